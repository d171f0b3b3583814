//! Memset nodes: made by `cuGraphAddMemsetNode` (or `cuGraphAddNode`) and by memsets issued on
//! a capturing stream, read back by `cuGraphMemsetNodeGetParams`, changed in an executable
//! graph by `cuGraphExecMemsetNodeSetParams` (or `cuGraphExecNodeSetParams`); a launch that
//! reaches one sets the memory and takes the memset's simulated time (`copy::memset_2d`).

use gpuslice_cuda_abi::cuda::CUDA_MEMSET_NODE_PARAMS;

use crate::codes::*;
use crate::graph::{CUgraph, CUgraphExec, CUgraphNode, Op};
use crate::paths::CUstream;
use crate::{CUcontext, CUresult, guard, out};

/// The operation of a memset node with parameters `p`, refused as the driver refuses it.
pub(crate) fn memset_op(p: *const CUDA_MEMSET_NODE_PARAMS) -> Result<Op, CUresult> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's parameters (the v2 ones begin as v1's).
    let p = unsafe { p.read_unaligned() };
    if !matches!(p.element_size, 1 | 2 | 4) || p.height > 1 && p.pitch < p.width {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(Op::Memset { params: p })
}

/// Records a memset on `stream` into the graph it is capturing into, if it is: whether it did.
pub(crate) fn captured(stream: CUstream, p: CUDA_MEMSET_NODE_PARAMS) -> Result<bool, CUresult> {
    let mut held = crate::stream::hold(stream)?;
    if held.graph().is_none() {
        return Ok(false);
    }
    held.record(memset_op(&raw const p)?)?;
    Ok(true)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemsetNode(
    node: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    params: *const CUDA_MEMSET_NODE_PARAMS,
    _ctx: CUcontext,
) -> CUresult {
    guard(|| crate::graph::add_node(node, g, deps, count, || memset_op(params)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphMemsetNodeGetParams(
    node: CUgraphNode,
    params: *mut CUDA_MEMSET_NODE_PARAMS,
) -> CUresult {
    guard(|| match crate::graph::node_op(node)? {
        Op::Memset { params: p } => out(params, p),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    })
}

/// Gives the memset node `node` new parameters in `e` alone, as the driver does.
pub(crate) fn set_exec_memset(e: CUgraphExec, node: CUgraphNode, op: Op) -> Result<(), CUresult> {
    crate::graph_updates::set_exec_op(e, node, op, |old| matches!(old, Op::Memset { .. }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecMemsetNodeSetParams(
    e: CUgraphExec,
    node: CUgraphNode,
    params: *const CUDA_MEMSET_NODE_PARAMS,
    _ctx: CUcontext,
) -> CUresult {
    guard(|| set_exec_memset(e, node, memset_op(params)?))
}
