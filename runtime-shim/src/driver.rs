//! The driver's files a GPU container needs, found in a driver root: device nodes (with the
//! major and minor numbers the host has), the driver's user-space libraries and tools. A
//! driver that needs more files beside these (a simulated node's description and state) says
//! so through the configuration's `extra_mounts`, not here.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

pub use gpuslice_core::layout::{CUDA_SONAME, LIBRARY_DIRS, NVML_SONAME};

/// A tree holding the driver's user-space files: `/` on a GPU node, or a simulated node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverRoot {
    pub root: PathBuf,
}

impl DriverRoot {
    #[must_use]
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The first file named `soname` in the driver root's library directories.
    #[must_use]
    pub fn find_library(&self, soname: &str) -> Option<PathBuf> {
        LIBRARY_DIRS
            .iter()
            .map(|d| self.root.join(d).join(soname))
            .find(|p| p.exists())
    }

    /// Path of device node `name` (e.g. `nvidia0`) under this root.
    #[must_use]
    pub fn device(&self, name: &str) -> PathBuf {
        self.root.join("dev").join(name)
    }
}

/// A device node to create in the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNode {
    /// Path in the container, e.g. `/dev/nvidia0`.
    pub path: String,
    pub major: u32,
    pub minor: u32,
    /// Permission bits, from the host node.
    pub mode: u32,
}

/// A file or directory of the host to bind-mount into the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindMount {
    pub source: PathBuf,
    pub destination: String,
    pub read_only: bool,
    /// Nothing in it may be executed (nor mapped executable) in the container.
    pub noexec: bool,
}

/// Control devices every GPU container needs besides its GPUs.
pub const CONTROL_DEVICES: &[&str] = &["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"];

/// Library name prefixes of the driver's user-space libraries that CUDA programs load.
pub const LIBRARY_PREFIXES: &[&str] = &[
    "libcuda.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libcudadebugger.so",
    "libnvidia-gpucomp.so",
    "libnvidia-allocator.so",
    "libnvidia-opencl.so",
];

/// Tools of the driver mounted into GPU containers.
pub const BINARIES: &[&str] = &[
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("driver device {path} is missing or not a character device")]
    Device { path: PathBuf },
    #[error("no CUDA driver library (libcuda.so.*) under driver root {0}")]
    NoLibcuda(PathBuf),
    #[error("failed to read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What a driver root offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverFiles {
    pub root: DriverRoot,
    pub control_devices: Vec<DeviceNode>,
    pub mounts: Vec<BindMount>,
}

impl DriverFiles {
    /// Finds the control devices, libraries and tools of `root`.
    pub fn discover(root: &DriverRoot) -> Result<Self, DriverError> {
        let control_devices = CONTROL_DEVICES
            .iter()
            .map(|d| device_node(root, d))
            .collect::<Result<Vec<_>, _>>()?;
        let mut mounts = Vec::new();
        for dir in LIBRARY_DIRS {
            let host_dir = root.root.join(dir);
            let Ok(entries) = std::fs::read_dir(&host_dir) else {
                continue;
            };
            let mut names: Vec<String> = entries
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect();
            names.sort();
            for name in names {
                let wanted = LIBRARY_PREFIXES
                    .iter()
                    .any(|p| name.starts_with(p) && name.len() > p.len());
                if !wanted {
                    continue;
                }
                mounts.push(resolved_mount(
                    &host_dir.join(&name),
                    format!("/{dir}/{name}"),
                )?);
            }
        }
        if !mounts
            .iter()
            .any(|m| m.destination.contains("/libcuda.so."))
        {
            return Err(DriverError::NoLibcuda(root.root.clone()));
        }
        for bin in BINARIES {
            let host = root.root.join("usr/bin").join(bin);
            if host.exists() {
                mounts.push(resolved_mount(&host, format!("/usr/bin/{bin}"))?);
            }
        }
        Ok(Self {
            root: root.clone(),
            control_devices,
            mounts,
        })
    }

    /// The device node of the GPU with minor number `minor`.
    pub fn gpu_device(&self, minor: u32) -> Result<DeviceNode, DriverError> {
        device_node(&self.root, &format!("nvidia{minor}"))
    }
}

/// A read-only mount of the file `host` (symbolic links resolved, since a link cannot be
/// bind-mounted) at `destination`.
fn resolved_mount(host: &Path, destination: String) -> Result<BindMount, DriverError> {
    let source = std::fs::canonicalize(host).map_err(|source| DriverError::Io {
        path: host.to_path_buf(),
        source,
    })?;
    Ok(BindMount {
        source,
        destination,
        read_only: true,
        noexec: false,
    })
}

fn device_node(root: &DriverRoot, name: &str) -> Result<DeviceNode, DriverError> {
    let path = root.device(name);
    let meta = std::fs::metadata(&path).map_err(|_| DriverError::Device { path: path.clone() })?;
    if !meta.file_type().is_char_device() {
        return Err(DriverError::Device { path });
    }
    let rdev = meta.rdev();
    Ok(DeviceNode {
        path: format!("/dev/{name}"),
        major: major(rdev),
        minor: minor(rdev),
        mode: meta.mode() & 0o777,
    })
}

/// Major number of a Linux `dev_t` (glibc's encoding).
#[must_use]
pub fn major(dev: u64) -> u32 {
    u32::try_from(((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0000_0fff)).unwrap_or(0)
}

/// Minor number of a Linux `dev_t` (glibc's encoding).
#[must_use]
pub fn minor(dev: u64) -> u32 {
    u32::try_from(((dev >> 12) & 0xffff_ff00) | (dev & 0x0000_00ff)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn major_and_minor_decode_as_glibc_does() {
        // makedev(195, 255) and makedev(510, 1) as glibc encodes them.
        let dev = |ma: u64, mi: u64| {
            ((ma & 0xfff) << 8) | ((ma & !0xfff) << 32) | (mi & 0xff) | ((mi & !0xff) << 12)
        };
        assert_eq!((major(dev(195, 255)), minor(dev(195, 255))), (195, 255));
        assert_eq!((major(dev(510, 1)), minor(dev(510, 1))), (510, 1));
        assert_eq!(
            (major(dev(4100, 70000)), minor(dev(4100, 70000))),
            (4100, 70000)
        );
    }

    #[test]
    fn a_root_without_devices_is_refused_naming_the_device() {
        let dir = std::env::temp_dir().join(format!("gpuslice-empty-root-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let e = DriverFiles::discover(&DriverRoot::new(&dir)).unwrap_err();
        assert!(e.to_string().contains("nvidiactl"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
