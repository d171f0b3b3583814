//! What users of the NVIDIA container toolkit rely on, through the wrapper and real runc:
//! `NVIDIA_VISIBLE_DEVICES` and `NVIDIA_DRIVER_CAPABILITIES` as they set them, the driver's
//! files and devices, and the linker cache inside the container (docs/runtime.md, "Parity
//! with the NVIDIA container toolkit").

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Node, text};
use gpuslice_testsupport::wait_for;

/// A bundle running `sleep` with `env` added to its environment and `annotations`; its root
/// filesystem has a linker cache and glibc's (static) `ldconfig`, as a distribution image has.
fn bundle(node: &Node, name: &str, env: &[&str], annotations: &[(&str, &str)]) -> PathBuf {
    let b = node.bundle(name, &["/bin/sleep", "60"], annotations);
    let rootfs = b.join("rootfs");
    std::fs::create_dir_all(rootfs.join("sbin")).unwrap();
    std::fs::copy("/sbin/ldconfig", rootfs.join("sbin/ldconfig")).unwrap();
    let made = std::process::Command::new("/sbin/ldconfig")
        .arg("-r")
        .arg(&rootfs)
        .status()
        .unwrap();
    assert!(made.success());
    let path = b.join("config.json");
    let mut spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let list = spec["process"]["env"].as_array_mut().unwrap();
    list.extend(env.iter().map(|e| serde_json::Value::from(*e)));
    std::fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
    b
}

fn start(node: &Node, bundle: &Path, id: &str) -> String {
    let b = bundle.display().to_string();
    let out = node.wrapper(&["create", "--bundle", &b, id]);
    if !out.status.success() {
        return text(&out);
    }
    let out = node.wrapper(&["start", id]);
    assert!(out.status.success(), "start failed: {}", text(&out));
    String::new()
}

fn exec(node: &Node, id: &str, args: &[&str]) -> String {
    let mut a = vec!["exec", id];
    a.extend(args);
    text(&node.runc(&a))
}

fn remove(node: &Node, id: &str) {
    let _ = node.runc(&["kill", id, "KILL"]);
    assert!(wait_for(Duration::from_secs(10), || text(
        &node.runc(&["state", id])
    )
    .contains("\"stopped\"")));
    assert!(node.wrapper(&["delete", id]).status.success());
}

#[test]
fn a_container_given_gpu_2_by_nvidia_visible_devices_sees_one_device_with_gpu_2s_uuid() {
    let node = Node::with_gpus(3, &[]);
    let uuid = node.sim.spec.gpus[2].uuid.clone();
    let b = bundle(&node, "third", &["NVIDIA_VISIBLE_DEVICES=2"], &[]);
    assert_eq!(start(&node, &b, "third"), "");
    let s = node.status();
    assert_eq!(s.slices.len(), 1, "{s:?}");
    let claim = &s.slices[0].claim;
    assert!(
        claim.exclusive,
        "a request by NVIDIA_VISIBLE_DEVICES alone is for the whole GPU"
    );
    assert_eq!(claim.gpus.iter().map(|g| g.index).collect::<Vec<_>>(), [2]);

    let smi = exec(
        &node,
        "third",
        &[
            "/usr/bin/nvidia-smi",
            "--query-gpu=index,uuid",
            "--format=csv,noheader",
        ],
    );
    assert_eq!(smi.trim(), format!("0, {uuid}"));
    let env = exec(
        &node,
        "third",
        &["/bin/sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES"],
    );
    assert_eq!(
        env.trim(),
        uuid,
        "the variable names what the container got, as the device plugin sets it"
    );
    // The linker cache inside lists the driver's libraries; beside libcuda.so.1 lies the
    // development name that `-lcuda` links against (Triton finds the directory this way).
    let cache = exec(&node, "third", &["/sbin/ldconfig", "-p"]);
    for lib in ["libcuda.so.1", "libnvidia-ml.so.1"] {
        assert!(
            cache.contains(&format!(
                "\t{lib} (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/{lib}"
            )),
            "{lib} not in the linker cache: {cache}"
        );
    }
    let dev_link = exec(
        &node,
        "third",
        &["/bin/ls", "/usr/lib/x86_64-linux-gnu/libcuda.so"],
    );
    assert_eq!(dev_link.trim(), "/usr/lib/x86_64-linux-gnu/libcuda.so");
    let devices = exec(&node, "third", &["/bin/ls", "/dev"]);
    for d in ["nvidia2", "nvidiactl", "nvidia-uvm", "nvidia-modeset"] {
        assert!(
            devices.split_whitespace().any(|x| x == d),
            "{d} not in {devices}"
        );
    }
    assert!(
        !devices
            .split_whitespace()
            .any(|x| x == "nvidia0" || x == "nvidia1"),
        "{devices}"
    );
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(b.join("config.json")).unwrap()).unwrap();
    let masked: Vec<&str> = spec["linux"]["maskedPaths"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    for g in [0, 1] {
        let bus = gpuslice_testsupport::sim::proc_bus_id(&node.sim.spec.gpus[g].pci_bus_id);
        assert!(
            masked.contains(&format!("/proc/driver/nvidia/gpus/{bus}").as_str()),
            "{masked:?}"
        );
    }
    remove(&node, "third");
    assert!(node.status().slices.is_empty());
}

