//! Builds a fake driver root: the tree a GPU node has where the NVIDIA driver is installed,
//! with the fake libraries in place of the real ones and real character devices.
//!
//! ```text
//! <root>/dev/nvidia0..N           char 195:minor
//! <root>/dev/nvidiactl            char 195:255
//! <root>/dev/nvidia-modeset       char 195:254
//! <root>/dev/nvidia-uvm           char 510:0   (the real major is assigned at load time)
//! <root>/dev/nvidia-uvm-tools     char 510:1
//! <root>/usr/lib/x86_64-linux-gnu/libcuda.so.<ver>, libcuda.so.1, libcuda.so
//! <root>/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.<ver>, libnvidia-ml.so.1, libnvidia-ml.so
//! <root>/usr/lib/x86_64-linux-gnu/gpuslice-sim/node.json
//! <root>/usr/bin/nvidia-smi
//! <root>/etc/ld.so.cache          the linker cache of the root, made by `ldconfig -r`
//! <root>/proc/driver/nvidia/version, gpus/<bus id>/information   as the kernel module has them
//! <root>/run/gpuslice-sim/procs/  per-process usage records
//! ```

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use crate::node::{NODE_BESIDE_LIBRARY, NodeSpec};

/// Major number of the NVIDIA GPU and control devices.
pub const NVIDIA_MAJOR: u32 = 195;
/// Minor number of `/dev/nvidiactl`.
pub const NVIDIACTL_MINOR: u32 = 255;
/// Minor number of `/dev/nvidia-modeset`.
pub const MODESET_MINOR: u32 = 254;
/// Major number given to the simulated `nvidia-uvm` devices.
pub const UVM_MAJOR: u32 = 510;
/// Library directory inside the root.
pub const LIB_DIR: &str = "usr/lib/x86_64-linux-gnu";

/// The build artefacts that go into a driver root.
#[derive(Debug, Clone)]
pub struct Artefacts {
    pub libcuda: PathBuf,
    pub libnvml: PathBuf,
    pub nvidia_smi: PathBuf,
}

