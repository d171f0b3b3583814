//! CUDA graphs: the memory their allocation nodes take, counted where the library can see
//! it, and their kernels paced to the slice's SM share.
//!
//! The driver takes a graph allocation's memory when a launch reaches its node, from the
//! device's graph pool, which keeps it after the allocation is freed (for later launches)
//! until `cuDeviceGraphMemTrim`. The library keeps the same books per slice GPU:
//!
//! - **instantiate**: the graph's allocation and free nodes are read from the driver
//!   (`cuGraphGetNodes`, `cuGraphNodeGetType`, `cuGraph{MemAlloc,MemFree}NodeGetParams`, child
//!   graphs followed) and kept with the executable graph; a graph that cannot be read is not
//!   instantiated.
//! - **launch**: the pool must hold what is already allocated from it plus every allocation
//!   of the graph (an upper bound of the graph's peak: frees inside the graph are not
//!   subtracted); what it lacks is charged before the launch and kept as reserved. Then the
//!   graph's frees take their allocations (graph or stream-ordered memory) off the books.
//!   An upload (`cuGraphUpload`, or the instantiate flag) reserves the same way.
//! - **frees** by `cuMemFree`/`cuMemFreeAsync` return a graph allocation to the pool;
//!   **trim** gives back what the pool held beyond its allocations and the launches under
//!   way, down to what the driver itself still reserves after it (a graph launched and not
//!   finished keeps memory the books already count as free). It waits for no work: a
//!   synchronization would break a capture another thread holds open in the global mode.
//!
//! Pool figures are in 2 MiB pages, the driver's mapping granularity, so the books never hold
//! less than the driver does. A launch on a stream being captured is recorded into the outer
//! graph, whose own instantiate reads it.
//!
//! Where the slice has a share of the SMs, instantiate also sums the thread blocks of the
//! graph's kernel nodes (`cuGraphKernelNodeGetParams`), and each launch takes that many from
//! the pacing bucket, as that many separate launches would (`pacing`). It also keeps the
//! most local memory a thread of any of its kernels needs, and a launch charges the stack
//! growth that makes the driver take first, as a launch of that kernel would (`stack`). A
//! kernel node given new parameters in the executable graph alone
//! (`cuGraphExecKernelNodeSetParams{,_v2}`, `cuGraphExecNodeSetParams`), or a child graph
//! node given another graph (`cuGraphExecChildGraphNodeSetParams`, `cuGraphExecNodeSetParams`),
//! moves both (`graph_exec_params`): a tenant cannot instantiate a small kernel and launch a
//! large one in its place.
//!
//! Kernels count wherever they stand: in child graphs, and in the bodies of conditional nodes
//! (CUDA 12.3; `graph_bodies` keeps the bodies, which the driver tells only when the node is
//! made). Every body of an `if` or `switch` node is counted, though a launch runs one at
//! most. A `while` node runs its body as many times as the graph's own kernels decide, which
//! no launch can know: on a paced slice a graph holding one is not instantiated
//! (`CUDA_ERROR_NOT_SUPPORTED`, logged), as neither is a graph with a conditional node made
//! where the library did not see it. For the same reason a graph instantiated to be
//! launched from the GPU (`CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH`: kernels launch it,
//! and it may launch itself again) is not instantiated on a paced slice, nor a graph with a
//! kernel node the GPU may update (CUDA 12.4's device-updatable kernel nodes, whose grid a
//! kernel may change).

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::real_or_return;
use crate::api::real;
use crate::ffi::*;
use crate::log::log;
use crate::slice::{self, Kind, Slice};

const PAGE: u64 = 2 << 20;
/// `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`.
const RESERVED_MEM_CURRENT: c_int = 2;
/// How deep child graphs are followed; a deeper graph is refused.
const MAX_DEPTH: u32 = 32;

/// Executable graphs in the books (with memory nodes, or kernels to pace); launches of others
/// skip the books.
static TRACKED_EXECS: AtomicUsize = AtomicUsize::new(0);
/// Live graph allocations in the books; frees skip the books while there are none.
static LIVE_ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Allocation {
    gpu: usize,
    bytes: u64,
}

