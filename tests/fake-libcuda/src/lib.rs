//! A simulated `libcuda.so.1`: the CUDA driver API functions gpuslice's tests use, with the
//! names, signatures and layouts of `cuda.h`. Device memory is host memory (reserved with
//! `MAP_NORESERVE`, so large slices cost nothing until touched); each process records what it
//! holds per GPU so that capacity, `cuMemGetInfo` and NVML agree across processes.
#![allow(
    unsafe_code,
    non_snake_case,
    non_camel_case_types,
    clippy::missing_safety_doc
)]

mod codes;
mod paths;
mod proc_address;
mod state;

use std::cell::Cell;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::path::PathBuf;

use codes::*;
use state::Driver;

pub type CUresult = c_uint;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
pub type CUcontext = *mut Ctx;

/// A context; `CUcontext` points at one.
pub struct Ctx {
    pub(crate) node_index: usize,
    ordinal: CUdevice,
    primary: bool,
}

#[repr(C)]
pub struct CUuuid {
    pub bytes: [c_char; 16],
}

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

pub(crate) fn guard(f: impl FnOnce() -> Result<(), CUresult>) -> CUresult {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => CUDA_ERROR_UNKNOWN,
    }
}

pub(crate) fn out<T>(p: *mut T, v: T) -> Result<(), CUresult> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: `p` is non-null and, per the CUDA API contract, points at writable storage for T.
    unsafe { p.write(v) };
    Ok(())
}

fn library_dir() -> Option<PathBuf> {
    gpuslice_simnode::library_dir_of(cuInit as *const c_void)
}

/// Copies `s` into a caller buffer of `len` bytes as a NUL-terminated string, truncating as
/// the driver does.
fn write_c_str(s: &str, buf: *mut c_char, len: c_int) -> Result<(), CUresult> {
    let len = usize::try_from(len).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    if buf.is_null() || len == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let n = s.len().min(len - 1);
    // SAFETY: `buf` holds `len` bytes per the API; we write n + 1 <= len bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), buf, n);
        *buf.add(n) = 0;
    }
    Ok(())
}

pub(crate) fn current_ctx() -> Result<&'static Ctx, CUresult> {
    let p = CURRENT.with(Cell::get);
    if p == 0 {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    // SAFETY: CURRENT only ever holds pointers from Box::leak in ctx_new, cleared on destroy.
    Ok(unsafe { &*(p as *const Ctx) })
}

fn ctx_new(d: &Driver, ordinal: CUdevice, primary: bool) -> Result<CUcontext, CUresult> {
    let node_index = d.node_index(ordinal)?;
    let bytes = d.spec.gpus[node_index].context_bytes;
    {
        let mut inner = d.lock();
        d.charge(&mut inner, node_index, bytes)?;
    }
    Ok(Box::into_raw(Box::new(Ctx {
        node_index,
        ordinal,
        primary,
    })))
}

