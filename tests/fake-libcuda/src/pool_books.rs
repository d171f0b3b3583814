//! What each memory pool holds, and its attributes (`cuMemPoolSetAttribute`,
//! `cuMemPoolGetAttribute`, `cuMemPoolTrimTo`). The simulated pools keep nothing once it is
//! freed, so what a pool reserves is what is allocated from it and not yet freed.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{LazyLock, Mutex};

use crate::codes::*;
use crate::{CUdeviceptr, CUresult, guard};

type CUmemoryPool = *mut c_void;

// CUmemPool_attribute: three reuse flags (int), then cuuint64_t figures.
const REUSE_FOLLOW_EVENT_DEPENDENCIES: c_int = 1;
const REUSE_ALLOW_INTERNAL_DEPENDENCIES: c_int = 3;
const RELEASE_THRESHOLD: c_int = 4;
const RESERVED_MEM_CURRENT: c_int = 5;
const RESERVED_MEM_HIGH: c_int = 6;
const USED_MEM_CURRENT: c_int = 7;
const USED_MEM_HIGH: c_int = 8;

struct Books {
    used: u64,
    high: u64,
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

/// `bytes` at `ptr` were allocated from `pool`.
pub(crate) fn allocated(pool: usize, ptr: CUdeviceptr, bytes: u64) -> Result<(), CUresult> {
    let mut all = books()?;
    let b = all.entry(pool).or_default();
    b.used += bytes;
    b.high = b.high.max(b.used);
    b.reserved_high = b.reserved_high.max(b.used);
    OWNERS
        .lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .insert(ptr, (pool, bytes));
    Ok(())
}

/// `ptr` was freed (by any free call); a pool allocation leaves its pool's books.
pub(crate) fn freed(ptr: CUdeviceptr) -> Result<(), CUresult> {
    let owner = OWNERS.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?.remove(&ptr);
    if let Some((pool, bytes)) = owner
        && let Some(b) = books()?.get_mut(&pool)
    {
        b.used -= bytes;
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
            RESERVED_MEM_HIGH if figure == 0 => b.reserved_high = b.used,
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
            RESERVED_MEM_CURRENT | USED_MEM_CURRENT => b.used,
            RESERVED_MEM_HIGH => b.reserved_high,
            USED_MEM_HIGH => b.high,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        // SAFETY: the API's contract: a cuuint64_t for these.
        unsafe { *value.cast::<u64>() = figure };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, _min_bytes_to_keep: usize) -> CUresult {
    // Nothing is kept beyond what is allocated, so there is nothing to trim.
    guard(|| {
        if pool.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    })
}
