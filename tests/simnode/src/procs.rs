//! Per-process records of the simulated driver: `<state_dir>/procs/<pid>`, rewritten by the
//! fake libcuda whenever the process's device memory changes or it launches a kernel, read
//! by the fake NVML to answer "running compute processes", "memory used" and "process
//! utilization" across processes.
//!
//! Record layout (little-endian): magic `GSIMPRC2` (8), pid (u64), start time in clock ticks
//! (u64), bytes held on each GPU index (64 × u64), then for each GPU index the kernel time
//! launched so far and the instant the last launched kernel ends (64 × 2 × u64, nanoseconds
//! of CLOCK_MONOTONIC). A record whose process is gone, or whose pid now belongs to a process
//! with another start time, is ignored and removed by the next process that starts.

use std::path::{Path, PathBuf};

pub const MAGIC: &[u8; 8] = b"GSIMPRC2";
pub const MAX_GPUS: usize = 64;
const USED_AT: usize = 24;
const BUSY_AT: usize = USED_AT + MAX_GPUS * 8;
pub const RECORD_SIZE: usize = BUSY_AT + MAX_GPUS * 16;

/// A process's kernel time on one GPU: launched so far, and when the last kernel ends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Busy {
    pub launched_ns: u64,
    pub until_ns: u64,
}

impl Busy {
    /// Kernel time done by `now`: the kernels run back to back up to `until_ns`.
    #[must_use]
    pub fn done_by(&self, now_ns: u64) -> u64 {
        self.launched_ns
            .saturating_sub(self.until_ns.saturating_sub(now_ns))
    }

    /// Queues a kernel of `ns` at `now_ns`: it starts when the previous one ends.
    pub fn launch(&mut self, now_ns: u64, ns: u64) {
        self.until_ns = self.until_ns.max(now_ns).saturating_add(ns);
        self.launched_ns = self.launched_ns.saturating_add(ns);
    }
}

/// One live process's device memory and kernel time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcUsage {
    pub pid: u32,
    pub start_time: u64,
    pub used: Vec<u64>,
    pub busy: Vec<Busy>,
}

#[must_use]
pub fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("procs")
}

#[must_use]
pub fn record_path(state_dir: &Path, pid: u32) -> PathBuf {
    dir(state_dir).join(pid.to_string())
}

#[must_use]
pub fn encode(
    pid: u32,
    start_time: u64,
    used: &[u64; MAX_GPUS],
    busy: &[Busy; MAX_GPUS],
) -> [u8; RECORD_SIZE] {
    let mut buf = [0u8; RECORD_SIZE];
    buf[0..8].copy_from_slice(MAGIC);
    buf[8..16].copy_from_slice(&u64::from(pid).to_le_bytes());
    buf[16..24].copy_from_slice(&start_time.to_le_bytes());
    for (i, u) in used.iter().enumerate() {
        buf[USED_AT + 8 * i..USED_AT + 8 * i + 8].copy_from_slice(&u.to_le_bytes());
    }
    for (i, b) in busy.iter().enumerate() {
        let (offset, bytes) = encode_busy(i, b);
        buf[offset..offset + 16].copy_from_slice(&bytes);
    }
    buf
}

/// Where GPU `index`'s kernel time sits in a record, and its bytes (to write it alone).
#[must_use]
pub fn encode_busy(index: usize, busy: &Busy) -> (usize, [u8; 16]) {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&busy.launched_ns.to_le_bytes());
    b[8..].copy_from_slice(&busy.until_ns.to_le_bytes());
    (BUSY_AT + 16 * index, b)
}

fn decode(buf: &[u8]) -> Option<ProcUsage> {
    if buf.len() < RECORD_SIZE || &buf[0..8] != MAGIC {
        return None;
    }
    let word = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&buf[at..at + 8]);
        u64::from_le_bytes(b)
    };
    Some(ProcUsage {
        pid: u32::try_from(word(8)).ok()?,
        start_time: word(16),
        used: (0..MAX_GPUS).map(|i| word(USED_AT + 8 * i)).collect(),
        busy: (0..MAX_GPUS)
            .map(|i| Busy {
                launched_ns: word(BUSY_AT + 16 * i),
                until_ns: word(BUSY_AT + 16 * i + 8),
            })
            .collect(),
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

/// Records of processes that are still alive.
#[must_use]
pub fn live(state_dir: &Path) -> Vec<ProcUsage> {
    let Ok(entries) = std::fs::read_dir(dir(state_dir)) else {
        return Vec::new();
    };
    let mut out: Vec<ProcUsage> = entries
        .flatten()
        .filter_map(|e| std::fs::read(e.path()).ok())
        .filter_map(|b| decode(&b))
        .filter(|p| process_start_time(Path::new("/proc"), p.pid) == Some(p.start_time))
        .collect();
    out.sort_by_key(|p| p.pid);
    out
}

/// Removes records of processes that are gone. A record that cannot be read whole is being
/// written by a process starting right now: it is removed only if no process has the pid its
/// file is named after (removing it from under a live process would hide that process from
/// every other one for good).
pub fn remove_stale(state_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir(state_dir)) else {
        return;
    };
    let proc_root = Path::new("/proc");
    for e in entries.flatten() {
        let alive = match std::fs::read(e.path()).ok().and_then(|b| decode(&b)) {
            Some(p) => process_start_time(proc_root, p.pid) == Some(p.start_time),
            None => e
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
                .is_some_and(|pid| process_start_time(proc_root, pid).is_some()),
        };
        if !alive {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Bytes held on GPU `index` by all live processes.
#[must_use]
pub fn used_on(state_dir: &Path, index: usize) -> u64 {
    live(state_dir)
        .iter()
        .map(|p| p.used.get(index).copied().unwrap_or(0))
        .sum()
}

/// The start time of `pid` in clock ticks since boot (`<proc_root>/<pid>/stat`), or `None`
/// when no such process exists.
#[must_use]
pub fn process_start_time(proc_root: &Path, pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    gpuslice_core::process::parse_start_time(&stat)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_run_back_to_back_and_count_as_done_once_their_time_has_passed() {
        let mut b = Busy::default();
        b.launch(1_000, 500); // runs 1000..1500
        b.launch(1_200, 300); // queued: 1500..1800
        b.launch(5_000, 100); // idle in between: 5000..5100
        assert_eq!(b.until_ns, 5_100);
        assert_eq!(b.launched_ns, 900);
        assert_eq!(b.done_by(5_050), 850);
        assert_eq!(b.done_by(9_000), 900);
        let record = encode(7, 11, &[0; MAX_GPUS], &{
            let mut all = [Busy::default(); MAX_GPUS];
            all[3] = b;
            all
        });
        let p = decode(&record).unwrap();
        assert_eq!((p.pid, p.start_time, p.busy[3]), (7, 11, b));
    }

    #[test]
    fn a_record_still_being_written_by_a_live_process_is_not_removed() {
        let state = tempfile_dir();
        std::fs::create_dir_all(dir(&state)).unwrap();
        let me = std::process::id();
        // Created, not yet written: what another process sees while this one starts.
        std::fs::write(record_path(&state, me), b"").unwrap();
        // No process has this pid (above the kernel's pid_max).
        std::fs::write(record_path(&state, 4_194_305), b"").unwrap();
        remove_stale(&state);
        assert!(record_path(&state, me).exists());
        assert!(!record_path(&state, 4_194_305).exists());
        std::fs::remove_dir_all(&state).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("gpuslice-procs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }
}
