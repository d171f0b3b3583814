//! CUDA graphs, as far as programs that capture and replay work need them: a graph is a list
//! of recorded operations (kernel launches, memsets, host functions, empty nodes, memory
//! allocation and free nodes); stream capture records the launches, memsets, host functions
//! and stream-ordered allocations and frees issued on a capturing stream instead of running
//! them; an
//! instantiated graph replays its operations at each `cuGraphLaunch`, kernels taking their
//! simulated time.
//!
//! Memory nodes behave as the driver's (`graph_memory`): the node's address is fixed when the
//! node is made, the memory is taken from the device's graph pool when a launch reaches the
//! node and goes back to the pool at a free node, `cuMemFree` or `cuMemFreeAsync`; launching a
//! graph whose earlier allocation is still held fails, unless it was instantiated to free it
//! on launch. A free node may also free stream-ordered memory made outside the graph.

use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};

use gpuslice_cuda_abi::cuda::{
    CU_GRAPH_NODE_TYPE_CONDITIONAL, CU_GRAPH_NODE_TYPE_EMPTY, CU_GRAPH_NODE_TYPE_GRAPH,
    CU_GRAPH_NODE_TYPE_HOST, CU_GRAPH_NODE_TYPE_KERNEL, CU_GRAPH_NODE_TYPE_MEM_ALLOC,
    CU_GRAPH_NODE_TYPE_MEM_FREE, CU_GRAPH_NODE_TYPE_MEMCPY, CU_GRAPH_NODE_TYPE_MEMSET,
    CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_LOCATION_TYPE_DEVICE,
    CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH, CUDA_GRAPH_INSTANTIATE_PARAMS,
    CUDA_KERNEL_NODE_PARAMS_v2, CUDA_MEM_ALLOC_NODE_PARAMS, CUDA_MEMSET_NODE_PARAMS, CUmemLocation,
    CUmemPoolProps, CUmemPropHead,
};
pub use gpuslice_cuda_abi::cuda::{CUgraph, CUgraphExec, CUgraphNode};

use crate::codes::*;
use crate::paths::{CUfunction, CUstream};
use crate::{CUresult, current_ctx, guard, out, state};
use crate::{graph_bodies, graph_memory};

/// One recorded operation.
#[derive(Clone, Copy)]
pub enum Op {
    /// A kernel launch: function, grid and block dimensions, dynamic shared memory.
    Kernel {
        func: usize,
        grid: [c_uint; 3],
        block: [c_uint; 3],
        shared: c_uint,
    },
    Host {
        function: unsafe extern "C" fn(*mut c_void),
        data: usize,
    },
    Empty,
    MemAlloc {
        ptr: u64,
    },
    MemFree {
        ptr: u64,
    },
    /// A memset node (`graph_memset`).
    Memset {
        params: CUDA_MEMSET_NODE_PARAMS,
    },
    /// A memcpy node (`graph_memcpy`).
    Memcpy {
        params: crate::graph_memcpy::Copy3D,
    },
    /// A child graph node: runs the graph it owns (`graph_bodies`).
    Child {
        graph: usize,
    },
    /// A conditional node: its handle, kind and bodies by this number (`graph_bodies`).
    Conditional {
        id: usize,
    },
}

/// A graph's operations, in the order they were added; graphs own their nodes.
pub struct Graph {
    ops: Mutex<Vec<Op>>,
    /// Node handles given out for this graph, forgotten with the graph.
    nodes: Mutex<Vec<usize>>,
    /// Dependency edges between its nodes, (from, to), in the order they were made
    /// (`graph_edges`). The simulation runs a graph's operations in the order they were
    /// added, which every edge agrees with (a node depends only on nodes made before it),
    /// except edges added afterwards between existing nodes.
    pub(crate) edges: Mutex<Vec<(usize, usize)>>,
}

pub struct Exec {
    /// Replaced whole by an update.
    pub(crate) ops: Mutex<Vec<Op>>,
    /// Each launch first frees what the previous one allocated and did not free.
    auto_free: bool,
}

static GRAPHS: LazyLock<Mutex<HashSet<usize>>> = LazyLock::new(|| Mutex::new(HashSet::new()));
static EXECS: LazyLock<Mutex<HashSet<usize>>> = LazyLock::new(|| Mutex::new(HashSet::new()));
/// Node handle → (graph, operation number).
static NODES: LazyLock<Mutex<HashMap<usize, (usize, usize)>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));
/// Node handles are distinct non-null values, never reused.
static NEXT_NODE: AtomicUsize = AtomicUsize::new(0x10_0000);

