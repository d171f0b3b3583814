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

use crate::api::real;
use crate::ffi::*;
use crate::slice::PoolPlace;

use super::gate::{Gate, Passage};
use super::real_or_return;

thread_local! {
    static OPEN: Cell<u32> = const { Cell::new(0) };
}

/// Passed shared by hooks between their question and the driver's answer; alone by the calls
/// that change the answer.
static DECIDED: Gate = Gate::new(&OPEN);

/// While it lives, no capture ends and no device's pool changes.
pub(crate) fn hold() -> Passage {
    DECIDED.shared()
}

/// While it lives, no hook is between its question and the driver's answer (for a call that
/// changes the answer: a pool destroyed, whose handle a new pool may get).
pub(crate) fn alone() -> Passage {
    DECIDED.alone()
}

pub unsafe fn stream_end_capture(stream: CUstream, graph: *mut CUgraph) -> CUresult {
    let f = real_or_return!(cuStreamEndCapture);
    let _alone = DECIDED.alone();
    // SAFETY: the caller's arguments, passed on unchanged.
    unsafe { f(stream, graph) }
}

pub unsafe fn stream_end_capture_ptsz(stream: CUstream, graph: *mut CUgraph) -> CUresult {
    let f = real_or_return!(cuStreamEndCapture_ptsz);
    let _alone = DECIDED.alone();
    // SAFETY: the caller's arguments, passed on unchanged.
    unsafe { f(stream, graph) }
}

pub unsafe fn device_set_mem_pool(dev: CUdevice, pool: CUmemoryPool) -> CUresult {
    let f = real_or_return!(cuDeviceSetMemPool);
    let _alone = DECIDED.alone();
    // SAFETY: the caller's arguments, passed on unchanged.
    unsafe { f(dev, pool) }
}

/// CUDA 13's way to make a pool current for a location: for a device, the same as
/// `cuDeviceSetMemPool`. The driver is given the library's copy of the location.
pub unsafe fn mem_set_mem_pool(
    location: *mut CUmemLocation,
    kind: std::ffi::c_int,
    pool: CUmemoryPool,
) -> CUresult {
    let f = real_or_return!(cuMemSetMemPool);
    // SAFETY: read only if non-null; the caller's CUmemLocation.
    let mut copy = unsafe { location.as_ref() }.copied();
    let given = copy
        .as_mut()
        .map_or(std::ptr::null_mut(), std::ptr::from_mut);
    let _alone = DECIDED.alone();
    // SAFETY: the caller's arguments, the location as copied.
    let r = unsafe { f(given, kind, pool) };
    // Only a device location is recorded: a pool is not taken as host memory on the caller's
    // word ([`super::pools::mem_get_mem_pool`]).
    if r == CUDA_SUCCESS
        && let Some(place @ PoolPlace::Device(_)) = super::pools::place_at(given, kind)
    {
        super::pools::remember(pool, place);
    }
    r
}

/// Runs `f` with the calling thread (a program's) in the relaxed capture mode, then gives
/// the thread its own mode back: the library's queries of and waits on its own events are
/// then not calls that a capture another thread holds open in the global mode forbids (the
/// driver refuses them from a thread in the global mode, the default, and invalidates that
/// capture).
pub(crate) fn relaxed<T>(f: impl FnOnce() -> T) -> T {
    let Some(exchange) = real::cuThreadExchangeStreamCaptureMode() else {
        return f();
    };
    let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: one mode to swap in, for this thread only; the thread's own comes back in it.
    unsafe { exchange(&raw mut mode) };
    let r = f();
    // SAFETY: the thread's own mode, given back.
    unsafe { exchange(&raw mut mode) };
    r
}
