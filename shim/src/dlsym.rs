//! `dlsym` interposed, so that a program which opens libcuda or libnvidia-ml itself and looks
//! functions up (as nvml-wrapper, the CUDA runtime and most frameworks do) gets this library's
//! functions. The real `dlsym` is found with `dlvsym` by glibc's symbol versions.
//!
//! `dlsym(RTLD_NEXT, …)` depends on who calls it: glibc reads the caller from the return
//! address. So the exported `dlsym` is a small trampoline that hands `RTLD_NEXT` lookups to
//! the real `dlsym` by a tail jump, leaving the caller's return address in place; every other
//! lookup goes to [`dlsym_hook`].

use std::ffi::{CStr, c_char, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::api;

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// Answers every lookup with "not found"; used only if no versioned `dlsym` can be found.
#[cfg_attr(test, allow(dead_code))]
unsafe extern "C" fn not_found(_: *mut c_void, _: *const c_char) -> *mut c_void {
    std::ptr::null_mut()
}

/// The address of glibc's `dlsym`.
#[cfg_attr(test, allow(dead_code))]
extern "C" fn real_dlsym_address() -> *mut c_void {
    let p = REAL_DLSYM.load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    // GLIBC_2.34 where libdl moved into libc; 2.2.5 (x86_64) and 2.17 (aarch64) before.
    for version in [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"] {
        // SAFETY: dlvsym with NUL-terminated strings; RTLD_NEXT from this library finds the
        // definition after it (libc's), never this library's own export.
        let p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
        if !p.is_null() {
            REAL_DLSYM.store(p, Ordering::Release);
            return p;
        }
    }
    not_found as *const () as *mut c_void
}

/// Calls glibc's `dlsym`.
///
/// # Safety
/// `handle` is a handle `dlsym` accepts and `name` a NUL-terminated string.
pub unsafe fn real_dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let p = real_dlsym_address();
    // SAFETY: p is glibc's dlsym (or `not_found`), both of type DlsymFn.
    let f = unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) };
    // SAFETY: the caller's contract.
    unsafe { f(handle, name) }
}

/// Every lookup but `RTLD_NEXT`: the real answer, replaced by this library's function where
/// the name is one it intercepts.
#[cfg_attr(test, allow(dead_code))]
unsafe extern "C" fn dlsym_hook(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // SAFETY: the caller's dlsym contract.
    let p = unsafe { real_dlsym(handle, name) };
    if p.is_null() || name.is_null() {
        return p;
    }
    std::panic::catch_unwind(|| {
        // SAFETY: non-null and NUL-terminated per dlsym's contract.
        let name = unsafe { CStr::from_ptr(name) };
        let b = name.to_bytes();
        if !(b.starts_with(b"cu") || b.starts_with(b"nvml")) {
            return p;
        }
        match api::intercepted_by_name(name).and_then(|e| Some((e, api::export_of(e)?))) {
            Some((e, ours)) if ours != p => {
                api::remember(e, p);
                ours
            }
            _ => p,
        }
    })
    .unwrap_or(p)
}

#[cfg(all(target_arch = "x86_64", not(test)))]
mod export {
    /// The exported `dlsym`. `RTLD_NEXT` is `(void *)-1`.
    ///
    /// # Safety
    /// dlsym's contract.
    #[unsafe(naked)]
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn dlsym(
        handle: *mut std::ffi::c_void,
        name: *const std::ffi::c_char,
    ) -> *mut std::ffi::c_void {
        std::arch::naked_asm!(
            "cmp rdi, -1",
            "jne {hook}",
            // RTLD_NEXT: keep the arguments, find glibc's dlsym, jump to it.
            "push rdi",
            "push rsi",
            "sub rsp, 8",
            "call {resolve}",
            "add rsp, 8",
            "pop rsi",
            "pop rdi",
            "jmp rax",
            hook = sym super::dlsym_hook,
            resolve = sym super::real_dlsym_address,
        )
    }
}

#[cfg(all(target_arch = "aarch64", not(test)))]
mod export {
    /// The exported `dlsym`. `RTLD_NEXT` is `(void *)-1`.
    ///
    /// # Safety
    /// dlsym's contract.
    #[unsafe(naked)]
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn dlsym(
        handle: *mut std::ffi::c_void,
        name: *const std::ffi::c_char,
    ) -> *mut std::ffi::c_void {
        std::arch::naked_asm!(
            "cmn x0, #1",
            "b.ne {hook}",
            "stp x0, x1, [sp, #-32]!",
            "str x30, [sp, #16]",
            "bl {resolve}",
            "mov x16, x0",
            "ldr x30, [sp, #16]",
            "ldp x0, x1, [sp], #32",
            "br x16",
            hook = sym super::dlsym_hook,
            resolve = sym super::real_dlsym_address,
        )
    }
}
