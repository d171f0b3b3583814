//! A graph's dependency edges, as the driver keeps them: made with a node (the dependencies a
//! `cuGraphAdd*Node` call passes, the capturing stream's dependency set for captured work),
//! added and removed afterwards (`cuGraphAddDependencies`, `cuGraphRemoveDependencies`), and
//! read back (`cuGraphGetEdges`, `cuGraphNodeGetDependencies`,
//! `cuGraphNodeGetDependentNodes`), with CUDA 12.3's forms that carry data on each edge
//! (`_v2`: every edge here is a plain one, its data zero; data passed in is accepted and not
//! kept, as it would change nothing in the simulation). The simulation still runs a graph's
//! operations in the order they were added.

use std::ffi::c_void;

use crate::codes::*;
use crate::graph::{CUgraph, CUgraphNode, deps_arg, graph, node_graph};
use crate::{CUresult, guard, out};

/// `CUgraphEdgeData`: ports and type, 8 bytes in all; zero is a plain edge.
type EdgeData = [u8; 8];

/// The edges of `g`, (from, to).
fn edges(g: CUgraph) -> Result<std::sync::MutexGuard<'static, Vec<(usize, usize)>>, CUresult> {
    graph(g)?.edges.lock().map_err(|_| CUDA_ERROR_UNKNOWN)
}

/// Gives the copy `to` of graph `from` (the same operations, in order, under new handles) the
/// edges of `from`.
pub(crate) fn copy(from: CUgraph, to: CUgraph) -> Result<(), CUresult> {
    let (old, new) = (node_handles(from)?, node_handles(to)?);
    let at = |n: usize| old.iter().position(|&o| o == n).map(|i| new[i]);
    let copied: Vec<(usize, usize)> = edges(from)?
        .iter()
        .filter_map(|&(a, b)| Some((at(a)?, at(b)?)))
        .collect();
    *edges(to)? = copied;
    Ok(())
}

fn node_handles(g: CUgraph) -> Result<Vec<usize>, CUresult> {
    let mut count = 0usize;
    // SAFETY: counting only, then an array of that many handles.
    unsafe {
        match crate::graph::cuGraphGetNodes(g, std::ptr::null_mut(), &raw mut count) {
            CUDA_SUCCESS => {}
            e => return Err(e),
        }
        let mut nodes = vec![std::ptr::null_mut(); count];
        match crate::graph::cuGraphGetNodes(g, nodes.as_mut_ptr(), &raw mut count) {
            CUDA_SUCCESS => Ok(nodes.into_iter().map(|n| n as usize).collect()),
            e => Err(e),
        }
    }
}

