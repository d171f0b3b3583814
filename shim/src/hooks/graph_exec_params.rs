//! Changing what an executable graph runs in place: a kernel, memset or child graph node
//! given new parameters in the executable graph alone (`cuGraphExecKernelNodeSetParams{,_v2}`,
//! `cuGraphExecMemsetNodeSetParams`, `cuGraphExecChildGraphNodeSetParams` and CUDA 12.2's
//! generic `cuGraphExecNodeSetParams`). Once the driver takes the change, the books of
//! `graph` follow: the thread blocks a launch takes from the pacing bucket, and the most local
//! memory a thread of its kernels needs, so that a tenant cannot instantiate a small kernel
//! and launch a large one in its place. The driver is given the copy of the parameters read
//! here: what the books follow is what it takes.

use std::ffi::c_void;

use super::graph::{Work, grid_blocks, set_node};
use super::real_or_return;
use crate::ffi::*;
use crate::log::log;
use crate::slice;

/// A kernel node of `exec` given the parameters `p` (see [`set_node`]).
fn set_kernel(
    exec: CUgraphExec,
    node: CUgraphNode,
    p: Option<CUDA_KERNEL_NODE_PARAMS_v2>,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let (Some(s), Some(p)) = (slice::get(), p) else {
        return call();
    };
    let f = if p.func.is_null() { p.kern } else { p.func };
    let work = Work {
        blocks: if s.paced { grid_blocks(&p) } else { 0 },
        local: super::stack::local_bytes(f),
    };
    set_node(s, exec, node, work, call)
}

/// A memset node of `exec` given the parameters `p` (see [`set_node`]).
fn set_memset(
    exec: CUgraphExec,
    node: CUgraphNode,
    p: Option<CUDA_MEMSET_NODE_PARAMS>,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    match (slice::get(), p) {
        (Some(s), Some(p)) if s.paced => {
            let work = Work {
                blocks: super::memset::node_blocks(&p),
                local: 0,
            };
            set_node(s, exec, node, work, call)
        }
        _ => call(),
    }
}

pub unsafe fn graph_exec_memset_node_set_params(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *const CUDA_MEMSET_NODE_PARAMS,
    ctx: CUcontext,
) -> CUresult {
    let f = real_or_return!(cuGraphExecMemsetNodeSetParams);
    // The driver is given the copy read here: what the books follow is what it takes.
    // SAFETY: the caller's parameters, where given.
    let p = (!params.is_null()).then(|| unsafe { params.read_unaligned() });
    let given = p.as_ref().map_or(params, std::ptr::from_ref);
    // SAFETY: the caller's arguments, the parameters as copied.
    set_memset(exec, node, p, || unsafe { f(exec, node, given, ctx) })
}

/// A child graph node of `exec` given the nodes of `child` (see [`set_node`]); a graph that
/// cannot be read is refused. Its memory nodes, if any, are not read: the driver takes no
/// change to an executable graph's memory nodes.
fn set_child(
    exec: CUgraphExec,
    node: CUgraphNode,
    child: CUgraph,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some(s) = slice::get() else {
        return call();
    };
    // No node is added to the child between this read and the driver's taking it.
    let _settled = super::graph_edits::settled();
    match super::graph::child_work(s, child) {
        Ok(work) => set_node(s, exec, node, work, call),
        Err(e) => {
            log!("a child graph could not be read (error {e}); the change is refused");
            e
        }
    }
}

/// Reads a kernel node's parameters the caller passes: v1 (`v2` false) is the head of v2,
/// up to `extra`.
fn caller_kernel_params(
    p: *const CUDA_KERNEL_NODE_PARAMS_v2,
    v2: bool,
) -> Option<CUDA_KERNEL_NODE_PARAMS_v2> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller's structure, read field by field (no reference to a whole v2
    // structure is made), `kern` only where it is a v2 one.
    Some(unsafe {
        CUDA_KERNEL_NODE_PARAMS_v2 {
            func: (*p).func,
            grid_dim_x: (*p).grid_dim_x,
            grid_dim_y: (*p).grid_dim_y,
            grid_dim_z: (*p).grid_dim_z,
            block_dim_x: (*p).block_dim_x,
            block_dim_y: (*p).block_dim_y,
            block_dim_z: (*p).block_dim_z,
            shared_mem_bytes: (*p).shared_mem_bytes,
            kernel_params: (*p).kernel_params,
            extra: (*p).extra,
            kern: if v2 { (*p).kern } else { std::ptr::null_mut() },
            ctx: if v2 { (*p).ctx } else { std::ptr::null_mut() },
        }
    })
}

