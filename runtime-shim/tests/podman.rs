//! podman with the packaged precreate hook (hooks.d): the hook claims the slice and edits the
//! spec; runc runs the createRuntime and poststop hooks it added.

mod common;

use std::process::Command;

use common::{CHECKS, Node, text};
use gpuslice_testsupport::{binary, rootfs};

/// The hooks.d file for the built hook and this node, as `gpuslice-hook install-hooks` writes
/// it (the packaged file is the same for `/usr/bin` and no extra environment: the hook's unit
/// tests compare them).
fn hooks_dir(node: &Node) -> std::path::PathBuf {
    let dir = node.work.path().join("hooks.d");
    let mut install = Command::new(binary("gpuslice-hook"));
    install.args(["install-hooks", "--dir"]).arg(&dir);
    for (k, v) in node.env() {
        install.arg("--env").arg(format!("{k}={v}"));
    }
    let out = install.output().unwrap();
    assert!(
        out.status.success(),
        "install-hooks: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        written.trim(),
        dir.join("gpuslice-precreate.json").display().to_string()
    );
    dir
}

fn podman(node: &Node, args: &[&str]) -> std::process::Output {
    let hooks = hooks_dir(node);
    common::podman(node, &["--hooks-dir".as_ref(), hooks.as_os_str()], args)
}

#[test]
fn podman_run_with_gpuslice_annotations_gets_the_slice_through_the_precreate_hook() {
    let node = Node::new();
    let rootfs = rootfs::busybox(&node.work.path().join("rootfs"), &[&binary("nvidia-smi")]);
    let r = rootfs.display().to_string();
    let base = rootfs::PODMAN_RUN;
    let mut args = base.to_vec();
    args.extend([
        "--annotation",
        "gpuslice.io/memory=2Gi",
        "--rootfs",
        &r,
        "/bin/sh",
        "-c",
        CHECKS,
    ]);
    let out = podman(&node, &args);
    assert!(out.status.success(), "podman run failed:\n{}", text(&out));
    common::assert_gpu_checks(&text(&out));
    assert!(
        node.status().slices.is_empty(),
        "the claim outlived the container (poststop)"
    );

    // An image that ships a program where a relative refusal name would be found: it must
    // not run in the refused container's place.
    let planted = rootfs
        .join("gpuslice refused this container: annotation gpuslice.io")
        .join("memory=\"lots\": not a number followed by an optional unit (B, Ki, Mi, Gi, Ti, k, M, G, T or %)");
    std::fs::create_dir_all(planted.parent().unwrap()).unwrap();
    std::fs::write(&planted, "#!/bin/sh\necho ESCAPED-THE-REFUSAL\n").unwrap();
    std::fs::set_permissions(
        &planted,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mut args = base.to_vec();
    args.extend([
        "--annotation",
        "gpuslice.io/memory=lots",
        "--rootfs",
        &r,
        "/bin/true",
    ]);
    let out = podman(&node, &args);
    assert!(!out.status.success(), "a malformed request ran");
    let t = text(&out);
    assert!(
        !t.contains("ESCAPED-THE-REFUSAL"),
        "the image's program ran in place of the refusal:\n{t}"
    );
    eprintln!("podman said:\n{t}");
    assert!(
        t.contains("gpuslice refused this container: annotation gpuslice.io/memory=\\\"lots\\\"")
            && t.contains("not a number"),
        "podman does not show why:\n{t}"
    );
    assert!(node.status().slices.is_empty());
}

#[test]
fn podman_run_with_the_wrapper_as_its_runtime_gets_the_slice_and_gives_it_back() {
    let node = Node::new();
    // Everything the tests otherwise pass in the environment, as an operator writes the file.
    let _etc = common::EtcConfig::install_for(&node);
    let rootfs = rootfs::busybox(&node.work.path().join("rootfs"), &[&binary("nvidia-smi")]);
    let r = rootfs.display().to_string();
    let wrapper = binary("gpuslice-runtime");
    let out = common::podman(
        &node,
        &["--runtime".as_ref(), wrapper.as_os_str()],
        &[
            &rootfs::PODMAN_RUN[..],
            &[
                "--annotation",
                "gpuslice.io/memory=2Gi",
                "--rootfs",
                &r,
                "/bin/sh",
                "-c",
                CHECKS,
            ],
        ]
        .concat(),
    );
    assert!(out.status.success(), "podman run failed:\n{}", text(&out));
    common::assert_gpu_checks(&text(&out));
    assert!(
        node.status().slices.is_empty(),
        "the wrapper did not give the slice back at podman's delete"
    );
}
