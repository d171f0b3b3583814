//! `cuGetProcAddress`: the driver answers (so the CUDA version and the per-thread default
//! stream flag pick the variant exactly as the driver does), then an answer that is one of
//! the intercepted functions is replaced by this library's export of that same variant,
//! `cuGetProcAddress` itself included, so that later lookups stay caught.

use std::ffi::{c_char, c_int, c_void};

use super::real_or_return;
use crate::api;
use crate::ffi::*;

fn replace(r: CUresult, pfn: *mut *mut c_void) -> CUresult {
    if r != CUDA_SUCCESS || pfn.is_null() {
        return r;
    }
    // SAFETY: pfn is non-null and the driver just wrote it.
    let p = unsafe { pfn.read() };
    if let Some(ours) = api::intercepted_by_real_address(p).and_then(api::export_of) {
        // SAFETY: as above.
        unsafe { pfn.write(ours) };
    }
    r
}

pub unsafe fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    let f = real_or_return!(cuGetProcAddress);
    // SAFETY: the caller's arguments, passed on unchanged.
    replace(unsafe { f(symbol, pfn, version, flags) }, pfn)
}

pub unsafe fn get_proc_address_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    let f = real_or_return!(cuGetProcAddress_v2);
    // SAFETY: the caller's arguments, passed on unchanged.
    replace(unsafe { f(symbol, pfn, version, flags, status) }, pfn)
}
