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
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::ffi::*;

use super::real_or_return;

static EDITS: RwLock<()> = RwLock::new(());

thread_local! {
    /// How many guards this thread holds (an edit's driver call may run another hook).
    static HELD: Cell<u32> = const { Cell::new(0) };
}

/// Held by a call that changes a graph, or by one reading a graph to instantiate it.
pub(crate) struct Guard {
    _read: Option<RwLockReadGuard<'static, ()>>,
    _write: Option<RwLockWriteGuard<'static, ()>>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        HELD.with(|h| h.set(h.get().saturating_sub(1)));
    }
}

fn outermost() -> bool {
    HELD.with(|h| {
        let n = h.get();
        h.set(n + 1);
        n == 0
    })
}

/// While it lives, no graph is being read to be instantiated.
pub(crate) fn editing() -> Guard {
    let outer = outermost();
    Guard {
        _read: outer.then(|| {
            EDITS
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }),
        _write: None,
    }
}

/// While it lives, no graph changes.
pub(crate) fn settled() -> Guard {
    let outer = outermost();
    Guard {
        _read: None,
        _write: outer.then(|| {
            EDITS
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }),
    }
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
