//! The simulated driver's state in one process: the node, the visible devices, contexts and
//! allocations, and this process's usage record shared with every other process.

use std::collections::HashMap;
use std::ffi::c_int;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

use gpuslice_simnode::{NodeSpec, procs};

use crate::CUresult;
use crate::codes::*;

pub struct Driver {
    pub spec: NodeSpec,
    /// CUDA ordinal → index in the node description (after `CUDA_VISIBLE_DEVICES`).
    pub visible: Vec<usize>,
    pid: u32,
    /// This process's PID namespace: with `pid`, how its record names it.
    pidns: u64,
    start_time: u64,
    record: Option<File>,
    lock_path: PathBuf,
    /// The node's kernel timeline, shared by all its processes ([`Driver::queue_on_device`]).
    timeline: Option<File>,
    pub inner: Mutex<Inner>,
}

/// One allocation made by [`Driver::allocate`].
pub struct Allocation {
    /// The node GPU it is on.
    pub index: usize,
    /// Bytes charged to the device.
    pub charge: u64,
    /// Bytes mapped.
    pub len: usize,
    /// The context it was allocated in (as an address), which frees it when destroyed.
    pub context: usize,
}

pub struct Inner {
    /// Device pointer → what was allocated there.
    pub allocs: HashMap<u64, Allocation>,
    pub used: Box<[u64; procs::MAX_GPUS]>,
    /// Kernel time launched on each node GPU (when the node simulates kernel time).
    pub busy: Box<[procs::Busy; procs::MAX_GPUS]>,
    /// Primary context per node index, with its retain count.
    pub primary: HashMap<usize, (usize, u32)>,
    /// When each of this process's kernels still queued on each node GPU ends, in launch
    /// order: a launch waits while [`gpuslice_simnode::node::LAUNCH_QUEUE_LAUNCHES`] are.
    pub queued: Box<[std::collections::VecDeque<u64>; procs::MAX_GPUS]>,
}

impl Default for Inner {
    fn default() -> Self {
        Self {
            allocs: HashMap::new(),
            used: Box::new([0; procs::MAX_GPUS]),
            busy: Box::new([procs::Busy::default(); procs::MAX_GPUS]),
            primary: HashMap::new(),
            queued: Box::new(std::array::from_fn(|_| std::collections::VecDeque::new())),
        }
    }
}

static DRIVER: OnceLock<Result<Driver, CUresult>> = OnceLock::new();

pub fn init(library_dir: Option<&Path>) -> Result<&'static Driver, CUresult> {
    DRIVER
        .get_or_init(|| load(library_dir))
        .as_ref()
        .map_err(|e| *e)
}

pub fn get() -> Result<&'static Driver, CUresult> {
    match DRIVER.get() {
        Some(Ok(d)) => Ok(d),
        Some(Err(e)) => Err(*e),
        None => Err(CUDA_ERROR_NOT_INITIALIZED),
    }
}

/// The CUDA version of the node's driver. `cuDriverGetVersion` and `cuGetProcAddress` answer
/// before `cuInit`, as the real driver does (the CUDA runtime asks both first, and a CUDA 13
/// runtime told 12.4 stops with `cudaErrorInsufficientDriver`): before it, the version is read
/// from the node description; where there is none, the default node's.
pub fn cuda_version() -> c_int {
    static BEFORE_INIT: OnceLock<c_int> = OnceLock::new();
    match get() {
        Ok(d) => d.spec.cuda_driver_version,
        Err(_) => *BEFORE_INIT.get_or_init(|| {
            NodeSpec::locate(crate::library_dir().as_deref())
                .map_or(crate::DEFAULT_CUDA_VERSION, |s| s.cuda_driver_version)
        }),
    }
}

fn load(library_dir: Option<&Path>) -> Result<Driver, CUresult> {
    let spec = NodeSpec::locate(library_dir).map_err(|e| {
        if std::env::var_os("GPUSLICE_SIM_DEBUG").is_some() {
            eprintln!("fake libcuda: {e}");
        }
        CUDA_ERROR_NO_DEVICE
    })?;
    let visible = visible_devices(&spec, std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref());
    let pid = std::process::id();
    let pidns = procs::own_pidns();
    let start_time =
        gpuslice_simnode::procs::process_start_time(Path::new("/proc"), pid).unwrap_or(0);
    procs::remove_stale(&spec.state_dir);
    gpuslice_simnode::unmodelled::set_state_dir(&spec.state_dir);
    let record = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(procs::record_path(&spec.state_dir, pidns, pid))
        .ok();
    let lock_path = spec.state_dir.join("lock");
    let timeline = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(spec.state_dir.join("timeline"))
        .ok();
    let driver = Driver {
        spec,
        visible,
        pid,
        pidns,
        start_time,
        record,
        lock_path,
        timeline,
        inner: Mutex::new(Inner::default()),
    };
    driver.publish_whole(&driver.lock());
    Ok(driver)
}

