//! The container's slice as this process sees it: limits read once from the limits file, the
//! usage region mapped shared, this process's slot in it, and what this process holds.
//!
//! The limits file is `/run/gpuslice/limits`, in the container's directory the runtime mounts
//! read-only at `/run/gpuslice`. A slice given as a CDI device (a DRA claim's request, a slice
//! of `gpuslice cdi`) has its directory mounted at `/run/gpuslice/<claim>` instead, so that a
//! container given several has each: every directory mounted there is one part of the slice,
//! its GPUs after the parts before it, each part with its own usage region and this process's
//! slot in it. Only mounts count (the container can make directories, not mounts). Only where
//! there is no container directory (neither that file nor the usage region beside it, nor a
//! mounted one) may `GPUSLICE_LIMITS` name one (for use outside containers); the usage region
//! is the file `usage` beside it. A limits file that cannot be read or parsed, one missing from
//! a container directory (its host directory was removed under the container), or a usage
//! region that cannot be mapped, closes the wall: every allocation fails.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use gpuslice_core::layout::CONTAINER_RUN_DIR;
use gpuslice_core::limits::{self, GpuLimit, Limits};
use gpuslice_core::usage;

use crate::api::real;
use crate::ffi::*;
use crate::log::log;
use crate::process::{FileLocks, ForkMark};
use crate::region::Region;

/// Device ordinals this library caches positions for; higher ones are looked up every time.
const ORDINALS: usize = 64;
const NO_SLOT: usize = usize::MAX;

/// What a pointer or handle was charged.
#[derive(Clone, Copy, Debug)]
pub struct Charge {
    pub gpu: usize,
    pub bytes: u64,
    /// The process that was charged, by its token (a forked child frees nothing of its
    /// parent's).
    pub owner: u64,
    /// The context the driver frees it with (as an address), or 0 where it outlives contexts.
    pub ctx: usize,
}

/// Kinds of things charged, each with its own key space.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Kind {
    Memory,
    Array,
    MipmappedArray,
    Physical,
    Context,
    /// A context's limit, keyed by context and limit ([`crate::hooks::limits`]).
    Limit,
    /// A loaded module's global variables ([`crate::hooks::module`]).
    Module,
    /// A loaded library's global variables.
    Library,
}

/// This process's references to a device's primary context.
#[derive(Default)]
pub struct Primary {
    pub count: u32,
    /// Its handle (as an address), which its limits are charged under.
    pub ctx: usize,
}

/// One container directory's part of the slice: its usage region, this process's slot in
/// it, and the slot locks.
struct Part {
    /// The slice position of the part's first GPU; its others follow, in its limits' order.
    first: usize,
    /// None where the region could not be mapped (the part's GPUs are refused everything).
    region: Option<Region>,
    /// The slot locks; None where the region could not be mapped.
    locks: Option<FileLocks>,
    slot: AtomicUsize,
    /// When `used` last reaped, in seconds of the monotonic clock (0: never).
    last_reap: AtomicU64,
}

impl Part {
    fn new(first: usize, region: Option<Region>, locks: Option<FileLocks>) -> Self {
        Self {
            first,
            region,
            locks,
            slot: AtomicUsize::new(NO_SLOT),
            last_reap: AtomicU64::new(0),
        }
    }
}

/// Where a memory pool holds its memory, as the call that made it or gave it out said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolPlace {
    /// On this device: charged to it.
    Device(CUdevice),
    /// In host memory (a pool located on the host or a host NUMA node): not device memory,
    /// not charged.
    Host,
}

