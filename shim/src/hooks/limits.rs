//! Context limits the driver backs with device memory (`cuCtxSetLimit`, which the runtime's
//! `cudaDeviceSetLimit` calls): the per-thread stack, reserved for every thread that can be
//! resident on the device (the value × threads per SM × SMs: 64 KiB a thread is 16.5 GiB on
//! an H100), the device `malloc` heap and the `printf` FIFO, byte for byte. Raising one is
//! charged before the driver is asked, the growth in what it reserves; lowering it gives back
//! what was charged for it; destroying the context (or releasing a primary one to zero) gives
//! back everything its limits were charged. What a context is made with is in its own charge.
//!
//! The device runtime's limits (sync depth, pending launches) reserve memory the driver does
//! not size publicly: the driver's share charges it from the agent's next sample
//! ([`crate::driver_share`]). The stack the driver grows itself at a launch of a kernel that
//! needs more is charged at that launch ([`super::stack`]).

use std::ffi::c_int;
use std::sync::RwLock;

use super::real_or_return;
use crate::api::real;
use crate::ffi::*;
use crate::log::log;
use crate::slice::{self, Kind, Slice};

const CU_LIMIT_STACK_SIZE: c_int = 0;
const CU_LIMIT_PRINTF_FIFO_SIZE: c_int = 1;
const CU_LIMIT_MALLOC_HEAP_SIZE: c_int = 2;
const BACKED: [c_int; 3] = [
    CU_LIMIT_STACK_SIZE,
    CU_LIMIT_PRINTF_FIFO_SIZE,
    CU_LIMIT_MALLOC_HEAP_SIZE,
];

const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 16;
const CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: c_int = 39;

/// One change of a limit at a time in this process: its value is read, changed and charged as
/// one step (the write lock). A launch that finds the stack large enough for its kernel holds
/// the read lock until the driver has it, so that no other thread lowers the stack in between
/// (the launch would grow it again, uncharged, and the charge given back for lowering it would
/// never be taken again).
pub(super) static CHANGING: RwLock<()> = RwLock::new(());

/// The key of a context's limit among the charges: contexts are heap addresses below 2^48.
fn key(ctx: CUcontext, limit: c_int) -> u64 {
    (ctx as u64).wrapping_mul(4).wrapping_add(limit as u64)
}

pub(super) fn attribute(dev: CUdevice, attribute: c_int) -> Option<u64> {
    let f = real::cuDeviceGetAttribute()?;
    let mut v: c_int = 0;
    // SAFETY: cuDeviceGetAttribute writes one int.
    let r = unsafe { f(&raw mut v, attribute, dev) };
    (r == CUDA_SUCCESS).then(|| u64::try_from(v).unwrap_or(0))
}