/// Devices CUDA shows: those whose device node this process can open, then narrowed as the
/// real driver reads `CUDA_VISIBLE_DEVICES` (indexes among those devices, or UUIDs or unique
/// UUID prefixes), stopping at the first entry that names no device.
fn visible_devices(spec: &NodeSpec, env: Option<&str>) -> Vec<usize> {
    let accessible = gpuslice_simnode::devices::accessible(spec);
    let Some(env) = env else {
        return accessible;
    };
    let mut out = Vec::new();
    for item in env.split(',').map(str::trim) {
        let found = if let Ok(i) = item.parse::<usize>() {
            accessible.get(i).copied()
        } else {
            let matches: Vec<usize> = accessible
                .iter()
                .copied()
                .filter(|&i| spec.gpus[i].uuid.starts_with(item) && !item.is_empty())
                .collect();
            (matches.len() == 1).then(|| matches[0])
        };
        match found {
            Some(i) if !out.contains(&i) => out.push(i),
            _ => break,
        }
    }
    out
}

impl Driver {
    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The node index behind a CUDA ordinal.
    pub fn node_index(&self, ordinal: i32) -> Result<usize, CUresult> {
        usize::try_from(ordinal)
            .ok()
            .and_then(|o| self.visible.get(o).copied())
            .ok_or(CUDA_ERROR_INVALID_DEVICE)
    }

    /// Writes this process's usage record whole for the other processes (and NVML) to read.
    fn publish_whole(&self, inner: &Inner) {
        if let Some(f) = &self.record {
            let record = procs::encode(
                (self.pidns, self.pid),
                self.start_time,
                &inner.used,
                &inner.busy,
            );
            let _ = f.write_all_at(&record, 0);
        }
    }

    /// Writes what this process holds on each GPU into its record.
    pub fn publish(&self, inner: &Inner) {
        if let Some(f) = &self.record {
            let (offset, bytes) = procs::encode_used(&inner.used);
            let _ = f.write_all_at(&bytes, offset as u64);
        }
    }

    /// Queues a kernel of `blocks` thread blocks on node GPU `index` and publishes it. Returns
    /// how long the launch must wait for room in the queue (zero when kernels take no time).
    pub fn launch(&self, index: usize, blocks: u64) -> std::time::Duration {
        let per_block = self.spec.gpus[index].kernel_ns_per_block;
        self.run_for(index, blocks.saturating_mul(per_block))
    }

    /// Queues a memset of `bytes` on node GPU `index` (the driver runs it as a kernel of its
    /// own) and publishes it, as [`Driver::launch`] does a kernel.
    pub fn memset(&self, index: usize, bytes: u64) -> std::time::Duration {
        let per_kib = self.spec.gpus[index].memset_ns_per_kib;
        self.run_for(index, bytes.saturating_mul(per_kib) / 1024)
    }

    /// Queues work taking `ns` on node GPU `index` behind what is queued there, as
    /// [`Driver::launch`] says.
    fn run_for(&self, index: usize, ns: u64) -> std::time::Duration {
        if ns == 0 {
            return std::time::Duration::ZERO;
        }
        let now = procs::monotonic_ns();
        let mut inner = self.lock();
        let busy = &mut inner.busy[index];
        let period = self.spec.gpus[index]
            .utilization_period_us
            .saturating_mul(1000);
        let until = self.queue_on_device(index, |device_free| {
            busy.launch_after(now, device_free, ns, period);
            busy.until_ns
        });
        let busy = &inner.busy[index];
        let (offset, bytes) = procs::encode_busy(index, busy);
        if let Some(f) = &self.record {
            let _ = f.write_all_at(&bytes, offset as u64);
        }
        let queued = &mut inner.queued[index];
        while queued.front().is_some_and(|&end| end <= now) {
            queued.pop_front();
        }
        queued.push_back(until);
        // The launch returns once no more than the queue's depth of launches are pending:
        // when the one that many launches back has ended.
        let full = queued
            .len()
            .checked_sub(gpuslice_simnode::node::LAUNCH_QUEUE_LAUNCHES + 1)
            .and_then(|i| queued.get(i).copied())
            .unwrap_or(0);
        drop(inner);
        std::time::Duration::from_nanos(full.saturating_sub(now))
    }

