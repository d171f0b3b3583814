//! Contexts: the driver reserves device memory for each one, out of the same card, so each
//! context a process creates is charged the limits file's `context_bytes` for its GPU. The
//! primary context is charged once per device while this process holds it retained. What a
//! context's raised limits were charged ([`super::limits`]) goes back with the context. When
//! the primary context is destroyed (released to zero or reset) and the process has no other
//! context on that GPU, the driver has freed all it held there: its charges there go too.

use std::ffi::{c_int, c_uint, c_void};

use super::{charged, limits, real_or_return, uncharged};
use crate::ffi::*;
use crate::slice::{self, Kind, Primary, Slice};

fn create(ctx: *mut CUcontext, dev: CUdevice, call: impl FnOnce() -> CUresult) -> CUresult {
    let Some(s) = slice::get() else {
        return call();
    };
    let bytes = s.position(dev).map_or(0, |g| s.context_bytes(g));
    let key = || {
        if ctx.is_null() {
            return 0;
        }
        // SAFETY: read after the driver reported success, so `ctx` was written.
        unsafe { ctx.read() as u64 }
    };
    charged(s, Kind::Context, dev, bytes, call, key)
}

pub unsafe fn ctx_create_v2(ctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    let f = real_or_return!(cuCtxCreate_v2);
    // SAFETY: the caller's arguments, passed on unchanged.
    create(ctx, dev, || unsafe { f(ctx, flags, dev) })
}

pub unsafe fn ctx_create_v3(
    ctx: *mut CUcontext,
    params: *mut c_void,
    count: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    let f = real_or_return!(cuCtxCreate_v3);
    // SAFETY: the caller's arguments, passed on unchanged.
    create(ctx, dev, || unsafe { f(ctx, params, count, flags, dev) })
}

pub unsafe fn ctx_create_v4(
    ctx: *mut CUcontext,
    params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    let f = real_or_return!(cuCtxCreate_v4);
    // SAFETY: the caller's arguments, passed on unchanged.
    create(ctx, dev, || unsafe { f(ctx, params, flags, dev) })
}

/// OpenGL and VDPAU interop contexts (`cuGLCtxCreate`, deprecated since CUDA 5, and
/// `cuVDPAUCtxCreate`, each with its CUDA 2/3.0 form): contexts like any other, charged alike.
pub unsafe fn gl_ctx_create(ctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    let f = real_or_return!(cuGLCtxCreate);
    // SAFETY: the caller's arguments, passed on unchanged.
    create(ctx, dev, || unsafe { f(ctx, flags, dev) })
}

pub unsafe fn gl_ctx_create_v2(ctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    let f = real_or_return!(cuGLCtxCreate_v2);
    // SAFETY: the caller's arguments, passed on unchanged.
    create(ctx, dev, || unsafe { f(ctx, flags, dev) })
}

type VdpauCtxCreate =
    unsafe extern "C" fn(*mut CUcontext, c_uint, CUdevice, u32, *mut c_void) -> CUresult;

fn vdpau(
    f: VdpauCtxCreate,
    ctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
    vdp_device: u32,
    get_proc_address: *mut c_void,
) -> CUresult {
    // SAFETY: the caller's arguments, passed on unchanged.
    create(ctx, dev, || unsafe {
        f(ctx, flags, dev, vdp_device, get_proc_address)
    })
}

pub unsafe fn vdpau_ctx_create(
    ctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
    vdp_device: u32,
    get_proc_address: *mut c_void,
) -> CUresult {
    let f = real_or_return!(cuVDPAUCtxCreate);
    vdpau(f, ctx, flags, dev, vdp_device, get_proc_address)
}

pub unsafe fn vdpau_ctx_create_v2(
    ctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
    vdp_device: u32,
    get_proc_address: *mut c_void,
) -> CUresult {
    let f = real_or_return!(cuVDPAUCtxCreate_v2);
    vdpau(f, ctx, flags, dev, vdp_device, get_proc_address)
}

pub unsafe fn ctx_destroy(ctx: CUcontext) -> CUresult {
    destroy(real_or_return!(cuCtxDestroy_v2), ctx)
}

