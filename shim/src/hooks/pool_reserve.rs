//! Stream-ordered pools' reservations. A pool takes device memory in steps of its own (32 MiB
//! for the default pool on an H200 with driver 580) and keeps, of what is freed, what its
//! release threshold lets it; the host's figure for the process counts the whole reservation.
//! So each allocation from a pool is charged the bytes asked for, and each pool its surplus:
//! what it reserves (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`, read after each allocation from
//! it and each free) beyond what its live allocations asked for.
//!
//! An allocation first uses the surplus already charged (memory the pool holds and hands out
//! again). One whose new step would take the container over its limit is freed again, its
//! stream waited for (through an event, in the relaxed capture mode), the pool trimmed, and
//! refused: the slice holds on the host's figure.
//! What the pool gives back when the program trims it leaves the books at once; what it gives
//! back on its own (at a synchronization, above its release threshold), at the pool's next
//! allocation, free or trim.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::api::real;
use crate::ffi::*;
use crate::log::log;
use crate::slice::{Kind, Slice};

/// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`.
const RESERVED_MEM_CURRENT: c_int = 5;

/// Whether this process ever allocated from a pool: frees look at the books only then.
static POOLED: AtomicBool = AtomicBool::new(false);

/// The pools this process allocated from, and their allocations.
#[derive(Default)]
pub struct Reserves {
    /// The process the books are for (a forked child starts with none).
    owner: u64,
    /// Each live allocation from a pool: its pool and the bytes asked for.
    of: HashMap<CUdeviceptr, (usize, u64)>,
    pools: HashMap<usize, Book>,
}

#[derive(Clone, Copy)]
struct Book {
    /// The slice position the pool's memory is on.
    gpu: usize,
    /// Bytes its live allocations asked for.
    asked: u64,
    /// What it reserves beyond them, as charged.
    surplus: u64,
}

impl Reserves {
    /// Forgets the pools on slice position `gpu` and their allocations (the driver freed them
    /// with the context).
    pub fn forget(&mut self, gpu: usize) {
        self.pools.retain(|_, b| b.gpu != gpu);
        let pools = &self.pools;
        self.of.retain(|_, (pool, _)| pools.contains_key(pool));
    }
}

/// How a stream-ordered allocation reaches the driver.
pub struct PoolCall<'a> {
    pub pool: CUmemoryPool,
    pub stream: CUstream,
    /// The per-thread default stream's variants.
    pub ptsz: bool,
    pub alloc: &'a dyn Fn() -> CUresult,
    pub dptr: *mut CUdeviceptr,
}

/// What `pool` reserves of the device, as the driver says.
fn reserved(pool: usize) -> Option<u64> {
    let f = real::cuMemPoolGetAttribute()?;
    let mut v: u64 = 0;
    // SAFETY: the attribute is a cuuint64_t, written to a local.
    let r = unsafe {
        f(
            pool as CUmemoryPool,
            RESERVED_MEM_CURRENT,
            (&raw mut v).cast(),
        )
    };
    (r == CUDA_SUCCESS).then_some(v)
}

/// Brings `book`'s surplus to what `pool` reserves beyond its allocations. Growth is charged
/// within the limit, or whatever the limit where `anyway` (the driver holds it already);
/// returns false where it was refused.
fn settle(s: &Slice, book: &mut Book, pool: usize, anyway: bool) -> bool {
    let Some(r) = reserved(pool) else {
        return true;
    };
    let want = r.saturating_sub(book.asked);
    if want > book.surplus {
        let more = want - book.surplus;
        if anyway {
            s.charge_anyway(book.gpu, more);
        } else if !s.charge(book.gpu, more) {
            return false;
        }
    } else {
        s.refund(book.gpu, book.surplus - want);
    }
    book.surplus = want;
    true
}

