//! Variants of CUDA 12.5–13.0 drivers that name what their older form took implicitly: the
//! context (`cuCtxGetDevice_v2`, `cuCtxSynchronize_v2`), a stream's device or green context
//! (`cuStreamGetDevice`, `cuStreamGetCtx_v2`), or a memory location for the pool calls
//! (`cuMemGetDefaultMemPool`, `cuMemGetMemPool`, `cuMemSetMemPool`, which also name host
//! locations: [`crate::host_pools`]). The CUDA 13 runtime asks for them by these versions;
//! each does what the older call does on what it names.
//! `cuGetProcAddress` gives them only on nodes whose driver has them (580).

use std::ffi::{c_float, c_int};

use gpuslice_cuda_abi::cuda::{
    CU_MEM_ALLOCATION_TYPE_MANAGED, CU_MEM_ALLOCATION_TYPE_PINNED, CUevent, CUmemLocation,
};

use crate::codes::*;
use crate::context::{self, cuCtxPopCurrent_v2, cuCtxPushCurrent_v2};
use crate::host_pools;
use crate::paths::{
    CUstream, HostPlace, cuDeviceGetDefaultMemPool, cuDeviceGetMemPool, cuDeviceSetMemPool,
    pool_host_place, pool_node_index,
};
use crate::stream::{cuEventElapsedTime, cuStreamGetCtx};
use crate::{CUcontext, CUdevice, CUresult, guard, ok, out};

type CUmemoryPool = *mut std::ffi::c_void;
type CUgreenCtx = *mut std::ffi::c_void;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice_v2(dev: *mut CUdevice, ctx: CUcontext) -> CUresult {
    if ctx.is_null() {
        // SAFETY: the caller's out-parameter, passed on.
        return unsafe { context::cuCtxGetDevice(dev) };
    }
    guard(|| {
        out(
            dev,
            context::ordinal_of(ctx).ok_or(CUDA_ERROR_INVALID_CONTEXT)?,
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize_v2(ctx: CUcontext) -> CUresult {
    if ctx.is_null() {
        return context::cuCtxSynchronize();
    }
    guard(|| {
        context::active(ctx)?;
        ok(cuCtxPushCurrent_v2(ctx))?;
        let synchronized = context::cuCtxSynchronize();
        let mut popped = std::ptr::null_mut();
        // SAFETY: a local out-parameter; the context pushed above is popped.
        ok(unsafe { cuCtxPopCurrent_v2(&mut popped) })?;
        ok(synchronized)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCtx_v2(
    s: CUstream,
    ctx: *mut CUcontext,
    green: *mut CUgreenCtx,
) -> CUresult {
    guard(|| {
        if ctx.is_null() && green.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut c = std::ptr::null_mut();
        // SAFETY: a local out-parameter.
        ok(unsafe { cuStreamGetCtx(s, &mut c) })?;
        // No stream here belongs to a green context (cuGreenCtxStreamCreate is not modelled).
        if !green.is_null() {
            out(green, std::ptr::null_mut())?;
        }
        if !ctx.is_null() {
            out(ctx, c)?;
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetDevice(s: CUstream, dev: *mut CUdevice) -> CUresult {
    guard(|| {
        let mut c = std::ptr::null_mut();
        // SAFETY: a local out-parameter.
        ok(unsafe { cuStreamGetCtx(s, &mut c) })?;
        out(
            dev,
            context::ordinal_of(c).ok_or(CUDA_ERROR_INVALID_CONTEXT)?,
        )
    })
}

same_as! {
    cuStreamGetCtx_v2_ptsz => cuStreamGetCtx_v2(s: CUstream, ctx: *mut CUcontext, green: *mut CUgreenCtx);
    cuStreamGetDevice_ptsz => cuStreamGetDevice(s: CUstream, dev: *mut CUdevice);
    cuEventElapsedTime_v2 => cuEventElapsedTime(ms: *mut c_float, start: CUevent, end: CUevent);
}

/// What a pool call names: a device's pinned pools, or a host location's ([`host_pools`]).
/// Managed pools are not simulated.
enum Named {
    Device(CUdevice),
    Host(HostPlace),
}

fn named(location: *const CUmemLocation, kind: c_int) -> Result<Named, CUresult> {
    if location.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and a CUmemLocation per the API.
    let l = unsafe { *location };
    match kind {
        CU_MEM_ALLOCATION_TYPE_PINNED => {}
        CU_MEM_ALLOCATION_TYPE_MANAGED => return Err(CUDA_ERROR_NOT_SUPPORTED),
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    Ok(match host_pools::place_of(crate::state::get()?, l)? {
        Some(place) => Named::Host(place),
        None => Named::Device(l.id),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetDefaultMemPool(
    pool: *mut CUmemoryPool,
    location: *const CUmemLocation,
    kind: c_int,
) -> CUresult {
    guard(|| match named(location, kind)? {
        // SAFETY: the caller's out-parameter, passed on.
        Named::Device(dev) => ok(unsafe { cuDeviceGetDefaultMemPool(pool, dev) }),
        Named::Host(place) => out(pool, host_pools::default_pool(place)? as CUmemoryPool),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetMemPool(
    pool: *mut CUmemoryPool,
    location: *const CUmemLocation,
    kind: c_int,
) -> CUresult {
    guard(|| match named(location, kind)? {
        // SAFETY: the caller's out-parameter, passed on.
        Named::Device(dev) => ok(unsafe { cuDeviceGetMemPool(pool, dev) }),
        Named::Host(place) => out(pool, host_pools::current_pool(place)? as CUmemoryPool),
    })
}

/// Makes `pool` current for the location; the pool must be of that location and kind, or
/// the call answers `CUDA_ERROR_INVALID_VALUE` (not `cuDeviceSetMemPool`'s
/// `CUDA_ERROR_INVALID_DEVICE`), as cuda.h says.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemSetMemPool(
    location: *const CUmemLocation,
    kind: c_int,
    pool: CUmemoryPool,
) -> CUresult {
    guard(|| {
        let host = pool_host_place(pool)?;
        match named(location, kind)? {
            Named::Device(dev) => {
                let index = crate::state::get()?.node_index(dev)?;
                if host.is_some() || pool_node_index(pool)? != index {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                // SAFETY: the caller's pool handle, passed on.
                ok(unsafe { cuDeviceSetMemPool(dev, pool) })
            }
            Named::Host(place) if host == Some(place) => {
                host_pools::set_current(place, pool as usize)
            }
            Named::Host(_) => Err(CUDA_ERROR_INVALID_VALUE),
        }
    })
}
