//! Modules and kernels as the driver describes them: how modules load, the attributes of a
//! kernel (the simulation has no code for it: no static shared memory, the local memory its
//! image declares, 32 registers a thread, built for the current device) and the occupancy
//! those give on the device.

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::{LazyLock, Mutex};

use gpuslice_cuda_abi::image;
use gpuslice_cuda_abi::params::Param;

use crate::codes::*;
use crate::paths::{CUfunction, CUmodule};
use crate::{CUdeviceptr, CUresult, current_ctx, guard, out, state};

/// A loaded module: its global variables, allocated on its context's device at load (as the
/// driver does), the local memory each thread of each of its kernels needs, their parameter
/// layouts, and the function handles given out for it.
struct Module {
    globals: HashMap<String, (CUdeviceptr, usize)>,
    locals: HashMap<String, u64>,
    params: HashMap<String, Vec<Param>>,
    functions: Mutex<HashMap<String, usize>>,
}

static MODULES: LazyLock<Mutex<HashSet<usize>>> = LazyLock::new(|| Mutex::new(HashSet::new()));

/// The per-thread local memory of every function handle given out, by handle.
static FUNCTION_LOCALS: LazyLock<Mutex<HashMap<usize, u64>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The parameter layout of every function handle given out whose image described it.
static FUNCTION_PARAMS: LazyLock<Mutex<HashMap<usize, Vec<Param>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Whether any function handle given out needs local memory (until then launches skip the
/// look-up).
static ANY_LOCAL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The local memory each thread of function `f` needs (0 for a handle not given out here).
pub(crate) fn local_bytes(f: usize) -> u64 {
    if !ANY_LOCAL.load(std::sync::atomic::Ordering::Acquire) {
        return 0;
    }
    FUNCTION_LOCALS
        .lock()
        .map_or(0, |l| l.get(&f).copied().unwrap_or(0))
}

fn module(m: CUmodule) -> Result<&'static Module, CUresult> {
    if m.is_null()
        || !MODULES
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .contains(&(m as usize))
    {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    // SAFETY: registered in MODULES: a Box leaked by cuModuleLoadData, not yet dropped.
    Ok(unsafe { &*m.cast::<Module>() })
}

/// Loads an image (fat binary, cubin or PTX). Its global variables take device memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadData(m: *mut CUmodule, image: *const c_void) -> CUresult {
    guard(|| {
        let index = current_ctx()?.node_index;
        if image.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: an image as this call takes one.
        let bytes = unsafe { image::bytes(image.cast()) };
        let d = state::get()?;
        // The entries for this device's architecture, decompressed where nvcc compressed them.
        let (major, minor) = d.spec.gpus[index].compute_capability;
        let image::Contents {
            globals: sizes,
            kernel_locals: locals,
            kernel_params: params,
        } = image::contents_with_params(bytes, || Some(10 * major + minor));
        let mut globals = HashMap::new();
        for (name, size) in sizes {
            let bytes = usize::try_from(size.max(1)).map_err(|_| CUDA_ERROR_INVALID_IMAGE)?;
            match d.allocate(index, bytes as u64, bytes) {
                Ok(p) => {
                    globals.insert(name, (p, size as usize));
                }
                Err(e) => {
                    for (p, _) in globals.values() {
                        let _ = d.free(*p);
                    }
                    return Err(e);
                }
            }
        }
        let handle = Box::into_raw(Box::new(Module {
            globals,
            locals,
            params,
            functions: Mutex::new(HashMap::new()),
        }));
        MODULES
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .insert(handle as usize);
        out(m, handle.cast())
    })
}