#[test]
fn nvidia_visible_devices_all_takes_every_gpu_whole_and_is_refused_beside_a_slice() {
    let node = Node::new();
    let slice = bundle(&node, "slice", &[], &[("gpuslice.io/memory", "1Gi")]);
    assert_eq!(start(&node, &slice, "slice"), "");
    let all = bundle(&node, "all", &["NVIDIA_VISIBLE_DEVICES=all"], &[]);
    let refused = start(&node, &all, "all");
    assert!(
        refused.contains("NVIDIA_VISIBLE_DEVICES=\"all\""),
        "{refused}"
    );
    assert!(
        refused.contains("NVIDIA_VISIBLE_DEVICES=void"),
        "the way out is named: {refused}"
    );
    assert_eq!(
        node.status().slices.len(),
        1,
        "nothing of the refused container is held"
    );
    remove(&node, "slice");
    assert_eq!(start(&node, &all, "all"), "");
    let s = node.status();
    assert_eq!(s.slices[0].claim.gpus.len(), 2, "{s:?}");
    remove(&node, "all");
}

#[test]
fn under_kubernetes_nvidia_visible_devices_asks_for_nothing() {
    let node = Node::new();
    let b = bundle(
        &node,
        "sidecar",
        &["NVIDIA_VISIBLE_DEVICES=all"],
        &[("io.kubernetes.cri.container-type", "container")],
    );
    assert_eq!(start(&node, &b, "sidecar"), "");
    assert!(node.status().slices.is_empty());
    let devices = exec(&node, "sidecar", &["/bin/ls", "/dev"]);
    assert!(!devices.contains("nvidia"), "{devices}");
    remove(&node, "sidecar");
}

#[test]
fn a_slice_goes_on_the_gpu_nvidia_visible_devices_names_and_capabilities_choose_the_files() {
    let node = Node::new();
    let b = bundle(
        &node,
        "utility",
        &[
            "NVIDIA_VISIBLE_DEVICES=1",
            "NVIDIA_DRIVER_CAPABILITIES=utility",
        ],
        &[("gpuslice.io/memory", "1Gi")],
    );
    assert_eq!(start(&node, &b, "utility"), "");
    let s = node.status();
    assert_eq!(s.slices[0].claim.gpus[0].index, 1, "{s:?}");
    assert!(!s.slices[0].claim.exclusive);
    let libs = exec(&node, "utility", &["/bin/ls", "/usr/lib/x86_64-linux-gnu"]);
    assert!(libs.contains("libnvidia-ml.so.1"), "{libs}");
    assert!(
        !libs.contains("libcuda"),
        "utility alone gives no CUDA: {libs}"
    );
    let smi = exec(
        &node,
        "utility",
        &[
            "/usr/bin/nvidia-smi",
            "--query-gpu=memory.total",
            "--format=csv,noheader",
        ],
    );
    assert_eq!(smi.trim(), "1024 MiB");
    remove(&node, "utility");

    let bad = bundle(
        &node,
        "bad",
        &["NVIDIA_DRIVER_CAPABILITIES=compute,graphix"],
        &[("gpuslice.io/memory", "1Gi")],
    );
    let refused = start(&node, &bad, "bad");
    assert!(
        refused.contains("\"graphix\" is not a driver capability"),
        "{refused}"
    );
    assert!(
        node.status().slices.is_empty(),
        "a refused create holds nothing"
    );
}

#[test]
fn an_image_that_needs_a_newer_cuda_than_the_driver_has_is_refused_as_the_toolkit_refuses_it() {
    let node = Node::new();
    // As nvidia/cuda images set it; the simulated driver is 550.54.15 with CUDA 12.4.
    let fits = "NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470,driver<471";
    let b = bundle(&node, "fits", &[fits], &[("gpuslice.io/memory", "1Gi")]);
    assert_eq!(start(&node, &b, "fits"), "");
    remove(&node, "fits");
    let newer = "NVIDIA_REQUIRE_CUDA=cuda>=12.6 brand=tesla,driver>=470,driver<471";
    let b = bundle(&node, "newer", &[newer], &[("gpuslice.io/memory", "1Gi")]);
    let refused = start(&node, &b, "newer");
    assert!(
        refused.contains("cuda>=12.6 does not hold: the driver's cuda is 12.4"),
        "{refused}"
    );
    assert!(
        node.status().slices.is_empty(),
        "nothing is claimed for a refused image"
    );
    let b = bundle(
        &node,
        "forced",
        &[newer, "NVIDIA_DISABLE_REQUIRE=true"],
        &[("gpuslice.io/memory", "1Gi")],
    );
    assert_eq!(start(&node, &b, "forced"), "");
    remove(&node, "forced");
}

