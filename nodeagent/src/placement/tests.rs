use super::*;
use gpuslice_core::annotations::DeviceSelector;
use gpuslice_core::policy::Policy;
use gpuslice_core::quantity::MemoryQuantity;
use gpuslice_core::{GpuLoad, SliceRequest};
use std::collections::BTreeMap;

const GIB: u64 = 1 << 30;

fn gpus(n: u32, total: u64) -> Vec<GpuLoad> {
    (0..n)
        .map(|i| GpuLoad {
            index: i,
            uuid: format!("GPU-{i}"),
            minor: i,
            model: if i % 2 == 0 {
                "NVIDIA A100-SXM4-80GB"
            } else {
                "Tesla T4"
            }
            .to_string(),
            memory_total: total,
            memory_allocated: 0,
            cores_allocated: 0,
            sharers: 0,
            exclusive: false,
        })
        .collect()
}

fn slice(memory: u64, policy: Policy) -> SliceRequest {
    SliceRequest {
        gpus: 1,
        memory: Some(MemoryQuantity::Bytes(memory)),
        cores: None,
        devices: vec![],
        avoid_devices: Vec::new(),
        models: Default::default(),
        gpu_policy: Some(policy),
        node_policy: None,
        assignment: None,
        container: None,
        source: BTreeMap::new(),
    }
}

fn apply(load: &mut [GpuLoad], grants: &[GpuGrant]) {
    for g in grants {
        let l = &mut load[g.index as usize];
        l.memory_allocated += g.memory_bytes;
        l.cores_allocated += g.cores;
        l.sharers += 1;
    }
}

fn used_gpus(policy: Policy) -> usize {
    let mut load = gpus(4, 15 * GIB);
    for _ in 0..4 {
        let g = place(
            &slice(15 * GIB / 2, policy),
            &load,
            Rules::default(),
            Policy::Binpack,
        )
        .unwrap();
        apply(&mut load, &g);
    }
    load.iter().filter(|l| l.sharers > 0).count()
}

#[test]
fn binpack_puts_four_half_card_slices_on_two_gpus() {
    assert_eq!(used_gpus(Policy::Binpack), 2);
}

#[test]
fn spread_puts_four_half_card_slices_on_four_gpus() {
    assert_eq!(used_gpus(Policy::Spread), 4);
}

#[test]
fn a_slice_too_big_for_any_gpu_names_the_memory_annotation() {
    let load = gpus(2, 15 * GIB);
    let e = place(
        &slice(16 * GIB, Policy::Binpack),
        &load,
        Rules::default(),
        Policy::Binpack,
    )
    .unwrap_err();
    assert_eq!(e.reason, RefusalReason::InsufficientMemory);
    assert!(
        e.message
            .starts_with("annotation gpuslice.io/memory=\"16Gi\""),
        "{}",
        e.message
    );
}

#[test]
fn a_whole_gpu_is_refused_where_a_slice_lives_and_a_slice_where_a_whole_gpu_is_held() {
    let mut load = gpus(1, 15 * GIB);
    let whole = SliceRequest {
        memory: None,
        ..slice(1, Policy::Binpack)
    };
    let first = place(
        &slice(GIB, Policy::Binpack),
        &load,
        Rules::default(),
        Policy::Binpack,
    )
    .unwrap();
    apply(&mut load, &first);
    assert_eq!(
        place(&whole, &load, Rules::default(), Policy::Binpack)
            .unwrap_err()
            .reason,
        RefusalReason::GpuInUse
    );
    let mut load = gpus(1, 15 * GIB);
    load[0].exclusive = true;
    load[0].sharers = 1;
    assert_eq!(
        place(
            &slice(GIB, Policy::Binpack),
            &load,
            Rules::default(),
            Policy::Binpack
        )
        .unwrap_err()
        .reason,
        RefusalReason::GpuInUse
    );
}

