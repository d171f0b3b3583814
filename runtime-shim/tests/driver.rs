//! Driver discovery over a simulated node's driver root.

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
        "/usr/lib/x86_64-linux-gnu/gpuslice-sim/node.json",
        "/usr/bin/nvidia-smi",
    ] {
        assert!(dests.contains(&want), "{want} not in {dests:?}");
    }
    assert!(
        !dests.contains(&"/usr/lib/x86_64-linux-gnu/libcuda.so"),
        "the development symlink is not needed"
    );
    let state = files
        .mounts
        .iter()
        .find(|m| m.source == sim.spec.state_dir)
        .expect("state dir mount");
    assert!(!state.read_only);
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