/// Allocates through `call` from its pool on slice position `gpu`, charging the bytes asked
/// for and the pool's new surplus (see the module's comment).
pub fn allocate(s: &Slice, gpu: usize, bytes: u64, call: &PoolCall<'_>) -> CUresult {
    let Ok(mut guard) = s.reserves.lock() else {
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    let books = &mut *guard;
    let me = s.this_process();
    if books.owner != me {
        *books = Reserves {
            owner: me,
            ..Reserves::default()
        };
    }
    POOLED.store(true, Relaxed);
    let pool = call.pool as usize;
    let book = books.pools.entry(pool).or_insert(Book {
        gpu,
        asked: 0,
        surplus: 0,
    });
    // What the pool gave back since the last look leaves the books first.
    settle(s, book, pool, true);
    let reused = bytes.min(book.surplus);
    let more = bytes - reused;
    if more > 0 && !s.charge(gpu, more) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    book.surplus -= reused;
    let r = (call.alloc)();
    if r != CUDA_SUCCESS {
        book.surplus += reused;
        s.refund(gpu, more);
        return r;
    }
    // SAFETY: the driver reported success, so the non-null out-pointer holds the address.
    let ptr = unsafe { call.dptr.as_ref() }.copied().unwrap_or(0);
    book.asked += bytes;
    s.record(Kind::Memory, ptr, gpu, bytes);
    books.of.insert(ptr, (pool, bytes));
    if settle(s, book, pool, false) {
        return CUDA_SUCCESS;
    }
    // The pool's new step does not fit the slice: the allocation goes back, and so does the
    // step once the stream is done with what it holds.
    log!("refused {bytes} bytes from a stream-ordered pool: its reservation would not fit");
    let free = if call.ptsz {
        real::cuMemFreeAsync_ptsz()
    } else {
        real::cuMemFreeAsync()
    };
    let freed = free.is_some_and(|f| {
        // SAFETY: freeing the allocation just made, on the stream it was made on.
        unsafe { f(ptr, call.stream) == CUDA_SUCCESS }
    });
    if freed && let Some(c) = s.take(Kind::Memory, ptr) {
        s.settle(c);
        book.asked -= bytes;
        books.of.remove(&ptr);
    }
    wait_for_stream(call.stream, call.ptsz);
    if let Some(f) = real::cuMemPoolTrimTo() {
        // SAFETY: the caller's pool, still live.
        unsafe { f(call.pool, 0) };
    }
    settle(s, book, pool, true);
    if !call.dptr.is_null() {
        // SAFETY: the out-pointer the driver wrote the address to, non-null.
        unsafe { *call.dptr = 0 };
    }
    CUDA_ERROR_OUT_OF_MEMORY
}

/// Waits for what `stream` holds now, through an event of its own waited on in the relaxed
/// capture mode: synchronizing the stream would break a capture another thread of the
/// program holds open in the global mode (the driver refuses it and invalidates the capture).
fn wait_for_stream(stream: CUstream, ptsz: bool) {
    use super::graph_running::{create, destroy, record};
    let Some(wait) = real::cuEventSynchronize() else {
        return;
    };
    let Some((event, _)) = create(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING) else {
        return;
    };
    if record(event, stream, ptsz) {
        // SAFETY: the event just recorded; the thread's capture mode is swapped back after.
        super::capture::relaxed(|| unsafe { wait(event as CUevent) });
    }
    destroy(event);
}

/// The books, where they are this process's (a forked child's inherited ones are not).
fn own_books(s: &Slice) -> Option<std::sync::MutexGuard<'_, Reserves>> {
    let guard = s.reserves.lock().ok()?;
    (guard.owner == s.this_process()).then_some(guard)
}

/// `ptr` was freed: if it came from a pool, the pool's surplus is settled.
pub fn freed(s: &Slice, ptr: CUdeviceptr) {
    if !POOLED.load(Relaxed) {
        return;
    }
    let Some(mut guard) = own_books(s) else {
        return;
    };
    let books = &mut *guard;
    let Some((pool, bytes)) = books.of.remove(&ptr) else {
        return;
    };
    if let Some(book) = books.pools.get_mut(&pool) {
        book.asked = book.asked.saturating_sub(bytes);
        settle(s, book, pool, true);
    }
}

/// `pool` was trimmed: what it gave back leaves the books.
pub fn trimmed(s: &Slice, pool: CUmemoryPool) {
    if let Some(mut books) = own_books(s)
        && let Some(book) = books.pools.get_mut(&(pool as usize))
    {
        settle(s, book, pool as usize, true);
    }
}

/// `pool` was destroyed: what it reserved is given back.
pub fn destroyed(s: &Slice, pool: CUmemoryPool) {
    let Some(mut guard) = own_books(s) else {
        return;
    };
    let books = &mut *guard;
    if let Some(book) = books.pools.remove(&(pool as usize)) {
        s.refund(book.gpu, book.surplus);
        books.of.retain(|_, (p, _)| *p != pool as usize);
    }
}
