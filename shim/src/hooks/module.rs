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
//!
//! In a slice the driver is given the copy of the image the library read (a file's contents
//! too, through `cuModuleLoadData` and `cuLibraryLoadData`): another thread of the tenant
//! rewriting the caller's bytes, or replacing the file, between the reading and the load
//! would otherwise have the driver load globals the library never saw. The copy lives as
//! long as the module.

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

/// A copy of the module image at `data` (PTX keeps its terminating NUL); None for a null one.
///
/// # Safety
/// `data` is null or a module image as `cuModuleLoadData` takes one.
unsafe fn copy_of(data: *const c_void) -> Option<Vec<u8>> {
    if data.is_null() {
        return None;
    }
    // SAFETY: a module image, per the caller.
    let mut copy = unsafe { image::bytes(data.cast()) }.to_vec();
    copy.push(0);
    Some(copy)
}

/// The contents of the module file at `path`, NUL-terminated as PTX text passed by address
/// must be; None where it cannot be read (the driver then fails to load it too).
fn file_copy(path: *const c_char) -> Option<Vec<u8>> {
    if path.is_null() {
        return None;
    }
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: a NUL-terminated path, per the API.
    let path = unsafe { std::ffi::CStr::from_ptr(path) };
    let mut data = std::fs::read(std::ffi::OsStr::from_bytes(path.to_bytes())).ok()?;
    data.push(0);
    Some(data)
}

/// Bytes of global variables the image `copy` declares for the current device.
fn declared(copy: &[u8]) -> u64 {
    image::declared_bytes(copy, current_arch)
}

/// An image handed to the driver, kept while what was loaded from it stays.
struct Kept {
    /// The module's or library's handle.
    handle: u64,
    /// The context a module was loaded into (0 for a library, which outlives contexts).
    ctx: usize,
    /// Held, not read here: the driver may read it for as long as the module is loaded.
    _image: Vec<u8>,
}

static KEPT: std::sync::Mutex<Vec<Kept>> = std::sync::Mutex::new(Vec::new());

/// Keeps `copy`, loaded as `handle` into `ctx` (when the load succeeded), until that is
/// unloaded or its context goes.
fn keep(handle: *mut *mut c_void, r: CUresult, copy: Vec<u8>, ctx: usize) {
    if r == CUDA_SUCCESS
        && !handle.is_null()
        && let Ok(mut kept) = KEPT.lock()
    {
        // SAFETY: the driver wrote the handle on success.
        let handle = unsafe { handle.read() } as u64;
        kept.push(Kept {
            handle,
            ctx,
            _image: copy,
        });
    }
}

fn forget(handle: u64) {
    if let Ok(mut kept) = KEPT.lock() {
        kept.retain(|k| k.handle != handle);
    }
}

/// Context `ctx` is gone, and the modules loaded into it with it (the driver unloads them):
/// their images are no longer kept.
pub fn context_gone(ctx: usize) {
    if ctx != 0
        && let Ok(mut kept) = KEPT.lock()
    {
        kept.retain(|k| k.ctx != ctx);
    }
}

/// In a slice, a copy of the caller's image at `data` to hand the driver.
///
/// # Safety
/// As [`copy_of`].
unsafe fn sliced_copy(data: *const c_void) -> Option<Vec<u8>> {
    slice::get()?;
    // SAFETY: as the caller's.
    unsafe { copy_of(data) }
}

/// Loads `copy`, the image the library read, through `call` (given its address), charged as
/// [`load`] charges, and keeps it while what was loaded stays.
fn load_copy(
    kind: Kind,
    handle: *mut *mut c_void,
    copy: Vec<u8>,
    call: impl FnOnce(*const c_void) -> CUresult,
) -> CUresult {
    let ctx = match (kind, slice::get()) {
        (Kind::Module, Some(s)) => s.current_context(),
        _ => 0,
    };
    let r = load(kind, handle, declared(&copy), || call(copy.as_ptr().cast()));
    keep(handle, r, copy, ctx);
    r
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
    // SAFETY: the caller's arguments; the image as given or as the library read it.
    unsafe {
        match sliced_copy(data) {
            Some(copy) => load_copy(Kind::Module, module, copy, |d| f(module, d)),
            None => f(module, data),
        }
    }
}

pub unsafe fn module_load_data_ex(
    module: *mut CUmodule,
    data: *const c_void,
    count: c_uint,
    options: *mut c_int,
    values: *mut *mut c_void,
) -> CUresult {
    let f = real_or_return!(cuModuleLoadDataEx);
    // SAFETY: the caller's arguments; the image as given or as the library read it.
    unsafe {
        match sliced_copy(data) {
            Some(copy) => load_copy(Kind::Module, module, copy, |d| {
                f(module, d, count, options, values)
            }),
            None => f(module, data, count, options, values),
        }
    }
}

