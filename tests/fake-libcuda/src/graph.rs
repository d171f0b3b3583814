//! CUDA graphs, as far as programs that capture and replay work need them: a graph is a list
//! of recorded operations (kernel launches, host functions, empty nodes, memory allocation and
//! free nodes); stream capture records the launches, host functions and stream-ordered
//! allocations and frees issued on a capturing stream instead of running them; an
//! instantiated graph replays its operations at each `cuGraphLaunch`, kernels taking their
//! simulated time.
//!
//! Memory nodes behave as the driver's: the node's address is fixed when the node is made, the
//! memory is taken (and charged to the device) when the graph is launched and given back by a
//! free node, `cuMemFree`/`cuMemFreeAsync`, never before; launching a graph whose earlier
//! allocation is still held fails. In a slice the interception library refuses memory nodes.

use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use std::sync::{LazyLock, Mutex};

use crate::codes::*;
use crate::paths::{CUfunction, CUstream};
use crate::{CUresult, current_ctx, guard, out, state};

pub type CUgraph = *mut c_void;
pub type CUgraphExec = *mut c_void;
pub type CUgraphNode = *mut c_void;

/// One recorded operation.
#[derive(Clone, Copy)]
pub enum Op {
    Kernel {
        blocks: u64,
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
}

/// A graph allocation: its device, size, and whether a launch holds it now.
struct GraphMemory {
    index: usize,
    bytes: u64,
    held: bool,
}

/// Graph allocations by address, for the life of the process (their addresses are reserved
/// when the node is made, as the driver's are).
static GRAPH_MEMORY: LazyLock<Mutex<std::collections::HashMap<u64, GraphMemory>>> =
    LazyLock::new(|| Mutex::new(std::collections::HashMap::new()));

/// Reserves `bytes` of address space on node GPU `index` for a memory node; nothing is
/// charged until a launch.
pub(crate) fn reserve(index: usize, bytes: u64) -> Result<u64, CUresult> {
    let len = usize::try_from(bytes).map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
    if len == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: an anonymous private mapping; no existing memory is touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    GRAPH_MEMORY.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?.insert(
        p as u64,
        GraphMemory {
            index,
            bytes,
            held: false,
        },
    );
    Ok(p as u64)
}

/// Gives back a graph allocation a launch holds (`cuMemFree`, `cuMemFreeAsync`, a free
/// node). Ok(false): `ptr` is no graph allocation.
pub(crate) fn release(ptr: u64) -> Result<bool, CUresult> {
    let mut all = GRAPH_MEMORY.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
    let Some(m) = all.get_mut(&ptr) else {
        return Ok(false);
    };
    if !m.held {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let d = state::get()?;
    d.uncharge(&mut d.lock(), m.index, m.bytes);
    m.held = false;
    Ok(true)
}

/// Whether `ptr` is a graph allocation (held or not).
pub(crate) fn is_graph_memory(ptr: u64) -> Result<bool, CUresult> {
    Ok(GRAPH_MEMORY
        .lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .contains_key(&ptr))
}

/// A node handle points at its graph's node number; graphs own their nodes.
pub struct Graph {
    ops: Mutex<Vec<Op>>,
    /// Node handles given out for this graph (boxed indexes), freed with the graph.
    nodes: Mutex<Vec<usize>>,
}

pub struct Exec {
    ops: Vec<Op>,
}

static GRAPHS: LazyLock<Mutex<HashSet<usize>>> = LazyLock::new(|| Mutex::new(HashSet::new()));
static EXECS: LazyLock<Mutex<HashSet<usize>>> = LazyLock::new(|| Mutex::new(HashSet::new()));

fn graph(g: CUgraph) -> Result<&'static Graph, CUresult> {
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
    let node = Box::into_raw(Box::new(index)) as usize;
    gr.nodes.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?.push(node);
    Ok(node as CUgraphNode)
}

/// Runs one operation now, as a launch or host call on an idle stream would.
pub(crate) fn run(op: Op) -> Result<(), CUresult> {
    match op {
        Op::Kernel { blocks, .. } => {
            let wait = state::get()?.launch(current_ctx()?.node_index, blocks);
            if !wait.is_zero() {
                std::thread::sleep(wait);
            }
        }
        // SAFETY: the program's host function with its own argument, as it asked.
        Op::Host { function, data } => unsafe { function(data as *mut c_void) },
        Op::Empty => {}
        Op::MemAlloc { ptr } => {
            let mut all = GRAPH_MEMORY.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
            let m = all.get_mut(&ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            // The previous launch's allocation must be freed before the graph runs again.
            if m.held {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let d = state::get()?;
            d.charge(&mut d.lock(), m.index, m.bytes)?;
            m.held = true;
        }
        Op::MemFree { ptr } => {
            release(ptr)?;
        }
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
        for node in gr.nodes.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?.drain(..) {
            // SAFETY: a Box<usize> made by record, freed only here.
            drop(unsafe { Box::from_raw(node as *mut usize) });
        }
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
    _deps: *const CUgraphNode,
    _count: usize,
) -> CUresult {
    guard(|| out(node, record(g, Op::Empty)?))
}

/// `CUDA_KERNEL_NODE_PARAMS`: the fields up to the block dimensions are what is read.
#[repr(C)]
pub struct KernelNodeParams {
    func: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
}

fn kernel_op(params: *const KernelNodeParams) -> Result<Op, CUresult> {
    if params.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's CUDA_KERNEL_NODE_PARAMS, whose head this is.
    let p = unsafe { &*params };
    if p.func.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if p.grid.contains(&0) || p.block.contains(&0) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(Op::Kernel {
        blocks: p.grid.iter().map(|&g| u64::from(g)).product(),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddKernelNode_v2(
    node: *mut CUgraphNode,
    g: CUgraph,
    _deps: *const CUgraphNode,
    _count: usize,
    params: *const KernelNodeParams,
) -> CUresult {
    guard(|| out(node, record(g, kernel_op(params)?)?))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddKernelNode(
    node: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    params: *const KernelNodeParams,
) -> CUresult {
    // SAFETY: the same contract; the v1 parameters are the head of the v2 ones.
    unsafe { cuGraphAddKernelNode_v2(node, g, deps, count, params) }
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
    _deps: *const CUgraphNode,
    _count: usize,
    params: *const HostNodeParams,
) -> CUresult {
    guard(|| {
        if params.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's CUDA_HOST_NODE_PARAMS.
        let p = unsafe { &*params };
        let function = p.function.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(
            node,
            record(
                g,
                Op::Host {
                    function,
                    data: p.data as usize,
                },
            )?,
        )
    })
}

/// The head of `CUDA_MEM_ALLOC_NODE_PARAMS`: pool properties (88 bytes, the location at 8),
/// access descriptors, then the size and the address the driver fills in.
#[repr(C)]
pub struct MemAllocNodeParams {
    pool_props: [u8; 88],
    access: *const c_void,
    access_count: usize,
    bytesize: usize,
    dptr: u64,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    node: *mut CUgraphNode,
    g: CUgraph,
    _deps: *const CUgraphNode,
    _count: usize,
    params: *mut MemAllocNodeParams,
) -> CUresult {
    guard(|| {
        graph(g)?;
        if params.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's CUDA_MEM_ALLOC_NODE_PARAMS.
        let p = unsafe { &mut *params };
        let location_type = i32::from_le_bytes(p.pool_props[8..12].try_into().unwrap_or_default());
        let location_id = i32::from_le_bytes(p.pool_props[12..16].try_into().unwrap_or_default());
        if location_type != gpuslice_cuda_abi::cuda::CU_MEM_LOCATION_TYPE_DEVICE {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let index = state::get()?.node_index(location_id)?;
        let ptr = reserve(index, p.bytesize as u64)?;
        p.dptr = ptr;
        out(node, record(g, Op::MemAlloc { ptr })?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemFreeNode(
    node: *mut CUgraphNode,
    g: CUgraph,
    _deps: *const CUgraphNode,
    _count: usize,
    dptr: u64,
) -> CUresult {
    guard(|| {
        if !is_graph_memory(dptr)? {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(node, record(g, Op::MemFree { ptr: dptr })?)
    })
}

fn instantiate(exec: *mut CUgraphExec, g: CUgraph) -> Result<(), CUresult> {
    let ops = graph(g)?
        .ops
        .lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .clone();
    let e = Box::into_raw(Box::new(Exec { ops }));
    EXECS
        .lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .insert(e as usize);
    out(exec, e.cast())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut CUgraphExec,
    g: CUgraph,
    _flags: c_ulonglong,
) -> CUresult {
    guard(|| instantiate(exec, g))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    exec: *mut CUgraphExec,
    g: CUgraph,
    _error_node: *mut CUgraphNode,
    _log: *mut c_char,
    _log_size: usize,
) -> CUresult {
    guard(|| instantiate(exec, g))
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

/// `CUDA_GRAPH_INSTANTIATE_PARAMS`: flags, upload stream, error node out, result out.
#[repr(C)]
pub struct InstantiateParams {
    flags: c_ulonglong,
    upload_stream: CUstream,
    error_node: CUgraphNode,
    result: c_int,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    exec: *mut CUgraphExec,
    g: CUgraph,
    params: *mut InstantiateParams,
) -> CUresult {
    guard(|| {
        instantiate(exec, g)?;
        if !params.is_null() {
            // SAFETY: the caller's CUDA_GRAPH_INSTANTIATE_PARAMS; `result` is an out field
            // (CUDA_GRAPH_INSTANTIATE_SUCCESS).
            unsafe { (*params).result = 0 };
        }
        Ok(())
    })
}

fn exec_of(e: CUgraphExec) -> Result<&'static Exec, CUresult> {
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
    guard(|| {
        let ex = exec_of(e)?;
        // A launch on a capturing stream is itself recorded, as a child would be.
        if let Some(g) = crate::stream::capturing_graph(s)? {
            for op in &ex.ops {
                record(g, *op)?;
            }
            return Ok(());
        }
        for op in &ex.ops {
            run(*op)?;
        }
        Ok(())
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
        // SAFETY: it was registered: a Box from instantiate, dropped only here.
        drop(unsafe { Box::from_raw(e.cast::<Exec>()) });
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphLaunch_ptsz(e: CUgraphExec, s: CUstream) -> CUresult {
    cuGraphLaunch(e, s)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphUpload_ptsz(e: CUgraphExec, s: CUstream) -> CUresult {
    cuGraphUpload(e, s)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithParams_ptsz(
    exec: *mut CUgraphExec,
    g: CUgraph,
    params: *mut InstantiateParams,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuGraphInstantiateWithParams(exec, g, params) }
}
