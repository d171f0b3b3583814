//! What the driver holds for the container's processes beyond their counters, as the agent
//! publishes it (layout in [`gpuslice_core::held`]): a file mapped read-only and shared, so
//! each check of an allocation sees the agent's latest sample. The container cannot write it
//! (its directory is mounted read-only); where it is missing (the library used without the
//! agent) nothing is added.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use gpuslice_core::held;

pub struct DriverShare {
    base: *const u8,
    len: usize,
    gpus: usize,
    entries: usize,
}

// SAFETY: the mapping is read-only here and read only through atomics; the pointer never
// changes after construction and the mapping is never unmapped.
unsafe impl Send for DriverShare {}
// SAFETY: as above.
unsafe impl Sync for DriverShare {}

impl DriverShare {
    /// Maps the file at `path` for a container of `gpus` GPUs whose usage region has
    /// `entries` slots.
    pub fn map(path: &Path, gpus: usize, entries: usize) -> Result<Self, String> {
        let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
        let meta = file.metadata().map_err(|e| e.to_string())?;
        let len = held::file_size(entries);
        if !meta.is_file() || meta.len() != len as u64 {
            return Err(format!("not a regular file of {len} bytes"));
        }
        // SAFETY: mapping `len` bytes of an open regular file of that size, read-only and
        // shared; checked for MAP_FAILED below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(format!("mmap: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: the first HEADER_SIZE (< len) bytes of the fresh mapping.
        let header = unsafe { std::slice::from_raw_parts(base.cast::<u8>(), held::HEADER_SIZE) };
        if !held::header_matches(header, gpus, entries) {
            // SAFETY: unmapping the mapping just made, which nothing else refers to.
            unsafe { libc::munmap(base, len) };
            return Err("its header does not match the container's".into());
        }
        Ok(Self {
            base: base.cast(),
            len,
            gpus,
            entries,
        })
    }

    fn word(&self, at: usize) -> u64 {
        debug_assert!(at + 8 <= self.len && at.is_multiple_of(8));
        // SAFETY: inside the mapping (callers stay within the header and entries), 8-aligned
        // from a page-aligned base; the agent writes these words atomically.
        unsafe { AtomicU64::from_ptr(self.base.add(at).cast_mut().cast()) }.load(SeqCst)
    }

    /// Bytes on `gpu` held by the container's processes that have no slot.
    pub fn unattributed(&self, gpu: usize) -> u64 {
        if gpu >= self.gpus {
            return 0;
        }
        self.word(held::HEADER_UNATTRIBUTED + 8 * gpu)
    }

    /// The host pid of slot `slot`'s owner, the process that started at `start_time`, as the
    /// agent found it: the pid NVML names it by, in or out of a container.
    pub fn host_pid(&self, slot: usize, start_time: u64) -> Option<u32> {
        if slot >= self.entries || start_time == 0 {
            return None;
        }
        let at = held::entry(slot);
        if self.word(at + held::ENTRY_START_TIME) != start_time {
            return None;
        }
        let pid = self.word(at + held::ENTRY_HOST_PID);
        if self.word(at + held::ENTRY_START_TIME) != start_time {
            return None;
        }
        u32::try_from(pid).ok().filter(|&p| p != 0)
    }

    /// Bytes on `gpu` the driver holds for slot `slot` beyond its counters, while the slot's
    /// owner is the process that started at `start_time`.
    pub fn extra(&self, slot: usize, start_time: u64, gpu: usize) -> u64 {
        if slot >= self.entries || gpu >= self.gpus || start_time == 0 {
            return 0;
        }
        let at = held::entry(slot);
        if self.word(at + held::ENTRY_START_TIME) != start_time {
            return 0;
        }
        let extra = self.word(at + held::ENTRY_EXTRA + 8 * gpu);
        // Read again: an entry being handed to a new owner is closed while it is rewritten.
        if self.word(at + held::ENTRY_START_TIME) != start_time {
            return 0;
        }
        extra
    }
}
