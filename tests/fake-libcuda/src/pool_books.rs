//! What each memory pool holds, its attributes (`cuMemPoolSetAttribute`,
//! `cuMemPoolGetAttribute`, `cuMemPoolTrimTo`) and which devices may read and write it
//! (`cuMemPoolSetAccess`, `cuMemPoolGetAccess`: the pool's own device always both, every
//! other device what was last set for it, nothing at first; every GPU of the node reaches
//! every other here, as with peer access). A pool takes device memory in steps of
//! [`STEP`], as the real driver's does: what it reserves is what is allocated from it rounded
//! up to a whole step, and, of what was freed, as much as its release threshold lets it keep
//! (the real driver gives the rest back when the stream synchronizes; here at the free). The
//! device is charged what the pool reserves, not what is allocated from it.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{LazyLock, Mutex};

use gpuslice_cuda_abi::cuda::{CU_MEM_LOCATION_TYPE_DEVICE, CUmemAccessDesc, CUmemLocation};

use crate::codes::*;
use crate::{CUdeviceptr, CUresult, guard, state};

type CUmemoryPool = *mut c_void;

// CUmemPool_attribute: three reuse flags (int), then cuuint64_t figures.
const REUSE_FOLLOW_EVENT_DEPENDENCIES: c_int = 1;
const REUSE_ALLOW_INTERNAL_DEPENDENCIES: c_int = 3;
const RELEASE_THRESHOLD: c_int = 4;
const RESERVED_MEM_CURRENT: c_int = 5;
const RESERVED_MEM_HIGH: c_int = 6;
const USED_MEM_CURRENT: c_int = 7;
const USED_MEM_HIGH: c_int = 8;

/// The step in which a pool takes memory from the device: 32 MiB, as measured on an H200 with
/// driver 580 (its default pool filled 16 MiB at a time grew by 32 MiB every other
/// allocation).
pub(crate) const STEP: u64 = 32 << 20;

fn whole_steps(bytes: u64) -> u64 {
    bytes.div_ceil(STEP).saturating_mul(STEP)
}

struct Books {
    used: u64,
    high: u64,
    /// What the pool holds of the device, charged to it.
    reserved: u64,
    /// The node GPU the reservation is charged on.
    node_index: usize,
    reserved_high: u64,
    release_threshold: u64,
    /// The three reuse flags, enabled by default as on the real driver.
    reuse: [c_int; 3],
}

impl Default for Books {
    fn default() -> Self {
        Self {
            used: 0,
            high: 0,
            reserved: 0,
            node_index: 0,
            reserved_high: 0,
            release_threshold: 0,
            reuse: [1; 3],
        }
    }
}

static BOOKS: LazyLock<Mutex<HashMap<usize, Books>>> = LazyLock::new(Default::default);
/// Which pool each live pool allocation came from, and its size.
static OWNERS: LazyLock<Mutex<HashMap<CUdeviceptr, (usize, u64)>>> =
    LazyLock::new(Default::default);

fn books() -> Result<std::sync::MutexGuard<'static, HashMap<usize, Books>>, CUresult> {
    BOOKS.lock().map_err(|_| CUDA_ERROR_UNKNOWN)
}

impl Books {
    /// Gives the device back what the pool may no longer keep: beyond its allocations'
    /// whole steps, what is above `keep`.
    fn release_to(&mut self, keep: u64) -> Result<(), CUresult> {
        let floor = whole_steps(self.used).max(keep.min(self.reserved));
        if self.reserved > floor {
            let d = state::get()?;
            let mut inner = d.lock();
            d.uncharge(&mut inner, self.node_index, self.reserved - floor);
            self.reserved = floor;
        }
        Ok(())
    }
}

/// Allocates `bytes` from `pool` on node GPU `index`: the pool grows by whole steps where
/// what it reserves cannot hold them, and the device is charged the growth.
pub(crate) fn allocate(pool: usize, index: usize, bytes: u64) -> Result<CUdeviceptr, CUresult> {
    let d = state::get()?;
    let len = usize::try_from(bytes).map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
    let mut all = books()?;
    let b = all.entry(pool).or_default();
    let need = b.used.saturating_add(bytes);
    let growth = if need > b.reserved {
        whole_steps(need) - b.reserved
    } else {
        0
    };
    if growth > 0 {
        let mut inner = d.lock();
        d.charge(&mut inner, index, growth)?;
    }
    let ptr = match d.allocate(index, 0, len) {
        Ok(p) => p,
        Err(e) => {
            let mut inner = d.lock();
            d.uncharge(&mut inner, index, growth);
            return Err(e);
        }
    };
    b.node_index = index;
    b.reserved += growth;
    b.used = need;
    b.high = b.high.max(b.used);
    b.reserved_high = b.reserved_high.max(b.reserved);
    OWNERS
        .lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .insert(ptr, (pool, bytes));
    Ok(ptr)
}

/// `ptr` was freed (by any free call); a pool allocation leaves its pool's books, and the
/// pool gives back what its release threshold does not let it keep.
pub(crate) fn freed(ptr: CUdeviceptr) -> Result<(), CUresult> {
    let owner = OWNERS.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?.remove(&ptr);
    if let Some((pool, bytes)) = owner
        && let Some(b) = books()?.get_mut(&pool)
    {
        b.used -= bytes;
        let keep = b.release_threshold;
        b.release_to(keep)?;
    }
    Ok(())
}

/// `pool` was destroyed: it gives back all it reserved (its allocations must have been
/// freed).
pub(crate) fn destroyed(pool: usize) -> Result<(), CUresult> {
    access()?.retain(|(p, _), _| *p != pool);
    if let Some(mut b) = books()?.remove(&pool) {
        b.used = 0;
        b.release_to(0)?;
    }
    Ok(())
}

