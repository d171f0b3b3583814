//! The driver's JIT linker (`cuLinkCreate_v2`, `cuLinkAddData_v2`, `cuLinkAddFile_v2`,
//! `cuLinkComplete`, `cuLinkDestroy`): what the CUDA sample `ptxjit`, cuda.core's and numba's
//! linker without nvJitLink, PyCUDA and XLA use to link PTX, cubins and fat binaries into one
//! image for `cuModuleLoadData`.
//!
//! Nothing is compiled here: the linked image is PTX that declares what the inputs hold, as
//! the simulated driver reads images ([`image::contents_with_params`] for the device's
//! architecture): every global variable with its size, and every kernel with its parameters
//! (at their offsets, each aligned to the largest power of two its offset allows) and its
//! local memory a thread. Loading it sets up what loading the inputs one by one would.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::fmt::Write as _;
use std::sync::{LazyLock, Mutex};

use gpuslice_cuda_abi::image::{self, Contents};
use gpuslice_cuda_abi::params::Param;

use crate::codes::*;
use crate::{CUresult, guard, out};

const CU_JIT_WALL_TIME: c_int = 2;
const CU_JIT_INFO_LOG_BUFFER: c_int = 3;
const CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES: c_int = 4;
const CU_JIT_ERROR_LOG_BUFFER: c_int = 5;
const CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES: c_int = 6;

const INPUT_CUBIN: c_int = 0;
const INPUT_PTX: c_int = 1;
const INPUT_FATBINARY: c_int = 2;

/// One link in progress.
struct Link {
    /// The architecture the link is for: the current device's (10 × major + minor).
    arch: u32,
    /// What the inputs added so far hold.
    contents: Contents,
    /// The linked image, once complete; it lives until the link is destroyed.
    image: Option<Vec<u8>>,
}

