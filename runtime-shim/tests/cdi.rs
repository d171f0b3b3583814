//! CDI specs: every spec gpuslice writes is valid against the CDI project's JSON schema, and
//! real podman, reading them from /var/run/cdi, gives a container a slice (the same edits
//! as the runtime wrapper: it hits the same wall) or a whole GPU claimed through the agent.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{CHECKS, Node, text};
use gpuslice_testsupport::{binary, rootfs};

const CDI_DIR: &str = "/var/run/cdi";

/// A file in the engines' CDI directory, removed when the test ends.
struct CdiFile(PathBuf);

impl Drop for CdiFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn gpuslice(node: &Node, args: &[&str]) -> Output {
    Command::new(binary("gpuslice"))
        .args(["--bus-address", &node.bus.address])
        .args(args)
        .envs(node.env())
        .output()
        .unwrap()
}

fn podman(node: &Node, args: &[&str]) -> Output {
    common::podman(node, &[], args)
}

const RUN: [&str; 8] = rootfs::PODMAN_RUN;

/// Claims a 2 GiB slice `name` with `gpuslice claim --cdi`; the spec file goes with the
/// returned guard.
fn claim_with_cdi(node: &Node, name: &str) -> CdiFile {
    claim_with_cdi_as(node, name, &["gpuslice.io/memory=2Gi"])
}

/// As [`claim_with_cdi`], the slice as the `annotations` ask.
fn claim_with_cdi_as(node: &Node, name: &str, annotations: &[&str]) -> CdiFile {
    let mut args = vec!["claim", name];
    for a in annotations {
        args.extend(["-a", a]);
    }
    args.extend(["--cdi", "--cdi-dir", CDI_DIR]);
    let out = gpuslice(node, &args);
    let file = CdiFile(Path::new(CDI_DIR).join(format!("gpuslice.io-slice-{name}.json")));
    assert!(out.status.success(), "{}", text(&out));
    file
}

#[test]
fn a_slice_claimed_with_cdi_runs_in_podman_with_the_wrappers_edits_until_released() {
    let node = Node::with_agent_args(&["--cdi-dir", CDI_DIR]);
    let name = format!("cdi-slice-{}", std::process::id());
    let file = claim_with_cdi(&node, &name);
    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&file.0).unwrap()).unwrap();
    gpuslice_testsupport::cdi::assert_valid(&spec);
    assert_eq!(spec["kind"], "gpuslice.io/slice");
    assert_eq!(
        spec["cdiVersion"], "0.5.0",
        "device nodes name their node in the driver root"
    );

    let rootfs = rootfs::busybox(&node.work.path().join("rootfs"), &[&binary("nvidia-smi")]);
    let r = rootfs.display().to_string();
    let device = format!("gpuslice.io/slice={name}");
    // The slice device mounts its directory at /run/gpuslice/<claim>.
    let checks = format!("RUN_DIR=/run/gpuslice/{name}\n{CHECKS}");
    let mut args = RUN.to_vec();
    args.extend([
        "--device", &device, "--rootfs", &r, "/bin/sh", "-c", &checks,
    ]);
    let out = podman(&node, &args);
    assert!(out.status.success(), "podman run failed:\n{}", text(&out));
    common::assert_gpu_checks(&text(&out));
    // The createRuntime hook reported the container's pid for the claim; the claim stays until
    // it is released (or the agent collects it, the process being gone).
    let s = node.status();
    assert_eq!(s.slices.len(), 1, "{s:?}");
    assert!(
        matches!(
            s.slices[0].claim.state,
            gpuslice_core::ClaimState::Active { .. }
        ),
        "{s:?}"
    );
    let out = gpuslice(&node, &["release", &name]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        !file.0.exists(),
        "the agent removes the spec with the claim"
    );
    let out = podman(&node, &args);
    assert!(!out.status.success(), "a released slice's device still ran");
}

