//! Page-locked host memory, as the driver gives it to copies and kernels: allocated by it
//! (`cuMemHostAlloc`, `cuMemAllocHost_v2`, freed by `cuMemFreeHost`) or registered from the
//! program's own memory (`cuMemHostRegister_v2` / `cuMemHostUnregister`). It is host memory,
//! not device memory: nothing is charged to the GPU, and NVML does not count it. Under unified
//! addressing its device address is its host address (`cuMemHostGetDevicePointer_v2`), and
//! pointer queries answer it as host memory of the context it was pinned in (what PyTorch's
//! `is_pinned` and CuPy's pinned pools ask). The simulated memory is not locked (`mlock`
//! would count against the container's locked-memory limit for nothing).

use std::collections::BTreeMap;
use std::ffi::{c_uint, c_void};
use std::sync::{LazyLock, Mutex, MutexGuard};

use gpuslice_cuda_abi::cuda::{
    CU_MEMHOSTALLOC_DEVICEMAP, CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTALLOC_WRITECOMBINED,
    CU_MEMHOSTREGISTER_DEVICEMAP, CU_MEMHOSTREGISTER_IOMEMORY, CU_MEMHOSTREGISTER_PORTABLE,
    CU_MEMHOSTREGISTER_READ_ONLY,
};

use crate::codes::*;
use crate::{CUdeviceptr, CUresult, guard, out};

/// A page-locked range, by its first address.
#[derive(Clone, Copy)]
pub(crate) struct Pinned {
    pub(crate) len: usize,
    pub(crate) flags: c_uint,
    /// The context it was pinned in (its handle).
    pub(crate) ctx: usize,
    origin: Origin,
}

/// How a page-locked range came to be, which says what gives it back.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// The program's own memory (`cuMemHostRegister_v2`; `cuMemHostUnregister`).
    Registered,
    /// Allocated here (`cuMemHostAlloc`; `cuMemFreeHost`).
    Allocated,
    /// Allocated from a pool in host memory (`cuMemFreeAsync` or `cuMemFree_v2`).
    Pool,
}

static PINNED: LazyLock<Mutex<BTreeMap<usize, Pinned>>> =
    LazyLock::new(|| Mutex::new(BTreeMap::new()));

fn pinned() -> Result<MutexGuard<'static, BTreeMap<usize, Pinned>>, CUresult> {
    PINNED.lock().map_err(|_| CUDA_ERROR_UNKNOWN)
}

/// The page-locked range holding `ptr`: its first address and itself.
pub(crate) fn range_of(ptr: u64) -> Option<(usize, Pinned)> {
    let ptr = usize::try_from(ptr).ok()?;
    let map = PINNED.lock().ok()?;
    let (&base, &p) = map.range(..=ptr).next_back()?;
    (ptr < base + p.len).then_some((base, p))
}

/// Maps `bytes` of host memory, page-locked as `origin` in the current context with `flags`;
/// its address, the device's and the host's alike.
fn allocate(bytes: usize, flags: c_uint, origin: Origin) -> Result<usize, CUresult> {
    let ctx = current()?;
    // SAFETY: a fresh anonymous private mapping; nothing else refers to it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let entry = Pinned {
        len: bytes,
        flags,
        ctx,
        origin,
    };
    pinned()?.insert(p as usize, entry);
    Ok(p as usize)
}

/// Unmaps the range [`allocate`] made at `p` as `origin`; whether there was one.
fn free(p: usize, origin: Origin) -> Result<bool, CUresult> {
    let mut map = pinned()?;
    let len = match map.get(&p) {
        Some(e) if e.origin == origin => e.len,
        _ => return Ok(false),
    };
    map.remove(&p);
    drop(map);
    // SAFETY: the mapping allocate made at `p`, `len` bytes, now forgotten.
    unsafe { libc::munmap(p as *mut c_void, len) };
    Ok(true)
}

/// Page-locked host memory of `bytes` from a pool in host memory, in the current context.
pub(crate) fn allocate_from_pool(bytes: usize) -> Result<u64, CUresult> {
    allocate(bytes, CU_MEMHOSTALLOC_DEVICEMAP, Origin::Pool).map(|p| p as u64)
}

/// Frees `ptr` if a host pool gave it out; whether it did.
pub(crate) fn free_from_pool(ptr: CUdeviceptr) -> Result<bool, CUresult> {
    usize::try_from(ptr).map_or(Ok(false), |p| free(p, Origin::Pool))
}

/// A current context is needed to pin memory, as with the driver.
fn current() -> Result<usize, CUresult> {
    crate::context::current_ctx()?;
    Ok(crate::context::current_handle() as usize)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    bytes: usize,
    flags: c_uint,
) -> CUresult {
    guard(|| {
        let known =
            CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
        if pp.is_null() || bytes == 0 || flags & !known != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(
            pp,
            allocate(bytes, flags, Origin::Allocated)? as *mut c_void,
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytes: usize) -> CUresult {
    // SAFETY: the same contract as cuMemHostAlloc.
    unsafe { cuMemHostAlloc(pp, bytes, 0) }
}

/// Frees what `cuMemHostAlloc` gave; anything else is `CUDA_ERROR_INVALID_VALUE`.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    guard(|| {
        if free(p as usize, Origin::Allocated)? {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostRegister_v2(p: *mut c_void, bytes: usize, flags: c_uint) -> CUresult {
    guard(|| {
        let known = CU_MEMHOSTREGISTER_PORTABLE
            | CU_MEMHOSTREGISTER_DEVICEMAP
            | CU_MEMHOSTREGISTER_IOMEMORY
            | CU_MEMHOSTREGISTER_READ_ONLY;
        if p.is_null() || bytes == 0 || flags & !known != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ctx = current()?;
        let start = p as usize;
        let end = start.checked_add(bytes).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let mut map = pinned()?;
        let overlaps = map
            .range(..end)
            .next_back()
            .is_some_and(|(&base, e)| base + e.len > start);
        if overlaps {
            return Err(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        }
        map.insert(
            start,
            Pinned {
                len: bytes,
                flags,
                ctx,
                origin: Origin::Registered,
            },
        );
        Ok(())
    })
}

/// Unregisters the range registered at `p` (its first address).
#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    guard(|| {
        let mut map = pinned()?;
        match map.get(&(p as usize)) {
            Some(e) if e.origin == Origin::Registered => {
                map.remove(&(p as usize));
                Ok(())
            }
            _ => Err(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED),
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    dptr: *mut CUdeviceptr,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    guard(|| {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        range_of(p as u64).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(dptr, p as CUdeviceptr)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetFlags(flags: *mut c_uint, p: *mut c_void) -> CUresult {
    guard(|| {
        let (_, e) = range_of(p as u64).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(flags, e.flags)
    })
}
