//! The driver's error log (CUDA 12.9, drivers from 575 on): callbacks registered and
//! unregistered, an iterator at the log's tail, dumps to a buffer or a file. The CUDA 13
//! runtime registers a callback at start-up (PyTorch for CUDA 13 through it). The simulated
//! driver writes no message to the log, so no callback is ever called, the tail stays at 0 and
//! a dump is empty; the arguments are checked as the header documents.

use std::collections::HashSet;
use std::ffi::{c_char, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};

use crate::codes::*;
use crate::{CUresult, guard, out};

type CUlogsCallback = Option<unsafe extern "C" fn(*mut c_void, c_uint, *mut c_char, usize)>;
type CUlogsCallbackHandle = *mut c_void;
type CUlogIterator = c_uint;

/// Registered callbacks, by handle.
static CALLBACKS: LazyLock<Mutex<HashSet<usize>>> = LazyLock::new(|| Mutex::new(HashSet::new()));
/// Handles are distinct non-null values, never reused.
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(0x10_0000);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLogsRegisterCallback(
    callback: CUlogsCallback,
    _data: *mut c_void,
    handle: *mut CUlogsCallbackHandle,
) -> CUresult {
    guard(|| {
        callback.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let h = NEXT_HANDLE.fetch_add(16, Ordering::Relaxed);
        CALLBACKS.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?.insert(h);
        if !handle.is_null() {
            out(handle, h as CUlogsCallbackHandle)?;
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLogsUnregisterCallback(handle: CUlogsCallbackHandle) -> CUresult {
    guard(|| {
        let removed = CALLBACKS
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .remove(&(handle as usize));
        if removed {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLogsCurrent(iterator: *mut CUlogIterator, flags: c_uint) -> CUresult {
    guard(|| {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(iterator, 0)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLogsDumpToFile(
    _iterator: *mut CUlogIterator,
    path: *const c_char,
    flags: c_uint,
) -> CUresult {
    guard(|| {
        if flags != 0 || path.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated path per the API, checked non-null.
        let path = unsafe { std::ffi::CStr::from_ptr(path) }
            .to_str()
            .map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        std::fs::write(path, b"").map_err(|_| CUDA_ERROR_INVALID_VALUE)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLogsDumpToMemory(
    _iterator: *mut CUlogIterator,
    buffer: *mut c_char,
    size: *mut usize,
    flags: c_uint,
) -> CUresult {
    guard(|| {
        if flags != 0 || buffer.is_null() || size.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null, the caller's size of `buffer` per the API.
        if unsafe { size.read() } == 0 {
            // No room even for the terminator the driver always writes.
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `buffer` holds at least one byte (checked above).
        unsafe { buffer.write(0) };
        out(size, 0)
    })
}