#[test]
fn two_slice_devices_of_one_gpu_give_a_container_their_sum_which_the_agent_holds_it_to() {
    // Slices of 2 GiB and 1 GiB of GPU 0, each admitted by the agent, given to one podman
    // container; the agent kills a process over its wall, checking every 200 ms.
    let node = Node::killing_over_its_slice_and(&["--cdi-dir", CDI_DIR]);
    let pid = std::process::id();
    let (a, b) = (format!("cdi-sum-a-{pid}"), format!("cdi-sum-b-{pid}"));
    let _a = claim_with_cdi_as(
        &node,
        &a,
        &["gpuslice.io/memory=2Gi", "gpuslice.io/devices=0"],
    );
    let _b = claim_with_cdi_as(
        &node,
        &b,
        &["gpuslice.io/memory=1Gi", "gpuslice.io/devices=0"],
    );
    let wall = node.wall_program();
    let rootfs = rootfs::busybox(
        &node.work.path().join("rootfs"),
        &[&binary("nvidia-smi"), &wall],
    );
    std::fs::copy(&wall, rootfs.join("usr/bin/wall")).unwrap();
    let r = rootfs.display().to_string();
    // The container holds all of the 3 GiB (its context included) for a second, five of the
    // agent's passes, then asks for one byte more.
    let ctx = node.sim.spec.gpus[0].context_bytes;
    let script = format!(
        "/usr/bin/nvidia-smi --query-gpu=memory.total --format=csv,noheader | sed 's/^/slice memory /'\n\
         sleep 1 | /usr/bin/wall procaddr hold {}; echo \"hold exit $?\"\n\
         /usr/bin/wall procaddr alloc {}",
        (3u64 << 30) - ctx,
        (3u64 << 30) - ctx
    );
    let (da, db) = (
        format!("gpuslice.io/slice={a}"),
        format!("gpuslice.io/slice={b}"),
    );
    let mut args = RUN.to_vec();
    args.extend([
        "--device", &da, "--device", &db, "--rootfs", &r, "/bin/sh", "-c", &script,
    ]);
    let out = podman(&node, &args);
    let t = text(&out);
    assert!(out.status.success(), "podman run failed:\n{t}");
    // Before, the container got the first slice alone (2048 MiB), and the agent held it to
    // that.
    for want in [
        "slice memory 3072 MiB",
        "hold exit 0",
        "fit=CUDA_SUCCESS",
        "over=CUDA_ERROR_OUT_OF_MEMORY",
    ] {
        assert!(t.contains(want), "{want:?} not in:\n{t}");
    }
    let log = node.agent.log();
    assert!(
        !log.contains("over its slice"),
        "the agent found the container over its slice:\n{log}"
    );
}

