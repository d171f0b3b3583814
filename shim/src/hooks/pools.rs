//! Which GPU a stream-ordered allocation comes from, so that it is charged there.
//!
//! `cuMemAllocAsync` takes from the pool current to the *stream's* device, which need not be
//! the current context's: a stream of GPU 1's context used while GPU 0's is current allocates
//! on GPU 1. `cuMemAllocFromPoolAsync` takes from the pool it is given, on whichever device
//! that pool is, also one other than the stream's. So the library learns each pool's device
//! from every call that gives a pool out (`cuMemPoolCreate` with a device location,
//! `cuDeviceGetDefaultMemPool`, `cuDeviceGetMemPool`, and CUDA 13's `cuMemGetDefaultMemPool`
//! and `cuMemGetMemPool`) or makes one current (`cuMemSetMemPool`, in [`super::capture`]),
//! and finds a stream's device from its context ([`super::streams`]). A pool made in host
//! memory (located on the host or a host NUMA node: `cuMemPoolCreate`, and CUDA 13's default
//! pool of such a location) gives out page-locked host memory, which is not charged; a pool
//! is never taken as one in host memory because the caller named it with a host location
//! (`cuMemSetMemPool`, or `cuMemGetMemPool` after it) unless it is one of those. A pool it
//! does not know (one imported from another process) is charged to the current context's
//! device: the wall errs on the side of holding. Destroying a pool waits for the
//! stream-ordered allocations being decided ([`super::capture`]), so that no allocation judged
//! to come from a host pool is made from a device pool given the same handle in between.

use crate::ffi::*;
use crate::slice::{self, PoolPlace, Slice};

use super::alloc::written;
use super::{pool_reserve, real_or_return};

/// `CU_MEM_ALLOCATION_TYPE_PINNED`: page-locked memory, of a device or of the host.
const PINNED: std::ffi::c_int = 1;

/// Records where `pool` holds its memory.
pub(super) fn remember(pool: CUmemoryPool, place: PoolPlace) {
    if let Some(s) = slice::get()
        && let Ok(mut pools) = s.pools.lock()
    {
        pools.insert(pool as usize, place);
    }
}

/// Where `pool` holds its memory, where a call that made it or gave it out said.
pub(super) fn place_of(s: &Slice, pool: CUmemoryPool) -> Option<PoolPlace> {
    s.pools
        .lock()
        .ok()
        .and_then(|p| p.get(&(pool as usize)).copied())
}

/// Where a pool of `kind` memory at `location` holds it: the device it names (managed memory
/// too, which prefers it), or host memory for pinned memory on the host or a host NUMA node;
/// None for anything else (managed memory on the host, which may move to a device, or a
/// location the driver refuses).
pub(super) fn located_place(location: CUmemLocation, kind: std::ffi::c_int) -> Option<PoolPlace> {
    match (location.typ, kind) {
        (CU_MEM_LOCATION_TYPE_DEVICE, _) => Some(PoolPlace::Device(location.id)),
        (CU_MEM_LOCATION_TYPE_HOST | CU_MEM_LOCATION_TYPE_HOST_NUMA, PINNED) => {
            Some(PoolPlace::Host)
        }
        _ => None,
    }
}

/// As [`located_place`], for the caller's location.
pub(super) fn place_at(location: *const CUmemLocation, kind: std::ffi::c_int) -> Option<PoolPlace> {
    // SAFETY: read only if non-null; the caller's CUmemLocation.
    let l = unsafe { location.as_ref() }.copied()?;
    located_place(l, kind)
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
    let place = copy.and_then(|p| located_place(p.head.location, p.head.typ));
    if let (Some(place), Some(p)) = (place, written(pool)) {
        remember(p, place);
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
        remember(p, PoolPlace::Device(dev));
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
/// the location, and `place` decides from it where the pool given out is recorded (None:
/// nowhere new).
fn located_pool(
    f: LocatedPool,
    pool: *mut CUmemoryPool,
    location: *mut CUmemLocation,
    kind: std::ffi::c_int,
    place: impl FnOnce(CUmemoryPool, CUmemLocation) -> Option<PoolPlace>,
) -> CUresult {
    // SAFETY: read only if non-null; the caller's CUmemLocation.
    let mut copy = unsafe { location.as_ref() }.copied();
    let given = copy
        .as_mut()
        .map_or(std::ptr::null_mut(), std::ptr::from_mut);
    // SAFETY: the caller's arguments, the location as copied.
    let r = unsafe { f(pool, given, kind) };
    if r == CUDA_SUCCESS
        && let (Some(l), Some(p)) = (copy, written(pool))
        && let Some(place) = place(p, l)
    {
        remember(p, place);
    }
    r
}

/// Whether `pool` is the driver's own default pool of host location `location`.
fn is_default_host_pool(
    pool: CUmemoryPool,
    mut location: CUmemLocation,
    kind: std::ffi::c_int,
) -> bool {
    let Some(f) = crate::api::real::cuMemGetDefaultMemPool() else {
        return false;
    };
    let mut default: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: one pool handle to write, and a location of the library's own.
    let r = unsafe { f(&raw mut default, &raw mut location, kind) };
    r == CUDA_SUCCESS && default == pool
}

/// The driver's default pool of a location: where the location says (a host location's
/// default pool is the driver's own, in host memory).
pub unsafe fn mem_get_default_mem_pool(
    pool: *mut CUmemoryPool,
    location: *mut CUmemLocation,
    kind: std::ffi::c_int,
) -> CUresult {
    let f = real_or_return!(cuMemGetDefaultMemPool);
    located_pool(f, pool, location, kind, |_, l| located_place(l, kind))
}

/// The pool current for a location, which the caller may have made current
/// (`cuMemSetMemPool`): a device's is recorded on that device; for a host location, the pool
/// counts as host memory only where the library knows it as such already (made in host
/// memory) or it is the driver's default pool there, never by the location alone (a driver
/// that took a device pool as a host location's would otherwise let its memory go
/// uncharged).
pub unsafe fn mem_get_mem_pool(
    pool: *mut CUmemoryPool,
    location: *mut CUmemLocation,
    kind: std::ffi::c_int,
) -> CUresult {
    let f = real_or_return!(cuMemGetMemPool);
    located_pool(f, pool, location, kind, |p, l| {
        match located_place(l, kind)? {
            PoolPlace::Host => is_default_host_pool(p, l, kind).then_some(PoolPlace::Host),
            device => Some(device),
        }
    })
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
    let _decided = super::capture::alone();
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
