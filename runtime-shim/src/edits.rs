//! What a GPU container gets, as data: device nodes with their cgroup rules, bind mounts and
//! hooks. Built from a claim and the driver's files; applied to an OCI spec by
//! [`crate::spec::apply`], and imperatively by the prestart hook.

use std::path::PathBuf;

use crate::driver::{BindMount, DeviceNode, DriverError, DriverFiles};
use gpuslice_core::claim::Claim;
use gpuslice_core::layout::{FRONTS, Front, REAL_DRIVER_DIR};
use gpuslice_core::usage;

pub use gpuslice_core::layout::CONTAINER_RUN_DIR;
/// Where the interception library appears inside every GPU container.
pub const INTERCEPTION_LIBRARY: &str = "/usr/lib/gpuslice/libgpuslice.so";

/// A lifecycle point of the OCI runtime spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookPoint {
    /// After the runtime made the container (its cgroups included), before its program
    /// runs: the container's pid is reported here, so that its cgroups are read before
    /// anything in it can move.
    CreateRuntime,
    CreateContainer,
    Poststop,
}

impl HookPoint {
    /// The key under `hooks` in config.json.
    #[must_use]
    pub fn key(self) -> &'static str {
        match self {
            Self::CreateRuntime => "createRuntime",
            Self::CreateContainer => "createContainer",
            Self::Poststop => "poststop",
        }
    }
}

/// An OCI hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hook {
    pub point: HookPoint,
    pub path: String,
    pub args: Vec<String>,
    /// `KEY=value` entries; runtimes start hooks with this environment only.
    pub env: Vec<String>,
    pub timeout_seconds: Option<u32>,
}

/// Host paths the edits refer to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPaths {
    /// The container's directory made by the agent (`/run/gpuslice/<id>`).
    pub container_dir: PathBuf,
    /// `libgpuslice.so` on the host; the fronts ([`FRONTS`]) lie beside it.
    pub interception_library: PathBuf,
    /// `gpuslice-hook` on the host.
    pub hook: PathBuf,
    /// Environment of the hooks (e.g. the agent's bus address when it is not the system bus).
    pub hook_env: Vec<String>,
}

/// Everything to add to a container for its claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edits {
    pub devices: Vec<DeviceNode>,
    pub mounts: Vec<BindMount>,
    pub hooks: Vec<Hook>,
    /// Paths hidden in the container (`linux.maskedPaths`): other GPUs' procfs entries.
    pub masked_paths: Vec<String>,
    /// `KEY=value` entries set in the container's environment, replacing the image's.
    pub env: Vec<String>,
}

impl Edits {
    /// The edits for `claim`: its GPUs' device nodes and the control devices, the driver's
    /// files, the container directory (with the limits file mounted read-only on top), and
    /// the hooks that report the container's start and stop to the agent; the other GPUs'
    /// procfs entries masked, and `NVIDIA_VISIBLE_DEVICES` set to the granted GPUs' UUIDs (as
    /// NVIDIA's device plugin sets it), for tools that read it. Every name of
    /// `libcuda.so` and `libnvidia-ml.so` is the front of that library, which needs the
    /// interception library and then the real library, mounted under a private name in
    /// [`REAL_DRIVER_DIR`]: whatever loads the driver gets the interception library in front
    /// of it, and a process that does not load it pays nothing.
    pub fn for_claim(
        claim: &Claim,
        driver: &DriverFiles,
        host: &HostPaths,
    ) -> Result<Self, DriverError> {
        let mut devices = driver.control_devices.clone();
        for g in &claim.gpus {
            devices.push(driver.gpu_device(g.minor)?);
        }
        // The container's directory is read-only inside (its limits file cannot be replaced,
        // nothing can be planted beside it); only the usage region, which its processes
        // update, is writable, and nothing there may be executed.
        let mut mounts = vec![
            BindMount {
                source: host.container_dir.clone(),
                destination: CONTAINER_RUN_DIR.into(),
                read_only: true,
                noexec: true,
            },
            BindMount {
                source: host.container_dir.join(usage::FILE_NAME),
                destination: format!("{CONTAINER_RUN_DIR}/{}", usage::FILE_NAME),
                read_only: false,
                noexec: true,
            },
        ];
        let mut real: Vec<(Front, PathBuf)> = Vec::new();
        for m in &driver.mounts {
            let name = m.destination.rsplit('/').next().unwrap_or_default();
            match FRONTS.iter().find(|f| f.covers(name)) {
                Some(f) => {
                    if !real.iter().any(|(r, _)| r == f) {
                        real.push((*f, m.source.clone()));
                    }
                    mounts.push(BindMount {
                        source: front_path(host, f),
                        ..m.clone()
                    });
                }
                None => mounts.push(m.clone()),
            }
        }
        for (f, source) in real {
            mounts.push(BindMount {
                source,
                destination: format!("{REAL_DRIVER_DIR}/{}", f.real),
                read_only: true,
                noexec: false,
            });
        }
        mounts.push(BindMount {
            source: host.interception_library.clone(),
            destination: INTERCEPTION_LIBRARY.into(),
            read_only: true,
            noexec: false,
        });
        let hook = |point: HookPoint, verb: &str| Hook {
            point,
            path: host.hook.display().to_string(),
            args: vec!["gpuslice-hook".into(), verb.into()],
            env: host.hook_env.clone(),
            timeout_seconds: Some(10),
        };
        let own: Vec<u32> = claim.gpus.iter().map(|g| g.minor).collect();
        let uuids: Vec<&str> = claim.gpus.iter().map(|g| g.uuid.as_str()).collect();
        Ok(Self {
            devices,
            mounts,
            masked_paths: driver.foreign_gpu_proc_dirs(&own),
            env: vec![format!(
                "{}={}",
                crate::nvidia_env::VISIBLE_DEVICES,
                uuids.join(",")
            )],
            hooks: vec![
                hook(HookPoint::CreateContainer, "update-ldcache"),
                hook(HookPoint::CreateRuntime, "activate"),
                hook(HookPoint::Poststop, "poststop"),
            ],
        })
    }
}

/// The host file of `front`: beside the interception library.
#[must_use]
pub fn front_path(host: &HostPaths, front: &Front) -> PathBuf {
    host.interception_library.with_file_name(front.file)
}