pub struct Slice {
    /// Every part's GPUs, in the order of the parts.
    pub gpus: Vec<GpuLimit>,
    /// Some GPU of the slice has a share of its SMs: its launches are paced.
    pub paced: bool,
    /// Ordered by their first position.
    parts: Vec<Part>,
    /// Device ordinal → position + 1; 0 not looked up yet; -1 not part of the slice.
    positions: [AtomicI32; ORDINALS],
    nvml_positions: Mutex<HashMap<usize, Option<usize>>>,
    charges: Mutex<HashMap<(Kind, u64), Charge>>,
    /// Where each memory pool the library saw given out holds its memory.
    pub pools: Mutex<HashMap<usize, PoolPlace>>,
    pub primary: Mutex<HashMap<CUdevice, Primary>>,
    /// Mappings of the virtual-memory API, so that a released handle stays charged until its
    /// last unmap.
    pub vmm: Mutex<crate::hooks::vmm::Mappings>,
    /// Graph allocations and the graph memory pools.
    pub graphs: Mutex<crate::hooks::graph::Books>,
    /// Stream-ordered pools' reservations beyond their allocations.
    pub reserves: Mutex<crate::hooks::pool_reserve::Reserves>,
    /// What this process holds per GPU, to restore into a new slot if it ever loses its own.
    held: [AtomicU64; usage::MAX_GPUS],
    /// This process's pid as it sees it, recorded in its slots for reporting.
    pid: AtomicU32,
    /// Tells a forked child (by any fork) from the process that set it.
    mark: ForkMark,
}

/// Seconds of CLOCK_MONOTONIC_COARSE (read through the vDSO: no system call).
fn coarse_seconds() -> u64 {
    crate::process::clock_us(libc::CLOCK_MONOTONIC_COARSE) / 1_000_000
}

static SLICE: OnceLock<Option<Slice>> = OnceLock::new();

/// The slice, read on first use; None means pass-through.
pub fn get() -> Option<&'static Slice> {
    SLICE.get_or_init(load).as_ref()
}

fn load() -> Option<Slice> {
    crate::log::init();
    let paths = match container_limits(Path::new(CONTAINER_RUN_DIR)) {
        Some(paths) => paths,
        None => vec![PathBuf::from(std::env::var_os("GPUSLICE_LIMITS")?)],
    };
    let mut gpus = Vec::new();
    let mut parts = Vec::new();
    for path in &paths {
        let limits = std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|t| Limits::parse(&t).map_err(|e| e.to_string()))
            .and_then(|l| {
                if gpus.len() + l.gpus.len() > usage::MAX_GPUS {
                    Err(format!(
                        "{} GPUs with the slices before it, more than the {} a container may hold",
                        gpus.len() + l.gpus.len(),
                        usage::MAX_GPUS
                    ))
                } else {
                    Ok(l)
                }
            });
        let limits = match limits {
            Ok(l) => l,
            Err(e) => {
                log!(
                    "limits file {}: {e}; every allocation will fail",
                    path.display()
                );
                return Some(Slice::new(Vec::new(), Vec::new()));
            }
        };
        let region_path = path.with_file_name(usage::FILE_NAME);
        let region = match map_region(&region_path, limits.gpus.len()) {
            Ok(r) => Some(r),
            Err(e) => {
                log!(
                    "usage region {}: {e}; every allocation will fail",
                    region_path.display()
                );
                None
            }
        };
        log!(
            "container {}: {}",
            limits.container_id,
            limits
                .gpus
                .iter()
                .map(|g| format!("{} {} bytes", g.uuid, g.memory_bytes))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let locks = region.is_some().then(|| FileLocks::open(&region_path));
        parts.push(Part::new(gpus.len(), region, locks));
        add_to_earlier_parts(&mut gpus, &limits.gpus);
        gpus.extend(limits.gpus);
    }
    // SAFETY: registering plain extern "C" functions without arguments.
    unsafe {
        pthread_atfork(None, None, Some(after_fork_in_child));
        libc::atexit(at_exit);
    }
    Some(Slice::new(gpus, parts))
}

