//! The work a paced process has queued on a GPU, kept short. A real GPU's stream holds about
//! a thousand launches before a launch blocks, so a process launching kernels of a
//! millisecond could queue a second of work in one window of its share, or in one sampling
//! period: launches let through at the pace of the share would run long after, whatever the
//! pacing. On a paced GPU the library records an event behind each launch it lets through,
//! and a launch waits while [`DEPTH`] of this process's recorded launches there have not
//! finished: what was let through runs within a few kernels of when it was.
//!
//! Events are the driver's own (`cuEventCreate` with `CU_EVENT_BLOCKING_SYNC`, so a waiting
//! launch sleeps; `CU_EVENT_DISABLE_TIMING`), recorded on the launch's stream, kept for reuse
//! per context, and forgotten, never destroyed, with their context (the driver frees them).

use std::collections::VecDeque;
use std::ffi::c_uint;
use std::sync::{Mutex, PoisonError};

use crate::api::real;
use crate::ffi::*;

/// Launches a process may have unfinished on a paced GPU before its next launch waits.
pub const DEPTH: usize = 8;

const EVENT_FLAGS: c_uint = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING;

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
}

/// One paced GPU's launches in this process.
#[derive(Default)]
pub struct Queue {
    inner: Mutex<Inner>,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Returns once fewer than [`DEPTH`] of the launches recorded here are unfinished,
    /// sleeping in the driver until the oldest finishes while they are not.
    pub fn wait_for_room(&self) {
        let (Some(query), Some(sync)) = (real::cuEventQuery(), real::cuEventSynchronize()) else {
            return;
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
                if q.pending.len() < DEPTH {
                    return;
                }
                q.pending[0].event
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
