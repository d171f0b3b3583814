//! Per-process records of the simulated driver: `<state_dir>/procs/<pid>`, rewritten by the
//! fake libcuda whenever the process's device memory changes or it launches a kernel, read
//! by the fake NVML to answer "running compute processes", "memory used" and "process
//! utilization" across processes.
//!
//! Record layout (little-endian): magic `GSIMPRC3` (8), pid (u64) in the writer's PID
//! namespace, start time in clock ticks (u64), the inode of that PID namespace (u64), bytes
//! held on each GPU index (64 × u64), then for each GPU index the instant the last launched
//! kernel ends and, for each of the last [`BUSY_PERIODS`] periods of the driver's utilization
//! sampling (a ring by period index), the index and the kernel time that falls in it:
//! 64 × (1 + 2 × 32) × u64, nanoseconds of CLOCK_MONOTONIC.
//! Records are named `<namespace inode>-<pid>`. A process that takes device memory through
//! the graphics driver (OpenGL, Vulkan) rather than CUDA has a record of its own, of the same
//! layout under the magic `GSIMGFX5`, named `<namespace inode>-<pid>-graphics`: NVML lists it
//! among the graphics processes, not the compute ones (`gpuslice-simnode hold-graphics`
//! writes one, standing in for such a program).
//!
//! The real driver knows every process by its kernel identity; a process in a container knows
//! only its pid in its own namespace. A reader translates: a record of its own namespace is
//! checked against its `/proc`; one of another namespace is found by scanning its `/proc` for
//! the process whose innermost namespace and pid (`/proc/<p>/ns/pid`, the last `NSpid`) are
//! the record's. NVML names processes by their host pids wherever it is asked
//! ([`nvml_view`]), as the real driver, which knows nothing of PID namespaces, does.
//! A record whose process is gone is ignored and removed by the next process that can tell
//! (its own namespace's processes, any process that sees that namespace, or any process of
//! the host's initial namespace, which sees them all); a record a reader cannot see at all
//! (a sibling container's) still counts as memory in use, as on a real GPU.

use std::path::{Path, PathBuf};

pub const MAGIC: &[u8; 8] = b"GSIMPRC5";
/// The magic of a graphics process's record.
pub const GRAPHICS_MAGIC: &[u8; 8] = b"GSIMGFX5";
pub const MAX_GPUS: usize = 64;
const NS_AT: usize = 24;
const USED_AT: usize = 32;
const BUSY_AT: usize = USED_AT + MAX_GPUS * 8;
/// Sampling periods of kernel time kept per GPU: more than a full queue of launches spans.
pub const BUSY_PERIODS: usize = 32;
const BUSY_SIZE: usize = 8 + BUSY_PERIODS * 16;
pub const RECORD_SIZE: usize = BUSY_AT + MAX_GPUS * BUSY_SIZE;

/// A process's kernel time on one GPU: when its last queued kernel ends, and how much of its
/// kernels' time falls in each sampling period (by period index, in a ring), as the device
/// runs them: a kernel queued behind other processes' kernels starts when they end, so its
/// time is put in the periods it will run in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy {
    pub until_ns: u64,
    /// (period index, kernel time in it), at index `period % BUSY_PERIODS`.
    pub periods: [(u64, u64); BUSY_PERIODS],
}

impl Default for Busy {
    fn default() -> Self {
        Self {
            until_ns: 0,
            periods: [(0, 0); BUSY_PERIODS],
        }
    }
}

impl Busy {
    /// Queues a kernel of `ns` at `now_ns`: it starts when the previous one ends. With a
    /// sampling `period_ns`, its time is put in the periods it runs in.
    pub fn launch(&mut self, now_ns: u64, ns: u64, period_ns: u64) {
        self.launch_after(now_ns, 0, ns, period_ns);
    }

    /// As [`Busy::launch`], the kernel starting no earlier than `not_before_ns` (when the
    /// device is done with the kernels other processes queued before it).
    pub fn launch_after(&mut self, now_ns: u64, not_before_ns: u64, ns: u64, period_ns: u64) {
        let start = self.until_ns.max(now_ns).max(not_before_ns);
        let end = start.saturating_add(ns);
        self.until_ns = end;
        let Some(first) = start.checked_div(period_ns) else {
            return;
        };
        // Periods further ahead than the ring holds get what is left in the last one.
        let last = (end.saturating_sub(1) / period_ns).min(first + BUSY_PERIODS as u64 - 1);
        for p in first..=last {
            let from = start.max(p * period_ns);
            let to = if p == last {
                end
            } else {
                end.min((p + 1) * period_ns)
            };
            let slot = &mut self.periods[(p % BUSY_PERIODS as u64) as usize];
            if slot.0 != p {
                *slot = (p, 0);
            }
            slot.1 = slot.1.saturating_add(to.saturating_sub(from));
        }
    }

