//! The virtual-memory API: physical allocations (`cuMemCreate`, charged their size, a multiple
//! of the 2 MiB granularity, until their last `cuMemRelease`, one per `cuMemCreate` and per
//! `cuMemRetainAllocationHandle`, or, if still mapped then, their last `cuMemUnmap`, as the
//! real driver frees them), reserved ranges, mappings and access.

#![allow(clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};

use crate::codes::*;
use crate::paths::*;
use crate::{CUdeviceptr, CUresult, guard, out, state};
use gpuslice_cuda_abi::cuda::CUmemAllocationProp;

/// A physical allocation of the virtual-memory API.
struct Physical {
    index: usize,
    size: usize,
    /// The properties it was made with, and its allocation flags as granted
    /// (`cuMemGetAllocationPropertiesFromHandle`).
    prop: (CUmemPropHead, [u8; 8]),
    /// The memfd backing it, closed when the memory is freed.
    fd: c_int,
    /// References to the handle: one from `cuMemCreate`, one more per
    /// `cuMemRetainAllocationHandle`, one fewer per `cuMemRelease`.
    refs: u32,
    /// How many mappings of it exist.
    maps: u32,
}

/// Physical allocations of the virtual-memory API by handle, kept after their last release
/// while still mapped: the driver frees the memory at the later of the last release and the
/// last unmap.
static HANDLES: LazyLock<Mutex<HashMap<u64, Physical>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));
/// A mapping of a physical allocation into a reserved range (`cuMemMap`).
struct Mapping {
    handle: u64,
    size: usize,
    /// `cuMemSetAccess` made it readable and writable.
    accessible: bool,
}

/// Mappings by start address.
static MAPPINGS: LazyLock<Mutex<std::collections::BTreeMap<u64, Mapping>>> =
    LazyLock::new(|| Mutex::new(std::collections::BTreeMap::new()));

/// The mappings that lay `[ptr, ptr + n)` end to end (from the one holding `ptr`), or None
/// where part of the range is not mapped.
fn covering(
    maps: &std::collections::BTreeMap<u64, Mapping>,
    ptr: CUdeviceptr,
    n: usize,
) -> Option<Vec<u64>> {
    let end = ptr.checked_add(n as u64)?;
    let (&first, m) = maps.range(..=ptr).next_back()?;
    let mut at = first.checked_add(m.size as u64)?;
    if ptr >= at {
        return None;
    }
    let mut starts = vec![first];
    while at < end {
        let m = maps.get(&at)?;
        starts.push(at);
        at = at.checked_add(m.size as u64)?;
    }
    Some(starts)
}

/// `[ptr, ptr + n)` lies in mappings laid end to end, each made accessible: a copy or a
/// memset may cross from one to the next, as a program striping a range over several
/// allocations (or GPUs) does.
pub(crate) fn mapped_range(ptr: CUdeviceptr, n: usize) -> bool {
    MAPPINGS.lock().is_ok_and(|maps| {
        covering(&maps, ptr, n).is_some_and(|starts| {
            starts
                .iter()
                .all(|s| maps.get(s).is_some_and(|m| m.accessible))
        })
    })
}
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);

