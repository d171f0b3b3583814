//! A minimal container root filesystem: busybox, plus the host's shared libraries for the
//! dynamically linked programs a test runs inside (nvidia-smi, CUDA clients).

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

const APPLETS: &[&str] = &[
    "sh", "ls", "cat", "sleep", "echo", "test", "grep", "stat", "touch", "id", "true", "readlink",
];

/// Creates a busybox root filesystem at `dir` with the libraries `programs` need.
pub fn busybox(dir: &Path, programs: &[&Path]) -> PathBuf {
    for d in [
        "bin",
        "etc",
        "dev",
        "proc",
        "sys",
        "tmp",
        "run",
        "usr/lib/x86_64-linux-gnu",
        "lib64",
        "usr/bin",
        "usr/lib/gpuslice",
    ] {
        std::fs::create_dir_all(dir.join(d)).expect("rootfs dir");
    }
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("busybox (apt-get install busybox-static)");
    std::fs::copy(busybox, dir.join("bin/busybox")).expect("copy busybox");
    for a in APPLETS {
        let _ = symlink("busybox", dir.join("bin").join(a));
    }
    std::fs::write(dir.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").expect("passwd");
    for program in programs {
        for lib in shared_libraries(program) {
            let dest = dir.join(lib.strip_prefix("/").unwrap_or(&lib));
            std::fs::create_dir_all(dest.parent().expect("parent")).expect("lib dir");
            if !dest.exists() {
                std::fs::copy(&lib, &dest)
                    .unwrap_or_else(|e| panic!("copy {}: {e}", lib.display()));
            }
        }
    }
    dir.to_path_buf()
}

/// The shared libraries `program` loads, as ldd reports them (the loader included).
fn shared_libraries(program: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(program).output().expect("ldd");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .filter(|p| {
            !p.to_string_lossy().contains("libnvidia-ml")
                && !p.to_string_lossy().contains("libcuda")
        })
        .collect()
}

/// `podman run` of a throwaway busybox container with the limits runc needs on these machines
/// (it cannot raise the file and process limits above the caller's); append the rest.
pub const PODMAN_RUN: [&str; 8] = [
    "run",
    "--rm",
    "--network",
    "none",
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1024:1024",
];

/// podman's global flags for these machines: runc, cgroupfs, and events in a file.
pub const PODMAN_ENGINE: [&str; 6] = [
    "--runtime",
    "runc",
    "--cgroup-manager",
    "cgroupfs",
    "--events-backend",
    "file",
];

/// Runs real podman with a store under `store` of its own and [`PODMAN_ENGINE`], with
/// `global` flags (e.g. `--hooks-dir DIR`) before `args`.
pub fn podman(store: &Path, global: &[&std::ffi::OsStr], args: &[&str]) -> std::process::Output {
    Command::new("podman")
        .arg("--root")
        .arg(store.join("podman-root"))
        .arg("--runroot")
        .arg(store.join("podman-runroot"))
        .args(PODMAN_ENGINE)
        .args(global)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("podman (apt-get install podman)")
}

/// The interception library's test program (`shim/tests/c/wall.c`) built into `dir`, reaching
/// the driver only through dlopen, so that it runs in a container where the driver is
/// mounted.
pub fn wall_program(dir: &Path) -> PathBuf {
    let out = dir.join("wall");
    if !out.exists() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shim/tests/c/wall.c");
        let ok = Command::new("gcc")
            .args(["-O1", "-DWALL_NO_LINK", "-o"])
            .arg(&out)
            .arg(&src)
            .arg("-ldl")
            .status()
            .expect("gcc");
        assert!(ok.success(), "building {}", src.display());
    }
    out
}
