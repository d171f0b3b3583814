//! The usage region is a file of the container's, which a process of the container can
//! truncate; every other process that maps it would then die of SIGBUS at its next access.
//! A SIGBUS handler, installed when the region is mapped, replaces the mapping with private
//! zeroed memory and marks the region lost: the process lives on with its wall closed (every
//! charge fails), and the agent reports the truncated region. A fault anywhere else goes to
//! the disposition that was there before.

use std::ffi::c_void;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static BASE: AtomicUsize = AtomicUsize::new(0);
static LEN: AtomicUsize = AtomicUsize::new(0);
static LOST: AtomicBool = AtomicBool::new(false);
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// Whether the region was truncated under this process (its mapping is now private memory).
pub fn region_lost() -> bool {
    LOST.load(Ordering::Acquire)
}

/// Guards the shared mapping at `base` of `len` bytes.
pub fn protect(base: *mut u8, len: usize) {
    LEN.store(len, Ordering::Release);
    BASE.store(base as usize, Ordering::Release);
    PREVIOUS.get_or_init(|| {
        // SAFETY: zeroed sigaction structs are valid; `handler` has the SA_SIGINFO signature;
        // sigaction only reads the new action and writes the old one.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = handler as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&raw mut action.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGBUS, &raw const action, &raw mut old);
            old
        }
    });
}

/// Only async-signal-safe work: atomics, mmap, sigaction, and the previous handler.
extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    let (base, len) = (BASE.load(Ordering::Acquire), LEN.load(Ordering::Acquire));
    if base != 0 && addr >= base && addr < base + len {
        // SAFETY: replaces exactly the region's own mapping (page-aligned, `len` bytes) with
        // anonymous memory at the same address, so that every pointer into it stays valid.
        let p = unsafe {
            libc::mmap(
                base as *mut c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            LOST.store(true, Ordering::Release);
            return;
        }
    }
    let previous = PREVIOUS.get().copied();
    match previous {
        Some(old) if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN => {
            if old.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the handler the program installed, with the signature its flags say.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) =
                    unsafe { std::mem::transmute(old.sa_sigaction) };
                f(sig, info, context);
            } else {
                // SAFETY: as above, a plain handler.
                let f: extern "C" fn(libc::c_int) =
                    unsafe { std::mem::transmute(old.sa_sigaction) };
                f(sig);
            }
        }
        _ => {
            // The default disposition: returning re-runs the faulting access, which now ends
            // the process as it would have without this handler.
            // SAFETY: a zeroed sigaction is SIG_DFL with an empty mask.
            unsafe {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGBUS, &raw const dfl, std::ptr::null_mut());
            }
        }
    }
}
