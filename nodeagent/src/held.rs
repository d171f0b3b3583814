//! The driver's share of each container, found and published (the file's layout is in
//! [`gpuslice_core::held`]). Every sampling interval the agent reads each container's usage
//! region, asks NVML what each of the container's processes holds, reads the region again,
//! and writes per slot what the driver holds beyond the slot's counters. The interception
//! library adds that to the container's total, so the next allocation is refused once the
//! driver's figure reaches the slice.
//!
//! A process is matched to its slot by its pid in its own PID namespace and its start time;
//! nothing the container writes can move the driver's figure elsewhere: a process with no
//! slot (the library not in front of it, or its slot rewritten) is charged to the container
//! as a whole, and a slot whose counters were lowered gets a larger share. A counter that
//! moved while the driver was asked is taken at its lower reading, so an allocation in flight
//! is charged rather than lost. The file is the agent's alone: the container sees it through
//! a read-only mount of its directory.

use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use gpuslice_core::held::{self, DriverShare, ShareEntry};
use gpuslice_core::usage::{self, SlotSnapshot, UsageSnapshot};

#[derive(Debug, thiserror::Error)]
pub enum HeldError {
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
}

/// One process of a container as the driver reports it on one of the container's GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The GPU's position in the claim.
    pub position: usize,
    /// Its pid in its own (innermost) PID namespace, as its slot records it.
    pub ns_pid: u32,
    /// Its pid in the host's namespace, as NVML names it.
    pub host_pid: u32,
    pub start_time: u64,
    pub used: u64,
}

/// What the driver holds for a container beyond its counters, from the region read before
/// and after the driver was asked (`before`, `after`: live slots only) and the container's
/// `holders`.
#[must_use]
pub fn driver_share(
    gpus: usize,
    before: &UsageSnapshot,
    after: &UsageSnapshot,
    holders: &[Holder],
) -> DriverShare {
    let mut share = DriverShare {
        entries: Vec::new(),
        unattributed: vec![0; gpus],
    };
    let find = |s: &UsageSnapshot, h: &Holder| -> Option<SlotSnapshot> {
        s.slots
            .iter()
            .find(|s| s.pid == h.ns_pid && s.start_time == h.start_time)
            .cloned()
    };
    for h in holders.iter().filter(|h| h.position < gpus) {
        let slot = match (find(before, h), find(after, h)) {
            (Some(a), Some(b)) if a.index == b.index => Some((a, b)),
            (None, Some(b)) => Some((b.clone(), b)),
            (Some(a), None) => Some((a.clone(), a)),
            _ => None,
        };
        let Some((a, b)) = slot else {
            share.unattributed[h.position] = share.unattributed[h.position].saturating_add(h.used);
            continue;
        };
        let counted = |s: &SlotSnapshot| s.used.get(h.position).copied().unwrap_or(0);
        let extra = h.used.saturating_sub(counted(&a).min(counted(&b)));
        let entry = match share.entries.iter_mut().position(|e| e.slot == a.index) {
            Some(k) => &mut share.entries[k],
            None => {
                share.entries.push(ShareEntry {
                    slot: a.index,
                    start_time: a.start_time,
                    host_pid: h.host_pid,
                    extra: vec![0; gpus],
                });
                share.entries.last_mut().expect("just pushed")
            }
        };
        entry.extra[h.position] = entry.extra[h.position].saturating_add(extra);
    }
    share
}

/// Creates the container directory's file, nothing held (kept as it is when present: its
/// processes may have it mapped).
pub fn create(
    dir: &Path,
    gpus: usize,
    write: impl Fn(&Path, &[u8]) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let path = dir.join(held::FILE_NAME);
    if path.symlink_metadata().is_ok() {
        return Ok(());
    }
    write(&path, &held::new_file(gpus, usage::DEFAULT_SLOTS))
}

/// A sample of one container begun: its file, mapped once for the sample, and its number.
pub struct Sample {
    map: Mapping,
    gpus: usize,
    pub number: u64,
}

/// Counts a sample of the container of directory `dir` as begun, before anything is read for
/// it (see [`gpuslice_core::held`]: a reader waits for a sample that began after it looked).
pub fn begin(dir: &Path, gpus: usize) -> Result<Sample, HeldError> {
    let map = map_file(dir, gpus)?;
    let number = map
        .word(held::HEADER_BEGUN)
        .fetch_add(1, SeqCst)
        .wrapping_add(1);
    Ok(Sample { map, gpus, number })
}

