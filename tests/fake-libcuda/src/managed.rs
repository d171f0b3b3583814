//! Managed memory's hints, as programs that use unified memory give them: where to move it
//! ahead of use (`cuMemPrefetchAsync`, and CUDA 12.2's `_v2` that names a location), how it
//! will be used (`cuMemAdvise{,_v2}`: read mostly, a preferred location, devices that access
//! it), and what was said (`cuMemRangeGetAttribute{,s}`). Simulated device memory is host
//! memory, so nothing moves: the hints are kept, per allocation of `cuMemAllocManaged` (a
//! hint for part of an allocation holds for the whole of it here), and answered back. A range
//! that is not managed memory is refused with `CUDA_ERROR_INVALID_VALUE`, as by the driver.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{LazyLock, Mutex, MutexGuard};

use gpuslice_cuda_abi::cuda::CUmemLocation;

use crate::codes::*;
use crate::paths::CUstream;
use crate::{CUdevice, CUdeviceptr, CUresult, guard, state};

/// `CU_DEVICE_CPU` and `CU_DEVICE_INVALID`, as locations.
const CPU: c_int = -1;
const NOWHERE: c_int = -2;
/// `CU_MEM_LOCATION_TYPE_DEVICE`, `_HOST`, `_HOST_NUMA`, `_HOST_NUMA_CURRENT`.
const LOCATION_DEVICE: c_int = 1;
const LOCATION_HOST: c_int = 2;
const LOCATION_HOST_NUMA: c_int = 3;
const LOCATION_HOST_NUMA_CURRENT: c_int = 4;

/// What the program said of one managed allocation.
#[derive(Clone)]
struct Hints {
    len: u64,
    read_mostly: bool,
    preferred: c_int,
    accessed_by: Vec<c_int>,
    last_prefetch: c_int,
}

static MANAGED: LazyLock<Mutex<HashMap<u64, Hints>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

fn managed() -> Result<MutexGuard<'static, HashMap<u64, Hints>>, CUresult> {
    MANAGED.lock().map_err(|_| CUDA_ERROR_UNKNOWN)
}

/// `ptr` is a new managed allocation of `len` bytes.
pub(crate) fn allocated(ptr: CUdeviceptr, len: u64) -> Result<(), CUresult> {
    managed()?.insert(
        ptr,
        Hints {
            len,
            read_mostly: false,
            preferred: NOWHERE,
            accessed_by: Vec::new(),
            last_prefetch: NOWHERE,
        },
    );
    Ok(())
}

/// The allocation at `ptr` was freed.
pub(crate) fn freed(ptr: CUdeviceptr) {
    if let Ok(mut m) = managed() {
        m.remove(&ptr);
    }
}

/// Whether the allocation starting at `base` is managed memory.
pub(crate) fn is_managed(base: CUdeviceptr) -> bool {
    managed().is_ok_and(|m| m.contains_key(&base))
}

/// Runs `f` on the hints of the managed allocation holding all of `[ptr, ptr + count)`.
fn with_range<T>(
    ptr: CUdeviceptr,
    count: usize,
    f: impl FnOnce(&mut Hints) -> Result<T, CUresult>,
) -> Result<T, CUresult> {
    if count == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut m = managed()?;
    let (_, hints) = m
        .iter_mut()
        .find(|(base, h)| ptr >= **base && ptr.saturating_add(count as u64) <= **base + h.len)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    f(hints)
}

/// A device ordinal or `CU_DEVICE_CPU`, checked.
fn device_or_cpu(dev: CUdevice) -> Result<c_int, CUresult> {
    if dev != CPU {
        state::get()?
            .node_index(dev)
            .map_err(|_| CUDA_ERROR_INVALID_DEVICE)?;
    }
    Ok(dev)
}