/// The primary context of node GPU `index` was destroyed: the pools there give back all
/// they reserved, and their allocations leave their books (the memory itself is freed with
/// the context's allocations).
pub(crate) fn context_destroyed(index: usize) -> Result<(), CUresult> {
    let mut all = books()?;
    let emptied: Vec<usize> = all
        .iter()
        .filter(|(_, b)| b.node_index == index && b.reserved > 0)
        .map(|(&p, _)| p)
        .collect();
    OWNERS
        .lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .retain(|_, (pool, _)| !emptied.contains(pool));
    for pool in emptied {
        if let Some(b) = all.get_mut(&pool) {
            b.used = 0;
            b.release_to(0)?;
        }
    }
    Ok(())
}

/// Runs `f` on `pool`'s books, for an attribute call whose value is at `value`.
fn with_books(
    pool: CUmemoryPool,
    value: *mut c_void,
    f: impl FnOnce(&mut Books) -> Result<(), CUresult>,
) -> CUresult {
    guard(|| {
        if pool.is_null() || value.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        f(books()?.entry(pool as usize).or_default())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: CUmemoryPool,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    with_books(pool, value, |b| {
        if (REUSE_FOLLOW_EVENT_DEPENDENCIES..=REUSE_ALLOW_INTERNAL_DEPENDENCIES).contains(&attr) {
            // SAFETY: the API's contract: an int for the reuse flags.
            b.reuse[(attr - 1) as usize] = unsafe { *value.cast::<c_int>() };
            return Ok(());
        }
        // SAFETY: the API's contract: a cuuint64_t for every other attribute.
        let figure = unsafe { *value.cast::<u64>() };
        match attr {
            RELEASE_THRESHOLD => b.release_threshold = figure,
            // Only a reset to zero is allowed: the mark starts again from now.
            USED_MEM_HIGH if figure == 0 => b.high = b.used,
            RESERVED_MEM_HIGH if figure == 0 => b.reserved_high = b.reserved,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: CUmemoryPool,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    with_books(pool, value, |b| {
        let figure = match attr {
            REUSE_FOLLOW_EVENT_DEPENDENCIES..=REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                // SAFETY: the API's contract: an int for the reuse flags.
                unsafe { *value.cast::<c_int>() = b.reuse[(attr - 1) as usize] };
                return Ok(());
            }
            RELEASE_THRESHOLD => b.release_threshold,
            RESERVED_MEM_CURRENT => b.reserved,
            USED_MEM_CURRENT => b.used,
            RESERVED_MEM_HIGH => b.reserved_high,
            USED_MEM_HIGH => b.high,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        // SAFETY: the API's contract: a cuuint64_t for these.
        unsafe { *value.cast::<u64>() = figure };
        Ok(())
    })
}

/// Gives back what the pool reserves beyond its allocations' whole steps, down to
/// `min_bytes_to_keep`.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, min_bytes_to_keep: usize) -> CUresult {
    guard(|| {
        if pool.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if let Some(b) = books()?.get_mut(&(pool as usize)) {
            b.release_to(min_bytes_to_keep as u64)?;
        }
        Ok(())
    })
}

/// `CU_MEM_ACCESS_FLAGS_PROT_NONE`, `_READ` and `_READWRITE`.
const ACCESS_NONE: c_int = 0;
const ACCESS_READ: c_int = 1;
const ACCESS_READWRITE: c_int = 3;

/// The access set for other devices than its own, by pool and node GPU.
type Access = HashMap<(usize, usize), c_int>;
static ACCESS: LazyLock<Mutex<Access>> = LazyLock::new(|| Mutex::new(HashMap::new()));

fn access() -> Result<std::sync::MutexGuard<'static, Access>, CUresult> {
    ACCESS.lock().map_err(|_| CUDA_ERROR_UNKNOWN)
}

/// The node GPU a location names: a device of this process.
fn location_index(location: &CUmemLocation) -> Result<usize, CUresult> {
    if location.typ != CU_MEM_LOCATION_TYPE_DEVICE {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    state::get()?.node_index(location.id)
}

/// Sets which devices may read or write the pool's allocations. Every descriptor is checked
/// before any is applied; one for the pool's own device changes nothing (it always has both).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolSetAccess(
    pool: CUmemoryPool,
    map: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    guard(|| {
        let own = crate::paths::pool_node_index(pool)?;
        if map.is_null() && count > 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let descs = if count == 0 {
            &[][..]
        } else {
            // SAFETY: the caller's array of `count` descriptors, non-null.
            unsafe { std::slice::from_raw_parts(map, count) }
        };
        let mut wanted = Vec::with_capacity(descs.len());
        for d in descs {
            if !matches!(d.flags, ACCESS_NONE | ACCESS_READ | ACCESS_READWRITE) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            wanted.push((location_index(&d.location)?, d.flags));
        }
        let mut set = access()?;
        for (index, flags) in wanted.into_iter().filter(|(i, _)| *i != own) {
            set.insert((pool as usize, index), flags);
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolGetAccess(
    flags: *mut c_int,
    pool: CUmemoryPool,
    location: *mut CUmemLocation,
) -> CUresult {
    guard(|| {
        let own = crate::paths::pool_node_index(pool)?;
        if location.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null, the caller's location.
        let index = location_index(unsafe { &*location })?;
        let granted = if index == own {
            ACCESS_READWRITE
        } else {
            access()?
                .get(&(pool as usize, index))
                .copied()
                .unwrap_or(ACCESS_NONE)
        };
        crate::out(flags, granted)
    })
}
