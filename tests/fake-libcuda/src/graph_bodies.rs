//! Graph nodes that run other graphs: child graph nodes (CUDA 10) and conditional nodes
//! (CUDA 12.3), as the driver has them.
//!
//! - A child graph node owns a copy of the graph it was given (`cuGraphAddChildGraphNode`,
//!   or `cuGraphAddNode` with a child graph's parameters), which
//!   `cuGraphChildGraphNodeGetGraph` hands out; a graph with memory or conditional nodes
//!   cannot be a child. A launch runs the copy's operations.
//! - A conditional node has a handle (`cuGraphConditionalHandleCreate`, with the value each
//!   launch starts from) and body graphs the driver makes with the node and writes into the
//!   caller's parameters (`phGraph_out`), to be filled with nodes afterwards. An `if` node runs
//!   its first body when the value is non-zero (its second, if it has one, when it is zero),
//!   a `switch` node the body the value numbers, a `while` node its body as long as the value
//!   is non-zero. No kernel of the simulated GPU runs device code, so none sets the value
//!   (`cudaGraphSetConditional`): a `while` node here runs its body as many times as the
//!   value it starts from, where a real kernel would count down.
//!
//! Instantiating takes a deep copy of every graph a node runs, so that changing a graph
//! afterwards changes no executable graph, as with the driver;
//! `cuGraphExecChildGraphNodeSetParams` (and `cuGraphExecNodeSetParams` for a child graph
//! node) gives the executable graph's copy a new graph's operations, of the same topology.
//! Graphs copied into nodes are not freed with them (the simulation's handles live as long as
//! the process).

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_ulonglong};
use std::sync::{LazyLock, Mutex};

use gpuslice_cuda_abi::cuda::{
    CU_GRAPH_COND_TYPE_IF, CU_GRAPH_COND_TYPE_SWITCH, CU_GRAPH_COND_TYPE_WHILE,
    CU_GRAPH_NODE_TYPE_CONDITIONAL, CU_GRAPH_NODE_TYPE_GRAPH, CU_GRAPH_NODE_TYPE_KERNEL,
    CUDA_CHILD_GRAPH_NODE_PARAMS, CUDA_CONDITIONAL_NODE_PARAMS, CUDA_KERNEL_NODE_PARAMS_v2,
    CUgraphNodeParamsHead,
};

use crate::codes::*;
use crate::graph::{CUgraph, CUgraphExec, CUgraphNode, Op, graph, node_index, ops_of, record};
use crate::{CUcontext, CUresult, guard, out};

/// A conditional node: its handle, kind and body graphs (the array the caller is given).
struct Conditional {
    handle: u64,
    kind: c_int,
    bodies: Box<[usize]>,
}

/// Conditional handles' starting values, by handle less one.
static HANDLES: LazyLock<Mutex<Vec<u32>>> = LazyLock::new(|| Mutex::new(Vec::new()));
/// By [`Op::Conditional`]'s number.
static CONDITIONALS: LazyLock<Mutex<HashMap<usize, Conditional>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn poisoned<T>(_: T) -> CUresult {
    CUDA_ERROR_UNKNOWN
}

/// A new graph holding a deep copy of `g`'s operations.
pub(crate) fn copy_graph(g: usize) -> Result<usize, CUresult> {
    let copy = crate::graph::new_graph()?;
    for op in ops_of(g as CUgraph)? {
        record(copy, copy_op(op)?)?;
    }
    crate::graph_edges::copy(g as CUgraph, copy)?;
    crate::user_objects::shared(g, copy as usize)?;
    Ok(copy as usize)
}

/// `op`, with a copy of every graph it runs.
pub(crate) fn copy_op(op: Op) -> Result<Op, CUresult> {
    Ok(match op {
        Op::Child { graph } => Op::Child {
            graph: copy_graph(graph)?,
        },
        Op::Conditional { id } => {
            let (handle, kind, bodies) = {
                let table = CONDITIONALS.lock().map_err(poisoned)?;
                let c = table.get(&id).ok_or(CUDA_ERROR_INVALID_VALUE)?;
                (c.handle, c.kind, c.bodies.clone())
            };
            let bodies = bodies
                .iter()
                .map(|&b| copy_graph(b))
                .collect::<Result<Box<[usize]>, _>>()?;
            Op::Conditional {
                id: remember(handle, kind, bodies)?,
            }
        }
        other => other,
    })
}

fn remember(handle: u64, kind: c_int, bodies: Box<[usize]>) -> Result<usize, CUresult> {
    let mut table = CONDITIONALS.lock().map_err(poisoned)?;
    let id = table.len() + 1;
    table.insert(
        id,
        Conditional {
            handle,
            kind,
            bodies,
        },
    );
    Ok(id)
}

/// Runs a conditional node's bodies as its handle's starting value decides.
pub(crate) fn run_conditional(id: usize) -> Result<(), CUresult> {
    let (value, kind, bodies) = {
        let table = CONDITIONALS.lock().map_err(poisoned)?;
        let c = table.get(&id).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let handles = HANDLES.lock().map_err(poisoned)?;
        let value = usize::try_from(c.handle)
            .ok()
            .and_then(|h| handles.get(h.wrapping_sub(1)))
            .copied()
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        (value, c.kind, c.bodies.clone())
    };
    match kind {
        CU_GRAPH_COND_TYPE_WHILE => (0..value).try_for_each(|_| run_graph(bodies[0])),
        CU_GRAPH_COND_TYPE_IF if value != 0 => run_graph(bodies[0]),
        CU_GRAPH_COND_TYPE_IF => bodies.get(1).map_or(Ok(()), |&b| run_graph(b)),
        _ => bodies.get(value as usize).map_or(Ok(()), |&b| run_graph(b)),
    }
}

