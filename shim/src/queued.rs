//! The work a paced process has queued on a GPU, kept short. A real GPU's stream holds about
//! a thousand launches before a launch blocks, so a process launching kernels of a
//! millisecond could queue a second of work in one window of its share, or in one sampling
//! period: launches let through at the pace of the share would run long after, whatever the
//! pacing. On a paced GPU the library records an event behind each launch it lets through,
//! and a launch waits while [`DEPTH`] of this process's launches there have not finished:
//! what was let through runs within a few kernels of when it was.
//!
//! A launch takes its place in the queue before it is paced and holds it until its event is
//! recorded (or it failed), so threads launching at once, each on a stream of its own, are
//! counted before any of them reaches the driver: however many a process runs, no more than
//! [`DEPTH`] of its launches are let through ahead of the driver's finishing them.
//!
//! Events are the driver's own (`cuEventCreate` with `CU_EVENT_BLOCKING_SYNC`, so a waiting
//! launch sleeps; `CU_EVENT_DISABLE_TIMING`), recorded on the launch's stream, kept for reuse
//! per context, and forgotten, never destroyed, with their context (the driver frees them).

use std::collections::VecDeque;
use std::ffi::c_uint;
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

use crate::api::real;
use crate::ffi::*;

/// Launches a process may have unfinished on a paced GPU before its next launch waits.
pub const DEPTH: usize = 8;

const EVENT_FLAGS: c_uint = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING;

/// The longest a launch waiting for a place others hold (and have not launched yet) sleeps
/// before it looks again, where no launch woke it.
const WAKE_AT_LEAST: Duration = Duration::from_millis(10);

/// An event of this library's and the context it belongs to (as addresses).
#[derive(Clone, Copy)]
struct Recorded {
    event: usize,
    ctx: usize,
}

#[derive(Default)]
struct Inner {
    /// Recorded behind launches, oldest first.
    pending: VecDeque<Recorded>,
    /// Finished, to record again.
    free: Vec<Recorded>,
    /// Places taken by launches not yet recorded ([`Place`]).
    taken: usize,
    /// Launches asleep in [`Queue::placed`].
    waiting: usize,
}

/// One paced GPU's launches in this process.
#[derive(Default)]
pub struct Queue {
    inner: Mutex<Inner>,
    /// Launches waiting for a place taken by others; woken when one is given up or recorded.
    placed: Condvar,
}

/// A launch's place in its process's queue on a paced GPU, from before it is paced until
/// its event is recorded ([`Place::record`]) or the driver refused it; given up when
/// dropped.
#[must_use]
pub struct Place {
    queue: &'static Queue,
}

impl Place {
    /// After the launch went to the driver on `stream` (`ptsz`: the per-thread default
    /// stream's variant): records an event behind it in the place.
    pub fn record(self, stream: CUstream, ptsz: bool) {
        self.queue.record(stream, ptsz);
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut q = self.queue.lock();
        q.taken -= 1;
        if q.waiting > 0 {
            self.queue.placed.notify_all();
        }
    }
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a place once fewer than [`DEPTH`] of the launches here are unfinished or about
    /// to be launched, sleeping in the driver until the oldest finishes while they are not.
    /// None where the driver has no events (nothing is recorded then).
    pub fn take_place(&'static self) -> Option<Place> {
        let (Some(query), Some(sync)) = (real::cuEventQuery(), real::cuEventSynchronize()) else {
            return None;
        };
        loop {
            let oldest = {
                let mut q = self.lock();
                while let Some(&r) = q.pending.front() {
                    // SAFETY: an event this library created in a context not yet gone.
                    match unsafe { query(r.event as CUevent) } {
                        CUDA_ERROR_NOT_READY => break,
                        CUDA_SUCCESS => {
                            q.pending.pop_front();
                            q.free.push(r);
                        }
                        // Not an event any more (its context went unseen): dropped, not
                        // destroyed.
                        _ => {
                            q.pending.pop_front();
                        }
                    }
                }
                if q.pending.len() + q.taken < DEPTH {
                    q.taken += 1;
                    return Some(Place { queue: self });
                }
                let Some(oldest) = q.pending.front() else {
                    // Every place is held by a launch on its way to the driver.
                    q.waiting += 1;
                    let (mut q, _) = self
                        .placed
                        .wait_timeout(q, WAKE_AT_LEAST)
                        .unwrap_or_else(PoisonError::into_inner);
                    q.waiting -= 1;
                    continue;
                };
                oldest.event
            };
            // SAFETY: as above; a wait on an event recorded again meanwhile waits for that
            // later record, which bounds the wait all the same.
            if unsafe { sync(oldest as CUevent) } != CUDA_SUCCESS {
                // Checked and dropped at the next look.
                continue;
            }
        }
    }

    /// After a launch let through went to the driver on `stream` (`ptsz`: the per-thread
    /// default stream's variant): records an event behind it.
    pub fn record(&self, stream: CUstream, ptsz: bool) {
        let record = if ptsz {
            real::cuEventRecord_ptsz().or_else(real::cuEventRecord)
        } else {
            real::cuEventRecord()
        };
        let (Some(record), Some(current)) = (record, real::cuCtxGetCurrent()) else {
            return;
        };
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: cuCtxGetCurrent writes one context handle.
        if unsafe { current(&raw mut ctx) } != CUDA_SUCCESS || ctx.is_null() {
            return;
        }
        let ctx = ctx as usize;
        let mut q = self.lock();
        let Some(mut r) = take_free(&mut q.free, ctx).or_else(|| create(ctx)) else {
            return;
        };
        // SAFETY: an event of the calling thread's current context and the stream the launch
        // just went to.
        if unsafe { record(r.event as CUevent, stream) } == CUDA_SUCCESS {
            r.ctx = ctx;
            q.pending.push_back(r);
        } else if let Some(destroy) = real::cuEventDestroy_v2() {
            // SAFETY: an event this library created in the current context.
            unsafe { destroy(r.event as CUevent) };
        }
    }

    /// `ctx` is about to go: its events go with it.
    pub fn forget_context(&self, ctx: CUcontext) {
        let ctx = ctx as usize;
        let mut q = self.lock();
        q.pending.retain(|r| r.ctx != ctx);
        q.free.retain(|r| r.ctx != ctx);
    }
}

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
    })
}
