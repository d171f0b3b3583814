//! Modules: the driver allocates a module's global variables (`__device__` data) in device
//! memory when it loads the module, through calls that are not allocation calls, so a module
//! declaring a large global would take memory past the slice. The globals the image declares
//! ([`gpuslice_cuda_abi::image::globals`]: PTX declarations and ELF cubins, in a fat binary
//! every uncompressed entry's and the compressed ones the driver would load on the current
//! device, decompressed, each name once) are charged before the driver is asked to load
//! it, and the load is refused with `CUDA_ERROR_OUT_OF_MEMORY` (the driver's answer when
//! they do not fit) where the slice has no room. The charge goes back at unload, or with the
//! context a module was loaded into. What an image does not show (code, the driver's own
//! buffers) is charged from the driver's figure at the agent's next sample.

use std::ffi::{c_char, c_int, c_uint, c_void};

use gpuslice_cuda_abi::image;

use super::{charged_in, real_or_return, uncharged};
use crate::ffi::*;
use crate::slice::{self, Kind};

/// The architecture (10 × major + minor) of the device of the current context, for which the
/// driver picks a fat binary's compressed entries (asked only for an image that has some);
/// None outside a slice (nothing is charged there) or without a current context (a library
/// loaded then is charged from the driver's figure).
fn current_arch() -> Option<u32> {
    let dev = slice::get()?.current_device().ok()?;
    let major = super::limits::attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = super::limits::attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    u32::try_from(10 * major + minor).ok()
}

/// Bytes of global variables the image at `data` declares for the current device.
///
/// # Safety
/// `data` is null or a module image as `cuModuleLoadData` takes one.
unsafe fn declared(data: *const c_void) -> u64 {
    if data.is_null() {
        return 0;
    }
    // SAFETY: a module image, per the caller.
    image::declared_bytes(unsafe { image::bytes(data.cast()) }, current_arch)
}

/// Bytes of global variables the module file at `path` declares for the current device (0
/// where it cannot be read: the driver then fails to load it too).
fn declared_in_file(path: *const c_char) -> u64 {
    if path.is_null() {
        return 0;
    }
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: a NUL-terminated path, per the API.
    let path = unsafe { std::ffi::CStr::from_ptr(path) };
    std::fs::read(std::ffi::OsStr::from_bytes(path.to_bytes()))
        .map_or(0, |data| image::declared_bytes(&data, current_arch))
}

/// Loads through `call` what declares `bytes` of globals into the current context, charged
/// under the handle written to `handle`: a module (`Kind::Module`) goes with the context it
/// is loaded into, a library (`Kind::Library`) is the process's until it is unloaded.
fn load(
    kind: Kind,
    handle: *mut *mut c_void,
    bytes: u64,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some(s) = slice::get() else {
        return call();
    };
    // Without a current context there is nothing to load into yet (a library is loaded into
    // the contexts made later): what it takes is charged from the driver's figure.
    let Ok(dev) = s.current_device() else {
        return call();
    };
    let ctx = if kind == Kind::Module {
        s.current_context()
    } else {
        0
    };
    charged_in(s, kind, dev, bytes, ctx, call, || {
        if handle.is_null() {
            return 0;
        }
        // SAFETY: read after the driver reported success, so it wrote the handle.
        unsafe { handle.read() as u64 }
    })
}

pub unsafe fn module_load_data(module: *mut CUmodule, data: *const c_void) -> CUresult {
    let f = real_or_return!(cuModuleLoadData);
    // SAFETY: the caller's image.
    let bytes = unsafe { declared(data) };
    // SAFETY: the caller's arguments, passed on unchanged.
    load(Kind::Module, module, bytes, || unsafe { f(module, data) })
}

pub unsafe fn module_load_data_ex(
    module: *mut CUmodule,
    data: *const c_void,
    count: c_uint,
    options: *mut c_int,
    values: *mut *mut c_void,
) -> CUresult {
    let f = real_or_return!(cuModuleLoadDataEx);
    // SAFETY: the caller's image.
    let bytes = unsafe { declared(data) };
    // SAFETY: the caller's arguments, passed on unchanged.
    load(Kind::Module, module, bytes, || unsafe {
        f(module, data, count, options, values)
    })
}

pub unsafe fn module_load_fat_binary(module: *mut CUmodule, data: *const c_void) -> CUresult {
    let f = real_or_return!(cuModuleLoadFatBinary);
    // SAFETY: the caller's fat binary.
    let bytes = unsafe { declared(data) };
    // SAFETY: the caller's arguments, passed on unchanged.
    load(Kind::Module, module, bytes, || unsafe { f(module, data) })
}

pub unsafe fn module_load(module: *mut CUmodule, path: *const c_char) -> CUresult {
    let f = real_or_return!(cuModuleLoad);
    let bytes = declared_in_file(path);
    // SAFETY: the caller's arguments, passed on unchanged.
    load(Kind::Module, module, bytes, || unsafe { f(module, path) })
}

pub unsafe fn module_unload(module: CUmodule) -> CUresult {
    let f = real_or_return!(cuModuleUnload);
    // SAFETY: the caller's argument, passed on unchanged.
    unload(Kind::Module, module as u64, || unsafe { f(module) })
}

/// The unload `call` of a module or library (`handle`): what it was charged is given back
/// once it went, and its functions' cached figures go with it (their handles may be reused).
fn unload(kind: Kind, handle: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    let call = || {
        let r = call();
        super::stack::forget_functions();
        r
    };
    let Some(s) = slice::get() else {
        return call();
    };
    uncharged(s, kind, handle, call)
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn library_load_data(
    library: *mut CUlibrary,
    data: *const c_void,
    jit_options: *mut c_int,
    jit_values: *mut *mut c_void,
    jit_count: c_uint,
    library_options: *mut c_int,
    library_values: *mut *mut c_void,
    library_count: c_uint,
) -> CUresult {
    let f = real_or_return!(cuLibraryLoadData);
    // SAFETY: the caller's image.
    let bytes = unsafe { declared(data) };
    // SAFETY: the caller's arguments, passed on unchanged.
    load(Kind::Library, library, bytes, || unsafe {
        f(
            library,
            data,
            jit_options,
            jit_values,
            jit_count,
            library_options,
            library_values,
            library_count,
        )
    })
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn library_load_from_file(
    library: *mut CUlibrary,
    path: *const c_char,
    jit_options: *mut c_int,
    jit_values: *mut *mut c_void,
    jit_count: c_uint,
    library_options: *mut c_int,
    library_values: *mut *mut c_void,
    library_count: c_uint,
) -> CUresult {
    let f = real_or_return!(cuLibraryLoadFromFile);
    let bytes = declared_in_file(path);
    // SAFETY: the caller's arguments, passed on unchanged.
    load(Kind::Library, library, bytes, || unsafe {
        f(
            library,
            path,
            jit_options,
            jit_values,
            jit_count,
            library_options,
            library_values,
            library_count,
        )
    })
}

pub unsafe fn library_unload(library: CUlibrary) -> CUresult {
    let f = real_or_return!(cuLibraryUnload);
    // SAFETY: the caller's argument, passed on unchanged.
    unload(Kind::Library, library as u64, || unsafe { f(library) })
}
