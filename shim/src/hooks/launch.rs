//! Kernel launches: paced where the slice has a share of the GPU's SMs (see `pacing`), the
//! stack growth a kernel with more local memory makes the driver take charged first (see
//! `stack`), then passed to the driver unchanged. Every launch call the driver exports is
//! here: the CUDA 2.0 calls (`cuLaunch`, `cuLaunchGrid`, `cuLaunchGridAsync`, deprecated and
//! still exported) too, or a tenant would launch through them unpaced. A multi-device
//! cooperative launch (`cuLaunchCooperativeKernelMultiDevice`, deprecated since CUDA 11.3) of
//! one device is paced as a cooperative launch; one of several devices is refused
//! (`CUDA_ERROR_NOT_SUPPORTED`) where the slice is paced or a kernel needs more stack than
//! the default: each device would be paced and charged on its own, which is not done.

use std::ffi::{c_int, c_uint, c_void};

use super::real_or_return;
use super::stack::{beyond_default, launching};
use crate::ffi::*;
use crate::pacing::Paced;

/// Waits for the slice's SM share, if it has one, to allow a grid of gx × gy × gz blocks
/// launched on `stream` (`ptsz`: the per-thread default stream's variant); what to do once
/// the driver has it ([`launched`]). A launch captured into a graph runs nothing now: it is
/// paced when the graph is launched.
#[inline]
fn pace(gx: c_uint, gy: c_uint, gz: c_uint, stream: CUstream, ptsz: bool) -> Option<Paced> {
    pace_blocks(u64::from(gx) * u64::from(gy) * u64::from(gz), stream, ptsz)
}

/// As [`pace`], for work of `blocks` thread blocks (a memset's, `memset`).
#[inline(always)]
pub(super) fn pace_blocks(blocks: u64, stream: CUstream, ptsz: bool) -> Option<Paced> {
    if let Some(s) = crate::slice::get()
        && s.paced
        && !super::alloc::capturing(stream, ptsz)
    {
        return crate::pacing::pace(s, blocks, stream, ptsz);
    }
    None
}

/// The driver's answer `r` to a launch on `stream`, once a paced one is recorded behind the
/// work its process has queued.
#[inline(always)]
pub(super) fn launched(
    paced: Option<Paced>,
    r: CUresult,
    stream: CUstream,
    ptsz: bool,
) -> CUresult {
    if let Some(p) = paced {
        p.launched(r, stream, ptsz);
    }
    r
}

/// Passes the launch of `f` on `stream` to the driver (`call`): the stack growth its kernel
/// makes the driver take charged first, and a paced one recorded behind the work its process
/// has queued.
#[inline(always)]
fn go(
    f: CUfunction,
    stream: CUstream,
    ptsz: bool,
    paced: Option<Paced>,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    match (paced, beyond_default(f)) {
        (None, None) => call(),
        (paced, Some(bound)) => {
            launched(paced, launching(bound, f, stream, ptsz, call), stream, ptsz)
        }
        (paced, None) => launched(paced, call(), stream, ptsz),
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
    let paced = pace(gx, gy, gz, stream, false);
    // SAFETY: the caller's arguments, passed on unchanged.
    let call = || unsafe { real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra) };
    go(f, stream, false, paced, call)
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
    let paced = pace(gx, gy, gz, stream, true);
    // SAFETY: the caller's arguments, passed on unchanged.
    let call = || unsafe { real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra) };
    go(f, stream, true, paced, call)
}

/// Paces the grid of a launch configuration, if there is one to read; its stream.
fn pace_config(config: *const CUlaunchConfig, ptsz: bool) -> (CUstream, Option<Paced>) {
    if config.is_null() {
        return (std::ptr::null_mut(), None);
    }
    // SAFETY: a non-null configuration the caller passes to the driver, readable by its
    // contract.
    let c = unsafe { &*config };
    let paced = pace(c.grid_dim_x, c.grid_dim_y, c.grid_dim_z, c.stream, ptsz);
    (c.stream, paced)
}

pub unsafe fn launch_kernel_ex(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let real = real_or_return!(cuLaunchKernelEx);
    // The driver is given the copy of the configuration that is paced.
    // SAFETY: read only if non-null; the caller's CUlaunchConfig.
    let copy = unsafe { config.as_ref() }.copied();
    let config = copy.as_ref().map_or(config, std::ptr::from_ref);
    let (stream, paced) = pace_config(config, false);
    // SAFETY: the caller's arguments, the configuration as copied.
    let call = || unsafe { real(config, f, params, extra) };
    go(f, stream, false, paced, call)
}

