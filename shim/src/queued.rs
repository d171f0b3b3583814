//! The work a paced container has queued on a GPU, kept short. A real GPU's stream holds
//! about a thousand launches before a launch blocks, so a process launching kernels of a
//! millisecond could queue a second of work in one window of its share, or in one sampling
//! period: launches let through at the pace of the share would run long after, whatever the
//! pacing. On a paced GPU the library records an event behind each launch it lets through,
//! and a launch waits while [`DEPTH`] of the container's launches there have not finished:
//! what was let through runs within a few kernels of when it was.
//!
//! The count is the container's, not the process's: each process counts its own unfinished
//! launches in its slot of the usage region (`queued`, added to and summed as the wall adds
//! and sums bytes, so the places kept never exceed [`DEPTH`] together), or else sixteen
//! processes each holding their own eight would queue 128 kernels at a window's opening. A
//! launch takes its place before it is paced (before it waits for its window or its bucket)
//! and holds it until its event has finished, so threads launching at once, each on a stream
//! of its own, are counted before any of them reaches the driver. A thread of the process
//! (started at its first paced launch there) sleeps on the oldest event and gives each place
//! back as its launch finishes, whether or not the process launches again; a dead process's
//! places go with its slot when it is reaped.
//!
//! Events are the driver's own (`cuEventCreate` with `CU_EVENT_BLOCKING_SYNC`, so a waiting
//! thread sleeps; `CU_EVENT_DISABLE_TIMING`), recorded on the launch's stream, kept for reuse
//! per context, and forgotten, never destroyed, with their context (the driver frees them).
//! Waiting on an event needs no current context (PyTorch waits on events of other devices).
//!
//! The thread giving places back also measures how long a launch keeps the GPU: the time from
//! when the oldest of the process's launches began to run (the last one finishing, or its own
//! recording where none was queued) to its finishing, per launch found finished. It measures
//! only while none of the container's other processes has launches queued there (their
//! kernels between the process's own would be counted as its own); the estimate falls at once
//! to a shorter time and rises slowly to a longer one. A window of the cycle
//! ([`crate::slots`]) predicts from it when the container's queued work will end, and takes
//! when the process's last launch finished as the end of a window's work it did not wait for.

use std::collections::VecDeque;
use std::ffi::c_uint;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::api::real;
use crate::ffi::*;
use crate::hooks::capture::relaxed;
use crate::slice::Slice;

/// Launches a container may have unfinished on a paced GPU before its next launch waits.
pub const DEPTH: usize = 8;

const EVENT_FLAGS: c_uint = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING;

/// How long a launch waiting for a place the container's other processes hold sleeps before
/// it looks again (their launches finishing wake nothing here). The places are held by
/// queued launches, so the GPU has their work meanwhile.
const CONTAINER_POLL: Duration = Duration::from_micros(500);
/// How often the container's unfinished launches are counted while waiting for them to run.
const DRAIN_POLL: Duration = Duration::from_micros(100);
/// The longest a launch waiting for one of this process's places sleeps before it looks
/// again, where no launch finishing woke it.
const WAKE_AT_LEAST: Duration = Duration::from_millis(10);

/// An event of this library's and the context it belongs to (as addresses).
#[derive(Clone, Copy)]
struct Recorded {
    event: usize,
    ctx: usize,
    /// When it was last recorded (CLOCK_REALTIME µs).
    at_us: u64,
}

#[derive(Default)]
struct Inner {
    /// Recorded behind launches, oldest first; each holds a place.
    pending: VecDeque<Recorded>,
    /// Finished, to record again.
    free: Vec<Recorded>,
    /// Places taken by launches not yet recorded ([`Place`]).
    taken: usize,
    /// Launches asleep in [`Queue::room`].
    waiting: usize,
    /// Whether the thread giving places back runs.
    watched: bool,
    /// The context of the event that thread waits on outside the lock (0: none).
    watching: usize,
    /// When the oldest pending launch began to run, as far as this process can tell
    /// (CLOCK_REALTIME µs): the last launch finishing, or its own recording.
    running_since_us: u64,
}

