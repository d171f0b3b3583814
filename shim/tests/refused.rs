//! Entry points whose memory the wall cannot count are refused in a slice, found however the
//! program looks for them, and pass through outside one; the device attributes that tell of
//! them report them absent in a slice; new parameters for a conditional node are refused there
//! too; the legacy `cuCtxCreate` is charged as a context.

mod common;

use std::process::Stdio;

use common::{Facts, MIB, Running, Slice};

const REFUSED: &[&str] = &[
    "cuMemAlloc",
    "cuMemAllocPitch",
    "cuArrayCreate",
    "cuArray3DCreate",
    "cuMemFree",
    "cuMemGetInfo",
    "cuDeviceTotalMem",
    "cuMemImportFromShareableHandle",
    "cuMemPoolImportFromShareableHandle",
    "cuMemPoolImportPointer",
    "cuMemExportToShareableHandle",
    "cuMemPoolExportToShareableHandle",
    "cuMemPoolExportPointer",
    "cuMulticastCreate",
    "cuMemGetHandleForAddressRange",
];

/// New parameters for a conditional node, of its graph and of an executable graph: refused in
/// a slice (what its bodies would then run is not told), each with the name the simulated
/// driver, which does not model them for conditional nodes, records when one reaches it.
const CONDITIONAL_CHANGES: &[(&str, &str)] = &[
    ("cuGraphNodeSetParams", "cuGraphNodeSetParams"),
    (
        "cuGraphExecNodeSetParams",
        "cuGraphExecNodeSetParams (not a kernel, memset, memcpy or child graph node)",
    ),
];

/// The device attributes that tell of the refused features (exported handles of each type, a
/// pool's handle types, dma-buf, fabric handles, multicast), and what the simulated node's GPU
/// reports for each outside a slice.
const ATTRIBUTES: &[(&str, &str)] = &[
    ("attr103", "1"),
    ("attr104", "0"),
    ("attr105", "0"),
    ("attr119", "1"),
    ("attr124", "1"),
    ("attr128", "0"),
    ("attr132", "0"),
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
        assert!(
            !reached.iter().any(|r| r == name),
            "{name} reached the driver: {reached:?}"
        );
    }
    for (name, recorded) in CONDITIONAL_CHANGES {
        assert_eq!(f.get(name), NOT_SUPPORTED, "{name}: {line}");
        assert!(
            !reached.iter().any(|r| r == recorded),
            "{name} reached the driver: {reached:?}"
        );
    }
    assert_eq!(f.get("cuCtxCreate"), "0", "{line}");
    assert_eq!(f.get("cuMemAllocAsync.plain"), "0", "{line}");
    // The primary context, the one made by the legacy name, and the plain 1 MiB from the
    // default pool, which took a step of 32 MiB for it.
    assert_eq!(slice.usage().totals()[0], 2 * 2 * MIB + 32 * MIB, "{line}");
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
    for name in REFUSED {
        assert_eq!(f.get(name), NOT_SUPPORTED, "{name}: {line}");
        assert!(
            reached.iter().any(|r| r == name),
            "{name} did not reach the driver: {reached:?}"
        );
    }
    for (name, recorded) in CONDITIONAL_CHANGES {
        assert!(
            reached.iter().any(|r| r == recorded),
            "{name} did not reach the driver: {reached:?}"
        );
    }
}

#[test]
fn a_slice_reports_the_features_it_refuses_absent_and_the_device_reports_them_outside_one() {
    let slice = Slice::new(64 * MIB, 2 * MIB);
    let program = common::compile(&slice.sim, "refused");
    let run = |in_slice: bool| {
        let mut cmd = slice.command(&program);
        if !in_slice {
            cmd.env_remove("GPUSLICE_LIMITS");
        }
        let out = cmd.stdin(Stdio::null()).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let (inside, outside) = (run(true), run(false));
    let (fi, fo) = (Facts::parse(&inside), Facts::parse(&outside));
    for (attr, device) in ATTRIBUTES {
        assert_eq!(fi.get(attr), "0", "{attr} in a slice: {inside}");
        assert_eq!(fo.get(attr), *device, "{attr} outside a slice: {outside}");
    }
}