/// A `CUmemLocation` as a device ordinal or `CU_DEVICE_CPU` (every host location is the CPU
/// here).
fn location(l: CUmemLocation) -> Result<c_int, CUresult> {
    match l.typ {
        LOCATION_DEVICE => device_or_cpu(l.id).and_then(|d| {
            if d == CPU {
                Err(CUDA_ERROR_INVALID_DEVICE)
            } else {
                Ok(d)
            }
        }),
        LOCATION_HOST | LOCATION_HOST_NUMA | LOCATION_HOST_NUMA_CURRENT => Ok(CPU),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// Notes that the range was last sent to `to` (nothing moves here), once `stream` is checked.
fn prefetch(ptr: CUdeviceptr, count: usize, to: c_int, stream: CUstream) -> Result<(), CUresult> {
    crate::stream::capturing_graph(stream)?;
    with_range(ptr, count, |h| {
        h.last_prefetch = to;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemPrefetchAsync(
    ptr: CUdeviceptr,
    count: usize,
    dev: CUdevice,
    stream: CUstream,
) -> CUresult {
    guard(|| prefetch(ptr, count, device_or_cpu(dev)?, stream))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemPrefetchAsync_ptsz(
    ptr: CUdeviceptr,
    count: usize,
    dev: CUdevice,
    stream: CUstream,
) -> CUresult {
    cuMemPrefetchAsync(ptr, count, dev, stream)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemPrefetchAsync_v2(
    ptr: CUdeviceptr,
    count: usize,
    to: CUmemLocation,
    flags: std::ffi::c_uint,
    stream: CUstream,
) -> CUresult {
    guard(|| {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        prefetch(ptr, count, location(to)?, stream)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemPrefetchAsync_v2_ptsz(
    ptr: CUdeviceptr,
    count: usize,
    to: CUmemLocation,
    flags: std::ffi::c_uint,
    stream: CUstream,
) -> CUresult {
    cuMemPrefetchAsync_v2(ptr, count, to, flags, stream)
}

/// `CUmem_advise`: read mostly, the preferred location, a device that accesses the range; each
/// set and unset.
fn advise(ptr: CUdeviceptr, count: usize, advice: c_int, at: c_int) -> Result<(), CUresult> {
    with_range(ptr, count, |h| {
        match advice {
            1 => h.read_mostly = true,
            2 => h.read_mostly = false,
            3 => h.preferred = at,
            4 => h.preferred = NOWHERE,
            5 if !h.accessed_by.contains(&at) => h.accessed_by.push(at),
            5 => {}
            6 => h.accessed_by.retain(|&d| d != at),
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemAdvise(
    ptr: CUdeviceptr,
    count: usize,
    advice: c_int,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        // The device does not matter to read-mostly advice.
        let at = if matches!(advice, 1 | 2) {
            NOWHERE
        } else {
            device_or_cpu(dev)?
        };
        advise(ptr, count, advice, at)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemAdvise_v2(
    ptr: CUdeviceptr,
    count: usize,
    advice: c_int,
    at: CUmemLocation,
) -> CUresult {
    guard(|| {
        let at = if matches!(advice, 1 | 2) {
            NOWHERE
        } else {
            location(at)?
        };
        advise(ptr, count, advice, at)
    })
}

/// `CUmem_range_attribute`: read mostly, preferred location, accessed by, last prefetch
/// location (each a 32-bit integer but the third, an array of them), and CUDA 12.2's location
/// types and ids.
///
/// # Safety
/// `data` holds `size` bytes.
unsafe fn range_attribute(
    data: *mut c_void,
    size: usize,
    attribute: c_int,
    h: &Hints,
) -> Result<(), CUresult> {
    if data.is_null() || size < 4 || !size.is_multiple_of(4) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ints = data.cast::<c_int>();
    let kind = |d: c_int| match d {
        NOWHERE => 0,
        CPU => LOCATION_HOST,
        _ => LOCATION_DEVICE,
    };
    let id = |d: c_int| if d < 0 { NOWHERE } else { d };
    let one = match attribute {
        1 => c_int::from(h.read_mostly),
        2 => h.preferred,
        3 => {
            for i in 0..size / 4 {
                // SAFETY: i < size / 4, within the caller's buffer.
                unsafe { *ints.add(i) = h.accessed_by.get(i).copied().unwrap_or(NOWHERE) };
            }
            return Ok(());
        }
        4 => h.last_prefetch,
        5 => kind(h.preferred),
        6 => id(h.preferred),
        7 => kind(h.last_prefetch),
        8 => id(h.last_prefetch),
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    if size != 4 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: four bytes, checked above.
    unsafe { *ints = one };
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRangeGetAttribute(
    data: *mut c_void,
    size: usize,
    attribute: c_int,
    ptr: CUdeviceptr,
    count: usize,
) -> CUresult {
    guard(|| {
        let h = with_range(ptr, count, |h| Ok(h.clone()))?;
        // SAFETY: the caller's buffer of `size` bytes.
        unsafe { range_attribute(data, size, attribute, &h) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRangeGetAttributes(
    data: *mut *mut c_void,
    sizes: *mut usize,
    attributes: *mut c_int,
    n: usize,
    ptr: CUdeviceptr,
    count: usize,
) -> CUresult {
    guard(|| {
        if n == 0 || data.is_null() || sizes.is_null() || attributes.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = with_range(ptr, count, |h| Ok(h.clone()))?;
        for i in 0..n {
            // SAFETY: `n` entries in each of the caller's arrays.
            unsafe {
                range_attribute(*data.add(i), *sizes.add(i), *attributes.add(i), &h)?;
            }
        }
        Ok(())
    })
}
