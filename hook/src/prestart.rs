//! The prestart (`createRuntime`) path, for engines that can only run hooks: the same edit as
//! the wrapper's, done imperatively. runc runs these hooks after the container's mounts are
//! set up and before it pivots into its root, so the host's paths are still visible in the
//! container's mount namespace: the hook enters that namespace and bind-mounts the driver's
//! files, the limits directory and the preload list into the root filesystem, creates the
//! device nodes, and opens the devices in the container's device cgroup.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result};
use gpuslice_runtime_shim::edits::Edits;
use gpuslice_runtime_shim::inject::{self, Reporting};
use serde::{Deserialize, Serialize};

/// What to do inside the container's mount namespace (sent to the helper on stdin).
#[derive(Debug, Serialize, Deserialize)]
pub struct MountPlan {
    pub rootfs: PathBuf,
    /// (path in the container, major, minor, mode)
    pub devices: Vec<(String, u32, u32, u32)>,
    /// (host source, path in the container, read-only)
    /// (source, destination in the container, read-only, noexec)
    pub mounts: Vec<(PathBuf, String, bool, bool)>,
}

/// Claims the slice and injects it into the container `id` whose init process is `pid`.
pub fn prestart(id: &str, pid: u32, bundle: &Path) -> Result<()> {
    let spec = crate::read_spec(bundle)?;
    let cfg = crate::config()?;
    let Some(edits) =
        inject::claim_and_plan(id, None, &spec, Some(bundle), Reporting::ByHooks, &cfg)?
    else {
        return Ok(());
    };
    // The pid is reported here, before the container's program runs (see `activate`).
    let result = inject_into(pid, &inject::rootfs(&spec, Some(bundle)), &edits, &spec)
        .and_then(|()| inject::activate(id, pid, &cfg));
    if result.is_err() {
        let _ = inject::release(id, None, &cfg);
    }
    result.with_context(|| {
        format!(
            "container {id}: the GPU slice could not be set up, so the container is not started"
        )
    })
}

fn inject_into(pid: u32, rootfs: &Path, edits: &Edits, spec: &serde_json::Value) -> Result<()> {
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
            .map(|m| {
                (
                    m.source.clone(),
                    m.destination.clone(),
                    m.read_only,
                    m.noexec,
                )
            })
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
    allow_devices(pid, edits, spec)
}

/// Opens the container's device cgroup to its devices: on cgroup v1 by writing its
/// `devices.allow`; on cgroup v2 by replacing the runtime's eBPF device program with one that
/// allows the spec's rules, the runtime's default devices and the GPU's.
fn allow_devices(pid: u32, edits: &Edits, spec: &serde_json::Value) -> Result<()> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .context("failed to read the container's cgroups")?;
    let mut v1 = None;
    let mut v2 = None;
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if controllers.split(',').any(|c| c == "devices") {
            v1 = Some(path.to_string());
        } else if id == "0" && controllers.is_empty() {
            v2 = Some(path.to_string());
        }
    }
    if let Some(path) = v1 {
        let allow = Path::new("/sys/fs/cgroup/devices")
            .join(path.trim_start_matches('/'))
            .join("devices.allow");
        for d in &edits.devices {
            std::fs::write(&allow, format!("c {}:{} rwm", d.major, d.minor))
                .with_context(|| format!("failed to write {}", allow.display()))?;
        }
        return Ok(());
    }
    let path =
        v2.context("the container is in neither a cgroup v1 devices cgroup nor a cgroup v2 one")?;
    let root = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "/sys/fs/cgroup"
    } else {
        "/sys/fs/cgroup/unified"
    };
    let dir = Path::new(root).join(path.trim_start_matches('/'));
    allow_devices_v2(&dir, &spec["linux"]["resources"]["devices"], &edits.devices)
}