/// The container directory `dir`'s file, mapped, once it is found to be this container's.
fn map_file(dir: &Path, gpus: usize) -> Result<Mapping, HeldError> {
    let path = dir.join(held::FILE_NAME);
    let err = |reason: String| HeldError::File {
        path: path.display().to_string(),
        reason,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(&path)
        .map_err(|e| err(e.to_string()))?;
    let meta = file.metadata().map_err(|e| err(e.to_string()))?;
    let len = held::file_size(usage::DEFAULT_SLOTS);
    if !meta.is_file() || meta.size() != len as u64 {
        return Err(err(format!("not a regular file of {len} bytes")));
    }
    let map = Mapping::new(&file, len).map_err(err)?;
    if !held::header_matches(map.bytes(held::HEADER_SIZE), gpus, usage::DEFAULT_SLOTS) {
        return Err(err("its header is not this container's".into()));
    }
    Ok(map)
}

impl Sample {
    /// Writes `share`, what this sample found, into the file, every word atomically; the
    /// sample's number goes in last.
    pub fn publish(&self, share: &DriverShare) {
        let (map, gpus) = (&self.map, self.gpus);
        for g in 0..gpus.min(usage::MAX_GPUS) {
            let v = share.unattributed.get(g).copied().unwrap_or(0);
            map.word(held::HEADER_UNATTRIBUTED + 8 * g).store(v, SeqCst);
        }
        for i in 0..usage::DEFAULT_SLOTS {
            let at = held::entry(i);
            let start = map.word(at + held::ENTRY_START_TIME);
            let found = share.entries.iter().find(|e| e.slot == i);
            let (owner, extra) = found.map_or((0, None), |e| (e.start_time, Some(&e.extra)));
            // A new owner's figures go in with the entry closed, so that no reader adds the last
            // owner's figures to the new one's slot, or the new ones to the last owner's.
            let reopen = start.load(SeqCst) != owner;
            if reopen {
                start.store(0, SeqCst);
            }
            let host_pid = found.map_or(0, |e| u64::from(e.host_pid));
            map.word(at + held::ENTRY_HOST_PID).store(host_pid, SeqCst);
            for g in 0..gpus.min(usage::MAX_GPUS) {
                let v = extra.and_then(|x| x.get(g).copied()).unwrap_or(0);
                map.word(at + held::ENTRY_EXTRA + 8 * g).store(v, SeqCst);
            }
            if reopen {
                start.store(owner, SeqCst);
            }
        }
        map.word(held::HEADER_SAMPLES)
            .fetch_max(self.number, SeqCst);
    }
}

/// A file mapped shared for the length of one publication.
struct Mapping {
    base: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(file: &std::fs::File, len: usize) -> Result<Self, String> {
        // SAFETY: mapping `len` bytes of an open regular file of that size, shared; checked
        // for MAP_FAILED.
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
        Ok(Self {
            base: base.cast(),
            len,
        })
    }

    fn bytes(&self, n: usize) -> &[u8] {
        // SAFETY: the first `n` (≤ len) bytes of the mapping, which lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.base, n.min(self.len)) }
    }

    fn word(&self, at: usize) -> &AtomicU64 {
        assert!(at + 8 <= self.len && at.is_multiple_of(8));
        // SAFETY: inside the mapping, 8-aligned (a page-aligned base plus a multiple of 8),
        // and only accessed atomically here and by the library.
        unsafe { AtomicU64::from_ptr(self.base.add(at).cast()) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `new`, once.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(slots: &[(usize, u32, u64, u64)]) -> UsageSnapshot {
        UsageSnapshot {
            gpu_count: 1,
            slots: slots
                .iter()
                .map(|&(index, pid, start_time, used)| SlotSnapshot {
                    index,
                    pid,
                    start_time,
                    used: vec![used],
                })
                .collect(),
        }
    }

    fn holder(ns_pid: u32, start_time: u64, used: u64) -> Holder {
        Holder {
            position: 0,
            ns_pid,
            host_pid: ns_pid + 1000,
            start_time,
            used,
        }
    }

    fn entry(slot: usize, start_time: u64, host_pid: u32, extra: u64) -> ShareEntry {
        ShareEntry {
            slot,
            start_time,
            host_pid,
            extra: vec![extra],
        }
    }

    #[test]
    fn a_process_is_charged_what_the_driver_holds_beyond_its_counters() {
        let s = snapshot(&[(3, 7, 100, 1000)]);
        let share = driver_share(1, &s, &s, &[holder(7, 100, 1500)]);
        assert_eq!(share.entries, vec![entry(3, 100, 1007, 500)]);
        assert_eq!(share.unattributed, vec![0]);
    }

    #[test]
    fn a_process_counting_more_than_the_driver_holds_gets_nothing_back() {
        let s = snapshot(&[(0, 7, 100, 2000)]);
        let share = driver_share(1, &s, &s, &[holder(7, 100, 1500)]);
        assert_eq!(share.entries, vec![entry(0, 100, 1007, 0)]);
    }

    #[test]
    fn a_process_without_a_slot_is_charged_to_the_container() {
        // Another process's slot, a reused pid (other start time), and no slot at all.
        let s = snapshot(&[(0, 7, 100, 10)]);
        let share = driver_share(1, &s, &s, &[holder(7, 999, 300), holder(8, 100, 400)]);
        assert!(share.entries.is_empty());
        assert_eq!(share.unattributed, vec![700]);
    }

    #[test]
    fn a_counter_that_moved_while_the_driver_was_asked_is_taken_at_its_lower_reading() {
        let before = snapshot(&[(0, 7, 100, 1000)]);
        let after = snapshot(&[(0, 7, 100, 3000)]);
        let share = driver_share(1, &before, &after, &[holder(7, 100, 1200)]);
        assert_eq!(share.entries, vec![entry(0, 100, 1007, 200)]);
    }

    #[test]
    fn a_publication_reaches_the_file_and_a_new_owner_does_not_inherit_the_last_ones() {
        let dir = tempfile::tempdir().unwrap();
        create(dir.path(), 1, |p, b| std::fs::write(p, b)).unwrap();
        let share = DriverShare {
            entries: vec![entry(2, 55, 4321, 4096)],
            unattributed: vec![10],
        };
        let first = begin(dir.path(), 1).unwrap();
        first.publish(&share);
        let first = first.number;
        let bytes = std::fs::read(dir.path().join(held::FILE_NAME)).unwrap();
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        assert_eq!(word(held::HEADER_UNATTRIBUTED), 10);
        assert_eq!(word(held::entry(2) + held::ENTRY_START_TIME), 55);
        assert_eq!(word(held::entry(2) + held::ENTRY_EXTRA), 4096);
        assert_eq!(word(held::entry(2) + held::ENTRY_HOST_PID), 4321);
        assert_eq!((first, word(held::HEADER_SAMPLES)), (1, 1));
        assert_eq!(word(held::HEADER_BEGUN), 1);
        begin(dir.path(), 1)
            .unwrap()
            .publish(&DriverShare::default());
        let bytes = std::fs::read(dir.path().join(held::FILE_NAME)).unwrap();
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        assert_eq!(word(held::entry(2) + held::ENTRY_START_TIME), 0);
        assert_eq!(word(held::entry(2) + held::ENTRY_EXTRA), 0);
        assert_eq!(word(held::HEADER_UNATTRIBUTED), 0);
    }

    #[test]
    fn a_sample_published_late_never_lowers_the_number_readers_wait_for() {
        let dir = tempfile::tempdir().unwrap();
        create(dir.path(), 1, |p, b| std::fs::write(p, b)).unwrap();
        let (a, b) = (begin(dir.path(), 1).unwrap(), begin(dir.path(), 1).unwrap());
        assert_eq!((a.number, b.number), (1, 2));
        b.publish(&DriverShare::default());
        a.publish(&DriverShare::default());
        let bytes = std::fs::read(dir.path().join(held::FILE_NAME)).unwrap();
        let at = held::HEADER_SAMPLES;
        assert_eq!(u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()), 2);
    }

    #[test]
    fn a_file_of_another_shape_is_refused_not_written() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(held::FILE_NAME), b"short").unwrap();
        assert!(begin(dir.path(), 1).is_err());
        let dir = tempfile::tempdir().unwrap();
        create(dir.path(), 2, |p, b| std::fs::write(p, b)).unwrap();
        assert!(begin(dir.path(), 1).is_err());
    }
}
