//! A graph's kernel nodes read and changed after they were made (`cuGraphKernelNodeGetParams`,
//! `cuGraphKernelNodeSetAttribute`/`GetAttribute`, device-updatable nodes), and an
//! instantiated graph changed in place: `cuGraphExecUpdate` from a graph of the same shape and
//! `cuGraphExec*NodeSetParams` node by node.

use std::collections::HashSet;
use std::ffi::{c_int, c_void};
use std::sync::{LazyLock, Mutex};

use gpuslice_cuda_abi::cuda::{
    CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED, CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED,
    CU_GRAPH_EXEC_UPDATE_SUCCESS, CU_GRAPH_NODE_PARAMS_UNION_OFFSET, CU_GRAPH_NODE_TYPE_GRAPH,
    CU_GRAPH_NODE_TYPE_KERNEL, CU_GRAPH_NODE_TYPE_MEMCPY, CU_GRAPH_NODE_TYPE_MEMSET,
    CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE, CUDA_CHILD_GRAPH_NODE_PARAMS,
    CUDA_KERNEL_NODE_PARAMS_v2, CUgraphExecUpdateResultInfo, CUgraphNodeParamsHead,
    CUlaunchAttributeValue,
};
use gpuslice_cuda_abi::cuda::{CUgraph, CUgraphExec, CUgraphNode};

use crate::codes::*;
use crate::graph_bodies;
use crate::paths::CUfunction;
use crate::{CUresult, guard, out};

use crate::graph::*;