/// Links by handle (the address of the boxed link).
static LINKS: LazyLock<Mutex<HashMap<usize, Box<Link>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The caller's JIT options: the log buffers get an empty log (nothing to report), the
/// wall time 0 ms; the rest (registers, optimization level, target) change nothing here.
fn answer_options(count: c_uint, options: *const c_int, values: *mut *mut c_void) {
    if count == 0 || options.is_null() || values.is_null() {
        return;
    }
    // SAFETY: `count` options and as many value slots, per the API.
    let (options, values) = unsafe {
        (
            std::slice::from_raw_parts(options, count as usize),
            std::slice::from_raw_parts_mut(values, count as usize),
        )
    };
    let size_of = |want: c_int| {
        options
            .iter()
            .position(|&o| o == want)
            .map_or(0, |i| values[i] as usize)
    };
    let (info, error) = (
        size_of(CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES),
        size_of(CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES),
    );
    for (i, &option) in options.iter().enumerate() {
        match option {
            CU_JIT_INFO_LOG_BUFFER | CU_JIT_ERROR_LOG_BUFFER => {
                let size = if option == CU_JIT_INFO_LOG_BUFFER {
                    info
                } else {
                    error
                };
                if size > 0 && !values[i].is_null() {
                    // SAFETY: the caller's log buffer of at least `size` bytes.
                    unsafe { *values[i].cast::<c_char>() = 0 };
                }
            }
            CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES | CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES => {
                // The log's length, written back into the slot as the driver does.
                values[i] = std::ptr::null_mut();
            }
            CU_JIT_WALL_TIME => {
                // The driver writes a float into the slot itself.
                values[i] = std::ptr::null_mut();
            }
            _ => {}
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkCreate_v2(
    count: c_uint,
    options: *mut c_int,
    values: *mut *mut c_void,
    state: *mut *mut c_void,
) -> CUresult {
    guard(|| {
        let gpu = crate::context::current_gpu()?;
        if state.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        answer_options(count, options, values);
        let (major, minor) = gpu.compute_capability;
        let link = Box::new(Link {
            arch: 10 * major + minor,
            contents: Contents::default(),
            image: None,
        });
        let handle = std::ptr::from_ref::<Link>(&link) as usize;
        LINKS
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .insert(handle, link);
        out(state, handle as *mut c_void)
    })
}

/// Adds what an input of `kind` holds to the link: a cubin, PTX or a fat binary (its entries
/// for the link's architecture, as the driver picks them). Host objects and libraries
/// (`CU_JIT_INPUT_OBJECT`, `_LIBRARY`) and NVVM IR are not modelled.
fn add(state: *mut c_void, kind: c_int, data: &[u8]) -> Result<(), CUresult> {
    let mut links = LINKS.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
    let link = links
        .get_mut(&(state as usize))
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if link.image.is_some() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let readable = match kind {
        INPUT_CUBIN => data.starts_with(b"\x7fELF"),
        INPUT_PTX => data.windows(8).any(|w| w == b".version"),
        INPUT_FATBINARY => data.starts_with(&0xBA55_ED50_u32.to_le_bytes()),
        _ => return Err(crate::unmodelled("cuLinkAddData_v2 (this input type)")),
    };
    if !readable {
        return Err(if kind == INPUT_PTX {
            CUDA_ERROR_INVALID_PTX
        } else {
            CUDA_ERROR_INVALID_IMAGE
        });
    }
    let arch = link.arch;
    let found = image::contents_with_params(data, || Some(arch));
    let into = &mut link.contents;
    into.globals.extend(found.globals);
    for (name, bytes) in found.kernel_locals {
        let e = into.kernel_locals.entry(name).or_insert(0);
        *e = (*e).max(bytes);
    }
    for (name, params) in found.kernel_params {
        into.kernel_params.entry(name).or_insert(params);
    }
    Ok(())
}

#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLinkAddData_v2(
    state: *mut c_void,
    kind: c_int,
    data: *mut c_void,
    size: usize,
    _name: *const c_char,
    count: c_uint,
    options: *mut c_int,
    values: *mut *mut c_void,
) -> CUresult {
    guard(|| {
        if data.is_null() || size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        answer_options(count, options, values);
        // SAFETY: `size` bytes of input at `data`, per the API.
        let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), size) };
        add(state, kind, bytes)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkAddFile_v2(
    state: *mut c_void,
    kind: c_int,
    path: *const c_char,
    count: c_uint,
    options: *mut c_int,
    values: *mut *mut c_void,
) -> CUresult {
    guard(|| {
        if path.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        answer_options(count, options, values);
        // SAFETY: a NUL-terminated path, per the API.
        let path = unsafe { CStr::from_ptr(path) }
            .to_string_lossy()
            .into_owned();
        let bytes = std::fs::read(&path).map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
        add(state, kind, &bytes)
    })
}

/// The linked image: owned by the link, valid until `cuLinkDestroy`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkComplete(
    state: *mut c_void,
    image: *mut *mut c_void,
    size: *mut usize,
) -> CUresult {
    guard(|| {
        if image.is_null() || size.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut links = LINKS.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
        let link = links
            .get_mut(&(state as usize))
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let c = &link.contents;
        if c.kernel_locals.is_empty() && c.kernel_params.is_empty() && c.globals.is_empty() {
            // Nothing was added (or nothing the inputs hold): the driver has nothing to link.
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let text = link
            .image
            .get_or_insert_with(|| linked_ptx(link.arch, &link.contents));
        out(size, text.len())?;
        out(image, text.as_mut_ptr().cast())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLinkDestroy(state: *mut c_void) -> CUresult {
    guard(|| {
        LINKS
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .remove(&(state as usize))
            .map(drop)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    })
}

/// PTX declaring `contents` for `arch`, NUL-terminated as `cuModuleLoadData` takes PTX.
fn linked_ptx(arch: u32, contents: &Contents) -> Vec<u8> {
    let mut s = format!(".version 8.0\n.target sm_{arch}\n.address_size 64\n\n");
    let mut globals: Vec<_> = contents.globals.iter().collect();
    globals.sort();
    for (name, size) in globals {
        let _ = writeln!(s, ".visible .global .align 8 .b8 {name}[{}];", size.max(&1));
    }
    // Every kernel an input described: by its stack, its parameters or both.
    let mut kernels: Vec<(&String, u64)> = contents
        .kernel_locals
        .iter()
        .map(|(name, local)| (name, *local))
        .chain(
            contents
                .kernel_params
                .keys()
                .filter(|name| !contents.kernel_locals.contains_key(*name))
                .map(|name| (name, 0)),
        )
        .collect();
    kernels.sort();
    for (name, local) in kernels {
        let params = contents
            .kernel_params
            .get(name)
            .map_or(&[][..], Vec::as_slice);
        let _ = write!(s, "\n.visible .entry {name}(");
        for (i, p) in params.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            let _ = write!(
                s,
                "{sep}\n\t.param .align {} .b8 {name}_param_{i}[{}]",
                alignment(p),
                p.size
            );
        }
        s.push_str("\n)\n{\n");
        if local > 0 {
            let _ = writeln!(s, "\t.local .align 16 .b8 __local_depot0[{local}];");
        }
        s.push_str("\tret;\n}\n");
    }
    let mut bytes = s.into_bytes();
    bytes.push(0);
    bytes
}

/// The largest power of two (up to 128) that divides the parameter's offset: the alignment
/// that puts it there after the parameters before it, as compilers lay them out.
fn alignment(p: &Param) -> u64 {
    if p.offset == 0 {
        8
    } else {
        (1u64 << p.offset.trailing_zeros()).min(128)
    }
}

// The CUDA 5.5 names (without `_v2`): the same calls, as `cuda.h` maps them.
same_as! {
    cuLinkCreate => cuLinkCreate_v2(count: c_uint, options: *mut c_int, values: *mut *mut c_void, state: *mut *mut c_void);
    cuLinkAddData => cuLinkAddData_v2(state: *mut c_void, kind: c_int, data: *mut c_void, size: usize, name: *const c_char, count: c_uint, options: *mut c_int, values: *mut *mut c_void);
    cuLinkAddFile => cuLinkAddFile_v2(state: *mut c_void, kind: c_int, path: *const c_char, count: c_uint, options: *mut c_int, values: *mut *mut c_void);
}
