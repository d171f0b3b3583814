//! The allocation paths besides `cuMemAlloc` (pitched, managed, stream-ordered from the
//! default and from user pools, CUDA arrays; the virtual-memory API is in [`crate::vmm`]),
//! and the handle types the other modules share. What each path charges on the device is what
//! the interception library must count:
//!
//! | path | charged |
//! |---|---|
//! | `cuMemAllocPitch` | pitch × height, pitch = width rounded up to 512 bytes |
//! | `cuMemAllocManaged` | bytes, on the current context's device |
//! | `cuMemAllocAsync`, `cuMemAllocFromPoolAsync` | bytes, at once; freed at once (release threshold 0) |
//! | `cuArrayCreate`, `cuArray3DCreate` | width × max(height,1) × max(depth,1) × channels × element size |
//! | `cuMipmappedArrayCreate` | the sum of that over the levels, each halving every extent (at least 1) |
//! | `cuMemCreate` | size (a multiple of the 2 MiB granularity), until its last `cuMemRelease` (one per `cuMemCreate` and per `cuMemRetainAllocationHandle`) or, if it is still mapped then, its last `cuMemUnmap` (as the real driver frees it) |
#![allow(clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::{LazyLock, Mutex};

use crate::codes::*;
use crate::{CUdevice, CUdeviceptr, CUresult, current_ctx, guard, out, state};

/// Pitch alignment of pitched allocations.
pub const PITCH_ALIGNMENT: usize = 512;
/// Granularity of the virtual-memory API.
pub const VMM_GRANULARITY: usize = 2 << 20;

pub use gpuslice_cuda_abi::cuda::{
    CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_HOST, CUDA_ARRAY_DESCRIPTOR,
    CUDA_ARRAY_MEMORY_REQUIREMENTS, CUDA_ARRAY3D_DESCRIPTOR, CUarray, CUfunction, CUlaunchConfig,
    CUmemAccessDesc, CUmemGenericAllocationHandle, CUmemPropHead, CUmemoryPool, CUmipmappedArray,
    CUmodule, CUstream,
};

/// A memory pool: the device it allocates on, or host memory (whose attributes and access
/// are answered as a pool of GPU 0's would be).
pub struct Pool {
    node_index: usize,
    host: Option<HostPlace>,
}

/// Where in host memory a host pool is: `CU_MEM_LOCATION_TYPE_HOST` (id 0), or
/// `CU_MEM_LOCATION_TYPE_HOST_NUMA` and the node.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct HostPlace {
    pub typ: c_int,
    pub id: c_int,
}

impl Pool {
    /// A new pool of host memory at `place`, as a handle.
    pub(crate) fn new_host(place: HostPlace) -> usize {
        Box::into_raw(Box::new(Pool {
            node_index: 0,
            host: Some(place),
        })) as usize
    }
}

/// Where in host memory `pool` is, if it is a host pool; `pool` is a handle this library
/// gave out.
pub(crate) fn pool_host_place(pool: CUmemoryPool) -> Result<Option<HostPlace>, CUresult> {
    if pool.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: a pool from cuMemPoolCreate or a default pool, per the API's contract.
    Ok(unsafe { &*pool.cast::<Pool>() }.host)
}

/// The node GPU a pool allocates on; `pool` is a handle this library gave out (the API's
/// contract, which the driver does not check either).
pub(crate) fn pool_node_index(pool: CUmemoryPool) -> Result<usize, CUresult> {
    if pool.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: a pool from cuMemPoolCreate or a default pool, per the API's contract.
    Ok(unsafe { &*pool.cast::<Pool>() }.node_index)
}

pub(crate) fn element_size(format: c_int) -> Result<u64, CUresult> {
    Ok(match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    })
}

