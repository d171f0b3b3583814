//! Every path that takes device memory, and the frees that give it back.
//!
//! | path | charged |
//! |---|---|
//! | `cuMemAlloc`, managed, stream-ordered (default and user pools) | the bytes asked for |
//! | `cuMemAllocPitch` | pitch × height, the pitch the driver chose |
//! | CUDA arrays 1D/2D/3D, mipmapped | the driver's own memory requirements where it reports them (CUDA ≥ 11.6), else the element bytes of every level |
//! | `cuMemCreate` on a device | the size |
//!
//! Managed memory is charged in full to the current context's device, although the driver
//! may keep part of it in host memory: the wall errs on the side of holding. Stream-ordered
//! frees give the charge back when they are enqueued, not when the stream reaches them.
//!
//! On a stream being captured into a graph, a stream-ordered allocation or free is not made
//! but recorded as a graph node: nothing is charged or given back then; the graph's launch
//! counts it (`graph`).

use std::ffi::c_uint;

use super::{charged, charged_in, graph, pool_reserve, real_or_return, uncharged};
use crate::api::real;
use crate::ffi::*;
use crate::slice::{self, Kind, PoolPlace};

macro_rules! slice_or_pass {
    ($call:expr) => {
        match slice::get() {
            Some(s) => s,
            None => return $call,
        }
    };
}

/// Reads what the driver wrote through an out-pointer it was given.
pub(super) fn written<T: Copy>(p: *const T) -> Option<T> {
    // SAFETY: only called after the driver reported success, so a non-null out-pointer
    // points at the value it wrote.
    (!p.is_null()).then(|| unsafe { p.read() })
}

