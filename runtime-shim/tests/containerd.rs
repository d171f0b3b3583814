//! A real containerd, configured by `gpuslice-containerd`, running a GPU container through
//! `ctr` and the wrapper.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{CHECKS, Containerd, Node, text};
use gpuslice_testsupport::{binary, rootfs, wait_for};

#[test]
fn containerd_loads_the_written_handler_and_runs_a_gpu_container_through_ctr() {
    let node = Node::new();
    let c = Containerd::start(&node, "containerd", "", true);
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
    // containerd can drop the last output of a process that exits right after writing it
    // (copying from its FIFOs races the exit): the checks write to a file of the rootfs,
    // read here once ctr is back.
    let checks = format!("{{\n{CHECKS}\n}} > /checks.out 2>&1");
    let out = c.ctr(&[
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
        &checks,
    ]);
    assert!(out.status.success(), "ctr run failed: {}", text(&out));
    let written = std::fs::read_to_string(rootfs.join("checks.out"))
        .unwrap_or_else(|e| panic!("the checks wrote nothing ({e}); ctr: {}", text(&out)));
    common::assert_gpu_checks(&written);
    assert!(
        wait_for(Duration::from_secs(5), || node.status().slices.is_empty()),
        "the claim outlived the container"
    );

    let out = c.ctr(&[
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
    ]);
    assert!(!out.status.success());
    let t = text(&out);
    assert!(
        t.contains("annotation gpuslice.io/cores=") && t.contains("at most 100"),
        "ctr does not show why:\n{t}"
    );
    assert!(node.status().slices.is_empty());
}
