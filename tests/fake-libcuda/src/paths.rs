//! The allocation paths besides `cuMemAlloc` (pitched, managed, stream-ordered from the
//! default and from user pools, CUDA arrays, the virtual-memory API), and the streams, modules
//! and launches a CUDA program touches. What each path charges on the device is what the
//! interception library must count:
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};

use crate::codes::*;
use crate::{CUdevice, CUdeviceptr, CUresult, current_ctx, guard, out, state};
use gpuslice_cuda_abi::cuda::CUmemAllocationProp;

/// Pitch alignment of pitched allocations.
pub const PITCH_ALIGNMENT: usize = 512;
/// Granularity of the virtual-memory API.
pub const VMM_GRANULARITY: usize = 2 << 20;

pub use gpuslice_cuda_abi::cuda::{
    CU_MEM_LOCATION_TYPE_DEVICE, CUDA_ARRAY_DESCRIPTOR, CUDA_ARRAY_MEMORY_REQUIREMENTS,
    CUDA_ARRAY3D_DESCRIPTOR, CUarray, CUfunction, CUlaunchConfig, CUmemAccessDesc,
    CUmemGenericAllocationHandle, CUmemPropHead, CUmemoryPool, CUmipmappedArray, CUmodule,
    CUstream,
};

/// A memory pool: the device it allocates on.
pub struct Pool {
    node_index: usize,
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
        let p = *pools
            .entry(index)
            .or_insert_with(|| Box::into_raw(Box::new(Pool { node_index: index })) as usize);
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
    Ok(*pools
        .entry(index)
        .or_insert_with(|| Box::into_raw(Box::new(Pool { node_index: index })) as usize))
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
        if unsafe { &*pool.cast::<Pool>() }.node_index != index {
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
        if props.location.typ != CU_MEM_LOCATION_TYPE_DEVICE {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        let index = d.node_index(props.location.id)?;
        out(
            pool,
            Box::into_raw(Box::new(Pool { node_index: index })).cast(),
        )
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
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        crate::pool_books::destroyed(pool as usize)?;
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
        let index = unsafe { (*pool.cast::<Pool>()).node_index };
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
        if crate::graph_memory::release(dptr)? {
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

/// Launches made through the fake driver (no code runs on the simulated device).
pub static LAUNCHES: AtomicU64 = AtomicU64::new(0);

#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLaunchKernel(
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_mem_bytes: c_uint,
    stream: CUstream,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    guard(|| {
        let op = crate::graph::kernel(
            f,
            [grid_x, grid_y, grid_z],
            [block_x, block_y, block_z],
            shared_mem_bytes,
        )?;
        LAUNCHES.fetch_add(1, Ordering::Relaxed);
        current_ctx()?;
        // In the stream's context, the current one for the default streams (as the driver
        // launches a library's kernel).
        let ctx = crate::stream::ctx_of(stream)?;
        // On a capturing stream the launch is recorded; otherwise it runs, waiting while the
        // queue is full, as a real launch does.
        let mut held = crate::stream::hold(stream)?;
        if held.graph().is_some() {
            return held.record(op).map(|_| ());
        }
        drop(held);
        crate::graph::run_in(op, Some(ctx))
    })
}

#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    if config.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller passes a valid configuration (checked for null above).
    let c = unsafe { &*config };
    let clusters = guard(|| crate::clusters::check_launch(f, c));
    if clusters != CUDA_SUCCESS {
        return clusters;
    }
    // SAFETY: same contract as cuLaunchKernel.
    unsafe {
        cuLaunchKernel(
            f,
            c.grid_dim_x,
            c.grid_dim_y,
            c.grid_dim_z,
            c.block_dim_x,
            c.block_dim_y,
            c.block_dim_z,
            c.shared_mem_bytes,
            c.stream,
            params,
            extra,
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuLaunchKernelEx(config, f, params, extra) }
}

#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    // SAFETY: same contract as cuLaunchKernel, without `extra`.
    unsafe {
        cuLaunchKernel(
            f,
            gx,
            gy,
            gz,
            bx,
            by,
            bz,
            shared,
            stream,
            params,
            std::ptr::null_mut(),
        )
    }
}

#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel_ptsz(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params) }
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
