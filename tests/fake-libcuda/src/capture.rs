//! Stream capture: work issued on a capturing stream is recorded into a graph instead of run
//! (begin, end, status and capture information, the thread's capture mode, the dependency set
//! of the next captured node), and the capture spreads across streams as the driver spreads
//! it: a stream waiting on an event recorded in a capture joins it (a fork) or adds the
//! record's nodes to its dependencies (a join); only the stream that began a capture ends it,
//! and only once every fork's work is joined back into it.

use std::cell::Cell;
use std::collections::HashSet;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use gpuslice_cuda_abi::cuda::CUgraph;

use crate::codes::*;
use crate::paths::CUstream;
use crate::stream::{STREAMS, Stream, stream};
use crate::{CUresult, guard, out};

/// `CU_STREAM_CAPTURE_STATUS_ACTIVE`.
pub(crate) const CAPTURE_ACTIVE: u8 = 1;
/// `CU_STREAM_CAPTURE_STATUS_INVALIDATED`.
pub(crate) const CAPTURE_INVALIDATED: u8 = 2;
/// `CU_STREAM_CAPTURE_MODE_GLOBAL`.
const CAPTURE_MODE_GLOBAL: c_int = 0;

/// Captures in progress in the global mode, in which no thread may make a call that is
/// unsafe while capturing (a synchronization among them).
pub(crate) static GLOBAL_CAPTURES: AtomicUsize = AtomicUsize::new(0);

/// An event recorded on a capturing stream: the capture, its graph, and the nodes work
/// waiting on it must follow (the stream's dependency set at the record).
#[derive(Clone)]
pub(crate) struct CapturedRecord {
    pub(crate) capture_id: u64,
    pub(crate) graph: usize,
    pub(crate) deps: Vec<usize>,
}

static NEXT_CAPTURE_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's `CUstreamCaptureMode` (`cuThreadExchangeStreamCaptureMode`).
    static CAPTURE_MODE: Cell<c_int> = const { Cell::new(0) };
}

/// The graph `s` is capturing into, if it is capturing: work issued on it is recorded there
/// instead of run.
pub(crate) fn capturing_graph(s: CUstream) -> Result<Option<crate::graph::CUgraph>, CUresult> {
    Ok(stream(s)?.and_then(|st| {
        (st.capture.load(Ordering::Acquire) == CAPTURE_ACTIVE)
            .then(|| st.graph.load(Ordering::Acquire) as crate::graph::CUgraph)
    }))
}

/// A stream's capture, held: while it lives the capture neither begins nor ends (each takes
/// the same lock), so that work found captured is recorded into a graph the capture still
/// owns, and work found not captured is not recorded into one another thread just got back.
pub(crate) struct Held {
    deps: Option<std::sync::MutexGuard<'static, Vec<usize>>>,
    graph: Option<crate::graph::CUgraph>,
}

/// Holds the capture of `s` (a default stream has none).
pub(crate) fn hold(s: CUstream) -> Result<Held, CUresult> {
    let Some(st) = stream(s)? else {
        return Ok(Held {
            deps: None,
            graph: None,
        });
    };
    let deps = st.deps.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
    let graph = (st.capture.load(Ordering::Acquire) == CAPTURE_ACTIVE)
        .then(|| st.graph.load(Ordering::Acquire) as crate::graph::CUgraph);
    Ok(Held {
        deps: Some(deps),
        graph,
    })
}

impl Held {
    /// The graph being captured into, if the stream is capturing.
    pub(crate) fn graph(&self) -> Option<crate::graph::CUgraph> {
        self.graph
    }

    /// Records `op` into the capture's graph as a node depending on its dependency set, which
    /// then becomes that node alone (as the driver chains the work captured on one stream).
    pub(crate) fn record(
        &mut self,
        op: crate::graph::Op,
    ) -> Result<crate::graph::CUgraphNode, CUresult> {
        let (Some(g), Some(deps)) = (self.graph, self.deps.as_mut()) else {
            return Err(CUDA_ERROR_ILLEGAL_STATE);
        };
        let node = crate::graph::record_after(g, deps, op)?;
        **deps = vec![node as usize];
        Ok(node)
    }
}

