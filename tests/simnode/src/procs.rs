//! Per-process device-memory records of the simulated driver: `<state_dir>/procs/<pid>`,
//! rewritten by the fake libcuda whenever the process's device memory changes, read by the
//! fake NVML to answer "running compute processes" and "memory used" across processes.
//!
//! Record layout (little-endian): magic `GSIMPRC1` (8), pid (u64), start time in clock ticks
//! (u64), then bytes held on each GPU index (64 × u64). A record whose process is gone, or
//! whose pid now belongs to a process with another start time, is ignored and removed by the
//! next process that starts.

use std::path::{Path, PathBuf};

use gpuslice_core::host;

pub const MAGIC: &[u8; 8] = b"GSIMPRC1";
pub const MAX_GPUS: usize = 64;
pub const RECORD_SIZE: usize = 24 + MAX_GPUS * 8;

/// One live process's device memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcUsage {
    pub pid: u32,
    pub start_time: u64,
    pub used: Vec<u64>,
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
pub fn encode(pid: u32, start_time: u64, used: &[u64; MAX_GPUS]) -> [u8; RECORD_SIZE] {
    let mut buf = [0u8; RECORD_SIZE];
    buf[0..8].copy_from_slice(MAGIC);
    buf[8..16].copy_from_slice(&u64::from(pid).to_le_bytes());
    buf[16..24].copy_from_slice(&start_time.to_le_bytes());
    for (i, u) in used.iter().enumerate() {
        buf[24 + 8 * i..32 + 8 * i].copy_from_slice(&u.to_le_bytes());
    }
    buf
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
        used: (0..MAX_GPUS).map(|i| word(24 + 8 * i)).collect(),
    })
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
        .filter(|p| host::process_start_time(Path::new("/proc"), p.pid) == Some(p.start_time))
        .collect();
    out.sort_by_key(|p| p.pid);
    out
}

/// Removes records of processes that are gone.
pub fn remove_stale(state_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir(state_dir)) else {
        return;
    };
    for e in entries.flatten() {
        let alive = std::fs::read(e.path())
            .ok()
            .and_then(|b| decode(&b))
            .is_some_and(|p| {
                host::process_start_time(Path::new("/proc"), p.pid) == Some(p.start_time)
            });
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
