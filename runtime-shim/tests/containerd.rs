//! A real containerd, configured by `gpuslice-containerd`, running a GPU container through
//! `ctr` and the wrapper.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{CHECKS, Node, text};
use gpuslice_testsupport::{binary, rootfs, wait_for};

struct Containerd {
    child: Child,
    socket: PathBuf,
    config: PathBuf,
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn containerd(node: &Node) -> Containerd {
    let dir = node.work.path().join("containerd");
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("containerd.sock");
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "# private containerd for a test\nversion = 2\nroot = \"{0}/root\"\nstate = \"{0}/state\"\n\n[grpc]\n  address = \"{1}\"\n",
            dir.display(),
            socket.display()
        ),
    )
    .unwrap();
    let out = Command::new(binary("gpuslice-containerd"))
        .args(["configure", "--config"])
        .arg(&config)
        .arg("--drop-in")
        .arg(dir.join("conf.d/gpuslice.toml"))
        .arg("--runtime-path")
        .arg(binary("gpuslice-runtime"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let log = std::fs::File::create(dir.join("containerd.log")).unwrap();
    let child = Command::new("containerd")
        .arg("--config")
        .arg(&config)
        .envs(node.env())
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("containerd (apt-get install containerd)");
    let up = wait_for(Duration::from_secs(20), || socket.exists());
    assert!(
        up,
        "containerd did not start:\n{}",
        std::fs::read_to_string(dir.join("containerd.log")).unwrap_or_default()
    );
    Containerd {
        child,
        socket,
        config,
    }
}

fn ctr(c: &Containerd, args: &[&str]) -> std::process::Output {
    Command::new("ctr")
        .arg("--address")
        .arg(&c.socket)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn containerd_loads_the_written_handler_and_runs_a_gpu_container_through_ctr() {
    let node = Node::new();
    let c = containerd(&node);
    let dump = Command::new("containerd")
        .arg("--config")
        .arg(&c.config)
        .args(["config", "dump"])
        .output()
        .unwrap();
    let dumped = String::from_utf8_lossy(&dump.stdout);
    assert!(
        dumped.contains("[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.gpuslice]"),
        "{dumped}"
    );
    assert!(
        dumped.contains(&format!(
            "BinaryName = \"{}\"",
            binary("gpuslice-runtime").display()
        )),
        "{dumped}"
    );
    assert!(
        dumped.contains("pod_annotations = [\"gpuslice.io/*\"]"),
        "{dumped}"
    );

    let rootfs = rootfs::busybox(&node.work.path().join("rootfs"), &[&binary("nvidia-smi")]);
    let wrapper = binary("gpuslice-runtime").display().to_string();
    let r = rootfs.display().to_string();
    let out = ctr(
        &c,
        &[
            "run",
            "--rm",
            "--runc-binary",
            &wrapper,
            "--annotation",
            "gpuslice.io/memory=2Gi",
            "--rootfs",
            &r,
            "ctr-gpu",
            "/bin/sh",
            "-c",
            CHECKS,
        ],
    );
    assert!(out.status.success(), "ctr run failed: {}", text(&out));
    common::assert_gpu_checks(&text(&out));
    assert!(
        wait_for(Duration::from_secs(5), || node.status().slices.is_empty()),
        "the claim outlived the container"
    );

    let out = ctr(
        &c,
        &[
            "run",
            "--rm",
            "--runc-binary",
            &wrapper,
            "--annotation",
            "gpuslice.io/cores=150",
            "--rootfs",
            &r,
            "ctr-bad",
            "/bin/true",
        ],
    );
    assert!(!out.status.success());
    let t = text(&out);
    assert!(
        t.contains("annotation gpuslice.io/cores=") && t.contains("at most 100"),
        "ctr does not show why:\n{t}"
    );
    assert!(node.status().slices.is_empty());
}
