//! Whether work is captured, decided once. A stream-ordered allocation or free, or a graph's
//! launch, made on a stream being captured becomes a node of the graph and takes nothing now,
//! so its hook leaves it uncharged; made on a stream not capturing, it takes memory and is
//! charged. The hook asks the driver which (`cuStreamIsCapturing`) and then makes the call: a
//! capture another thread ends in between (`cuStreamEndCapture`) would let the call take
//! memory the hook had judged to be a graph's, uncharged. So each such hook holds a read lock
//! from its question to the driver's answer, and ending a capture takes the write lock. A
//! capture that begins in between (or a stream that joins one) only charges what becomes a
//! node, which is given back with it. Ending a capture is rare; the allocations wait only
//! while one ends.

use std::cell::Cell;
use std::sync::{RwLock, RwLockReadGuard};

use crate::ffi::*;

use super::real_or_return;

static CAPTURE_ENDS: RwLock<()> = RwLock::new(());

thread_local! {
    /// How many guards this thread holds (a hook's driver call may run another hook).
    static HELD: Cell<u32> = const { Cell::new(0) };
}

/// Holds captures from ending while it lives.
pub(crate) struct CaptureGuard {
    _read: Option<RwLockReadGuard<'static, ()>>,
}

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        HELD.with(|h| h.set(h.get().saturating_sub(1)));
    }
}

/// A guard under which no capture ends; taken once per thread (an inner hook shares the
/// outer one's).
pub(crate) fn hold() -> CaptureGuard {
    let outer = HELD.with(|h| {
        let n = h.get();
        h.set(n + 1);
        n == 0
    });
    CaptureGuard {
        _read: outer.then(|| {
            CAPTURE_ENDS
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }),
    }
}

type EndCapture = unsafe extern "C" fn(CUstream, *mut CUgraph) -> CUresult;

fn end(f: EndCapture, stream: CUstream, graph: *mut CUgraph) -> CUresult {
    // A thread ending a capture inside a hook of its own (none does) shares its guard.
    if HELD.with(Cell::get) > 0 {
        // SAFETY: the caller's arguments, passed on unchanged.
        return unsafe { f(stream, graph) };
    }
    let _write = CAPTURE_ENDS
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // SAFETY: the caller's arguments, passed on unchanged.
    unsafe { f(stream, graph) }
}

pub unsafe fn stream_end_capture(stream: CUstream, graph: *mut CUgraph) -> CUresult {
    end(real_or_return!(cuStreamEndCapture), stream, graph)
}

pub unsafe fn stream_end_capture_ptsz(stream: CUstream, graph: *mut CUgraph) -> CUresult {
    end(real_or_return!(cuStreamEndCapture_ptsz), stream, graph)
}
