//! Streams and events. Work on the simulated device is done when it is issued (copies happen
//! at once, kernels take only their simulated time, waited for at synchronisation), so a
//! stream is always idle at a query, an event is complete once recorded, and a host function
//! queued on a stream runs before the call that queues it returns, as it would run on an idle
//! stream. An event records the host's monotonic clock, so `cuEventElapsedTime` measures what
//! happened between two records. Handles are checked before use: a destroyed stream or event
//! answers `CUDA_ERROR_INVALID_HANDLE`. Capturing a stream's work into a graph: `capture`.

use std::collections::HashSet;
use std::ffi::{c_float, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};

use crate::capture::{CAPTURE_ACTIVE, CapturedRecord, wait_in_capture};
pub(crate) use crate::capture::{capturing_graph, hold, refuse_during_global_capture};
use crate::codes::*;
use crate::paths::CUstream;
use crate::stream_attributes::{
    cuStreamCopyAttributes, cuStreamGetAttribute, cuStreamSetAttribute,
};
use crate::{CUcontext, CUresult, current_ctx, guard, out};
use gpuslice_cuda_abi::cuda::{CUevent, CUlaunchAttributeValue};

/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`: the two default streams by name.
const STREAM_LEGACY: usize = 0x1;
const STREAM_PER_THREAD: usize = 0x2;

use gpuslice_cuda_abi::cuda::CU_EVENT_DISABLE_TIMING as EVENT_DISABLE_TIMING;

pub struct Stream {
    pub(crate) ctx: usize,
    flags: c_uint,
    priority: c_int,
    id: u64,
    pub(crate) capture: AtomicU8,
    /// Its capture is in the global mode.
    pub(crate) global: std::sync::atomic::AtomicBool,
    /// The graph being captured into (0 when not capturing).
    pub(crate) graph: AtomicUsize,
    pub(crate) capture_id: AtomicU64,
    /// The capture's dependency set: the nodes the next captured one will depend on (the
    /// last captured, or what `cuStreamUpdateCaptureDependencies` set).
    pub(crate) deps: std::sync::Mutex<Vec<usize>>,
    /// It began its capture (`cuStreamBeginCapture`); false for a stream that joined another's
    /// by waiting on an event recorded in it, which that stream's end ends.
    pub(crate) origin: std::sync::atomic::AtomicBool,
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

pub(crate) static STREAMS: LazyLock<Mutex<HashSet<usize>>> =
    LazyLock::new(|| Mutex::new(HashSet::new()));
static EVENTS: LazyLock<Mutex<HashSet<usize>>> = LazyLock::new(|| Mutex::new(HashSet::new()));
static NEXT_STREAM_ID: AtomicU64 = AtomicU64::new(16);

/// A stream this library made and has not destroyed; None for the default streams.
pub(crate) fn stream(s: CUstream) -> Result<Option<&'static Stream>, CUresult> {
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

/// The context of stream `s`: its own, or the current one for the default streams (whose
/// work goes to the current context).
pub(crate) fn ctx_of(s: CUstream) -> Result<&'static crate::context::Ctx, CUresult> {
    match stream(s)? {
        Some(st) => crate::context::active(st.ctx as CUcontext),
        None => current_ctx(),
    }
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

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamSynchronize(s: CUstream) -> CUresult {
    // The stream's device: every kernel of this process runs in order there.
    guard(|| crate::context::synchronize(ctx_of(s)?))
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
        // The stream's work so far ends when its last kernel does, on the stream's device.
        let ctx = ctx_of(s)?;
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
        crate::capture::refuse_unless_relaxed_during_global_capture()?;
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
        crate::capture::refuse_unless_relaxed_during_global_capture()?;
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