/// What an executable graph allocates (address → allocation) and frees, the thread blocks
/// of its kernels where they are paced, and the most local memory a thread of any of its
/// kernels needs.
#[derive(Clone, Default)]
struct ExecMemory {
    allocs: Vec<(CUdeviceptr, Allocation)>,
    frees: Vec<CUdeviceptr>,
    auto_free: bool,
    blocks: u64,
    local: u64,
    /// The blocks of each kernel node of the graph itself (not of its child graphs), where
    /// paced: what a later change of one node's parameters takes back. Moved into
    /// [`Books::node_blocks`] when the executable graph is remembered.
    node_blocks: HashMap<usize, u64>,
}

impl ExecMemory {
    fn tracked(&self) -> bool {
        !(self.allocs.is_empty() && self.frees.is_empty())
            || self.blocks > 0
            || self.local > super::stack::DEFAULT_STACK
    }
}

#[derive(Clone, Copy, Default)]
struct Pool {
    used: u64,
    reserved: u64,
    /// The allocations of graphs being launched or uploaded, from when the books reserved
    /// for them until the driver has the call: the pool must hold them meanwhile (those a
    /// graph frees itself are already out of `used`, and an upload's are in it not at all).
    launching: u64,
}

/// This process's graph memory.
#[derive(Default)]
pub struct Books {
    execs: HashMap<usize, ExecMemory>,
    /// Per executable graph, [`ExecMemory::node_blocks`] (kept apart: a launch copies its
    /// graph's [`ExecMemory`]).
    node_blocks: HashMap<usize, HashMap<usize, u64>>,
    /// Graph allocations a launch made and nothing freed yet.
    live: HashMap<CUdeviceptr, Allocation>,
    /// By slice position.
    pools: HashMap<usize, Pool>,
    /// Launches that may still run, and what their own frees gave back.
    running: super::graph_running::Running,
}

impl Books {
    /// Forgets the graph memory on slice position `gpu` (the driver freed it with the
    /// context).
    pub fn forget(&mut self, gpu: usize) {
        self.live.retain(|_, a| a.gpu != gpu);
        self.pools.remove(&gpu);
    }
}

fn books(s: &Slice) -> std::sync::MutexGuard<'_, Books> {
    s.graphs
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn pages(bytes: u64) -> u64 {
    bytes.div_ceil(PAGE).saturating_mul(PAGE)
}