/// The pairs `from[i]` → `to[i]` a call passes, each node of `g`.
fn pairs(
    g: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    count: usize,
) -> Result<Vec<(usize, usize)>, CUresult> {
    let from = deps_arg(g, from, count)?;
    let to = deps_arg(g, to, count)?;
    Ok(from.into_iter().zip(to).collect())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddDependencies(
    g: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    count: usize,
) -> CUresult {
    guard(|| {
        let wanted = pairs(g, from, to, count)?;
        let mut all = edges(g)?;
        for (i, e) in wanted.iter().enumerate() {
            // A node cannot depend on itself, and an existing edge cannot be added again.
            if e.0 == e.1 || all.contains(e) || wanted[..i].contains(e) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
        }
        all.extend(wanted);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddDependencies_v2(
    g: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    _edge_data: *const c_void,
    count: usize,
) -> CUresult {
    // SAFETY: the same contract, the edges' data apart.
    unsafe { cuGraphAddDependencies(g, from, to, count) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphRemoveDependencies(
    g: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    count: usize,
) -> CUresult {
    guard(|| {
        let unwanted = pairs(g, from, to, count)?;
        if count > 0
            && crate::graph::ops_of(g)?.iter().any(|op| {
                matches!(
                    op,
                    crate::graph::Op::MemAlloc { .. } | crate::graph::Op::MemFree { .. }
                )
            })
        {
            // Not in a graph with memory nodes, as the driver says.
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut all = edges(g)?;
        if unwanted.iter().any(|e| !all.contains(e)) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        all.retain(|e| !unwanted.contains(e));
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphRemoveDependencies_v2(
    g: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    _edge_data: *const c_void,
    count: usize,
) -> CUresult {
    // SAFETY: the same contract, the edges' data apart.
    unsafe { cuGraphRemoveDependencies(g, from, to, count) }
}

/// Writes `found` to the caller's arrays as the edge queries do: with every array NULL, only
/// the count; otherwise as many as `*count` says, the rest of a longer array NULL, and the
/// number found in `*count`.
///
/// # Safety
/// Each non-null array holds `*count` entries.
unsafe fn answer(
    found: &[(usize, usize)],
    first: *mut CUgraphNode,
    second: *mut CUgraphNode,
    data: *mut EdgeData,
    count: *mut usize,
) -> Result<(), CUresult> {
    if count.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if !first.is_null() {
        // SAFETY: the caller's count of entries in its arrays.
        let room = unsafe { *count };
        for i in 0..room {
            let e = found.get(i);
            // SAFETY: i < room, within each non-null array.
            unsafe {
                *first.add(i) = e.map_or(std::ptr::null_mut(), |e| e.0 as CUgraphNode);
                if !second.is_null() {
                    *second.add(i) = e.map_or(std::ptr::null_mut(), |e| e.1 as CUgraphNode);
                }
                if !data.is_null() {
                    *data.add(i) = [0; 8];
                }
            }
        }
    }
    out(count, found.len())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphGetEdges_v2(
    g: CUgraph,
    from: *mut CUgraphNode,
    to: *mut CUgraphNode,
    data: *mut EdgeData,
    count: *mut usize,
) -> CUresult {
    guard(|| {
        if from.is_null() != to.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let found = edges(g)?.clone();
        // SAFETY: the caller's arrays of `*count` entries.
        unsafe { answer(&found, from, to, data, count) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphGetEdges(
    g: CUgraph,
    from: *mut CUgraphNode,
    to: *mut CUgraphNode,
    count: *mut usize,
) -> CUresult {
    // SAFETY: the same contract without the edges' data.
    unsafe { cuGraphGetEdges_v2(g, from, to, std::ptr::null_mut(), count) }
}

/// The edges of `node`'s graph that end at it (`into`) or start from it, as (node, node)
/// with the other end first.
fn around(node: CUgraphNode, into: bool) -> Result<Vec<(usize, usize)>, CUresult> {
    let n = node as usize;
    Ok(edges(node_graph(node)?)?
        .iter()
        .filter_map(|&(a, b)| match into {
            true if b == n => Some((a, b)),
            false if a == n => Some((b, a)),
            _ => None,
        })
        .collect())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetDependencies_v2(
    node: CUgraphNode,
    deps: *mut CUgraphNode,
    data: *mut EdgeData,
    count: *mut usize,
) -> CUresult {
    // SAFETY: the caller's array of `*count` entries.
    guard(|| unsafe {
        answer(
            &around(node, true)?,
            deps,
            std::ptr::null_mut(),
            data,
            count,
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetDependencies(
    node: CUgraphNode,
    deps: *mut CUgraphNode,
    count: *mut usize,
) -> CUresult {
    // SAFETY: the same contract without the edges' data.
    unsafe { cuGraphNodeGetDependencies_v2(node, deps, std::ptr::null_mut(), count) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetDependentNodes_v2(
    node: CUgraphNode,
    dependents: *mut CUgraphNode,
    data: *mut EdgeData,
    count: *mut usize,
) -> CUresult {
    // SAFETY: the caller's array of `*count` entries.
    guard(|| unsafe {
        answer(
            &around(node, false)?,
            dependents,
            std::ptr::null_mut(),
            data,
            count,
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetDependentNodes(
    node: CUgraphNode,
    dependents: *mut CUgraphNode,
    count: *mut usize,
) -> CUresult {
    // SAFETY: the same contract without the edges' data.
    unsafe { cuGraphNodeGetDependentNodes_v2(node, dependents, std::ptr::null_mut(), count) }
}

/// Writes the graph as Graphviz DOT text to `path`: each node with its type, each edge. (The
/// driver's file says more of each node; the `flags` choosing what are accepted.)
/// `CUDA_ERROR_OPERATING_SYSTEM` where the file cannot be written, as with the driver.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphDebugDotPrint(
    g: CUgraph,
    path: *const std::ffi::c_char,
    _flags: std::ffi::c_uint,
) -> CUresult {
    guard(|| {
        if path.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated path, per the API.
        let path = unsafe { std::ffi::CStr::from_ptr(path) };
        let nodes = node_handles(g)?;
        let mut dot = format!("digraph dot {{\n subgraph cluster_{:x} {{\n", g as usize);
        for &n in &nodes {
            let kind = match crate::graph::node_op(n as CUgraphNode)? {
                crate::graph::Op::Kernel { .. } => "KERNEL",
                crate::graph::Op::Host { .. } => "HOST",
                crate::graph::Op::Empty => "EMPTY",
                crate::graph::Op::MemAlloc { .. } => "MEM_ALLOC",
                crate::graph::Op::MemFree { .. } => "MEM_FREE",
                crate::graph::Op::Memset { .. } => "MEMSET",
                crate::graph::Op::Memcpy { .. } => "MEMCPY",
                crate::graph::Op::Child { .. } => "GRAPH",
                crate::graph::Op::Conditional { .. } => "CONDITIONAL",
            };
            dot.push_str(&format!("  node_{n:x} [label=\"{kind}\"];\n"));
        }
        for (a, b) in edges(g)?.iter() {
            dot.push_str(&format!("  node_{a:x} -> node_{b:x};\n"));
        }
        dot.push_str(" }\n}\n");
        use std::os::unix::ffi::OsStrExt;
        std::fs::write(std::ffi::OsStr::from_bytes(path.to_bytes()), dot)
            .map_err(|_| CUDA_ERROR_OPERATING_SYSTEM)
    })
}
