//! Entry points whose memory the wall cannot count, refused in a slice with
//! `CUDA_ERROR_NOT_SUPPORTED` (and a log line); outside a slice they pass through.
//!
//! | entry point | why |
//! |---|---|
//! | `cuMemAlloc`, `cuMemAllocPitch`, `cuArrayCreate`, `cuArray3DCreate`, `cuMemFree`, `cuMemGetInfo`, `cuDeviceTotalMem` (unversioned) | the 32-bit API before CUDA 3.2; `cuda.h` has mapped these names to the `_v2` functions since, so only a program looking for them on purpose calls them (the two queries would show the card, not the slice) |
//! | `cuMemImportFromShareableHandle`, `cuMemPoolImportFromShareableHandle`, `cuMemPoolImportPointer` | memory another process allocated, kept alive by the import after its owner gives it back |
//! | `cuMemExportToShareableHandle`, `cuMemPoolExportToShareableHandle`, `cuMemPoolExportPointer` | the exported handle (a file descriptor any process may hold, CUDA or not) keeps the memory alive after its owner releases it and the books give it back |
//! | `cuMemGetHandleForAddressRange` | the dma-buf file descriptor it exports holds the range's memory as an exported handle does |
//! | `cuMulticastCreate` | multicast objects span GPUs and are backed by memory bound to them outside the allocators |
//!
//! The device attributes that tell of these features report them absent in a slice (`info`).
//!
//! Graph memory nodes are counted when a graph is launched (`graph`).

use std::ffi::{c_int, c_uint, c_void};

use crate::ffi::*;
use crate::log::log;
use crate::slice;

/// Refuses `name` in a slice; passes `call` through otherwise.
fn refuse_in_slice(name: &str, call: impl FnOnce() -> CUresult) -> CUresult {
    if slice::get().is_none() {
        return call();
    }
    log!("{name}: not supported in a slice (its memory cannot be counted)");
    CUDA_ERROR_NOT_SUPPORTED
}

macro_rules! refused {
    ($( $hook:ident => $name:ident ( $($arg:ident : $ty:ty),* ); )*) => {
        $(
            pub unsafe fn $hook($($arg: $ty),*) -> CUresult {
                refuse_in_slice(stringify!($name), || match crate::api::real::$name() {
                    // SAFETY: the caller's arguments, passed on unchanged.
                    Some(f) => unsafe { f($($arg),*) },
                    None => CUDA_ERROR_NOT_FOUND,
                })
            }
        )*
    };
}

refused! {
    legacy_mem_alloc => cuMemAlloc(dptr: *mut c_uint, bytes: c_uint);
    legacy_mem_alloc_pitch => cuMemAllocPitch(dptr: *mut c_uint, pitch: *mut c_uint, width: c_uint, height: c_uint, element: c_uint);
    legacy_array_create => cuArrayCreate(array: *mut CUarray, desc: *const c_void);
    legacy_array_3d_create => cuArray3DCreate(array: *mut CUarray, desc: *const c_void);
    legacy_mem_free => cuMemFree(dptr: c_uint);
    legacy_mem_get_info => cuMemGetInfo(free: *mut c_uint, total: *mut c_uint);
    legacy_device_total_mem => cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice);
    mem_import_from_shareable_handle => cuMemImportFromShareableHandle(handle: *mut CUmemGenericAllocationHandle, os_handle: *mut c_void, kind: c_int);
    mem_pool_import_from_shareable_handle => cuMemPoolImportFromShareableHandle(pool: *mut CUmemoryPool, handle: *mut c_void, kind: c_int, flags: u64);
    mem_pool_import_pointer => cuMemPoolImportPointer(dptr: *mut CUdeviceptr, pool: CUmemoryPool, data: *mut c_void);
    mem_export_to_shareable_handle => cuMemExportToShareableHandle(os_handle: *mut c_void, handle: CUmemGenericAllocationHandle, kind: c_int, flags: u64);
    mem_pool_export_to_shareable_handle => cuMemPoolExportToShareableHandle(os_handle: *mut c_void, pool: CUmemoryPool, kind: c_int, flags: u64);
    mem_pool_export_pointer => cuMemPoolExportPointer(data: *mut c_void, dptr: CUdeviceptr);
    multicast_create => cuMulticastCreate(handle: *mut CUmemGenericAllocationHandle, prop: *const c_void);
    mem_get_handle_for_address_range => cuMemGetHandleForAddressRange(handle: *mut c_void, dptr: CUdeviceptr, size: usize, kind: c_int, flags: u64);
}
