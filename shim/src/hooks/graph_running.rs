//! Graphs launched and perhaps still running, and the memory their own free nodes gave back
//! to the graph pool while they run. The driver hands a launch memory another graph freed
//! only where the launch runs after that graph for certain: on the same stream, or a launch
//! of the same executable graph (the driver orders those). Graphs that may run at once get
//! memory of their own, so the pool grows with each graph launched on a stream of its own
//! while the others run (NVIDIA's `graphMemoryFootprint` sample shows it), and a launch's
//! reservation counts, beside its own allocations, what such graphs hold.
//!
//! Behind each launch of a graph that frees allocations of its own the library records an
//! event of its own (one per executable graph, recorded again at each launch), and counts the
//! memory those frees gave back as held until the event has passed; it looks at the events
//! in the relaxed capture mode, as the launch queue does ([`super::capture::relaxed`]).

use std::collections::HashMap;

use crate::api::real;
use crate::ffi::*;
use crate::log::log;

/// The latest launch of an executable graph whose free nodes free its own allocations.
struct Launch {
    /// The executable graph (0 once destroyed: a new one may get its address).
    exec: usize,
    stream: usize,
    /// Recorded behind the launch, and the context it was made in.
    event: usize,
    ctx: usize,
    /// Per slice GPU, the bytes of the allocations it frees itself.
    freed: Vec<(usize, u64)>,
}

#[derive(Default)]
pub struct Running {
    launches: Vec<Launch>,
}

impl Running {
    /// Per slice GPU, what the launches a launch of `exec` on the stream named `stream`
    /// ([`stream_key`]) may run beside hold, once those whose events have passed are
    /// dropped.
    pub fn held_beside(&mut self, exec: usize, stream: usize) -> HashMap<usize, u64> {
        self.drop_finished();
        let mut held = HashMap::new();
        for l in &self.launches {
            if l.exec == exec || l.stream == stream {
                continue;
            }
            for &(gpu, bytes) in &l.freed {
                *held.entry(gpu).or_default() += bytes;
            }
        }
        held
    }

    /// `exec` was launched on `stream` (`ptsz`: through the per-thread default stream's
    /// variant) and frees `freed` of its own allocations: counted until it has run.
    pub fn launched(
        &mut self,
        exec: usize,
        stream: CUstream,
        ptsz: bool,
        freed: Vec<(usize, u64)>,
    ) {
        let at = self.launches.iter().position(|l| l.exec == exec);
        let (event, ctx) = match at {
            Some(i) => (self.launches[i].event, self.launches[i].ctx),
            None => match create(CU_EVENT_DISABLE_TIMING) {
                Some(made) => made,
                None => return,
            },
        };
        if !record(event, stream, ptsz) {
            log!(
                "a graph's launch could not be followed by an event: what it frees is not counted while it runs"
            );
            if let Some(i) = at {
                self.launches.swap_remove(i);
            }
            destroy(event);
            return;
        }
        let launch = Launch {
            exec,
            stream: stream_key(stream, ptsz),
            event,
            ctx,
            freed,
        };
        match at {
            Some(i) => self.launches[i] = launch,
            None => self.launches.push(launch),
        }
    }

    /// `exec` was destroyed: its last launch still counts until it has run, but is no longer
    /// its.
    pub fn forget_exec(&mut self, exec: usize) {
        for l in &mut self.launches {
            if l.exec == exec {
                l.exec = 0;
            }
        }
    }

    /// `ctx` is about to go: its events go with it (the driver frees them), and the
    /// launches they follow are no longer counted.
    pub fn forget_context(&mut self, ctx: usize) {
        self.launches.retain(|l| l.ctx != ctx);
    }

    fn drop_finished(&mut self) {
        let Some(query) = real::cuEventQuery() else {
            return;
        };
        self.launches.retain(|l| {
            // SAFETY: an event of the library's, live until destroyed here.
            let r = super::capture::relaxed(|| unsafe { query(l.event as CUevent) });
            match r {
                CUDA_ERROR_NOT_READY => true,
                CUDA_SUCCESS => {
                    destroy(l.event);
                    false
                }
                // Gone with its context: the driver freed it.
                _ => false,
            }
        });
    }
}

/// The last number given a thread's per-thread default stream.
static THREADS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

thread_local! {
    /// Names this thread's per-thread default stream: a number no other thread of the
    /// process had, with the top bit set (no stream handle has it).
    static THREAD: usize =
        THREADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) | 1 << (usize::BITS - 1);
}

/// What names `stream` (`ptsz`: passed to the per-thread default stream's variant) among the
/// launches: the per-thread default stream is each thread's own, the legacy one is one.
pub fn stream_key(stream: CUstream, ptsz: bool) -> usize {
    match stream as usize {
        2 => THREAD.with(|t| *t),
        0 if ptsz => THREAD.with(|t| *t),
        0 | 1 => 1,
        other => other,
    }
}

/// An event of the library's, made with `flags` in the current context, and that context.
pub(super) fn create(flags: std::ffi::c_uint) -> Option<(usize, usize)> {
    let (f, current) = (real::cuEventCreate()?, real::cuCtxGetCurrent()?);
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: cuCtxGetCurrent writes one context handle.
    if unsafe { current(&raw mut ctx) } != CUDA_SUCCESS || ctx.is_null() {
        return None;
    }
    let mut event: CUevent = std::ptr::null_mut();
    // SAFETY: cuEventCreate writes one event handle, made in the current context.
    let r = unsafe { f(&raw mut event, flags) };
    (r == CUDA_SUCCESS && !event.is_null()).then_some((event as usize, ctx as usize))
}

/// Records `event` on `stream` (`ptsz`: the per-thread default stream's variant).
pub(super) fn record(event: usize, stream: CUstream, ptsz: bool) -> bool {
    let f = if ptsz {
        real::cuEventRecord_ptsz()
    } else {
        real::cuEventRecord()
    };
    // SAFETY: an event of the library's, on a stream the program just used.
    f.is_some_and(|f| unsafe { f(event as CUevent, stream) } == CUDA_SUCCESS)
}

pub(super) fn destroy(event: usize) {
    if let Some(f) = real::cuEventDestroy_v2() {
        // SAFETY: an event of the library's, no longer used.
        unsafe { f(event as CUevent) };
    }
}
