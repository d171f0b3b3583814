//! The context a stream's work goes to: the stream's own, which need not be the current
//! context (a stream of GPU 1's context used while GPU 0's is current), or the current one
//! for the default streams (NULL, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`). A stream-
//! ordered allocation comes from the pool of the stream's device, and a library's kernel
//! (`CUkernel`, context-less) runs in the stream's context, growing that context's stack.

use crate::api::real;
use crate::ffi::*;
use crate::slice::Slice;

/// Whether `stream` is one of the default streams, whose work goes to the current context.
fn is_default(stream: CUstream) -> bool {
    (stream as usize) <= 2
}

/// The context of `stream` (`ptsz`: the per-thread default stream variant of the call) where
/// it is not the current one; None for the default streams and the current context's.
pub(crate) fn other_context(stream: CUstream, ptsz: bool) -> Result<Option<CUcontext>, CUresult> {
    if is_default(stream) {
        return Ok(None);
    }
    let get = if ptsz {
        real::cuStreamGetCtx_ptsz().or_else(real::cuStreamGetCtx)
    } else {
        real::cuStreamGetCtx()
    }
    .ok_or(CUDA_ERROR_NOT_FOUND)?;
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: cuStreamGetCtx writes one CUcontext.
    match unsafe { get(stream, &raw mut ctx) } {
        CUDA_SUCCESS => {}
        e => return Err(e),
    }
    Ok((super::limits::current_context() != Some(ctx)).then_some(ctx))
}

/// Runs `f` with `ctx` current on this thread, then puts the caller's current context back.
pub(crate) fn in_context<T>(ctx: CUcontext, f: impl FnOnce() -> T) -> Result<T, CUresult> {
    let (Some(push), Some(pop)) = (real::cuCtxPushCurrent_v2(), real::cuCtxPopCurrent_v2()) else {
        return Err(CUDA_ERROR_NOT_FOUND);
    };
    // SAFETY: a context the driver named for a stream.
    match unsafe { push(ctx) } {
        CUDA_SUCCESS => {}
        e => return Err(e),
    }
    let out = f();
    let mut popped: CUcontext = std::ptr::null_mut();
    // SAFETY: pops the context pushed above; one CUcontext written.
    unsafe { pop(&raw mut popped) };
    Ok(out)
}

/// The device of `stream`: its context's, the current context's for the default streams.
pub(crate) fn stream_device(s: &Slice, stream: CUstream, ptsz: bool) -> Result<CUdevice, CUresult> {
    Ok(stream_place(s, stream, ptsz)?.1)
}

/// The context of `stream` where it is not the current one ([`other_context`]), and its
/// device.
pub(crate) fn stream_place(
    s: &Slice,
    stream: CUstream,
    ptsz: bool,
) -> Result<(Option<CUcontext>, CUdevice), CUresult> {
    let other = other_context(stream, ptsz)?;
    let dev = match other {
        None => s.current_device()?,
        Some(ctx) => in_context(ctx, || s.current_device())??,
    };
    Ok((other, dev))
}
