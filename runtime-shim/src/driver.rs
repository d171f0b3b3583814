//! The driver's files a GPU container needs, found in a driver root: device nodes (with the
//! major and minor numbers the host has), the driver's user-space libraries and tools. A
//! driver that needs more files beside these (a simulated node's description and state) says
//! so through the configuration's `extra_mounts`, not here.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::nvidia_env::{Capabilities, Capability};

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
/// Control devices given when the node has them (`nvidia-modeset` comes with display
/// drivers only).
pub const OPTIONAL_DEVICES: &[&str] = &["nvidia-modeset"];

/// The driver's user-space libraries by the capability that brings them, as the NVIDIA
/// container toolkit lists them (each a name prefix: `libcuda.so` covers `libcuda.so.1` and
/// `libcuda.so.<driver version>`).
pub const LIBRARIES: &[(Capability, &[&str])] = &[
    (
        Capability::Utility,
        &["libnvidia-ml.so", "libnvidia-cfg.so", "libnvidia-nscq.so"],
    ),
    (
        Capability::Compute,
        &[
            "libcuda.so",
            "libcudadebugger.so",
            "libnvidia-opencl.so",
            "libnvidia-gpucomp.so",
            "libnvidia-ptxjitcompiler.so",
            "libnvidia-fatbinaryloader.so",
            "libnvidia-allocator.so",
            "libnvidia-compiler.so",
            "libnvidia-pkcs11.so",
            "libnvidia-pkcs11-openssl3.so",
            "libnvidia-nvvm.so",
            "libnvidia-tileiras.so",
        ],
    ),
    (
        Capability::Video,
        &[
            "libvdpau_nvidia.so",
            "libnvidia-encode.so",
            "libnvidia-opticalflow.so",
            "libnvcuvid.so",
        ],
    ),
    (
        Capability::Graphics,
        &[
            "libnvidia-eglcore.so",
            "libnvidia-glcore.so",
            "libnvidia-tls.so",
            "libnvidia-glsi.so",
            "libnvidia-fbc.so",
            "libnvidia-ifr.so",
            "libnvidia-rtcore.so",
            "libnvoptix.so",
            "libGLX_nvidia.so",
            "libEGL_nvidia.so",
            "libGLESv2_nvidia.so",
            "libGLESv1_CM_nvidia.so",
            "libnvidia-glvkspirv.so",
            "libnvidia-cbl.so",
        ],
    ),
    (Capability::Ngx, &["libnvidia-ngx.so"]),
];

/// Libraries that get their unversioned development name (`libcuda.so` → the driver's
/// library) even where the host has none, as the toolkit links it: programs that build
/// kernels at run time (Triton, `torch.compile`) link with `-lcuda`.
pub const DEVELOPMENT_LINKS: &[&str] = &["libcuda.so"];

/// The driver's tools by capability, as the toolkit lists them.
pub const BINARIES: &[(Capability, &[&str])] = &[
    (
        Capability::Utility,
        &[
            "nvidia-smi",
            "nvidia-debugdump",
            "nvidia-persistenced",
            "nv-fabricmanager",
        ],
    ),
    (
        Capability::Compute,
        &["nvidia-cuda-mps-control", "nvidia-cuda-mps-server"],
    ),
];

/// Where tools are looked for under the driver root, in the order of a default `PATH`.
pub const BINARY_DIRS: &[&str] = &[
    "usr/local/sbin",
    "usr/local/bin",
    "usr/sbin",
    "usr/bin",
    "sbin",
    "bin",
];

/// Sockets of the driver's daemons a container talks to, by capability (the toolkit's IPC
/// paths). The MPS control directory is left out on purpose: through it a client can change
/// the limits of every other client of the server (see `docs/runtime.md`).
pub const SOCKETS: &[(Capability, &str)] = &[
    (Capability::Utility, "var/run/nvidia-persistenced/socket"),
    (Capability::Compute, "var/run/nvidia-fabricmanager/socket"),
];

/// The loader configuration files through which Vulkan and EGL find the NVIDIA driver
/// (graphics), at the paths the driver's installer uses: given read-only where present.
pub const GRAPHICS_CONFIG: &[&str] = &[
    "etc/vulkan/icd.d/nvidia_icd.json",
    "usr/share/vulkan/icd.d/nvidia_icd.json",
    "etc/vulkan/implicit_layer.d/nvidia_layers.json",
    "usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
    "usr/share/glvnd/egl_vendor.d/10_nvidia.json",
    "usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
    "usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
];

