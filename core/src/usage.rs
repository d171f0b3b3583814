//! The usage region: one file per container, mapped shared by every process of the container,
//! where each process keeps the device memory it holds in a slot of its own. The total of a
//! GPU is the sum over slots, so no process ever decrements another's counter and the total
//! cannot underflow; a dead process's slot is reaped by whoever finds it.
//!
//! Layout, version 1 (all integers little-endian, as the CPU writes them):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `GPSLUSG1` |
//! | 8 | 4 | version (1) |
//! | 12 | 4 | GPU count of the container (≤ 16) |
//! | 16 | 4 | slot count |
//! | 20 | 4 | slot size in bytes (192) |
//! | 24 | 4 | high-water mark: one past the highest slot ever claimed (readers scan below it) |
//! | 28 | 36 | reserved, zero |
//! | 64 + i·192 | 192 | slot i |
//!
//! Slot: `pid: u32` at 0 (0 free; top bit set: being reaped by the process whose pid is in the
//! low 31 bits, so that a reaper killed half-way is itself recognised as dead), `reserved: u32` at 4,
//! `start_time: u64` at 8 (clock ticks since boot of the owner, to tell a reused pid apart),
//! `used: [u64; 16]` at 16 (bytes held on each of the container's GPUs), `queued: [u16; 16]` at
//! 144 (kernel launches the owner has let through on each paced GPU and not seen finish:
//! the container's together are kept few, see the interception library's `queued`), zero
//! padding to 192. A region written before `queued` had its padding zero there: none queued.
//! A process claims a free slot by compare-and-swap of `pid` from 0, and updates only its own
//! `used` counters with atomic adds; readers sum the slots whose `pid` is neither 0 nor being
//! reaped. A process that dies (even by SIGKILL mid-update) leaves only its own slot behind,
//! which any other process of the container may reap: mark it with its own pid, zero it, free it.

pub const MAGIC: &[u8; 8] = b"GPSLUSG1";
pub const VERSION: u32 = 1;
pub const HEADER_SIZE: usize = 64;
pub const SLOT_SIZE: usize = 192;
pub const MAX_GPUS: usize = 16;
pub const DEFAULT_SLOTS: usize = 256;
/// File name inside the container's directory.
pub const FILE_NAME: &str = "usage";
/// Offset of `pid` in a slot.
pub const SLOT_PID: usize = 0;
/// Offset of `start_time` in a slot.
pub const SLOT_START_TIME: usize = 8;
/// Offset of `used[0]` in a slot.
pub const SLOT_USED: usize = 16;
/// Offset of `queued[0]` in a slot.
pub const SLOT_QUEUED: usize = 144;
const _: () = assert!(
    SLOT_USED + 8 * MAX_GPUS <= SLOT_QUEUED && SLOT_QUEUED + 2 * MAX_GPUS <= SLOT_SIZE,
    "a slot's fields overlap or overflow it"
);
/// Offset of the high-water mark in the header.
pub const HEADER_HIGH_WATER: usize = 24;
/// Set in `pid` while a slot is being reaped; the low 31 bits name the reaper.
pub const PID_REAPING: u32 = 1 << 31;
/// A slot's owner holds an open-file-description write lock (`F_OFD_SETLK`) on byte
/// `SLOT_LOCK_BASE + i` of the usage file for slot `i` while it lives: the kernel drops it when
/// the owner exits or execs, whatever its PID namespace, and a forked child does not inherit
/// it as its own. A slot whose lock can be taken has no live owner.
pub const SLOT_LOCK_BASE: u64 = 1 << 32;

