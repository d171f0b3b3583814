//! Cloning a graph (`cuGraphClone`, which the CUDA sample `simpleCudaGraphs` and frameworks
//! that instantiate one graph several ways use) and finding a node in a clone
//! (`cuGraphNodeFindInClone`). A clone is a deep copy: its nodes, their edges, the graphs its
//! child and conditional nodes run, and references to the original's user objects; changing
//! one changes nothing in the other. A graph with memory allocation or free nodes is not
//! cloned (`CUDA_ERROR_NOT_SUPPORTED`), as the CUDA programming guide says of graphs with
//! memory nodes.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use crate::codes::*;
use crate::graph::{CUgraph, CUgraphNode, Op};
use crate::{CUresult, guard, out};

/// Each clone's original graph, by the clone's handle.
static ORIGINALS: LazyLock<Mutex<HashMap<usize, usize>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Forgets `g` as a clone (it is being destroyed).
pub(crate) fn forget(g: CUgraph) {
    if let Ok(mut originals) = ORIGINALS.lock() {
        originals.remove(&(g as usize));
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphClone(clone: *mut CUgraph, original: CUgraph) -> CUresult {
    guard(|| {
        if clone.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ops = crate::graph::ops_of(original)?;
        if ops
            .iter()
            .any(|op| matches!(op, Op::MemAlloc { .. } | Op::MemFree { .. }))
        {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        let copy = crate::graph_bodies::copy_graph(original as usize)?;
        ORIGINALS
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .insert(copy, original as usize);
        out(clone, copy as CUgraph)
    })
}

/// The node of `cloned` that `original_node` became: the one at the same place, where
/// `cloned` is a clone of the graph `original_node` belongs to.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeFindInClone(
    node: *mut CUgraphNode,
    original_node: CUgraphNode,
    cloned: CUgraph,
) -> CUresult {
    guard(|| {
        let from = crate::graph::node_graph(original_node)?;
        let cloned_from = ORIGINALS
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .get(&(cloned as usize))
            .copied();
        if cloned_from != Some(from as usize) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let index = crate::graph::node_index(original_node)?;
        out(node, crate::graph::node_at(cloned, index)?)
    })
}