impl Artefacts {
    /// The artefacts beside `dir` (a cargo target directory such as `target/debug`).
    #[must_use]
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            libcuda: dir.join("libcuda.so"),
            libnvml: dir.join("libnvidia_ml.so"),
            nvidia_smi: dir.join("nvidia-smi"),
        }
    }

    pub fn check(&self) -> Result<(), DriverRootError> {
        for p in [&self.libcuda, &self.libnvml, &self.nvidia_smi] {
            if !p.exists() {
                return Err(DriverRootError::Missing(p.clone()));
            }
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DriverRootError {
    #[error("{0} is missing: build the workspace first (cargo build --workspace)")]
    Missing(PathBuf),
    #[error("failed to write {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "failed to create device node {path} ({major}:{minor}); creating device nodes needs root (or pass --no-devices)"
    )]
    Mknod {
        path: PathBuf,
        major: u32,
        minor: u32,
        #[source]
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DriverRootError + '_ {
    move |source| DriverRootError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The runtime configuration (`/etc/gpuslice/runtime.json`) that points gpuslice-runtime
/// and gpuslice-hook at the driver root `root` holding `spec`: its `driver_root`, and as
/// `extra_mounts` what the fake libraries need inside a container besides the driver's own
/// files (the node description at its system path, since in a container the fake driver
/// lies under a private name in another directory, and the shared state directory, where
/// every process of the node records its device memory as a real driver keeps it in the
/// kernel).
#[must_use]
pub fn runtime_config(root: &Path, spec: &NodeSpec) -> serde_json::Value {
    let description = crate::node::NODE_SYSTEM_PATH;
    let state = spec.state_dir.display().to_string();
    serde_json::json!({
        "driver_root": root,
        "extra_mounts": [
            {"source": root.join(LIB_DIR).join(NODE_BESIDE_LIBRARY), "destination": description, "read_only": true},
            {"source": spec.state_dir, "destination": state, "read_only": false},
        ],
    })
}

/// Creates the driver root at `root` for `spec` (whose `state_dir` should lie inside it).
pub fn create(
    root: &Path,
    spec: &NodeSpec,
    artefacts: &Artefacts,
    devices: bool,
) -> Result<(), DriverRootError> {
    artefacts.check()?;
    let lib = root.join(LIB_DIR);
    let bin = root.join("usr/bin");
    for d in [
        &lib,
        &bin,
        &root.join("dev"),
        &root.join("etc"),
        &crate::procs::dir(&spec.state_dir),
        &lib.join("gpuslice-sim"),
    ] {
        std::fs::create_dir_all(d).map_err(io(d))?;
    }
    let ver = &spec.driver_version;
    install_library(&artefacts.libcuda, &lib, "libcuda.so", ver)?;
    install_library(&artefacts.libnvml, &lib, "libnvidia-ml.so", ver)?;
    copy(&artefacts.nvidia_smi, &bin.join("nvidia-smi"))?;
    let node_file = lib.join(NODE_BESIDE_LIBRARY);
    let json = serde_json::to_string_pretty(spec).unwrap_or_default();
    std::fs::write(&node_file, json + "\n").map_err(io(&node_file))?;
    set_mode(&crate::procs::dir(&spec.state_dir), 0o1777)?;
    write_procfs(root, spec)?;
    linker_cache(root)?;
    if devices {
        let dev = root.join("dev");
        for g in &spec.gpus {
            mknod(
                &dev.join(format!("nvidia{}", g.minor)),
                NVIDIA_MAJOR,
                g.minor,
            )?;
        }
        mknod(&dev.join("nvidiactl"), NVIDIA_MAJOR, NVIDIACTL_MINOR)?;
        mknod(&dev.join("nvidia-modeset"), NVIDIA_MAJOR, MODESET_MINOR)?;
        mknod(&dev.join("nvidia-uvm"), UVM_MAJOR, 0)?;
        mknod(&dev.join("nvidia-uvm-tools"), UVM_MAJOR, 1)?;
    }
    Ok(())
}

/// The kernel module's files under `/proc/driver/nvidia` that name the driver version and,
/// per GPU, its UUID and device minor number, as the real module writes them.
fn write_procfs(root: &Path, spec: &NodeSpec) -> Result<(), DriverRootError> {
    let nvidia = root.join("proc/driver/nvidia");
    let write = |path: PathBuf, text: String| {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
        }
        std::fs::write(&path, text).map_err(io(&path))
    };
    write(
        nvidia.join("version"),
        format!(
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {}  (simulated)\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n",
            spec.driver_version
        ),
    )?;
    for g in &spec.gpus {
        let bus = proc_bus_id(&g.pci_bus_id);
        write(
            nvidia.join("gpus").join(&bus).join("information"),
            format!(
                "Model: \t\t {}\nIRQ:   \t\t 0\nGPU UUID: \t {}\nBus Type: \t PCIe\nBus Location: \t {bus}\nDevice Minor: \t {}\nGPU Excluded:\t No\n",
                g.name, g.uuid, g.minor
            ),
        )?;
    }
    Ok(())
}

/// A PCI bus id as procfs names it: a 4-digit domain, lower case (NVML writes 8 digits).
#[must_use]
pub fn proc_bus_id(nvml: &str) -> String {
    match nvml.split_once(':') {
        Some((domain, rest)) => {
            let domain = u32::from_str_radix(domain, 16).unwrap_or(0);
            format!("{domain:04x}:{}", rest.to_lowercase())
        }
        None => nvml.to_lowercase(),
    }
}

/// Builds the root's linker cache with glibc's `ldconfig -r`, as a driver's installer leaves
/// the host's.
fn linker_cache(root: &Path) -> Result<(), DriverRootError> {
    let status = ["ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"]
        .iter()
        .find_map(|l| {
            std::process::Command::new(l)
                .arg("-r")
                .arg(root)
                .status()
                .ok()
        });
    match status {
        Some(s) if s.success() => Ok(()),
        _ => Err(DriverRootError::Io {
            path: root.join("etc/ld.so.cache"),
            source: std::io::Error::other("ldconfig -r failed or was not found"),
        }),
    }
}

fn install_library(
    src: &Path,
    lib: &Path,
    stem: &str,
    version: &str,
) -> Result<(), DriverRootError> {
    let real = format!("{stem}.{version}");
    copy(src, &lib.join(&real))?;
    for (link, target) in [
        (format!("{stem}.1"), real),
        (stem.to_string(), format!("{stem}.1")),
    ] {
        let p = lib.join(link);
        let _ = std::fs::remove_file(&p);
        symlink(&target, &p).map_err(io(&p))?;
    }
    Ok(())
}

fn copy(src: &Path, dst: &Path) -> Result<(), DriverRootError> {
    // Replace rather than overwrite: a running process may have the old file mapped.
    let tmp = dst.with_extension("gpuslice-tmp");
    std::fs::copy(src, &tmp).map_err(io(dst))?;
    std::fs::rename(&tmp, dst).map_err(io(dst))
}

fn set_mode(path: &Path, mode: u32) -> Result<(), DriverRootError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io(path))
}

#[allow(unsafe_code)]
fn mknod(path: &Path, major: u32, minor: u32) -> Result<(), DriverRootError> {
    use std::os::unix::ffi::OsStrExt;
    let _ = std::fs::remove_file(path);
    let c =
        std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| DriverRootError::Io {
            path: path.into(),
            source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
        })?;
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call; mknod reads it only.
    let rc = unsafe {
        libc::mknod(
            c.as_ptr(),
            libc::S_IFCHR | 0o666,
            libc::makedev(major, minor),
        )
    };
    if rc != 0 {
        return Err(DriverRootError::Mknod {
            path: path.into(),
            major,
            minor,
            source: std::io::Error::last_os_error(),
        });
    }
    set_mode(path, 0o666)
}