    /// Queues a kernel on node GPU `index` behind every kernel any process of the node has
    /// queued there, as a real GPU runs one context's work at a time: `queue` gets the
    /// instant the device is free and returns when the new kernel ends, which becomes the
    /// instant the device is next free. Holds the timeline file's lock meanwhile.
    fn queue_on_device(&self, index: usize, queue: impl FnOnce(u64) -> u64) -> u64 {
        use std::os::unix::fs::FileExt;
        let Some(f) = &self.timeline else {
            return queue(0);
        };
        let at = (index * 8) as u64;
        let _lock = FileLock::exclusive(f);
        let mut bytes = [0u8; 8];
        let free = match f.read_at(&mut bytes, at) {
            Ok(8) => u64::from_le_bytes(bytes),
            _ => 0,
        };
        let until = queue(free);
        let _ = f.write_all_at(&until.max(free).to_le_bytes(), at);
        until
    }

    /// How long until every kernel launched on node GPU `index` has run.
    pub fn until_idle(&self, index: usize) -> std::time::Duration {
        let until = self.lock().busy[index].until_ns;
        std::time::Duration::from_nanos(until.saturating_sub(procs::monotonic_ns()))
    }

    /// Charges `bytes` on node GPU `index` if the whole node has room, holding a lock file so
    /// that two processes cannot both take the last bytes.
    pub fn charge(&self, inner: &mut Inner, index: usize, bytes: u64) -> Result<(), CUresult> {
        let lock = File::create(&self.lock_path).ok();
        let _held = lock.as_ref().map(FileLock::exclusive);
        let others: u64 = procs::holding(&self.spec.state_dir)
            .iter()
            .filter(|p| p.writer != (self.pidns, self.pid))
            .map(|p| p.used.get(index).copied().unwrap_or(0))
            .sum();
        let usable = self.usable(index);
        let mine = inner.used[index];
        if others.saturating_add(mine).saturating_add(bytes) > usable {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        inner.used[index] = mine + bytes;
        self.publish(inner);
        Ok(())
    }

    pub fn uncharge(&self, inner: &mut Inner, index: usize, bytes: u64) {
        inner.used[index] = inner.used[index].saturating_sub(bytes);
        self.publish(inner);
    }

    /// Maps `len` bytes of host memory as device memory of node GPU `index`, charging
    /// `charge` bytes (the two differ where the driver pads, e.g. pitched allocations).
    pub fn allocate(&self, index: usize, charge: u64, len: usize) -> Result<u64, CUresult> {
        let mut inner = self.lock();
        self.charge(&mut inner, index, charge)?;
        // SAFETY: an anonymous private mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len.max(1),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            self.uncharge(&mut inner, index, charge);
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let addr = p as u64;
        let allocation = Allocation {
            index,
            charge,
            len: len.max(1),
            context: crate::context::current_handle() as usize,
        };
        inner.allocs.insert(addr, allocation);
        Ok(addr)
    }

    /// Frees an allocation made by [`Driver::allocate`], giving back what it charged.
    pub fn free(&self, ptr: u64) -> Result<(), CUresult> {
        let mut inner = self.lock();
        let a = inner.allocs.remove(&ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: `ptr`/`len` is a mapping this library made in `allocate` and still owns.
        unsafe { libc::munmap(ptr as *mut libc::c_void, a.len) };
        crate::ipc::freed(ptr);
        crate::managed::freed(ptr);
        self.uncharge(&mut inner, a.index, a.charge);
        Ok(())
    }

    /// Frees every allocation made in context `ctx` (the context is being destroyed).
    pub fn free_context_allocations(&self, ctx: usize) {
        let ptrs: Vec<u64> = self
            .lock()
            .allocs
            .iter()
            .filter(|(_, a)| a.context == ctx)
            .map(|(&p, _)| p)
            .collect();
        for p in ptrs {
            let _ = self.free(p);
        }
    }

    /// Free and total bytes of node GPU `index`, across all processes: what the driver
    /// reserves for itself is never free.
    pub fn mem_info(&self, index: usize) -> (u64, u64) {
        let used = procs::used_on(&self.spec.state_dir, index);
        (
            self.usable(index).saturating_sub(used),
            self.spec.gpus[index].memory_bytes,
        )
    }

    /// What processes can be given of node GPU `index`: its memory less the driver's
    /// reservation.
    fn usable(&self, index: usize) -> u64 {
        let g = &self.spec.gpus[index];
        g.memory_bytes.saturating_sub(g.reserved_bytes)
    }
}

/// An exclusive `flock` on a file, released when dropped.
struct FileLock<'a>(&'a File);

impl<'a> FileLock<'a> {
    fn exclusive(f: &'a File) -> Self {
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor the caller's File owns for the guard's life.
        #[allow(unsafe_code)]
        unsafe {
            libc::flock(f.as_raw_fd(), libc::LOCK_EX);
        }
        Self(f)
    }
}

impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: unlocks the lock taken in `exclusive` on the same open descriptor.
        #[allow(unsafe_code)]
        unsafe {
            libc::flock(self.0.as_raw_fd(), libc::LOCK_UN);
        }
    }
}
