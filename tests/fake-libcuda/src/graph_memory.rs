//! Graph allocations and each device's graph memory pool, as the driver keeps them.
//!
//! An allocation node's address is fixed when the node is made; nothing is taken until a
//! launch reaches the node. Physical memory comes from the device's graph pool: a launch that
//! needs more than the pool holds grows it (charged to the device, in 2 MiB pages, the
//! driver's mapping granularity), and a free (a free node, `cuMemFree`, `cuMemFreeAsync`)
//! returns the memory to the pool, not to the device. The pool keeps what it reserved for later
//! launches until `cuDeviceGraphMemTrim` gives the unused part back, or the process exits.
//! Memory a free node of a graph returned is in use until the work queued before it on the
//! device has run (a launch returns before its graph runs): a trim meanwhile keeps it, as the
//! driver keeps what a graph executing or scheduled to execute uses, and only a launch that
//! runs after it for certain (on the same stream, or of the same executable graph, whose
//! launches the driver orders) takes it again: graphs that may run at once need memory of
//! their own, so each graph launched on a stream of its own while the others run grows the
//! pool, as the driver's does.
//! `cuDeviceGetGraphMemAttribute` reports the pool's figures.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{LazyLock, Mutex, MutexGuard};

use gpuslice_cuda_abi::cuda::{
    CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH,
    CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH,
};

use crate::codes::*;
use crate::{CUresult, guard, state};

/// The driver maps graph memory in pages of this size.
pub(crate) const GRANULARITY: u64 = 2 << 20;

/// One allocation node's memory.
struct Allocation {
    /// Node GPU and the CUDA ordinal it was asked for by.
    index: usize,
    ordinal: c_int,
    bytes: u64,
    /// Whether a launch holds it now.
    held: bool,
}

#[derive(Clone, Copy, Default)]
struct Pool {
    used: u64,
    reserved: u64,
    used_high: u64,
    reserved_high: u64,
}

#[derive(Default)]
struct Books {
    allocations: HashMap<u64, Allocation>,
    /// By node GPU.
    pools: HashMap<usize, Pool>,
    /// By node GPU: memory a graph's free node returned to the pool that the work before that
    /// node still uses.
    in_use: HashMap<usize, Vec<InUse>>,
}

struct InUse {
    /// Until when (monotonic ns).
    until: u64,
    bytes: u64,
    /// The launch that freed it.
    by: Launch,
}

/// A graph's launch: its stream and executable graph (as addresses).
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Launch {
    pub stream: usize,
    pub exec: usize,
}

impl Launch {
    /// Whether this launch runs after `earlier` for certain.
    fn ordered_after(self, earlier: Launch) -> bool {
        self.stream == earlier.stream || self.exec == earlier.exec
    }
}

thread_local! {
    /// The graph launch this thread is running the nodes of.
    static LAUNCHING: std::cell::Cell<Launch> = const {
        std::cell::Cell::new(Launch { stream: 0, exec: 0 })
    };
}

/// The last number given a thread's per-thread default stream.
static THREADS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

thread_local! {
    /// Names this thread's per-thread default stream: a number no other thread of the
    /// process had, with the top bit set (no stream handle has it).
    static THREAD: usize =
        THREADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) | 1 << (usize::BITS - 1);
}

/// What names stream `s` (`ptsz`: passed to a per-thread default stream variant) among the
/// launches: each thread's per-thread default stream is its own, the legacy stream is one.
pub(crate) fn stream_key(s: crate::paths::CUstream, ptsz: bool) -> usize {
    match s as usize {
        2 => THREAD.with(|t| *t),
        0 if ptsz => THREAD.with(|t| *t),
        0 | 1 => 1,
        other => other,
    }
}

/// Runs `f` (a graph's nodes) as launch `launch`.
pub(crate) fn as_launch<T>(launch: Launch, f: impl FnOnce() -> T) -> T {
    let outer = LAUNCHING.with(|l| l.replace(launch));
    let r = f();
    LAUNCHING.with(|l| l.set(outer));
    r
}

/// What `in_use` holds that a launch `by` cannot take, once what has run is dropped.
fn in_use_by_others(in_use: &mut Vec<InUse>, by: Launch) -> u64 {
    let now = gpuslice_simnode::procs::monotonic_ns();
    in_use.retain(|u| u.until > now);
    in_use
        .iter()
        .filter(|u| !by.ordered_after(u.by))
        .map(|u| u.bytes)
        .sum()
}

static BOOKS: LazyLock<Mutex<Books>> = LazyLock::new(Mutex::default);

fn books() -> MutexGuard<'static, Books> {
    BOOKS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn pages(bytes: u64) -> u64 {
    bytes.div_ceil(GRANULARITY).saturating_mul(GRANULARITY)
}

/// Reserves `bytes` of address space for an allocation node on CUDA device `ordinal`; nothing
/// is charged until a launch.
pub(crate) fn reserve(ordinal: c_int, bytes: u64) -> Result<u64, CUresult> {
    let index = state::get()?.node_index(ordinal)?;
    let len = usize::try_from(bytes).map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
    if len == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: an anonymous private mapping; no existing memory is touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    books().allocations.insert(
        p as u64,
        Allocation {
            index,
            ordinal,
            bytes,
            held: false,
        },
    );
    Ok(p as u64)
}

