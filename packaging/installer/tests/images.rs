//! The container images, built by `scripts/build-images` with real podman from the debug
//! build, and the node image's installer run as the DaemonSet runs it, against a host root in
//! a temporary directory that holds containerd's own default configuration.
//!
//! Needs root, podman, containerd (its `config dump` reads what the installer wrote),
//! busybox-static, and the workspace built (`cargo build --workspace`, as `scripts/test` does
//! first). The first run downloads the Debian root the images are based on (about 80 MB).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use gpuslice_testsupport::rootfs;
use gpuslice_testsupport::run_ok as run;

const TAG: &str = "test";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Builds both images once per test binary; returns their IDs.
fn images() -> &'static [String] {
    static IDS: OnceLock<Vec<String>> = OnceLock::new();
    IDS.get_or_init(|| {
        let out = run(Command::new(repo().join("scripts/build-images")).args([
            "--profile",
            "dev",
            "--no-build",
            "--tag",
            TAG,
        ]));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    })
}

/// podman with the settings these machines need (runc, cgroupfs, file events), on the
/// default store where the images are.
fn podman() -> Command {
    let mut cmd = Command::new("podman");
    cmd.args(rootfs::PODMAN_ENGINE);
    cmd
}

/// `podman run` with testsupport's flags for these machines (no network, limits runc can
/// set), keeping the container unless `--rm` is added (the installer's daemon is stopped and
/// inspected by name); `host` mounted at /host.
fn podman_run(host: &Path) -> Command {
    let mut cmd = podman();
    cmd.args(rootfs::PODMAN_RUN.iter().filter(|a| **a != "--rm"))
        .arg("-v")
        .arg(format!("{}:/host", host.display()));
    cmd
}

/// A host root: containerd's default configuration, and a `systemctl` (busybox sh) that
/// writes down what it was asked, in place of the host's systemd.
fn host_root(dir: &Path) -> PathBuf {
    let root = dir.join("host");
    for d in ["etc/containerd", "bin", "usr/bin", "var/log"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    let config = run(Command::new("containerd").args(["config", "default"]));
    std::fs::write(root.join("etc/containerd/config.toml"), &config.stdout).unwrap();
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("busybox (apt-get install busybox-static)");
    std::fs::copy(busybox, root.join("bin/busybox")).unwrap();
    std::os::unix::fs::symlink("busybox", root.join("bin/sh")).unwrap();
    let systemctl = root.join("usr/bin/systemctl");
    std::fs::write(&systemctl, "#!/bin/sh\necho \"$@\" >> /var/log/systemctl\n").unwrap();
    std::fs::set_permissions(
        &systemctl,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    root
}

/// Every file under `root` with its content, the fake systemctl's log left out.
fn files(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let out = run(Command::new("find").arg(root).args(["-type", "f"]));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(PathBuf::from)
        .filter(|p| !p.ends_with("var/log/systemctl"))
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p.strip_prefix(root).unwrap().to_owned(), bytes)
        })
        .collect()
}

fn dump(config: &Path) -> String {
    text(&run(Command::new("containerd")
        .arg("--config")
        .arg(config)
        .args(["config", "dump"])))
}

