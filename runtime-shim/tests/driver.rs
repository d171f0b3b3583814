//! Driver discovery over a simulated node's driver root, and the runtime configuration that
//! selects the simulated node.

use std::path::Path;

use gpuslice_runtime_shim::config::Config;
use gpuslice_runtime_shim::driver::{DriverFiles, DriverRoot};
use gpuslice_testsupport::sim::SimNode;

#[test]
fn the_driver_files_of_a_simulated_root_are_what_a_gpu_container_needs() {
    let sim = SimNode::new(2, "T4", None);
    let files = DriverFiles::discover(&DriverRoot::new(sim.root())).unwrap();
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
            ("/dev/nvidia-uvm-tools", 510, 1)
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
        !dests.contains(&"/usr/lib/x86_64-linux-gnu/libcuda.so"),
        "the development symlink is not needed"
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
        .find(|m| m.destination == "/usr/lib/x86_64-linux-gnu/gpuslice-sim/node.json")
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