    /// Kernel time in period `p` (`p × period ≤ t < (p + 1) × period`), 0 where the ring no
    /// longer holds it.
    #[must_use]
    pub fn in_period(&self, p: u64) -> u64 {
        let slot = self.periods[(p % BUSY_PERIODS as u64) as usize];
        if slot.0 == p { slot.1 } else { 0 }
    }
}

/// One live process's device memory and kernel time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcUsage {
    /// The pid the reader knows the process by.
    pub pid: u32,
    pub start_time: u64,
    /// The process's own PID namespace and its pid there: who wrote the record.
    pub writer: (u64, u32),
    pub used: Vec<u64>,
    pub busy: Vec<Busy>,
    /// Memory taken through the graphics driver: NVML lists it as a graphics process.
    pub graphics: bool,
}

#[must_use]
pub fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("procs")
}

#[must_use]
pub fn record_path(state_dir: &Path, pidns: u64, pid: u32) -> PathBuf {
    dir(state_dir).join(format!("{pidns}-{pid}"))
}

/// Where a graphics process's record is.
#[must_use]
pub fn graphics_record_path(state_dir: &Path, pidns: u64, pid: u32) -> PathBuf {
    dir(state_dir).join(format!("{pidns}-{pid}-graphics"))
}

/// Writes this process's graphics record: `bytes` held on GPU `index`, no kernel time.
/// Written whole (to a temporary file renamed into place).
pub fn write_graphics(state_dir: &Path, index: usize, bytes: u64) -> std::io::Result<PathBuf> {
    let pid = std::process::id();
    let start = process_start_time(Path::new("/proc"), pid).unwrap_or(0);
    let mut used = [0u64; MAX_GPUS];
    *used
        .get_mut(index)
        .ok_or(std::io::ErrorKind::InvalidInput)? = bytes;
    let mut record = encode(
        (own_pidns(), pid),
        start,
        &used,
        &[Busy::default(); MAX_GPUS],
    );
    record[0..8].copy_from_slice(GRAPHICS_MAGIC);
    let path = graphics_record_path(state_dir, own_pidns(), pid);
    std::fs::create_dir_all(dir(state_dir))?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, record)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// The inode of the host's initial PID namespace (the kernel's `PROC_PID_INIT_INO`).
pub const INITIAL_PIDNS: u64 = 0xEFFF_FFFC;

/// The inode of this process's PID namespace.
#[must_use]
pub fn own_pidns() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

#[must_use]
pub fn encode(
    (pidns, pid): (u64, u32),
    start_time: u64,
    used: &[u64; MAX_GPUS],
    busy: &[Busy; MAX_GPUS],
) -> [u8; RECORD_SIZE] {
    let mut buf = [0u8; RECORD_SIZE];
    buf[0..8].copy_from_slice(MAGIC);
    buf[8..16].copy_from_slice(&u64::from(pid).to_le_bytes());
    buf[16..24].copy_from_slice(&start_time.to_le_bytes());
    buf[NS_AT..NS_AT + 8].copy_from_slice(&pidns.to_le_bytes());
    let (offset, bytes) = encode_used(used);
    buf[offset..offset + bytes.len()].copy_from_slice(&bytes);
    for (i, b) in busy.iter().enumerate() {
        let (offset, bytes) = encode_busy(i, b);
        buf[offset..offset + BUSY_SIZE].copy_from_slice(&bytes);
    }
    buf
}

/// Where the bytes held on each GPU sit in a record, and theirs (to write them alone: a
/// record is written whole once, then in parts, so that an allocation rewrites 512 bytes).
#[must_use]
pub fn encode_used(used: &[u64; MAX_GPUS]) -> (usize, [u8; MAX_GPUS * 8]) {
    let mut b = [0u8; MAX_GPUS * 8];
    for (i, u) in used.iter().enumerate() {
        b[8 * i..8 * i + 8].copy_from_slice(&u.to_le_bytes());
    }
    (USED_AT, b)
}

