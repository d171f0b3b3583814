//! `libgpuslice.so`: loaded into every process of a container through `/etc/ld.so.preload`,
//! it stands between the program and the CUDA driver and holds the container to its slice.
//!
//! - [`api`]: the table of intercepted functions (exports, real pointers, lookups).
//! - [`dlsym`]: `dlsym` interposed so that handles to the driver give this library's functions.
//! - [`hooks`]: what each intercepted function does.
//! - [`slice`]: the container's limits, its usage region, and what this process holds.
//! - [`region`]: the usage region shared by the container's processes, and the wall check.
//! - [`pacing`]: kernel launches paced to the slice's share of the SMs.
//!
//! Nothing happens until a CUDA or NVML function is called: no thread, no file, no allocation
//! (and no thread at all unless the slice has a share of a GPU's SMs and launches a kernel).
//! Without a limits file every function passes straight through.
#![allow(unsafe_code)]

mod api;
mod dlsym;
mod ffi;
mod hooks;
mod log;
mod pacing;
mod region;
mod slice;

/// Runs a hook, turning a panic into `CUDA_ERROR_UNKNOWN` / `NVML_ERROR_UNKNOWN` (both 999):
/// no panic crosses the C ABI.
#[inline]
fn guard(f: impl FnOnce() -> u32) -> u32 {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(ffi::CUDA_ERROR_UNKNOWN)
}