/// The devices runc allows every container besides the spec's rules (its `AllowedDevices`):
/// (type, major, minor, access), `None` for a wildcard.
const RUNTIME_DEFAULT_DEVICES: &[(char, Option<i64>, Option<i64>, &str)] = &[
    ('c', None, None, "m"),
    ('b', None, None, "m"),
    ('c', Some(1), Some(3), "rwm"),    // /dev/null
    ('c', Some(1), Some(8), "rwm"),    // /dev/random
    ('c', Some(1), Some(7), "rwm"),    // /dev/full
    ('c', Some(5), Some(0), "rwm"),    // /dev/tty
    ('c', Some(1), Some(5), "rwm"),    // /dev/zero
    ('c', Some(1), Some(9), "rwm"),    // /dev/urandom
    ('c', Some(5), Some(1), "rwm"),    // /dev/console
    ('c', Some(136), None, "rwm"),     // /dev/pts/*
    ('c', Some(5), Some(2), "rwm"),    // /dev/ptmx
    ('c', Some(10), Some(200), "rwm"), // /dev/net/tun
];

/// Replaces the eBPF device program of the cgroup v2 `dir` by one allowing `spec_rules`
/// (the spec's `linux.resources.devices`), the devices runc allows every container, and
/// `devices`. The rules are folded and compiled into a program by youki's libcgroups.
pub fn allow_devices_v2(
    dir: &Path,
    spec_rules: &serde_json::Value,
    devices: &[gpuslice_runtime_shim::driver::DeviceNode],
) -> Result<()> {
    use libcgroups::v2::devices::bpf::prog;
    use libcgroups::v2::devices::emulator::Emulator;
    use libcgroups::v2::devices::program::Program;
    use oci_spec::runtime::{LinuxDeviceCgroup, LinuxDeviceCgroupBuilder, LinuxDeviceType};
    use std::os::fd::AsRawFd;

    let rule = |typ: char,
                major: Option<i64>,
                minor: Option<i64>,
                access: &str|
     -> Result<LinuxDeviceCgroup> {
        let mut b = LinuxDeviceCgroupBuilder::default()
            .allow(true)
            .typ(if typ == 'b' {
                LinuxDeviceType::B
            } else {
                LinuxDeviceType::C
            })
            .access(access);
        if let Some(m) = major {
            b = b.major(m);
        }
        if let Some(m) = minor {
            b = b.minor(m);
        }
        Ok(b.build()?)
    };
    let mut emulator = Emulator::with_default_allow(false);
    if !spec_rules.is_null() {
        let rules: Vec<LinuxDeviceCgroup> = serde_json::from_value(spec_rules.clone())
            .context("linux.resources.devices in config.json is not a list of device rules")?;
        emulator.add_rules(&rules);
    }
    for (typ, major, minor, access) in RUNTIME_DEFAULT_DEVICES {
        emulator.add_rule(&rule(*typ, *major, *minor, access)?);
    }
    for d in devices {
        emulator.add_rule(&rule(
            'c',
            Some(i64::from(d.major)),
            Some(i64::from(d.minor)),
            "rwm",
        )?);
    }
    let program = Program::from_rules(&emulator.rules, emulator.default_allow)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    // Kernels before 5.11 charge BPF programs to RLIMIT_MEMLOCK; later ones to the memory
    // cgroup. Raising the limit may be refused (it is in containers) and is then not needed.
    let _ = prog::bump_memlock_rlimit();
    let fd = prog::load("Apache", program.bytecodes())
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("failed to load the eBPF device program")?;
    let cgroup =
        std::fs::File::open(dir).with_context(|| format!("failed to open {}", dir.display()))?;
    let old = prog::query(cgroup.as_raw_fd()).map_err(|e| anyhow::anyhow!("{e}"))?;
    prog::attach(fd, cgroup.as_raw_fd())
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("failed to attach the device program to {}", dir.display()))?;
    for p in old {
        prog::detach2(p.fd, cgroup.as_raw_fd()).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(())
}