/// # Safety
/// `ctx` must come from `ctx_new` and not have been dropped.
unsafe fn ctx_drop(d: &Driver, ctx: CUcontext) {
    // SAFETY: per the contract, `ctx` is a live Box from ctx_new.
    let c = unsafe { Box::from_raw(ctx) };
    let mut inner = d.lock();
    d.uncharge(
        &mut inner,
        c.node_index,
        d.spec.gpus[c.node_index].context_bytes,
    );
    CURRENT.with(|cur| {
        if cur.get() == ctx as usize {
            cur.set(0);
        }
    });
}

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    guard(|| {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        state::init(library_dir().as_deref()).map(|_| ())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    guard(|| {
        let v = state::get().map_or(12040, |d| d.spec.cuda_driver_version);
        out(version, v)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    guard(|| {
        out(
            count,
            c_int::try_from(state::get()?.visible.len()).unwrap_or(0),
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    guard(|| {
        state::get()?.node_index(ordinal)?;
        out(device, ordinal)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = state::get()?;
        write_c_str(&d.spec.gpus[d.node_index(dev)?].name, name, len)
    })
}

fn uuid_bytes(uuid: &str) -> [c_char; 16] {
    let hex: String = uuid
        .trim_start_matches("GPU-")
        .chars()
        .filter(char::is_ascii_hexdigit)
        .collect();
    let mut b = [0 as c_char; 16];
    for (i, slot) in b.iter_mut().enumerate() {
        *slot = hex
            .get(2 * i..2 * i + 2)
            .and_then(|h| u8::from_str_radix(h, 16).ok())
            .unwrap_or(0) as c_char;
    }
    b
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = state::get()?;
        out(
            uuid,
            CUuuid {
                bytes: uuid_bytes(&d.spec.gpus[d.node_index(dev)?].uuid),
            },
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    // SAFETY: same contract as cuDeviceGetUuid.
    unsafe { cuDeviceGetUuid(uuid, dev) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = state::get()?;
        let total = d.spec.gpus[d.node_index(dev)?].memory_bytes;
        out(bytes, usize::try_from(total).unwrap_or(usize::MAX))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    value: *mut c_int,
    attrib: c_int,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let d = state::get()?;
        let g = &d.spec.gpus[d.node_index(dev)?];
        let field = |k: usize| {
            g.pci_bus_id
                .split([':', '.'])
                .nth(k)
                .and_then(|p| i32::from_str_radix(p, 16).ok())
                .unwrap_or(0)
        };
        let cc = |v: u32| c_int::try_from(v).unwrap_or(0);
        let v = match attrib {
            ATTR_MAX_THREADS_PER_BLOCK => 1024,
            ATTR_WARP_SIZE => 32,
            ATTR_MULTIPROCESSOR_COUNT => cc(g.sm_count),
            ATTR_PCI_DOMAIN_ID => field(0),
            ATTR_PCI_BUS_ID => field(1),
            ATTR_PCI_DEVICE_ID => field(2),
            ATTR_COMPUTE_CAPABILITY_MAJOR => cc(g.compute_capability.0),
            ATTR_COMPUTE_CAPABILITY_MINOR => cc(g.compute_capability.1),
            a if (1..ATTR_MAX).contains(&a) => 0,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        out(value, v)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(
    bus: *mut c_char,
    len: c_int,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let d = state::get()?;
        let id = d.spec.gpus[d.node_index(dev)?].pci_bus_id.clone();
        write_c_str(id.get(4..).unwrap_or(&id), bus, len)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = state::get()?;
        let index = d.node_index(dev)?;
        let existing = d.lock().primary.get(&index).copied();
        let ctx = match existing {
            Some((p, n)) => {
                d.lock().primary.insert(index, (p, n + 1));
                p as CUcontext
            }
            None => {
                let c = ctx_new(d, dev, true)?;
                d.lock().primary.insert(index, (c as usize, 1));
                c
            }
        };
        out(pctx, ctx)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    guard(|| {
        let d = state::get()?;
        let index = d.node_index(dev)?;
        let entry = d.lock().primary.get(&index).copied();
        match entry {
            Some((p, 1)) => {
                d.lock().primary.remove(&index);
                // SAFETY: `p` is the live primary context created by ctx_new.
                unsafe { ctx_drop(d, p as CUcontext) };
                Ok(())
            }
            Some((p, n)) => {
                d.lock().primary.insert(index, (p, n - 1));
                Ok(())
            }
            None => Err(CUDA_ERROR_INVALID_CONTEXT),
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    cuDevicePrimaryCtxRelease_v2(dev)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut CUcontext,
    _flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let c = ctx_new(state::get()?, dev, false)?;
        CURRENT.with(|cur| cur.set(c as usize));
        out(pctx, c)
    })
}

/// CUDA 11.4's variant with execution-affinity parameters (ignored here).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    _params: *mut c_void,
    _num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: same contract as cuCtxCreate_v2.
    unsafe { cuCtxCreate_v2(pctx, flags, dev) }
}

/// CUDA 12.5's variant with `CUctxCreateParams` (ignored here).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    _params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: same contract as cuCtxCreate_v2.
    unsafe { cuCtxCreate_v2(pctx, flags, dev) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    guard(|| {
        let d = state::get()?;
        if ctx.is_null() {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        // SAFETY: the caller passes a context from cuCtxCreate; primary ones are refused.
        if unsafe { (*ctx).primary } {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        // SAFETY: `ctx` is a live non-primary context created by cuCtxCreate.
        unsafe { ctx_drop(d, ctx) };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    guard(|| {
        state::get()?;
        CURRENT.with(|cur| cur.set(ctx as usize));
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    guard(|| {
        state::get()?;
        out(pctx, CURRENT.with(Cell::get) as CUcontext)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult {
    guard(|| out(dev, current_ctx()?.ordinal))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    guard(|| {
        let ctx = current_ctx()?;
        // Every kernel of this process runs in order on the device: wait for the last.
        std::thread::sleep(state::get()?.until_idle(ctx.node_index));
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    guard(|| {
        let d = state::get()?;
        let ctx = current_ctx()?;
        if dptr.is_null() || bytesize == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(dptr, d.allocate(ctx.node_index, bytesize as u64, bytesize)?)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    guard(|| state::get()?.free(dptr))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    guard(|| {
        let d = state::get()?;
        let (f, t) = d.mem_info(current_ctx()?.node_index);
        out(free, usize::try_from(f).unwrap_or(usize::MAX))?;
        out(total, usize::try_from(t).unwrap_or(usize::MAX))
    })
}

/// Checks that `[ptr, ptr + n)` lies inside one allocation.
fn check_range(d: &Driver, ptr: CUdeviceptr, n: usize) -> Result<(), CUresult> {
    let inner = d.lock();
    let ok = inner
        .allocs
        .iter()
        .any(|(base, (_, _, len))| ptr >= *base && ptr + n as u64 <= base + *len as u64);
    if ok {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
) -> CUresult {
    guard(|| {
        check_range(state::get()?, dst, n)?;
        // SAFETY: dst range checked against our allocations; src holds n bytes per the API.
        unsafe { std::ptr::copy(src.cast::<u8>(), dst as *mut u8, n) };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    guard(|| {
        check_range(state::get()?, src, n)?;
        // SAFETY: src range checked against our allocations; dst holds n bytes per the API.
        unsafe { std::ptr::copy(src as *const u8, dst.cast::<u8>(), n) };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, value: u8, n: usize) -> CUresult {
    guard(|| {
        check_range(state::get()?, dst, n)?;
        // SAFETY: the range lies inside one of our allocations.
        unsafe { std::ptr::write_bytes(dst as *mut u8, value, n) };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, s: *mut *const c_char) -> CUresult {
    guard(|| {
        let (n, _) = codes::name(error).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(s, n.as_ptr())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, s: *mut *const c_char) -> CUresult {
    guard(|| {
        let (_, m) = codes::name(error).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(s, m.as_ptr())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    guard(|| {
        if symbol.is_null() || pfn.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller passes a NUL-terminated symbol name.
        let name = unsafe { CStr::from_ptr(symbol) }
            .to_str()
            .map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        let (found, code) = proc_address::lookup(name, cuda_version, flags);
        if !status.is_null() {
            // SAFETY: non-null status points at an int the caller owns.
            unsafe { *status = code };
        }
        // SAFETY: `pfn` is non-null and points at a pointer slot the caller owns.
        unsafe { *pfn = found.unwrap_or(std::ptr::null_mut()) };
        if found.is_some() {
            Ok(())
        } else {
            Err(CUDA_ERROR_NOT_FOUND)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    // SAFETY: same contract as cuGetProcAddress_v2, with no status out-parameter.
    unsafe { cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, std::ptr::null_mut()) }
}