/// One paced GPU's launches in this process.
pub struct Queue {
    slice: &'static Slice,
    /// The GPU's position in the slice.
    gpu: usize,
    inner: Mutex<Inner>,
    /// Launches waiting for a place; woken when one is given back.
    room: Condvar,
    /// The watching thread, waiting for a launch to be recorded.
    recorded: Condvar,
    /// A context's leaving, waiting for the watching thread's wait on one of its events.
    watched_wait_over: Condvar,
    /// How long one of the process's launches keeps the GPU, in µs ([`Queue::launch_us`]; 0:
    /// not yet measured).
    launch_us: AtomicU64,
    /// When one of the process's launches was last found finished (CLOCK_REALTIME µs; 0:
    /// none yet).
    finished_us: AtomicU64,
}

/// A launch's place in its container's queue on a paced GPU, from before it is paced until
/// its launch finished ([`Place::record`]) or the driver refused it (dropped unrecorded).
#[must_use]
pub struct Place {
    queue: &'static Queue,
    recorded: bool,
}

impl Place {
    /// After the launch went to the driver on `stream` (`ptsz`: the per-thread default
    /// stream's variant; `other`: the stream's context, where it is not the current one):
    /// records an event behind it, which holds the place until it finishes.
    pub fn record(mut self, stream: CUstream, ptsz: bool, other: Option<CUcontext>) {
        self.recorded = self.queue.record(stream, ptsz, other);
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut q = self.queue.lock();
        q.taken -= 1;
        if !self.recorded {
            self.queue.slice.give_queued(self.queue.gpu);
            self.queue.wake(&q);
        }
    }
}