/// The kernel module's description of itself, which names the driver version.
pub const PROC_VERSION: &str = "proc/driver/nvidia/version";
/// One directory per GPU, named by PCI bus id, with an `information` file.
pub const PROC_GPUS: &str = "proc/driver/nvidia/gpus";

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("driver device {path} is missing or not a character device")]
    Device { path: PathBuf },
    #[error("no CUDA driver library (libcuda.so.*) of driver {version} under driver root {root}")]
    NoLibcuda { root: PathBuf, version: String },
    #[error(
        "the driver version under driver root {0} is unknown: neither {PROC_VERSION} nor sys/module/nvidia/version names it, and libcuda.so.1 is not a link to libcuda.so.<version>"
    )]
    NoVersion(PathBuf),
    #[error("failed to read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    LdCache(#[from] crate::ldcache::LdCacheError),
}

/// What a driver root offers a container with some capabilities.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverFiles {
    pub root: DriverRoot,
    /// The driver version (`580.95.05`): only libraries of this version are given.
    pub version: String,
    pub control_devices: Vec<DeviceNode>,
    pub mounts: Vec<BindMount>,
}

impl DriverFiles {
    /// Finds what `root` offers for `capabilities`, as the NVIDIA toolkit does: the control
    /// devices; the libraries of each capability that the linker cache (or, without one, the
    /// library directories) names, of the driver's version only; the tools; the daemons'
    /// sockets; the GSP firmware.
    pub fn discover(root: &DriverRoot, capabilities: Capabilities) -> Result<Self, DriverError> {
        let mut control_devices = CONTROL_DEVICES
            .iter()
            .map(|d| device_node(root, d))
            .collect::<Result<Vec<_>, _>>()?;
        control_devices.extend(
            OPTIONAL_DEVICES
                .iter()
                .filter_map(|d| device_node(root, d).ok()),
        );
        let version = root.driver_version()?;
        let mut mounts = libraries(root, capabilities, &version)?;
        if capabilities.has(Capability::Compute)
            && !mounts
                .iter()
                .any(|m| m.destination.contains("/libcuda.so."))
        {
            return Err(DriverError::NoLibcuda {
                root: root.root.clone(),
                version,
            });
        }
        for (cap, names) in BINARIES {
            if !capabilities.has(*cap) {
                continue;
            }
            for name in *names {
                let found = BINARY_DIRS
                    .iter()
                    .map(|d| (d, root.root.join(d).join(name)))
                    .find(|(_, p)| p.is_file());
                if let Some((dir, host)) = found {
                    mounts.push(resolved_mount(&host, format!("/{dir}/{name}"))?);
                }
            }
        }
        for (cap, socket) in SOCKETS {
            let host = root.root.join(socket);
            if capabilities.has(*cap) && host.exists() {
                mounts.push(BindMount {
                    source: host,
                    destination: format!("/{socket}"),
                    read_only: false,
                    noexec: true,
                });
            }
        }
        if capabilities.has(Capability::Graphics) {
            for file in GRAPHICS_CONFIG {
                let host = root.root.join(file);
                if host.is_file() {
                    mounts.push(resolved_mount(&host, format!("/{file}"))?);
                }
            }
        }
        if capabilities.has(Capability::Compute) || capabilities.has(Capability::Utility) {
            mounts.extend(firmware(root, &version));
        }
        Ok(Self {
            root: root.clone(),
            version,
            control_devices,
            mounts,
        })
    }

    /// The device node of the GPU with minor number `minor`.
    pub fn gpu_device(&self, minor: u32) -> Result<DeviceNode, DriverError> {
        device_node(&self.root, &format!("nvidia{minor}"))
    }

    /// The container paths of the `/proc/driver/nvidia/gpus/<bus id>` directories of every
    /// GPU whose minor number is not in `own`: masked, so that a container learns nothing of
    /// the GPUs it was not given.
    #[must_use]
    pub fn foreign_gpu_proc_dirs(&self, own: &[u32]) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.root.root.join(PROC_GPUS)) else {
            return Vec::new();
        };
        let mut dirs: Vec<String> = entries
            .flatten()
            .filter(|e| {
                let info =
                    std::fs::read_to_string(e.path().join("information")).unwrap_or_default();
                proc_minor(&info).is_none_or(|m| !own.contains(&m))
            })
            .filter_map(|e| e.file_name().into_string().ok())
            .map(|bus| format!("/{PROC_GPUS}/{bus}"))
            .collect();
        dirs.sort();
        dirs
    }
}