pub unsafe fn launch_kernel_ex_ptsz(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let real = real_or_return!(cuLaunchKernelEx_ptsz);
    // The driver is given the copy of the configuration that is paced.
    // SAFETY: read only if non-null; the caller's CUlaunchConfig.
    let copy = unsafe { config.as_ref() }.copied();
    let config = copy.as_ref().map_or(config, std::ptr::from_ref);
    let (stream, paced) = pace_config(config, true);
    // SAFETY: the caller's arguments, the configuration as copied.
    let call = || unsafe { real(config, f, params, extra) };
    go(f, stream, true, paced, call)
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
    let paced = pace(gx, gy, gz, stream, false);
    // SAFETY: the caller's arguments, passed on unchanged.
    let call = || unsafe { real(f, gx, gy, gz, bx, by, bz, shared, stream, params) };
    go(f, stream, false, paced, call)
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
    let paced = pace(gx, gy, gz, stream, true);
    // SAFETY: the caller's arguments, passed on unchanged.
    let call = || unsafe { real(f, gx, gy, gz, bx, by, bz, shared, stream, params) };
    go(f, stream, true, paced, call)
}

/// `cuLaunch`: a grid of one block, on the default stream.
pub unsafe fn launch_legacy(f: CUfunction) -> CUresult {
    let real = real_or_return!(cuLaunch);
    let stream = std::ptr::null_mut();
    let paced = pace(1, 1, 1, stream, false);
    // SAFETY: the caller's argument, passed on unchanged.
    go(f, stream, false, paced, || unsafe { real(f) })
}

/// The blocks of a `w` × `h` grid of a CUDA 2.0 launch (the driver refuses a negative one).
fn grid(w: c_int, h: c_int) -> (c_uint, c_uint) {
    (
        c_uint::try_from(w).unwrap_or(0),
        c_uint::try_from(h).unwrap_or(0),
    )
}

/// `cuLaunchGrid`: a `w` × `h` grid on the default stream.
pub unsafe fn launch_grid(f: CUfunction, w: c_int, h: c_int) -> CUresult {
    let real = real_or_return!(cuLaunchGrid);
    let stream = std::ptr::null_mut();
    let (gx, gy) = grid(w, h);
    let paced = pace(gx, gy, 1, stream, false);
    // SAFETY: the caller's arguments, passed on unchanged.
    go(f, stream, false, paced, || unsafe { real(f, w, h) })
}

/// `cuLaunchGridAsync`: a `w` × `h` grid on `stream`.
pub unsafe fn launch_grid_async(f: CUfunction, w: c_int, h: c_int, stream: CUstream) -> CUresult {
    let real = real_or_return!(cuLaunchGridAsync);
    let (gx, gy) = grid(w, h);
    let paced = pace(gx, gy, 1, stream, false);
    // SAFETY: the caller's arguments, passed on unchanged.
    go(f, stream, false, paced, || unsafe { real(f, w, h, stream) })
}

/// `cuLaunchCooperativeKernelMultiDevice`: `count` launches at `list`, one per device.
pub unsafe fn launch_cooperative_multi_device(
    list: *mut CUDA_LAUNCH_PARAMS,
    count: c_uint,
    flags: c_uint,
) -> CUresult {
    let real = real_or_return!(cuLaunchCooperativeKernelMultiDevice);
    let Some(s) = crate::slice::get() else {
        // SAFETY: the caller's arguments, passed on unchanged.
        return unsafe { real(list, count, flags) };
    };
    // The driver is given the copy of the list that is paced and charged (it only reads it).
    let copy: Vec<CUDA_LAUNCH_PARAMS> = if list.is_null() {
        Vec::new()
    } else {
        // SAFETY: the caller passes `count` entries at a non-null `list`.
        unsafe { std::slice::from_raw_parts(list, count as usize) }.to_vec()
    };
    let given = if list.is_null() {
        list
    } else {
        copy.as_ptr().cast_mut()
    };
    // SAFETY: the caller's arguments, the list as copied.
    let call = || unsafe { real(given, count, flags) };
    let entries = copy.as_slice();
    match entries {
        [] => call(),
        [one] => {
            let paced = pace(
                one.grid_dim_x,
                one.grid_dim_y,
                one.grid_dim_z,
                one.stream,
                false,
            );
            go(one.function, one.stream, false, paced, call)
        }
        many if s.paced || many.iter().any(|p| beyond_default(p.function).is_some()) => {
            crate::log::log!(
                "refused: a cooperative launch on {} devices at once \
                 (cuLaunchCooperativeKernelMultiDevice) is not paced or charged per device",
                many.len()
            );
            CUDA_ERROR_NOT_SUPPORTED
        }
        _ => call(),
    }
}