#[test]
fn the_sharer_limit_and_the_core_share_are_enforced() {
    let mut load = gpus(1, 15 * GIB);
    load[0].sharers = 2;
    let e = place(
        &slice(GIB, Policy::Binpack),
        &load,
        Rules { max_sharers: 2 },
        Policy::Binpack,
    )
    .unwrap_err();
    assert_eq!(e.reason, RefusalReason::MaxSharers);
    let mut load = gpus(1, 15 * GIB);
    load[0].cores_allocated = 80;
    let req = SliceRequest {
        cores: Some(30),
        ..slice(GIB, Policy::Binpack)
    };
    let e = place(&req, &load, Rules::default(), Policy::Binpack).unwrap_err();
    assert_eq!(e.reason, RefusalReason::InsufficientCores);
    assert!(
        e.message.contains("gpuslice.io/cores=\"30\""),
        "{}",
        e.message
    );
}

#[test]
fn named_devices_are_used_as_given_or_refused_when_unknown() {
    let load = gpus(2, 15 * GIB);
    let req = SliceRequest {
        devices: vec![DeviceSelector::Uuid("GPU-1".into())],
        ..slice(GIB, Policy::Binpack)
    };
    assert_eq!(
        place(&req, &load, Rules::default(), Policy::Binpack).unwrap()[0].index,
        1
    );
    let req = SliceRequest {
        devices: vec![DeviceSelector::Index(7)],
        ..slice(GIB, Policy::Binpack)
    };
    assert_eq!(
        place(&req, &load, Rules::default(), Policy::Binpack)
            .unwrap_err()
            .reason,
        RefusalReason::NoSuchDevice
    );
}

#[test]
fn multi_gpu_requests_take_distinct_gpus() {
    let load = gpus(4, 15 * GIB);
    let req = SliceRequest {
        gpus: 3,
        ..slice(GIB, Policy::Spread)
    };
    let g = place(&req, &load, Rules::default(), Policy::Binpack).unwrap();
    assert_eq!(g.iter().map(|g| g.index).collect::<Vec<_>>(), vec![0, 1, 2]);
    let req = SliceRequest {
        gpus: 5,
        ..slice(GIB, Policy::Spread)
    };
    assert_eq!(
        place(&req, &load, Rules::default(), Policy::Binpack)
            .unwrap_err()
            .reason,
        RefusalReason::NotEnoughGpus
    );
}

#[test]
fn the_agent_places_only_on_accepted_models_and_never_on_avoided_gpus() {
    // GPUs 0 and 2 are A100s, 1 and 3 T4s.
    let load = gpus(4, 15 * GIB);
    let models = |v: &str| {
        gpuslice_core::selection::ModelSelector::parse("gpuslice.io/gpu-model", v).unwrap()
    };
    let mut source = BTreeMap::new();
    source.insert("gpuslice.io/gpu-model".to_string(), "T4".to_string());
    let t4 = SliceRequest {
        models: models("T4"),
        source,
        ..slice(GIB, Policy::Binpack)
    };
    let g = place(&t4, &load, Rules::default(), Policy::Binpack).unwrap();
    assert_eq!(g[0].index, 1);
    let three_t4 = SliceRequest {
        gpus: 3,
        ..t4.clone()
    };
    let e = place(&three_t4, &load, Rules::default(), Policy::Binpack).unwrap_err();
    assert_eq!(e.reason, RefusalReason::NoSuchDevice);
    assert!(
        e.message.contains("gpuslice.io/gpu-model=\"T4\""),
        "{}",
        e.message
    );
    assert!(
        e.message.contains("has 2 the request may use"),
        "{}",
        e.message
    );
    let avoid = SliceRequest {
        gpus: 3,
        avoid_devices: vec![DeviceSelector::Index(1)],
        ..slice(GIB, Policy::Binpack)
    };
    let g = place(&avoid, &load, Rules::default(), Policy::Binpack).unwrap();
    assert_eq!(g.iter().map(|g| g.index).collect::<Vec<_>>(), vec![0, 2, 3]);
    let named_t4 = SliceRequest {
        devices: vec![DeviceSelector::Index(1)],
        models: models("A100"),
        ..slice(GIB, Policy::Binpack)
    };
    let e = place(&named_t4, &load, Rules::default(), Policy::Binpack).unwrap_err();
    assert!(e.message.contains("is a Tesla T4"), "{}", e.message);
}