/// A part naming a GPU an earlier part names too (two claims on one card given to one
/// container, each admitted by the agent): its memory there is added to the earlier part's,
/// which that GPU's charges go to (the first part naming a GPU is the one its device is
/// found in), so the container gets the sum of both. The agent holds the container to the
/// same sum. The SM share there stays the earlier part's.
fn add_to_earlier_parts(earlier: &mut [GpuLimit], part: &[GpuLimit]) {
    for g in part {
        if let Some(e) = earlier
            .iter_mut()
            .find(|e| e.uuid.eq_ignore_ascii_case(&g.uuid))
        {
            e.memory_bytes = e.memory_bytes.saturating_add(g.memory_bytes);
            log!(
                "{} is in two slices: {} bytes there in all",
                g.uuid,
                e.memory_bytes
            );
        }
    }
}

/// The limits files of the container directories under `dir`, as the mount table shows them:
/// `dir` itself where it is mounted and holds a limits file or a usage region, else every
/// directory mounted right under it, in the order of their names; else `dir` where it holds a
/// limits file or a usage region all the same (a directory whose mount is not shown). None:
/// not in a container (on a node the agent's own run directory may be mounted there, empty
/// of both).
fn container_limits(dir: &Path) -> Option<Vec<PathBuf>> {
    // Outside a container there is usually no such directory: no mount table to read.
    dir.symlink_metadata().ok()?;
    let own = dir.join(limits::FILE_NAME).symlink_metadata().is_ok()
        || dir.join(usage::FILE_NAME).symlink_metadata().is_ok();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mounted = mounted_under(&mountinfo, dir);
    if own && mounted.iter().any(|m| m == dir) {
        return Some(vec![dir.join(limits::FILE_NAME)]);
    }
    mounted.retain(|m| m != dir && m.is_dir());
    if !mounted.is_empty() {
        return Some(mounted.iter().map(|m| m.join(limits::FILE_NAME)).collect());
    }
    own.then(|| vec![dir.join(limits::FILE_NAME)])
}

/// The mount points of `mountinfo` that are `dir` or right under it, sorted, once each.
fn mounted_under(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|point| PathBuf::from(unescape_mount_point(point)))
        .filter(|point| point == dir || point.parent() == Some(dir))
        .collect();
    found.sort();
    found.dedup();
    found
}

/// A mount point as the kernel writes it in mountinfo (space, tab, newline and backslash as
/// `\` and three octal digits).
fn unescape_mount_point(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push(
                    d.iter()
                        .fold(0u8, |v, c| v.wrapping_mul(8).wrapping_add(c - b'0')),
                );
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

unsafe extern "C" {
    fn pthread_atfork(
        prepare: Option<unsafe extern "C" fn()>,
        parent: Option<unsafe extern "C" fn()>,
        child: Option<unsafe extern "C" fn()>,
    ) -> libc::c_int;
}

/// A forked child has its own pid and holds none of its parent's device memory: it takes a
/// slot of its own when it first allocates ([`Slice::this_process`]). The fork mark's page is
/// wiped in every child by the kernel; this handler clears it too where it is not. Only an
/// atomic store here (no lock is safe after fork).
unsafe extern "C" fn after_fork_in_child() {
    if let Some(Some(s)) = SLICE.get() {
        s.mark.clear();
    }
}

/// Gives the slots back at exit, unless this is a forked child that never took one (its slot
/// indexes are its parent's).
extern "C" fn at_exit() {
    if let Some(Some(s)) = SLICE.get() {
        if s.mark.token() == 0 {
            return;
        }
        for p in &s.parts {
            let slot = p.slot.load(Ordering::SeqCst);
            if let (Some(r), Some(locks), true) = (&p.region, &p.locks, slot != NO_SLOT) {
                r.release(slot, locks);
            }
        }
    }
}

/// Opens the usage region, creating it (atomically, by link) where the agent has not, and maps it.
fn map_region(path: &Path, gpus: usize) -> Result<Region, String> {
    let open = || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
    };
    let file = match open() {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
            std::fs::write(&tmp, usage::new_region(gpus, usage::DEFAULT_SLOTS))
                .map_err(|e| format!("creating {}: {e}", tmp.display()))?;
            let linked = std::fs::hard_link(&tmp, path);
            let _ = std::fs::remove_file(&tmp);
            if let Err(e) = linked
                && e.kind() != std::io::ErrorKind::AlreadyExists
            {
                return Err(format!("creating: {e}"));
            }
            open().map_err(|e| e.to_string())?
        }
        Err(e) => return Err(e.to_string()),
    };
    let len = usize::try_from(file.metadata().map_err(|e| e.to_string())?.len())
        .map_err(|e| e.to_string())?;
    if len < usage::HEADER_SIZE {
        return Err(format!("{len} bytes, shorter than its header"));
    }
    // SAFETY: mapping `len` bytes of an open file shared; checked for MAP_FAILED below.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(format!("mmap: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: a fresh page-aligned shared mapping of `len` bytes, never unmapped, accessed
    // only through Region's atomics.
    let region = unsafe { Region::new(base.cast(), len) }.map_err(|e| format!("{e:?}"))?;
    if !crate::sigbus::protect(base.cast(), len) {
        return Err("more usage regions than this process guards".into());
    }
    let share_path = path.with_file_name(gpuslice_core::held::FILE_NAME);
    let share = match crate::driver_share::DriverShare::map(&share_path, gpus, region.slots()) {
        Ok(s) => Some(s),
        Err(e) => {
            if share_path.exists() {
                log!(
                    "{}: {e}; only the counters are charged",
                    share_path.display()
                );
            }
            None
        }
    };
    let region = region.with_driver_share(share);
    if region.gpus() < gpus {
        return Err(format!("counts {} GPUs, the limits {gpus}", region.gpus()));
    }
    Ok(region)
}

