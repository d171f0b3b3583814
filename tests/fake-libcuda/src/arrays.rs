//! CUDA arrays as the simulated driver lays them out: an array is an allocation of its element
//! bytes, row after row (a row is width × element size, unpadded), slice after slice; its
//! handle is the allocation's address. Copies to and from arrays address that layout: the
//! 1-D calls (`cuMemcpy{HtoA,AtoH,DtoA,AtoD,AtoA}`) by a byte offset, 2-D and 3-D copies by
//! (x in bytes, row, slice) within the array's own extents.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{LazyLock, Mutex, MutexGuard};

use gpuslice_cuda_abi::cuda::{CUDA_ARRAY_DESCRIPTOR, CUDA_ARRAY3D_DESCRIPTOR};

use crate::codes::*;
use crate::paths::CUstream;
use crate::{CUdeviceptr, CUresult, guard, out};

static ARRAYS: LazyLock<Mutex<HashMap<u64, CUDA_ARRAY3D_DESCRIPTOR>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn arrays() -> MutexGuard<'static, HashMap<u64, CUDA_ARRAY3D_DESCRIPTOR>> {
    ARRAYS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(crate) fn register(handle: u64, desc: CUDA_ARRAY3D_DESCRIPTOR) {
    arrays().insert(handle, desc);
}

pub(crate) use gpuslice_cuda_abi::cuda::CUarray;

/// The flags array `array` was made with (`CUDA_ARRAY3D_*`).
pub(crate) fn flags(array: CUarray) -> Result<u32, CUresult> {
    arrays()
        .get(&(array as u64))
        .map(|d| d.flags)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

pub(crate) fn forget(handle: u64) {
    arrays().remove(&handle);
}

/// An array's extents: bytes per row, rows per slice, slices.
#[derive(Clone, Copy)]
pub(crate) struct Layout {
    pub row: usize,
    pub rows: usize,
    pub slices: usize,
}

impl Layout {
    fn bytes(self) -> usize {
        self.row * self.rows * self.slices
    }
}

pub(crate) fn layout(array: CUarray) -> Result<Layout, CUresult> {
    let d = arrays()
        .get(&(array as u64))
        .copied()
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let element = crate::paths::element_size(d.format)? * u64::from(d.num_channels);
    Ok(Layout {
        row: d.width * usize::try_from(element).map_err(|_| CUDA_ERROR_INVALID_VALUE)?,
        rows: d.height.max(1),
        slices: d.depth.max(1),
    })
}

/// The address of byte `x` of row `y` of slice `z` of `array`, with `n` bytes from there
/// inside that row.
pub(crate) fn address(
    array: CUarray,
    x: usize,
    y: usize,
    z: usize,
    n: usize,
) -> Result<u64, CUresult> {
    let l = layout(array)?;
    if x.checked_add(n).is_none_or(|end| end > l.row) || y >= l.rows || z >= l.slices {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(array as u64 + ((z * l.rows + y) * l.row + x) as u64)
}

/// The address of `offset` into `array` with `n` bytes from there inside it (1-D copies).
fn linear(array: CUarray, offset: usize, n: usize) -> Result<u64, CUresult> {
    let l = layout(array)?;
    if offset.checked_add(n).is_none_or(|end| end > l.bytes()) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(array as u64 + offset as u64)
}

fn copy(dst: u64, src: u64, n: usize) {
    if n > 0 {
        // SAFETY: array and device ends were checked against their extents; host ends hold
        // n bytes by the API's contract; `copy` allows overlap (an array copied onto itself).
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) };
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoA_v2(
    dst: CUarray,
    offset: usize,
    src: *const c_void,
    n: usize,
) -> CUresult {
    guard(|| {
        copy(linear(dst, offset, n)?, src as u64, n);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyAtoH_v2(
    dst: *mut c_void,
    src: CUarray,
    offset: usize,
    n: usize,
) -> CUresult {
    guard(|| {
        copy(dst as u64, linear(src, offset, n)?, n);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoA_v2(
    dst: CUarray,
    offset: usize,
    src: CUdeviceptr,
    n: usize,
) -> CUresult {
    guard(|| {
        crate::copy::device_range(src, n)?;
        copy(linear(dst, offset, n)?, src, n);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyAtoD_v2(
    dst: CUdeviceptr,
    src: CUarray,
    offset: usize,
    n: usize,
) -> CUresult {
    guard(|| {
        crate::copy::device_range(dst, n)?;
        copy(dst, linear(src, offset, n)?, n);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyAtoA_v2(
    dst: CUarray,
    dst_offset: usize,
    src: CUarray,
    src_offset: usize,
    n: usize,
) -> CUresult {
    guard(|| {
        copy(linear(dst, dst_offset, n)?, linear(src, src_offset, n)?, n);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoAAsync_v2(
    dst: CUarray,
    offset: usize,
    src: *const c_void,
    n: usize,
    _stream: CUstream,
) -> CUresult {
    // SAFETY: the same contract as the synchronous call.
    unsafe { cuMemcpyHtoA_v2(dst, offset, src, n) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyAtoHAsync_v2(
    dst: *mut c_void,
    src: CUarray,
    offset: usize,
    n: usize,
    _stream: CUstream,
) -> CUresult {
    // SAFETY: the same contract as the synchronous call.
    unsafe { cuMemcpyAtoH_v2(dst, src, offset, n) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoAAsync_v2_ptsz(
    dst: CUarray,
    offset: usize,
    src: *const c_void,
    n: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuMemcpyHtoAAsync_v2(dst, offset, src, n, stream) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyAtoHAsync_v2_ptsz(
    dst: *mut c_void,
    src: CUarray,
    offset: usize,
    n: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuMemcpyAtoHAsync_v2(dst, src, offset, n, stream) }
}

fn descriptor(array: CUarray) -> Result<CUDA_ARRAY3D_DESCRIPTOR, CUresult> {
    arrays()
        .get(&(array as u64))
        .copied()
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DGetDescriptor_v2(
    desc: *mut CUDA_ARRAY3D_DESCRIPTOR,
    array: CUarray,
) -> CUresult {
    guard(|| out(desc, descriptor(array)?))
}

/// A 2-D (or 1-D) array's descriptor; a layered or 3-D array has none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayGetDescriptor_v2(
    desc: *mut CUDA_ARRAY_DESCRIPTOR,
    array: CUarray,
) -> CUresult {
    guard(|| {
        let d = descriptor(array)?;
        if d.depth != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(
            desc,
            CUDA_ARRAY_DESCRIPTOR {
                width: d.width,
                height: d.height,
                format: d.format,
                num_channels: d.num_channels,
            },
        )
    })
}