/// As `cuModuleLoadData`; the JIT options are not used (nothing is compiled here).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    m: *mut CUmodule,
    image: *const c_void,
    _count: std::ffi::c_uint,
    _options: *mut c_int,
    _values: *mut *mut c_void,
) -> CUresult {
    // SAFETY: same contract as cuModuleLoadData.
    unsafe { cuModuleLoadData(m, image) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadFatBinary(m: *mut CUmodule, image: *const c_void) -> CUresult {
    // SAFETY: a fat binary is an image as cuModuleLoadData takes one.
    unsafe { cuModuleLoadData(m, image) }
}

/// The contents of the module file at `path`, ending in a NUL (as PTX text must).
fn module_file(path: *const c_char) -> Result<Vec<u8>, CUresult> {
    use std::os::unix::ffi::OsStrExt;
    let path = name_arg(path)?;
    let mut data = std::fs::read(std::ffi::OsStr::from_bytes(path.as_bytes()))
        .map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
    data.push(0);
    Ok(data)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoad(m: *mut CUmodule, path: *const c_char) -> CUresult {
    match module_file(path) {
        // SAFETY: the file's contents are an image as cuModuleLoadData takes one.
        Ok(data) => unsafe { cuModuleLoadData(m, data.as_ptr().cast()) },
        Err(e) => e,
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuModuleUnload(m: CUmodule) -> CUresult {
    guard(|| {
        let md = module(m)?;
        MODULES
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .remove(&(m as usize));
        let d = state::get()?;
        for (p, _) in md.globals.values() {
            let _ = d.free(*p);
        }
        let mut locals = FUNCTION_LOCALS.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
        let mut params = FUNCTION_PARAMS.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
        for (_, f) in md.functions.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?.drain() {
            locals.remove(&f);
            params.remove(&f);
            // SAFETY: a Box<CString> made by cuModuleGetFunction, freed only here.
            drop(unsafe { Box::from_raw(f as *mut std::ffi::CString) });
        }
        // SAFETY: it was registered: a Box from cuModuleLoadData, dropped only here.
        drop(unsafe { Box::from_raw(m.cast::<Module>()) });
        Ok(())
    })
}

/// The name of the kernel of function handle `f`, one this library gave out and has not
/// unloaded.
pub(crate) fn function_name(f: CUfunction) -> Result<&'static CStr, CUresult> {
    if f.is_null()
        || !FUNCTION_LOCALS
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .contains_key(&(f as usize))
    {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    // SAFETY: a Box<CString> made by cuModuleGetFunction and not yet freed (it is known).
    Ok(unsafe { &*(f as *const std::ffi::CString) }.as_c_str())
}

/// Parameter `index` of function `f` (a handle given out here): None where `f` has fewer
/// parameters, or its image did not describe them.
pub(crate) fn function_param(f: CUfunction, index: usize) -> Result<Option<Param>, CUresult> {
    function_name(f)?;
    Ok(FUNCTION_PARAMS
        .lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .get(&(f as usize))
        .and_then(|layout| layout.get(index).copied()))
}

/// The kernels module `m` defines, by name (those its image shows: PTX entries, cubin
/// functions), in the order of their names.
pub(crate) fn kernel_names(m: CUmodule) -> Result<Vec<String>, CUresult> {
    let mut names: Vec<String> = module(m)?.locals.keys().cloned().collect();
    names.sort();
    Ok(names)
}

fn name_arg(name: *const c_char) -> Result<String, CUresult> {
    if name.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: a NUL-terminated name per the API.
    Ok(unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned())
}

/// A handle for the kernel `name` (the same handle each time); the simulation runs no code,
/// so any name is found.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunction(
    f: *mut CUfunction,
    m: CUmodule,
    name: *const c_char,
) -> CUresult {
    guard(|| {
        let md = module(m)?;
        let name = name_arg(name)?;
        let local = md.locals.get(&name).copied().unwrap_or(0);
        let layout = md.params.get(&name).cloned();
        // The handle points at the kernel's name ([`function_name`]).
        let handle = *md
            .functions
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .entry(name.clone())
            .or_insert_with(|| {
                let name = std::ffi::CString::new(name).unwrap_or_default();
                Box::into_raw(Box::new(name)) as usize
            });
        if local > 0 {
            ANY_LOCAL.store(true, std::sync::atomic::Ordering::Release);
        }
        FUNCTION_LOCALS
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .insert(handle, local);
        if let Some(layout) = layout {
            FUNCTION_PARAMS
                .lock()
                .map_err(|_| CUDA_ERROR_UNKNOWN)?
                .insert(handle, layout);
        }
        out(f, handle as CUfunction)
    })
}

/// The device address and size of a global variable the module's cubins define;
/// `CUDA_ERROR_NOT_FOUND` for any other name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetGlobal_v2(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    m: CUmodule,
    name: *const c_char,
) -> CUresult {
    guard(|| {
        let md = module(m)?;
        let (p, size) = *md
            .globals
            .get(&name_arg(name)?)
            .ok_or(CUDA_ERROR_NOT_FOUND)?;
        if !dptr.is_null() {
            out(dptr, p)?;
        }
        if !bytes.is_null() {
            out(bytes, size)?;
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetGlobal(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    library: *mut c_void,
    name: *const c_char,
) -> CUresult {
    // SAFETY: a library is a module here.
    unsafe { cuModuleGetGlobal_v2(dptr, bytes, library, name) }
}

/// `CU_MODULE_EAGER_LOADING` and `CU_MODULE_LAZY_LOADING`.
const EAGER_LOADING: c_int = 1;
const LAZY_LOADING: c_int = 2;

/// Lazy unless `CUDA_MODULE_LOADING=EAGER`, as drivers since CUDA 12.2 do.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetLoadingMode(mode: *mut c_int) -> CUresult {
    guard(|| {
        let eager =
            std::env::var("CUDA_MODULE_LOADING").is_ok_and(|v| v.eq_ignore_ascii_case("EAGER"));
        out(mode, if eager { EAGER_LOADING } else { LAZY_LOADING })
    })
}

/// Settable function attributes (`cuFuncSetAttribute`), by function handle and attribute.
static FUNCTION_SETTINGS: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<(usize, c_int), c_int>>,
> = std::sync::LazyLock::new(|| std::sync::Mutex::new(std::collections::HashMap::new()));

/// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` and `..._PREFERRED_SHARED_MEMORY_CARVEOUT`,
/// the two a program may set.
const FUNC_MAX_DYNAMIC_SHARED: c_int = 8;
const FUNC_CARVEOUT: c_int = 9;
/// `CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH`, `_HEIGHT`, `_DEPTH`: a kernel's cluster shape,
/// set before launch on GPUs with thread block clusters (compute capability 9.0 on).
pub(crate) const FUNC_CLUSTER_SHAPE: std::ops::RangeInclusive<c_int> = 11..=13;
/// `CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED`.
pub(crate) const FUNC_NON_PORTABLE_CLUSTER: c_int = 14;
/// `CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE`.
const FUNC_CLUSTER_POLICY: c_int = 15;

/// Registers per thread the simulation reports for every kernel.
const REGISTERS_PER_THREAD: c_int = 32;

/// The attributes of a kernel the simulation has no code for: it uses no static shared or
/// constant memory, the local memory its image declares and 32 registers a thread, and was
/// built for the current device's architecture.
pub(crate) fn function_attribute(
    f: crate::paths::CUfunction,
    attribute: c_int,
) -> Result<c_int, crate::CUresult> {
    use crate::codes::{CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_UNKNOWN};
    if f.is_null() {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let gpu = crate::context::current_gpu()?;
    let cc = c_int::try_from(gpu.compute_capability.0 * 10 + gpu.compute_capability.1).unwrap_or(0);
    let set = |a: c_int| -> Result<Option<c_int>, crate::CUresult> {
        Ok(FUNCTION_SETTINGS
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .get(&(f as usize, a))
            .copied())
    };
    Ok(match attribute {
        0 => 1024,  // MAX_THREADS_PER_BLOCK
        1 | 2 => 0, // SHARED_SIZE_BYTES, CONST_SIZE_BYTES
        3 => c_int::try_from(local_bytes(f as usize)).unwrap_or(c_int::MAX), // LOCAL_SIZE_BYTES
        4 => REGISTERS_PER_THREAD,
        5 | 6 => cc, // PTX_VERSION, BINARY_VERSION
        7 => 0,      // CACHE_MODE_CA
        FUNC_MAX_DYNAMIC_SHARED => set(FUNC_MAX_DYNAMIC_SHARED)?.unwrap_or(49_152),
        FUNC_CARVEOUT => set(FUNC_CARVEOUT)?.unwrap_or(-1),
        a if FUNC_CLUSTER_SHAPE.contains(&a)
            || a == FUNC_NON_PORTABLE_CLUSTER
            || a == FUNC_CLUSTER_POLICY =>
        {
            set(a)?.unwrap_or(0)
        }
        10 => 0, // CLUSTER_SIZE_MUST_BE_SET
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetAttribute(
    value: *mut c_int,
    attribute: c_int,
    f: crate::paths::CUfunction,
) -> crate::CUresult {
    guard(|| out(value, function_attribute(f, attribute)?))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncSetAttribute(
    f: crate::paths::CUfunction,
    attribute: c_int,
    value: c_int,
) -> crate::CUresult {
    use crate::codes::{CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_UNKNOWN};
    guard(|| {
        if f.is_null() {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let gpu = crate::context::current_gpu()?;
        let optin = crate::attributes::value(gpu, 97).unwrap_or(49_152);
        // Thread block clusters: compute capability 9.0 on, at most 8 blocks (16 where the
        // kernel allows a non-portable size).
        let clusters = gpu.compute_capability.0 >= 9;
        let valid = match attribute {
            FUNC_MAX_DYNAMIC_SHARED => (0..=optin).contains(&value),
            FUNC_CARVEOUT => (-1..=100).contains(&value),
            a if FUNC_CLUSTER_SHAPE.contains(&a) => clusters && (0..=16).contains(&value),
            FUNC_NON_PORTABLE_CLUSTER => clusters && (0..=1).contains(&value),
            FUNC_CLUSTER_POLICY => clusters && (0..=2).contains(&value),
            _ => false,
        };
        if !valid {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        FUNCTION_SETTINGS
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .insert((f as usize, attribute), value);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncSetCacheConfig(
    f: crate::paths::CUfunction,
    config: c_int,
) -> crate::CUresult {
    guard(|| {
        if f.is_null() {
            return Err(crate::codes::CUDA_ERROR_INVALID_HANDLE);
        }
        if !(0..=3).contains(&config) {
            return Err(crate::codes::CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    })
}

/// Blocks of `block_size` threads using `dynamic_smem` bytes that fit on one SM of the
/// current device, by threads, registers, shared memory and the block limit.
pub(crate) fn blocks_per_sm(
    f: crate::paths::CUfunction,
    block_size: c_int,
    dynamic_smem: usize,
) -> Result<c_int, crate::CUresult> {
    let gpu = crate::context::current_gpu()?;
    let attr = |a| crate::attributes::value(gpu, a).unwrap_or(0);
    if block_size <= 0 || block_size > function_attribute(f, 0)? {
        return Ok(0);
    }
    let warps = (block_size + 31) / 32;
    let by_threads = attr(39) / (warps * 32);
    let by_registers = attr(82) / (warps * 32 * REGISTERS_PER_THREAD);
    let per_block_smem = i64::try_from(dynamic_smem).unwrap_or(i64::MAX) + i64::from(attr(111));
    let by_smem = if per_block_smem > 0 {
        i64::from(attr(81)) / per_block_smem
    } else {
        i64::MAX
    };
    let by_smem = c_int::try_from(by_smem).unwrap_or(c_int::MAX);
    Ok(attr(106)
        .min(by_threads)
        .min(by_registers)
        .min(by_smem)
        .max(0))
}

/// The dynamic shared memory each of `blocks` blocks of `block_size` threads of `f` can have
/// with all of them resident on one SM: the SM's shared memory shared among them, less what
/// each block reserves and declares itself, at most what one block may opt in to; 0 where
/// that many blocks cannot be resident at all (threads, registers, blocks per SM).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyAvailableDynamicSMemPerBlock(
    smem: *mut usize,
    f: crate::paths::CUfunction,
    blocks: c_int,
    block_size: c_int,
) -> crate::CUresult {
    guard(|| {
        if blocks <= 0 || block_size <= 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let gpu = crate::context::current_gpu()?;
        let attr = |a| i64::from(crate::attributes::value(gpu, a).unwrap_or(0));
        let fit_otherwise = blocks_per_sm(f, block_size, 0)?;
        let own = i64::from(function_attribute(f, 1)?); // CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
        let available = if blocks > fit_otherwise {
            0
        } else {
            (attr(81) / i64::from(blocks) - attr(111) - own).clamp(0, (attr(97) - own).max(0))
        };
        out(smem, usize::try_from(available).unwrap_or(0))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    blocks: *mut c_int,
    f: crate::paths::CUfunction,
    block_size: c_int,
    dynamic_smem: usize,
) -> crate::CUresult {
    guard(|| out(blocks, blocks_per_sm(f, block_size, dynamic_smem)?))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    blocks: *mut c_int,
    f: crate::paths::CUfunction,
    block_size: c_int,
    dynamic_smem: usize,
    _flags: std::ffi::c_uint,
) -> crate::CUresult {
    guard(|| out(blocks, blocks_per_sm(f, block_size, dynamic_smem)?))
}

type BlockSizeToSmem = Option<unsafe extern "C" fn(c_int) -> usize>;

/// The block size (a multiple of the warp) that keeps the most threads resident, the largest
/// on a tie, and the grid that fills every SM with it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxPotentialBlockSize(
    min_grid: *mut c_int,
    block: *mut c_int,
    f: crate::paths::CUfunction,
    smem_of: BlockSizeToSmem,
    dynamic_smem: usize,
    limit: c_int,
) -> crate::CUresult {
    guard(|| {
        let sms = c_int::try_from(crate::context::current_gpu()?.sm_count).unwrap_or(1);
        let max = if limit > 0 { limit.min(1024) } else { 1024 };
        let mut best = (0, 0, 0); // (resident threads, block size, blocks per SM)
        let mut size = 32;
        while size <= max {
            // SAFETY: the caller's callback, with a block size, as the driver calls it.
            let smem = smem_of.map_or(dynamic_smem, |cb| unsafe { cb(size) });
            let n = blocks_per_sm(f, size, smem)?;
            if n * size >= best.0 {
                best = (n * size, size, n);
            }
            size += 32;
        }
        out(min_grid, best.2 * sms)?;
        out(block, best.1)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxPotentialBlockSizeWithFlags(
    min_grid: *mut c_int,
    block: *mut c_int,
    f: crate::paths::CUfunction,
    smem_of: BlockSizeToSmem,
    dynamic_smem: usize,
    limit: c_int,
    _flags: std::ffi::c_uint,
) -> crate::CUresult {
    // SAFETY: the same contract.
    unsafe { cuOccupancyMaxPotentialBlockSize(min_grid, block, f, smem_of, dynamic_smem, limit) }
}

/// A library (CUDA 12's context-independent module) is a module loaded in the current
/// context; its kernels are the module's functions, and a kernel handle is accepted wherever a
/// function is, as `cuLaunchKernel` takes a `CUkernel`.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLibraryLoadData(
    library: *mut *mut std::ffi::c_void,
    code: *const std::ffi::c_void,
    _jit_options: *mut c_int,
    _jit_values: *mut *mut std::ffi::c_void,
    _jit_count: std::ffi::c_uint,
    _library_options: *mut c_int,
    _library_values: *mut *mut std::ffi::c_void,
    _library_count: std::ffi::c_uint,
) -> crate::CUresult {
    // SAFETY: `code` is an image as cuModuleLoadData takes it.
    unsafe { cuModuleLoadData(library.cast(), code) }
}

#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLibraryLoadFromFile(
    library: *mut *mut std::ffi::c_void,
    path: *const c_char,
    _jit_options: *mut c_int,
    _jit_values: *mut *mut std::ffi::c_void,
    _jit_count: std::ffi::c_uint,
    _library_options: *mut c_int,
    _library_values: *mut *mut std::ffi::c_void,
    _library_count: std::ffi::c_uint,
) -> crate::CUresult {
    // SAFETY: same contract as cuModuleLoad.
    unsafe { cuModuleLoad(library.cast(), path) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLibraryUnload(library: *mut std::ffi::c_void) -> crate::CUresult {
    cuModuleUnload(library)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetModule(
    module: *mut crate::paths::CUmodule,
    library: *mut std::ffi::c_void,
) -> crate::CUresult {
    guard(|| {
        if library.is_null() {
            return Err(crate::codes::CUDA_ERROR_INVALID_HANDLE);
        }
        out(module, library)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetKernel(
    kernel: *mut crate::paths::CUfunction,
    library: *mut std::ffi::c_void,
    name: *const std::ffi::c_char,
) -> crate::CUresult {
    // SAFETY: the same contract as cuModuleGetFunction.
    unsafe { cuModuleGetFunction(kernel, library, name) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetFunction(
    function: *mut crate::paths::CUfunction,
    kernel: crate::paths::CUfunction,
) -> crate::CUresult {
    guard(|| {
        crate::current_ctx()?;
        if kernel.is_null() {
            return Err(crate::codes::CUDA_ERROR_INVALID_HANDLE);
        }
        out(function, kernel)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetAttribute(
    value: *mut c_int,
    attribute: c_int,
    kernel: crate::paths::CUfunction,
    _dev: crate::CUdevice,
) -> crate::CUresult {
    // SAFETY: the same contract as cuFuncGetAttribute.
    unsafe { cuFuncGetAttribute(value, attribute, kernel) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuKernelSetAttribute(
    attribute: c_int,
    value: c_int,
    kernel: crate::paths::CUfunction,
    _dev: crate::CUdevice,
) -> crate::CUresult {
    cuFuncSetAttribute(kernel, attribute, value)
}
