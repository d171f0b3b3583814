//! Entry points whose memory the wall cannot count are refused in a slice, found however the
//! program looks for them, and pass through outside one; the legacy `cuCtxCreate` is charged
//! as a context.

mod common;

use std::process::Stdio;

use common::{Facts, MIB, Running, Slice};

const REFUSED: &[&str] = &[
    "cuMemAlloc",
    "cuMemAllocPitch",
    "cuArrayCreate",
    "cuArray3DCreate",
    "cuGraphAddMemAllocNode",
    "cuGraphAddNode.alloc",
    "cuGraphAddNode_v2.alloc",
    "cuMemImportFromShareableHandle",
    "cuMemPoolImportFromShareableHandle",
    "cuMemPoolImportPointer",
    "cuMulticastCreate",
    "cuMemAllocAsync.captured",
    "cuMemAllocFromPoolAsync.captured",
];

/// CUDA_ERROR_NOT_SUPPORTED and CUDA_ERROR_NOT_FOUND.
const NOT_SUPPORTED: &str = "801";
const NOT_FOUND: &str = "500";

#[test]
fn what_the_wall_cannot_count_is_refused_in_a_slice_and_a_legacy_context_is_charged() {
    let slice = Slice::new(64 * MIB, 2 * MIB);
    let program = common::compile(&slice.sim, "refused");
    let mut running = Running::start(slice.command(&program));
    let line = format!("{:?}", running.facts.0);
    let f = &running.facts;
    for name in REFUSED {
        assert_eq!(f.get(name), NOT_SUPPORTED, "{name}: {line}");
    }
    // A kernel node allocates nothing: it reaches the driver (which has no graphs).
    assert_eq!(f.get("cuGraphAddNode.kernel"), NOT_FOUND, "{line}");
    assert_eq!(f.get("cuCtxCreate"), "0", "{line}");
    assert_eq!(f.get("cuMemAllocAsync.plain"), "0", "{line}");
    // The primary context, the one made by the legacy name, and the plain 1 MiB.
    assert_eq!(slice.usage().totals()[0], 2 * 2 * MIB + MIB, "{line}");
    drop(running.stdin.take());
    assert!(running.child.wait().unwrap().success());
}

#[test]
fn outside_a_slice_those_entry_points_reach_the_driver() {
    let slice = Slice::new(64 * MIB, 2 * MIB);
    let program = common::compile(&slice.sim, "refused");
    let out = slice
        .command(&program)
        .env_remove("GPUSLICE_LIMITS")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&out.stdout);
    let f = Facts::parse(&line);
    for name in REFUSED.iter().filter(|n| !n.ends_with(".captured")) {
        assert_eq!(f.get(name), NOT_FOUND, "{name}: {line}");
    }
    // The simulated driver allocates on a capturing stream (the real one records a node).
    assert_eq!(f.get("cuMemAllocAsync.captured"), "0", "{line}");
}