/// Bytes of an array of these extents.
#[must_use]
pub fn array_bytes(
    width: usize,
    height: usize,
    depth: usize,
    format: c_int,
    channels: c_uint,
) -> Option<u64> {
    let e = element_size(format).ok()?;
    if width == 0 || !matches!(channels, 1 | 2 | 4) {
        return None;
    }
    let n = (width as u64)
        .checked_mul(height.max(1) as u64)?
        .checked_mul(depth.max(1) as u64)?;
    n.checked_mul(e * u64::from(channels))
}

fn alloc_on_current(dptr: *mut CUdeviceptr, bytes: u64) -> Result<(), CUresult> {
    let d = state::get()?;
    let ctx = current_ctx()?;
    if dptr.is_null() || bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let len = usize::try_from(bytes).map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
    out(dptr, d.allocate(ctx.node_index, bytes, len)?)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size_bytes: c_uint,
) -> CUresult {
    guard(|| {
        if pitch.is_null() || width == 0 || height == 0 || !matches!(element_size_bytes, 4 | 8 | 16)
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = width.div_ceil(PITCH_ALIGNMENT) * PITCH_ALIGNMENT;
        let bytes = (p as u64)
            .checked_mul(height as u64)
            .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        alloc_on_current(dptr, bytes)?;
        out(pitch, p)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    guard(|| {
        if !matches!(flags, 1 | 2) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        alloc_on_current(dptr, bytesize as u64)?;
        // SAFETY: written just above.
        crate::managed::allocated(unsafe { *dptr }, bytesize as u64)
    })
}

static DEFAULT_POOLS: LazyLock<Mutex<HashMap<usize, usize>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(
    pool: *mut CUmemoryPool,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let index = state::get()?.node_index(dev)?;
        let mut pools = DEFAULT_POOLS.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
        let p = *pools.entry(index).or_insert_with(|| {
            Box::into_raw(Box::new(Pool {
                node_index: index,
                host: None,
            })) as usize
        });
        out(pool, p as CUmemoryPool)
    })
}