#[test]
fn a_whole_gpu_from_the_generated_spec_is_claimed_through_the_agent_and_refused_beside_a_slice() {
    let node = Node::new();
    let out = gpuslice(&node, &["cdi", "generate"]);
    assert!(out.status.success(), "{}", text(&out));
    let spec: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    gpuslice_testsupport::cdi::assert_valid(&spec);
    let names: Vec<&str> = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["name"].as_str())
        .collect();
    let uuids: Vec<&str> = node.sim.spec.gpus.iter().map(|g| g.uuid.as_str()).collect();
    assert_eq!(names, ["0", uuids[0], "1", uuids[1], "all"]);
    let file =
        CdiFile(Path::new(CDI_DIR).join(format!("gpuslice.io-gpu-{}.json", std::process::id())));
    std::fs::create_dir_all(CDI_DIR).unwrap();
    // Atomically: podman in a test beside this one reads every spec in the directory.
    let tmp = Path::new(CDI_DIR).join(format!(".gpu-{}.tmp", std::process::id()));
    std::fs::write(&tmp, &out.stdout).unwrap();
    std::fs::rename(&tmp, &file.0).unwrap();

    // GPU 0 holds a slice: it cannot be given whole.
    let out = gpuslice(
        &node,
        &[
            "claim",
            "holder",
            "-a",
            "gpuslice.io/memory=1Gi",
            "-a",
            "gpuslice.io/devices=0",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let rootfs = rootfs::busybox(&node.work.path().join("rootfs"), &[&binary("nvidia-smi")]);
    let r = rootfs.display().to_string();
    let mut args = RUN.to_vec();
    args.extend(["--device", "gpuslice.io/gpu=0", "--rootfs", &r, "/bin/true"]);
    let out = podman(&node, &args);
    let refused = text(&out);
    assert!(
        !out.status.success(),
        "GPU 0 was given whole beside a slice:\n{refused}"
    );
    assert!(
        refused.contains("cannot be given whole"),
        "podman does not show why:\n{refused}"
    );
    assert_eq!(
        node.status().slices.len(),
        1,
        "nothing of the refused container is held"
    );

    // GPU 1 is free: the container holds it whole while it runs, and gives it back.
    let mut args = RUN.to_vec();
    args.extend([
        "--device", "gpuslice.io/gpu=1", "--rootfs", &r, "/bin/sh", "-c",
        "ls /dev; /usr/bin/nvidia-smi --query-gpu=uuid --format=csv,noheader; echo $NVIDIA_VISIBLE_DEVICES",
    ]);
    let out = podman(&node, &args);
    let t = text(&out);
    assert!(out.status.success(), "podman run failed:\n{t}");
    assert!(
        t.lines().any(|l| l == "nvidia1") && !t.lines().any(|l| l == "nvidia0"),
        "{t}"
    );
    assert_eq!(
        t.matches(uuids[1]).count(),
        2,
        "nvidia-smi and NVIDIA_VISIBLE_DEVICES name GPU 1:\n{t}"
    );
    let s = node.status();
    assert_eq!(
        s.slices.len(),
        1,
        "the whole GPU was given back at poststop: {s:?}"
    );
}

#[test]
fn a_privileged_container_given_a_slice_device_is_not_started() {
    let node = Node::with_agent_args(&["--cdi-dir", CDI_DIR]);
    let name = format!("cdi-privileged-{}", std::process::id());
    let _file = claim_with_cdi(&node, &name);
    let rootfs = rootfs::busybox(&node.work.path().join("rootfs"), &[]);
    let r = rootfs.display().to_string();
    let device = format!("gpuslice.io/slice={name}");
    let run = |extra: &[&str]| {
        let mut args = RUN.to_vec();
        args.extend(["--device", &device]);
        args.extend(extra);
        args.extend(["--rootfs", &r, "/bin/sh", "-c", "echo started"]);
        podman(&node, &args)
    };
    // With CAP_SYS_ADMIN a tenant could mount its own limits over the slice's directory;
    // privileged, it could also open every GPU.
    for (flags, why) in [
        (&["--privileged"][..], "it has CAP_SYS_ADMIN"),
        (&["--cap-add", "SYS_ADMIN"], "it has CAP_SYS_ADMIN"),
        (
            &["--device-cgroup-rule", "a *:* rwm"],
            "its device cgroup allows every device",
        ),
    ] {
        let out = run(flags);
        assert!(!out.status.success(), "{flags:?}: {}", text(&out));
        assert!(!text(&out).contains("started"), "{flags:?}: {}", text(&out));
        let refusal =
            format!("is given the slice {name} by its CDI device but is privileged ({why})");
        assert!(text(&out).contains(&refusal), "{flags:?}: {}", text(&out));
    }
    let s = node.status();
    assert!(
        !matches!(
            s.slices[0].claim.state,
            gpuslice_core::ClaimState::Active { .. }
        ),
        "no privileged container's pid was reported for the claim: {s:?}"
    );
    // The device itself is fine: a container without the privilege starts on it.
    let out = run(&[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("started"), "{}", text(&out));
    let out = gpuslice(&node, &["release", &name]);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn a_slice_device_given_to_a_container_the_wrapper_creates_is_not_asked_for_again() {
    let node = Node::with_agent_args(&["--cdi-dir", CDI_DIR]);
    let name = format!("cdi-wrapped-{}", std::process::id());
    let _file = claim_with_cdi(&node, &name);
    // podman with the wrapper as its runtime: the device's NVIDIA_VISIBLE_DEVICES names the
    // slice's GPU, which outside Kubernetes asks the wrapper for that GPU whole.
    let _etc = common::EtcConfig::install_for(&node);
    let wrapper = binary("gpuslice-runtime");
    let rootfs = rootfs::busybox(&node.work.path().join("rootfs"), &[&binary("nvidia-smi")]);
    let r = rootfs.display().to_string();
    let device = format!("gpuslice.io/slice={name}");
    let checks = format!("RUN_DIR=/run/gpuslice/{name}\n{CHECKS}");
    let run = |extra: &[&str]| {
        let mut args = RUN.to_vec();
        args.extend(["--device", &device]);
        args.extend(extra);
        args.extend(["--rootfs", &r, "/bin/sh", "-c", &checks]);
        common::podman(&node, &["--runtime".as_ref(), wrapper.as_os_str()], &args)
    };
    let out = run(&[]);
    assert!(out.status.success(), "podman run failed:\n{}", text(&out));
    common::assert_gpu_checks(&text(&out));
    assert_eq!(node.status().slices.len(), 1, "only the device's slice");
    // Annotations asking for a slice besides the device's: refused, naming both.
    let out = run(&["--annotation", "gpuslice.io/memory=1Gi"]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("already given the slice {name}")),
        "{}",
        text(&out)
    );
    assert_eq!(node.status().slices.len(), 1, "{:?}", node.status());
    let out = gpuslice(&node, &["release", &name]);
    assert!(out.status.success(), "{}", text(&out));
}