/// The graph and operation number behind a node handle.
fn node_place(node: CUgraphNode) -> Result<(usize, usize), CUresult> {
    NODES
        .lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .get(&(node as usize))
        .copied()
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// The operation number of a node in its graph (and in graphs instantiated from it).
pub(crate) fn node_index(node: CUgraphNode) -> Result<usize, CUresult> {
    Ok(node_place(node)?.1)
}

/// The handle of the node at operation number `index` of `g`.
pub(crate) fn node_at(g: CUgraph, index: usize) -> Result<CUgraphNode, CUresult> {
    // Copied out first: node_place takes NODES, which cuGraphDestroy takes before `nodes`.
    let nodes = graph(g)?
        .nodes
        .lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .clone();
    nodes
        .into_iter()
        .find(|&n| node_place(n as CUgraphNode).is_ok_and(|(_, i)| i == index))
        .map(|n| n as CUgraphNode)
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// The operation behind a node handle.
pub(crate) fn node_op(node: CUgraphNode) -> Result<Op, CUresult> {
    let (g, index) = node_place(node)?;
    ops_of(g as CUgraph)?
        .get(index)
        .copied()
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// Gives the node `node` the operation `op` in its graph (graphs instantiated before keep
/// theirs).
pub(crate) fn set_node_op(node: CUgraphNode, op: Op) -> Result<(), CUresult> {
    let (g, index) = node_place(node)?;
    let mut ops = graph(g as CUgraph)?
        .ops
        .lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?;
    let slot = ops.get_mut(index).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    *slot = op;
    Ok(())
}

/// A copy of the operations of `g`.
pub(crate) fn ops_of(g: CUgraph) -> Result<Vec<Op>, CUresult> {
    Ok(graph(g)?
        .ops
        .lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .clone())
}

/// Gives `g` the operations `ops` (as many as it had: its node handles stay).
pub(crate) fn set_ops(g: CUgraph, ops: Vec<Op>) -> Result<(), CUresult> {
    *graph(g)?.ops.lock().map_err(|_| CUDA_ERROR_UNKNOWN)? = ops;
    Ok(())
}

pub(crate) fn graph(g: CUgraph) -> Result<&'static Graph, CUresult> {
    if g.is_null()
        || !GRAPHS
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .contains(&(g as usize))
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: registered in GRAPHS: a Box leaked by new_graph and not yet dropped.
    Ok(unsafe { &*g.cast::<Graph>() })
}

/// A new empty graph, registered.
pub(crate) fn new_graph() -> Result<CUgraph, CUresult> {
    let g = Box::into_raw(Box::new(Graph {
        ops: Mutex::new(Vec::new()),
        nodes: Mutex::new(Vec::new()),
        edges: Mutex::new(Vec::new()),
    }));
    GRAPHS
        .lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .insert(g as usize);
    Ok(g.cast())
}

/// Appends `op` to `g` and returns a handle for its node.
pub(crate) fn record(g: CUgraph, op: Op) -> Result<CUgraphNode, CUresult> {
    let gr = graph(g)?;
    let index = {
        let mut ops = gr.ops.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
        ops.push(op);
        ops.len() - 1
    };
    let node = NEXT_NODE.fetch_add(16, Ordering::Relaxed);
    NODES
        .lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .insert(node, (g as usize, index));
    gr.nodes.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?.push(node);
    Ok(node as CUgraphNode)
}

/// The dependencies a node-adding call passes (`deps`, `count` of them), each a node of `g`.
pub(crate) fn deps_arg(
    g: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
) -> Result<Vec<usize>, CUresult> {
    if count == 0 {
        return Ok(Vec::new());
    }
    if deps.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's array of `count` node handles, non-null.
    let deps = unsafe { std::slice::from_raw_parts(deps, count) };
    deps.iter()
        .map(|&d| match node_place(d)? {
            (owner, _) if owner == g as usize => Ok(d as usize),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        })
        .collect()
}

/// Appends `op` to `g` as a node depending on `deps` (nodes of `g`: [`deps_arg`]).
pub(crate) fn record_after(g: CUgraph, deps: &[usize], op: Op) -> Result<CUgraphNode, CUresult> {
    let node = record(g, op)?;
    graph(g)?
        .edges
        .lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .extend(deps.iter().map(|&d| (d, node as usize)));
    Ok(node)
}

/// A node-adding call's work: the dependencies checked, then `op` made and appended to `g`
/// after them, its handle written to `node`.
pub(crate) fn add_node(
    node: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    op: impl FnOnce() -> Result<Op, CUresult>,
) -> Result<(), CUresult> {
    let deps = deps_arg(g, deps, count)?;
    out(node, record_after(g, &deps, op()?)?)
}

/// The graph a node belongs to.
pub(crate) fn node_graph(node: CUgraphNode) -> Result<CUgraph, CUresult> {
    Ok(node_place(node)?.0 as CUgraph)
}

/// Runs one operation now, as a launch or host call on an idle stream would.
pub(crate) fn run(op: Op) -> Result<(), CUresult> {
    run_in(op, None)
}

/// As [`run`], a kernel in context `ctx` (a stream's), else in the current one.
pub(crate) fn run_in(op: Op, ctx: Option<&crate::context::Ctx>) -> Result<(), CUresult> {
    match op {
        Op::Kernel { func, grid, .. } => {
            let ctx = match ctx {
                Some(c) => c,
                None => current_ctx()?,
            };
            crate::context::grow_stack_for_launch_in(ctx, crate::module::local_bytes(func))?;
            let blocks = grid.iter().map(|&g| u64::from(g)).product();
            let wait = state::get()?.launch(ctx.node_index, blocks);
            if !wait.is_zero() {
                std::thread::sleep(wait);
            }
        }
        // SAFETY: the program's host function with its own argument, as it asked.
        Op::Host { function, data } => unsafe { function(data as *mut c_void) },
        Op::Empty => {}
        Op::MemAlloc { ptr } => graph_memory::take(ptr)?,
        Op::MemFree { ptr } => {
            if !graph_memory::release_in_graph(ptr)? {
                state::get()?.free(ptr)?;
                crate::pool_books::freed(ptr)?;
            }
        }
        Op::Memset { params } => crate::copy::memset_2d(&params)?,
        Op::Memcpy { params } => crate::graph_memcpy::run(&params)?,
        Op::Child { graph } => graph_bodies::run_graph(graph)?,
        Op::Conditional { id } => graph_bodies::run_conditional(id)?,
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphCreate(g: *mut CUgraph, _flags: c_uint) -> CUresult {
    guard(|| out(g, new_graph()?))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphDestroy(g: CUgraph) -> CUresult {
    guard(|| {
        let gr = graph(g)?;
        GRAPHS
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .remove(&(g as usize));
        let mut nodes = NODES.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
        for node in gr.nodes.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?.drain(..) {
            nodes.remove(&node);
        }
        crate::user_objects::graph_destroyed(g)?;
        crate::graph_clone::forget(g);
        // SAFETY: it was registered: a Box from new_graph, dropped only here.
        drop(unsafe { Box::from_raw(g.cast::<Graph>()) });
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphGetNodes(
    g: CUgraph,
    nodes: *mut CUgraphNode,
    count: *mut usize,
) -> CUresult {
    guard(|| {
        let gr = graph(g)?;
        let handles = gr.nodes.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
        if count.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if !nodes.is_null() {
            // SAFETY: the caller's array holds *count entries.
            let room = unsafe { *count };
            for (i, h) in handles.iter().take(room).enumerate() {
                // SAFETY: within the caller's array.
                unsafe { *nodes.add(i) = *h as CUgraphNode };
            }
        }
        out(count, handles.len())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddEmptyNode(
    node: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
) -> CUresult {
    guard(|| add_node(node, g, deps, count, || Ok(Op::Empty)))
}

/// A kernel launch's operation, refused as the driver refuses it.
pub(crate) fn kernel(
    func: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared: c_uint,
) -> Result<Op, CUresult> {
    if func.is_null() {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    if grid.contains(&0) || block.contains(&0) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(Op::Kernel {
        func: func as usize,
        grid,
        block,
        shared,
    })
}

/// Reads the head `CUDA_KERNEL_NODE_PARAMS` v1 and v2 share (up to `extra`), and where
/// `whole` (v2 and the generic node parameters' v3), the kernel handle (`kern`) that stands
/// for the function when `func` is NULL (a library's kernel: the same handle here).
pub(crate) fn kernel_op(
    params: *const CUDA_KERNEL_NODE_PARAMS_v2,
    whole: bool,
) -> Result<Op, CUresult> {
    if params.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's CUDA_KERNEL_NODE_PARAMS; only the fields v1 has are read, each
    // through the raw pointer (no reference to the whole v2 structure is made).
    let (func, grid, block, shared) = unsafe {
        (
            (*params).func,
            [
                (*params).grid_dim_x,
                (*params).grid_dim_y,
                (*params).grid_dim_z,
            ],
            [
                (*params).block_dim_x,
                (*params).block_dim_y,
                (*params).block_dim_z,
            ],
            (*params).shared_mem_bytes,
        )
    };
    let func = if func.is_null() && whole {
        // SAFETY: a v2 (or v3) structure, which has the kernel handle.
        unsafe { (*params).kern.cast() }
    } else {
        func
    };
    kernel(func, grid, block, shared).map_err(|_| CUDA_ERROR_INVALID_VALUE)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddKernelNode_v2(
    node: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    params: *const CUDA_KERNEL_NODE_PARAMS_v2,
) -> CUresult {
    add_kernel_node(node, g, deps, count, params, true)
}

/// Takes a `CUDA_KERNEL_NODE_PARAMS` v1, the head of the v2 structure (only that is read).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddKernelNode(
    node: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    params: *const c_void,
) -> CUresult {
    add_kernel_node(node, g, deps, count, params.cast(), false)
}

fn add_kernel_node(
    node: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    params: *const CUDA_KERNEL_NODE_PARAMS_v2,
    whole: bool,
) -> CUresult {
    guard(|| add_node(node, g, deps, count, || kernel_op(params, whole)))
}

/// `CUDA_HOST_NODE_PARAMS`.
#[repr(C)]
pub struct HostNodeParams {
    function: Option<unsafe extern "C" fn(*mut c_void)>,
    data: *mut c_void,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddHostNode(
    node: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    params: *const HostNodeParams,
) -> CUresult {
    guard(|| {
        let deps = deps_arg(g, deps, count)?;
        if params.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's CUDA_HOST_NODE_PARAMS.
        let p = unsafe { &*params };
        let function = p.function.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(
            node,
            record_after(
                g,
                &deps,
                Op::Host {
                    function,
                    data: p.data as usize,
                },
            )?,
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    node: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    params: *mut CUDA_MEM_ALLOC_NODE_PARAMS,
) -> CUresult {
    guard(|| {
        let deps = deps_arg(g, deps, count)?;
        if params.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's CUDA_MEM_ALLOC_NODE_PARAMS.
        let p = unsafe { &mut *params };
        let location = p.pool_props.head.location;
        if location.typ != CU_MEM_LOCATION_TYPE_DEVICE {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ptr = graph_memory::reserve(location.id, p.bytesize as u64)?;
        p.dptr = ptr;
        out(node, record_after(g, &deps, Op::MemAlloc { ptr })?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemFreeNode(
    node: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    dptr: u64,
) -> CUresult {
    guard(|| {
        let deps = deps_arg(g, deps, count)?;
        if dptr == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(node, record_after(g, &deps, Op::MemFree { ptr: dptr })?)
    })
}

/// `ops` with a copy of every graph their nodes run, so that changing those graphs later
/// changes no executable graph.
pub(crate) fn copied(ops: Vec<Op>) -> Result<Vec<Op>, CUresult> {
    ops.into_iter().map(graph_bodies::copy_op).collect()
}

fn instantiate(exec: *mut CUgraphExec, g: CUgraph, flags: u64) -> Result<(), CUresult> {
    let ops = copied(ops_of(g)?)?;
    let e = Box::into_raw(Box::new(Exec {
        ops: Mutex::new(ops),
        auto_free: flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH != 0,
    }));
    EXECS
        .lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .insert(e as usize);
    crate::user_objects::shared(g as usize, e as usize)?;
    out(exec, e.cast())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut CUgraphExec,
    g: CUgraph,
    flags: c_ulonglong,
) -> CUresult {
    guard(|| instantiate(exec, g, flags))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    exec: *mut CUgraphExec,
    g: CUgraph,
    _error_node: *mut CUgraphNode,
    _log: *mut c_char,
    _log_size: usize,
) -> CUresult {
    guard(|| instantiate(exec, g, 0))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate(
    exec: *mut CUgraphExec,
    g: CUgraph,
    error_node: *mut CUgraphNode,
    log: *mut c_char,
    log_size: usize,
) -> CUresult {
    // SAFETY: the same contract as cuGraphInstantiate_v2.
    unsafe { cuGraphInstantiate_v2(exec, g, error_node, log, log_size) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    exec: *mut CUgraphExec,
    g: CUgraph,
    params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
) -> CUresult {
    guard(|| {
        if params.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's CUDA_GRAPH_INSTANTIATE_PARAMS.
        let p = unsafe { &mut *params };
        instantiate(exec, g, p.flags)?;
        // CUDA_GRAPH_INSTANTIATE_SUCCESS.
        p.result = 0;
        Ok(())
    })
}

/// A copy of the operations of the executable graph `e`.
pub(crate) fn exec_ops(e: CUgraphExec) -> Result<Vec<Op>, CUresult> {
    Ok(exec_of(e)?
        .ops
        .lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .clone())
}

pub(crate) fn exec_of(e: CUgraphExec) -> Result<&'static Exec, CUresult> {
    if e.is_null()
        || !EXECS
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .contains(&(e as usize))
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: registered in EXECS: a Box leaked by instantiate and not yet dropped.
    Ok(unsafe { &*e.cast::<Exec>() })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphLaunch(e: CUgraphExec, s: CUstream) -> CUresult {
    launch_graph(e, s, false)
}

/// Launches `e` on `s` (`ptsz`: through the per-thread default stream's variant).
fn launch_graph(e: CUgraphExec, s: CUstream, ptsz: bool) -> CUresult {
    guard(|| {
        let ex = exec_of(e)?;
        let ops = ex.ops.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?.clone();
        // A launch on a capturing stream is itself recorded, as a child would be.
        let mut held = crate::stream::hold(s)?;
        if held.graph().is_some() {
            for op in &ops {
                held.record(*op)?;
            }
            return Ok(());
        }
        drop(held);
        if ex.auto_free {
            for op in &ops {
                if let Op::MemAlloc { ptr } = op
                    && graph_memory::held(*ptr) == Some(true)
                {
                    graph_memory::release(*ptr)?;
                }
            }
        }
        let launch = graph_memory::Launch {
            stream: graph_memory::stream_key(s, ptsz),
            exec: e as usize,
        };
        graph_memory::as_launch(launch, || ops.iter().try_for_each(|op| run(*op)))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphUpload(e: CUgraphExec, _s: CUstream) -> CUresult {
    guard(|| exec_of(e).map(|_| ()))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphExecDestroy(e: CUgraphExec) -> CUresult {
    guard(|| {
        exec_of(e)?;
        EXECS
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .remove(&(e as usize));
        crate::user_objects::exec_destroyed(e)?;
        // SAFETY: it was registered: a Box from instantiate, dropped only here.
        drop(unsafe { Box::from_raw(e.cast::<Exec>()) });
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphLaunch_ptsz(e: CUgraphExec, s: CUstream) -> CUresult {
    launch_graph(e, s, true)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphUpload_ptsz(e: CUgraphExec, s: CUstream) -> CUresult {
    cuGraphUpload(e, s)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithParams_ptsz(
    exec: *mut CUgraphExec,
    g: CUgraph,
    params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuGraphInstantiateWithParams(exec, g, params) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetType(node: CUgraphNode, typ: *mut c_int) -> CUresult {
    guard(|| {
        let t = match node_op(node)? {
            Op::Kernel { .. } => CU_GRAPH_NODE_TYPE_KERNEL,
            Op::Host { .. } => CU_GRAPH_NODE_TYPE_HOST,
            Op::Empty => CU_GRAPH_NODE_TYPE_EMPTY,
            Op::MemAlloc { .. } => CU_GRAPH_NODE_TYPE_MEM_ALLOC,
            Op::MemFree { .. } => CU_GRAPH_NODE_TYPE_MEM_FREE,
            Op::Memset { .. } => CU_GRAPH_NODE_TYPE_MEMSET,
            Op::Memcpy { .. } => CU_GRAPH_NODE_TYPE_MEMCPY,
            Op::Child { .. } => CU_GRAPH_NODE_TYPE_GRAPH,
            Op::Conditional { .. } => CU_GRAPH_NODE_TYPE_CONDITIONAL,
        };
        out(typ, t)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphMemAllocNodeGetParams(
    node: CUgraphNode,
    params: *mut CUDA_MEM_ALLOC_NODE_PARAMS,
) -> CUresult {
    guard(|| {
        let Op::MemAlloc { ptr } = node_op(node)? else {
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        let (ordinal, bytes) = graph_memory::params(ptr)?;
        let pool_props = CUmemPoolProps {
            head: CUmemPropHead {
                typ: CU_MEM_ALLOCATION_TYPE_PINNED,
                handle_types: 0,
                location: CUmemLocation {
                    typ: CU_MEM_LOCATION_TYPE_DEVICE,
                    id: ordinal,
                },
            },
            win32_security_attributes: std::ptr::null_mut(),
            rest: [0; 64],
        };
        out(
            params,
            CUDA_MEM_ALLOC_NODE_PARAMS {
                pool_props,
                access_descs: std::ptr::null(),
                access_desc_count: 0,
                bytesize: usize::try_from(bytes).map_err(|_| CUDA_ERROR_INVALID_VALUE)?,
                dptr: ptr,
            },
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphMemFreeNodeGetParams(
    node: CUgraphNode,
    dptr: *mut u64,
) -> CUresult {
    guard(|| {
        let Op::MemFree { ptr } = node_op(node)? else {
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        out(dptr, ptr)
    })
}