pub unsafe fn module_load_fat_binary(module: *mut CUmodule, data: *const c_void) -> CUresult {
    let f = real_or_return!(cuModuleLoadFatBinary);
    // SAFETY: the caller's arguments; the fat binary as given or as the library read it.
    unsafe {
        match sliced_copy(data) {
            Some(copy) => load_copy(Kind::Module, module, copy, |d| f(module, d)),
            None => f(module, data),
        }
    }
}

/// In a slice, the file's contents the library read are loaded (`cuModuleLoadData`).
pub unsafe fn module_load(module: *mut CUmodule, path: *const c_char) -> CUresult {
    let f = real_or_return!(cuModuleLoad);
    let copy = slice::get().and_then(|_| file_copy(path));
    // SAFETY: the caller's arguments; the file as the driver reads it or as the library did.
    unsafe {
        match (copy, crate::api::real::cuModuleLoadData()) {
            (Some(copy), Some(from_data)) => {
                load_copy(Kind::Module, module, copy, |d| from_data(module, d))
            }
            _ => f(module, path),
        }
    }
}

pub unsafe fn module_unload(module: CUmodule) -> CUresult {
    let f = real_or_return!(cuModuleUnload);
    // SAFETY: the caller's argument, passed on unchanged.
    let r = unload(Kind::Module, module as u64, || unsafe { f(module) });
    if r == CUDA_SUCCESS {
        forget(module as u64);
    }
    r
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
    let load_from = |data: *const c_void| {
        // SAFETY: the caller's arguments, the image as given or as the library read it.
        unsafe {
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
        }
    };
    // SAFETY: the caller's image.
    match unsafe { sliced_copy(data) } {
        Some(copy) => load_copy(Kind::Library, library.cast(), copy, load_from),
        None => load_from(data),
    }
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
    // The file's contents the library read, loaded as an image, where it could read them.
    let copy = slice::get().and_then(|_| file_copy(path));
    let from_data = crate::api::real::cuLibraryLoadData();
    let load_with = |image: Option<*const c_void>| {
        // SAFETY: the caller's arguments, with the library's copy in place of the path.
        unsafe {
            match (image, from_data) {
                (Some(d), Some(g)) => g(
                    library,
                    d,
                    jit_options,
                    jit_values,
                    jit_count,
                    library_options,
                    library_values,
                    library_count,
                ),
                _ => f(
                    library,
                    path,
                    jit_options,
                    jit_values,
                    jit_count,
                    library_options,
                    library_values,
                    library_count,
                ),
            }
        }
    };
    match copy.filter(|_| from_data.is_some()) {
        Some(copy) => load_copy(Kind::Library, library.cast(), copy, |d| load_with(Some(d))),
        None => load_with(None),
    }
}

pub unsafe fn library_unload(library: CUlibrary) -> CUresult {
    let f = real_or_return!(cuLibraryUnload);
    // SAFETY: the caller's argument, passed on unchanged.
    let r = unload(Kind::Library, library as u64, || unsafe { f(library) });
    if r == CUDA_SUCCESS {
        forget(library as u64);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept_handles() -> Vec<u64> {
        KEPT.lock().unwrap().iter().map(|k| k.handle).collect()
    }

    #[test]
    fn a_destroyed_contexts_module_images_go_with_it_and_a_librarys_stay() {
        let mut handle: *mut c_void = 0x51_0001 as *mut c_void;
        keep(&raw mut handle, CUDA_SUCCESS, vec![1; 16], 0xc0);
        handle = 0x51_0002 as *mut c_void;
        keep(&raw mut handle, CUDA_SUCCESS, vec![2; 16], 0xc1);
        handle = 0x51_0003 as *mut c_void;
        keep(&raw mut handle, CUDA_SUCCESS, vec![3; 16], 0);
        handle = 0x51_0004 as *mut c_void;
        keep(&raw mut handle, CUDA_ERROR_INVALID_IMAGE, vec![4; 16], 0xc0);
        let mine = |h: &u64| (0x51_0001..=0x51_0004).contains(h);
        let before: Vec<u64> = kept_handles().into_iter().filter(mine).collect();
        assert_eq!(before, [0x51_0001, 0x51_0002, 0x51_0003]);
        context_gone(0xc0);
        context_gone(0);
        let after: Vec<u64> = kept_handles().into_iter().filter(mine).collect();
        assert_eq!(after, [0x51_0002, 0x51_0003]);
        forget(0x51_0002);
        forget(0x51_0003);
        assert!(!kept_handles().iter().any(mine));
    }
}