impl DriverRoot {
    /// The driver version: from the kernel module when it is loaded, else from the name
    /// `libcuda.so.1` links to (as the driver's installer lays it out).
    pub fn driver_version(&self) -> Result<String, DriverError> {
        let proc = std::fs::read_to_string(self.root.join(PROC_VERSION)).unwrap_or_default();
        // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 ..."
        let from_proc = proc.lines().find_map(|l| {
            l.strip_prefix("NVRM version:")?
                .split_whitespace()
                .find(|w| is_version(w))
                .map(str::to_string)
        });
        let from_sys = || {
            std::fs::read_to_string(self.root.join("sys/module/nvidia/version"))
                .ok()
                .map(|v| v.trim().to_string())
                .filter(|v| is_version(v))
        };
        let from_library = || {
            LIBRARY_DIRS.iter().find_map(|d| {
                let target = std::fs::read_link(self.root.join(d).join(CUDA_SONAME)).ok()?;
                let name = target.file_name()?.to_str()?;
                name.strip_prefix("libcuda.so.")
                    .filter(|v| is_version(v))
                    .map(str::to_string)
            })
        };
        from_proc
            .or_else(from_sys)
            .or_else(from_library)
            .ok_or_else(|| DriverError::NoVersion(self.root.clone()))
    }
}

/// A driver version: dot-separated numbers, at least two.
fn is_version(s: &str) -> bool {
    s.split('.').count() >= 2
        && s.split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// `Device Minor: N` in a GPU's `information` file.
fn proc_minor(information: &str) -> Option<u32> {
    information
        .lines()
        .find_map(|l| l.strip_prefix("Device Minor:")?.trim().parse().ok())
}

/// Every name of every library of `capabilities` whose file is of driver `version`: the
/// linker cache's names first, then the library directories' (a root without a cache, or
/// names the cache leaves out). A name whose file is of another version (a library left
/// behind by an older driver) is skipped, as the toolkit does.
fn libraries(
    root: &DriverRoot,
    capabilities: Capabilities,
    version: &str,
) -> Result<Vec<BindMount>, DriverError> {
    let stems: Vec<&str> = LIBRARIES
        .iter()
        .filter(|(c, _)| capabilities.has(*c))
        .flat_map(|(_, s)| s.iter().copied())
        .collect();
    let wanted = |name: &str| {
        stems.iter().any(|s| {
            name.strip_prefix(s)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
        })
    };
    // (path in the container, path on the host)
    let mut names: Vec<(String, PathBuf)> = Vec::new();
    let cache = root.root.join("etc/ld.so.cache");
    if cache.exists() {
        let compat32 = capabilities.has(Capability::Compat32);
        for e in crate::ldcache::read(&cache)? {
            if (e.arch == crate::ldcache::Arch::Native || compat32) && wanted(&e.name) {
                let inside = e.path.display().to_string();
                let host = root.root.join(inside.trim_start_matches('/'));
                names.push((inside, host));
            }
        }
    }
    for dir in LIBRARY_DIRS {
        let Ok(entries) = std::fs::read_dir(root.root.join(dir)) else {
            continue;
        };
        let mut found: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| wanted(n))
            .collect();
        found.sort();
        names.extend(
            found
                .into_iter()
                .map(|n| (format!("/{dir}/{n}"), root.root.join(dir).join(n))),
        );
    }
    let suffix = format!(".so.{version}");
    let mut mounts: Vec<BindMount> = Vec::new();
    for (inside, host) in names {
        if mounts.iter().any(|m| m.destination == inside) {
            continue;
        }
        let Ok(m) = resolved_mount(&host, inside) else {
            continue;
        };
        if m.source.to_str().is_some_and(|s| s.ends_with(&suffix)) {
            mounts.push(m);
        }
    }
    for stem in DEVELOPMENT_LINKS.iter().filter(|s| stems.contains(s)) {
        let soname = mounts
            .iter()
            .find(|m| m.destination.ends_with(&format!("/{stem}.1")))
            .cloned();
        if let Some(m) = soname {
            let link = format!(
                "{}/{stem}",
                m.destination.rsplit_once('/').map_or("", |(d, _)| d)
            );
            if !mounts.iter().any(|x| x.destination == link) {
                mounts.push(BindMount {
                    destination: link,
                    ..m
                });
            }
        }
    }
    Ok(mounts)
}

/// The GSP firmware of driver `version` (`/lib/firmware/nvidia/<version>/gsp*.bin`).
fn firmware(root: &DriverRoot, version: &str) -> Vec<BindMount> {
    let dir = format!("lib/firmware/nvidia/{version}");
    let Ok(entries) = std::fs::read_dir(root.root.join(&dir)) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("gsp") && n.ends_with(".bin"))
        .collect();
    names.sort();
    names
        .into_iter()
        .filter_map(|n| resolved_mount(&root.root.join(&dir).join(&n), format!("/{dir}/{n}")).ok())
        .collect()
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
        let e = DriverFiles::discover(&DriverRoot::new(&dir), Capabilities::DEFAULT).unwrap_err();
        assert!(e.to_string().contains("nvidiactl"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
