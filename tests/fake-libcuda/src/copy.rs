//! Copies, fills and pointer queries on the simulated device, whose memory is host memory at
//! the addresses the allocations return (so a device pointer is also a valid host address, as
//! under unified addressing). Every device range is checked against this process's
//! allocations: a range outside them answers `CUDA_ERROR_INVALID_VALUE` instead of touching
//! memory. Asynchronous variants complete before they return (a memset or a copy on a
//! capturing stream becomes a memset or memcpy node of its graph instead: `graph_memset`,
//! `graph_memcpy`); `_ptds`/`_ptsz` variants are
//! the same calls. A memset also takes the simulated GPU's time for it (`memset_ns_per_kib`),
//! queued behind its kernels as the driver's own memset kernels are.

use std::ffi::{c_int, c_uint, c_void};

use gpuslice_cuda_abi::cuda::{CUDA_MEMCPY2D, CUDA_MEMCPY3D, CUDA_MEMSET_NODE_PARAMS};

use crate::codes::*;
use crate::paths::CUstream;
use crate::state::{self, Driver};
use crate::{CUcontext, CUdeviceptr, CUresult, current_ctx, guard, out};

/// (base, length, node index) of the allocation holding `ptr`.
fn allocation_of(d: &Driver, ptr: CUdeviceptr) -> Option<(u64, u64, usize)> {
    let inner = d.lock();
    inner
        .allocs
        .iter()
        .find(|(base, a)| ptr >= **base && ptr < **base + a.len as u64)
        .map(|(base, a)| (*base, a.len as u64, a.index))
}