fn restarts(host: &Path) -> Vec<String> {
    std::fs::read_to_string(host.join("var/log/systemctl"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_installer_container_configures_containerd_on_the_host_and_takes_it_all_off_when_stopped() {
    images();
    let dir = tempfile::tempdir().unwrap();
    let host = host_root(dir.path());
    let before = files(&host);
    let name = format!("gpuslice-installer-{}", std::process::id());
    // As the DaemonSet runs it: install, wait to be stopped, take it off.
    run(podman_run(&host)
        .args(["-d", "--name", &name])
        .arg(format!("localhost/gpuslice-node:{TAG}"))
        .args(["gpuslice-install", "run", "--restart", "systemd"]));
    let record = host.join("usr/local/gpuslice/installed.json");
    let start = Instant::now();
    while !record.exists() {
        let logs = podman().args(["logs", &name]).output().unwrap();
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no installation after 60 s:\n{}",
            text(&logs)
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // containerd itself reads the handler from the configuration the installer wrote.
    let config = host.join("etc/containerd/config.toml");
    let dumped = dump(&config);
    let handler = dumped
        .split("[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.gpuslice.options]")
        .nth(1)
        .unwrap_or_else(|| panic!("containerd does not see the handler:\n{dumped}"));
    assert!(
        handler.contains("BinaryName = \"/usr/local/gpuslice/bin/gpuslice-runtime\""),
        "{dumped}"
    );
    assert_eq!(restarts(&host), ["restart containerd.service"]);
    // What landed on the host runs there, outside the image.
    let version = run(Command::new(host.join("usr/local/gpuslice/bin/gpuslice")).arg("--version"));
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("gpuslice {}", env!("CARGO_PKG_VERSION"))
    );
    let hook = Command::new(host.join("usr/local/gpuslice/bin/gpuslice-hook"))
        .output()
        .unwrap();
    assert!(
        text(&hook).contains("usage: gpuslice-hook"),
        "{}",
        text(&hook)
    );
    for lib in [
        "libgpuslice.so",
        "libgpuslice_cuda.so",
        "libgpuslice_nvml.so",
    ] {
        let elf = std::fs::read(host.join("usr/local/gpuslice/lib").join(lib)).unwrap();
        assert_eq!(&elf[..4], b"\x7fELF", "{lib}");
    }
    let runtime: serde_json::Value =
        serde_json::from_slice(&std::fs::read(host.join("etc/gpuslice/runtime.json")).unwrap())
            .unwrap();
    assert_eq!(
        runtime["interception_library"],
        "/usr/local/gpuslice/lib/libgpuslice.so"
    );

    // Deleting the DaemonSet stops the container: the host is as it was, byte for byte.
    let stopped = podman().args(["stop", "-t", "20", &name]).output().unwrap();
    let waited = podman().args(["wait", &name]).output().unwrap();
    let logs = podman().args(["logs", &name]).output().unwrap();
    podman().args(["rm", "-f", &name]).output().unwrap();
    assert!(stopped.status.success(), "{}", text(&stopped));
    assert_eq!(
        String::from_utf8_lossy(&waited.stdout).trim(),
        "0",
        "the installer did not exit cleanly:\n{}",
        text(&logs)
    );
    assert_eq!(files(&host), before, "{}", text(&logs));
    assert!(!host.join("usr/local/gpuslice").exists());
    assert_eq!(
        restarts(&host),
        ["restart containerd.service", "restart containerd.service"]
    );
}

#[test]
fn an_operators_edit_to_containerds_configuration_survives_the_removal_which_takes_only_the_handler()
 {
    images();
    let dir = tempfile::tempdir().unwrap();
    let host = host_root(dir.path());
    let image = format!("localhost/gpuslice-node:{TAG}");
    run(podman_run(&host)
        .arg("--rm")
        .arg(&image)
        .args(["gpuslice-install", "install"]));
    let config = host.join("etc/containerd/config.toml");
    let edited = std::fs::read_to_string(&config).unwrap().replace(
        "max_concurrent_downloads = 3",
        "max_concurrent_downloads = 7",
    );
    assert!(edited.contains("max_concurrent_downloads = 7"));
    std::fs::write(&config, &edited).unwrap();
    let out = run(podman_run(&host)
        .arg("--rm")
        .arg(&image)
        .args(["gpuslice-install", "uninstall"]));
    let dumped = dump(&config);
    assert!(dumped.contains("max_concurrent_downloads = 7"), "{dumped}");
    assert!(!dumped.contains("runtimes.gpuslice"), "{dumped}");
    assert!(
        text(&out).contains("/etc/containerd/config.toml restored"),
        "{}",
        text(&out)
    );
    assert_eq!(
        restarts(&host),
        Vec::<String>::new(),
        "restarted without --restart"
    );
}

#[test]
fn the_images_are_reproducible_their_programs_run_and_the_extender_runs_as_nobody() {
    let first = images().to_vec();
    assert_eq!(first.len(), 2, "{first:?}");
    let again = run(Command::new(repo().join("scripts/build-images")).args([
        "--profile",
        "dev",
        "--no-build",
        "--tag",
        TAG,
    ]));
    let second: Vec<String> = String::from_utf8_lossy(&again.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(first, second, "the same inputs gave other images");
    let image = format!("localhost/gpuslice-scheduler:{TAG}");
    let user = run(podman().args(["image", "inspect", "--format", "{{.Config.User}}", &image]));
    assert_eq!(String::from_utf8_lossy(&user.stdout).trim(), "65534:65534");
    let out = run(podman()
        .args(rootfs::PODMAN_RUN)
        .args([&image, "--version"]));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("gpuslice-scheduler {}", env!("CARGO_PKG_VERSION"))
    );
    let id =
        run(podman()
            .args(rootfs::PODMAN_RUN)
            .args(["--entrypoint", "/usr/bin/id", &image, "-u"]));
    assert_eq!(String::from_utf8_lossy(&id.stdout).trim(), "65534");
    // The node image's programs run there, with the image's own libraries.
    let node = format!("localhost/gpuslice-node:{TAG}");
    for program in ["gpuslice-agent", "gpuslice-dra-plugin", "gpuslice-install"] {
        let out = run(podman()
            .args(rootfs::PODMAN_RUN)
            .args([&node, program, "--version"]));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("{program} {}", env!("CARGO_PKG_VERSION"))
        );
    }
}