/// Where GPU `index`'s kernel time sits in a record, and its bytes (to write it alone).
#[must_use]
pub fn encode_busy(index: usize, busy: &Busy) -> (usize, [u8; BUSY_SIZE]) {
    let mut b = [0u8; BUSY_SIZE];
    let words = std::iter::once(busy.until_ns).chain(busy.periods.iter().flat_map(|p| [p.0, p.1]));
    for (k, w) in words.enumerate() {
        b[8 * k..8 * k + 8].copy_from_slice(&w.to_le_bytes());
    }
    (BUSY_AT + BUSY_SIZE * index, b)
}

/// How much of each record a reader needs: who and how much memory (the head, a sixtieth of
/// a record: what every memory figure reads), or also the kernel time (what utilization
/// reads).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    Memory,
    All,
}

impl Part {
    fn bytes(self) -> usize {
        match self {
            Self::Memory => BUSY_AT,
            Self::All => RECORD_SIZE,
        }
    }
}

/// A record's first `part` (`busy` left empty for [`Part::Memory`]).
fn decode(buf: &[u8], part: Part) -> Option<ProcUsage> {
    if buf.len() < part.bytes() {
        return None;
    }
    let graphics = &buf[0..8] == GRAPHICS_MAGIC;
    if &buf[0..8] != MAGIC && !graphics {
        return None;
    }
    let word = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&buf[at..at + 8]);
        u64::from_le_bytes(b)
    };
    let pid = u32::try_from(word(8)).ok()?;
    Some(ProcUsage {
        pid,
        start_time: word(16),
        writer: (word(NS_AT), pid),
        used: (0..MAX_GPUS).map(|i| word(USED_AT + 8 * i)).collect(),
        busy: (0..if part == Part::All { MAX_GPUS } else { 0 })
            .map(|i| {
                let at = |k: usize| word(BUSY_AT + BUSY_SIZE * i + 8 * k);
                Busy {
                    until_ns: at(0),
                    periods: std::array::from_fn(|p| (at(1 + 2 * p), at(2 + 2 * p))),
                }
            })
            .collect(),
        graphics,
    })
}

/// Nanoseconds of CLOCK_MONOTONIC, the clock every process's kernel times are on.
#[must_use]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec.
    #[allow(unsafe_code)]
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts)
    };
    u64::try_from(ts.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(ts.tv_nsec).unwrap_or(0))
}

/// What a reader can tell of a record's process.
enum Seen {
    /// Alive, known to the reader by this pid.
    Alive(u32),
    Gone,
    /// In a namespace the reader cannot see (a sibling container's): alive as far as it
    /// can tell.
    Hidden,
}

/// How a reader finds processes of other PID namespaces: (namespace inode, pid there) →
/// its own pid, scanned from its `/proc` once, when first needed.
struct Translator {
    own: u64,
    others: Option<std::collections::HashMap<(u64, u32), u32>>,
}

impl Translator {
    fn new() -> Self {
        Self {
            own: own_pidns(),
            others: None,
        }
    }

    fn scan() -> std::collections::HashMap<(u64, u32), u32> {
        use std::os::unix::fs::MetadataExt;
        let mut map = std::collections::HashMap::new();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return map;
        };
        for e in entries.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(ns) = std::fs::metadata(e.path().join("ns/pid")).map(|m| m.ino()) else {
                continue;
            };
            let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
                continue;
            };
            let inner = status
                .lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .and_then(|l| l.split_whitespace().last())
                .and_then(|v| v.parse::<u32>().ok());
            if let Some(inner) = inner {
                map.insert((ns, inner), p);
            }
        }
        map
    }

    fn see(&mut self, p: &ProcUsage) -> Seen {
        let (ns, pid) = p.writer;
        let proc_root = Path::new("/proc");
        if ns == self.own {
            return if process_start_time(proc_root, pid) == Some(p.start_time) {
                Seen::Alive(pid)
            } else {
                Seen::Gone
            };
        }
        let own = self.own;
        let map = self.others.get_or_insert_with(Self::scan);
        if let Some(&mine) = map.get(&(ns, pid))
            && process_start_time(proc_root, mine) == Some(p.start_time)
        {
            return Seen::Alive(mine);
        }
        // Gone if the reader sees that namespace (or sees every namespace).
        if own == INITIAL_PIDNS || map.keys().any(|(n, _)| *n == ns) {
            Seen::Gone
        } else {
            Seen::Hidden
        }
    }
}

fn records(state_dir: &Path, part: Part) -> Vec<(PathBuf, Option<ProcUsage>)> {
    use std::io::Read;
    let Ok(entries) = std::fs::read_dir(dir(state_dir)) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| {
            let mut buf = Vec::with_capacity(part.bytes());
            let read = std::fs::File::open(e.path())
                .and_then(|f| f.take(part.bytes() as u64).read_to_end(&mut buf));
            let usage = read.ok().and_then(|_| decode(&buf, part));
            (e.path(), usage)
        })
        .collect()
}