impl Queue {
    pub fn new(slice: &'static Slice, gpu: usize) -> Self {
        Self {
            slice,
            gpu,
            inner: Mutex::default(),
            room: Condvar::new(),
            recorded: Condvar::new(),
            watched_wait_over: Condvar::new(),
            launch_us: AtomicU64::new(0),
            finished_us: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wake(&self, q: &Inner) {
        if q.waiting > 0 {
            self.room.notify_all();
        }
    }

    /// Sleeps in [`Queue::room`] for at most `most`.
    fn sleep<'a>(&'a self, mut q: MutexGuard<'a, Inner>, most: Duration) {
        q.waiting += 1;
        let (mut q, _) = self
            .room
            .wait_timeout(q, most)
            .unwrap_or_else(PoisonError::into_inner);
        q.waiting -= 1;
    }

    /// Gives back the places of the oldest launches that have finished; with `timed` (the
    /// watching thread, which wakes as they finish), measures how long they kept the GPU.
    fn give_back_finished(&self, q: &mut Inner, query: CuEventQuery, timed: bool) {
        let (mut finished, mut gone) = (0u64, 0u64);
        while let Some(&r) = q.pending.front() {
            // SAFETY: an event this library created in a context not yet gone.
            match unsafe { query(r.event as CUevent) } {
                // Not finished, or not to be asked now (a capture forbids it): kept.
                CUDA_ERROR_NOT_READY | CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED => break,
                CUDA_SUCCESS => {
                    q.free.push(r);
                    finished += 1;
                }
                // Not an event any more (its context went unseen): dropped, not destroyed.
                _ => {}
            }
            q.pending.pop_front();
            self.slice.give_queued(self.gpu);
            gone += 1;
        }
        if gone == 0 {
            return;
        }
        let now = crate::pacing::realtime_us();
        if finished > 0 {
            self.finished_us.store(now, Relaxed);
        }
        // Timed only where the container's queued launches there are all this process's
        // (counted after the finished ones went: all of them, as before, or not).
        let alone = || self.slice.queued_total(self.gpu) == (q.pending.len() + q.taken) as u64;
        if timed && finished > 0 && q.running_since_us != 0 && alone() {
            self.note_launch_time(now.saturating_sub(q.running_since_us) / finished);
        }
        q.running_since_us = now;
        self.wake(q);
    }

    /// Takes one measured launch time into the estimate: a shorter one at once, a longer one
    /// a quarter of the way. Kept low rather than high: a window closed early on too long an
    /// estimate is time lost, while work that runs past a prediction too short moves the
    /// window's margin ([`crate::slots`]), which takes it back.
    fn note_launch_time(&self, us: u64) {
        let us = us.max(1);
        let _ = self.launch_us.fetch_update(Relaxed, Relaxed, |before| {
            Some(if before == 0 || us <= before {
                us
            } else {
                before + (us - before) / 4
            })
        });
    }

    /// How long one of the process's launches keeps the GPU, in µs (0: not measured yet).
    pub fn launch_us(&self) -> u64 {
        self.launch_us.load(Relaxed)
    }

    /// Takes a place once fewer than `depth` (at most [`DEPTH`]) of the container's launches
    /// here are unfinished or about to be launched. None where the driver has no events
    /// (nothing is recorded then).
    pub fn take_place(&'static self, depth: usize) -> Option<Place> {
        let depth = depth.clamp(1, DEPTH);
        let query = real::cuEventQuery()?;
        // The watching thread waits with it (only its presence is needed here).
        real::cuEventSynchronize()?;
        let mut q = self.lock();
        // The watching thread gives places back as launches finish; the events are looked at
        // here only once a place cannot be had at once (where that thread could not start,
        // this is what gives them back), so a launch with room costs no query.
        let mut looked = false;
        loop {
            let own_full = q.pending.len() + q.taken >= depth;
            if !own_full && self.slice.take_queued(self.gpu, depth as u64) {
                q.taken += 1;
                return Some(Place {
                    queue: self,
                    recorded: false,
                });
            }
            if !looked {
                looked = true;
                relaxed(|| self.give_back_finished(&mut q, query, false));
                continue;
            }
            looked = false;
            // This process holds every place: the next of its launches to finish wakes it.
            // Or the container's other processes hold the rest (their finishing wakes nothing
            // here).
            self.sleep(
                q,
                if own_full {
                    WAKE_AT_LEAST
                } else {
                    CONTAINER_POLL
                },
            );
            q = self.lock();
        }
    }

    /// Records an event behind the launch that went to the driver on `stream`; whether it
    /// did (the place is then the event's until it finishes).
    fn record(&'static self, stream: CUstream, ptsz: bool, other: Option<CUcontext>) -> bool {
        let record = if ptsz {
            real::cuEventRecord_ptsz().or_else(real::cuEventRecord)
        } else {
            real::cuEventRecord()
        };
        let (Some(record), Some(current)) = (record, real::cuCtxGetCurrent()) else {
            return false;
        };
        // The event is made in the context the launch went to: the stream's (`other`: a
        // library's kernel on another context's stream runs there), else the current one.
        let mut ctx: CUcontext = std::ptr::null_mut();
        match other {
            Some(c) => ctx = c,
            // SAFETY: cuCtxGetCurrent writes one context handle.
            None if unsafe { current(&raw mut ctx) } != CUDA_SUCCESS => return false,
            None => {}
        }
        if ctx.is_null() {
            return false;
        }
        let ctx = ctx as usize;
        let mut q = self.lock();
        let made = || match other {
            Some(c) => crate::hooks::streams::in_context(c, || create(ctx))
                .ok()
                .flatten(),
            None => create(ctx),
        };
        let Some(mut r) = take_free(&mut q.free, ctx).or_else(made) else {
            return false;
        };
        // SAFETY: an event of the context the launch went to and the stream it went to.
        if unsafe { record(r.event as CUevent, stream) } != CUDA_SUCCESS {
            if let Some(destroy) = real::cuEventDestroy_v2() {
                // SAFETY: an event this library created in the current context.
                unsafe { destroy(r.event as CUevent) };
            }
            return false;
        }
        r.ctx = ctx;
        r.at_us = crate::pacing::realtime_us();
        if q.pending.is_empty() {
            q.running_since_us = r.at_us;
        }
        q.pending.push_back(r);
        if !q.watched {
            q.watched = std::thread::Builder::new()
                .name("gpuslice-queue".into())
                .spawn(move || self.watch())
                .is_ok();
        }
        self.recorded.notify_one();
        true
    }

    /// Gives each place back as its launch finishes, for the life of the process.
    fn watch(&self) {
        let (Some(query), Some(sync)) = (real::cuEventQuery(), real::cuEventSynchronize()) else {
            return;
        };
        if let Some(exchange) = real::cuThreadExchangeStreamCaptureMode() {
            let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
            // SAFETY: one mode to swap in, for this thread only. Relaxed: its waits never
            // touch a capture another thread of the process makes in the global mode.
            unsafe { exchange(&raw mut mode) };
        }
        let mut q = self.lock();
        loop {
            self.give_back_finished(&mut q, query, true);
            let Some(&oldest) = q.pending.front() else {
                q = self
                    .recorded
                    .wait(q)
                    .unwrap_or_else(PoisonError::into_inner);
                continue;
            };
            q.watching = oldest.ctx;
            drop(q);
            let current = set_current(oldest.ctx as CUcontext);
            // SAFETY: an event this library created, in a context that cannot go while this
            // waits (`forget_context` waits for the wait to end); one recorded again meanwhile
            // is waited for to that later record, which bounds the wait all the same.
            let r = unsafe { sync(oldest.event as CUevent) };
            if current {
                // No context stays current here once this wait is over: it may go.
                set_current(std::ptr::null_mut());
            }
            if r != CUDA_SUCCESS {
                // The event is looked at under the lock (a failed query drops it); the wait
                // is not retried at once, so a driver refusing it costs no busy loop.
                std::thread::sleep(DRAIN_POLL);
            }
            q = self.lock();
            q.watching = 0;
            self.watched_wait_over.notify_all();
        }
    }

    /// `ctx` is about to go: its events go with it, and their places. Returns once the
    /// watching thread waits on none of them (the driver must not be waiting on an event of
    /// a context while it is destroyed; the wait ends when the launch has run).
    pub fn forget_context(&self, ctx: CUcontext) {
        let ctx = ctx as usize;
        let mut q = self.lock();
        while ctx != 0 && q.watching == ctx {
            q = self
                .watched_wait_over
                .wait(q)
                .unwrap_or_else(PoisonError::into_inner);
        }
        let before = q.pending.len();
        q.pending.retain(|r| r.ctx != ctx);
        for _ in q.pending.len()..before {
            self.slice.give_queued(self.gpu);
        }
        q.free.retain(|r| r.ctx != ctx);
        self.wake(&q);
    }
}

/// Makes `ctx` the calling thread's current context, so that a driver that looks for one
/// in an event's wait finds the event's own (the waits need none on the drivers tested);
/// whether it was made current.
fn set_current(ctx: CUcontext) -> bool {
    // SAFETY: a context this library recorded an event in, not yet gone, or null (none).
    real::cuCtxSetCurrent().is_some_and(|set| unsafe { set(ctx) } == CUDA_SUCCESS)
}

type CuEventQuery = unsafe extern "C" fn(CUevent) -> CUresult;

fn take_free(free: &mut Vec<Recorded>, ctx: usize) -> Option<Recorded> {
    let i = free.iter().position(|r| r.ctx == ctx)?;
    Some(free.swap_remove(i))
}

fn create(ctx: usize) -> Option<Recorded> {
    let create = real::cuEventCreate()?;
    let mut event: CUevent = std::ptr::null_mut();
    // SAFETY: cuEventCreate writes one event handle, made in the current context.
    if unsafe { create(&raw mut event, EVENT_FLAGS) } != CUDA_SUCCESS || event.is_null() {
        return None;
    }
    Some(Recorded {
        event: event as usize,
        ctx,
        at_us: 0,
    })
}

impl crate::slots::Container for Queue {
    /// Counts the container's launches here, unfinished or about to be launched, until there
    /// are none.
    fn wait_until_drained(&self, until_us: u64) {
        while self.unfinished() {
            let now = crate::pacing::realtime_us();
            if now >= until_us {
                return;
            }
            std::thread::sleep(DRAIN_POLL.min(Duration::from_micros(until_us - now)));
        }
    }

    fn wait_until_own_finished(&self, recorded_before_us: u64) {
        let Some(query) = real::cuEventQuery() else {
            return;
        };
        loop {
            let mut q = self.lock();
            if !q.watched {
                // No thread gives the places back: looked at here.
                relaxed(|| self.give_back_finished(&mut q, query, false));
            }
            // Launches recorded later (other threads launch on in later windows) are not
            // the window's.
            if q.pending.iter().all(|r| r.at_us >= recorded_before_us) {
                return;
            }
            drop(q);
            std::thread::sleep(DRAIN_POLL);
        }
    }

    fn queued(&self) -> u64 {
        self.slice.queued_total(self.gpu)
    }

    /// Looks at this process's events now rather than when the watching thread wakes: a
    /// program that waited for its work and launches again at once is ahead of that thread.
    fn settle(&self) {
        let Some(query) = real::cuEventQuery() else {
            return;
        };
        let mut q = self.lock();
        relaxed(|| self.give_back_finished(&mut q, query, false));
    }

    fn launch_us(&self) -> u64 {
        Queue::launch_us(self)
    }

    fn finished_us(&self) -> Option<u64> {
        Some(self.finished_us.load(Relaxed)).filter(|&us| us != 0)
    }
}
