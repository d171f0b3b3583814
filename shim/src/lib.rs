//! `libgpuslice.so`: stands between a container's programs and the CUDA driver and holds the
//! container to its slice. In a container, `libcuda.so.1` and `libnvidia-ml.so.1` are fronts
//! (`shim/fronts`) that need this library first and the real driver library (under a private
//! name) second, so every lookup of a driver function, by the dynamic linker or by `dlsym` on
//! the driver's handle, finds this library's function where it has one. A process that never
//! loads the driver never loads this library.
//!
//! - [`api`]: the table of intercepted functions (exports, real pointers, lookups).
//! - [`hooks`]: what each intercepted function does.
//! - [`slice`]: the container's limits, its usage region, and what this process holds.
//! - [`region`]: the usage region shared by the container's processes, and the wall check.
//! - [`pacing`]: kernel launches paced to the slice's share of the SMs.
//! - [`sigbus`]: a truncated usage region closes the wall instead of killing the process.
//!
//! Nothing happens until a CUDA or NVML function is called: no thread, no file, no allocation
//! (and no thread at all unless the slice has a share of a GPU's SMs and launches a kernel).
//! Without a limits file every function passes straight through.
#![allow(unsafe_code)]

mod api;
mod driver_share;
mod ffi;
mod hooks;
mod log;
mod pacing;
mod process;
mod queued;
mod region;
mod sigbus;
mod slice;
mod slots;

/// Runs a hook, turning a panic into `CUDA_ERROR_UNKNOWN` / `NVML_ERROR_UNKNOWN` (both 999):
/// no panic crosses the C ABI.
#[inline]
fn guard(f: impl FnOnce() -> u32) -> u32 {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(ffi::CUDA_ERROR_UNKNOWN)
}
