//! The C types and values of `cuda.h` and `nvml.h` that the intercepted functions use,
//! declared once in `gpuslice-cuda-abi` (checked there against NVIDIA's headers).

use std::ffi::c_int;

pub use gpuslice_cuda_abi::cuda::*;
pub use gpuslice_cuda_abi::nvml::*;

/// Bytes per element of a `CUarray_format`, or None for a format this library does not know
/// (such an array is charged after creation, from the driver's own memory requirements).
#[must_use]
pub fn array_format_bytes(format: c_int) -> Option<u64> {
    Some(match format {
        0x01 | 0x08 => 1,        // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2, // UNSIGNED_INT16, SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => 4, // UNSIGNED_INT32, SIGNED_INT32, FLOAT
        _ => return None,
    })
}
