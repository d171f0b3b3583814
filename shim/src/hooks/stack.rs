//! Local memory at a launch. The driver keeps one local-memory reservation per context: its
//! per-thread stack (`CU_LIMIT_STACK_SIZE`) for every thread that can be resident on the
//! device. At the launch of a kernel whose threads need more local memory than the stack
//! holds (`CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES`: large local arrays, spilled registers, deep
//! call chains) it grows the stack to that, for good, and fails the launch with
//! `CUDA_ERROR_OUT_OF_MEMORY` where the card has no room. No allocation call shows it: one
//! kernel with a 16 KiB local array takes 4.1 GiB of an H100 at its first launch.
//!
//! The library charges that growth before such a launch, refuses the launch with the
//! driver's error where the slice has no room, and after it charges what the driver reports
//! the stack to be (`cuCtxGetLimit`), in the same books as a stack raised by `cuCtxSetLimit`
//! ([`super::limits`]): lowering the limit or ending the context gives it back. A launch
//! captured into a graph runs nothing; graphs are checked at their own launch
//! ([`super::graph`]).
//!
//! Each function's figure is asked of the driver once and kept in a lock-free cache, so a
//! launch of a kernel that needs no more than the driver's default stack (1 KiB a thread,
//! part of every context's own charge), nearly every kernel, costs one look-up; one that
//! needs more also reads the context's stack.

use std::ffi::c_int;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::limits;
use crate::api::real;
use crate::ffi::*;
use crate::log::log;
use crate::slice;

/// The per-thread stack every context starts with, as the driver sets it.
pub const DEFAULT_STACK: u64 = 1024;

const CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: c_int = 3;
const CU_LIMIT_STACK_SIZE: c_int = 0;

/// Cached figures: a function handle (below 2^48, as every user-space address is) in the
/// high 48 bits, its local memory in 16-byte units, rounded up, in the low 16 (at most
/// 1 MiB; the hardware's limit is 512 KiB). 0: empty. Indexed by the handle's bits above
/// the 16-byte alignment of the driver's objects; 4096 of them (32 KiB), so that a program
/// launching hundreds of kernels in turn rarely has two share a slot and ask again.
const SLOTS: usize = 4096;
static CACHE: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
const UNIT: u64 = 16;

fn slot(f: u64) -> &'static AtomicU64 {
    &CACHE[(f >> 4) as usize % SLOTS]
}

/// Empties the cache: handles may be reused once modules, libraries or contexts are gone.
pub fn forget_functions() {
    for s in &CACHE {
        s.store(0, Ordering::Relaxed);
    }
}

/// The local memory a thread of `f` needs, as the driver reports it (0 where it does not
/// say). A handle from `cuLibraryGetKernel` is asked for on the current device.
fn asked(f: CUfunction) -> u64 {
    let mut v: c_int = 0;
    if let Some(get) = real::cuFuncGetAttribute() {
        // SAFETY: cuFuncGetAttribute writes one int for a function the caller is launching.
        if unsafe { get(&raw mut v, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, f) } == CUDA_SUCCESS {
            return u64::try_from(v).unwrap_or(0);
        }
    }
    let (Some(get), Some(device)) = (real::cuKernelGetAttribute(), real::cuCtxGetDevice()) else {
        return 0;
    };
    let mut dev: CUdevice = 0;
    // SAFETY: cuCtxGetDevice writes one CUdevice; cuKernelGetAttribute one int.
    unsafe {
        if device(&raw mut dev) != CUDA_SUCCESS
            || get(&raw mut v, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, f, dev) != CUDA_SUCCESS
        {
            return 0;
        }
    }
    u64::try_from(v).unwrap_or(0)
}

/// The local memory a thread of `f` (a function or a library's kernel) needs, as the driver
/// reports it.
pub fn local_bytes(f: CUfunction) -> u64 {
    if f.is_null() { 0 } else { asked(f) }
}

/// An upper bound of what `f` needs, within 16 bytes: from the cache, else asked and kept.
/// A handle of 2^48 or more (no user-space address is) is kept under its low 48 bits; the
/// null handle, which the driver refuses, is found in any empty slot as needing nothing.
#[inline]
fn bound(f: CUfunction) -> u64 {
    let key = f as u64;
    let tag = key << 16;
    let e = slot(key).load(Ordering::Relaxed);
    if e ^ tag < 1 << 16 {
        return (e & 0xFFFF) * UNIT;
    }
    let bytes = asked(f);
    slot(key).store(tag | bytes.div_ceil(UNIT).min(0xFFFF), Ordering::Relaxed);
    bytes
}

