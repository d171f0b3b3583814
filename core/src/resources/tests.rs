use std::collections::BTreeMap;

use serde_json::json;

use super::*;
use crate::publication::PublishedGpu;

const GIB: u64 = 1 << 30;

fn annotated(pairs: &[(&str, &str)]) -> Option<SliceRequest> {
    let mut a: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (format!("gpuslice.io/{k}"), (*v).to_string()))
        .collect();
    a.insert(annotations::CRI_CONTAINER_NAME.into(), "app".into());
    annotations::parse(&a).unwrap()
}

fn declared(memory: Option<u64>, cores: Option<u64>) -> Declared {
    Declared { memory, cores }
}

#[test]
fn resources_alone_ask_for_one_gpu_with_that_memory_and_share() {
    let r = resolve("app", None, declared(Some(4 * GIB), Some(30)))
        .unwrap()
        .unwrap();
    assert_eq!(r.request.gpus, 1);
    assert_eq!(r.request.memory, Some(MemoryQuantity::Bytes(4 * GIB)));
    assert_eq!(r.request.cores, Some(30));
    assert!(r.completed);
    assert_eq!(
        r.annotations("app"),
        BTreeMap::from([
            ("gpuslice.io/app.gpus".to_string(), "1".to_string()),
            ("gpuslice.io/app.memory".to_string(), (4 * GIB).to_string()),
            ("gpuslice.io/app.cores".to_string(), "30".to_string()),
        ])
    );
}

#[test]
fn resources_split_evenly_over_the_gpus_the_annotations_ask_for() {
    let r = resolve(
        "app",
        annotated(&[("gpus", "2")]),
        declared(Some(8 * GIB), Some(60)),
    )
    .unwrap()
    .unwrap();
    assert_eq!(r.request.memory, Some(MemoryQuantity::Bytes(4 * GIB)));
    assert_eq!(r.request.cores, Some(30));
    assert!(r.completed);
    let e = resolve(
        "app",
        annotated(&[("gpus", "3")]),
        declared(Some(1000), None),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "container app: resource gpuslice.io/gpu-memory=1000 does not split into 3 equal, non-zero sizes (one per GPU)"
    );
}

#[test]
fn annotations_and_resources_that_agree_need_nothing_written() {
    let r = resolve(
        "app",
        annotated(&[("gpus", "2"), ("memory", "2Gi"), ("cores", "25")]),
        declared(Some(4 * GIB), Some(50)),
    )
    .unwrap()
    .unwrap();
    assert!(!r.completed);
    assert_eq!(r.request.memory, Some(MemoryQuantity::Bytes(2 * GIB)));
}

#[test]
fn annotations_and_resources_that_disagree_are_refused_naming_both() {
    let e = resolve(
        "app",
        annotated(&[("memory", "2Gi")]),
        declared(Some(3 * GIB), None),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "container app: resource gpuslice.io/gpu-memory={} disagrees with annotation gpuslice.io/memory=\"2Gi\" × 1 GPU(s) = {}",
            3 * GIB,
            2 * GIB
        )
    );
    let e = resolve(
        "app",
        annotated(&[("memory", "2Gi"), ("cores", "20")]),
        declared(None, Some(30)),
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("disagrees with annotation gpuslice.io/cores=20"),
        "{e}"
    );
    let e = resolve(
        "app",
        annotated(&[("memory", "25%")]),
        declared(Some(GIB), None),
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("cannot agree with annotation gpuslice.io/memory=25%"),
        "{e}"
    );
}

#[test]
fn whole_gpus_declare_one_hundred_cores_each() {
    let r = resolve(
        "app",
        annotated(&[("gpus", "2")]),
        declared(None, Some(200)),
    )
    .unwrap()
    .unwrap();
    assert!(r.request.is_exclusive());
    assert!(!r.completed);
    let e = resolve(
        "app",
        annotated(&[("gpus", "2")]),
        declared(None, Some(100)),
    )
    .unwrap_err();
    assert!(e.to_string().contains("2 whole GPU(s) take 200"), "{e}");
}

#[test]
fn cores_without_memory_or_annotations_are_refused() {
    let e = resolve("app", None, declared(None, Some(30))).unwrap_err();
    assert!(
        e.to_string().contains("a slice always has a memory wall"),
        "{e}"
    );
    assert_eq!(resolve("app", None, Declared::default()).unwrap(), None);
}

#[test]
fn declared_resources_are_read_from_limits_then_requests_with_clear_errors() {
    let c = json!({"name": "app", "resources": {
        "limits": {"gpuslice.io/gpu-memory": "4Gi", "cpu": "1"},
        "requests": {"gpuslice.io/gpu-memory": "4Gi", "gpuslice.io/gpu-cores": "30"}}});
    assert_eq!(
        Declared::of_container(&c).unwrap(),
        declared(Some(4 * GIB), Some(30))
    );
    let bad = json!({"name": "app", "resources": {"limits": {"gpuslice.io/gpu-memory": "lots"}}});
    let e = Declared::of_container(&bad).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("container app: resource gpuslice.io/gpu-memory=\"lots\": "),
        "{e}"
    );
    let share = json!({"name": "app", "resources": {"limits": {"gpuslice.io/gpu-memory": "50%"}}});
    assert!(Declared::of_container(&share).is_err());
    let cores = json!({"name": "app", "resources": {"limits": {"gpuslice.io/gpu-cores": "0.5"}}});
    assert!(Declared::of_container(&cores).is_err());
    assert!(
        Declared::of_container(&json!({"name": "app"}))
            .unwrap()
            .is_empty()
    );
}

#[test]
fn a_node_advertises_all_its_gpu_memory_and_one_hundred_cores_per_gpu() {
    let gpu = |memory_total| PublishedGpu {
        index: None,
        uuid: "GPU-x".into(),
        model: "A10".into(),
        memory_total,
        memory_allocated: GIB,
        cores_allocated: 10,
        sharers: 1,
        exclusive: false,
    };
    let p = NodePublication {
        topology: None,
        version: 1,
        claimed: Vec::new(),
        max_sharers: 16,
        gpus: vec![gpu(24 * GIB), gpu(16 * GIB)],
    };
    let c = node_capacity(&p);
    assert_eq!(c[GPU_MEMORY], (40 * GIB).to_string());
    assert_eq!(c[GPU_CORES], "200");
}
