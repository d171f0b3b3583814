//! A graph is read as the driver instantiates it. Instantiating (or updating an executable
//! graph from a graph) reads the graph's memory nodes and kernels (`graph`), then the driver
//! instantiates it: a node another thread of the tenant added in between (an allocation node,
//! a kernel needing a larger stack) would run at every launch, never charged. NVIDIA's
//! documentation has a graph "not internally synchronized": calls on one graph must not
//! overlap, so no program that keeps to it waits here. The calls that change what a graph
//! runs hold a read lock; reading a graph to instantiate or update takes the write lock until
//! the driver is done. Work captured into a graph (`cuStreamBeginCaptureToGraph`, a
//! conditional node's body) is not held so: a capture running into a graph being
//! instantiated is not covered.

use std::cell::Cell;
use std::ffi::{c_int, c_void};

use crate::ffi::*;

use super::gate::{Gate, Passage};
use super::real_or_return;

thread_local! {
    static OPEN: Cell<u32> = const { Cell::new(0) };
}

/// Passed shared by the calls that change a graph, alone by reading one to instantiate it.
static EDITS: Gate = Gate::new(&OPEN);

/// While it lives, no graph is being read to be instantiated.
pub(crate) fn editing() -> Passage {
    EDITS.shared()
}

/// While it lives, no graph changes.
pub(crate) fn settled() -> Passage {
    EDITS.alone()
}

/// A hook that passes a graph-changing call to the driver under [`editing`].
macro_rules! edit {
    ($hook:ident => $real:ident ( $($arg:ident : $ty:ty),* )) => {
        pub unsafe fn $hook($($arg: $ty),*) -> CUresult {
            let f = real_or_return!($real);
            let _edit = editing();
            // SAFETY: the caller's arguments, passed on unchanged.
            unsafe { f($($arg),*) }
        }
    };
}

edit!(graph_add_kernel_node => cuGraphAddKernelNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, count: usize, params: *const c_void));
edit!(graph_add_kernel_node_v2 => cuGraphAddKernelNode_v2(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, count: usize, params: *const CUDA_KERNEL_NODE_PARAMS_v2));
edit!(graph_add_mem_alloc_node => cuGraphAddMemAllocNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, count: usize, params: *mut CUDA_MEM_ALLOC_NODE_PARAMS));
edit!(graph_add_mem_free_node => cuGraphAddMemFreeNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, count: usize, dptr: CUdeviceptr));
edit!(graph_add_child_graph_node => cuGraphAddChildGraphNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, count: usize, child: CUgraph));
edit!(graph_add_memset_node => cuGraphAddMemsetNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, count: usize, params: *const CUDA_MEMSET_NODE_PARAMS, ctx: CUcontext));
edit!(graph_kernel_node_set_params => cuGraphKernelNodeSetParams(node: CUgraphNode, params: *const c_void));
edit!(graph_kernel_node_set_params_v2 => cuGraphKernelNodeSetParams_v2(node: CUgraphNode, params: *const CUDA_KERNEL_NODE_PARAMS_v2));
edit!(graph_memset_node_set_params => cuGraphMemsetNodeSetParams(node: CUgraphNode, params: *const CUDA_MEMSET_NODE_PARAMS));
edit!(graph_kernel_node_set_attribute => cuGraphKernelNodeSetAttribute(node: CUgraphNode, attr: c_int, value: *const CUlaunchAttributeValue));
edit!(graph_kernel_node_copy_attributes => cuGraphKernelNodeCopyAttributes(dst: CUgraphNode, src: CUgraphNode));
edit!(graph_destroy_node => cuGraphDestroyNode(node: CUgraphNode));
