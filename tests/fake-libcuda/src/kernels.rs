//! What drivers from 545 (CUDA 12.3) and 550 (CUDA 12.4) tell about a module's kernels, and
//! their notifications, which the simulated driver (reporting 550) answers as they do: a
//! kernel's name (`cuFuncGetName`, `cuKernelGetName`), the kernels of a module or library
//! (`cuModuleGetFunctionCount`, `cuModuleEnumerateFunctions`, `cuLibraryGetKernelCount`,
//! `cuLibraryEnumerateKernels`: those its image shows, in the order of their names), whether
//! a function is loaded (always: modules load whole here) and the device's asynchronous
//! notifications (registered and never sent: the simulated GPU never runs over a budget).
//! The CUDA 12.8 runtime and cuBLAS look them up at start.

use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};

use crate::codes::*;
use crate::paths::{CUfunction, CUmodule};
use crate::{CUdevice, CUresult, guard, out, state};

/// `CU_FUNCTION_LOADING_STATE_LOADED`.
const LOADED: c_int = 1;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetName(name: *mut *const c_char, f: CUfunction) -> CUresult {
    guard(|| out(name, crate::module::function_name(f)?.as_ptr()))
}

/// A kernel is its function here (`cuLibraryGetKernel`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetName(name: *mut *const c_char, kernel: CUfunction) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuFuncGetName(name, kernel) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncIsLoaded(state: *mut c_int, f: CUfunction) -> CUresult {
    guard(|| {
        crate::module::function_name(f)?;
        out(state, LOADED)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncLoad(f: CUfunction) -> CUresult {
    guard(|| crate::module::function_name(f).map(|_| ()))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunctionCount(count: *mut c_uint, m: CUmodule) -> CUresult {
    guard(|| {
        let n = crate::module::kernel_names(m)?.len();
        out(count, c_uint::try_from(n).unwrap_or(c_uint::MAX))
    })
}

/// Up to `most` of the module's kernels, a handle each (as `cuModuleGetFunction` gives it).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleEnumerateFunctions(
    functions: *mut CUfunction,
    most: c_uint,
    m: CUmodule,
) -> CUresult {
    guard(|| {
        if functions.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let names = crate::module::kernel_names(m)?;
        for (i, name) in names.into_iter().take(most as usize).enumerate() {
            let name = std::ffi::CString::new(name).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
            let mut f: CUfunction = std::ptr::null_mut();
            // SAFETY: the module is loaded; `f` receives the handle.
            match unsafe { crate::module::cuModuleGetFunction(&raw mut f, m, name.as_ptr()) } {
                CUDA_SUCCESS => {}
                e => return Err(e),
            }
            // SAFETY: the caller's array holds `most` handles, and i < most.
            unsafe { functions.add(i).write(f) };
        }
        Ok(())
    })
}

/// A library is a module here (`cuLibraryLoadData`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetKernelCount(
    count: *mut c_uint,
    library: CUmodule,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuModuleGetFunctionCount(count, library) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryEnumerateKernels(
    kernels: *mut CUfunction,
    most: c_uint,
    library: CUmodule,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuModuleEnumerateFunctions(kernels, most, library) }
}

type AsyncCallback = Option<unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_void)>;

/// The notification callbacks registered, by handle.
static CALLBACKS: LazyLock<Mutex<HashSet<usize>>> = LazyLock::new(|| Mutex::new(HashSet::new()));
static NEXT_CALLBACK: AtomicUsize = AtomicUsize::new(1);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceRegisterAsyncNotification(
    dev: CUdevice,
    callback: AsyncCallback,
    _data: *mut c_void,
    handle: *mut *mut c_void,
) -> CUresult {
    guard(|| {
        state::get()?.node_index(dev)?;
        callback.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let h = NEXT_CALLBACK.fetch_add(1, Ordering::Relaxed);
        CALLBACKS.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?.insert(h);
        out(handle, h as *mut c_void)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceUnregisterAsyncNotification(
    dev: CUdevice,
    handle: *mut c_void,
) -> CUresult {
    guard(|| {
        state::get()?.node_index(dev)?;
        if CALLBACKS
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .remove(&(handle as usize))
        {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    })
}

/// Where parameter `index` of a kernel lies in its parameter block, as its image lays it out
/// (an ELF cubin's `.nv.info` records; PTX's parameter list). `CUDA_ERROR_INVALID_VALUE` for
/// an index past the last parameter, as the driver answers it (callers count parameters so).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetParamInfo(
    f: CUfunction,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> CUresult {
    guard(|| {
        if offset.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let param = crate::module::function_param(f, index)?.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let to_usize = |v: u64| usize::try_from(v).map_err(|_| CUDA_ERROR_INVALID_VALUE);
        out(offset, to_usize(param.offset)?)?;
        if !size.is_null() {
            out(size, to_usize(param.size)?)?;
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetParamInfo(
    kernel: CUfunction,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> CUresult {
    // SAFETY: the same contract; a kernel is its function here.
    unsafe { cuFuncGetParamInfo(kernel, index, offset, size) }
}
