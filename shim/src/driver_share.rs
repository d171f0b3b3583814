//! What the driver holds for the container's processes beyond their counters, as the agent
//! publishes it (layout in [`gpuslice_core::held`]): a file mapped read-only and shared, so
//! each check of an allocation sees the agent's latest sample. The container cannot write it
//! (its directory is mounted read-only); where it is missing (the library used without the
//! agent) nothing is added.
//!
//! Near the limit the library does not grant on an old sample: an allocation that would
//! bring the container within [`NEAR`] of its limit first asks the agent for a fresh sample
//! (a datagram to its socket beside the file) and waits for one that began after it asked,
//! unless one came within [`FRESH`]. So what the driver took for the container since the
//! agent last looked (a framework's start-up beyond its context, modules loaded, a pool's
//! reservation) is charged before the last [`NEAR`] bytes are granted, not an interval later.
//! An agent that does not answer within [`WAIT`] is not asked again for [`BACK_OFF`]; the
//! allocation goes on with the sample it has.
//!
//! A sample taken while one of this process's allocations was in flight (charged in the
//! region, the driver not done with it) finds it in the counters but not in the driver's
//! figure, and publishes a share short by that allocation; granting on it would let the
//! container past its limit by as much. So every charge notes whether a sample began since
//! the last charge or was under way at it ([`DriverShare::checking`]): such samples are not
//! fresh, however recent, and the next allocation near the limit asks for one that begins
//! after it (the allocation before it has returned by then). Allocations in flight in other
//! threads or processes of the container at that moment are not covered.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::time::Duration;

use gpuslice_core::held;

use crate::log::log;

/// How near its limit an allocation must bring the container to wait for a fresh sample.
pub const NEAR: u64 = 256 << 20;
/// How long a sample stays fresh enough for the allocations near the limit.
pub const FRESH: Duration = Duration::from_millis(50);
/// How long an allocation waits for the agent's fresh sample.
pub const WAIT: Duration = Duration::from_millis(500);
/// How long a process goes without asking after the agent did not answer.
pub const BACK_OFF: Duration = Duration::from_secs(5);

pub struct DriverShare {
    base: *const u8,
    len: usize,
    gpus: usize,
    entries: usize,
    /// The agent's socket for sample requests.
    requests: PathBuf,
    /// Milliseconds of the monotonic clock before which no fresh sample is asked for.
    ask_after: AtomicU64,
    /// Whether the last request was answered (false while backing off).
    answered: AtomicBool,
    /// The count of samples begun at this process's last charge, and whether one was under
    /// way then.
    begun_at_charge: AtomicU64,
    under_way_at_charge: AtomicBool,
    /// The newest sample that may have overlapped an allocation in flight: shares count as
    /// fresh only once a later one is published.
    suspect: AtomicU64,
}

