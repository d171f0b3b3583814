//! What the driver will do with a call, decided once. A stream-ordered allocation or free, or
//! a graph's launch, made on a stream being captured becomes a node of the graph and takes
//! nothing now, so its hook leaves it uncharged; made on a stream not capturing, it takes
//! memory and is charged. A stream-ordered allocation comes from the device's current pool,
//! whose reservation its hook reads and charges. Each hook asks the driver (whether the stream
//! is capturing: `cuStreamIsCapturing`; the device's pool: `cuDeviceGetMemPool`) and then
//! makes the call: a capture another thread ends in between (`cuStreamEndCapture`), or a pool
//! it makes current (`cuDeviceSetMemPool`), would let the call take memory the hook had judged
//! a graph's, or from a pool whose reservation it did not read, uncharged. So each such hook
//! holds a read lock from its question to the driver's answer, and ending a capture or setting
//! a device's pool takes the write lock. A capture that begins in between (or a stream that
//! joins one) only charges what becomes a node, which is given back with it. Both are rare;
//! the allocations wait only while one happens.

use std::cell::Cell;
use std::sync::{RwLock, RwLockReadGuard};

use crate::ffi::*;

use super::real_or_return;

/// Read by hooks between their question and the driver's answer; written by the calls that
/// change the answer.
static DECIDED: RwLock<()> = RwLock::new(());

thread_local! {
    /// How many guards this thread holds (a hook's driver call may run another hook).
    static HELD: Cell<u32> = const { Cell::new(0) };
}

/// Holds captures from ending, and devices' pools from changing, while it lives.
pub(crate) struct CaptureGuard {
    _read: Option<RwLockReadGuard<'static, ()>>,
}

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        HELD.with(|h| h.set(h.get().saturating_sub(1)));
    }
}

/// A guard under which no capture ends and no device's pool changes; taken once per thread (an inner hook shares the
/// outer one's).
pub(crate) fn hold() -> CaptureGuard {
    let outer = HELD.with(|h| {
        let n = h.get();
        h.set(n + 1);
        n == 0
    });
    CaptureGuard {
        _read: outer.then(|| {
            DECIDED
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
    let _write = DECIDED
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

pub unsafe fn device_set_mem_pool(dev: CUdevice, pool: CUmemoryPool) -> CUresult {
    let f = real_or_return!(cuDeviceSetMemPool);
    if HELD.with(Cell::get) > 0 {
        // SAFETY: the caller's arguments, passed on unchanged.
        return unsafe { f(dev, pool) };
    }
    let _write = DECIDED
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // SAFETY: the caller's arguments, passed on unchanged.
    unsafe { f(dev, pool) }
}
