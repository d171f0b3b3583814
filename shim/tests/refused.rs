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

/// CUDA_ERROR_NOT_SUPPORTED: the library's refusal, and the simulated driver's answer for an
/// entry point it does not model (which its log of unmodelled calls records).
const NOT_SUPPORTED: &str = "801";

/// The names the simulated driver was called by, from its log of unmodelled calls.
fn reached_driver(log: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(" first ").map(|(_, name)| name.to_string()))
        .collect()
}

fn base(name: &str) -> &str {
    name.split('.').next().unwrap()
}

#[test]
fn what_the_wall_cannot_count_is_refused_in_a_slice_and_a_legacy_context_is_charged() {
    let slice = Slice::new(64 * MIB, 2 * MIB);
    let program = common::compile(&slice.sim, "refused");
    let log = slice.dir.path().join("unmodelled.log");
    let mut cmd = slice.command(&program);
    cmd.env("GPUSLICE_SIM_UNMODELLED_LOG", &log);
    let mut running = Running::start(cmd);
    let line = format!("{:?}", running.facts.0);
    let f = &running.facts;
    let reached = reached_driver(&log);
    for name in REFUSED {
        assert_eq!(f.get(name), NOT_SUPPORTED, "{name}: {line}");
        if *name != "cuGraphAddNode.alloc" {
            assert!(
                !reached.iter().any(|r| r == base(name)),
                "{name} reached the driver: {reached:?}"
            );
        }
    }
    // A kernel node allocates nothing: it reaches the driver (which does not model graphs).
    assert_eq!(f.get("cuGraphAddNode.kernel"), NOT_SUPPORTED, "{line}");
    assert!(reached.iter().any(|r| r == "cuGraphAddNode"), "{reached:?}");
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
    let log = slice.dir.path().join("unmodelled.log");
    let out = slice
        .command(&program)
        .env("GPUSLICE_SIM_UNMODELLED_LOG", &log)
        .env_remove("GPUSLICE_LIMITS")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&out.stdout);
    let f = Facts::parse(&line);
    let reached = reached_driver(&log);
    // The reference driver (535, CUDA 12.2) has no cuGraphAddNode_v2 (CUDA 12.3): the library
    // passes on its absence.
    assert_eq!(f.get("cuGraphAddNode_v2.alloc"), "500", "{line}");
    // The simulated driver models memory nodes: with no graph it answers INVALID_VALUE.
    assert_eq!(f.get("cuGraphAddMemAllocNode"), "1", "{line}");
    for name in REFUSED.iter().filter(|n| {
        !n.ends_with(".captured")
            && !n.starts_with("cuGraphAddNode_v2")
            && **n != "cuGraphAddMemAllocNode"
    }) {
        assert_eq!(f.get(name), NOT_SUPPORTED, "{name}: {line}");
        assert!(
            reached.iter().any(|r| r == base(name)),
            "{name} did not reach the driver: {reached:?}"
        );
    }
    // On a capturing stream the simulated driver records a memory node, as the real one does.
    assert_eq!(f.get("cuMemAllocAsync.captured"), "0", "{line}");
}
