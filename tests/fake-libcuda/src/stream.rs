//! Streams and events. Work on the simulated device is done when it is issued (copies happen
//! at once, kernels take only their simulated time, waited for at synchronisation), so a
//! stream is always idle at a query, an event is complete once recorded, and a host function
//! queued on a stream runs before the call that queues it returns, as it would run on an idle
//! stream. An event records the host's monotonic clock, so `cuEventElapsedTime` measures what
//! happened between two records. Handles are checked before use: a destroyed stream or event
//! answers `CUDA_ERROR_INVALID_HANDLE`.

use std::cell::Cell;
use std::collections::HashSet;
use std::ffi::{c_float, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};

use crate::codes::*;
use crate::paths::CUstream;
use crate::stream_attributes::{
    cuStreamCopyAttributes, cuStreamGetAttribute, cuStreamSetAttribute,
};
use crate::{CUcontext, CUresult, current_ctx, guard, out};
use gpuslice_cuda_abi::cuda::{CUevent, CUgraph, CUlaunchAttributeValue};

/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`: the two default streams by name.
const STREAM_LEGACY: usize = 0x1;
const STREAM_PER_THREAD: usize = 0x2;

/// `CU_STREAM_CAPTURE_STATUS_ACTIVE`.
const CAPTURE_ACTIVE: u8 = 1;
/// `CU_STREAM_CAPTURE_STATUS_INVALIDATED`.
const CAPTURE_INVALIDATED: u8 = 2;
/// `CU_STREAM_CAPTURE_MODE_GLOBAL`.
const CAPTURE_MODE_GLOBAL: c_int = 0;

/// Captures in progress in the global mode, in which no thread may make a call that is
/// unsafe while capturing (a synchronization among them).
static GLOBAL_CAPTURES: AtomicUsize = AtomicUsize::new(0);

use gpuslice_cuda_abi::cuda::CU_EVENT_DISABLE_TIMING as EVENT_DISABLE_TIMING;

pub struct Stream {
    ctx: usize,
    flags: c_uint,
    priority: c_int,
    id: u64,
    capture: AtomicU8,
    /// Its capture is in the global mode.
    global: std::sync::atomic::AtomicBool,
    /// The graph being captured into (0 when not capturing).
    graph: AtomicUsize,
    capture_id: AtomicU64,
    /// The capture's dependency set: the nodes the next captured one will depend on (the
    /// last captured, or what `cuStreamUpdateCaptureDependencies` set).
    deps: std::sync::Mutex<Vec<usize>>,
    /// It began its capture (`cuStreamBeginCapture`); false for a stream that joined another's
    /// by waiting on an event recorded in it, which that stream's end ends.
    origin: std::sync::atomic::AtomicBool,
}

/// An event recorded on a capturing stream: the capture, its graph, and the nodes work
/// waiting on it must follow (the stream's dependency set at the record).
#[derive(Clone)]
struct CapturedRecord {
    capture_id: u64,
    graph: usize,
    deps: Vec<usize>,
}

pub struct Event {
    flags: c_uint,
    /// The context it was made in (its handle), which takes it along when destroyed.
    ctx: usize,
    /// Monotonic nanoseconds of the last record, 0 before any.
    recorded_ns: AtomicU64,
    /// Where the record time lives once the event is shared with other processes
    /// ([`crate::ipc`]), in place of `recorded_ns`.
    shared: std::sync::OnceLock<crate::ipc::SharedWord>,
    /// Threads waiting for it in `cuEventSynchronize`.
    waiters: AtomicU32,
    /// Its last record, where that was on a capturing stream: a stream that waits on it
    /// joins the capture (fork), or takes its nodes into its dependency set (join).
    captured: std::sync::Mutex<Option<CapturedRecord>>,
}

/// `CU_EVENT_INTERPROCESS`.
pub(crate) const EVENT_INTERPROCESS: c_uint = 0x4;

impl Event {
    /// Monotonic nanoseconds of its last record (in every process sharing it), 0 before any.
    fn recorded(&self) -> &AtomicU64 {
        self.shared.get().map_or(&self.recorded_ns, |w| w.word())
    }

    pub(crate) fn interprocess(&self) -> bool {
        self.flags & EVENT_INTERPROCESS != 0
    }

    /// The shared word its record time lives in, made (with its time so far) on first use.
    pub(crate) fn share(&self) -> Result<&crate::ipc::SharedWord, CUresult> {
        if self.shared.get().is_none() {
            let word = crate::ipc::SharedWord::new()?;
            word.word()
                .store(self.recorded_ns.load(Ordering::Acquire), Ordering::Release);
            // Another thread sharing it at once made one too: theirs is kept.
            let _ = self.shared.set(word);
        }
        self.shared.get().ok_or(CUDA_ERROR_UNKNOWN)
    }
}

/// Registers a new event of the current context; `shared`: another process's event opened
/// here ([`crate::ipc`]).
pub(crate) fn new_event(
    flags: c_uint,
    shared: Option<crate::ipc::SharedWord>,
) -> Result<CUevent, CUresult> {
    let ctx = current_ctx()?;
    let cell = std::sync::OnceLock::new();
    if let Some(word) = shared {
        let _ = cell.set(word);
    }
    let ev = Box::into_raw(Box::new(Event {
        flags,
        ctx: std::ptr::from_ref(ctx) as usize,
        recorded_ns: AtomicU64::new(0),
        shared: cell,
        waiters: AtomicU32::new(0),
        captured: std::sync::Mutex::new(None),
    }));
    EVENTS
        .lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .insert(ev as usize);
    Ok(ev.cast())
}

static STREAMS: LazyLock<Mutex<HashSet<usize>>> = LazyLock::new(|| Mutex::new(HashSet::new()));
static EVENTS: LazyLock<Mutex<HashSet<usize>>> = LazyLock::new(|| Mutex::new(HashSet::new()));
static NEXT_STREAM_ID: AtomicU64 = AtomicU64::new(16);

/// A stream this library made and has not destroyed; None for the default streams.
fn stream(s: CUstream) -> Result<Option<&'static Stream>, CUresult> {
    if s.is_null() || s as usize == STREAM_LEGACY || s as usize == STREAM_PER_THREAD {
        return Ok(None);
    }
    if !STREAMS
        .lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .contains(&(s as usize))
    {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    // SAFETY: registered in STREAMS: a Box leaked by create and not yet dropped.
    Ok(Some(unsafe { &*s.cast::<Stream>() }))
}

/// Whether `s` names one of the default streams (NULL, legacy, per-thread).
pub(crate) fn is_default(s: CUstream) -> bool {
    s.is_null() || s as usize == STREAM_LEGACY || s as usize == STREAM_PER_THREAD
}

/// The priority `s` was made with (0 for the default streams); `CUDA_ERROR_INVALID_HANDLE`
/// for a handle that is no stream.
pub(crate) fn priority_of(s: CUstream) -> Result<c_int, CUresult> {
    Ok(stream(s)?.map_or(0, |st| st.priority))
}

pub(crate) fn event(e: CUevent) -> Result<&'static Event, CUresult> {
    if e.is_null()
        || !EVENTS
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .contains(&(e as usize))
    {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    // SAFETY: registered in EVENTS: a Box leaked by cuEventCreate and not yet dropped.
    Ok(unsafe { &*e.cast::<Event>() })
}

fn create(out_stream: *mut CUstream, flags: c_uint, priority: c_int) -> Result<(), CUresult> {
    let ctx = std::ptr::from_ref(current_ctx()?) as usize;
    // Priorities outside [-5, 0] are clamped, as the driver does.
    let s = Box::into_raw(Box::new(Stream {
        ctx,
        flags,
        priority: priority.clamp(-5, 0),
        id: NEXT_STREAM_ID.fetch_add(1, Ordering::Relaxed),
        capture: AtomicU8::new(0),
        graph: AtomicUsize::new(0),
        capture_id: AtomicU64::new(0),
        global: std::sync::atomic::AtomicBool::new(false),
        deps: std::sync::Mutex::new(Vec::new()),
        origin: std::sync::atomic::AtomicBool::new(false),
    }));
    STREAMS
        .lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .insert(s as usize);
    out(out_stream, s.cast())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(s: *mut CUstream, flags: c_uint) -> CUresult {
    guard(|| create(s, flags, 0))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    s: *mut CUstream,
    flags: c_uint,
    priority: c_int,
) -> CUresult {
    guard(|| create(s, flags, priority))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamDestroy_v2(s: CUstream) -> CUresult {
    guard(|| {
        if stream(s)?.is_none() {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        STREAMS
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .remove(&(s as usize));
        crate::stream_attributes::forget(s);
        // SAFETY: it was registered, so it is a Box from create, dropped only here.
        drop(unsafe { Box::from_raw(s.cast::<Stream>()) });
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamDestroy(s: CUstream) -> CUresult {
    cuStreamDestroy_v2(s)
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

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamSynchronize(s: CUstream) -> CUresult {
    guard(|| {
        stream(s)?;
        match crate::context::cuCtxSynchronize() {
            CUDA_SUCCESS => Ok(()),
            e => Err(e),
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamQuery(s: CUstream) -> CUresult {
    guard(|| {
        current_ctx()?;
        stream(s).map(|_| ())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetPriority(s: CUstream, priority: *mut c_int) -> CUresult {
    guard(|| {
        let made = priority_of(s)?;
        out(
            priority,
            crate::stream_attributes::priority(s).unwrap_or(made),
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetFlags(s: CUstream, flags: *mut c_uint) -> CUresult {
    guard(|| out(flags, stream(s)?.map_or(0, |st| st.flags)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetId(s: CUstream, id: *mut u64) -> CUresult {
    guard(|| out(id, stream(s)?.map_or(s as u64, |st| st.id)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCtx(s: CUstream, ctx: *mut CUcontext) -> CUresult {
    guard(|| {
        let c = match stream(s)? {
            Some(st) => st.ctx,
            None => std::ptr::from_ref(current_ctx()?) as usize,
        };
        out(ctx, c as CUcontext)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamWaitEvent(s: CUstream, e: CUevent, _flags: c_uint) -> CUresult {
    guard(|| {
        let st = stream(s)?;
        let record = event(e)?
            .captured
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .clone();
        match (st, record) {
            (Some(st), Some(record)) => wait_in_capture(st, record),
            _ => Ok(()),
        }
    })
}

/// `st` waits on an event recorded in a capture: it joins that capture after the record's
/// nodes (a fork), or, capturing into it already, adds them to its dependency set (a join).
/// A stream capturing something else cannot wait on another capture's work
/// (`CUDA_ERROR_STREAM_CAPTURE_ISOLATION`).
fn wait_in_capture(st: &Stream, record: CapturedRecord) -> Result<(), CUresult> {
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

type HostFn = Option<unsafe extern "C" fn(*mut c_void)>;
type StreamCallback = Option<unsafe extern "C" fn(CUstream, CUresult, *mut c_void)>;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchHostFunc(s: CUstream, f: HostFn, data: *mut c_void) -> CUresult {
    guard(|| {
        let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let op = crate::graph::Op::Host {
            function: f,
            data: data as usize,
        };
        let mut held = hold(s)?;
        if held.graph().is_some() {
            return held.record(op).map(|_| ());
        }
        drop(held);
        crate::graph::run(op)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamAddCallback(
    s: CUstream,
    f: StreamCallback,
    data: *mut c_void,
    _flags: c_uint,
) -> CUresult {
    guard(|| {
        stream(s)?;
        let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the caller's callback, with the stream, success and its argument.
        unsafe { f(s, CUDA_SUCCESS, data) };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventCreate(e: *mut CUevent, flags: c_uint) -> CUresult {
    guard(|| {
        // An interprocess event keeps no timing, as the driver requires.
        if flags & EVENT_INTERPROCESS != 0 && flags & EVENT_DISABLE_TIMING == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(e, new_event(flags, None)?)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventDestroy_v2(e: CUevent) -> CUresult {
    guard(|| {
        event(e)?;
        EVENTS
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .remove(&(e as usize));
        // SAFETY: it was registered, so it is a Box from cuEventCreate, dropped only here.
        drop(unsafe { Box::from_raw(e.cast::<Event>()) });
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventDestroy(e: CUevent) -> CUresult {
    cuEventDestroy_v2(e)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecord(e: CUevent, s: CUstream) -> CUresult {
    guard(|| {
        let st = stream(s)?;
        let ev = event(e)?;
        let mut captured = ev.captured.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
        *captured = None;
        if let Some(st) = st {
            let deps = st.deps.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
            if st.capture.load(Ordering::Acquire) == CAPTURE_ACTIVE {
                // Recorded into the capture: no time, the nodes so far.
                *captured = Some(CapturedRecord {
                    capture_id: st.capture_id.load(Ordering::Acquire),
                    graph: st.graph.load(Ordering::Acquire),
                    deps: deps.clone(),
                });
                return Ok(());
            }
        }
        drop(captured);
        // The stream's work so far ends when its last kernel does.
        let ctx = current_ctx()?;
        let wait = crate::state::get()?.until_idle(ctx.node_index);
        let at = gpuslice_simnode::procs::monotonic_ns()
            + u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
        ev.recorded().store(at.max(1), Ordering::Release);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecordWithFlags(e: CUevent, s: CUstream, _flags: c_uint) -> CUresult {
    cuEventRecord(e, s)
}

/// Complete once its recorded time has passed (at once for work that takes no time).
#[unsafe(no_mangle)]
pub extern "C" fn cuEventQuery(e: CUevent) -> CUresult {
    guard(|| {
        let at = event(e)?.recorded().load(Ordering::Acquire);
        if at > gpuslice_simnode::procs::monotonic_ns() {
            return Err(CUDA_ERROR_NOT_READY);
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventSynchronize(e: CUevent) -> CUresult {
    guard(|| {
        let ev = event(e)?;
        ev.waiters.fetch_add(1, Ordering::AcqRel);
        let at = ev.recorded().load(Ordering::Acquire);
        let now = gpuslice_simnode::procs::monotonic_ns();
        if at > now {
            std::thread::sleep(std::time::Duration::from_nanos(at - now));
        }
        ev.waiters.fetch_sub(1, Ordering::AcqRel);
        Ok(())
    })
}

/// Context `ctx` is destroyed: its events go with it (their handles answer
/// `CUDA_ERROR_INVALID_HANDLE` from now on). A thread still waiting on one of them is the
/// caller's error (`cuCtxDestroy`: no API call may use the context meanwhile), which the
/// real driver need not survive: the process is stopped, so that no test passes over it.
pub(crate) fn context_destroyed(ctx: CUcontext) {
    let Ok(mut events) = EVENTS.lock() else {
        return;
    };
    events.retain(|&e| {
        // SAFETY: registered in EVENTS: a Box leaked by cuEventCreate and not yet dropped
        // (those of destroyed contexts are left leaked: another thread may still read one).
        let ev = unsafe { &*(e as *const Event) };
        if ev.ctx != ctx as usize {
            return true;
        }
        if ev.waiters.load(Ordering::Acquire) > 0 {
            eprintln!(
                "simulated driver: context {ctx:p} destroyed while a thread waits on its event \
                 {e:#x} in cuEventSynchronize"
            );
            std::process::abort();
        }
        false
    });
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut c_float,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    guard(|| {
        let (a, b) = (event(start)?, event(end)?);
        if (a.flags | b.flags) & EVENT_DISABLE_TIMING != 0 {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let (ta, tb) = (
            a.recorded().load(Ordering::Acquire),
            b.recorded().load(Ordering::Acquire),
        );
        if ta == 0 || tb == 0 {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        out(ms, (tb as f64 - ta as f64) as c_float / 1.0e6)
    })
}

// The `_ptsz` variants: the same on the simulated device, where the per-thread default
// stream is as idle as the legacy one.
same_as! {
    cuStreamBeginCapture_v2_ptsz => cuStreamBeginCapture_v2(s: CUstream, mode: c_int);
    cuStreamBeginCapture_ptsz => cuStreamBeginCapture(s: CUstream);
    cuStreamGetCaptureInfo_ptsz => cuStreamGetCaptureInfo(s: CUstream, status: *mut c_int, id: *mut u64);
    cuStreamGetCaptureInfo_v2_ptsz => cuStreamGetCaptureInfo_v2(s: CUstream, status: *mut c_int, id: *mut u64, graph: *mut *mut c_void, deps: *mut *const *mut c_void, count: *mut usize);
    cuStreamGetCaptureInfo_v3_ptsz => cuStreamGetCaptureInfo_v3(s: CUstream, status: *mut c_int, id: *mut u64, graph: *mut *mut c_void, deps: *mut *const *mut c_void, edges: *mut *const c_void, count: *mut usize);
    cuStreamEndCapture_ptsz => cuStreamEndCapture(s: CUstream, graph: *mut *mut c_void);
    cuStreamIsCapturing_ptsz => cuStreamIsCapturing(s: CUstream, status: *mut c_int);
    cuStreamGetPriority_ptsz => cuStreamGetPriority(s: CUstream, priority: *mut c_int);
    cuStreamGetFlags_ptsz => cuStreamGetFlags(s: CUstream, flags: *mut c_uint);
    cuStreamGetId_ptsz => cuStreamGetId(s: CUstream, id: *mut u64);
    cuStreamGetCtx_ptsz => cuStreamGetCtx(s: CUstream, ctx: *mut CUcontext);
    cuLaunchHostFunc_ptsz => cuLaunchHostFunc(s: CUstream, f: HostFn, data: *mut c_void);
    cuStreamAddCallback_ptsz => cuStreamAddCallback(s: CUstream, f: StreamCallback, data: *mut c_void, flags: c_uint);
    cuStreamSetAttribute_ptsz => cuStreamSetAttribute(s: CUstream, attr: c_int, value: *const CUlaunchAttributeValue);
    cuStreamGetAttribute_ptsz => cuStreamGetAttribute(s: CUstream, attr: c_int, value: *mut CUlaunchAttributeValue);
}

macro_rules! per_thread_safe {
    ($($name:ident => $target:ident($($arg:ident: $ty:ty),*);)*) => {
        $(
            #[unsafe(no_mangle)]
            pub extern "C" fn $name($($arg: $ty),*) -> CUresult {
                $target($($arg),*)
            }
        )*
    };
}

per_thread_safe! {
    cuStreamSynchronize_ptsz => cuStreamSynchronize(s: CUstream);
    cuStreamQuery_ptsz => cuStreamQuery(s: CUstream);
    cuStreamWaitEvent_ptsz => cuStreamWaitEvent(s: CUstream, e: CUevent, flags: c_uint);
    cuEventRecord_ptsz => cuEventRecord(e: CUevent, s: CUstream);
    cuEventRecordWithFlags_ptsz => cuEventRecordWithFlags(e: CUevent, s: CUstream, flags: c_uint);
    cuStreamCopyAttributes_ptsz => cuStreamCopyAttributes(dst: CUstream, src: CUstream);
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

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamUpdateCaptureDependencies_ptsz(
    s: CUstream,
    deps: *mut crate::graph::CUgraphNode,
    count: usize,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuStreamUpdateCaptureDependencies(s, deps, count, flags) }
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

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamUpdateCaptureDependencies_v2_ptsz(
    s: CUstream,
    deps: *mut crate::graph::CUgraphNode,
    edge_data: *const c_void,
    count: usize,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuStreamUpdateCaptureDependencies_v2(s, deps, edge_data, count, flags) }
}