/// The stack each context has run a kernel needing, by context: where a driver did not
/// report a launch's growth in its limit, the launches after it do not charge it again
/// (what it took is then charged from the driver's own figure at the agent's next sample).
/// Changed under [`limits::CHANGING`].
static GRANTED: Mutex<Vec<(usize, u64)>> = Mutex::new(Vec::new());

fn granted(ctx: CUcontext) -> u64 {
    GRANTED.lock().map_or(0, |g| {
        g.iter()
            .find(|(c, _)| *c == ctx as usize)
            .map_or(0, |(_, b)| *b)
    })
}

/// Records that `ctx` ran a kernel needing `bytes` a thread (after a launch), or had its
/// stack limit set to `bytes` (`cuCtxSetLimit`, which sizes the stack anew).
pub fn grant(ctx: CUcontext, bytes: u64) {
    if let Ok(mut g) = GRANTED.lock() {
        g.retain(|(c, _)| *c != ctx as usize);
        g.push((ctx as usize, bytes));
    }
}

/// Forgets `ctx` (it is being destroyed).
pub fn forget_context(ctx: CUcontext) {
    if let Ok(mut g) = GRANTED.lock() {
        g.retain(|(c, _)| *c != ctx as usize);
    }
}

/// What a thread of `f` may need beyond the driver's default stack (an upper bound within
/// 16 bytes), or None where it needs no more: the launch's whole cost in the library for
/// nearly every kernel.
#[inline]
pub fn beyond_default(f: CUfunction) -> Option<u64> {
    let needs = bound(f);
    (needs > DEFAULT_STACK).then_some(needs)
}

/// Makes the launch `call` of `f` (on `stream`; `ptsz`: the per-thread default stream's
/// variant), whose threads need up to `bound` bytes ([`beyond_default`]), charging first the
/// stack growth it makes the driver take.
#[cold]
pub fn launching(
    bound: u64,
    f: CUfunction,
    stream: CUstream,
    ptsz: bool,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    // A launch captured into a graph runs nothing now: it needs nothing more. No capture
    // ends between the question and the launch (`capture`).
    let _capture = super::capture::hold();
    let exact = || {
        if super::alloc::capturing(stream, ptsz) {
            0
        } else {
            asked(f)
        }
    };
    // A library's kernel runs in its stream's context, which need not be the current one:
    // the stack it grows is that context's, on that context's GPU, so it is read and charged
    // with that context current (the launch made so too, as the driver would make it).
    match super::streams::other_context(stream, ptsz) {
        Ok(Some(ctx)) => super::streams::in_context(ctx, || with_stack_of(bound, exact, call))
            .unwrap_or_else(|e| e),
        _ => with_stack_of(bound, exact, call),
    }
}

/// Makes `call`, which runs kernels whose threads need up to `bound` bytes of local memory
/// each (`exact` the figure itself), with the stack growth it makes the driver take charged
/// first.
pub fn with_stack_of(
    bound: u64,
    exact: impl FnOnce() -> u64,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some(s) = slice::get() else {
        return call();
    };
    {
        // The stack stays as large until the driver has the launch (`limits::CHANGING`).
        let Ok(_steady) = limits::CHANGING.read() else {
            return CUDA_ERROR_UNKNOWN;
        };
        if limits::current_limit(CU_LIMIT_STACK_SIZE).is_ok_and(|now| bound <= now) {
            return call();
        }
    }
    let (Some(ctx), Ok(dev)) = (limits::current_context(), s.current_device()) else {
        return call();
    };
    let Some(gpu) = s.position(dev) else {
        log!("device {dev} is not part of this container's slice");
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    let Some(unit) = limits::per_unit(dev, CU_LIMIT_STACK_SIZE) else {
        return call();
    };
    let Ok(_one_at_a_time) = limits::CHANGING.write() else {
        return CUDA_ERROR_UNKNOWN;
    };
    let Ok(reported) = limits::current_limit(CU_LIMIT_STACK_SIZE) else {
        return call();
    };
    let before = reported.max(granted(ctx));
    let needs = exact();
    if needs <= before {
        return call();
    }
    let (r, after) = limits::raise(s, ctx, CU_LIMIT_STACK_SIZE, gpu, unit, before, needs, call);
    if r == CUDA_SUCCESS {
        grant(ctx, after.max(needs));
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_figure_is_found_again_and_bounds_the_true_one() {
        let f = 0x5555_1234_5670usize as CUfunction;
        slot(f as u64).store((f as u64) << 16 | 1025u64.div_ceil(UNIT), Ordering::Relaxed);
        let got = bound(f);
        assert!((1025..1025 + UNIT).contains(&got), "{got}");
        forget_functions();
        assert_eq!(slot(f as u64).load(Ordering::Relaxed), 0);
    }
}