/// Writes a kernel node's parameters; `v2`: the caller's structure has `kern` and `ctx`.
fn kernel_params(
    node: CUgraphNode,
    params: *mut CUDA_KERNEL_NODE_PARAMS_v2,
    v2: bool,
) -> Result<(), CUresult> {
    let Op::Kernel {
        func,
        grid,
        block,
        shared,
    } = node_op(node)?
    else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    if params.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's structure, v2-sized only when `v2`; each field is written through
    // the raw pointer, only those within the size of the version asked for.
    unsafe {
        (*params).func = func as CUfunction;
        [
            (*params).grid_dim_x,
            (*params).grid_dim_y,
            (*params).grid_dim_z,
        ] = grid;
        [
            (*params).block_dim_x,
            (*params).block_dim_y,
            (*params).block_dim_z,
        ] = block;
        (*params).shared_mem_bytes = shared;
        (*params).kernel_params = std::ptr::null_mut();
        (*params).extra = std::ptr::null_mut();
        if v2 {
            (*params).kern = std::ptr::null_mut();
            (*params).ctx = std::ptr::null_mut();
        }
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphKernelNodeGetParams_v2(
    node: CUgraphNode,
    params: *mut CUDA_KERNEL_NODE_PARAMS_v2,
) -> CUresult {
    guard(|| kernel_params(node, params, true))
}

/// Writes a `CUDA_KERNEL_NODE_PARAMS` v1, the head of the v2 structure.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphKernelNodeGetParams(
    node: CUgraphNode,
    params: *mut c_void,
) -> CUresult {
    guard(|| kernel_params(node, params.cast(), false))
}

/// Kernel nodes made device-updatable (CUDA 12.4), by handle: their kernels may change their
/// parameters and grid from the GPU (no simulated kernel does).
static DEVICE_UPDATABLE: LazyLock<Mutex<HashSet<usize>>> =
    LazyLock::new(|| Mutex::new(HashSet::new()));

/// `cuGraphKernelNodeSetAttribute`, for `CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE`
/// (others are not modelled): 1 makes the node device-updatable; a node cannot opt out again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphKernelNodeSetAttribute(
    node: CUgraphNode,
    attr: c_int,
    value: *const CUlaunchAttributeValue,
) -> CUresult {
    guard(|| {
        if attr != CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE {
            return Err(crate::unmodelled(
                "cuGraphKernelNodeSetAttribute (this attribute)",
            ));
        }
        let Op::Kernel { .. } = node_op(node)? else {
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        // SAFETY: the caller's CUlaunchAttributeValue (null refused).
        let v = unsafe { value.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let mut set = DEVICE_UPDATABLE.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
        match v.first_int() {
            1 => {
                set.insert(node as usize);
                Ok(())
            }
            0 if !set.contains(&(node as usize)) => Ok(()),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    })
}

/// `cuGraphKernelNodeGetAttribute`, for `CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE`:
/// the flag, and for a device-updatable node its device handle after it (`devNode`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphKernelNodeGetAttribute(
    node: CUgraphNode,
    attr: c_int,
    value: *mut CUlaunchAttributeValue,
) -> CUresult {
    guard(|| {
        if attr != CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE {
            return Err(crate::unmodelled(
                "cuGraphKernelNodeGetAttribute (this attribute)",
            ));
        }
        let Op::Kernel { .. } = node_op(node)? else {
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        let on = DEVICE_UPDATABLE
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .contains(&(node as usize));
        let mut v = CUlaunchAttributeValue::default();
        v.bytes[0..4].copy_from_slice(&c_int::from(on).to_ne_bytes());
        if on {
            v.bytes[8..16].copy_from_slice(&(node as u64).to_ne_bytes());
        }
        out(value, v)
    })
}

/// A caller's `CUgraphNodeParams`: the node's type, and where that type's own parameters
/// stand in it.
pub(crate) fn node_params(
    params: *mut CUgraphNodeParamsHead,
) -> Result<(c_int, *mut u8), CUresult> {
    if params.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's CUgraphNodeParams: its type first, the type's parameters at their
    // offset within it.
    Ok(unsafe {
        (
            (*params).typ,
            params.cast::<u8>().add(CU_GRAPH_NODE_PARAMS_UNION_OFFSET),
        )
    })
}

/// Whether two operations are nodes of the same type (what an update may not change).
fn same_type(a: &Op, b: &Op) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

/// Gives `e` the operations of `g` if it has as many, each of the same type; else the
/// `CUgraphExecUpdateResult` saying why, and nothing changes.
fn update(e: CUgraphExec, g: CUgraph) -> Result<Result<(), c_int>, CUresult> {
    let ex = exec_of(e)?;
    let new = copied(ops_of(g)?)?;
    let mut ops = ex.ops.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
    if ops.len() != new.len() {
        return Ok(Err(CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED));
    }
    if !ops.iter().zip(&new).all(|(a, b)| same_type(a, b)) {
        return Ok(Err(CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED));
    }
    *ops = new;
    Ok(Ok(()))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecUpdate_v2(
    e: CUgraphExec,
    g: CUgraph,
    info: *mut CUgraphExecUpdateResultInfo,
) -> CUresult {
    guard(|| {
        let outcome = update(e, g)?;
        let result = outcome.err().unwrap_or(CU_GRAPH_EXEC_UPDATE_SUCCESS);
        out(
            info,
            CUgraphExecUpdateResultInfo {
                result,
                error_node: std::ptr::null_mut(),
                error_from_node: std::ptr::null_mut(),
            },
        )?;
        outcome.map_err(|_| CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE)
    })
}

/// The CUDA 11 form: the error node and the result through separate pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecUpdate(
    e: CUgraphExec,
    g: CUgraph,
    error_node: *mut CUgraphNode,
    result: *mut c_int,
) -> CUresult {
    guard(|| {
        let outcome = update(e, g)?;
        out(
            result,
            outcome.err().unwrap_or(CU_GRAPH_EXEC_UPDATE_SUCCESS),
        )?;
        if !error_node.is_null() {
            out(error_node, std::ptr::null_mut())?;
        }
        outcome.map_err(|_| CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE)
    })
}

/// Gives the kernel node `node` of the graph `e` was instantiated from new parameters in `e`
/// alone (the graph keeps its own), as the driver does: a kernel node stays a kernel node.
fn set_exec_kernel(e: CUgraphExec, node: CUgraphNode, op: Op) -> Result<(), CUresult> {
    set_exec_op(e, node, op, |old| matches!(old, Op::Kernel { .. }))
}

/// Gives the node `node` of the graph `e` was instantiated from the operation `op` in `e`
/// alone, where its operation there is of the kind `same` accepts.
pub(crate) fn set_exec_op(
    e: CUgraphExec,
    node: CUgraphNode,
    op: Op,
    same: impl Fn(&Op) -> bool,
) -> Result<(), CUresult> {
    let index = node_index(node)?;
    let mut ops = exec_of(e)?.ops.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
    match ops.get_mut(index) {
        Some(slot) if same(slot) => {
            *slot = op;
            Ok(())
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecKernelNodeSetParams_v2(
    e: CUgraphExec,
    node: CUgraphNode,
    params: *const CUDA_KERNEL_NODE_PARAMS_v2,
) -> CUresult {
    guard(|| set_exec_kernel(e, node, kernel_op(params, true)?))
}

/// Takes a `CUDA_KERNEL_NODE_PARAMS` v1, the head of the v2 structure (only that is read).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecKernelNodeSetParams(
    e: CUgraphExec,
    node: CUgraphNode,
    params: *const c_void,
) -> CUresult {
    guard(|| set_exec_kernel(e, node, kernel_op(params.cast(), false)?))
}

/// CUDA 12.2's generic form, for a kernel, memset, memcpy or child graph node (other types
/// are not modelled here).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecNodeSetParams(
    e: CUgraphExec,
    node: CUgraphNode,
    params: *mut CUgraphNodeParamsHead,
) -> CUresult {
    guard(|| {
        let (typ, body) = node_params(params)?;
        match typ {
            CU_GRAPH_NODE_TYPE_KERNEL => set_exec_kernel(e, node, kernel_op(body.cast(), true)?),
            CU_GRAPH_NODE_TYPE_MEMSET => crate::graph_memset::set_exec_memset(
                e,
                node,
                crate::graph_memset::memset_op(body.cast())?,
            ),
            CU_GRAPH_NODE_TYPE_MEMCPY => crate::graph_memcpy::set_exec_memcpy(
                e,
                node,
                crate::graph_memcpy::memcpy_op_of_node_params(body)?,
            ),
            CU_GRAPH_NODE_TYPE_GRAPH => {
                // SAFETY: a child graph node's parameters: the graph first.
                let child = unsafe { (*body.cast::<CUDA_CHILD_GRAPH_NODE_PARAMS>()).graph };
                graph_bodies::set_exec_child(e, node, child)
            }
            _ => Err(crate::unmodelled(
                "cuGraphExecNodeSetParams (not a kernel, memset, memcpy or child graph node)",
            )),
        }
    })
}
