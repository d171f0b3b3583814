//! Kernel launches: paced where the slice has a share of the GPU's SMs (see `pacing`), the
//! stack growth a kernel with more local memory makes the driver take charged first (see
//! `stack`), then passed to the driver unchanged.

use std::ffi::{c_uint, c_void};

use super::real_or_return;
use super::stack::{beyond_default, launching};
use crate::ffi::*;

/// Waits for the slice's SM share, if it has one, to allow a grid of gx × gy × gz blocks
/// launched on `stream` (`ptsz`: the per-thread default stream's variant). A launch captured
/// into a graph runs nothing now: it is paced when the graph is launched.
#[inline]
fn pace(gx: c_uint, gy: c_uint, gz: c_uint, stream: CUstream, ptsz: bool) {
    if let Some(s) = crate::slice::get()
        && s.paced
        && !super::alloc::capturing(stream, ptsz)
    {
        crate::pacing::pace(s, u64::from(gx) * u64::from(gy) * u64::from(gz));
    }
}

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
    pace(gx, gy, gz, stream, false);
    if let Some(bound) = beyond_default(f) {
        // SAFETY: the caller's arguments, passed on unchanged.
        return launching(bound, f, stream, false, || unsafe {
            real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)
        });
    }
    // SAFETY: as above.
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
    pace(gx, gy, gz, stream, true);
    if let Some(bound) = beyond_default(f) {
        // SAFETY: the caller's arguments, passed on unchanged.
        return launching(bound, f, stream, true, || unsafe {
            real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)
        });
    }
    // SAFETY: as above.
    unsafe { real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra) }
}

/// Paces the grid of a launch configuration, if there is one to read; its stream.
fn pace_config(config: *const CUlaunchConfig, ptsz: bool) -> CUstream {
    if config.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: a non-null configuration the caller passes to the driver, readable by its
    // contract.
    let c = unsafe { &*config };
    pace(c.grid_dim_x, c.grid_dim_y, c.grid_dim_z, c.stream, ptsz);
    c.stream
}

pub unsafe fn launch_kernel_ex(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let real = real_or_return!(cuLaunchKernelEx);
    let stream = pace_config(config, false);
    if let Some(bound) = beyond_default(f) {
        // SAFETY: the caller's arguments, passed on unchanged.
        return launching(bound, f, stream, false, || unsafe {
            real(config, f, params, extra)
        });
    }
    // SAFETY: as above.
    unsafe { real(config, f, params, extra) }
}

pub unsafe fn launch_kernel_ex_ptsz(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let real = real_or_return!(cuLaunchKernelEx_ptsz);
    let stream = pace_config(config, true);
    if let Some(bound) = beyond_default(f) {
        // SAFETY: the caller's arguments, passed on unchanged.
        return launching(bound, f, stream, true, || unsafe {
            real(config, f, params, extra)
        });
    }
    // SAFETY: as above.
    unsafe { real(config, f, params, extra) }
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn launch_cooperative_kernel(
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
) -> CUresult {
    let real = real_or_return!(cuLaunchCooperativeKernel);
    pace(gx, gy, gz, stream, false);
    if let Some(bound) = beyond_default(f) {
        // SAFETY: the caller's arguments, passed on unchanged.
        return launching(bound, f, stream, false, || unsafe {
            real(f, gx, gy, gz, bx, by, bz, shared, stream, params)
        });
    }
    // SAFETY: as above.
    unsafe { real(f, gx, gy, gz, bx, by, bz, shared, stream, params) }
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn launch_cooperative_kernel_ptsz(
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
) -> CUresult {
    let real = real_or_return!(cuLaunchCooperativeKernel_ptsz);
    pace(gx, gy, gz, stream, true);
    if let Some(bound) = beyond_default(f) {
        // SAFETY: the caller's arguments, passed on unchanged.
        return launching(bound, f, stream, true, || unsafe {
            real(f, gx, gy, gz, bx, by, bz, shared, stream, params)
        });
    }
    // SAFETY: as above.
    unsafe { real(f, gx, gy, gz, bx, by, bz, shared, stream, params) }
}