/// Runs every operation of the graph `g`.
pub(crate) fn run_graph(g: usize) -> Result<(), CUresult> {
    for op in ops_of(g as CUgraph)? {
        crate::graph::run(op)?;
    }
    Ok(())
}

/// A child graph node's operation: a copy of `child`, which may hold no memory or
/// conditional nodes.
fn child(child: CUgraph) -> Result<Op, CUresult> {
    let ops = ops_of(child)?;
    if ops.iter().any(|op| {
        matches!(
            op,
            Op::MemAlloc { .. } | Op::MemFree { .. } | Op::Conditional { .. }
        )
    }) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(Op::Child {
        graph: copy_graph(child as usize)?,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddChildGraphNode(
    node: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    child_graph: CUgraph,
) -> CUresult {
    guard(|| crate::graph::add_node(node, g, deps, count, || child(child_graph)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphChildGraphNodeGetGraph(
    node: CUgraphNode,
    g: *mut CUgraph,
) -> CUresult {
    guard(|| {
        let Op::Child { graph } = crate::graph::node_op(node)? else {
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        out(g, graph as CUgraph)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphConditionalHandleCreate(
    handle: *mut c_ulonglong,
    g: CUgraph,
    _ctx: CUcontext,
    default_value: c_uint,
    _flags: c_uint,
) -> CUresult {
    guard(|| {
        graph(g)?;
        let mut handles = HANDLES.lock().map_err(poisoned)?;
        handles.push(default_value);
        out(handle, handles.len() as u64)
    })
}

/// A conditional node's operation from the caller's parameters, its body graphs made and
/// written back into them.
fn conditional(p: *mut CUDA_CONDITIONAL_NODE_PARAMS) -> Result<Op, CUresult> {
    // SAFETY: the caller's CUDA_CONDITIONAL_NODE_PARAMS.
    let c = unsafe { &mut *p };
    let known = usize::try_from(c.handle)
        .is_ok_and(|h| h >= 1 && h <= HANDLES.lock().map(|v| v.len()).unwrap_or(0));
    let size_fits = match c.typ {
        CU_GRAPH_COND_TYPE_IF => (1..=2).contains(&c.size),
        CU_GRAPH_COND_TYPE_WHILE => c.size == 1,
        CU_GRAPH_COND_TYPE_SWITCH => c.size >= 1,
        _ => false,
    };
    if !known || !size_fits {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let bodies = (0..c.size)
        .map(|_| crate::graph::new_graph().map(|g| g as usize))
        .collect::<Result<Box<[usize]>, _>>()?;
    c.graphs = bodies.as_ptr() as *mut CUgraph;
    Ok(Op::Conditional {
        id: remember(c.handle, c.typ, bodies)?,
    })
}

/// The operation `cuGraphAddNode` makes from a `CUgraphNodeParams` (kernel, memset, memcpy,
/// child graph and conditional nodes modelled).
fn node_from_params(params: *mut CUgraphNodeParamsHead) -> Result<Op, CUresult> {
    let (typ, body) = crate::graph_updates::node_params(params)?;
    match typ {
        CU_GRAPH_NODE_TYPE_KERNEL => {
            crate::graph::kernel_op(body.cast::<CUDA_KERNEL_NODE_PARAMS_v2>(), true)
        }
        CU_GRAPH_NODE_TYPE_GRAPH => {
            // SAFETY: a child graph node's parameters: the graph first.
            let g = unsafe { (*body.cast::<CUDA_CHILD_GRAPH_NODE_PARAMS>()).graph };
            child(g)
        }
        CU_GRAPH_NODE_TYPE_CONDITIONAL => conditional(body.cast()),
        gpuslice_cuda_abi::cuda::CU_GRAPH_NODE_TYPE_MEMSET => {
            crate::graph_memset::memset_op(body.cast())
        }
        gpuslice_cuda_abi::cuda::CU_GRAPH_NODE_TYPE_MEMCPY => {
            crate::graph_memcpy::memcpy_op_of_node_params(body)
        }
        _ => Err(crate::unmodelled("cuGraphAddNode (this node type)")),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddNode(
    node: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    params: *mut CUgraphNodeParamsHead,
) -> CUresult {
    guard(|| crate::graph::add_node(node, g, deps, count, || node_from_params(params)))
}

/// CUDA 12.3's form, with data on each dependency's edge (kept as plain edges: the data,
/// for programmatic dependent launches, changes nothing in the simulation).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddNode_v2(
    node: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    _edge_data: *const std::ffi::c_void,
    count: usize,
    params: *mut CUgraphNodeParamsHead,
) -> CUresult {
    // SAFETY: the same contract less the edge data.
    unsafe { cuGraphAddNode(node, g, deps, count, params) }
}

/// Gives the executable graph's copy of child graph node `node` the operations of `child`,
/// whose nodes must be as many and of the same types.
pub(crate) fn set_exec_child(
    e: CUgraphExec,
    node: CUgraphNode,
    child: CUgraph,
) -> Result<(), CUresult> {
    let index = node_index(node)?;
    let Some(Op::Child { graph: copy }) = crate::graph::exec_ops(e)?.get(index).copied() else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let new = ops_of(child)?;
    let old = ops_of(copy as CUgraph)?;
    if new.len() != old.len()
        || !new
            .iter()
            .zip(&old)
            .all(|(a, b)| std::mem::discriminant(a) == std::mem::discriminant(b))
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let new = new
        .into_iter()
        .map(copy_op)
        .collect::<Result<Vec<_>, _>>()?;
    crate::graph::set_ops(copy as CUgraph, new)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphExecChildGraphNodeSetParams(
    e: CUgraphExec,
    node: CUgraphNode,
    child: CUgraph,
) -> CUresult {
    guard(|| set_exec_child(e, node, child))
}