/// Records of processes that are alive and that this process can see, each with the pid it
/// knows the process by.
#[must_use]
pub fn live(state_dir: &Path) -> Vec<ProcUsage> {
    let mut t = Translator::new();
    let mut out: Vec<ProcUsage> = records(state_dir, Part::All)
        .into_iter()
        .filter_map(|(_, p)| p)
        .filter_map(|mut p| match t.see(&p) {
            Seen::Alive(pid) => {
                p.pid = pid;
                Some(p)
            }
            Seen::Gone | Seen::Hidden => None,
        })
        .collect();
    out.sort_by_key(|p| p.pid);
    out
}

/// Where the host pid of a process of another PID namespace is kept, once a reader of the
/// host's namespace has found it: `<state_dir>/hostpids/<namespace inode>-<pid>`, holding
/// `<host pid> <start time>`.
fn host_pid_path(state_dir: &Path, (ns, pid): (u64, u32)) -> PathBuf {
    state_dir.join("hostpids").join(format!("{ns}-{pid}"))
}

/// The processes as the real NVML lists them, by their host pids: the driver knows nothing of
/// PID namespaces, so a reader inside a container is given host pids too, including those of
/// processes it cannot see (other containers'). The simulated driver learns a process's host
/// pid when a reader in the host's namespace first lists it (the agent, `nvidia-smi` on the
/// host) and keeps it for the others; until then a reader inside a container is given the pid
/// it knows the process by, and a process it cannot see is left out.
/// Memory only: `busy` is left empty ([`nvml_view_with_kernel_time`] reads it too).
#[must_use]
pub fn nvml_view(state_dir: &Path) -> Vec<ProcUsage> {
    view(state_dir, Part::Memory)
}

/// [`nvml_view`] with each process's kernel time.
#[must_use]
pub fn nvml_view_with_kernel_time(state_dir: &Path) -> Vec<ProcUsage> {
    view(state_dir, Part::All)
}

fn view(state_dir: &Path, part: Part) -> Vec<ProcUsage> {
    let mut t = Translator::new();
    let on_host = t.own == INITIAL_PIDNS;
    let mut out = Vec::new();
    for p in records(state_dir, part).into_iter().filter_map(|(_, p)| p) {
        let seen = t.see(&p);
        let known = std::fs::read_to_string(host_pid_path(state_dir, p.writer))
            .ok()
            .and_then(|text| {
                let (pid, start) = text.trim().split_once(' ')?;
                (start.parse::<u64>().ok()? == p.start_time).then(|| pid.parse::<u32>().ok())?
            });
        let pid = match seen {
            Seen::Gone => continue,
            Seen::Alive(pid) if on_host => {
                if p.writer.0 != INITIAL_PIDNS && known != Some(pid) {
                    let path = host_pid_path(state_dir, p.writer);
                    let _ = std::fs::create_dir_all(path.parent().unwrap_or(state_dir));
                    let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
                    if std::fs::write(&tmp, format!("{pid} {}", p.start_time)).is_ok() {
                        let _ = std::fs::rename(&tmp, &path);
                    }
                }
                pid
            }
            Seen::Alive(pid) => known.unwrap_or(pid),
            Seen::Hidden => match known {
                Some(pid) => pid,
                None => continue,
            },
        };
        out.push(ProcUsage { pid, ..p });
    }
    out.sort_by_key(|p| p.pid);
    out
}

/// Records of every process that holds device memory as far as this process can tell: those
/// it sees alive and those it cannot see at all.
#[must_use]
pub fn holding(state_dir: &Path) -> Vec<ProcUsage> {
    let mut t = Translator::new();
    records(state_dir, Part::Memory)
        .into_iter()
        .filter_map(|(_, p)| p)
        .filter(|p| !matches!(t.see(p), Seen::Gone))
        .collect()
}

/// Removes records of processes that are gone. A record that cannot be read whole is being
/// written by a process starting right now: it is removed only if its file names a pid of
/// this namespace that no process has (removing it from under a live process would hide that
/// process from every other one for good).
pub fn remove_stale(state_dir: &Path) {
    let mut t = Translator::new();
    let own = t.own;
    let proc_root = Path::new("/proc");
    for (path, usage) in records(state_dir, Part::Memory) {
        let gone = match usage {
            Some(p) => matches!(t.see(&p), Seen::Gone),
            None => path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.split_once('-'))
                .and_then(|(ns, pid)| Some((ns.parse::<u64>().ok()?, pid.parse::<u32>().ok()?)))
                .is_some_and(|(ns, pid)| ns == own && process_start_time(proc_root, pid).is_none()),
        };
        if gone {
            let _ = std::fs::remove_file(&path);
            if let Some(name) = path.file_name() {
                let _ = std::fs::remove_file(state_dir.join("hostpids").join(name));
            }
        }
    }
}

