//! The usage region is a file of the container's, which a process of the container can
//! truncate; every other process that maps it would then die of SIGBUS at its next access.
//! A SIGBUS handler, installed when the first region is mapped (a container given several
//! slices maps one region per slice), replaces the faulting region's mapping with private
//! zeroed memory and marks the regions lost: the process lives on with its wall closed (every
//! charge fails), and the agent reports the truncated region. A fault anywhere else goes to
//! the disposition that was there before.

use std::ffi::c_void;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Most mappings guarded (a slice has at least one GPU, a container at most this many).
const MAPPINGS: usize = gpuslice_core::usage::MAX_GPUS;
/// The guarded mappings, each published by its length after its base (0: not yet).
static BASE: [AtomicUsize; MAPPINGS] = [const { AtomicUsize::new(0) }; MAPPINGS];
static LEN: [AtomicUsize; MAPPINGS] = [const { AtomicUsize::new(0) }; MAPPINGS];
static GUARDED: AtomicUsize = AtomicUsize::new(0);
static LOST: AtomicBool = AtomicBool::new(false);
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// Whether the region was truncated under this process (its mapping is now private memory).
pub fn region_lost() -> bool {
    LOST.load(Ordering::Acquire)
}

/// Guards the shared mapping at `base` of `len` bytes; false where as many are guarded as
/// can be.
pub fn protect(base: *mut u8, len: usize) -> bool {
    let i = GUARDED.fetch_add(1, Ordering::AcqRel);
    if i >= MAPPINGS {
        return false;
    }
    BASE[i].store(base as usize, Ordering::Release);
    LEN[i].store(len, Ordering::Release);
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
    true
}

/// Only async-signal-safe work: atomics, mmap, sigaction, and the previous handler.
extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    for i in 0..MAPPINGS {
        let (len, base) = (
            LEN[i].load(Ordering::Acquire),
            BASE[i].load(Ordering::Acquire),
        );
        if len == 0 || addr < base || addr >= base + len {
            continue;
        }
        // SAFETY: replaces exactly a region's own mapping (page-aligned, `len` bytes) with
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
        break;
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
