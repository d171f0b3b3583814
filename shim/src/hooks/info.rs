//! What programs see: `cuMemGetInfo` and `cuDeviceTotalMem` report the slice, and so do NVML's
//! memory queries (so `nvidia-smi` in the container shows it). Free is the limit less what the
//! container holds, never more than the card really has free, never negative, never an error
//! where the driver gave none. A device outside the slice reports no memory. The device
//! attributes that tell of features a slice refuses (`refused`) report them absent.

use std::ffi::c_int;

use super::real_or_return;
use crate::ffi::*;
use crate::slice::{self, Slice};

/// (total, free, used) of slice position `gpu`, given what the driver says is free.
fn seen(s: &Slice, gpu: Option<usize>, real_free: u64) -> (u64, u64, u64) {
    match gpu {
        Some(g) => {
            let (limit, used) = (s.limit(g), s.used(g));
            (
                limit,
                limit.saturating_sub(used).min(real_free),
                used.min(limit),
            )
        }
        None => (0, 0, 0),
    }
}

pub unsafe fn mem_get_info(free: *mut usize, total: *mut usize) -> CUresult {
    let f = real_or_return!(cuMemGetInfo_v2);
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = unsafe { f(free, total) };
    let Some(s) = slice::get() else {
        return r;
    };
    if r != CUDA_SUCCESS || free.is_null() || total.is_null() {
        return r;
    }
    let gpu = s.current_device().ok().and_then(|d| s.position(d));
    // SAFETY: both non-null and just written by the driver.
    unsafe {
        let (t, fr, _) = seen(s, gpu, *free as u64);
        *total = usize::try_from(t).unwrap_or(usize::MAX);
        *free = usize::try_from(fr).unwrap_or(usize::MAX);
    }
    r
}

pub unsafe fn device_total_mem(bytes: *mut usize, dev: CUdevice) -> CUresult {
    let f = real_or_return!(cuDeviceTotalMem_v2);
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = unsafe { f(bytes, dev) };
    if let Some(s) = slice::get()
        && r == CUDA_SUCCESS
        && !bytes.is_null()
    {
        let limit = s.position(dev).map_or(0, |g| s.limit(g));
        // SAFETY: non-null and just written by the driver.
        unsafe { *bytes = usize::try_from(limit).unwrap_or(usize::MAX) };
    }
    r
}

/// Device attributes that tell of features a slice refuses (`refused`): memory exported as
/// shareable handles (file descriptors, Windows handles, fabric handles, a pool's handle
/// types), dma-buf exports and multicast objects. A slice reports them absent (0, and no
/// handle type for a pool), so that software that checks them takes the path it takes on a
/// device without them instead of meeting the refusal (NCCL reads the dma-buf, multicast and
/// fabric attributes before it uses those features).
const ABSENT_IN_A_SLICE: [c_int; 7] = [
    CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
    CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_HANDLE_SUPPORTED,
    CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED,
    CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES,
    CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
    CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED,
    CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED,
];

pub unsafe fn device_get_attribute(value: *mut c_int, attribute: c_int, dev: CUdevice) -> CUresult {
    let f = real_or_return!(cuDeviceGetAttribute);
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = unsafe { f(value, attribute, dev) };
    if r == CUDA_SUCCESS
        && !value.is_null()
        && ABSENT_IN_A_SLICE.contains(&attribute)
        && slice::get().is_some()
    {
        // SAFETY: non-null and just written by the driver.
        unsafe { *value = 0 };
    }
    r
}

macro_rules! nvml_real_or_return {
    ($name:ident) => {
        match crate::api::real::$name() {
            Some(f) => f,
            None => return NVML_ERROR_UNINITIALIZED,
        }
    };
}

pub unsafe fn nvml_memory_info(dev: nvmlDevice_t, memory: *mut nvmlMemory_t) -> nvmlReturn_t {
    let f = nvml_real_or_return!(nvmlDeviceGetMemoryInfo);
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = unsafe { f(dev, memory) };
    if let Some(s) = slice::get()
        && r == NVML_SUCCESS
        && !memory.is_null()
    {
        // SAFETY: non-null and just written by the library.
        let m = unsafe { &mut *memory };
        let (total, free, used) = seen(s, s.nvml_position(dev), m.free);
        *m = nvmlMemory_t { total, free, used };
    }
    r
}

pub unsafe fn nvml_memory_info_v2(dev: nvmlDevice_t, memory: *mut nvmlMemory_v2_t) -> nvmlReturn_t {
    let f = nvml_real_or_return!(nvmlDeviceGetMemoryInfo_v2);
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = unsafe { f(dev, memory) };
    if let Some(s) = slice::get()
        && r == NVML_SUCCESS
        && !memory.is_null()
    {
        // SAFETY: non-null and just written by the library.
        let m = unsafe { &mut *memory };
        let (total, free, used) = seen(s, s.nvml_position(dev), m.free);
        m.total = total;
        m.reserved = 0;
        m.free = free;
        m.used = used;
    }
    r
}