/// A launch reaches the allocation node of `ptr`: the pool grows if it must. Fails if the
/// previous launch's allocation was not freed, or the device has no room.
pub(crate) fn take(ptr: u64) -> Result<(), CUresult> {
    let mut b = books();
    let a = b.allocations.get(&ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if a.held {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (index, need) = (a.index, pages(a.bytes));
    let others = in_use_by_others(
        b.in_use.entry(index).or_default(),
        LAUNCHING.with(std::cell::Cell::get),
    );
    let mut pool = b.pools.get(&index).copied().unwrap_or_default();
    pool.used = pool.used.saturating_add(need);
    let must_hold = pool.used.saturating_add(others);
    if must_hold > pool.reserved {
        let d = state::get()?;
        d.charge(&mut d.lock(), index, must_hold - pool.reserved)?;
        pool.reserved = must_hold;
    }
    pool.used_high = pool.used_high.max(pool.used);
    pool.reserved_high = pool.reserved_high.max(pool.reserved);
    b.pools.insert(index, pool);
    if let Some(a) = b.allocations.get_mut(&ptr) {
        a.held = true;
    }
    Ok(())
}

/// Frees a graph allocation a launch holds, back into its pool. Ok(false): `ptr` is no graph
/// allocation.
pub(crate) fn release(ptr: u64) -> Result<bool, CUresult> {
    let mut b = books();
    let Some(a) = b.allocations.get_mut(&ptr) else {
        return Ok(false);
    };
    if !a.held {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    a.held = false;
    let (index, bytes) = (a.index, pages(a.bytes));
    if let Some(p) = b.pools.get_mut(&index) {
        p.used = p.used.saturating_sub(bytes);
    }
    Ok(true)
}

/// A graph's free node reached by its launch: `ptr` goes back into its pool as [`release`]
/// does, still in use until the work queued on its device so far has run.
pub(crate) fn release_in_graph(ptr: u64) -> Result<bool, CUresult> {
    if !release(ptr)? {
        return Ok(false);
    }
    let mut b = books();
    let Some(a) = b.allocations.get(&ptr) else {
        return Ok(true);
    };
    let (index, bytes) = (a.index, pages(a.bytes));
    let until = gpuslice_simnode::procs::monotonic_ns()
        .saturating_add(state::get()?.until_idle(index).as_nanos() as u64);
    let by = LAUNCHING.with(std::cell::Cell::get);
    b.in_use
        .entry(index)
        .or_default()
        .push(InUse { until, bytes, by });
    Ok(true)
}

/// Whether `[ptr, ptr + n)` lies in a graph allocation a launch holds (between its
/// allocation node and its free): a copy or memset of the graph, or of work after its launch,
/// may use it then.
pub(crate) fn held_range(ptr: u64, n: usize) -> bool {
    books().allocations.iter().any(|(&base, a)| {
        a.held && ptr >= base && ptr.saturating_add(n as u64) <= base.saturating_add(a.bytes)
    })
}

/// Whether `ptr` is a graph allocation, and whether a launch holds it.
pub(crate) fn held(ptr: u64) -> Option<bool> {
    books().allocations.get(&ptr).map(|a| a.held)
}

/// The CUDA ordinal and size an allocation node was made with.
pub(crate) fn params(ptr: u64) -> Result<(c_int, u64), CUresult> {
    books()
        .allocations
        .get(&ptr)
        .map(|a| (a.ordinal, a.bytes))
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceGraphMemTrim(dev: c_int) -> CUresult {
    guard(|| {
        let d = state::get()?;
        let index = d.node_index(dev)?;
        let mut b = books();
        let now = gpuslice_simnode::procs::monotonic_ns();
        let in_use = b.in_use.entry(index).or_default();
        in_use.retain(|u| u.until > now);
        let running: u64 = in_use.iter().map(|u| u.bytes).sum();
        if let Some(p) = b.pools.get_mut(&index) {
            let keep = p.used.saturating_add(running).min(p.reserved);
            d.uncharge(&mut d.lock(), index, p.reserved - keep);
            p.reserved = keep;
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetGraphMemAttribute(
    dev: c_int,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    guard(|| {
        let index = state::get()?.node_index(dev)?;
        let p = books().pools.get(&index).copied().unwrap_or_default();
        let v = match attr {
            CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT => p.used,
            CU_GRAPH_MEM_ATTR_USED_MEM_HIGH => p.used_high,
            CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT => p.reserved,
            CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH => p.reserved_high,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        crate::out(value.cast::<u64>(), v)
    })
}

/// Only the high-water marks can be set, and only to zero (which resets them).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceSetGraphMemAttribute(
    dev: c_int,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    guard(|| {
        let index = state::get()?.node_index(dev)?;
        if value.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's cuuint64_t.
        if unsafe { value.cast::<u64>().read() } != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut b = books();
        let p = b.pools.entry(index).or_default();
        match attr {
            CU_GRAPH_MEM_ATTR_USED_MEM_HIGH => p.used_high = 0,
            CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH => p.reserved_high = 0,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    })
}
