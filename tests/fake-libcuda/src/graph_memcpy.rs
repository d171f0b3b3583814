//! Memcpy nodes: made by `cuGraphAddMemcpyNode` (or `cuGraphAddNode`), which the CUDA samples
//! `simpleCudaGraphs` and `jacobiCudaGraphs` and XLA's command buffers build graphs with, and
//! by copies issued on a capturing stream; read back by `cuGraphMemcpyNodeGetParams`, changed
//! by `cuGraphMemcpyNodeSetParams`, and in an executable graph by
//! `cuGraphExecMemcpyNodeSetParams` (or `cuGraphExecNodeSetParams`). A launch that reaches
//! one copies, as `cuMemcpy3D_v2` would then (each end checked against the allocations).

use std::ffi::c_void;

use gpuslice_cuda_abi::cuda::{CUDA_MEMCPY2D, CUDA_MEMCPY3D, CUdeviceptr};

use crate::codes::*;
use crate::graph::{CUgraph, CUgraphExec, CUgraphNode, Op};
use crate::paths::CUstream;
use crate::{CUcontext, CUresult, guard, out};

use gpuslice_cuda_abi::cuda::{
    CU_MEMORYTYPE_DEVICE as DEVICE, CU_MEMORYTYPE_HOST as HOST, CU_MEMORYTYPE_UNIFIED as UNIFIED,
};

/// A copy's parameters as a node keeps them.
#[derive(Clone, Copy)]
pub struct Copy3D(pub CUDA_MEMCPY3D);

// SAFETY: the pointers are addresses in the program's memory, read and written only by the
// copy when a launch reaches the node, as the driver does; never dereferenced otherwise.
unsafe impl Send for Copy3D {}

/// The operation of a memcpy node with parameters `p`, refused as the driver refuses it: no
/// parameters, a mipmap level, or no width.
pub(crate) fn memcpy_op(p: *const CUDA_MEMCPY3D) -> Result<Op, CUresult> {
    // SAFETY: the caller's parameters, copied out (null refused).
    let p = unsafe { p.as_ref() }
        .copied()
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if p.src_lod != 0 || p.dst_lod != 0 || p.width_in_bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(Op::Memcpy { params: Copy3D(p) })
}

/// The copy a node runs, when a launch reaches it.
pub(crate) fn run(p: &Copy3D) -> Result<(), CUresult> {
    // SAFETY: the program's own copy parameters, as it gave them for this node.
    crate::ok(unsafe { crate::copy::cuMemcpy3D_v2(&raw const p.0) })
}

/// A one-dimensional copy of `n` bytes, as a node's parameters.
fn linear(dst: (u32, u64), src: (u32, u64), n: usize) -> CUDA_MEMCPY3D {
    // SAFETY: an all-zero CUDA_MEMCPY3D is a valid value (null pointers, zero sizes).
    let mut p: CUDA_MEMCPY3D = unsafe { std::mem::zeroed() };
    p.dst_memory_type = dst.0;
    p.src_memory_type = src.0;
    if dst.0 == HOST {
        p.dst_host = dst.1 as *mut c_void;
    } else {
        p.dst_device = dst.1;
    }
    if src.0 == HOST {
        p.src_host = src.1 as *const c_void;
    } else {
        p.src_device = src.1;
    }
    p.width_in_bytes = n;
    p.height = 1;
    p.depth = 1;
    p
}

/// A two-dimensional copy, as a node's parameters (one slice).
fn planar(c: &CUDA_MEMCPY2D) -> CUDA_MEMCPY3D {
    // SAFETY: an all-zero CUDA_MEMCPY3D is a valid value (null pointers, zero sizes).
    let mut p: CUDA_MEMCPY3D = unsafe { std::mem::zeroed() };
    p.src_x_in_bytes = c.src_x_in_bytes;
    p.src_y = c.src_y;
    p.src_memory_type = c.src_memory_type;
    p.src_host = c.src_host;
    p.src_device = c.src_device;
    p.src_array = c.src_array;
    p.src_pitch = c.src_pitch;
    p.dst_x_in_bytes = c.dst_x_in_bytes;
    p.dst_y = c.dst_y;
    p.dst_memory_type = c.dst_memory_type;
    p.dst_host = c.dst_host;
    p.dst_device = c.dst_device;
    p.dst_array = c.dst_array;
    p.dst_pitch = c.dst_pitch;
    p.width_in_bytes = c.width_in_bytes;
    p.height = c.height;
    p.depth = 1;
    p
}

/// Records a copy on `stream` into the graph it is capturing into, if it is: whether it did.
fn captured(stream: CUstream, p: CUDA_MEMCPY3D) -> Result<bool, CUresult> {
    let mut held = crate::stream::hold(stream)?;
    if held.graph().is_none() {
        return Ok(false);
    }
    held.record(memcpy_op(&raw const p)?)?;
    Ok(true)
}

/// An asynchronous copy: recorded on a capturing stream, done now otherwise.
fn async_copy(stream: CUstream, p: CUDA_MEMCPY3D, now: impl FnOnce() -> CUresult) -> CUresult {
    match captured(stream, p) {
        Ok(true) => CUDA_SUCCESS,
        Ok(false) => now(),
        Err(e) => e,
    }
}

/// The memory kinds (destination, source) of the one-dimensional copy `sync`.
fn ends_of(sync: &str) -> (u32, u32) {
    match sync {
        "cuMemcpyHtoD_v2" => (DEVICE, HOST),
        "cuMemcpyDtoH_v2" => (HOST, DEVICE),
        "cuMemcpyDtoD_v2" => (DEVICE, DEVICE),
        _ => (UNIFIED, UNIFIED),
    }
}

