//! Kernel launches (`cuLaunchKernel`, `cuLaunchKernelEx`, cooperative launches and their
//! per-thread default stream variants): checked against the device's limits as the driver
//! checks them, counted, queued on their stream; no code runs on the simulated device.

#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_uint, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::codes::*;
use crate::paths::*;
use crate::{CUresult, current_ctx, guard};

/// Launches made through the fake driver (no code runs on the simulated device).
pub static LAUNCHES: AtomicU64 = AtomicU64::new(0);

#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLaunchKernel(
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_mem_bytes: c_uint,
    stream: CUstream,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    guard(|| {
        let op = crate::graph::kernel(
            f,
            [grid_x, grid_y, grid_z],
            [block_x, block_y, block_z],
            shared_mem_bytes,
        )?;
        LAUNCHES.fetch_add(1, Ordering::Relaxed);
        current_ctx()?;
        // In the stream's context, the current one for the default streams (as the driver
        // launches a library's kernel).
        let ctx = crate::stream::ctx_of(stream)?;
        // On a capturing stream the launch is recorded; otherwise it runs, waiting while the
        // queue is full, as a real launch does.
        let mut held = crate::stream::hold(stream)?;
        if held.graph().is_some() {
            return held.record(op).map(|_| ());
        }
        drop(held);
        crate::graph::run_in(op, Some(ctx))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    if config.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller passes a valid configuration (checked for null above).
    let c = unsafe { &*config };
    let clusters = guard(|| crate::clusters::check_launch(f, c));
    if clusters != CUDA_SUCCESS {
        return clusters;
    }
    // SAFETY: same contract as cuLaunchKernel.
    unsafe {
        cuLaunchKernel(
            f,
            c.grid_dim_x,
            c.grid_dim_y,
            c.grid_dim_z,
            c.block_dim_x,
            c.block_dim_y,
            c.block_dim_z,
            c.shared_mem_bytes,
            c.stream,
            params,
            extra,
        )
    }
}

#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
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
    // SAFETY: same contract as cuLaunchKernel, without `extra`.
    unsafe {
        cuLaunchKernel(
            f,
            gx,
            gy,
            gz,
            bx,
            by,
            bz,
            shared,
            stream,
            params,
            std::ptr::null_mut(),
        )
    }
}

same_as! {
    cuLaunchKernel_ptsz => cuLaunchKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void);
    cuLaunchKernelEx_ptsz => cuLaunchKernelEx(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void);
    cuLaunchCooperativeKernel_ptsz => cuLaunchCooperativeKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void);
}