/// This process's start time (clock ticks since boot), recorded in its slot for reporting.
fn own_start_time() -> u64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| gpuslice_core::process::parse_start_time(&stat))
        .unwrap_or(0)
}

impl Slice {
    fn new(gpus: Vec<GpuLimit>, parts: Vec<Part>) -> Self {
        let mark = ForkMark::new();
        mark.renew();
        Self {
            paced: gpus.iter().any(|g| crate::pacing::is_share(g.cores)),
            gpus,
            parts,
            positions: [const { AtomicI32::new(0) }; ORDINALS],
            nvml_positions: Mutex::new(HashMap::new()),
            charges: Mutex::new(HashMap::new()),
            pools: Mutex::new(HashMap::new()),
            primary: Mutex::new(HashMap::new()),
            vmm: Mutex::new(crate::hooks::vmm::Mappings::default()),
            graphs: Mutex::new(crate::hooks::graph::Books::default()),
            reserves: Mutex::new(crate::hooks::pool_reserve::Reserves::default()),
            held: [const { AtomicU64::new(0) }; usage::MAX_GPUS],
            pid: AtomicU32::new(std::process::id()),
            mark,
        }
    }

    /// The part slice position `gpu` is in, and its position there.
    fn part(&self, gpu: usize) -> Option<(&Part, usize)> {
        if gpu >= self.gpus.len() {
            return None;
        }
        let part = self.parts.iter().rev().find(|p| p.first <= gpu)?;
        Some((part, gpu - part.first))
    }

    fn position_of_uuid(&self, uuid: &str) -> Option<usize> {
        self.gpus
            .iter()
            .position(|g| g.uuid.eq_ignore_ascii_case(uuid))
    }

    /// The slice position of CUDA device `dev`, or None where the container has no slice.
    pub fn position(&self, dev: CUdevice) -> Option<usize> {
        let cache = usize::try_from(dev)
            .ok()
            .and_then(|d| self.positions.get(d));
        if let Some(c) = cache {
            match c.load(Ordering::Relaxed) {
                0 => {}
                -1 => return None,
                p => return usize::try_from(p - 1).ok(),
            }
        }
        let found = cuda_uuid(dev).and_then(|u| self.position_of_uuid(&u));
        if let Some(c) = cache {
            c.store(found.map_or(-1, |p| p as i32 + 1), Ordering::Relaxed);
        }
        found
    }