/// `[ptr, ptr + n)` lies inside one allocation of this process, in accessible mappings of
/// the virtual-memory API laid end to end, or in a graph allocation a launch holds.
pub(crate) fn device_range(ptr: CUdeviceptr, n: usize) -> Result<(), CUresult> {
    let d = state::get()?;
    match allocation_of(d, ptr) {
        Some((base, len, _)) if ptr + n as u64 <= base + len => Ok(()),
        _ if n == 0
            || crate::vmm::mapped_range(ptr, n)
            || crate::graph_memory::held_range(ptr, n) =>
        {
            Ok(())
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// Fills `count` elements from `dst` and queues the GPU time for it.
fn memset<T: Copy>(dst: CUdeviceptr, value: T, count: usize) -> Result<(), CUresult> {
    fill(dst, value, count)?;
    occupy(count * size_of::<T>())
}

/// Queues the simulated GPU time of a memset of `bytes` on the current context's GPU, as a
/// launch's is (none without a current context).
fn occupy(bytes: usize) -> Result<(), CUresult> {
    if let Ok(ctx) = current_ctx() {
        let wait = state::get()?.memset(ctx.node_index, bytes as u64);
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }
    Ok(())
}

/// Copies `n` bytes; both ends were checked (or are the caller's host memory).
fn copy(dst: u64, src: u64, n: usize) {
    if n > 0 {
        // SAFETY: device ends were checked against live allocations; host ends hold n bytes
        // by the API's contract. `copy` allows overlap, as cuMemcpy on one allocation may.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) };
    }
}

fn fill<T: Copy>(dst: CUdeviceptr, value: T, count: usize) -> Result<(), CUresult> {
    let bytes = count
        .checked_mul(size_of::<T>())
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    device_range(dst, bytes)?;
    if !dst.is_multiple_of(size_of::<T>() as u64) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the range lies inside one of our allocations and is aligned for T.
    let slice = unsafe { std::slice::from_raw_parts_mut(dst as *mut T, count) };
    slice.fill(value);
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
) -> CUresult {
    guard(|| {
        device_range(dst, n)?;
        copy(dst, src as u64, n);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    guard(|| {
        device_range(src, n)?;
        copy(dst as u64, src, n);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    guard(|| {
        device_range(dst, n)?;
        device_range(src, n)?;
        copy(dst, src, n);
        Ok(())
    })
}

/// Unified addressing: either end may be host or device memory; device ends are checked.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    guard(|| {
        let d = state::get()?;
        for end in [dst, src] {
            if allocation_of(d, end).is_some() {
                device_range(end, n)?;
            }
        }
        copy(dst, src, n);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyPeer(
    dst: CUdeviceptr,
    _dst_ctx: CUcontext,
    src: CUdeviceptr,
    _src_ctx: CUcontext,
    n: usize,
) -> CUresult {
    // SAFETY: the same contract as cuMemcpyDtoD_v2.
    unsafe { cuMemcpyDtoD_v2(dst, src, n) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, value: u8, n: usize) -> CUresult {
    guard(|| memset(dst, value, n))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemsetD16_v2(dst: CUdeviceptr, value: u16, n: usize) -> CUresult {
    guard(|| memset(dst, value, n))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemsetD32_v2(dst: CUdeviceptr, value: c_uint, n: usize) -> CUresult {
    guard(|| memset(dst, value, n))
}

/// Sets a memset node's memory (`graph_memset`) and takes the time for it.
pub(crate) fn memset_2d(p: &CUDA_MEMSET_NODE_PARAMS) -> Result<(), CUresult> {
    let (dst, pitch, width, height) = (p.dst, p.pitch, p.width, p.height);
    match p.element_size {
        1 => fill_2d(dst, pitch, p.value as u8, width, height),
        2 => fill_2d(dst, pitch, p.value as u16, width, height),
        4 => fill_2d(dst, pitch, p.value, width, height),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// An asynchronous memset of `count` elements of `element_size` bytes: on a capturing
/// stream a memset node of the graph, otherwise run now (`set`).
fn memset_async(
    stream: CUstream,
    dst: CUdeviceptr,
    value: c_uint,
    element_size: c_uint,
    count: usize,
    set: impl FnOnce() -> Result<(), CUresult>,
) -> CUresult {
    guard(|| {
        let p = CUDA_MEMSET_NODE_PARAMS {
            dst,
            pitch: 0,
            value,
            element_size,
            width: count,
            height: 1,
        };
        if crate::graph_memset::captured(stream, p)? {
            return Ok(());
        }
        set()
    })
}

macro_rules! memsets_async {
    ($($name:ident => $t:ty;)*) => {
        $(
            #[unsafe(no_mangle)]
            pub extern "C" fn $name(dst: CUdeviceptr, value: $t, n: usize, stream: CUstream) -> CUresult {
                memset_async(stream, dst, c_uint::from(value), size_of::<$t>() as c_uint, n, || {
                    memset(dst, value, n)
                })
            }
        )*
    };
}

memsets_async! {
    cuMemsetD8Async => u8;
    cuMemsetD8Async_ptsz => u8;
    cuMemsetD16Async => u16;
    cuMemsetD16Async_ptsz => u16;
    cuMemsetD32Async => c_uint;
    cuMemsetD32Async_ptsz => c_uint;
}

/// One end of a 2-D or 3-D copy.
struct End {
    memory_type: c_uint,
    host: u64,
    device: CUdeviceptr,
    array: gpuslice_cuda_abi::cuda::CUarray,
    x: usize,
    y: usize,
    z: usize,
    /// Bytes per row and rows per slice of a linear end.
    pitch: usize,
    height: usize,
}

impl End {
    /// The address of row `y` of slice `z` (counted from the end's own offset), with `row`
    /// bytes from there checked where the end is the simulated device's.
    fn row(&self, y: usize, z: usize, row: usize) -> Result<u64, CUresult> {
        use gpuslice_cuda_abi::cuda::{
            CU_MEMORYTYPE_ARRAY, CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_UNIFIED,
        };
        let (y, z) = (self.y + y, self.z + z);
        if self.memory_type == CU_MEMORYTYPE_ARRAY {
            return crate::arrays::address(self.array, self.x, y, z, row);
        }
        let offset = z
            .checked_mul(self.height)
            .and_then(|r| r.checked_add(y))
            .and_then(|r| r.checked_mul(self.pitch))
            .and_then(|o| o.checked_add(self.x))
            .ok_or(CUDA_ERROR_INVALID_VALUE)? as u64;
        match self.memory_type {
            CU_MEMORYTYPE_HOST => Ok(self.host + offset),
            CU_MEMORYTYPE_DEVICE => {
                device_range(self.device + offset, row)?;
                Ok(self.device + offset)
            }
            CU_MEMORYTYPE_UNIFIED => {
                if allocation_of(state::get()?, self.device).is_some() {
                    device_range(self.device + offset, row)?;
                }
                Ok(self.device + offset)
            }
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// A linear end must fit a row in its pitch and, over several slices, the rows in its
    /// slice height.
    fn check(&self, width: usize, height: usize, depth: usize) -> Result<(), CUresult> {
        use gpuslice_cuda_abi::cuda::CU_MEMORYTYPE_ARRAY;
        if self.memory_type == CU_MEMORYTYPE_ARRAY {
            return Ok(());
        }
        if (height > 1 || depth > 1) && self.pitch < width || depth > 1 && self.height < height {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    }
}

/// Copies `c.depth` slices of `c.height` rows of `c.width_in_bytes` between its two ends.
fn copy_3d(c: &CUDA_MEMCPY3D) -> Result<(), CUresult> {
    if c.src_lod != 0 || c.dst_lod != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let src = End {
        memory_type: c.src_memory_type,
        host: c.src_host as u64,
        device: c.src_device,
        array: c.src_array,
        x: c.src_x_in_bytes,
        y: c.src_y,
        z: c.src_z,
        pitch: c.src_pitch,
        height: c.src_height,
    };
    let dst = End {
        memory_type: c.dst_memory_type,
        host: c.dst_host as u64,
        device: c.dst_device,
        array: c.dst_array,
        x: c.dst_x_in_bytes,
        y: c.dst_y,
        z: c.dst_z,
        pitch: c.dst_pitch,
        height: c.dst_height,
    };
    let (width, height, depth) = (c.width_in_bytes, c.height, c.depth);
    if width == 0 && height != 0 && depth != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    src.check(width, height, depth)?;
    dst.check(width, height, depth)?;
    for z in 0..depth {
        for y in 0..height {
            copy(dst.row(y, z, width)?, src.row(y, z, width)?, width);
        }
    }
    Ok(())
}

/// `cuMemcpy2D`: `height` rows of `width_in_bytes`, each end at its own pitch: the 3-D copy
/// of one slice.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy2D_v2(c: *const CUDA_MEMCPY2D) -> CUresult {
    guard(|| {
        if c.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's CUDA_MEMCPY2D.
        let c = unsafe { &*c };
        copy_3d(&CUDA_MEMCPY3D {
            src_x_in_bytes: c.src_x_in_bytes,
            src_y: c.src_y,
            src_z: 0,
            src_lod: 0,
            src_memory_type: c.src_memory_type,
            src_host: c.src_host,
            src_device: c.src_device,
            src_array: c.src_array,
            reserved0: std::ptr::null_mut(),
            src_pitch: c.src_pitch,
            src_height: 0,
            dst_x_in_bytes: c.dst_x_in_bytes,
            dst_y: c.dst_y,
            dst_z: 0,
            dst_lod: 0,
            dst_memory_type: c.dst_memory_type,
            dst_host: c.dst_host,
            dst_device: c.dst_device,
            dst_array: c.dst_array,
            reserved1: std::ptr::null_mut(),
            dst_pitch: c.dst_pitch,
            dst_height: 0,
            width_in_bytes: c.width_in_bytes,
            height: c.height,
            depth: 1,
        })
    })
}

/// `cuMemcpy3D`: `depth` slices of `height` rows of `width_in_bytes`; a linear end's slices
/// are `height` of its rows apart (`srcHeight`/`dstHeight`). Levels of detail are 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy3D_v2(c: *const CUDA_MEMCPY3D) -> CUresult {
    guard(|| {
        if c.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's CUDA_MEMCPY3D.
        copy_3d(unsafe { &*c })
    })
}

fn fill_2d<T: Copy>(
    dst: CUdeviceptr,
    pitch: usize,
    value: T,
    width: usize,
    height: usize,
) -> Result<(), CUresult> {
    if height > 1 && pitch < width * size_of::<T>() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for y in 0..height {
        fill(dst + (y * pitch) as u64, value, width)?;
    }
    occupy(width.saturating_mul(size_of::<T>()).saturating_mul(height))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD2D8_v2(
    dst: CUdeviceptr,
    pitch: usize,
    value: u8,
    width: usize,
    height: usize,
) -> CUresult {
    guard(|| fill_2d(dst, pitch, value, width, height))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD2D16_v2(
    dst: CUdeviceptr,
    pitch: usize,
    value: u16,
    width: usize,
    height: usize,
) -> CUresult {
    guard(|| fill_2d(dst, pitch, value, width, height))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD2D32_v2(
    dst: CUdeviceptr,
    pitch: usize,
    value: c_uint,
    width: usize,
    height: usize,
) -> CUresult {
    guard(|| fill_2d(dst, pitch, value, width, height))
}

/// `CUpointer_attribute` values answered, and `CUmemorytype`.
const POINTER_CONTEXT: c_int = 1;
const POINTER_MEMORY_TYPE: c_int = 2;
const POINTER_DEVICE_POINTER: c_int = 3;
const POINTER_HOST_POINTER: c_int = 4;
const POINTER_SYNC_MEMOPS: c_int = 6;
const POINTER_BUFFER_ID: c_int = 7;
const POINTER_IS_MANAGED: c_int = 8;
const POINTER_DEVICE_ORDINAL: c_int = 9;
const POINTER_RANGE_START_ADDR: c_int = 11;
const POINTER_RANGE_SIZE: c_int = 12;
const POINTER_MAPPED: c_int = 13;
const MEMORYTYPE_HOST: c_uint = 1;
const MEMORYTYPE_DEVICE: c_uint = 2;

/// One attribute of a device pointer, or of page-locked host memory; `CUDA_ERROR_INVALID_VALUE`
/// for memory the driver does not know (host memory neither allocated nor registered by it).
unsafe fn pointer_attribute(
    data: *mut c_void,
    attribute: c_int,
    ptr: CUdeviceptr,
) -> Result<(), CUresult> {
    let d = state::get()?;
    let Some((base, len, index)) = allocation_of(d, ptr) else {
        // SAFETY: as the caller's.
        return unsafe { pinned_attribute(data, attribute, ptr) };
    };
    let ordinal = d
        .visible
        .iter()
        .position(|&i| i == index)
        .and_then(|o| c_int::try_from(o).ok())
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    match attribute {
        POINTER_CONTEXT => out(
            data.cast::<CUcontext>(),
            std::ptr::from_ref(current_ctx()?) as CUcontext,
        ),
        POINTER_MEMORY_TYPE => out(data.cast::<c_uint>(), MEMORYTYPE_DEVICE),
        POINTER_DEVICE_POINTER | POINTER_HOST_POINTER => out(data.cast::<u64>(), ptr),
        POINTER_SYNC_MEMOPS | POINTER_MAPPED => out(data.cast::<c_int>(), 1),
        POINTER_BUFFER_ID => out(data.cast::<u64>(), base),
        POINTER_IS_MANAGED => out(
            data.cast::<c_int>(),
            c_int::from(crate::managed::is_managed(base)),
        ),
        POINTER_DEVICE_ORDINAL => out(data.cast::<c_int>(), ordinal),
        POINTER_RANGE_START_ADDR => out(data.cast::<u64>(), base),
        POINTER_RANGE_SIZE => out(data.cast::<usize>(), len as usize),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// One attribute of page-locked host memory ([`crate::host`]): host memory of the context it
/// was pinned in, mapped at the same address for the device; `CUDA_ERROR_INVALID_VALUE` for
/// memory the driver does not know.
unsafe fn pinned_attribute(
    data: *mut c_void,
    attribute: c_int,
    ptr: CUdeviceptr,
) -> Result<(), CUresult> {
    let (base, p) = crate::host::range_of(ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let ctx = p.ctx as CUcontext;
    match attribute {
        POINTER_CONTEXT => out(data.cast::<CUcontext>(), ctx),
        POINTER_MEMORY_TYPE => out(data.cast::<c_uint>(), MEMORYTYPE_HOST),
        POINTER_DEVICE_POINTER | POINTER_HOST_POINTER => out(data.cast::<u64>(), ptr),
        POINTER_MAPPED => out(data.cast::<c_int>(), 1),
        POINTER_SYNC_MEMOPS | POINTER_IS_MANAGED => out(data.cast::<c_int>(), 0),
        POINTER_BUFFER_ID | POINTER_RANGE_START_ADDR => out(data.cast::<u64>(), base as u64),
        POINTER_DEVICE_ORDINAL => out(
            data.cast::<c_int>(),
            crate::context::ordinal_of(ctx).ok_or(CUDA_ERROR_INVALID_VALUE)?,
        ),
        POINTER_RANGE_SIZE => out(data.cast::<usize>(), p.len),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: c_int,
    ptr: CUdeviceptr,
) -> CUresult {
    // SAFETY: `data` points at storage of the attribute's type, per the API.
    guard(|| unsafe { pointer_attribute(data, attribute, ptr) })
}

/// Each requested attribute; those that do not apply to `ptr` are left as the driver leaves
/// them for unregistered memory (zeroed), without failing the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttributes(
    count: c_uint,
    attributes: *const c_int,
    data: *mut *mut c_void,
    ptr: CUdeviceptr,
) -> CUresult {
    guard(|| {
        if attributes.is_null() || data.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        for i in 0..count as usize {
            // SAFETY: `count` entries in each array, per the API.
            let (attribute, slot) = unsafe { (*attributes.add(i), *data.add(i)) };
            // SAFETY: as for cuPointerGetAttribute.
            if unsafe { pointer_attribute(slot, attribute, ptr) }.is_err() && !slot.is_null() {
                // SAFETY: the smallest attribute is 4 bytes.
                unsafe { slot.cast::<c_uint>().write(0) };
            }
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut CUdeviceptr,
    size: *mut usize,
    ptr: CUdeviceptr,
) -> CUresult {
    guard(|| {
        let (b, len, _) = allocation_of(state::get()?, ptr).ok_or(CUDA_ERROR_NOT_FOUND)?;
        if !base.is_null() {
            out(base, b)?;
        }
        if !size.is_null() {
            out(size, len as usize)?;
        }
        Ok(())
    })
}

// The per-thread variants (and the other names of one call): the same work, done before
// they return.
same_as! {
    cuMemcpy2D_v2_ptds => cuMemcpy2D_v2(c: *const CUDA_MEMCPY2D);
    cuMemcpy2DUnaligned_v2 => cuMemcpy2D_v2(c: *const CUDA_MEMCPY2D);
    cuMemcpy2DUnaligned_v2_ptds => cuMemcpy2D_v2(c: *const CUDA_MEMCPY2D);
    cuMemcpy3D_v2_ptds => cuMemcpy3D_v2(c: *const CUDA_MEMCPY3D);
    cuMemcpyHtoD_v2_ptds => cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize);
    cuMemcpyDtoH_v2_ptds => cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize);
    cuMemcpyDtoD_v2_ptds => cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize);
    cuMemcpy_ptds => cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize);
    cuMemsetD8_v2_ptds => cuMemsetD8_v2(dst: CUdeviceptr, value: u8, n: usize);
    cuMemsetD16_v2_ptds => cuMemsetD16_v2(dst: CUdeviceptr, value: u16, n: usize);
    cuMemsetD32_v2_ptds => cuMemsetD32_v2(dst: CUdeviceptr, value: c_uint, n: usize);
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyPeerAsync(
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    n: usize,
    _stream: CUstream,
) -> CUresult {
    // SAFETY: the same contract as cuMemcpyPeer.
    unsafe { cuMemcpyPeer(dst, dst_ctx, src, src_ctx, n) }
}
