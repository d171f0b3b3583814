//! The body graphs of conditional graph nodes (CUDA 12.3), for `graph`'s reading of what a
//! graph runs.
//!
//! A conditional node runs one of its bodies (`if`, `switch`) or one body again and again
//! (`while`), as a value the graph's own kernels set decides. The driver makes the bodies
//! with the node and tells the caller only then (`cuGraphAddNode`'s `phGraph_out`); no call
//! reads them back from the node later. So every node made through `cuGraphAddNode{,_v2}`
//! with a conditional's parameters is remembered here, with its bodies, once the driver made
//! it: that call is the only way a conditional node comes to be (a graph holding one cannot
//! be cloned or made a child). A node handle the driver gives again replaces what was
//! remembered for it; what is remembered is not forgotten when the graph goes (a program
//! making conditional nodes without end grows its own memory only).

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{LazyLock, Mutex, PoisonError};

use super::real_or_return;
use crate::ffi::*;

/// A conditional node: its kind (`CU_GRAPH_COND_TYPE_*`) and body graphs' handles.
#[derive(Clone, Debug)]
pub struct Conditional {
    pub kind: c_int,
    pub bodies: Vec<usize>,
}

/// By node handle.
static CONDITIONALS: LazyLock<Mutex<HashMap<usize, Conditional>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The conditional node `node`, if this process made one with that handle.
pub fn conditional(node: CUgraphNode) -> Option<Conditional> {
    let table = CONDITIONALS.lock().unwrap_or_else(PoisonError::into_inner);
    table.get(&(node as usize)).cloned()
}

/// After the driver made the node `*node` from `params`: a conditional one is remembered,
/// if the driver wrote its bodies (one it did not is left unknown: a graph holding it is not
/// instantiated in a slice).
fn remember(r: CUresult, node: *mut CUgraphNode, params: *mut CUgraphNodeParamsHead) {
    if r != CUDA_SUCCESS || node.is_null() || params.is_null() {
        return;
    }
    // SAFETY: the caller's CUgraphNodeParams, which the driver just took: its type first, a
    // conditional node's parameters at their offset, the body array written by the driver
    // with `size` entries; the node handle written by the driver.
    let (node, found) = unsafe {
        if (*params).typ != CU_GRAPH_NODE_TYPE_CONDITIONAL {
            return;
        }
        let c = params
            .cast::<u8>()
            .add(CU_GRAPH_NODE_PARAMS_UNION_OFFSET)
            .cast::<CUDA_CONDITIONAL_NODE_PARAMS>()
            .read_unaligned();
        if c.graphs.is_null() {
            return;
        }
        let bodies = std::slice::from_raw_parts(c.graphs, c.size as usize)
            .iter()
            .map(|&g| g as usize)
            .collect();
        (
            node.read() as usize,
            Conditional {
                kind: c.typ,
                bodies,
            },
        )
    };
    CONDITIONALS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(node, found);
}

pub unsafe fn graph_add_node(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    params: *mut CUgraphNodeParamsHead,
) -> CUresult {
    let f = real_or_return!(cuGraphAddNode);
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = unsafe { f(node, graph, deps, count, params) };
    remember(r, node, params);
    r
}

pub unsafe fn graph_add_node_v2(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    edges: *const c_void,
    count: usize,
    params: *mut CUgraphNodeParamsHead,
) -> CUresult {
    let f = real_or_return!(cuGraphAddNode_v2);
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = unsafe { f(node, graph, deps, edges, count, params) };
    remember(r, node, params);
    r
}

/// A graph's node given new parameters before it is instantiated: for a conditional node,
/// what its bodies then are is not told, so in a slice the change is refused.
pub unsafe fn graph_node_set_params(
    node: CUgraphNode,
    params: *mut CUgraphNodeParamsHead,
) -> CUresult {
    let f = real_or_return!(cuGraphNodeSetParams);
    // SAFETY: the caller's CUgraphNodeParams, whose type comes first.
    let conditional =
        !params.is_null() && unsafe { (*params).typ } == CU_GRAPH_NODE_TYPE_CONDITIONAL;
    if conditional && crate::slice::get().is_some() {
        crate::log::log!("new parameters for a graph's conditional node: not supported in a slice");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    // SAFETY: the caller's arguments, passed on unchanged.
    unsafe { f(node, params) }
}
