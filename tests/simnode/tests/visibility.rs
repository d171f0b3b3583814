//! A process sees the GPUs whose device nodes it can open, in the node's order, through CUDA
//! and NVML alike; `CUDA_VISIBLE_DEVICES` narrows that further, its indexes counting only those.

mod common;

use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::process::Command;

use gpuslice_testsupport::sim::SimNode;

/// A device directory holding `/dev/nvidiaN` character nodes for the given minors.
fn device_dir(minors: &[u32]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for m in minors {
        let path = dir.path().join(format!("nvidia{m}"));
        let made = Command::new("mknod")
            .arg(&path)
            .args(["c", "195", &m.to_string()])
            .status()
            .unwrap();
        assert!(made.success(), "mknod (the tests run as root)");
        assert!(
            std::fs::metadata(&path)
                .unwrap()
                .file_type()
                .is_char_device()
        );
    }
    dir
}

fn seen(program: &Path, sim: &SimNode, dev: &Path, visible: Option<&str>) -> String {
    let mut c = Command::new(program);
    c.env("LD_LIBRARY_PATH", sim.lib_dir())
        .env("GPUSLICE_SIM_DEV_DIR", dev);
    if let Some(v) = visible {
        c.env("CUDA_VISIBLE_DEVICES", v);
    }
    let out = c.output().unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn only_gpus_whose_device_nodes_can_be_opened_are_seen() {
    let sim = SimNode::new(4, "A10", None);
    let program = common::compile(&sim, "visible", &["cuda", "nvidia-ml"]);
    let dev = device_dir(&[0, 2, 3]);
    assert_eq!(
        seen(&program, &sim, dev.path(), None),
        "cuda=0000:17:00.0,0000:37:00.0,0000:47:00.0 nvml=0@0,2@1,3@2"
    );
    // Index 1 is the second GPU this process can open: the node's third.
    assert_eq!(
        seen(&program, &sim, dev.path(), Some("1,0")),
        "cuda=0000:37:00.0,0000:17:00.0 nvml=0@0,2@1,3@2"
    );
    // GPU 1 has no node here: naming its UUID ends the list, as an unknown UUID does.
    let hidden = sim.spec.gpus[1].uuid.clone();
    assert_eq!(
        seen(&program, &sim, dev.path(), Some(&format!("{hidden},0"))),
        "cuda= nvml=0@0,2@1,3@2"
    );
}

#[test]
fn with_no_device_node_at_all_nothing_is_seen_where_a_device_directory_is_named() {
    let sim = SimNode::new(2, "A10", None);
    let program = common::compile(&sim, "visible", &["cuda", "nvidia-ml"]);
    let dev = device_dir(&[]);
    assert_eq!(seen(&program, &sim, dev.path(), None), "cuda= nvml=");
}