    /// The slice position of an NVML device handle.
    pub fn nvml_position(&self, dev: nvmlDevice_t) -> Option<usize> {
        let key = dev as usize;
        if let Some(p) = self.nvml_positions.lock().ok()?.get(&key) {
            return *p;
        }
        let found = nvml_uuid(dev).and_then(|u| self.position_of_uuid(&u));
        self.nvml_positions.lock().ok()?.insert(key, found);
        found
    }

    /// The container's processes that use the driver (this one included), as NVML names them
    /// ([`Region::pids`]).
    pub fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = Vec::new();
        for p in self.parts.iter().filter_map(|p| p.region.as_ref()) {
            for pid in p.pids() {
                if !pids.contains(&pid) {
                    pids.push(pid);
                }
            }
        }
        // A process without a slot yet is named by its own pid (right outside a container).
        let me = std::process::id();
        if !pids.contains(&me) {
            pids.push(me);
        }
        pids
    }

    /// The device of the calling thread's current context.
    pub fn current_device(&self) -> Result<CUdevice, CUresult> {
        let f = real::cuCtxGetDevice().ok_or(CUDA_ERROR_NOT_FOUND)?;
        let mut dev: CUdevice = 0;
        // SAFETY: cuCtxGetDevice writes one CUdevice.
        match unsafe { f(&raw mut dev) } {
            CUDA_SUCCESS => Ok(dev),
            e => Err(e),
        }
    }

    /// This process's token. In a child forked since the token was set (by any fork, the raw
    /// system call included), the first call starts the child's own books: no slot, nothing
    /// held, its own pid, its own descriptor for the slot locks.
    pub fn this_process(&self) -> u64 {
        let token = self.mark.token();
        if token != 0 {
            return token;
        }
        let (token, mine) = self.mark.renew();
        if mine {
            self.pid.store(std::process::id(), Ordering::SeqCst);
            for h in &self.held {
                h.store(0, Ordering::SeqCst);
            }
            for p in &self.parts {
                p.slot.store(NO_SLOT, Ordering::SeqCst);
                if let Some(l) = &p.locks {
                    l.reopen();
                }
            }
        }
        token
    }

    fn my_slot(&self, part: &Part, region: &Region, locks: &FileLocks) -> Option<usize> {
        let pid = self.pid.load(Ordering::SeqCst);
        let slot = part.slot.load(Ordering::SeqCst);
        if slot != NO_SLOT && region.owns(slot, pid) {
            return Some(slot);
        }
        let slot = region.claim(pid, own_start_time(), locks).ok()?;
        if part.slot.swap(slot, Ordering::SeqCst) != NO_SLOT {
            // The old slot was rewritten under us: carry what we hold over.
            let held = self.held.iter().skip(part.first).take(region.gpus());
            for (g, h) in held.enumerate() {
                let _ = region.charge(slot, g, h.load(Ordering::SeqCst), u64::MAX, locks);
            }
        }
        Some(slot)
    }

    /// Charges `bytes` on slice position `gpu` if the container stays within its limit.
    pub fn charge(&self, gpu: usize, bytes: u64) -> bool {
        self.this_process();
        let Some(((part, local), limit)) = self.part(gpu).zip(self.gpus.get(gpu)) else {
            return false;
        };
        let (Some(region), Some(locks)) = (&part.region, &part.locks) else {
            return false;
        };
        if crate::sigbus::region_lost() {
            log!("the usage region was truncated under this process; every allocation fails");
            return false;
        }
        let Some(slot) = self.my_slot(part, region, locks) else {
            log!("no free slot in the usage region");
            return false;
        };
        // Near the limit, what the driver took since the agent's last sample must be in the
        // total first.
        if let Some(share) = region.driver_share() {
            share.checking();
            if region
                .total(local)
                .saturating_add(bytes)
                .saturating_add(crate::driver_share::NEAR)
                > limit.memory_bytes
            {
                share.fresh_sample();
            }
            share.charging();
        }
        if region.charge(slot, local, bytes, limit.memory_bytes, locks) {
            self.held[gpu].fetch_add(bytes, Ordering::SeqCst);
            true
        } else {
            log!(
                "refused {bytes} bytes on {}: {} of {} in use",
                limit.uuid,
                region.total(local),
                limit.memory_bytes
            );
            false
        }
    }

    /// Charges `bytes` on slice position `gpu` whatever the limit: memory the driver holds
    /// already, which the next allocation must find in the total.
    pub fn charge_anyway(&self, gpu: usize, bytes: u64) {
        self.this_process();
        if let Some((part, local)) = self.part(gpu)
            && let (Some(region), Some(locks)) = (&part.region, &part.locks)
            && let Some(slot) = self.my_slot(part, region, locks)
            && region.charge(slot, local, bytes, u64::MAX, locks)
        {
            self.held[gpu].fetch_add(bytes, Ordering::SeqCst);
        }
    }

    pub fn refund(&self, gpu: usize, bytes: u64) {
        self.this_process();
        let Some((part, local)) = self.part(gpu) else {
            return;
        };
        let slot = part.slot.load(Ordering::SeqCst);
        if let (Some(region), true) = (&part.region, slot != NO_SLOT) {
            region.refund(slot, local, bytes);
            let _ = self.held[gpu].fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                Some(v.saturating_sub(bytes))
            });
        }
    }

    /// Bytes the container holds on position `gpu`. Dead processes' slots are reaped first,
    /// at most once a second here (reaping tries every other slot's lock, a system call
    /// each; programs may ask for memory info often). An allocation that meets the limit
    /// always reaps.
    pub fn used(&self, gpu: usize) -> u64 {
        let Some((part, local)) = self.part(gpu) else {
            return 0;
        };
        match &part.region {
            Some(r) => {
                self.reap_now_and_then(part, r);
                r.total(local)
            }
            None => 0,
        }
    }

    /// Reaps dead processes' slots of a part, at most once a second.
    fn reap_now_and_then(&self, part: &Part, r: &Region) {
        let now = coarse_seconds();
        let last = part.last_reap.load(Ordering::Relaxed);
        if (last == 0 || now > last)
            && part
                .last_reap
                .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            && let Some(locks) = &part.locks
        {
            self.this_process();
            let slot = part.slot.load(Ordering::SeqCst);
            r.reap((slot != NO_SLOT).then_some(slot), locks);
        }
    }

    /// Takes one of the container's `most` places for launches queued on slice position
    /// `gpu` ([`crate::queued`]): false while its processes hold them all (a dead process's
    /// are reaped, at most once a second). True where there is no region to count in: the
    /// process's own bound still holds.
    pub fn take_queued(&self, gpu: usize, most: u64) -> bool {
        self.this_process();
        let Some((part, local)) = self.part(gpu) else {
            return true;
        };
        let (Some(region), Some(locks)) = (&part.region, &part.locks) else {
            return true;
        };
        if crate::sigbus::region_lost() {
            return true;
        }
        let Some(slot) = self.my_slot(part, region, locks) else {
            return true;
        };
        if region.take_queued(slot, local, most) {
            return true;
        }
        self.reap_now_and_then(part, region);
        false
    }

    /// The container's places for launches queued on slice position `gpu` that are taken (0
    /// where there is no region to count in).
    pub fn queued_total(&self, gpu: usize) -> u64 {
        match self.part(gpu) {
            Some((part, local)) if !crate::sigbus::region_lost() => {
                part.region.as_ref().map_or(0, |r| r.queued_total(local))
            }
            _ => 0,
        }
    }

    /// Gives back a place [`Slice::take_queued`] took: its launch finished, or never went.
    pub fn give_queued(&self, gpu: usize) {
        self.this_process();
        let Some((part, local)) = self.part(gpu) else {
            return;
        };
        let slot = part.slot.load(Ordering::SeqCst);
        if let (Some(region), true) = (&part.region, slot != NO_SLOT)
            && !crate::sigbus::region_lost()
        {
            region.give_queued(slot, local);
        }
    }

    pub fn limit(&self, gpu: usize) -> u64 {
        self.gpus.get(gpu).map_or(0, |g| g.memory_bytes)
    }

    pub fn context_bytes(&self, gpu: usize) -> u64 {
        self.gpus.get(gpu).map_or(0, |g| g.context_bytes)
    }

    pub fn record(&self, kind: Kind, key: u64, gpu: usize, bytes: u64) {
        self.record_in(kind, key, gpu, bytes, 0);
    }

    /// Records a charge the driver frees with context `ctx` (0: none) if it is not freed first.
    pub fn record_in(&self, kind: Kind, key: u64, gpu: usize, bytes: u64, ctx: usize) {
        let charge = Charge {
            gpu,
            bytes,
            owner: self.this_process(),
            ctx,
        };
        if let Ok(mut m) = self.charges.lock() {
            m.insert((kind, key), charge);
        }
    }

    /// The calling thread's current context (as an address; 0 for none).
    pub fn current_context(&self) -> usize {
        let Some(f) = real::cuCtxGetCurrent() else {
            return 0;
        };
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: cuCtxGetCurrent writes one handle.
        if unsafe { f(&raw mut ctx) } != CUDA_SUCCESS {
            return 0;
        }
        ctx as usize
    }

    /// Context `ctx` was destroyed: what this process allocated in it was freed with it, so
    /// its charges go back.
    pub fn forget_context(&self, ctx: usize) {
        if ctx == 0 {
            return;
        }
        let me = self.this_process();
        let gone: Vec<Charge> = match self.charges.lock() {
            Ok(mut m) => {
                let mut gone = Vec::new();
                m.retain(|_, c| {
                    let freed = c.ctx == ctx && c.owner == me;
                    if freed {
                        gone.push(*c);
                    }
                    !freed
                });
                gone
            }
            Err(_) => return,
        };
        for c in gone {
            self.refund(c.gpu, c.bytes);
        }
    }

    /// Takes the charge of a pointer or handle out of the books (None: not charged here).
    pub fn take(&self, kind: Kind, key: u64) -> Option<Charge> {
        self.charges.lock().ok()?.remove(&(kind, key))
    }

    /// Puts a charge back (the driver refused to free it).
    pub fn put_back(&self, kind: Kind, key: u64, charge: Charge) {
        if let Ok(mut m) = self.charges.lock() {
            m.insert((kind, key), charge);
        }
    }

    /// Whether this process holds a context of its own (not the primary one) on `gpu`.
    pub fn has_own_context(&self, gpu: usize) -> bool {
        let me = self.this_process();
        self.charges.lock().is_ok_and(|m| {
            m.iter()
                .any(|((k, _), c)| *k == Kind::Context && c.gpu == gpu && c.owner == me)
        })
    }

    /// The driver freed everything this process had on `gpu` (its only context there was
    /// destroyed): its counters there go to zero and its books forget what they held there.
    pub fn forget_gpu(&self, gpu: usize) {
        let me = self.this_process();
        if let Ok(mut m) = self.charges.lock() {
            m.retain(|_, c| c.gpu != gpu || c.owner != me);
        }
        if let Ok(mut r) = self.reserves.lock() {
            r.forget(gpu);
        }
        if let Ok(mut g) = self.graphs.lock() {
            g.forget(gpu);
        }
        if let Ok(mut v) = self.vmm.lock() {
            v.forget(gpu);
        }
        if let Some(held) = self.held.get(gpu) {
            self.refund(gpu, held.load(Ordering::SeqCst));
        }
    }

    /// Gives a freed charge back, if this process is the one that was charged.
    pub fn settle(&self, charge: Charge) {
        if charge.owner == self.this_process() {
            self.refund(charge.gpu, charge.bytes);
        }
    }
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as NVML writes it, from the driver's bytes.
fn cuda_uuid(dev: CUdevice) -> Option<String> {
    let f = real::cuDeviceGetUuid_v2().or_else(real::cuDeviceGetUuid)?;
    let mut u = CUuuid { bytes: [0; 16] };
    // SAFETY: cuDeviceGetUuid writes one CUuuid.
    if unsafe { f(&raw mut u, dev) } != CUDA_SUCCESS {
        return None;
    }
    let h: String = u.bytes.iter().map(|b| format!("{b:02x}")).collect();
    Some(format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    ))
}

