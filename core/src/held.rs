//! The driver's share: one file per container, written by the agent alone (read-only in the
//! container), mapped shared by every process of the container, saying how much device memory
//! the driver holds for each process beyond what the process counted in its usage-region slot:
//! its contexts' real cost where the charge per context was an estimate, module images, the
//! driver's own buffers. The agent finds it from what NVML says each process holds; the
//! interception library adds it to the container's total when it checks an allocation, so the
//! wall holds on the figure the host sees (NVML's per-process `usedGpuMemory`).
//!
//! Layout, version 1 (all integers little-endian, as the CPU writes them):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `GPSLHLD1` |
//! | 8 | 4 | version (1) |
//! | 12 | 4 | GPU count of the container (≤ 16) |
//! | 16 | 4 | entry count (the usage region's slot count) |
//! | 20 | 4 | entry size in bytes (144) |
//! | 24 | 8 | the newest sample published (its number among those begun) |
//! | 32 | 8 | samples begun so far (0: the agent takes no requests for a sample) |
//! | 40 | 24 | reserved, zero |
//! | 64 | 128 | `unattributed: [u64; 16]`: held by the container's processes that have no slot |
//! | 192 + i·144 | 144 | entry i, for usage-region slot i |
//!
//! Entry: `start_time: u64` at 0 (the start time of the slot's owner the entry was measured
//! for; 0 for none), `host_pid: u64` at 8 (the owner's pid in the host's PID namespace, as
//! NVML names it everywhere, since the driver knows nothing of PID namespaces), `extra:
//! [u64; 16]` at 16 (bytes the driver holds for that process on each GPU beyond its slot's
//! counters). A reader adds an entry's `extra` to a live slot's
//! counters only while the slot's start time is the entry's, so a slot taken over by a new
//! process never inherits what the driver held for the last one. Every field is an aligned
//! 8-byte word, written and read atomically.
//!
//! A fresh sample on request: beside the file the agent listens on a datagram socket
//! ([`REQUEST_SOCKET`]); any datagram sent to it asks for a sample of the container soon. The
//! agent counts a sample as begun before it reads anything, and writes its number once every
//! other word is written, so a reader that saw `n` samples begun and then sees a number above
//! `n` published knows that sample began after it looked: it covers everything the driver did
//! for the reader before then.

use crate::usage::MAX_GPUS;

pub const MAGIC: &[u8; 8] = b"GPSLHLD1";
pub const VERSION: u32 = 1;
pub const HEADER_SIZE: usize = 192;
pub const ENTRY_SIZE: usize = 144;
/// File name inside the container's directory.
pub const FILE_NAME: &str = "held";
/// Offset of the number of the newest sample published.
pub const HEADER_SAMPLES: usize = 24;
/// Offset of the count of samples begun.
pub const HEADER_BEGUN: usize = 32;
/// Name of the agent's socket for requests of a fresh sample, inside the container's
/// directory.
pub const REQUEST_SOCKET: &str = "sample.sock";
/// Offset of `unattributed[0]`.
pub const HEADER_UNATTRIBUTED: usize = 64;
/// Offset of `start_time` in an entry.
pub const ENTRY_START_TIME: usize = 0;
/// Offset of `host_pid` in an entry.
pub const ENTRY_HOST_PID: usize = 8;
/// Offset of `extra[0]` in an entry.
pub const ENTRY_EXTRA: usize = 16;

/// Size of a file with `entries` entries.
#[must_use]
pub fn file_size(entries: usize) -> usize {
    HEADER_SIZE + entries * ENTRY_SIZE
}

/// Offset of entry `i`.
#[must_use]
pub fn entry(i: usize) -> usize {
    HEADER_SIZE + i * ENTRY_SIZE
}

/// A fresh file for a container with `gpu_count` GPUs: nothing held beyond the counters.
#[must_use]
pub fn new_file(gpu_count: usize, entries: usize) -> Vec<u8> {
    let mut buf = vec![0u8; file_size(entries)];
    buf[0..8].copy_from_slice(MAGIC);
    let mut put = |at: usize, v: usize| {
        let v = u32::try_from(v).unwrap_or(0);
        buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
    };
    put(8, VERSION as usize);
    put(12, gpu_count.min(MAX_GPUS));
    put(16, entries);
    put(20, ENTRY_SIZE);
    buf
}

/// Whether `header` (at least [`HEADER_SIZE`] bytes) is a version-1 file for `gpus` GPUs
/// with `entries` entries.
#[must_use]
pub fn header_matches(header: &[u8], gpus: usize, entries: usize) -> bool {
    let word = |at: usize| {
        header
            .get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
    };
    header.get(0..8) == Some(&MAGIC[..])
        && word(8) == Some(VERSION)
        && word(12).map(|g| g as usize) == Some(gpus.min(MAX_GPUS))
        && word(16).map(|e| e as usize) == Some(entries)
        && word(20).map(|s| s as usize) == Some(ENTRY_SIZE)
}

/// What the driver holds for one slot's owner beyond its counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShareEntry {
    pub slot: usize,
    pub start_time: u64,
    pub host_pid: u32,
    /// Bytes beyond the slot's counters on each GPU.
    pub extra: Vec<u64>,
}

/// What the agent found the driver holding for one container, to be published.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverShare {
    /// Per usage-region slot that the driver's processes were matched to.
    pub entries: Vec<ShareEntry>,
    /// Bytes held on each GPU by the container's processes that have no slot.
    pub unattributed: Vec<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_file_matches_its_own_header_and_no_other() {
        let f = new_file(2, 256);
        assert_eq!(f.len(), 192 + 256 * 144);
        assert!(header_matches(&f, 2, 256));
        assert!(!header_matches(&f, 1, 256));
        assert!(!header_matches(&f, 2, 255));
        assert!(!header_matches(&f[..10], 2, 256));
        assert!(f[HEADER_SIZE..].iter().all(|&b| b == 0));
    }

    #[test]
    fn every_word_is_eight_byte_aligned() {
        assert_eq!(HEADER_SIZE % 8, 0);
        assert_eq!(ENTRY_SIZE % 8, 0);
        assert_eq!(HEADER_UNATTRIBUTED + 8 * MAX_GPUS, HEADER_SIZE);
        assert_eq!(ENTRY_EXTRA + 8 * MAX_GPUS, ENTRY_SIZE);
    }
}