/// Whether a slot's `pid` field names a live owner (not free, not being reaped).
#[must_use]
pub fn pid_is_owner(pid: u32) -> bool {
    pid != 0 && pid & PID_REAPING == 0
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsageError {
    #[error("usage region is {0} bytes, shorter than its header")]
    Short(usize),
    #[error("usage region has a bad magic number")]
    Magic,
    #[error("unsupported usage region version {0}")]
    Version(u32),
    #[error("usage region header is inconsistent: {0}")]
    Header(&'static str),
}

/// Size of a region with `slots` slots.
#[must_use]
pub fn region_size(slots: usize) -> usize {
    HEADER_SIZE + slots * SLOT_SIZE
}

/// A fresh region for a container with `gpu_count` GPUs: header filled in, all slots free.
#[must_use]
pub fn new_region(gpu_count: usize, slots: usize) -> Vec<u8> {
    let mut buf = vec![0u8; region_size(slots)];
    buf[0..8].copy_from_slice(MAGIC);
    put_u32(&mut buf, 8, VERSION);
    put_u32(
        &mut buf,
        12,
        u32::try_from(gpu_count.min(MAX_GPUS)).unwrap_or(0),
    );
    put_u32(&mut buf, 16, u32::try_from(slots).unwrap_or(0));
    put_u32(&mut buf, 20, u32::try_from(SLOT_SIZE).unwrap_or(0));
    buf
}

fn put_u32(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn get_u32(buf: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&buf[at..at + 4]);
    u32::from_le_bytes(b)
}

fn get_u64(buf: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(b)
}

/// One live slot as read from a region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotSnapshot {
    /// The slot's position in the region (its lock is byte `SLOT_LOCK_BASE + index`).
    pub index: usize,
    pub pid: u32,
    pub start_time: u64,
    pub used: Vec<u64>,
}

/// A copy of a region read at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageSnapshot {
    pub gpu_count: usize,
    pub slots: Vec<SlotSnapshot>,
}

impl UsageSnapshot {
    pub fn parse(buf: &[u8]) -> Result<Self, UsageError> {
        if buf.len() < HEADER_SIZE {
            return Err(UsageError::Short(buf.len()));
        }
        if &buf[0..8] != MAGIC {
            return Err(UsageError::Magic);
        }
        let version = get_u32(buf, 8);
        if version != VERSION {
            return Err(UsageError::Version(version));
        }
        let gpu_count = get_u32(buf, 12) as usize;
        let slot_count = get_u32(buf, 16) as usize;
        if gpu_count > MAX_GPUS {
            return Err(UsageError::Header("more GPUs than slots have counters"));
        }
        if get_u32(buf, 20) as usize != SLOT_SIZE {
            return Err(UsageError::Header("slot size"));
        }
        if buf.len() < region_size(slot_count) {
            return Err(UsageError::Header("file shorter than its slots"));
        }
        let slots = (0..slot_count)
            .map(|i| (i, HEADER_SIZE + i * SLOT_SIZE))
            .filter_map(|(index, at)| {
                let pid = get_u32(buf, at + SLOT_PID);
                pid_is_owner(pid).then(|| SlotSnapshot {
                    index,
                    pid,
                    start_time: get_u64(buf, at + SLOT_START_TIME),
                    used: (0..gpu_count)
                        .map(|g| get_u64(buf, at + SLOT_USED + 8 * g))
                        .collect(),
                })
            })
            .collect();
        Ok(Self { gpu_count, slots })
    }

    /// Bytes held on each of the container's GPUs, summed over live slots.
    #[must_use]
    pub fn totals(&self) -> Vec<u64> {
        (0..self.gpu_count)
            .map(|g| {
                self.slots
                    .iter()
                    .fold(0u64, |acc, s| acc.saturating_add(s.used[g]))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_region_has_no_live_slot_and_zero_totals() {
        let r = new_region(2, 8);
        let s = UsageSnapshot::parse(&r).unwrap();
        assert_eq!(s.gpu_count, 2);
        assert!(s.slots.is_empty());
        assert_eq!(s.totals(), vec![0, 0]);
    }

    #[test]
    fn totals_sum_live_slots_and_skip_free_and_reaping_ones() {
        let mut r = new_region(2, 4);
        let slot = |i: usize| HEADER_SIZE + i * SLOT_SIZE;
        for (i, pid, used0) in [(0, 10u32, 100u64), (1, PID_REAPING | 7, 1000), (3, 12, 5)] {
            r[slot(i)..slot(i) + 4].copy_from_slice(&pid.to_le_bytes());
            r[slot(i) + SLOT_USED..slot(i) + SLOT_USED + 8].copy_from_slice(&used0.to_le_bytes());
        }
        let s = UsageSnapshot::parse(&r).unwrap();
        assert_eq!(s.slots.len(), 2);
        assert_eq!(s.totals(), vec![105, 0]);
    }

    #[test]
    fn a_damaged_region_is_refused() {
        assert_eq!(UsageSnapshot::parse(&[0; 10]), Err(UsageError::Short(10)));
        let mut r = new_region(1, 2);
        r[0] = b'X';
        assert_eq!(UsageSnapshot::parse(&r), Err(UsageError::Magic));
        let r = new_region(1, 2);
        assert!(UsageSnapshot::parse(&r[..100]).is_err());
    }
}