fn nvml_uuid(dev: nvmlDevice_t) -> Option<String> {
    let f = real::nvmlDeviceGetUUID()?;
    let mut buf = [0 as std::ffi::c_char; 96];
    // SAFETY: nvmlDeviceGetUUID writes a NUL-terminated string of at most `len` bytes.
    if unsafe { f(dev, buf.as_mut_ptr(), buf.len() as u32) } != NVML_SUCCESS {
        return None;
    }
    // SAFETY: NUL-terminated within the buffer on success.
    let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Some(s.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 0:21 / / rw,relatime - overlay overlay rw
31 22 0:40 /gpuslice/dra-b-0 /run/gpuslice/dra-b-0 ro,nosuid,nodev,noexec - tmpfs tmpfs rw
32 31 0:40 /gpuslice/dra-b-0/usage /run/gpuslice/dra-b-0/usage rw,nosuid,nodev,noexec - tmpfs tmpfs rw
33 22 0:40 /gpuslice/dra-a-0 /run/gpuslice/dra-a-0 ro,nosuid,nodev,noexec - tmpfs tmpfs rw
34 22 0:40 /gpuslice/x /run/gpuslice-other ro - tmpfs tmpfs rw
35 22 0:40 /gpuslice/y /run/gpuslice/with\\040space ro - tmpfs tmpfs rw
";

    #[test]
    fn a_gpu_a_later_part_names_again_gets_its_memory_added_to_the_earlier_part() {
        let limit = |uuid: &str, memory_bytes| GpuLimit {
            uuid: uuid.into(),
            memory_bytes,
            cores: 30,
            context_bytes: 0,
            window: None,
        };
        let mut gpus = vec![limit("GPU-a", 100), limit("GPU-b", 10)];
        let part = [limit("gpu-A", 50), limit("GPU-c", 7)];
        add_to_earlier_parts(&mut gpus, &part);
        let memory: Vec<u64> = gpus.iter().map(|g| g.memory_bytes).collect();
        assert_eq!(memory, [150, 10]);
        assert_eq!(gpus[0].cores, 30, "the SM share stays the earlier part's");
    }

    #[test]
    fn every_directory_mounted_right_under_the_run_directory_is_a_part_in_name_order() {
        let found = mounted_under(MOUNTINFO, Path::new("/run/gpuslice"));
        assert_eq!(
            found,
            [
                "/run/gpuslice/dra-a-0",
                "/run/gpuslice/dra-b-0",
                "/run/gpuslice/with space"
            ]
            .map(PathBuf::from)
        );
    }

    #[test]
    fn the_run_directory_mounted_itself_is_found_as_itself() {
        let one = "40 22 0:40 /gpuslice/web /run/gpuslice ro - tmpfs tmpfs rw\n\
                   41 40 0:40 /gpuslice/web/usage /run/gpuslice/usage rw - tmpfs tmpfs rw\n";
        let found = mounted_under(one, Path::new("/run/gpuslice"));
        assert!(found.contains(&PathBuf::from("/run/gpuslice")), "{found:?}");
    }

    #[test]
    fn mount_points_are_unescaped_as_the_kernel_escapes_them() {
        assert_eq!(unescape_mount_point(r"/a\040b\011c\134d"), "/a b\tc\\d");
        assert_eq!(unescape_mount_point(r"/plain\0x"), r"/plain\0x");
    }
}
