//! Which GPU a stream-ordered allocation comes from, so that it is charged there.
//!
//! `cuMemAllocAsync` takes from the pool current to the *stream's* device, which need not be
//! the current context's: a stream of GPU 1's context used while GPU 0's is current allocates
//! on GPU 1. `cuMemAllocFromPoolAsync` takes from the pool it is given, on whichever device
//! that pool is, also one other than the stream's. So the library learns each pool's device
//! from every call that gives a pool out (`cuMemPoolCreate` with a device location,
//! `cuDeviceGetDefaultMemPool`, `cuDeviceGetMemPool`, and CUDA 13's `cuMemGetDefaultMemPool`
//! and `cuMemGetMemPool`) or makes one current (`cuMemSetMemPool`, in [`super::capture`]),
//! and finds a stream's device from its context ([`super::streams`]). A pool it does not know
//! (one in host memory) is charged to the current context's device: the wall errs on the side
//! of holding.

use crate::ffi::*;
use crate::slice::{self, Slice};

use super::alloc::written;
use super::{pool_reserve, real_or_return};

/// `CU_MEM_ALLOCATION_TYPE_PINNED`: device memory (the only kind a device's pools hold).
const PINNED: std::ffi::c_int = 1;

/// Records that `pool` is on device `dev`.
pub(super) fn remember(pool: CUmemoryPool, dev: CUdevice) {
    if let Some(s) = slice::get()
        && let Ok(mut pools) = s.pools.lock()
    {
        pools.insert(pool as usize, dev);
    }
}

/// The device pool `pool` is on, where a call that gave it out said.
pub(super) fn device_of(s: &Slice, pool: CUmemoryPool) -> Option<CUdevice> {
    s.pools
        .lock()
        .ok()
        .and_then(|p| p.get(&(pool as usize)).copied())
}

/// The device a location names for pinned memory, if it names one.
pub(super) fn located_device(
    location: *const CUmemLocation,
    kind: std::ffi::c_int,
) -> Option<CUdevice> {
    // SAFETY: read only if non-null; the caller's CUmemLocation.
    let l = unsafe { location.as_ref() }.copied()?;
    (l.typ == CU_MEM_LOCATION_TYPE_DEVICE && kind == PINNED).then_some(l.id)
}

pub unsafe fn mem_pool_create(pool: *mut CUmemoryPool, props: *const CUmemPropHead) -> CUresult {
    let f = real_or_return!(cuMemPoolCreate);
    // The driver is given a copy of the caller's properties, the one read here (as for
    // cuMemCreate).
    // SAFETY: read only if non-null; the caller's CUmemPoolProps, whole.
    let copy = unsafe { props.cast::<CUmemPoolProps>().as_ref() }.copied();
    let given = copy.as_ref().map_or(std::ptr::null(), |c| {
        std::ptr::from_ref(c).cast::<CUmemPropHead>()
    });
    // SAFETY: the caller's arguments, the properties as copied.
    let r = unsafe { f(pool, given) };
    if r != CUDA_SUCCESS {
        return r;
    }
    let location = copy.map(|p| (p.head.location.typ, p.head.location.id));
    if let (Some((CU_MEM_LOCATION_TYPE_DEVICE, dev)), Some(p)) = (location, written(pool)) {
        remember(p, dev);
    }
    r
}

type DevicePool = unsafe extern "C" fn(*mut CUmemoryPool, CUdevice) -> CUresult;

/// A pool of device `dev` given out by `f`.
fn device_pool(f: DevicePool, pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = unsafe { f(pool, dev) };
    if r == CUDA_SUCCESS
        && let Some(p) = written(pool)
    {
        remember(p, dev);
    }
    r
}

pub unsafe fn default_mem_pool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    device_pool(real_or_return!(cuDeviceGetDefaultMemPool), pool, dev)
}

pub unsafe fn device_mem_pool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    device_pool(real_or_return!(cuDeviceGetMemPool), pool, dev)
}

type LocatedPool =
    unsafe extern "C" fn(*mut CUmemoryPool, *mut CUmemLocation, std::ffi::c_int) -> CUresult;

/// A pool of a location given out by `f` (CUDA 13): the driver is given the library's copy of
/// the location, the one it records the pool under.
fn located_pool(
    f: LocatedPool,
    pool: *mut CUmemoryPool,
    location: *mut CUmemLocation,
    kind: std::ffi::c_int,
) -> CUresult {
    // SAFETY: read only if non-null; the caller's CUmemLocation.
    let mut copy = unsafe { location.as_ref() }.copied();
    let given = copy
        .as_mut()
        .map_or(std::ptr::null_mut(), std::ptr::from_mut);
    // SAFETY: the caller's arguments, the location as copied.
    let r = unsafe { f(pool, given, kind) };
    if r == CUDA_SUCCESS
        && let (Some(dev), Some(p)) = (located_device(given, kind), written(pool))
    {
        remember(p, dev);
    }
    r
}

pub unsafe fn mem_get_default_mem_pool(
    pool: *mut CUmemoryPool,
    location: *mut CUmemLocation,
    kind: std::ffi::c_int,
) -> CUresult {
    located_pool(
        real_or_return!(cuMemGetDefaultMemPool),
        pool,
        location,
        kind,
    )
}

pub unsafe fn mem_get_mem_pool(
    pool: *mut CUmemoryPool,
    location: *mut CUmemLocation,
    kind: std::ffi::c_int,
) -> CUresult {
    located_pool(real_or_return!(cuMemGetMemPool), pool, location, kind)
}

pub unsafe fn mem_pool_trim_to(pool: CUmemoryPool, keep: usize) -> CUresult {
    let f = real_or_return!(cuMemPoolTrimTo);
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = unsafe { f(pool, keep) };
    if r == CUDA_SUCCESS
        && let Some(s) = slice::get()
    {
        pool_reserve::trimmed(s, pool);
    }
    r
}

pub unsafe fn mem_pool_destroy(pool: CUmemoryPool) -> CUresult {
    let f = real_or_return!(cuMemPoolDestroy);
    // SAFETY: the caller's argument, passed on unchanged.
    let r = unsafe { f(pool) };
    if r == CUDA_SUCCESS
        && let Some(s) = slice::get()
    {
        if let Ok(mut pools) = s.pools.lock() {
            pools.remove(&(pool as usize));
        }
        pool_reserve::destroyed(s, pool);
    }
    r
}
