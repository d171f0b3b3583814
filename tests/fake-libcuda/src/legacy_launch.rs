//! The launch calls of the CUDA 2.0 driver API, deprecated since CUDA 3.2 and still exported:
//! a kernel's block shape and shared memory are set on the function (`cuFuncSetBlockShape`,
//! `cuFuncSetSharedSize`), its parameters one by one (`cuParamSetSize`, `cuParamSeti`,
//! `cuParamSetv`, accepted and not kept: the simulated kernels read none; `cuParamSetf`, whose
//! float argument the prototype check cannot compare, stays unmodelled), and `cuLaunch` (a 1 × 1 grid), `cuLaunchGrid` (on the
//! default stream) or `cuLaunchGridAsync` launch it as `cuLaunchKernel` would. Also
//! `cuLaunchCooperativeKernelMultiDevice` (deprecated since CUDA 11.3): each entry of the list
//! launched as `cuLaunchCooperativeKernel` would, in the calling thread's context. A function
//! whose block shape was never set launches blocks of one thread (the real driver's answer
//! then is not modelled).

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::{LazyLock, Mutex, PoisonError};

use gpuslice_cuda_abi::cuda::{CUDA_LAUNCH_PARAMS, CUfunction, CUstream};

use crate::CUresult;
use crate::codes::*;

/// Per function (as an address): its block shape and dynamic shared memory.
#[derive(Clone, Copy)]
struct Shape {
    block: [c_uint; 3],
    shared: c_uint,
}

/// A function's shape before `cuFuncSetBlockShape`.
const UNSET: Shape = Shape {
    block: [1, 1, 1],
    shared: 0,
};

static SHAPES: LazyLock<Mutex<HashMap<usize, Shape>>> = LazyLock::new(Mutex::default);

fn shape_of(f: CUfunction) -> Shape {
    SHAPES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&(f as usize))
        .copied()
        .unwrap_or(UNSET)
}

fn set(f: CUfunction, change: impl FnOnce(&mut Shape)) -> CUresult {
    if f.is_null() {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    let mut shapes = SHAPES.lock().unwrap_or_else(PoisonError::into_inner);
    let shape = shapes.entry(f as usize).or_insert(UNSET);
    change(shape);
    CUDA_SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncSetBlockShape(f: CUfunction, x: c_int, y: c_int, z: c_int) -> CUresult {
    let (Ok(x), Ok(y), Ok(z)) = (
        c_uint::try_from(x),
        c_uint::try_from(y),
        c_uint::try_from(z),
    ) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    set(f, |s| s.block = [x, y, z])
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncSetSharedSize(f: CUfunction, bytes: c_uint) -> CUresult {
    set(f, |s| s.shared = bytes)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuParamSetSize(f: CUfunction, _bytes: c_uint) -> CUresult {
    set(f, |_| {})
}

#[unsafe(no_mangle)]
pub extern "C" fn cuParamSeti(f: CUfunction, _offset: c_int, _value: c_uint) -> CUresult {
    set(f, |_| {})
}

#[unsafe(no_mangle)]
pub extern "C" fn cuParamSetv(
    f: CUfunction,
    _offset: c_int,
    _value: *mut c_void,
    _bytes: c_uint,
) -> CUresult {
    set(f, |_| {})
}

/// Launches `f` with its set shape on a grid of `w` × `h` blocks on `stream`.
fn launch(f: CUfunction, w: c_uint, h: c_uint, stream: CUstream) -> CUresult {
    let s = shape_of(f);
    let [bx, by, bz] = s.block;
    // SAFETY: no parameters are passed (the simulated kernels read none).
    unsafe {
        crate::launch::cuLaunchKernel(
            f,
            w,
            h,
            1,
            bx,
            by,
            bz,
            s.shared,
            stream,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLaunch(f: CUfunction) -> CUresult {
    launch(f, 1, 1, std::ptr::null_mut())
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLaunchGrid(f: CUfunction, w: c_int, h: c_int) -> CUresult {
    let (Ok(w), Ok(h)) = (c_uint::try_from(w), c_uint::try_from(h)) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    launch(f, w, h, std::ptr::null_mut())
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLaunchGridAsync(
    f: CUfunction,
    w: c_int,
    h: c_int,
    stream: CUstream,
) -> CUresult {
    let (Ok(w), Ok(h)) = (c_uint::try_from(w), c_uint::try_from(h)) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    launch(f, w, h, stream)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernelMultiDevice(
    list: *mut CUDA_LAUNCH_PARAMS,
    count: c_uint,
    _flags: c_uint,
) -> CUresult {
    if list.is_null() || count == 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller passes `count` entries at `list`.
    let entries = unsafe { std::slice::from_raw_parts(list, count as usize) };
    for p in entries {
        // SAFETY: the entry's own fields, as cuLaunchCooperativeKernel takes them.
        let r = unsafe {
            crate::launch::cuLaunchCooperativeKernel(
                p.function,
                p.grid_dim_x,
                p.grid_dim_y,
                p.grid_dim_z,
                p.block_dim_x,
                p.block_dim_y,
                p.block_dim_z,
                p.shared_mem_bytes,
                p.stream,
                p.kernel_params,
            )
        };
        if r != CUDA_SUCCESS {
            return r;
        }
    }
    CUDA_SUCCESS
}
