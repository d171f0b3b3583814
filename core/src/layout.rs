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

/// Where the interception library and its fronts lie in a container (the fronts' RUNPATH).
pub const INTERCEPTION_DIR: &str = "/usr/lib/gpuslice";
/// Where the real driver libraries lie in a container, under the private names below (the
/// fronts' RUNPATH; not in the container's linker cache).
pub const REAL_DRIVER_DIR: &str = "/usr/lib/gpuslice/driver";
/// The private name the CUDA front needs the real `libcuda.so.1` by.
pub const REAL_CUDA: &str = "libgpuslice-driver-cuda.so.1";
/// The private name the NVML front needs the real `libnvidia-ml.so.1` by.
pub const REAL_NVML: &str = "libgpuslice-driver-nvml.so.1";
/// The interception library's file name (a front's first needed library).
pub const INTERCEPTION_LIBRARY_FILE: &str = "libgpuslice.so";
/// The fronts as built (`gpuslice-front-cuda`, `gpuslice-front-nvml`), beside the
/// interception library: mounted in a container in place of every name of the driver library
/// whose soname they carry.
pub const FRONTS: &[Front] = &[
    Front {
        file: "libgpuslice_cuda.so",
        soname: CUDA_SONAME,
        stem: "libcuda.so",
        real: REAL_CUDA,
    },
    Front {
        file: "libgpuslice_nvml.so",
        soname: NVML_SONAME,
        stem: "libnvidia-ml.so",
        real: REAL_NVML,
    },
];

/// A driver library and the front that stands in for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Front {
    /// The front's file name beside the interception library.
    pub file: &'static str,
    /// The driver library's soname, which the front carries.
    pub soname: &'static str,
    /// The prefix of every name of the driver library (`libcuda.so`, `.so.1`, `.so.<version>`).
    pub stem: &'static str,
    /// The private name the front needs the real library by.
    pub real: &'static str,
}

impl Front {
    /// Whether a library file name is one of the names of this front's driver library.
    #[must_use]
    pub fn covers(&self, file_name: &str) -> bool {
        file_name
            .strip_prefix(self.stem)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
    }
}

/// The CDI kind of the slices the agent admitted (`gpuslice.io/slice=<claim>`).
pub const CDI_SLICE_KIND: &str = "gpuslice.io/slice";

/// The file the CDI spec of the slice of claim `id` is written to, in a CDI directory
/// (`gpuslice.io-slice-<id>.json`): the agent removes it when the claim is released.
#[must_use]
pub fn cdi_slice_file(id: &str) -> String {
    format!("{}-{id}.json", CDI_SLICE_KIND.replace('/', "-"))
}