/// Each device's current pool (`cuDeviceSetMemPool`), where it is not the default one.
static CURRENT_POOLS: LazyLock<Mutex<HashMap<usize, usize>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The pool `cuMemAllocAsync` takes from on device `index`: the one set, else the default.
fn current_pool(index: usize) -> Result<usize, CUresult> {
    if let Some(p) = CURRENT_POOLS
        .lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .get(&index)
    {
        return Ok(*p);
    }
    let mut pools = DEFAULT_POOLS.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
    Ok(*pools.entry(index).or_insert_with(|| {
        Box::into_raw(Box::new(Pool {
            node_index: index,
            host: None,
        })) as usize
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    guard(|| {
        let index = state::get()?.node_index(dev)?;
        let current = CURRENT_POOLS
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .get(&index)
            .copied();
        match current {
            Some(p) => out(pool, p as CUmemoryPool),
            // SAFETY: the caller's out-parameter, passed on as it came.
            None => crate::ok(unsafe { cuDeviceGetDefaultMemPool(pool, dev) }),
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool) -> CUresult {
    guard(|| {
        let index = state::get()?.node_index(dev)?;
        if pool.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a pool handle from cuMemPoolCreate or cuDeviceGetDefaultMemPool, as the
        // API requires; the driver reads its device the same way.
        let p = unsafe { &*pool.cast::<Pool>() };
        // A pool of another device, or of host memory, is not local to this device.
        if p.node_index != index || p.host.is_some() {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        CURRENT_POOLS
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .insert(index, pool as usize);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut CUmemoryPool,
    props: *const CUmemPropHead,
) -> CUresult {
    guard(|| {
        let d = state::get()?;
        if props.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null, points at the caller's CUmemPoolProps, whose prefix we read.
        let props = unsafe { &*props };
        let l = props.location;
        let host = crate::host_pools::place_of(d, l)?;
        if host.is_some_and(|h| h.typ == CU_MEM_LOCATION_TYPE_HOST) && props.handle_types != 0 {
            // A pool of the host, no node named, cannot be shared with other processes.
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = match host {
            Some(place) => Pool::new_host(place),
            None => Box::into_raw(Box::new(Pool {
                node_index: d.node_index(l.id)?,
                host: None,
            })) as usize,
        };
        out(pool, p as CUmemoryPool)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    guard(|| {
        if pool.is_null()
            || DEFAULT_POOLS
                .lock()
                .map_err(|_| CUDA_ERROR_UNKNOWN)?
                .values()
                .any(|p| *p == pool as usize)
            || crate::host_pools::is_default(pool as usize)?
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        crate::pool_books::destroyed(pool as usize)?;
        // The current pool of a place it was goes back to that place's default.
        CURRENT_POOLS
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .retain(|_, p| *p != pool as usize);
        crate::host_pools::destroyed(pool as usize)?;
        // SAFETY: a pool from cuMemPoolCreate, destroyed once by the API's contract.
        drop(unsafe { Box::from_raw(pool.cast::<Pool>()) });
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    _stream: CUstream,
) -> CUresult {
    guard(|| {
        if pool.is_null() || dptr.is_null() || bytesize == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a pool handle this library gave out.
        let (index, host) = unsafe {
            (
                (*pool.cast::<Pool>()).node_index,
                (*pool.cast::<Pool>()).host,
            )
        };
        if host.is_some() {
            return out(dptr, crate::host::allocate_from_pool(bytesize)?);
        }
        out(
            dptr,
            crate::pool_books::allocate(pool as usize, index, bytesize as u64)?,
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    // SAFETY: same contract as cuMemAllocFromPoolAsync.
    unsafe { cuMemAllocFromPoolAsync(dptr, bytesize, pool, stream) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    guard(|| {
        // On a capturing stream the allocation becomes a memory node of the graph.
        // From the pool current to the stream's device, as the driver documents it.
        let ctx = crate::stream::ctx_of(stream)?;
        let mut held = crate::stream::hold(stream)?;
        if held.graph().is_some() {
            let ptr = crate::graph_memory::reserve(ctx.ordinal, bytesize as u64)?;
            held.record(crate::graph::Op::MemAlloc { ptr })?;
            return out(dptr, ptr);
        }
        drop(held);
        if dptr.is_null() || bytesize == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let pool = current_pool(ctx.node_index)?;
        out(
            dptr,
            crate::pool_books::allocate(pool, ctx.node_index, bytesize as u64)?,
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuMemAllocAsync(dptr, bytesize, stream) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    guard(|| {
        // On a capturing stream the free becomes a node of the graph.
        let mut held = crate::stream::hold(stream)?;
        if held.graph().is_some() {
            return held
                .record(crate::graph::Op::MemFree { ptr: dptr })
                .map(|_| ());
        }
        drop(held);
        if crate::graph_memory::release(dptr)? || crate::host::free_from_pool(dptr)? {
            return Ok(());
        }
        state::get()?.free(dptr)?;
        crate::pool_books::freed(dptr)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    cuMemFreeAsync(dptr, stream)
}

/// Allocates `bytes` (None: a descriptor the driver refuses) for an array on the current
/// context's device.
fn allocate_array(bytes: Option<u64>) -> Result<u64, CUresult> {
    let d = state::get()?;
    let ctx = current_ctx()?;
    let bytes = bytes.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let len = usize::try_from(bytes).map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
    d.allocate(ctx.node_index, bytes, len)
}

fn create_array(handle: *mut *mut c_void, desc: CUDA_ARRAY3D_DESCRIPTOR) -> Result<(), CUresult> {
    let array = allocate_array(array_bytes(
        desc.width,
        desc.height,
        desc.depth,
        desc.format,
        desc.num_channels,
    ))?;
    crate::arrays::register(array, desc);
    out(handle, array as *mut c_void)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(
    array: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR,
) -> CUresult {
    guard(|| {
        // SAFETY: checked for null; the caller's descriptor.
        let desc = unsafe { desc.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        create_array(
            array,
            CUDA_ARRAY3D_DESCRIPTOR {
                width: desc.width,
                height: desc.height,
                depth: 0,
                format: desc.format,
                num_channels: desc.num_channels,
                flags: 0,
            },
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    array: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    guard(|| {
        // SAFETY: checked for null; the caller's descriptor.
        let desc = unsafe { desc.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        create_array(array, *desc)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuArrayDestroy(array: CUarray) -> CUresult {
    guard(|| {
        state::get()?.free(array as u64)?;
        crate::arrays::forget(array as u64);
        Ok(())
    })
}

/// Alignment the simulated driver reports for arrays.
const ARRAY_ALIGNMENT: usize = 512;

fn array_requirements(
    req: *mut CUDA_ARRAY_MEMORY_REQUIREMENTS,
    array: *mut c_void,
) -> Result<(), CUresult> {
    let d = state::get()?;
    let charge = d
        .lock()
        .allocs
        .get(&(array as u64))
        .map(|a| a.charge)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    out(
        req,
        CUDA_ARRAY_MEMORY_REQUIREMENTS {
            size: usize::try_from(charge).map_err(|_| CUDA_ERROR_INVALID_VALUE)?,
            alignment: ARRAY_ALIGNMENT,
            reserved: [0; 4],
        },
    )
}

/// The device memory an array takes: here exactly what it was charged.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayGetMemoryRequirements(
    req: *mut CUDA_ARRAY_MEMORY_REQUIREMENTS,
    array: CUarray,
    _device: CUdevice,
) -> CUresult {
    guard(|| array_requirements(req, array))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayGetMemoryRequirements(
    req: *mut CUDA_ARRAY_MEMORY_REQUIREMENTS,
    array: CUmipmappedArray,
    _device: CUdevice,
) -> CUresult {
    guard(|| array_requirements(req, array))
}

/// Bytes of a mipmapped array: every level halves each extent, down to 1.
#[must_use]
pub fn mipmapped_bytes(desc: &CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) -> Option<u64> {
    let (mut w, mut h, mut d) = (desc.width, desc.height, desc.depth);
    let mut total: u64 = 0;
    for _ in 0..levels {
        total = total.checked_add(array_bytes(w, h, d, desc.format, desc.num_channels)?)?;
        w = (w / 2).max(1);
        h = if h == 0 { 0 } else { (h / 2).max(1) };
        d = if d == 0 { 0 } else { (d / 2).max(1) };
    }
    (levels > 0).then_some(total)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    array: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: c_uint,
) -> CUresult {
    guard(|| {
        // SAFETY: checked for null; the caller's descriptor.
        let desc = unsafe { desc.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(
            array,
            allocate_array(mipmapped_bytes(desc, levels))? as *mut c_void,
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMipmappedArrayDestroy(array: CUmipmappedArray) -> CUresult {
    cuArrayDestroy(array)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_sizes_follow_the_documented_rule() {
        assert_eq!(array_bytes(100, 0, 0, 0x20, 4), Some(1600));
        assert_eq!(array_bytes(100, 10, 0, 0x01, 1), Some(1000));
        assert_eq!(array_bytes(8, 8, 8, 0x10, 2), Some(2048));
        assert_eq!(array_bytes(8, 8, 8, 0x77, 2), None);
        assert_eq!(array_bytes(8, 8, 8, 0x10, 3), None);
        let d = CUDA_ARRAY3D_DESCRIPTOR {
            width: 8,
            height: 4,
            depth: 0,
            format: 0x01,
            num_channels: 1,
            flags: 0,
        };
        // 8x4 + 4x2 + 2x1 + 1x1
        assert_eq!(mipmapped_bytes(&d, 4), Some(32 + 8 + 2 + 1));
    }
}