/// The helper: joins the mount namespace of `pid` and carries out the plan read from stdin.
pub fn enter_mount_namespace(pid: &str) -> Result<()> {
    use nix::mount::{MsFlags, mount};
    use nix::sched::{CloneFlags, setns};
    use nix::sys::stat::makedev;

    let mut text = String::new();
    std::io::stdin().read_to_string(&mut text)?;
    let plan: MountPlan = serde_json::from_str(&text)?;
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/mnt"))
        .with_context(|| format!("no mount namespace for pid {pid}"))?;
    setns(&ns, CloneFlags::CLONE_NEWNS)
        .context("failed to join the container's mount namespace")?;
    // Every path is resolved beneath the root filesystem's descriptor, links refused.
    let root = crate::beneath::Root::open(&plan.rootfs)?;
    for (inner, major, minor, mode) in &plan.devices {
        root.device(inner, *mode, makedev(u64::from(*major), u64::from(*minor)))?;
    }
    for (source, inner, read_only, noexec) in &plan.mounts {
        let target = root.target(inner, source.is_dir())?;
        mount(
            Some(source.as_path()),
            &crate::beneath::fd_path(&target),
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .with_context(|| format!("failed to bind {} on {inner}", source.display()))?;
        // The descriptor names what lies under the new mount: look the target up again, now
        // the mount's root, to change its flags.
        let mounted = root.target(inner, source.is_dir())?;
        let target = crate::beneath::fd_path(&mounted);
        // Every mount is nosuid and nodev, as the runtime path's; read-only and noexec as
        // the plan says.
        let mut flags =
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        if *read_only {
            flags |= MsFlags::MS_RDONLY;
        }
        if *noexec {
            flags |= MsFlags::MS_NOEXEC;
        }
        mount(None::<&str>, &target, None::<&str>, flags, None::<&str>)
            .with_context(|| format!("failed to restrict the mount on {inner}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_runtime_shim::driver::DeviceNode;
    use gpuslice_testsupport::sim::SimNode;

    /// Opens `dev` from a shell moved into the cgroup `dir` first; returns what `cat` said.
    fn open_in(dir: &Path, dev: &Path) -> String {
        let script = format!(
            "echo $$ > {}/cgroup.procs && exec cat {} 2>&1",
            dir.display(),
            dev.display()
        );
        let out = Command::new("sh").args(["-c", &script]).output().unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    #[test]
    fn on_cgroup_v2_the_gpu_is_opened_in_the_ebpf_device_program() {
        let root = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            "/sys/fs/cgroup"
        } else {
            "/sys/fs/cgroup/unified"
        };
        assert!(
            Path::new(root).join("cgroup.procs").exists(),
            "no cgroup v2 hierarchy at {root}"
        );
        let dir = Path::new(root).join(format!("gpuslice-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sim = SimNode::new(2, "T4", None);
        let deny_all = serde_json::json!([{"allow": false, "access": "rwm"}]);
        // What a runtime attaches: the spec's rules (deny all) and the default devices.
        allow_devices_v2(&dir, &deny_all, &[]).unwrap();
        let gpu0 = sim.root().join("dev/nvidia0");
        let gpu1 = sim.root().join("dev/nvidia1");
        assert!(
            open_in(&dir, &gpu0).contains("Operation not permitted"),
            "the runtime's program let the GPU through"
        );

        let node = DeviceNode {
            path: "/dev/nvidia0".into(),
            major: 195,
            minor: 0,
            mode: 0o666,
        };
        allow_devices_v2(&dir, &deny_all, &[node]).unwrap();
        let after = open_in(&dir, &gpu0);
        assert!(
            after.contains("No such device or address"),
            "allowed GPU: {after}"
        );
        assert!(
            open_in(&dir, &gpu1).contains("Operation not permitted"),
            "another GPU was let through"
        );
        assert_eq!(
            open_in(&dir, Path::new("/dev/null")),
            "",
            "a default device was lost"
        );
        let _ = std::fs::remove_dir(&dir);
    }
}
