//! The prestart (`createRuntime`) path, for engines that can only run hooks: the same edit as
//! the wrapper's, done imperatively. runc runs these hooks after the container's mounts are
//! set up and before it pivots into its root, so the host's paths are still visible in the
//! container's mount namespace: the hook enters that namespace and bind-mounts the driver's
//! files, the limits directory and the preload list into the root filesystem, creates the
//! device nodes, and opens the devices in the container's device cgroup.

use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use gpuslice_core::edits::Edits;
use gpuslice_runtime_shim::config::Config;
use gpuslice_runtime_shim::inject::{self, Release};
use serde::{Deserialize, Serialize};

/// What to do inside the container's mount namespace (sent to the helper on stdin).
#[derive(Debug, Serialize, Deserialize)]
pub struct MountPlan {
    pub rootfs: PathBuf,
    /// (path in the container, major, minor, mode)
    pub devices: Vec<(String, u32, u32, u32)>,
    /// (host source, path in the container, read-only)
    pub mounts: Vec<(PathBuf, String, bool)>,
}

/// Claims the slice and injects it into the container `id` whose init process is `pid`.
pub fn prestart(id: &str, pid: u32, bundle: &Path) -> Result<()> {
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle.join("config.json"))?)
            .context("config.json is not JSON")?;
    let cfg = Config::load()?;
    let Some(edits) = inject::claim_and_plan(id, &spec, Some(bundle), Release::ByHook, &cfg)?
    else {
        return Ok(());
    };
    let result = inject_into(pid, &inject::rootfs(&spec, Some(bundle)), &edits);
    if result.is_err() {
        let _ = inject::release(id, &cfg);
    }
    result.with_context(|| {
        format!(
            "container {id}: the GPU slice could not be set up, so the container is not started"
        )
    })
}

fn inject_into(pid: u32, rootfs: &Path, edits: &Edits) -> Result<()> {
    let plan = MountPlan {
        rootfs: rootfs.to_path_buf(),
        devices: edits
            .devices
            .iter()
            .map(|d| (d.path.clone(), d.major, d.minor, d.mode))
            .collect(),
        mounts: edits
            .mounts
            .iter()
            .map(|m| (m.source.clone(), m.destination.clone(), m.read_only))
            .collect(),
    };
    // Joining a mount namespace needs a single-threaded process: a fresh one does it.
    let mut child = Command::new(std::env::current_exe()?)
        .args(["enter-mount-namespace", &pid.to_string()])
        .stdin(Stdio::piped())
        .spawn()
        .context("failed to start the mount-namespace helper")?;
    serde_json::to_writer(child.stdin.take().context("helper stdin")?, &plan)?;
    let status = child.wait()?;
    anyhow::ensure!(
        status.success(),
        "injecting into the container's mount namespace failed ({status})"
    );
    allow_devices(pid, edits)
}

/// Opens the container's device cgroup to its devices.
fn allow_devices(pid: u32, edits: &Edits) -> Result<()> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .context("failed to read the container's cgroups")?;
    let v1 = cgroups.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "devices")
            .then(|| path.to_string())
    });
    let Some(path) = v1 else {
        bail!(
            "the container has no cgroup v1 devices controller; on cgroup v2 use gpuslice-runtime, which hands the device rules to the runtime"
        );
    };
    let allow = Path::new("/sys/fs/cgroup/devices")
        .join(path.trim_start_matches('/'))
        .join("devices.allow");
    for d in &edits.devices {
        std::fs::write(&allow, format!("c {}:{} rwm", d.major, d.minor))
            .with_context(|| format!("failed to write {}", allow.display()))?;
    }
    Ok(())
}

/// `rootfs` joined with a path of the container, refusing to pass through a symbolic link:
/// the root filesystem is the image's, and a link there must not lead a mount onto the host.
fn contained(rootfs: &Path, inner: &str) -> Result<PathBuf> {
    let mut path = rootfs.to_path_buf();
    for c in Path::new(inner).components() {
        match c {
            Component::Normal(part) => {
                path.push(part);
                if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
                    bail!(
                        "refusing to follow the symbolic link {} in the container's root filesystem",
                        path.display()
                    );
                }
            }
            Component::RootDir | Component::CurDir => {}
            _ => bail!("{inner:?} is not a plain absolute path"),
        }
    }
    Ok(path)
}

/// The helper: joins the mount namespace of `pid` and carries out the plan read from stdin.
pub fn enter_mount_namespace(pid: &str) -> Result<()> {
    use nix::mount::{MsFlags, mount};
    use nix::sched::{CloneFlags, setns};
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};

    let mut text = String::new();
    std::io::stdin().read_to_string(&mut text)?;
    let plan: MountPlan = serde_json::from_str(&text)?;
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/mnt"))
        .with_context(|| format!("no mount namespace for pid {pid}"))?;
    setns(&ns, CloneFlags::CLONE_NEWNS)
        .context("failed to join the container's mount namespace")?;
    for (inner, major, minor, mode) in &plan.devices {
        let path = contained(&plan.rootfs, inner)?;
        let _ = std::fs::remove_file(&path);
        mknod(
            &path,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(*mode),
            makedev(u64::from(*major), u64::from(*minor)),
        )
        .with_context(|| format!("failed to create {}", path.display()))?;
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(*mode))?;
    }
    for (source, inner, read_only) in &plan.mounts {
        let target = contained(&plan.rootfs, inner)?;
        if source.is_dir() {
            std::fs::create_dir_all(&target)?;
        } else if !target.exists() {
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::File::create(&target)?;
        }
        mount(
            Some(source.as_path()),
            &target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .with_context(|| {
            format!(
                "failed to bind {} on {}",
                source.display(),
                target.display()
            )
        })?;
        if *read_only {
            let flags = MsFlags::MS_BIND
                | MsFlags::MS_REMOUNT
                | MsFlags::MS_RDONLY
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NODEV;
            mount(None::<&str>, &target, None::<&str>, flags, None::<&str>)
                .with_context(|| format!("failed to make {} read-only", target.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symbolic_link_in_the_root_filesystem_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("usr")).unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("usr/lib")).unwrap();
        assert!(contained(dir.path(), "/usr/lib/libcuda.so.1").is_err());
        assert_eq!(
            contained(dir.path(), "/usr/bin/x").unwrap(),
            dir.path().join("usr/bin/x")
        );
        assert!(contained(dir.path(), "/../etc/passwd").is_err());
    }
}