/// Frees the memory of `handle` if it is released and no longer mapped.
fn free_if_done(handles: &mut HashMap<u64, Physical>, handle: u64) -> Result<(), CUresult> {
    let done = handles
        .get(&handle)
        .is_some_and(|p| p.refs == 0 && p.maps == 0);
    if done && let Some(p) = handles.remove(&handle) {
        // SAFETY: the memfd this allocation owned; no mapping or handle uses it any more.
        unsafe { libc::close(p.fd) };
        let d = state::get()?;
        let mut inner = d.lock();
        d.uncharge(&mut inner, p.index, p.size as u64);
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    _prop: *const CUmemPropHead,
    _option: c_int,
) -> CUresult {
    guard(|| out(granularity, VMM_GRANULARITY))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemPropHead,
    _flags: u64,
) -> CUresult {
    guard(|| {
        let d = state::get()?;
        let prop_ptr = prop;
        // SAFETY: checked for null; the caller's CUmemPropHead, whose prefix we read.
        let prop = unsafe { prop.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if size == 0
            || !size.is_multiple_of(VMM_GRANULARITY)
            || prop.location.typ != CU_MEM_LOCATION_TYPE_DEVICE
            || handle.is_null()
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let index = d.node_index(prop.location.id)?;
        {
            let mut inner = d.lock();
            d.charge(&mut inner, index, size as u64)?;
        }
        // SAFETY: memfd_create with a static NUL-terminated name.
        let fd = unsafe { libc::memfd_create(c"gpuslice-sim-vmm".as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: ftruncate on the descriptor just created.
        if fd < 0 || unsafe { libc::ftruncate(fd, i64::try_from(size).unwrap_or(i64::MAX)) } != 0 {
            let mut inner = d.lock();
            d.uncharge(&mut inner, index, size as u64);
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        // SAFETY: the caller's whole CUmemAllocationProp, of which the head was read above.
        let whole = unsafe { prop_ptr.cast::<CUmemAllocationProp>().read_unaligned() };
        let mut flags = whole.alloc_flags;
        // Generic compression where the device has it and it was asked for, else none.
        let compressible = crate::attributes::value(&d.spec.gpus[index], GENERIC_COMPRESSION)
            .is_some_and(|v| v == 1);
        if flags[0] != COMPRESSION_GENERIC || !compressible {
            flags[0] = 0;
        }
        let h = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
        HANDLES.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?.insert(
            h,
            Physical {
                index,
                size,
                prop: (*prop, flags),
                fd,
                refs: 1,
                maps: 0,
            },
        );
        out(handle, h)
    })
}

/// `CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED`, and the generic compression type.
const GENERIC_COMPRESSION: c_int = 107;
const COMPRESSION_GENERIC: u8 = 1;

/// The properties an allocation was made with, as the driver granted them (compression only
/// where the device has it: the CUDA sample `cudaCompressibleMemory` checks so).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationPropertiesFromHandle(
    prop: *mut CUmemAllocationProp,
    handle: CUmemGenericAllocationHandle,
) -> CUresult {
    guard(|| {
        let granted = HANDLES
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .get(&handle)
            .filter(|p| p.refs > 0)
            .map(|p| p.prop)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(
            prop,
            CUmemAllocationProp {
                head: granted.0,
                win32_handle_meta_data: std::ptr::null_mut(),
                alloc_flags: granted.1,
            },
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    guard(|| {
        let mut handles = HANDLES.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
        let p = handles
            .get_mut(&handle)
            .filter(|p| p.refs > 0)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        p.refs -= 1;
        free_if_done(&mut handles, handle)
    })
}

/// The handle of the allocation mapped at `addr`, one more reference to it (the driver's
/// answer: the same handle, to be released once more).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut c_void,
) -> CUresult {
    guard(|| {
        let addr = addr as u64;
        let h = MAPPINGS
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .range(..=addr)
            .next_back()
            .filter(|(start, m)| addr < start.saturating_add(m.size as u64))
            .map(|(_, m)| m.handle)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let mut handles = HANDLES.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
        let p = handles.get_mut(&h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        p.refs += 1;
        out(handle, h)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    _alignment: usize,
    _addr: CUdeviceptr,
    _flags: u64,
) -> CUresult {
    guard(|| {
        state::get()?;
        if size == 0 || !size.is_multiple_of(VMM_GRANULARITY) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a fresh inaccessible anonymous mapping that reserves address space only.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        out(ptr, p as u64)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    guard(|| {
        // SAFETY: the caller gives back a range it reserved with cuMemAddressReserve.
        if unsafe { libc::munmap(ptr as *mut c_void, size) } != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    _flags: u64,
) -> CUresult {
    guard(|| {
        let mut handles = HANDLES.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
        let physical = handles
            .get_mut(&handle)
            .filter(|p| p.refs > 0)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let (hsize, fd) = (physical.size, physical.fd);
        if offset.checked_add(size).is_none_or(|end| end > hsize) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: MAP_FIXED over a range the caller reserved with cuMemAddressReserve.
        let p = unsafe {
            libc::mmap(
                ptr as *mut c_void,
                size,
                libc::PROT_NONE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd,
                i64::try_from(offset).unwrap_or(0),
            )
        };
        if p == libc::MAP_FAILED {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        physical.maps += 1;
        MAPPINGS.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?.insert(
            ptr,
            Mapping {
                handle,
                size,
                accessible: false,
            },
        );
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    guard(|| {
        if desc.is_null() || count == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut maps = MAPPINGS.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
        let starts = covering(&maps, ptr, size).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the range is mapped (cuMemMap), every byte of it, as just checked.
        if unsafe { libc::mprotect(ptr as *mut c_void, size, libc::PROT_READ | libc::PROT_WRITE) }
            != 0
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        for s in starts {
            if let Some(m) = maps.get_mut(&s) {
                m.accessible = true;
            }
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    guard(|| {
        // SAFETY: replaces the caller's mapped range by a reservation again.
        let p = unsafe {
            libc::mmap(
                ptr as *mut c_void,
                size,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let end = ptr.saturating_add(size as u64);
        let gone: Vec<(u64, u64)> = {
            let mut maps = MAPPINGS.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
            let starts: Vec<u64> = maps.range(ptr..end).map(|(k, _)| *k).collect();
            starts
                .into_iter()
                .filter_map(|k| maps.remove(&k).map(|m| (k, m.handle)))
                .collect()
        };
        let mut handles = HANDLES.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
        for (_, h) in gone {
            if let Some(p) = handles.get_mut(&h) {
                p.maps = p.maps.saturating_sub(1);
            }
            free_if_done(&mut handles, h)?;
        }
        Ok(())
    })
}
