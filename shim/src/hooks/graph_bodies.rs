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

/// A copy of a caller's `CUgraphNodeParams`, which the driver is given instead of the
/// caller's own, so that what the library reads of it is what the driver gets (another of the
/// caller's threads cannot change it in between); what the driver writes into it is copied
/// back to the caller's after the call.
#[repr(C, align(8))]
pub struct NodeParams([u8; CU_GRAPH_NODE_PARAMS_SIZE]);

impl NodeParams {
    /// A copy of `*params`; None for a null pointer.
    pub fn copy_of(params: *const CUgraphNodeParamsHead) -> Option<Self> {
        (!params.is_null()).then(|| {
            // SAFETY: a non-null caller's CUgraphNodeParams, of that size.
            Self(unsafe {
                params
                    .cast::<[u8; CU_GRAPH_NODE_PARAMS_SIZE]>()
                    .read_unaligned()
            })
        })
    }

    /// The copy, to give the driver.
    pub fn ptr(&mut self) -> *mut CUgraphNodeParamsHead {
        self.0.as_mut_ptr().cast()
    }

    /// The node's type, and where its own parameters stand in the copy.
    pub fn parts(&mut self) -> (c_int, *mut u8) {
        let typ = c_int::from_ne_bytes([self.0[0], self.0[1], self.0[2], self.0[3]]);
        (
            typ,
            self.0[CU_GRAPH_NODE_PARAMS_UNION_OFFSET..].as_mut_ptr(),
        )
    }

    /// Copies what the driver wrote back into the caller's `*params`.
    pub fn give_back(&self, params: *mut CUgraphNodeParamsHead) {
        // SAFETY: the caller's CUgraphNodeParams this was copied from, of that size.
        unsafe {
            params
                .cast::<[u8; CU_GRAPH_NODE_PARAMS_SIZE]>()
                .write_unaligned(self.0);
        };
    }
}

/// After the driver made the node `*node` from `params`: a conditional one is remembered,
/// if the driver wrote its bodies (one it did not is left unknown: a graph holding it is not
/// instantiated in a slice).
fn remember(r: CUresult, node: *mut CUgraphNode, params: &mut NodeParams) {
    let (typ, own) = params.parts();
    if r != CUDA_SUCCESS || node.is_null() || typ != CU_GRAPH_NODE_TYPE_CONDITIONAL {
        return;
    }
    // SAFETY: a conditional node's parameters in the copy the driver just took, the body
    // array written by the driver with `size` entries; the node handle written by the driver.
    let (node, found) = unsafe {
        let c = own.cast::<CUDA_CONDITIONAL_NODE_PARAMS>().read_unaligned();
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

/// Makes a node from the caller's `params` by `add`, given the copy of them; a conditional
/// node made is remembered.
fn add_node(
    node: *mut CUgraphNode,
    params: *mut CUgraphNodeParamsHead,
    add: impl Fn(*mut CUgraphNodeParamsHead) -> CUresult,
) -> CUresult {
    let Some(mut copy) = NodeParams::copy_of(params) else {
        return add(params);
    };
    let r = add(copy.ptr());
    copy.give_back(params);
    remember(r, node, &mut copy);
    r
}

pub unsafe fn graph_add_node(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    params: *mut CUgraphNodeParamsHead,
) -> CUresult {
    let f = real_or_return!(cuGraphAddNode);
    let _edit = super::graph_edits::editing();
    // SAFETY: the caller's arguments, the parameters as copied (or null).
    add_node(node, params, |p| unsafe { f(node, graph, deps, count, p) })
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
    let _edit = super::graph_edits::editing();
    // SAFETY: the caller's arguments, the parameters as copied (or null).
    add_node(node, params, |p| unsafe {
        f(node, graph, deps, edges, count, p)
    })
}

/// A graph's node given new parameters before it is instantiated: for a conditional node,
/// what its bodies then are is not told, so in a slice the change is refused.
pub unsafe fn graph_node_set_params(
    node: CUgraphNode,
    params: *mut CUgraphNodeParamsHead,
) -> CUresult {
    let f = real_or_return!(cuGraphNodeSetParams);
    let _edit = super::graph_edits::editing();
    let Some(mut copy) = NodeParams::copy_of(params) else {
        // SAFETY: the caller's arguments, passed on unchanged.
        return unsafe { f(node, params) };
    };
    if copy.parts().0 == CU_GRAPH_NODE_TYPE_CONDITIONAL && crate::slice::get().is_some() {
        crate::log::log!("new parameters for a graph's conditional node: not supported in a slice");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    // SAFETY: the caller's arguments, the parameters as copied.
    let r = unsafe { f(node, copy.ptr()) };
    copy.give_back(params);
    r
}