/// Device memory one unit of `limit` takes on `dev`.
pub(super) fn per_unit(dev: CUdevice, limit: c_int) -> Option<u64> {
    if limit != CU_LIMIT_STACK_SIZE {
        return Some(1);
    }
    let sms = attribute(dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    let threads = attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?;
    Some(sms.saturating_mul(threads))
}

pub(super) fn current_limit(limit: c_int) -> Result<u64, CUresult> {
    let f = real::cuCtxGetLimit().ok_or(CUDA_ERROR_NOT_FOUND)?;
    let mut v: usize = 0;
    // SAFETY: cuCtxGetLimit writes one size_t.
    match unsafe { f(&raw mut v, limit) } {
        CUDA_SUCCESS => Ok(v as u64),
        e => Err(e),
    }
}

pub(super) fn current_context() -> Option<CUcontext> {
    let f = real::cuCtxGetCurrent()?;
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: cuCtxGetCurrent writes one CUcontext.
    let r = unsafe { f(&raw mut ctx) };
    (r == CUDA_SUCCESS && !ctx.is_null()).then_some(ctx)
}

pub unsafe fn ctx_set_limit(limit: c_int, value: usize) -> CUresult {
    let f = real_or_return!(cuCtxSetLimit);
    // SAFETY: the caller's arguments, passed on unchanged.
    let call = || unsafe { f(limit, value) };
    let Some(s) = slice::get() else {
        return call();
    };
    if !BACKED.contains(&limit) {
        return call();
    }
    // Without a current context the driver refuses the call itself.
    let (Some(ctx), Ok(dev)) = (current_context(), s.current_device()) else {
        return call();
    };
    let Some(gpu) = s.position(dev) else {
        log!("device {dev} is not part of this container's slice");
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    let Some(unit) = per_unit(dev, limit) else {
        log!("limit {limit} left unchanged: its device memory cannot be sized");
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    let Ok(_one_at_a_time) = CHANGING.write() else {
        return CUDA_ERROR_UNKNOWN;
    };
    // A limit the driver cannot report it would not set either: its own answer.
    let before = match current_limit(limit) {
        Ok(v) => v,
        Err(e) => return e,
    };
    let wanted = value as u64;
    if wanted > before {
        let (r, set) = raise(s, ctx, limit, gpu, unit, before, wanted, call);
        if r == CUDA_SUCCESS && limit == CU_LIMIT_STACK_SIZE {
            super::stack::grant(ctx, set);
        }
        return r;
    }
    let key = key(ctx, limit);
    let charged = take_own(s, key);
    let r = call();
    if r != CUDA_SUCCESS {
        keep(s, key, gpu, charged);
        return r;
    }
    let set = current_limit(limit).unwrap_or(wanted);
    if limit == CU_LIMIT_STACK_SIZE {
        super::stack::grant(ctx, set);
    }
    let given = before.saturating_sub(set).saturating_mul(unit).min(charged);
    s.refund(gpu, given);
    keep(s, key, gpu, charged - given);
    r
}

/// What this process was charged for a context's limit under `key`, out of the books.
fn take_own(s: &Slice, key: u64) -> u64 {
    s.take(Kind::Limit, key)
        .filter(|c| c.owner == s.this_process())
        .map_or(0, |c| c.bytes)
}

/// Puts `bytes` back in the books for a context's limit under `key`.
fn keep(s: &Slice, key: u64, gpu: usize, bytes: u64) {
    if bytes > 0 {
        s.record(Kind::Limit, key, gpu, bytes);
    }
}

/// Raises `ctx`'s `limit` on slice position `gpu` from `before` to `to` (`unit` bytes of
/// device memory a unit) through `call`: `cuCtxSetLimit` itself, or a launch that makes the
/// driver grow the stack. The growth is charged first (the call refused with
/// `CUDA_ERROR_OUT_OF_MEMORY` where the slice has no room) and given back if the call fails;
/// otherwise the context's books keep what the driver reports the limit grown to. Returns the
/// call's result and that limit. Called under [`CHANGING`].
#[allow(clippy::too_many_arguments)]
pub(super) fn raise(
    s: &Slice,
    ctx: CUcontext,
    limit: c_int,
    gpu: usize,
    unit: u64,
    before: u64,
    to: u64,
    call: impl FnOnce() -> CUresult,
) -> (CUresult, u64) {
    let key = key(ctx, limit);
    let charged = take_own(s, key);
    let more = to.saturating_sub(before).saturating_mul(unit);
    if !s.charge(gpu, more) {
        keep(s, key, gpu, charged);
        log!(
            "refused raising limit {limit} from {before} to {to}: it would take {more} bytes more"
        );
        return (CUDA_ERROR_OUT_OF_MEMORY, before);
    }
    let r = call();
    if r != CUDA_SUCCESS {
        s.refund(gpu, more);
        keep(s, key, gpu, charged);
        return (r, before);
    }
    // The driver may round the value: charge what it set.
    let set = current_limit(limit).unwrap_or(to);
    let taken = set.saturating_sub(before).saturating_mul(unit);
    true_up(s, gpu, more, taken);
    keep(s, key, gpu, charged.saturating_add(taken));
    (r, set)
}

/// Brings a charge of `charged` bytes to what the driver `took`.
fn true_up(s: &Slice, gpu: usize, charged: u64, took: u64) {
    if took < charged {
        s.refund(gpu, charged - took);
    } else {
        s.charge_anyway(gpu, took - charged);
    }
}

/// Takes what the limits of `ctx` were charged out of the books, before the context is
/// destroyed; [`gone`] or [`kept`] after.
pub fn leaving(s: &Slice, ctx: CUcontext) -> Vec<(c_int, crate::slice::Charge)> {
    super::stack::forget_context(ctx);
    crate::pacing::forget_context(ctx);
    super::graph::forget_context(s, ctx);
    BACKED
        .iter()
        .filter_map(|&l| s.take(Kind::Limit, key(ctx, l)).map(|c| (l, c)))
        .collect()
}

/// The context is gone: its limits' charges are given back (and the functions' figures
/// forgotten, as its modules are gone).
pub fn gone(s: &Slice, charges: Vec<(c_int, crate::slice::Charge)>) {
    super::stack::forget_functions();
    for (_, c) in charges {
        s.settle(c);
    }
}

/// The context stays: its limits' charges go back in the books.
pub fn kept(s: &Slice, ctx: CUcontext, charges: Vec<(c_int, crate::slice::Charge)>) {
    for (l, c) in charges {
        s.put_back(Kind::Limit, key(ctx, l), c);
    }
}