/// The memory nodes of `graph` and of its child graphs.
fn read_graph(
    s: &Slice,
    graph: CUgraph,
    depth: u32,
    into: &mut ExecMemory,
) -> Result<(), CUresult> {
    if depth > MAX_DEPTH {
        log!("a graph nests child graphs deeper than {MAX_DEPTH}: not supported in a slice");
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    let nodes_of = real::cuGraphGetNodes().ok_or(CUDA_ERROR_NOT_SUPPORTED)?;
    let type_of = real::cuGraphNodeGetType().ok_or(CUDA_ERROR_NOT_SUPPORTED)?;
    let mut count = 0usize;
    // SAFETY: with a null array the driver only writes the count.
    let r = unsafe { nodes_of(graph, std::ptr::null_mut(), &raw mut count) };
    if r != CUDA_SUCCESS {
        return Err(r);
    }
    let mut nodes: Vec<CUgraphNode> = vec![std::ptr::null_mut(); count];
    // SAFETY: the array holds `count` entries; the driver writes at most that many.
    let r = unsafe { nodes_of(graph, nodes.as_mut_ptr(), &raw mut count) };
    if r != CUDA_SUCCESS {
        return Err(r);
    }
    nodes.truncate(count);
    for node in nodes {
        let mut typ: c_int = -1;
        // SAFETY: a node of the graph; the driver writes one CUgraphNodeType.
        let r = unsafe { type_of(node, &raw mut typ) };
        if r != CUDA_SUCCESS {
            return Err(r);
        }
        match typ {
            CU_GRAPH_NODE_TYPE_MEM_ALLOC => {
                let f = real::cuGraphMemAllocNodeGetParams().ok_or(CUDA_ERROR_NOT_SUPPORTED)?;
                // SAFETY: all-zero bytes are a valid CUDA_MEM_ALLOC_NODE_PARAMS (null
                // pointers, zero sizes); the driver overwrites it.
                let mut p: CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
                // SAFETY: an allocation node; the driver fills the parameters.
                let r = unsafe { f(node, &raw mut p) };
                if r != CUDA_SUCCESS {
                    return Err(r);
                }
                let location = p.pool_props.head.location;
                let gpu = (location.typ == CU_MEM_LOCATION_TYPE_DEVICE)
                    .then(|| s.position(location.id))
                    .flatten();
                let Some(gpu) = gpu else {
                    log!(
                        "a graph allocates on device {} (location type {}), outside this container's slice",
                        location.id,
                        location.typ
                    );
                    return Err(CUDA_ERROR_OUT_OF_MEMORY);
                };
                into.allocs.push((
                    p.dptr,
                    Allocation {
                        gpu,
                        bytes: pages(p.bytesize as u64),
                    },
                ));
            }
            CU_GRAPH_NODE_TYPE_MEM_FREE => {
                let f = real::cuGraphMemFreeNodeGetParams().ok_or(CUDA_ERROR_NOT_SUPPORTED)?;
                let mut dptr: CUdeviceptr = 0;
                // SAFETY: a free node; the driver writes one address.
                let r = unsafe { f(node, &raw mut dptr) };
                if r != CUDA_SUCCESS {
                    return Err(r);
                }
                into.frees.push(dptr);
            }
            CU_GRAPH_NODE_TYPE_KERNEL => {
                if s.paced && device_updatable(node) {
                    log!(
                        "a graph has a kernel node the GPU may update (device-updatable) on a slice with a share of the SMs: its grid could grow unseen, unpaced; not supported"
                    );
                    return Err(CUDA_ERROR_NOT_SUPPORTED);
                }
                if let Some(p) = kernel_params(node) {
                    if s.paced {
                        let blocks = grid_blocks(&p);
                        into.blocks = into.blocks.saturating_add(blocks);
                        if depth == 0 {
                            into.node_blocks.insert(node as usize, blocks);
                        }
                    }
                    let f = if p.func.is_null() { p.kern } else { p.func };
                    into.local = into.local.max(super::stack::local_bytes(f));
                }
            }
            CU_GRAPH_NODE_TYPE_MEMSET if s.paced => {
                let f = real::cuGraphMemsetNodeGetParams().ok_or(CUDA_ERROR_NOT_SUPPORTED)?;
                let mut p = CUDA_MEMSET_NODE_PARAMS::default();
                // SAFETY: a memset node; the driver writes its v1 parameters.
                let r = unsafe { f(node, &raw mut p) };
                if r != CUDA_SUCCESS {
                    return Err(r);
                }
                let blocks = super::memset::node_blocks(&p);
                into.blocks = into.blocks.saturating_add(blocks);
                if depth == 0 {
                    into.node_blocks.insert(node as usize, blocks);
                }
            }
            CU_GRAPH_NODE_TYPE_GRAPH => {
                let f = real::cuGraphChildGraphNodeGetGraph().ok_or(CUDA_ERROR_NOT_SUPPORTED)?;
                let mut child: CUgraph = std::ptr::null_mut();
                // SAFETY: a child graph node; the driver writes the embedded graph's handle.
                let r = unsafe { f(node, &raw mut child) };
                if r != CUDA_SUCCESS {
                    return Err(r);
                }
                let before = into.blocks;
                read_graph(s, child, depth + 1, into)?;
                if depth == 0 && s.paced {
                    into.node_blocks.insert(node as usize, into.blocks - before);
                }
            }
            CU_GRAPH_NODE_TYPE_CONDITIONAL => {
                let Some(c) = super::graph_bodies::conditional(node) else {
                    log!(
                        "a graph has a conditional node made where this library did not see it; not supported in a slice"
                    );
                    return Err(CUDA_ERROR_NOT_SUPPORTED);
                };
                if c.kind == CU_GRAPH_COND_TYPE_WHILE && s.paced {
                    log!(
                        "a graph loops (a conditional while node) on a slice with a share of the SMs: its kernels could run any number of times a launch, unpaced; not supported"
                    );
                    return Err(CUDA_ERROR_NOT_SUPPORTED);
                }
                // Every body is counted, though an `if` or `switch` runs one at most.
                for body in c.bodies {
                    read_graph(s, body as CUgraph, depth + 1, into)?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Whether the kernel node `node` may be updated from the GPU (CUDA 12.4); no on a driver
/// that does not know the attribute.
fn device_updatable(node: CUgraphNode) -> bool {
    let Some(f) = real::cuGraphKernelNodeGetAttribute() else {
        return false;
    };
    let mut value = CUlaunchAttributeValue::default();
    // SAFETY: a kernel node; the driver writes one CUlaunchAttributeValue.
    let r = unsafe {
        f(
            node,
            CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE,
            &raw mut value,
        )
    };
    r == CUDA_SUCCESS && value.first_int() != 0
}

pub(super) fn grid_blocks(p: &CUDA_KERNEL_NODE_PARAMS_v2) -> u64 {
    u64::from(p.grid_dim_x) * u64::from(p.grid_dim_y) * u64::from(p.grid_dim_z)
}

/// A kernel node's parameters (None where the driver does not say).
fn kernel_params(node: CUgraphNode) -> Option<CUDA_KERNEL_NODE_PARAMS_v2> {
    // SAFETY: all-zero bytes are a valid CUDA_KERNEL_NODE_PARAMS_v2 (null pointers, zero
    // dimensions); it is large enough for either version the driver writes.
    let mut p: CUDA_KERNEL_NODE_PARAMS_v2 = unsafe { std::mem::zeroed() };
    let r = if let Some(f) = real::cuGraphKernelNodeGetParams_v2() {
        // SAFETY: a kernel node; the driver fills the parameters.
        unsafe { f(node, &raw mut p) }
    } else if let Some(f) = real::cuGraphKernelNodeGetParams() {
        // SAFETY: as above; the v1 structure is the head of the v2 one.
        unsafe { f(node, (&raw mut p).cast()) }
    } else {
        return None;
    };
    (r == CUDA_SUCCESS).then_some(p)
}

impl Books {
    /// Reserves what `allocs` need on top of what the pools hold now and, on each GPU they
    /// allocate on, what graphs the launch may run beside hold there (`beside`), charging the
    /// slice. Returns the growth per GPU (to undo), or None if the slice has no room.
    fn reserve(
        &mut self,
        s: &Slice,
        allocs: &[(CUdeviceptr, Allocation)],
        beside: &HashMap<usize, u64>,
    ) -> Option<Vec<(usize, u64)>> {
        let mut need: HashMap<usize, u64> = HashMap::new();
        for (ptr, a) in allocs {
            if !self.live.contains_key(ptr) {
                *need.entry(a.gpu).or_default() += a.bytes;
            }
        }
        for (gpu, bytes) in &mut need {
            *bytes += beside.get(gpu).copied().unwrap_or(0);
        }
        let mut grown = Vec::new();
        for (gpu, bytes) in need {
            let pool = self.pools.entry(gpu).or_default();
            let grow = pool
                .used
                .saturating_add(bytes)
                .saturating_sub(pool.reserved);
            if grow == 0 {
                continue;
            }
            if !s.charge(gpu, grow) {
                self.unreserve(s, &grown);
                return None;
            }
            self.pools.entry(gpu).or_default().reserved += grow;
            grown.push((gpu, grow));
        }
        Some(grown)
    }

    fn unreserve(&mut self, s: &Slice, grown: &[(usize, u64)]) {
        for &(gpu, grow) in grown {
            let pool = self.pools.entry(gpu).or_default();
            pool.reserved = pool.reserved.saturating_sub(grow);
            s.refund(gpu, grow);
        }
    }

    fn allocate(&mut self, ptr: CUdeviceptr, a: Allocation) {
        if self.live.insert(ptr, a).is_none() {
            self.pools.entry(a.gpu).or_default().used += a.bytes;
            LIVE_ALLOCATIONS.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Counts a graph's allocations `allocs` as being launched or uploaded
    /// ([`Pool::launching`]) until [`Books::launched`] with what it returns: per GPU, their
    /// bytes.
    fn launching(&mut self, allocs: &[(CUdeviceptr, Allocation)]) -> Vec<(usize, u64)> {
        let per_gpu = bytes_per_gpu(allocs.iter().map(|(_, a)| a));
        for &(gpu, bytes) in &per_gpu {
            self.pools.entry(gpu).or_default().launching += bytes;
        }
        per_gpu
    }

    /// The driver has the launch or upload [`Books::launching`] counted.
    fn launched(&mut self, under_way: &[(usize, u64)]) {
        for &(gpu, bytes) in under_way {
            let pool = self.pools.entry(gpu).or_default();
            pool.launching = pool.launching.saturating_sub(bytes);
        }
    }

    /// Takes a graph allocation off the books into its pool; None: not a live one.
    fn free(&mut self, ptr: CUdeviceptr) -> Option<Allocation> {
        let a = self.live.remove(&ptr)?;
        LIVE_ALLOCATIONS.fetch_sub(1, Ordering::AcqRel);
        let pool = self.pools.entry(a.gpu).or_default();
        pool.used = pool.used.saturating_sub(a.bytes);
        Some(a)
    }
}

fn launch(
    exec: CUgraphExec,
    stream: CUstream,
    ptsz: bool,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    if TRACKED_EXECS.load(Ordering::Acquire) == 0 {
        return call();
    }
    let Some(s) = slice::get() else {
        return call();
    };
    let Some(e) = books(s).execs.get(&(exec as usize)).cloned() else {
        return call();
    };
    let _capture = super::capture::hold();
    if super::alloc::capturing(stream, ptsz) {
        return call();
    }
    let paced = if e.blocks > 0 {
        crate::pacing::pace(s, e.blocks, stream, ptsz)
    } else {
        None
    };
    let call = move || {
        let r = call();
        if let Some(p) = paced {
            p.launched(r, stream, ptsz);
        }
        r
    };
    let local = e.local;
    let call = move || {
        if local > super::stack::DEFAULT_STACK {
            super::stack::with_stack_of(local, || local, call)
        } else {
            call()
        }
    };
    if e.allocs.is_empty() && e.frees.is_empty() {
        return call();
    }
    let mut b = books(s);
    let mut auto_freed = Vec::new();
    if e.auto_free {
        for (ptr, _) in &e.allocs {
            if let Some(a) = b.free(*ptr) {
                auto_freed.push((*ptr, a));
            }
        }
    }
    let beside = if e.allocs.is_empty() {
        HashMap::new()
    } else {
        let on = super::graph_running::stream_key(stream, ptsz);
        b.running.held_beside(exec as usize, on)
    };
    let Some(grown) = b.reserve(s, &e.allocs, &beside) else {
        for (ptr, a) in auto_freed {
            b.allocate(ptr, a);
        }
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    let mut allocated = Vec::new();
    for (ptr, a) in &e.allocs {
        if !b.live.contains_key(ptr) {
            b.allocate(*ptr, *a);
            allocated.push(*ptr);
        }
    }
    let mut freed = Vec::new();
    for ptr in &e.frees {
        if let Some(a) = b.free(*ptr) {
            freed.push((*ptr, a));
        }
    }
    let under_way = b.launching(&e.allocs);
    drop(b);
    let r = call();
    if !under_way.is_empty() || r != CUDA_SUCCESS {
        let mut b = books(s);
        b.launched(&under_way);
        if r != CUDA_SUCCESS {
            // Undone in the reverse order.
            for (ptr, a) in freed {
                b.allocate(ptr, a);
            }
            for ptr in allocated {
                b.free(ptr);
            }
            for (ptr, a) in auto_freed {
                b.allocate(ptr, a);
            }
            b.unreserve(s, &grown);
            return r;
        }
        let freed_inside = own_frees(&e);
        if !freed_inside.is_empty() {
            b.running
                .launched(exec as usize, stream, ptsz, freed_inside);
        }
    }
    // Stream-ordered memory made outside the graph and freed by it.
    for ptr in &e.frees {
        if let Some(c) = s.take(Kind::Memory, *ptr) {
            s.settle(c);
            super::pool_reserve::freed(s, *ptr);
        }
    }
    r
}

/// Per slice GPU, the bytes of the allocations a graph frees itself.
fn own_frees(e: &ExecMemory) -> Vec<(usize, u64)> {
    bytes_per_gpu(
        e.allocs
            .iter()
            .filter(|(ptr, _)| e.frees.contains(ptr))
            .map(|(_, a)| a),
    )
}

/// The bytes of `allocs`, summed per slice GPU.
fn bytes_per_gpu<'a>(allocs: impl Iterator<Item = &'a Allocation>) -> Vec<(usize, u64)> {
    let mut per_gpu: Vec<(usize, u64)> = Vec::new();
    for a in allocs {
        match per_gpu.iter_mut().find(|(gpu, _)| *gpu == a.gpu) {
            Some((_, bytes)) => *bytes += a.bytes,
            None => per_gpu.push((a.gpu, a.bytes)),
        }
    }
    per_gpu
}

pub unsafe fn graph_launch(exec: CUgraphExec, stream: CUstream) -> CUresult {
    let f = real_or_return!(cuGraphLaunch);
    // SAFETY: the caller's arguments, passed on unchanged.
    launch(exec, stream, false, || unsafe { f(exec, stream) })
}

pub unsafe fn graph_launch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult {
    let f = real_or_return!(cuGraphLaunch_ptsz);
    // SAFETY: the caller's arguments, passed on unchanged.
    launch(exec, stream, true, || unsafe { f(exec, stream) })
}

fn upload(exec: CUgraphExec, call: impl FnOnce() -> CUresult) -> CUresult {
    if TRACKED_EXECS.load(Ordering::Acquire) == 0 {
        return call();
    }
    let Some(s) = slice::get() else {
        return call();
    };
    let mut b = books(s);
    let Some(e) = b.execs.get(&(exec as usize)).cloned() else {
        drop(b);
        return call();
    };
    let Some(grown) = b.reserve(s, &e.allocs, &HashMap::new()) else {
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    let under_way = b.launching(&e.allocs);
    drop(b);
    let r = call();
    let mut b = books(s);
    b.launched(&under_way);
    if r != CUDA_SUCCESS {
        b.unreserve(s, &grown);
    }
    r
}

pub unsafe fn graph_upload(exec: CUgraphExec, stream: CUstream) -> CUresult {
    let f = real_or_return!(cuGraphUpload);
    // SAFETY: the caller's arguments, passed on unchanged.
    upload(exec, || unsafe { f(exec, stream) })
}

pub unsafe fn graph_upload_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult {
    let f = real_or_return!(cuGraphUpload_ptsz);
    // SAFETY: the caller's arguments, passed on unchanged.
    upload(exec, || unsafe { f(exec, stream) })
}

/// Instantiates `graph` into `*exec` with `flags`, keeping its memory nodes in the books.
/// `upload_stream`: the instantiate also uploads (and so may map the graph's memory).
fn instantiate(
    graph: CUgraph,
    exec: *mut CUgraphExec,
    flags: u64,
    upload_stream: bool,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some(s) = slice::get() else {
        return call();
    };
    if flags & CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH != 0 && s.paced {
        log!(
            "a graph instantiated for launches from the GPU on a slice with a share of the SMs: kernels could launch it any number of times, unpaced; not supported"
        );
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    let mut memory = ExecMemory {
        auto_free: flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH != 0,
        ..ExecMemory::default()
    };
    // The graph the driver instantiates is the graph read (`graph_edits`).
    let _settled = super::graph_edits::settled();
    if let Err(e) = read_graph(s, graph, 0, &mut memory) {
        log!("a graph's memory nodes could not be read (error {e}); it is not instantiated");
        return e;
    }
    if !memory.tracked() {
        return call();
    }
    let grown = if upload_stream {
        match books(s).reserve(s, &memory.allocs, &HashMap::new()) {
            Some(g) => g,
            None => return CUDA_ERROR_OUT_OF_MEMORY,
        }
    } else {
        Vec::new()
    };
    let r = call();
    if r != CUDA_SUCCESS {
        books(s).unreserve(s, &grown);
        return r;
    }
    // SAFETY: the driver wrote the new executable graph's handle on success.
    if let Some(e) = (!exec.is_null()).then(|| unsafe { exec.read() }) {
        remember(s, e, memory);
    }
    r
}

fn remember(s: &Slice, exec: CUgraphExec, mut memory: ExecMemory) {
    let mut books = books(s);
    let nodes = std::mem::take(&mut memory.node_blocks);
    if !nodes.is_empty() {
        books.node_blocks.insert(exec as usize, nodes);
    }
    if books.execs.insert(exec as usize, memory).is_none() {
        TRACKED_EXECS.fetch_add(1, Ordering::AcqRel);
    }
}

/// `ctx` is about to be destroyed: the events the books keep in it go with it.
pub fn forget_context(s: &Slice, ctx: CUcontext) {
    books(s).running.forget_context(ctx as usize);
}

fn forget(s: &Slice, exec: CUgraphExec) {
    let mut books = books(s);
    books.node_blocks.remove(&(exec as usize));
    books.running.forget_exec(exec as usize);
    if books.execs.remove(&(exec as usize)).is_some() {
        TRACKED_EXECS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a node of an executable graph runs at each launch: its thread blocks (where the
/// slice is paced) and the most local memory a thread of its kernels needs.
#[derive(Clone, Copy, Default)]
pub(super) struct Work {
    pub(super) blocks: u64,
    pub(super) local: u64,
}

/// A node of `exec` given new work by `call` (which changes the executable graph alone):
/// once the driver took it, the books follow. The graph's blocks, where paced, trade the
/// node's old blocks for the new ones (a node not read at instantiate, as one inside a
/// conditional's body, had none counted on its own: its new blocks come on top); the most
/// local memory a thread of its kernels needs never goes down (the old kernel may stand in
/// another node too), so a launch charges the stack the new kernel makes the driver grow, as
/// a launch of it would.
pub(super) fn set_node(
    s: &Slice,
    exec: CUgraphExec,
    node: CUgraphNode,
    work: Work,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let r = call();
    if r != CUDA_SUCCESS {
        return r;
    }
    let mut books = books(s);
    let Books {
        execs, node_blocks, ..
    } = &mut *books;
    let key = exec as usize;
    let known = execs.contains_key(&key);
    let e = execs.entry(key).or_default();
    if s.paced {
        let old = node_blocks
            .entry(key)
            .or_default()
            .insert(node as usize, work.blocks)
            .unwrap_or(0);
        e.blocks = e.blocks.saturating_sub(old).saturating_add(work.blocks);
    }
    e.local = e.local.max(work.local);
    if !known {
        if e.tracked() {
            TRACKED_EXECS.fetch_add(1, Ordering::AcqRel);
        } else {
            execs.remove(&key);
            node_blocks.remove(&key);
        }
    }
    r
}

/// What the nodes of `child` (a graph given to a child graph node) run at each launch; a
/// graph that cannot be read is an error. The caller holds [`super::graph_edits::settled`]
/// from before this read until the driver took the change.
pub(super) fn child_work(s: &Slice, child: CUgraph) -> Result<Work, CUresult> {
    let mut read = ExecMemory::default();
    read_graph(s, child, 1, &mut read)?;
    Ok(Work {
        blocks: read.blocks,
        local: read.local,
    })
}

type WithLog = unsafe extern "C" fn(
    *mut CUgraphExec,
    CUgraph,
    *mut CUgraphNode,
    *mut c_char,
    usize,
) -> CUresult;

/// The CUDA 11 forms (`cuGraphInstantiate`, `_v2`): an error node and a log, no flags.
fn with_log(
    f: WithLog,
    exec: *mut CUgraphExec,
    graph: CUgraph,
    error_node: *mut CUgraphNode,
    log: *mut c_char,
    log_size: usize,
) -> CUresult {
    // SAFETY: the caller's arguments, passed on unchanged.
    instantiate(graph, exec, 0, false, || unsafe {
        f(exec, graph, error_node, log, log_size)
    })
}

pub unsafe fn graph_instantiate_v1(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    error_node: *mut CUgraphNode,
    log: *mut c_char,
    log_size: usize,
) -> CUresult {
    let f = real_or_return!(cuGraphInstantiate);
    with_log(f, exec, graph, error_node, log, log_size)
}

pub unsafe fn graph_instantiate_v2(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    error_node: *mut CUgraphNode,
    log: *mut c_char,
    log_size: usize,
) -> CUresult {
    let f = real_or_return!(cuGraphInstantiate_v2);
    with_log(f, exec, graph, error_node, log, log_size)
}

pub unsafe fn graph_instantiate_with_flags(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    flags: u64,
) -> CUresult {
    let f = real_or_return!(cuGraphInstantiateWithFlags);
    // SAFETY: the caller's arguments, passed on unchanged.
    instantiate(graph, exec, flags, false, || unsafe {
        f(exec, graph, flags)
    })
}

type WithParams =
    unsafe extern "C" fn(*mut CUgraphExec, CUgraph, *mut CUDA_GRAPH_INSTANTIATE_PARAMS) -> CUresult;

fn with_params(
    f: WithParams,
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
) -> CUresult {
    // The driver is given the copy whose flags are read here; what it writes into it (the
    // result, the error node) is copied back.
    // SAFETY: read only if non-null; the caller's parameters.
    let mut copy = unsafe { params.as_ref() }.copied();
    let flags = copy.map_or(0, |p| p.flags);
    let upload = flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD != 0;
    let given = copy.as_mut().map_or(params, std::ptr::from_mut);
    // SAFETY: the caller's arguments, the parameters as copied.
    let r = instantiate(graph, exec, flags, upload, || unsafe {
        f(exec, graph, given)
    });
    if let Some(c) = copy {
        // SAFETY: the caller's non-null parameters, written whole.
        unsafe { params.write(c) };
    }
    r
}

pub unsafe fn graph_instantiate_with_params(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
) -> CUresult {
    with_params(
        real_or_return!(cuGraphInstantiateWithParams),
        exec,
        graph,
        params,
    )
}

pub unsafe fn graph_instantiate_with_params_ptsz(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
) -> CUresult {
    with_params(
        real_or_return!(cuGraphInstantiateWithParams_ptsz),
        exec,
        graph,
        params,
    )
}

/// An update keeps the executable graph's handle but takes the new graph's nodes.
fn update(exec: CUgraphExec, graph: CUgraph, call: impl FnOnce() -> CUresult) -> CUresult {
    let Some(s) = slice::get() else {
        return call();
    };
    let auto_free = books(s)
        .execs
        .get(&(exec as usize))
        .is_some_and(|e| e.auto_free);
    let mut memory = ExecMemory {
        auto_free,
        ..ExecMemory::default()
    };
    let _settled = super::graph_edits::settled();
    if let Err(e) = read_graph(s, graph, 0, &mut memory) {
        log!("a graph's memory nodes could not be read (error {e}); the update is refused");
        return e;
    }
    let r = call();
    if r == CUDA_SUCCESS {
        forget(s, exec);
        if memory.tracked() {
            remember(s, exec, memory);
        }
    }
    r
}

pub unsafe fn graph_exec_update_v1(
    exec: CUgraphExec,
    graph: CUgraph,
    error_node: *mut CUgraphNode,
    result: *mut c_int,
) -> CUresult {
    let f = real_or_return!(cuGraphExecUpdate);
    // SAFETY: the caller's arguments, passed on unchanged.
    update(exec, graph, || unsafe {
        f(exec, graph, error_node, result)
    })
}

pub unsafe fn graph_exec_update_v2(
    exec: CUgraphExec,
    graph: CUgraph,
    info: *mut c_void,
) -> CUresult {
    let f = real_or_return!(cuGraphExecUpdate_v2);
    // SAFETY: the caller's arguments, passed on unchanged.
    update(exec, graph, || unsafe { f(exec, graph, info) })
}

pub unsafe fn graph_exec_destroy(exec: CUgraphExec) -> CUresult {
    let f = real_or_return!(cuGraphExecDestroy);
    // SAFETY: the caller's argument, passed on unchanged.
    let r = unsafe { f(exec) };
    if r == CUDA_SUCCESS
        && let Some(s) = slice::get()
    {
        forget(s, exec);
    }
    r
}

/// `cuMemFree`/`cuMemFreeAsync` of a graph allocation: back into its pool if the driver
/// frees it. None (and `call` not made): `ptr` is no graph allocation this process holds.
pub fn free_graph_allocation(
    s: &Slice,
    ptr: CUdeviceptr,
    call: impl FnOnce() -> CUresult,
) -> Option<CUresult> {
    if LIVE_ALLOCATIONS.load(Ordering::Acquire) == 0 {
        return None;
    }
    let a = books(s).free(ptr)?;
    let r = call();
    if r != CUDA_SUCCESS {
        books(s).allocate(ptr, a);
    }
    Some(r)
}

pub unsafe fn device_graph_mem_trim(dev: CUdevice) -> CUresult {
    let f = real_or_return!(cuDeviceGraphMemTrim);
    // SAFETY: the caller's argument, passed on unchanged.
    let call = || unsafe { f(dev) };
    let Some(s) = slice::get() else {
        return call();
    };
    let Some(gpu) = s.position(dev) else {
        return call();
    };
    // Held through the trim: no launch reserves or ends meanwhile.
    let mut b = books(s);
    let r = call();
    if r != CUDA_SUCCESS {
        return r;
    }
    // What the driver keeps after the trim is in use by a graph launched and not finished;
    // where it cannot say, nothing is given back.
    let Some(kept) = driver_reserved(dev) else {
        return r;
    };
    let pool = b.pools.entry(gpu).or_default();
    let keep = pages(kept).max(pool.used.saturating_add(pool.launching));
    let spare = pool.reserved.saturating_sub(keep);
    pool.reserved -= spare;
    drop(b);
    s.refund(gpu, spare);
    r
}

/// What the driver's graph pool on `dev` reserves for this process.
fn driver_reserved(dev: CUdevice) -> Option<u64> {
    let f = real::cuDeviceGetGraphMemAttribute()?;
    let mut v: u64 = 0;
    // SAFETY: the attribute is a cuuint64_t, written to a local.
    let r = unsafe { f(dev, RESERVED_MEM_CURRENT, (&raw mut v).cast()) };
    (r == CUDA_SUCCESS).then_some(v)
}
