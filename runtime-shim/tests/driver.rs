//! Driver discovery over a simulated node's driver root, and the runtime configuration that
//! selects the simulated node.

use std::path::Path;

use gpuslice_runtime_shim::config::Config;
use gpuslice_runtime_shim::driver::{DriverFiles, DriverRoot};
use gpuslice_runtime_shim::nvidia_env::{Capabilities, Capability};
use gpuslice_testsupport::sim::SimNode;

#[test]
fn the_driver_files_of_a_simulated_root_are_what_a_gpu_container_needs() {
    let sim = SimNode::new(2, "T4", None);
    let files = DriverFiles::discover(&DriverRoot::new(sim.root()), Capabilities::DEFAULT).unwrap();
    let devices: Vec<(&str, u32, u32)> = files
        .control_devices
        .iter()
        .map(|d| (d.path.as_str(), d.major, d.minor))
        .collect();
    assert_eq!(
        devices,
        vec![
            ("/dev/nvidiactl", 195, 255),
            ("/dev/nvidia-uvm", 510, 0),
            ("/dev/nvidia-uvm-tools", 510, 1),
            ("/dev/nvidia-modeset", 195, 254)
        ]
    );
    assert_eq!(files.gpu_device(1).unwrap().path, "/dev/nvidia1");
    assert!(files.gpu_device(7).is_err());
    let dests: Vec<&str> = files
        .mounts
        .iter()
        .map(|m| m.destination.as_str())
        .collect();
    for want in [
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "/usr/bin/nvidia-smi",
    ] {
        assert!(dests.contains(&want), "{want} not in {dests:?}");
    }
    assert!(
        dests.contains(&"/usr/lib/x86_64-linux-gnu/libcuda.so"),
        "programs that link with -lcuda need the development name"
    );
    assert_eq!(
        files.version, "550.54.15",
        "from the kernel module's procfs file"
    );
    assert!(
        !dests.iter().any(|d| d.contains("gpuslice-sim")),
        "discovery knows nothing of the simulated node: {dests:?}"
    );
    let libcuda = files
        .mounts
        .iter()
        .find(|m| m.destination.ends_with("libcuda.so.1"))
        .unwrap();
    assert!(
        libcuda.source.ends_with("libcuda.so.550.54.15"),
        "mounts resolve symlinks: {:?}",
        libcuda.source
    );
}

#[test]
fn the_simulated_node_is_selected_by_its_runtime_configuration() {
    let sim = SimNode::new(1, "A10", None);
    let text = sim.runtime_config().to_string();
    let cfg = Config::parse(Path::new("runtime.json"), text.as_bytes()).unwrap();
    assert_eq!(cfg.driver_root, sim.root());
    assert!(cfg.warnings().is_empty(), "{:?}", cfg.warnings());
    let mounts = cfg.extra_bind_mounts();
    let node_json = mounts
        .iter()
        .find(|m| m.destination == "/etc/gpuslice-sim/node.json")
        .expect("the node description is mounted");
    assert!(node_json.read_only && node_json.source.exists());
    let state = mounts
        .iter()
        .find(|m| m.source == sim.spec.state_dir)
        .expect("the shared state directory is mounted");
    assert!(
        !state.read_only,
        "processes record their device memory there"
    );
}

#[test]
fn every_name_of_the_driver_libraries_is_its_front_and_the_real_library_has_a_private_name() {
    use gpuslice_core::claim::{Claim, ClaimState};
    use gpuslice_runtime_shim::edits::{Edits, HostPaths};
    let sim = SimNode::new(1, "T4", None);
    let files = DriverFiles::discover(&DriverRoot::new(sim.root()), Capabilities::DEFAULT).unwrap();
    let claim = Claim {
        container_id: "c".into(),
        request: gpuslice_core::annotations::parse(
            &[("gpuslice.io/memory".to_string(), "1Gi".to_string())].into(),
        )
        .unwrap()
        .unwrap(),
        exclusive: false,
        gpus: Vec::new(),
        state: ClaimState::Pending,
        created_unix_ms: 0,
        assigned_as: None,
        owner: None,
        pod: None,
    };
    let host = HostPaths {
        container_dir: "/run/gpuslice/c".into(),
        interception_library: "/opt/gs/libgpuslice.so".into(),
        hook: "/opt/gs/gpuslice-hook".into(),
        hook_env: Vec::new(),
    };
    let edits = Edits::for_claim(&claim, &files, &host).unwrap();
    let source_of = |dest: &str| {
        edits
            .mounts
            .iter()
            .find(|m| m.destination == dest)
            .unwrap_or_else(|| panic!("{dest} not mounted: {:?}", edits.mounts))
            .source
            .clone()
    };
    let lib = "/usr/lib/x86_64-linux-gnu";
    for name in ["libcuda.so.1", "libcuda.so.550.54.15"] {
        assert_eq!(
            source_of(&format!("{lib}/{name}")),
            Path::new("/opt/gs/libgpuslice_cuda.so")
        );
    }
    assert_eq!(
        source_of(&format!("{lib}/libnvidia-ml.so.1")),
        Path::new("/opt/gs/libgpuslice_nvml.so")
    );
    let real = std::fs::canonicalize(sim.lib_dir().join("libcuda.so.1")).unwrap();
    assert_eq!(
        source_of("/usr/lib/gpuslice/driver/libgpuslice-driver-cuda.so.1"),
        real
    );
    assert_eq!(
        source_of("/usr/lib/gpuslice/libgpuslice.so"),
        Path::new("/opt/gs/libgpuslice.so")
    );
    assert!(
        edits
            .mounts
            .iter()
            .all(|m| m.destination != "/etc/ld.so.preload"),
        "nothing is preloaded"
    );
    assert_eq!(
        edits.mounts.iter().filter(|m| m.source == real).count(),
        1,
        "the real library is mounted once, under its private name only"
    );
}