/// Milliseconds of CLOCK_MONOTONIC (read through the vDSO: no system call).
fn monotonic_ms() -> u64 {
    crate::process::clock_us(libc::CLOCK_MONOTONIC) / 1000
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
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
        let requests = path
            .parent()
            .unwrap_or(Path::new("."))
            .join(held::REQUEST_SOCKET);
        Ok(Self {
            base: base.cast(),
            len,
            gpus,
            entries,
            requests,
            ask_after: AtomicU64::new(0),
            answered: AtomicBool::new(false),
            begun_at_charge: AtomicU64::new(0),
            under_way_at_charge: AtomicBool::new(false),
            suspect: AtomicU64::new(0),
        })
    }

    /// Makes sure the shares read next come from a sample that began after this call, or
    /// within [`FRESH`] before it (see the module's comment). Returns whether one does: false
    /// where the agent could not be asked or did not answer, and while backing off after that.
    pub fn fresh_sample(&self) -> bool {
        let now = monotonic_ms();
        if now < self.ask_after.load(SeqCst)
            && (!self.answered.load(SeqCst)
                || self.word(held::HEADER_SAMPLES) > self.suspect.load(SeqCst))
        {
            return self.answered.load(SeqCst);
        }
        let begun = self.word(held::HEADER_BEGUN);
        let back_off = |why: &str| {
            log!("no fresh sample of the driver ({why}): near the limit on the last one");
            self.answered.store(false, SeqCst);
            self.ask_after
                .store(now.saturating_add(ms(BACK_OFF)), SeqCst);
            false
        };
        if begun == 0 {
            return back_off("the agent takes no requests");
        }
        if let Err(e) = self.request() {
            return back_off(&format!("{}: {e}", self.requests.display()));
        }
        let deadline = now.saturating_add(ms(WAIT));
        let mut pause = Duration::from_micros(100);
        loop {
            if self.word(held::HEADER_SAMPLES) > begun {
                self.answered.store(true, SeqCst);
                self.ask_after
                    .store(monotonic_ms().saturating_add(ms(FRESH)), SeqCst);
                return true;
            }
            if monotonic_ms() >= deadline {
                return back_off("the agent did not answer");
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(5));
        }
    }

    /// Before an allocation is checked: the one charged last has returned from the driver,
    /// so a sample that began since its charge, or was under way at it, may have seen it
    /// charged and not yet held, and is suspect (see the module's comment).
    pub fn checking(&self) {
        let begun = self.word(held::HEADER_BEGUN);
        if begun > self.begun_at_charge.load(SeqCst) || self.under_way_at_charge.load(SeqCst) {
            self.suspect.fetch_max(begun, SeqCst);
        }
    }

    /// Right before a charge: notes which samples had begun and whether one was under way.
    pub fn charging(&self) {
        let begun = self.word(held::HEADER_BEGUN);
        let under_way = begun > self.word(held::HEADER_SAMPLES);
        self.begun_at_charge.store(begun, SeqCst);
        self.under_way_at_charge.store(under_way, SeqCst);
    }

    /// Sends the agent one datagram, without waiting where its queue is full (it has been
    /// asked already then).
    fn request(&self) -> std::io::Result<()> {
        let socket = std::os::unix::net::UnixDatagram::unbound()?;
        socket.set_nonblocking(true)?;
        match socket.send_to(b"sample", &self.requests) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(()),
            r => r.map(drop),
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;
    use std::time::Instant;

    const ENTRIES: usize = 4;

    /// A container directory with a fresh file, its first `begun` samples counted as begun.
    fn directory(begun: u64) -> (tempfile::TempDir, DriverShare) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(held::FILE_NAME);
        std::fs::write(&path, held::new_file(1, ENTRIES)).unwrap();
        put(&path, held::HEADER_BEGUN, begun);
        let share = DriverShare::map(&path, 1, ENTRIES).unwrap();
        (dir, share)
    }

    /// Writes a word of the file as the agent would (the mapping is shared).
    fn put(path: &Path, at: usize, value: u64) {
        let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        file.write_all_at(&value.to_le_bytes(), at as u64).unwrap();
    }

    #[test]
    fn a_file_from_an_agent_that_takes_no_requests_is_never_waited_on() {
        let (_dir, share) = directory(0);
        let t = Instant::now();
        assert!(!share.fresh_sample());
        assert!(t.elapsed() < WAIT / 5, "{:?}", t.elapsed());
    }

    #[test]
    fn a_missing_socket_is_not_waited_on_nor_asked_again_at_once() {
        let (_dir, share) = directory(3);
        let t = Instant::now();
        assert!(!share.fresh_sample());
        assert!(!share.fresh_sample(), "backing off");
        assert!(t.elapsed() < WAIT / 5, "{:?}", t.elapsed());
    }

    #[test]
    fn a_request_is_sent_and_answered_by_a_sample_that_began_after_it() {
        let (dir, share) = directory(5);
        let socket =
            std::os::unix::net::UnixDatagram::bind(dir.path().join(held::REQUEST_SOCKET)).unwrap();
        let path = dir.path().join(held::FILE_NAME);
        let agent = std::thread::spawn(move || {
            let mut buf = [0u8; 16];
            let n = socket.recv(&mut buf).unwrap();
            // A sample that was under way when the request came does not answer it.
            put(&path, held::HEADER_SAMPLES, 5);
            std::thread::sleep(Duration::from_millis(30));
            put(&path, held::HEADER_BEGUN, 6);
            let publishing = Instant::now();
            put(&path, held::HEADER_SAMPLES, 6);
            (n, publishing)
        });
        assert!(share.fresh_sample());
        let answered_at = Instant::now();
        let (n, publishing) = agent.join().unwrap();
        assert!(n > 0);
        assert!(
            answered_at >= publishing,
            "returned before the sample was published"
        );
        // Fresh for a while: no second request, no wait.
        let t = Instant::now();
        assert!(share.fresh_sample());
        assert!(t.elapsed() < Duration::from_millis(5), "{:?}", t.elapsed());
    }

    #[test]
    fn a_sample_begun_while_an_allocation_was_in_flight_is_not_fresh_however_recent() {
        let (dir, share) = directory(5);
        let socket =
            std::os::unix::net::UnixDatagram::bind(dir.path().join(held::REQUEST_SOCKET)).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let path = dir.path().join(held::FILE_NAME);
        let answer = |socket: std::os::unix::net::UnixDatagram, path: PathBuf, number: u64| {
            std::thread::spawn(move || {
                let mut buf = [0u8; 16];
                socket.recv(&mut buf).unwrap();
                put(&path, held::HEADER_BEGUN, number);
                put(&path, held::HEADER_SAMPLES, number);
                socket
            })
        };
        // Near the limit: asked, answered by sample 6.
        let agent = answer(socket, path.clone(), 6);
        share.checking();
        assert!(share.fresh_sample());
        let socket = agent.join().unwrap();
        // That allocation is charged and in flight; the agent's own sample 7 runs meanwhile.
        share.charging();
        put(&path, held::HEADER_BEGUN, 7);
        put(&path, held::HEADER_SAMPLES, 7);
        // The next allocation, within FRESH of the answer: sample 7 may be short by the one
        // in flight, so a sample begun now is asked for.
        let agent = answer(socket, path.clone(), 8);
        share.checking();
        assert!(share.fresh_sample());
        let socket = agent.join().unwrap();
        share.charging();
        assert_eq!(
            u64::from_le_bytes(
                std::fs::read(&path).unwrap()[held::HEADER_SAMPLES..][..8]
                    .try_into()
                    .unwrap()
            ),
            8,
            "answered by a sample begun after the allocation before returned"
        );
        // With no sample since, the next allocation is granted on sample 8 without asking.
        share.checking();
        let mut buf = [0u8; 16];
        let t = Instant::now();
        assert!(share.fresh_sample());
        assert!(t.elapsed() < Duration::from_millis(5), "{:?}", t.elapsed());
        socket.set_nonblocking(true).unwrap();
        assert!(socket.recv(&mut buf).is_err(), "asked again");
    }

    #[test]
    fn an_agent_that_does_not_answer_is_waited_for_a_bounded_time_then_left_alone() {
        let (dir, share) = directory(2);
        let _socket =
            std::os::unix::net::UnixDatagram::bind(dir.path().join(held::REQUEST_SOCKET)).unwrap();
        let t = Instant::now();
        assert!(!share.fresh_sample());
        let waited = t.elapsed();
        // The deadline is kept in whole milliseconds.
        let least = WAIT - Duration::from_millis(1);
        assert!(waited >= least && waited < WAIT * 2, "{waited:?}");
        let t = Instant::now();
        assert!(!share.fresh_sample());
        assert!(
            t.elapsed() < Duration::from_millis(5),
            "backing off: {:?}",
            t.elapsed()
        );
    }
}
