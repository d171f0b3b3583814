//! Messages to stderr, only when `GPUSLICE_LOG` is set (to anything but empty or `0`).

use std::sync::atomic::{AtomicBool, Ordering};

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Reads `GPUSLICE_LOG`; called once, when the slice is first needed.
pub fn init() {
    let on = std::env::var_os("GPUSLICE_LOG").is_some_and(|v| !v.is_empty() && v != "0");
    ENABLED.store(on, Ordering::Relaxed);
}

pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Writes one line, in one write(2), so that lines of several processes do not interleave.
pub fn line(args: std::fmt::Arguments<'_>) {
    if !enabled() {
        return;
    }
    let text = format!("gpuslice[{}]: {args}\n", std::process::id());
    // SAFETY: writing a live buffer of its own length to stderr.
    let _ = unsafe { libc::write(2, text.as_ptr().cast(), text.len()) };
}

macro_rules! log {
    ($($t:tt)*) => { $crate::log::line(format_args!($($t)*)) };
}
pub(crate) use log;