#[test]
fn only_libraries_of_the_drivers_version_and_the_asked_capabilities_are_given() {
    let sim = SimNode::new(2, "T4", None);
    let lib = sim.lib_dir();
    // A library an older driver left behind, and a video library of this driver.
    std::fs::copy(
        lib.join("libcuda.so.550.54.15"),
        lib.join("libnvidia-encode.so.535.104.05"),
    )
    .unwrap();
    std::os::unix::fs::symlink(
        "libnvidia-encode.so.535.104.05",
        lib.join("libnvidia-encode.so.1"),
    )
    .unwrap();
    std::fs::copy(
        lib.join("libcuda.so.550.54.15"),
        lib.join("libnvcuvid.so.550.54.15"),
    )
    .unwrap();
    std::os::unix::fs::symlink("libnvcuvid.so.550.54.15", lib.join("libnvcuvid.so.1")).unwrap();
    let root = DriverRoot::new(sim.root());
    let names = |caps: Capabilities| -> Vec<String> {
        DriverFiles::discover(&root, caps)
            .unwrap()
            .mounts
            .iter()
            .filter_map(|m| m.destination.rsplit('/').next().map(str::to_string))
            .collect()
    };
    let default = names(Capabilities::DEFAULT);
    assert!(
        !default.iter().any(|n| n.starts_with("libnvcuvid")),
        "{default:?}"
    );
    let video = names(Capabilities::DEFAULT.with(Capability::Video));
    assert!(video.contains(&"libnvcuvid.so.1".to_string()), "{video:?}");
    assert!(
        !video.iter().any(|n| n.starts_with("libnvidia-encode")),
        "a library of driver 535 is not this driver's: {video:?}"
    );
    // Utility alone: NVML and nvidia-smi, no CUDA.
    let utility = names(Capabilities::default().with(Capability::Utility));
    assert!(
        utility.contains(&"libnvidia-ml.so.1".to_string())
            && utility.contains(&"nvidia-smi".to_string())
    );
    assert!(
        !utility.iter().any(|n| n.starts_with("libcuda")),
        "{utility:?}"
    );
}

#[test]
fn the_linker_cache_of_the_root_is_read_and_the_proc_entries_of_other_gpus_are_listed() {
    let sim = SimNode::new(3, "T4", None);
    let cache = gpuslice_runtime_shim::ldcache::read(&sim.root().join("etc/ld.so.cache")).unwrap();
    assert!(cache.iter().any(|e| e.name == "libcuda.so.1"), "{cache:?}");
    let files = DriverFiles::discover(&DriverRoot::new(sim.root()), Capabilities::DEFAULT).unwrap();
    let others = files.foreign_gpu_proc_dirs(&[sim.spec.gpus[1].minor]);
    assert_eq!(others.len(), 2, "{others:?}");
    for g in [0, 2] {
        let bus = gpuslice_testsupport::sim::proc_bus_id(&sim.spec.gpus[g].pci_bus_id);
        assert!(
            others.contains(&format!("/proc/driver/nvidia/gpus/{bus}")),
            "{others:?}"
        );
    }
}

#[test]
fn graphics_brings_the_vulkan_and_egl_loader_files_and_the_gsp_firmware_of_the_version_comes_too() {
    let sim = SimNode::new(1, "T4", None);
    let root = sim.root();
    for f in [
        "etc/vulkan/icd.d/nvidia_icd.json",
        "usr/share/glvnd/egl_vendor.d/10_nvidia.json",
    ] {
        let p = root.join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, "{}").unwrap();
    }
    let fw = root.join("lib/firmware/nvidia/550.54.15");
    std::fs::create_dir_all(&fw).unwrap();
    std::fs::write(fw.join("gsp_ga10x.bin"), "").unwrap();
    std::fs::create_dir_all(root.join("lib/firmware/nvidia/535.104.05")).unwrap();
    std::fs::write(
        root.join("lib/firmware/nvidia/535.104.05/gsp_tu10x.bin"),
        "",
    )
    .unwrap();
    let dests = |caps: Capabilities| -> Vec<String> {
        DriverFiles::discover(&DriverRoot::new(root), caps)
            .unwrap()
            .mounts
            .into_iter()
            .map(|m| m.destination)
            .collect()
    };
    let default = dests(Capabilities::DEFAULT);
    assert!(!default.iter().any(|d| d.ends_with(".json")), "{default:?}");
    assert!(
        default.contains(&"/lib/firmware/nvidia/550.54.15/gsp_ga10x.bin".to_string()),
        "{default:?}"
    );
    assert!(
        !default.iter().any(|d| d.contains("535.104.05")),
        "another driver's firmware: {default:?}"
    );
    let graphics = dests(Capabilities::DEFAULT.with(Capability::Graphics));
    for want in [
        "/etc/vulkan/icd.d/nvidia_icd.json",
        "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
    ] {
        assert!(
            graphics.contains(&want.to_string()),
            "{want} not in {graphics:?}"
        );
    }
}