/// The asynchronous one-dimensional copies (and their per-thread variants): as the
/// synchronous copy, or recorded on a capturing stream.
macro_rules! async_copies {
    ($($name:ident => $sync:ident($dst:ident: $dty:ty, $src:ident: $sty:ty, $n:ident: usize), $stream:ident: CUstream;)*) => {
        $(
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name($dst: $dty, $src: $sty, $n: usize, $stream: CUstream) -> CUresult {
                let (to, from) = ends_of(stringify!($sync));
                let p = linear((to, $dst as u64), (from, $src as u64), $n);
                // SAFETY: the same contract as the synchronous copy.
                async_copy($stream, p, || unsafe { crate::copy::$sync($dst, $src, $n) })
            }
        )*
    };
}

async_copies! {
    cuMemcpyHtoDAsync_v2 => cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize), stream: CUstream;
    cuMemcpyHtoDAsync_v2_ptsz => cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize), stream: CUstream;
    cuMemcpyDtoHAsync_v2 => cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize), stream: CUstream;
    cuMemcpyDtoHAsync_v2_ptsz => cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize), stream: CUstream;
    cuMemcpyDtoDAsync_v2 => cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize), stream: CUstream;
    cuMemcpyDtoDAsync_v2_ptsz => cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize), stream: CUstream;
    cuMemcpyAsync => cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize), stream: CUstream;
    cuMemcpyAsync_ptsz => cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize), stream: CUstream;
}

/// A two- or three-dimensional copy's parameters as a node's.
trait AsCopy3D {
    fn as_3d(&self) -> CUDA_MEMCPY3D;
}

impl AsCopy3D for CUDA_MEMCPY2D {
    fn as_3d(&self) -> CUDA_MEMCPY3D {
        planar(self)
    }
}

impl AsCopy3D for CUDA_MEMCPY3D {
    fn as_3d(&self) -> CUDA_MEMCPY3D {
        *self
    }
}

/// The asynchronous two- and three-dimensional copies, as the one-dimensional ones.
macro_rules! async_copies_2d_3d {
    ($($name:ident => $sync:ident($c:ident: *const $ty:ty), $stream:ident: CUstream;)*) => {
        $(
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name($c: *const $ty, $stream: CUstream) -> CUresult {
                // SAFETY: the caller's copy parameters (null refused).
                let Some(given) = (unsafe { $c.as_ref() }) else {
                    return CUDA_ERROR_INVALID_VALUE;
                };
                // SAFETY: the same contract as the synchronous copy.
                async_copy($stream, given.as_3d(), || unsafe { crate::copy::$sync($c) })
            }
        )*
    };
}

async_copies_2d_3d! {
    cuMemcpy2DAsync_v2 => cuMemcpy2D_v2(c: *const CUDA_MEMCPY2D), stream: CUstream;
    cuMemcpy2DAsync_v2_ptsz => cuMemcpy2D_v2(c: *const CUDA_MEMCPY2D), stream: CUstream;
    cuMemcpy3DAsync_v2 => cuMemcpy3D_v2(c: *const CUDA_MEMCPY3D), stream: CUstream;
    cuMemcpy3DAsync_v2_ptsz => cuMemcpy3D_v2(c: *const CUDA_MEMCPY3D), stream: CUstream;
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemcpyNode(
    node: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    params: *const CUDA_MEMCPY3D,
    _ctx: CUcontext,
) -> CUresult {
    guard(|| crate::graph::add_node(node, g, deps, count, || memcpy_op(params)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphMemcpyNodeGetParams(
    node: CUgraphNode,
    params: *mut CUDA_MEMCPY3D,
) -> CUresult {
    guard(|| match crate::graph::node_op(node)? {
        Op::Memcpy { params: p } => out(params, p.0),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphMemcpyNodeSetParams(
    node: CUgraphNode,
    params: *const CUDA_MEMCPY3D,
) -> CUresult {
    guard(|| {
        let Op::Memcpy { .. } = crate::graph::node_op(node)? else {
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        crate::graph::set_node_op(node, memcpy_op(params)?)
    })
}

/// Gives the memcpy node `node` new parameters in `e` alone, as the driver does.
pub(crate) fn set_exec_memcpy(e: CUgraphExec, node: CUgraphNode, op: Op) -> Result<(), CUresult> {
    crate::graph_updates::set_exec_op(e, node, op, |old| matches!(old, Op::Memcpy { .. }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecMemcpyNodeSetParams(
    e: CUgraphExec,
    node: CUgraphNode,
    params: *const CUDA_MEMCPY3D,
    _ctx: CUcontext,
) -> CUresult {
    guard(|| set_exec_memcpy(e, node, memcpy_op(params)?))
}

/// A memcpy node's parameters in `CUgraphNodeParams` (CUDA 12.2, `CUDA_MEMCPY_NODE_PARAMS`):
/// flags, a reserved word and the copy's context before the copy itself.
pub(crate) fn memcpy_op_of_node_params(body: *const u8) -> Result<Op, CUresult> {
    const COPY_AT: usize = 16;
    // SAFETY: the caller's node parameters, whose memcpy member holds the copy at COPY_AT.
    memcpy_op(unsafe { body.add(COPY_AT) }.cast())
}