/// A call that is unsafe while a global-mode capture is in progress (`cuCtxSynchronize`):
/// as the driver does, it invalidates every such capture and is refused.
pub(crate) fn refuse_during_global_capture() -> Result<(), CUresult> {
    if GLOBAL_CAPTURES.load(Ordering::Acquire) == 0 {
        return Ok(());
    }
    for &s in STREAMS.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?.iter() {
        // SAFETY: registered in STREAMS: a Box leaked by create and not yet dropped.
        let st = unsafe { &*(s as *const Stream) };
        if st.global.load(Ordering::Acquire) {
            let _ = st.capture.compare_exchange(
                CAPTURE_ACTIVE,
                CAPTURE_INVALIDATED,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }
    Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
}

/// A call a thread may make while another thread's global-mode capture is open only in
/// the relaxed mode (`cuEventQuery`, `cuEventSynchronize`; PyTorch's and NCCL's watchdog
/// threads switch to it for that): from a thread in the global mode, the default, it
/// invalidates every such capture and is refused, as a synchronization is. A thread in the
/// thread-local mode is let through (it would be held only by a capture of its own).
pub(crate) fn refuse_unless_relaxed_during_global_capture() -> Result<(), CUresult> {
    if CAPTURE_MODE.with(Cell::get) != CAPTURE_MODE_GLOBAL {
        return Ok(());
    }
    refuse_during_global_capture()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(s: CUstream, mode: c_int) -> CUresult {
    guard(|| {
        // The default streams cannot be captured.
        let st = stream(s)?.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if st.capture.load(Ordering::Acquire) == CAPTURE_ACTIVE {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        begin_capture(st, crate::graph::new_graph()?, mode, Vec::new())
    })
}

/// Starts `st` capturing into `g` in capture mode `mode`, after the nodes `deps` of `g`.
fn begin_capture(
    st: &Stream,
    g: crate::graph::CUgraph,
    mode: c_int,
    deps: Vec<usize>,
) -> Result<(), CUresult> {
    let mut set = st.deps.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
    *set = deps;
    st.graph.store(g as usize, Ordering::Release);
    st.capture_id.store(
        NEXT_CAPTURE_ID.fetch_add(1, Ordering::Relaxed),
        Ordering::Release,
    );
    if mode == CAPTURE_MODE_GLOBAL {
        st.global.store(true, Ordering::Release);
        GLOBAL_CAPTURES.fetch_add(1, Ordering::AcqRel);
    }
    st.origin.store(true, Ordering::Release);
    st.capture.store(CAPTURE_ACTIVE, Ordering::Release);
    Ok(())
}

/// Begins capturing work issued on `s` into the existing graph `g` (CUDA 12.3), after
/// `count` of its nodes (`deps`): the bodies of conditional nodes are captured so. The edges'
/// data is accepted and not kept; `cuStreamEndCapture` answers `g`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamBeginCaptureToGraph(
    s: CUstream,
    g: crate::graph::CUgraph,
    deps: *const crate::graph::CUgraphNode,
    _edge_data: *const c_void,
    count: usize,
    mode: c_int,
) -> CUresult {
    guard(|| {
        let st = stream(s)?.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        crate::graph::graph(g)?;
        let given = crate::graph::deps_arg(g, deps, count)?;
        if st.capture.load(Ordering::Acquire) == CAPTURE_ACTIVE {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        begin_capture(st, g, mode, given)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamBeginCaptureToGraph_ptsz(
    s: CUstream,
    g: crate::graph::CUgraph,
    deps: *const crate::graph::CUgraphNode,
    edge_data: *const c_void,
    count: usize,
    mode: c_int,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuStreamBeginCaptureToGraph(s, g, deps, edge_data, count, mode) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamBeginCapture(s: CUstream) -> CUresult {
    // SAFETY: the same contract, in the global capture mode.
    unsafe { cuStreamBeginCapture_v2(s, 0) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamEndCapture(s: CUstream, graph: *mut *mut c_void) -> CUresult {
    guard(|| {
        let st = stream(s)?.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if st.capture.load(Ordering::Acquire) != 0 && !st.origin.load(Ordering::Acquire) {
            // A stream that joined another's capture: only the stream that began it ends it.
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
        }
        let unjoined = end_joined(st, s as usize)?;
        let _held = st.deps.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
        let status = st.capture.swap(0, Ordering::AcqRel);
        if st.global.swap(false, Ordering::AcqRel) {
            GLOBAL_CAPTURES.fetch_sub(1, Ordering::AcqRel);
        }
        if unjoined && status != 0 {
            // The capture ends on every stream, and its graph is not given.
            st.graph.store(0, Ordering::Release);
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
        }
        match status {
            CAPTURE_ACTIVE => out(graph, st.graph.swap(0, Ordering::AcqRel) as *mut c_void),
            CAPTURE_INVALIDATED => {
                st.graph.store(0, Ordering::Release);
                Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
            }
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamIsCapturing(s: CUstream, status: *mut c_int) -> CUresult {
    guard(|| {
        let capturing = stream(s)?.map_or(0, |st| st.capture.load(Ordering::Acquire));
        out(status, c_int::from(capturing))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2(
    s: CUstream,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut *mut c_void,
    deps: *mut *const *mut c_void,
    count: *mut usize,
) -> CUresult {
    guard(|| {
        let st = stream(s)?;
        let active = st.is_some_and(|st| st.capture.load(Ordering::Acquire) == CAPTURE_ACTIVE);
        out(status, c_int::from(active))?;
        if active && let Some(st) = st {
            if !id.is_null() {
                out(id, st.capture_id.load(Ordering::Acquire))?;
            }
            if !graph.is_null() {
                out(graph, st.graph.load(Ordering::Acquire) as *mut c_void)?;
            }
            // The dependency set, valid until the stream's next captured work or update.
            let set = st.deps.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
            if !deps.is_null() {
                let first = if set.is_empty() {
                    std::ptr::null()
                } else {
                    set.as_ptr().cast::<*mut c_void>()
                };
                out(deps, first)?;
            }
            if !count.is_null() {
                out(count, set.len())?;
            }
        }
        Ok(())
    })
}

/// CUDA 12.3's variant, with the data of each dependency edge (`edges`): NULL, which means
/// every edge is a plain one. A caller asking `cuGetProcAddress` for version 12.3 or later
/// calls it with this signature; given `_v2`, its count went where the edges' address should
/// be.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v3(
    s: CUstream,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut *mut c_void,
    deps: *mut *const *mut c_void,
    edges: *mut *const c_void,
    count: *mut usize,
) -> CUresult {
    // SAFETY: the same contract, the edges' address apart.
    let r = unsafe { cuStreamGetCaptureInfo_v2(s, status, id, graph, deps, count) };
    if r == CUDA_SUCCESS && !edges.is_null() {
        // SAFETY: non-null, per the API a pointer the caller owns.
        unsafe { edges.write(std::ptr::null()) };
    }
    r
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCaptureInfo(
    s: CUstream,
    status: *mut c_int,
    id: *mut u64,
) -> CUresult {
    // SAFETY: the same contract, without the graph and dependencies.
    unsafe {
        cuStreamGetCaptureInfo_v2(
            s,
            status,
            id,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(mode: *mut c_int) -> CUresult {
    guard(|| {
        if mode.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null; the caller's mode, exchanged with this thread's.
        let new = unsafe { *mode };
        out(mode, CAPTURE_MODE.with(|m| m.replace(new)))
    })
}

/// `st` waits on an event recorded in a capture: it joins that capture after the record's
/// nodes (a fork), or, capturing into it already, adds them to its dependency set (a join).
/// A stream capturing something else cannot wait on another capture's work
/// (`CUDA_ERROR_STREAM_CAPTURE_ISOLATION`).
pub(crate) fn wait_in_capture(st: &Stream, record: CapturedRecord) -> Result<(), CUresult> {
    let mut deps = st.deps.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
    match st.capture.load(Ordering::Acquire) {
        CAPTURE_ACTIVE if st.capture_id.load(Ordering::Acquire) == record.capture_id => {
            for d in record.deps {
                if !deps.contains(&d) {
                    deps.push(d);
                }
            }
            Ok(())
        }
        0 => {
            *deps = record.deps;
            st.graph.store(record.graph, Ordering::Release);
            st.capture_id.store(record.capture_id, Ordering::Release);
            st.origin.store(false, Ordering::Release);
            st.capture.store(CAPTURE_ACTIVE, Ordering::Release);
            Ok(())
        }
        _ => Err(CUDA_ERROR_STREAM_CAPTURE_ISOLATION),
    }
}

/// Ends the capture of `origin` (the stream `handle`, which began it) on every other stream
/// that joined it, and answers whether one of them has work not joined back: a node it
/// captured that `origin`'s last work does not depend on. The driver then refuses the end
/// (`CUDA_ERROR_STREAM_CAPTURE_UNJOINED`) and the capture ends everywhere.
fn end_joined(origin: &Stream, handle: usize) -> Result<bool, CUresult> {
    let capture_id = origin.capture_id.load(Ordering::Acquire);
    if capture_id == 0 || origin.capture.load(Ordering::Acquire) == 0 {
        return Ok(false);
    }
    let joined_back = {
        let tails = origin.deps.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?.clone();
        let g = origin.graph.load(Ordering::Acquire);
        ancestors(g as CUgraph, &tails)?
    };
    let mut unjoined = false;
    for &s in STREAMS.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?.iter() {
        if s == handle {
            continue;
        }
        // SAFETY: registered in STREAMS: a Box leaked by create and not yet dropped.
        let st = unsafe { &*(s as *const Stream) };
        if !st.origin.load(Ordering::Acquire)
            && st.capture_id.load(Ordering::Acquire) == capture_id
            && st.capture.load(Ordering::Acquire) != 0
        {
            let deps = st.deps.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
            unjoined |= deps.iter().any(|d| !joined_back.contains(d));
            st.capture.store(0, Ordering::Release);
            st.graph.store(0, Ordering::Release);
        }
    }
    Ok(unjoined)
}

/// The nodes of `g` that `tails` are or depend on, through its edges.
fn ancestors(g: CUgraph, tails: &[usize]) -> Result<HashSet<usize>, CUresult> {
    let mut found: HashSet<usize> = tails.iter().copied().collect();
    if g.is_null() {
        return Ok(found);
    }
    let edges = crate::graph::graph(g)?
        .edges
        .lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .clone();
    let mut todo: Vec<usize> = tails.to_vec();
    while let Some(node) = todo.pop() {
        for &(from, to) in &edges {
            if to == node && found.insert(from) {
                todo.push(from);
            }
        }
    }
    Ok(found)
}

same_as! {
    cuStreamUpdateCaptureDependencies_ptsz => cuStreamUpdateCaptureDependencies(s: CUstream, deps: *mut crate::graph::CUgraphNode, count: usize, flags: c_uint);
    cuStreamUpdateCaptureDependencies_v2_ptsz => cuStreamUpdateCaptureDependencies_v2(s: CUstream, deps: *mut crate::graph::CUgraphNode, edge_data: *const c_void, count: usize, flags: c_uint);
    cuStreamBeginCapture_v2_ptsz => cuStreamBeginCapture_v2(s: CUstream, mode: c_int);
    cuStreamBeginCapture_ptsz => cuStreamBeginCapture(s: CUstream);
    cuStreamGetCaptureInfo_ptsz => cuStreamGetCaptureInfo(s: CUstream, status: *mut c_int, id: *mut u64);
    cuStreamGetCaptureInfo_v2_ptsz => cuStreamGetCaptureInfo_v2(s: CUstream, status: *mut c_int, id: *mut u64, graph: *mut *mut c_void, deps: *mut *const *mut c_void, count: *mut usize);
    cuStreamGetCaptureInfo_v3_ptsz => cuStreamGetCaptureInfo_v3(s: CUstream, status: *mut c_int, id: *mut u64, graph: *mut *mut c_void, deps: *mut *const *mut c_void, edges: *mut *const c_void, count: *mut usize);
    cuStreamEndCapture_ptsz => cuStreamEndCapture(s: CUstream, graph: *mut *mut c_void);
    cuStreamIsCapturing_ptsz => cuStreamIsCapturing(s: CUstream, status: *mut c_int);
}

/// `CU_STREAM_ADD_CAPTURE_DEPENDENCIES` and `CU_STREAM_SET_CAPTURE_DEPENDENCIES`.
const ADD_CAPTURE_DEPENDENCIES: c_uint = 0;
const SET_CAPTURE_DEPENDENCIES: c_uint = 1;

/// Adds `deps` (nodes of the graph being captured) to the capture's dependency set, or sets
/// the set to them: what work captured next on the stream depends on (cuda.core's graph
/// builder joins a conditional node so). `CUDA_ERROR_ILLEGAL_STATE` where the stream is not
/// capturing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamUpdateCaptureDependencies(
    s: CUstream,
    deps: *mut crate::graph::CUgraphNode,
    count: usize,
    flags: c_uint,
) -> CUresult {
    guard(|| {
        let mut held = hold(s)?;
        let g = held.graph().ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
        let given = crate::graph::deps_arg(g, deps, count)?;
        let set = held.deps.as_mut().ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
        match flags {
            ADD_CAPTURE_DEPENDENCIES => {
                for d in given {
                    if !set.contains(&d) {
                        set.push(d);
                    }
                }
            }
            SET_CAPTURE_DEPENDENCIES => **set = given,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    })
}

/// CUDA 12.3's form, with data on each dependency's edge (accepted; every edge is a plain
/// one here).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamUpdateCaptureDependencies_v2(
    s: CUstream,
    deps: *mut crate::graph::CUgraphNode,
    _edge_data: *const c_void,
    count: usize,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the same contract, the edges' data apart.
    unsafe { cuStreamUpdateCaptureDependencies(s, deps, count, flags) }
}
