//! Where a driver root keeps the driver's user-space libraries: what the agent (looking for
//! NVML), the runtime side (mounting the libraries into containers) and the simulated node
//! (laying out its fake driver) agree on. Names only; the callers look at the files.

/// Directories under a driver root where the driver's libraries live, in lookup order.
pub const LIBRARY_DIRS: &[&str] = &[
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "usr/lib",
    "lib/x86_64-linux-gnu",
    "lib64",
    "lib",
];

/// The NVML library's soname.
pub const NVML_SONAME: &str = "libnvidia-ml.so.1";
/// The CUDA driver library's soname.
pub const CUDA_SONAME: &str = "libcuda.so.1";

/// Where a container's own directory (its limits file and usage region) appears inside it.
pub const CONTAINER_RUN_DIR: &str = "/run/gpuslice";
