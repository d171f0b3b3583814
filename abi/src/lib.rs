//! The C ABI of the CUDA driver API (`cuda.h`) and NVML (`nvml.h`) as gpuslice uses it: the
//! interception library and the simulated driver libraries share these declarations, and
//! `tests/headers.rs` compares every size, field offset and constant with NVIDIA's headers
//! (CUDA 12.9 and Debian's CUDA 11.8), compiled by a C compiler.
//!
//! Field names are the headers' in snake case; handles are opaque pointers.
#![allow(non_camel_case_types)]

pub mod compressed;
pub mod cuda;
pub mod image;
pub mod nvml;
pub mod params;
#[cfg(any(test, feature = "testing"))]
pub mod writer;