#[test]
fn an_image_newer_than_the_drivers_cuda_starts_by_its_brand_alternative_as_the_toolkit_starts_it() {
    let node = Node::new();
    // As nvidia/cuda images set it: CUDA 12.6 on the simulated 550 driver (CUDA 12.4) holds by
    // the alternative of the 550 branch for the GPU's brand (NVML's NVIDIA, as data-center
    // GPUs report it).
    let image = "NVIDIA_REQUIRE_CUDA=cuda>=12.6 brand=tesla,driver>=550,driver<551 \
                 brand=nvidia,driver>=550,driver<551 brand=geforce,driver>=550,driver<551";
    let b = bundle(&node, "branch", &[image], &[("gpuslice.io/memory", "1Gi")]);
    assert_eq!(start(&node, &b, "branch"), "");
    remove(&node, "branch");
    // Without an alternative for the GPU's brand, refused naming it, and nothing held.
    let other = "NVIDIA_REQUIRE_CUDA=cuda>=12.6 brand=tesla,driver>=550,driver<551";
    let b = bundle(&node, "tesla", &[other], &[("gpuslice.io/memory", "1Gi")]);
    let refused = start(&node, &b, "tesla");
    assert!(
        refused.contains("brand=tesla does not hold: a GPU's brand is nvidia"),
        "{refused}"
    );
    assert!(
        node.status().slices.is_empty(),
        "the claim made to learn the GPU is given back"
    );
}

#[test]
fn an_image_with_a_newer_drivers_compat_libraries_runs_with_them_behind_the_front() {
    let node = Node::new();
    // As nvcr.io images carry cuda-compat: a driver newer (560) than the node's (550).
    let b = bundle(
        &node,
        "compat",
        &["CUDA_VERSION=12.6.1", "NVIDIA_REQUIRE_CUDA=cuda>=12.6"],
        &[("gpuslice.io/memory", "1Gi")],
    );
    let compat = b.join("rootfs/usr/local/cuda/compat");
    std::fs::create_dir_all(&compat).unwrap();
    std::fs::copy(
        node.sim.lib_dir().join("libcuda.so.550.54.15"),
        compat.join("libcuda.so.560.28.03"),
    )
    .unwrap();
    std::os::unix::fs::symlink("libcuda.so.560.28.03", compat.join("libcuda.so.1")).unwrap();
    assert_eq!(
        start(&node, &b, "compat"),
        "",
        "CUDA 12.6 comes from the image's compat libraries"
    );
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(b.join("config.json")).unwrap()).unwrap();
    let real = spec["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["destination"] == "/usr/lib/gpuslice/driver/libgpuslice-driver-cuda.so.1")
        .unwrap();
    assert_eq!(
        real["source"].as_str().unwrap(),
        std::fs::canonicalize(compat.join("libcuda.so.560.28.03"))
            .unwrap()
            .to_str()
            .unwrap()
    );
    // Behind the front: the wall holds with the image's driver library (1 GiB less the
    // process's context is left to allocate).
    let room = ((1u64 << 30) - node.sim.spec.gpus[0].context_bytes).to_string();
    let wall = exec(
        &node,
        "compat",
        &["/usr/bin/wall", "procaddr", "alloc", &room],
    );
    for want in ["fit=CUDA_SUCCESS", "over=CUDA_ERROR_OUT_OF_MEMORY"] {
        assert!(wall.contains(want), "{want} not in {wall}");
    }
    remove(&node, "compat");

    // Compat libraries of an older driver than the node's are not used, and then CUDA 12.6
    // is more than the node's driver gives.
    let b = bundle(
        &node,
        "old",
        &["CUDA_VERSION=12.6.1", "NVIDIA_REQUIRE_CUDA=cuda>=12.6"],
        &[("gpuslice.io/memory", "1Gi")],
    );
    let compat = b.join("rootfs/usr/local/cuda/compat");
    std::fs::create_dir_all(&compat).unwrap();
    std::fs::copy(
        node.sim.lib_dir().join("libcuda.so.550.54.15"),
        compat.join("libcuda.so.535.104.05"),
    )
    .unwrap();
    let refused = start(&node, &b, "old");
    assert!(refused.contains("the driver's cuda is 12.4"), "{refused}");
}

#[test]
fn an_image_that_needs_a_newer_gpu_arch_than_it_was_given_is_refused_and_holds_nothing() {
    let node = Node::new(); // T4s: compute capability 7.5
    let b = bundle(
        &node,
        "ampere",
        &["NVIDIA_REQUIRE_ARCH=arch>=8.0"],
        &[("gpuslice.io/memory", "1Gi")],
    );
    let refused = start(&node, &b, "ampere");
    assert!(
        refused.contains("arch>=8.0 does not hold: a GPU's arch is 7.5"),
        "{refused}"
    );
    assert!(
        node.status().slices.is_empty(),
        "the claim made to learn the GPU is given back"
    );
    let b = bundle(
        &node,
        "turing",
        &["NVIDIA_REQUIRE_ARCH=arch>=7.0"],
        &[("gpuslice.io/memory", "1Gi")],
    );
    assert_eq!(start(&node, &b, "turing"), "");
    remove(&node, "turing");
}