pub unsafe fn graph_exec_kernel_node_set_params(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *const c_void,
) -> CUresult {
    let f = real_or_return!(cuGraphExecKernelNodeSetParams);
    // The driver is given the copy read here (its v1 head): what the books follow is what
    // the driver takes.
    let p = caller_kernel_params(params.cast(), false);
    let given = p.as_ref().map_or(params, |c| std::ptr::from_ref(c).cast());
    // SAFETY: the caller's arguments, the parameters as copied.
    set_kernel(exec, node, p, || unsafe { f(exec, node, given) })
}

pub unsafe fn graph_exec_kernel_node_set_params_v2(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *const CUDA_KERNEL_NODE_PARAMS_v2,
) -> CUresult {
    let f = real_or_return!(cuGraphExecKernelNodeSetParams_v2);
    let p = caller_kernel_params(params, true);
    let given = p.as_ref().map_or(params, std::ptr::from_ref);
    // SAFETY: the caller's arguments, the parameters as copied.
    set_kernel(exec, node, p, || unsafe { f(exec, node, given) })
}

pub unsafe fn graph_exec_child_graph_node_set_params(
    exec: CUgraphExec,
    node: CUgraphNode,
    child: CUgraph,
) -> CUresult {
    let f = real_or_return!(cuGraphExecChildGraphNodeSetParams);
    // SAFETY: the caller's arguments, passed on unchanged.
    set_child(exec, node, child, || unsafe { f(exec, node, child) })
}

/// CUDA 12.2's generic form: followed for a kernel, memset and child graph node; a
/// conditional node's new parameters are refused in a slice (what its bodies would then run
/// is not known here); other nodes' parameters change no books (an executable graph's
/// memory nodes cannot be changed).
pub unsafe fn graph_exec_node_set_params(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *mut CUgraphNodeParamsHead,
) -> CUresult {
    let f = real_or_return!(cuGraphExecNodeSetParams);
    let Some(mut copy) = super::graph_bodies::NodeParams::copy_of(params) else {
        // SAFETY: the caller's arguments, passed on unchanged.
        return unsafe { f(exec, node, params) };
    };
    // The driver is given the copy read here.
    let given = copy.ptr();
    // SAFETY: the caller's arguments, the parameters as copied.
    let call = move || unsafe { f(exec, node, given) };
    let (typ, own) = copy.parts();
    match typ {
        CU_GRAPH_NODE_TYPE_KERNEL => {
            set_kernel(exec, node, caller_kernel_params(own.cast(), true), call)
        }
        CU_GRAPH_NODE_TYPE_MEMSET => {
            // SAFETY: a memset node's v2 parameters, which begin as v1's.
            let p = unsafe { own.cast::<CUDA_MEMSET_NODE_PARAMS>().read_unaligned() };
            set_memset(exec, node, Some(p), call)
        }
        CU_GRAPH_NODE_TYPE_GRAPH => {
            // SAFETY: a child graph node's parameters, the graph first.
            let child =
                unsafe { own.cast::<CUDA_CHILD_GRAPH_NODE_PARAMS>().read_unaligned() }.graph;
            set_child(exec, node, child, call)
        }
        CU_GRAPH_NODE_TYPE_CONDITIONAL if slice::get().is_some() => {
            log!(
                "new parameters for an executable graph's conditional node: not supported in a slice"
            );
            CUDA_ERROR_NOT_SUPPORTED
        }
        _ => call(),
    }
}
