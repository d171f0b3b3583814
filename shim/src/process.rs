//! Which process this is, as the slice's books need it: a token that changes in every child
//! of a fork (the raw system call included, which runs no fork handlers), and the slot locks
//! on the usage file that tell live owners from dead ones across PID namespaces.
//!
//! The token lives in a page marked `MADV_WIPEONFORK`, which the kernel hands to a forked
//! child zeroed: a zero token means "a fork happened since the token was set".
//!
//! Also the clocks this process keeps its own time by ([`clock_us`]).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use gpuslice_core::usage::SLOT_LOCK_BASE;

use crate::region::SlotLocks;

/// A page the kernel zeroes in forked children (or, where it cannot, ordinary memory that
/// only the fork handler resets).
pub struct ForkMark {
    word: &'static AtomicU64,
}

impl ForkMark {
    pub fn new() -> Self {
        // SAFETY: an anonymous private mapping of one page, checked for failure; the madvise
        // only changes what a forked child sees of it.
        let word = unsafe {
            let page = libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if page == libc::MAP_FAILED {
                Box::leak(Box::new(AtomicU64::new(0)))
            } else {
                libc::madvise(page, 4096, libc::MADV_WIPEONFORK);
                // SAFETY: the page is 4096 bytes, page-aligned and never unmapped.
                &*page.cast::<AtomicU64>()
            }
        };
        Self { word }
    }

    /// The token, or 0 in a child forked since it was set.
    pub fn token(&self) -> u64 {
        self.word.load(Ordering::Acquire)
    }

    /// Sets a fresh token if none is set (the first caller after a fork wins); returns the
    /// token now set and whether this call set it.
    pub fn renew(&self) -> (u64, bool) {
        let fresh = random_nonzero();
        match self
            .word
            .compare_exchange(0, fresh, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => (fresh, true),
            Err(current) => (current, false),
        }
    }

    /// Forgets the token (the fork handler's reset, where the page is not wiped).
    pub fn clear(&self) {
        self.word.store(0, Ordering::Release);
    }
}

fn random_nonzero() -> u64 {
    let mut v = 0u64;
    // SAFETY: getrandom writes at most 8 bytes into `v`.
    let n = unsafe { libc::getrandom((&raw mut v).cast(), 8, libc::GRND_NONBLOCK) };
    if n != 8 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
        v = (u64::from(std::process::id()) << 40)
            ^ ts.tv_nsec.unsigned_abs()
            ^ (ts.tv_sec.unsigned_abs() << 20);
    }
    v.max(1)
}

/// Slot locks: open-file-description write locks on the usage file, through a descriptor of
/// this process's own (a forked child opens its own, so that it never shares its parent's).
pub struct FileLocks {
    fd: AtomicI32,
    path: CString,
}

impl FileLocks {
    pub fn open(path: &Path) -> Self {
        let path = CString::new(path.as_os_str().as_bytes()).unwrap_or_default();
        let locks = Self {
            fd: AtomicI32::new(-1),
            path,
        };
        locks.reopen();
        locks
    }

    /// Opens a descriptor of this process's own, closing the one it had (a forked child's
    /// copy of its parent's: closing it leaves the parent's locks alone).
    pub fn reopen(&self) {
        // SAFETY: open with a NUL-terminated path; the old descriptor is this object's.
        let fd = unsafe { libc::open(self.path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        let old = self.fd.swap(fd, Ordering::AcqRel);
        if old >= 0 {
            // SAFETY: closing the descriptor this object owned.
            unsafe { libc::close(old) };
        }
    }

    fn set(&self, i: usize, kind: libc::c_int) -> bool {
        let fd = self.fd.load(Ordering::Acquire);
        if fd < 0 {
            return false;
        }
        // SAFETY: a zeroed flock is valid; fcntl reads it.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = kind as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        fl.l_start = i64::try_from(SLOT_LOCK_BASE + i as u64).unwrap_or(i64::MAX);
        fl.l_len = 1;
        // SAFETY: F_OFD_SETLK with a valid flock on an open descriptor.
        unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &raw const fl) == 0 }
    }
}

impl SlotLocks for FileLocks {
    fn try_lock(&self, i: usize) -> bool {
        self.set(i, libc::F_WRLCK)
    }

    fn unlock(&self, i: usize) {
        self.set(i, libc::F_UNLCK);
    }
}

/// Microseconds of `clock` (read through the vDSO: no system call).
pub fn clock_us(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(clock, &raw mut ts) };
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000).saturating_add(nanos / 1_000)
}
