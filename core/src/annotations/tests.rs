use super::*;

fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

#[test]
fn no_gpuslice_keys_means_no_gpu() {
    assert_eq!(parse(&ann(&[("org.example/x", "1")])), Ok(None));
}

#[test]
fn pod_level_keys_give_a_shared_slice() {
    let r = parse(&ann(&[
        ("gpuslice.io/memory", "2Gi"),
        ("gpuslice.io/cores", "30"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(r.gpus, 1);
    assert_eq!(r.memory, Some(MemoryQuantity::Bytes(2 << 30)));
    assert_eq!(r.cores, Some(30));
    assert!(!r.is_exclusive());
}

#[test]
fn gpus_alone_asks_for_whole_gpus() {
    let r = parse(&ann(&[("gpuslice.io/gpus", "2")])).unwrap().unwrap();
    assert_eq!(r.gpus, 2);
    assert!(r.is_exclusive());
}

#[test]
fn devices_set_the_gpu_count_and_must_agree_with_gpus() {
    let r = parse(&ann(&[
        (
            "gpuslice.io/devices",
            "1,GPU-0123abcd-0000-0000-0000-00000000beef",
        ),
        ("gpuslice.io/memory", "1Gi"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(r.gpus, 2);
    let e = parse(&ann(&[
        ("gpuslice.io/devices", "0,1"),
        ("gpuslice.io/gpus", "1"),
    ]))
    .unwrap_err();
    assert_eq!(e.key, "gpuslice.io/devices");
}

#[test]
fn per_container_keys_apply_to_the_named_container_only() {
    let base = [
        ("gpuslice.io/memory", "1Gi"),
        ("gpuslice.io/trainer.memory", "4Gi"),
        ("gpuslice.io/trainer.cores", "50"),
    ];
    let mut a = ann(&base);
    a.insert(CRI_CONTAINER_NAME.into(), "trainer".into());
    let r = parse(&a).unwrap().unwrap();
    assert_eq!(r.memory, Some(MemoryQuantity::Bytes(4 << 30)));
    assert_eq!(r.container.as_deref(), Some("trainer"));
    assert_eq!(r.key(MEMORY), "gpuslice.io/trainer.memory");
    let mut b = ann(&base);
    b.insert(CRIO_CONTAINER_NAME.into(), "sidecar".into());
    assert_eq!(parse(&b), Ok(None));
}

#[test]
fn the_pod_sandbox_never_gets_a_gpu() {
    let mut a = ann(&[("gpuslice.io/memory", "1Gi")]);
    a.insert(CRI_CONTAINER_TYPE.into(), "sandbox".into());
    assert_eq!(parse(&a), Ok(None));
}

#[test]
fn every_error_names_the_annotation_the_value_and_the_reason() {
    let cases = [
        ("gpuslice.io/memory", "-2Gi", "negative"),
        ("gpuslice.io/memory", "lots", "not a number"),
        ("gpuslice.io/cores", "0", "at least 1"),
        ("gpuslice.io/cores", "150", "at most 100"),
        ("gpuslice.io/gpus", "0", "at least 1"),
        ("gpuslice.io/gpus", "17", "at most 16"),
        ("gpuslice.io/devices", "0,0", "listed twice"),
        ("gpuslice.io/devices", "0,,1", "empty entry"),
        ("gpuslice.io/gpu-policy", "fast", "unknown policy"),
        ("gpuslice.io/colour", "blue", "unknown gpuslice annotation"),
        ("gpuslice.io/Bad_Name.memory", "1Gi", "not a container name"),
        ("gpuslice.io/web.node-policy", "spread", "per pod"),
        ("gpuslice.io/memory", "1Gi\u{7}", "control characters"),
    ];
    for (k, v, why) in cases {
        let e = parse(&ann(&[(k, v)])).unwrap_err();
        let msg = e.to_string();
        assert_eq!(e.key, k);
        assert!(
            msg.contains(k) && msg.contains(&format!("{v:?}")) && msg.contains(why),
            "{msg}"
        );
    }
}

#[test]
fn policies_or_an_assignment_alone_ask_for_no_gpu_but_are_still_checked() {
    for pairs in [
        &[("gpuslice.io/node-policy", "binpack")][..],
        &[
            ("gpuslice.io/gpu-policy", "spread"),
            ("gpuslice.io/assignment", "v1.x.y"),
        ],
    ] {
        assert_eq!(parse(&ann(pairs)).unwrap(), None, "{pairs:?}");
    }
    let e = parse(&ann(&[("gpuslice.io/node-policy", "tightly")])).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("annotation gpuslice.io/node-policy=\"tightly\": "),
        "{e}"
    );
}