/// The unversioned `cuCtxDestroy`, as `cuGetProcAddress` gives it for CUDA versions before 4.0.
pub unsafe fn ctx_destroy_v1(ctx: CUcontext) -> CUresult {
    destroy(real_or_return!(cuCtxDestroy), ctx)
}

fn destroy(f: unsafe extern "C" fn(CUcontext) -> CUresult, ctx: CUcontext) -> CUresult {
    // SAFETY: the caller's argument, passed on unchanged.
    let call = || unsafe { f(ctx) };
    let Some(s) = slice::get() else {
        return call();
    };
    let raised = limits::leaving(s, ctx);
    let r = uncharged(s, Kind::Context, ctx as u64, call);
    if r == CUDA_SUCCESS {
        limits::gone(s, raised);
        s.forget_context(ctx as usize);
        super::module::context_gone(ctx as usize);
    } else {
        limits::kept(s, ctx, raised);
    }
    r
}

pub unsafe fn primary_retain(ctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    let f = real_or_return!(cuDevicePrimaryCtxRetain);
    let Some(s) = slice::get() else {
        // SAFETY: the caller's arguments, passed on unchanged.
        return unsafe { f(ctx, dev) };
    };
    let Ok(mut retained) = s.primary.lock() else {
        return CUDA_ERROR_UNKNOWN;
    };
    let held = retained.entry(dev).or_default();
    if held.count > 0 {
        // SAFETY: the caller's arguments, passed on unchanged.
        let r = unsafe { f(ctx, dev) };
        if r == CUDA_SUCCESS {
            held.count += 1;
            if held.ctx == 0 && !ctx.is_null() {
                // Retained first by a green context, whose creation does not name it.
                // SAFETY: written by the driver, which reported success.
                held.ctx = unsafe { ctx.read() as usize };
            }
        }
        return r;
    }
    let Some(gpu) = s.position(dev) else {
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    let bytes = s.context_bytes(gpu);
    if !s.charge(gpu, bytes) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = unsafe { f(ctx, dev) };
    if r == CUDA_SUCCESS {
        held.count = 1;
        held.ctx = if ctx.is_null() {
            0
        } else {
            // SAFETY: written by the driver, which reported success.
            unsafe { ctx.read() as usize }
        };
    } else {
        s.refund(gpu, bytes);
    }
    r
}

type ByDevice = unsafe extern "C" fn(CUdevice) -> CUresult;

/// Release (`drop_all` false) or reset (true) of the primary context.
fn primary_drop(f: ByDevice, dev: CUdevice, drop_all: bool) -> CUresult {
    let Some(s) = slice::get() else {
        // SAFETY: the caller's argument, passed on unchanged.
        return unsafe { f(dev) };
    };
    let Ok(mut retained) = s.primary.lock() else {
        return CUDA_ERROR_UNKNOWN;
    };
    if let Some(held) = retained.get(&dev)
        && held.ctx != 0
        && (drop_all || held.count == 1)
    {
        // The context may go with this call: nothing of this library's may be waiting on
        // its events meanwhile.
        crate::pacing::forget_context(held.ctx as CUcontext);
    }
    // SAFETY: the caller's argument, passed on unchanged.
    let r = unsafe { f(dev) };
    if r == CUDA_SUCCESS
        && let Some(held) = retained.get_mut(&dev)
        && held.count > 0
    {
        held.count = if drop_all { 0 } else { held.count - 1 };
        if held.count == 0
            && let Some(gpu) = s.position(dev)
        {
            primary_destroyed(s, gpu, held);
        }
    }
    r
}

/// The primary context is destroyed with its last reference, and with it its limits and all
/// memory allocated in it: where it was this process's only context on the GPU, that is all
/// this process held there.
fn primary_destroyed(s: &Slice, gpu: usize, held: &mut Primary) {
    super::module::context_gone(held.ctx);
    if s.has_own_context(gpu) {
        s.refund(gpu, s.context_bytes(gpu));
        limits::gone(s, limits::leaving(s, held.ctx as CUcontext));
        s.forget_context(held.ctx);
    } else {
        s.forget_gpu(gpu);
    }
    held.ctx = 0;
}

pub unsafe fn primary_release(dev: CUdevice) -> CUresult {
    primary_drop(real_or_return!(cuDevicePrimaryCtxRelease_v2), dev, false)
}

pub unsafe fn primary_release_v1(dev: CUdevice) -> CUresult {
    primary_drop(real_or_return!(cuDevicePrimaryCtxRelease), dev, false)
}

pub unsafe fn primary_reset(dev: CUdevice) -> CUresult {
    primary_drop(real_or_return!(cuDevicePrimaryCtxReset_v2), dev, true)
}

/// The unversioned reset, which the CUDA 12 runtime's `cudaDeviceReset` calls (it asks
/// `cuGetProcAddress` for it as of CUDA 7.0).
pub unsafe fn primary_reset_v1(dev: CUdevice) -> CUresult {
    primary_drop(real_or_return!(cuDevicePrimaryCtxReset), dev, true)
}

/// `cuGreenCtxCreate` (CUDA 12.4): a green context is a context of its own, charged as one, and
/// the driver retains the device's primary context for it until it is destroyed, which in
/// this process's books is one more reference to the primary context (charged when it is
/// the first).
pub unsafe fn green_ctx_create(
    green: *mut CUgreenCtx,
    desc: CUdevResourceDesc,
    dev: CUdevice,
    flags: c_uint,
) -> CUresult {
    let f = real_or_return!(cuGreenCtxCreate);
    // SAFETY: the caller's arguments, passed on unchanged.
    let call = || unsafe { f(green, desc, dev, flags) };
    let Some(s) = slice::get() else {
        return call();
    };
    let Some(gpu) = s.position(dev) else {
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    let Ok(mut retained) = s.primary.lock() else {
        return CUDA_ERROR_UNKNOWN;
    };
    let held = retained.entry(dev).or_default();
    let own = s.context_bytes(gpu);
    let bytes = if held.count == 0 { 2 * own } else { own };
    if !s.charge(gpu, bytes) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let r = call();
    if r == CUDA_SUCCESS && !green.is_null() {
        held.count += 1;
        // SAFETY: written by the driver, which reported success.
        let key = unsafe { green.read() } as u64;
        s.record(Kind::Context, key, gpu, own);
    } else {
        s.refund(gpu, bytes);
    }
    r
}

/// `cuGreenCtxDestroy`: the green context's charge and its raised limits go back, and so does
/// the driver's reference to the primary context.
pub unsafe fn green_ctx_destroy(green: CUgreenCtx) -> CUresult {
    let f = real_or_return!(cuGreenCtxDestroy);
    // SAFETY: the caller's argument, passed on unchanged.
    let call = || unsafe { f(green) };
    let Some(s) = slice::get() else {
        return call();
    };
    let ctx = context_of(green);
    let raised = limits::leaving(s, ctx);
    let Ok(mut retained) = s.primary.lock() else {
        limits::kept(s, ctx, raised);
        return CUDA_ERROR_UNKNOWN;
    };
    let charge = s.take(Kind::Context, green as u64);
    let r = call();
    if r != CUDA_SUCCESS {
        if let Some(c) = charge {
            s.put_back(Kind::Context, green as u64, c);
        }
        limits::kept(s, ctx, raised);
        return r;
    }
    limits::gone(s, raised);
    s.forget_context(ctx as usize);
    let Some(c) = charge else {
        return r;
    };
    s.settle(c);
    let primary = retained
        .iter_mut()
        .find(|(d, h)| h.count > 0 && s.position(**d) == Some(c.gpu));
    if let Some((_, held)) = primary {
        held.count -= 1;
        if held.count == 0 {
            primary_destroyed(s, c.gpu, held);
        }
    }
    r
}

/// The context a green context is used through (null where the driver does not say).
fn context_of(green: CUgreenCtx) -> CUcontext {
    let mut ctx: CUcontext = std::ptr::null_mut();
    if let Some(f) = crate::api::real::cuCtxFromGreenCtx() {
        // SAFETY: one handle to write and the caller's green context.
        if unsafe { f(&raw mut ctx, green) } != CUDA_SUCCESS {
            ctx = std::ptr::null_mut();
        }
    }
    ctx
}