pub unsafe fn mem_alloc(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult {
    let f = real_or_return!(cuMemAlloc_v2);
    // SAFETY: the caller's arguments, passed on unchanged.
    let call = || unsafe { f(dptr, bytes) };
    let s = slice_or_pass!(call());
    let dev = match s.current_device() {
        Ok(d) => d,
        Err(e) => return e,
    };
    // Freed with the current context if it is not freed first.
    let ctx = s.current_context();
    charged_in(s, Kind::Memory, dev, bytes as u64, ctx, call, || {
        written(dptr).unwrap_or(0)
    })
}

pub unsafe fn mem_alloc_managed(dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint) -> CUresult {
    let f = real_or_return!(cuMemAllocManaged);
    // SAFETY: the caller's arguments, passed on unchanged.
    let call = || unsafe { f(dptr, bytes, flags) };
    let s = slice_or_pass!(call());
    let dev = match s.current_device() {
        Ok(d) => d,
        Err(e) => return e,
    };
    // Freed with the current context if it is not freed first.
    let ctx = s.current_context();
    charged_in(s, Kind::Memory, dev, bytes as u64, ctx, call, || {
        written(dptr).unwrap_or(0)
    })
}

pub unsafe fn mem_free(dptr: CUdeviceptr) -> CUresult {
    let f = real_or_return!(cuMemFree_v2);
    // SAFETY: the caller's argument, passed on unchanged.
    let call = || unsafe { f(dptr) };
    let s = slice_or_pass!(call());
    if let Some(r) = graph::free_graph_allocation(s, dptr, call) {
        return r;
    }
    let r = uncharged(s, Kind::Memory, dptr, call);
    if r == CUDA_SUCCESS {
        pool_reserve::freed(s, dptr);
    }
    r
}

pub unsafe fn mem_alloc_pitch(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element: c_uint,
) -> CUresult {
    let f = real_or_return!(cuMemAllocPitch_v2);
    // SAFETY: the caller's arguments, passed on unchanged.
    let call = || unsafe { f(dptr, pitch, width, height, element) };
    let s = slice_or_pass!(call());
    let dev = match s.current_device() {
        Ok(d) => d,
        Err(e) => return e,
    };
    let Some(gpu) = s.position(dev) else {
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    // The pitch is at least the width: charge that first, then what the padding adds.
    let Some(least) = (width as u64).checked_mul(height as u64) else {
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    if !s.charge(gpu, least) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let r = call();
    if r != CUDA_SUCCESS {
        s.refund(gpu, least);
        return r;
    }
    let actual = (written(pitch).unwrap_or(0) as u64).saturating_mul(height as u64);
    if actual > least && !s.charge(gpu, actual - least) {
        if let Some(free) = real::cuMemFree_v2() {
            // SAFETY: freeing the allocation the driver just made.
            unsafe { free(written(dptr).unwrap_or(0)) };
        }
        s.refund(gpu, least);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if actual < least {
        s.refund(gpu, least - actual);
    }
    let ctx = s.current_context();
    s.record_in(Kind::Memory, written(dptr).unwrap_or(0), gpu, actual, ctx);
    CUDA_SUCCESS
}

type AllocAsync = unsafe extern "C" fn(*mut CUdeviceptr, usize, CUstream) -> CUresult;

/// Whether `stream` is being captured into a graph (`ptsz`: the per-thread default stream
/// variant). A stream-ordered allocation or free made there becomes a graph memory node.
pub(crate) fn capturing(stream: CUstream, ptsz: bool) -> bool {
    let f = if ptsz {
        real::cuStreamIsCapturing_ptsz().or_else(real::cuStreamIsCapturing)
    } else {
        real::cuStreamIsCapturing()
    };
    let Some(f) = f else {
        return false;
    };
    let mut status: std::ffi::c_int = 0;
    // SAFETY: cuStreamIsCapturing writes one CUstreamCaptureStatus.
    let r = unsafe { f(stream, &raw mut status) };
    r == CUDA_SUCCESS && status == CU_STREAM_CAPTURE_STATUS_ACTIVE
}

unsafe fn alloc_async(
    f: AllocAsync,
    ptsz: bool,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: the caller's arguments, passed on unchanged.
    let call = || unsafe { f(dptr, bytes, stream) };
    let s = slice_or_pass!(call());
    let _capture = super::capture::hold();
    if capturing(stream, ptsz) {
        return call();
    }
    // The stream's device's current pool, which the allocation comes from.
    let dev = match super::streams::stream_device(s, stream, ptsz) {
        Ok(d) => d,
        Err(e) => return e,
    };
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    let found = real::cuDeviceGetMemPool()
        // SAFETY: one pool handle to write.
        .is_some_and(|get| unsafe { get(&raw mut pool, dev) } == CUDA_SUCCESS);
    from_pool(
        s,
        dev,
        found.then_some(pool),
        ptsz,
        dptr,
        bytes,
        stream,
        &call,
    )
}

/// A stream-ordered allocation from `pool` (None: not known) on device `dev`, made by `call`.
#[allow(clippy::too_many_arguments)]
fn from_pool(
    s: &slice::Slice,
    dev: CUdevice,
    pool: Option<CUmemoryPool>,
    ptsz: bool,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: CUstream,
    call: &dyn Fn() -> CUresult,
) -> CUresult {
    let (Some(pool), Some(gpu)) = (pool.filter(|p| !p.is_null()), s.position(dev)) else {
        return charged(s, Kind::Memory, dev, bytes as u64, call, || {
            written(dptr).unwrap_or(0)
        });
    };
    let how = pool_reserve::PoolCall {
        pool,
        stream,
        ptsz,
        alloc: call,
        dptr,
    };
    pool_reserve::allocate(s, gpu, bytes as u64, &how)
}

pub unsafe fn mem_alloc_async(dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream) -> CUresult {
    // SAFETY: the caller's contract.
    unsafe { alloc_async(real_or_return!(cuMemAllocAsync), false, dptr, bytes, stream) }
}

pub unsafe fn mem_alloc_async_ptsz(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: the caller's contract.
    unsafe {
        alloc_async(
            real_or_return!(cuMemAllocAsync_ptsz),
            true,
            dptr,
            bytes,
            stream,
        )
    }
}

type AllocFromPool =
    unsafe extern "C" fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream) -> CUresult;

unsafe fn alloc_from_pool(
    f: AllocFromPool,
    ptsz: bool,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    // SAFETY: the caller's arguments, passed on unchanged.
    let call = || unsafe { f(dptr, bytes, pool, stream) };
    let s = slice_or_pass!(call());
    let _capture = super::capture::hold();
    if capturing(stream, ptsz) {
        return call();
    }
    let dev = match super::pools::place_of(s, pool) {
        // Page-locked host memory: nothing of the device.
        Some(PoolPlace::Host) => return call(),
        Some(PoolPlace::Device(d)) => d,
        None => match s.current_device() {
            Ok(d) => d,
            Err(e) => return e,
        },
    };
    from_pool(s, dev, Some(pool), ptsz, dptr, bytes, stream, &call)
}

pub unsafe fn mem_alloc_from_pool(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    // SAFETY: the caller's contract.
    unsafe {
        alloc_from_pool(
            real_or_return!(cuMemAllocFromPoolAsync),
            false,
            dptr,
            bytes,
            pool,
            stream,
        )
    }
}

pub unsafe fn mem_alloc_from_pool_ptsz(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    let f = real_or_return!(cuMemAllocFromPoolAsync_ptsz);
    // SAFETY: the caller's contract.
    unsafe { alloc_from_pool(f, true, dptr, bytes, pool, stream) }
}

type FreeAsync = unsafe extern "C" fn(CUdeviceptr, CUstream) -> CUresult;

fn free_async(f: FreeAsync, ptsz: bool, dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    // SAFETY: the caller's arguments, passed on unchanged.
    let call = || unsafe { f(dptr, stream) };
    let s = slice_or_pass!(call());
    let _capture = super::capture::hold();
    if capturing(stream, ptsz) {
        return call();
    }
    if let Some(r) = graph::free_graph_allocation(s, dptr, call) {
        return r;
    }
    let r = uncharged(s, Kind::Memory, dptr, call);
    if r == CUDA_SUCCESS {
        pool_reserve::freed(s, dptr);
    }
    r
}

pub unsafe fn mem_free_async(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    free_async(real_or_return!(cuMemFreeAsync), false, dptr, stream)
}

pub unsafe fn mem_free_async_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    free_async(real_or_return!(cuMemFreeAsync_ptsz), true, dptr, stream)
}

/// Element bytes of an array of the given extents (0 where the format is unknown).
fn array_estimate(width: usize, height: usize, depth: usize, format: i32, channels: c_uint) -> u64 {
    let e = array_format_bytes(format).unwrap_or(0);
    (width as u64)
        .saturating_mul(height.max(1) as u64)
        .saturating_mul(depth.max(1) as u64)
        .saturating_mul(e)
        .saturating_mul(u64::from(channels))
}

fn mipmapped_estimate(d: &CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) -> u64 {
    let (mut w, mut h, mut z) = (d.width, d.height, d.depth);
    let mut total = 0u64;
    for _ in 0..levels {
        total = total.saturating_add(array_estimate(w, h, z, d.format, d.num_channels));
        w = (w / 2).max(1);
        h = if h == 0 { 0 } else { (h / 2).max(1) };
        z = if z == 0 { 0 } else { (z / 2).max(1) };
    }
    total
}

type Requirements = unsafe extern "C" fn(
    *mut CUDA_ARRAY_MEMORY_REQUIREMENTS,
    *mut std::ffi::c_void,
    CUdevice,
) -> CUresult;
type Destroy = unsafe extern "C" fn(*mut std::ffi::c_void) -> CUresult;

/// Creates an array (`kind` Array or MipmappedArray) whose handle the driver writes to `out`,
/// charging `estimate` first, then settling on the driver's own figure where it gives one.
fn create_array(
    kind: Kind,
    estimate: u64,
    out: *mut *mut std::ffi::c_void,
    create: impl FnOnce() -> CUresult,
) -> CUresult {
    let s = slice_or_pass!(create());
    let (requirements, destroy): (Option<Requirements>, Option<Destroy>) = match kind {
        Kind::MipmappedArray => (
            real::cuMipmappedArrayGetMemoryRequirements(),
            real::cuMipmappedArrayDestroy(),
        ),
        _ => (real::cuArrayGetMemoryRequirements(), real::cuArrayDestroy()),
    };
    let dev = match s.current_device() {
        Ok(d) => d,
        Err(e) => return e,
    };
    let Some(gpu) = s.position(dev) else {
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    if !s.charge(gpu, estimate) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let r = create();
    if r != CUDA_SUCCESS {
        s.refund(gpu, estimate);
        return r;
    }
    let array = written(out).unwrap_or(std::ptr::null_mut());
    let mut req = CUDA_ARRAY_MEMORY_REQUIREMENTS {
        size: 0,
        alignment: 0,
        reserved: [0; 4],
    };
    // SAFETY: the driver fills the requirements of the array it just created.
    let exact = requirements
        .filter(|f| unsafe { f(&raw mut req, array, dev) } == CUDA_SUCCESS)
        .map_or(estimate, |_| req.size as u64);
    if exact > estimate && !s.charge(gpu, exact - estimate) {
        if let Some(d) = destroy {
            // SAFETY: destroying the array just created.
            unsafe { d(array) };
        }
        s.refund(gpu, estimate);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if exact < estimate {
        s.refund(gpu, estimate - exact);
    }
    s.record_in(kind, array as u64, gpu, exact, s.current_context());
    CUDA_SUCCESS
}

pub unsafe fn array_create(array: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) -> CUresult {
    let f = real_or_return!(cuArrayCreate_v2);
    // The driver is given a copy of the descriptor, the one estimated from (as for
    // cuMemCreate).
    // SAFETY: read only if non-null; the caller's descriptor.
    let copy = unsafe { desc.as_ref() }.copied();
    let estimate = copy.map_or(0, |d| {
        array_estimate(d.width, d.height, 0, d.format, d.num_channels)
    });
    let given = copy.as_ref().map_or(std::ptr::null(), std::ptr::from_ref);
    // SAFETY: the caller's arguments, the descriptor as copied.
    create_array(Kind::Array, estimate, array, || unsafe { f(array, given) })
}

pub unsafe fn array_3d_create(
    array: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    let f = real_or_return!(cuArray3DCreate_v2);
    // SAFETY: read only if non-null; the caller's descriptor (copied, as above).
    let copy = unsafe { desc.as_ref() }.copied();
    let estimate = copy.map_or(0, |d| {
        array_estimate(d.width, d.height, d.depth, d.format, d.num_channels)
    });
    let given = copy.as_ref().map_or(std::ptr::null(), std::ptr::from_ref);
    // SAFETY: the caller's arguments, the descriptor as copied.
    create_array(Kind::Array, estimate, array, || unsafe { f(array, given) })
}

pub unsafe fn array_destroy(array: CUarray) -> CUresult {
    let f = real_or_return!(cuArrayDestroy);
    // SAFETY: the caller's argument, passed on unchanged.
    let call = || unsafe { f(array) };
    let s = slice_or_pass!(call());
    uncharged(s, Kind::Array, array as u64, call)
}

pub unsafe fn mipmapped_array_create(
    array: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: c_uint,
) -> CUresult {
    let f = real_or_return!(cuMipmappedArrayCreate);
    // SAFETY: read only if non-null; the caller's descriptor (copied, as above).
    let copy = unsafe { desc.as_ref() }.copied();
    let estimate = copy.map_or(0, |d| mipmapped_estimate(&d, levels));
    let given = copy.as_ref().map_or(std::ptr::null(), std::ptr::from_ref);
    // SAFETY: the caller's arguments, the descriptor as copied.
    create_array(Kind::MipmappedArray, estimate, array, || unsafe {
        f(array, given, levels)
    })
}

pub unsafe fn mipmapped_array_destroy(array: CUmipmappedArray) -> CUresult {
    let f = real_or_return!(cuMipmappedArrayDestroy);
    // SAFETY: the caller's argument, passed on unchanged.
    let call = || unsafe { f(array) };
    let s = slice_or_pass!(call());
    uncharged(s, Kind::MipmappedArray, array as u64, call)
}

pub unsafe fn mem_create(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemPropHead,
    flags: u64,
) -> CUresult {
    let f = real_or_return!(cuMemCreate);
    // The driver is given a copy of the caller's properties, the one read here: another of
    // the caller's threads cannot change the location between this read and the driver's.
    // SAFETY: read only if non-null; the caller's CUmemAllocationProp, whole.
    let copy = unsafe { prop.cast::<CUmemAllocationProp>().as_ref() }.copied();
    let given = copy.as_ref().map_or(std::ptr::null(), |c| {
        std::ptr::from_ref(c).cast::<CUmemPropHead>()
    });
    // SAFETY: the caller's arguments, the properties as copied.
    let call = || unsafe { f(handle, size, given, flags) };
    let s = slice_or_pass!(call());
    let location = copy.map(|p| (p.head.location.typ, p.head.location.id));
    match location {
        Some((CU_MEM_LOCATION_TYPE_DEVICE, dev)) => {
            charged(s, Kind::Physical, dev, size as u64, call, || {
                written(handle).unwrap_or(0)
            })
        }
        // Host memory, or a request the driver will refuse.
        _ => call(),
    }
}