/// Bytes held on GPU `index` by every process holding memory.
#[must_use]
pub fn used_on(state_dir: &Path, index: usize) -> u64 {
    holding(state_dir)
        .iter()
        .map(|p| p.used.get(index).copied().unwrap_or(0))
        .sum()
}

/// The start time of `pid` in clock ticks since boot (`<proc_root>/<pid>/stat`), or `None`
/// when no such process exists or it has exited (a zombie, not reaped yet: the real driver
/// frees a process's memory when it exits, as its descriptors close, not when it is reaped).
#[must_use]
pub fn process_start_time(proc_root: &Path, pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    let state = stat[stat.rfind(')')? + 1..].split_whitespace().next()?;
    if matches!(state, "Z" | "X") {
        return None;
    }
    gpuslice_core::process::parse_start_time(&stat)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_run_back_to_back_and_their_time_falls_in_the_periods_they_run_in() {
        // Period 1000: [0, 1000), [1000, 2000)...
        let mut b = Busy::default();
        b.launch(1_500, 800, 1_000); // runs 1500..2300
        b.launch(2_100, 400, 1_000); // queued: 2300..2700
        b.launch(5_000, 100, 1_000); // idle in between: 5000..5100
        assert_eq!(b.until_ns, 5_100);
        assert_eq!(
            (0..6).map(|p| b.in_period(p)).collect::<Vec<_>>(),
            [0, 500, 700, 0, 0, 100]
        );
        let record = encode((4_026_532_000, 7), 11, &[0; MAX_GPUS], &{
            let mut all = [Busy::default(); MAX_GPUS];
            all[3] = b;
            all
        });
        let p = decode(&record, Part::All).unwrap();
        assert_eq!(
            (p.pid, p.writer, p.start_time, p.busy[3]),
            (7, (4_026_532_000, 7), 11, b)
        );
        // A memory reader needs only the record's head.
        let head = decode(&record[..BUSY_AT], Part::Memory).unwrap();
        assert_eq!((head.pid, head.used, head.busy), (p.pid, p.used, vec![]));
        assert!(decode(&record[..BUSY_AT], Part::All).is_none());
    }

    #[test]
    fn a_kernel_queued_behind_another_process_runs_when_the_device_is_free() {
        let mut b = Busy::default();
        // Launched at 100, the device busy with others' kernels until 1800.
        b.launch_after(100, 1_800, 400, 1_000);
        assert_eq!(
            (b.in_period(0), b.in_period(1), b.in_period(2)),
            (0, 200, 200)
        );
        assert_eq!(b.until_ns, 2_200);
    }

    #[test]
    fn the_ring_forgets_periods_long_past_and_folds_those_too_far_ahead() {
        let mut b = Busy::default();
        b.launch(0, 500, 1_000);
        let far = BUSY_PERIODS as u64 * 1_000;
        b.launch(far, 100, 1_000);
        assert_eq!(b.in_period(0), 0, "overwritten by period {BUSY_PERIODS}");
        assert_eq!(b.in_period(BUSY_PERIODS as u64), 100);
        // A kernel longer than the ring: the rest lands in its last period.
        let mut long = Busy::default();
        long.launch(0, (BUSY_PERIODS as u64 + 10) * 1_000, 1_000);
        assert_eq!(long.in_period(0), 1_000);
        assert_eq!(long.in_period(BUSY_PERIODS as u64 - 1), 11_000);
    }

    #[test]
    fn a_record_still_being_written_by_a_live_process_is_not_removed() {
        let state = tempfile_dir();
        std::fs::create_dir_all(dir(&state)).unwrap();
        let (ns, me) = (own_pidns(), std::process::id());
        // Created, not yet written: what another process sees while this one starts.
        std::fs::write(record_path(&state, ns, me), b"").unwrap();
        // No process has this pid (above the kernel's pid_max).
        std::fs::write(record_path(&state, ns, 4_194_305), b"").unwrap();
        remove_stale(&state);
        assert!(record_path(&state, ns, me).exists());
        assert!(!record_path(&state, ns, 4_194_305).exists());
        std::fs::remove_dir_all(&state).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("gpuslice-procs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }
}
