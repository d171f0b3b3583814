//! Kernel launches: passed straight to the driver (the SM share is not enforced here yet).

use std::ffi::{c_uint, c_void};

use super::real_or_return;
use crate::ffi::*;

#[allow(clippy::too_many_arguments)]
pub unsafe fn launch_kernel(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let real = real_or_return!(cuLaunchKernel);
    // SAFETY: the caller's arguments, passed on unchanged.
    unsafe { real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra) }
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn launch_kernel_ptsz(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let real = real_or_return!(cuLaunchKernel_ptsz);
    // SAFETY: the caller's arguments, passed on unchanged.
    unsafe { real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra) }
}
