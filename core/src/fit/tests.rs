use super::*;
use crate::quantity::MemoryQuantity;

const GIB: u64 = 1 << 30;

/// A node of `rooms`, GPU i with index i and UUID `GPU-i`.
struct Node {
    rooms: Vec<GpuRoom>,
    uuids: Vec<String>,
    rules: Rules,
}

impl Node {
    fn new(rooms: Vec<GpuRoom>, max_sharers: u32) -> Self {
        let uuids = (0..rooms.len()).map(|i| format!("GPU-{i}")).collect();
        Self {
            rooms,
            uuids,
            rules: Rules { max_sharers },
        }
    }
}

impl NodeView for Node {
    fn gpu_count(&self) -> usize {
        self.rooms.len()
    }
    fn room(&self, pos: usize) -> GpuRoom {
        self.rooms[pos]
    }
    fn index(&self, pos: usize) -> u32 {
        pos as u32
    }
    fn uuid(&self, pos: usize) -> &str {
        &self.uuids[pos]
    }
    fn model(&self, pos: usize) -> &str {
        if pos.is_multiple_of(2) {
            "NVIDIA A100-SXM4-80GB"
        } else {
            "Tesla T4"
        }
    }
    fn rules(&self) -> Rules {
        self.rules
    }
}

fn slice(gib: u64, cores: u32) -> Shape {
    Shape {
        exclusive: false,
        memory: MemoryQuantity::Bytes(gib * GIB),
        cores,
    }
}

/// The GPUs `fit_node` finds, checked against `fits_node`'s yes or no.
fn fitting(ask: &Ask<'_>, node: &Node) -> Result<Vec<usize>, NodeMisfit> {
    let mut out = Vec::new();
    let found = fit_node(ask, node, |pos, _| out.push(pos)).map(|()| out);
    assert_eq!(fits_node(ask, node), found.is_ok(), "{ask:?}");
    found
}

#[test]
fn a_slice_fits_exactly_the_free_memory_and_not_one_byte_more() {
    let mut gpu = GpuRoom::idle(16 * GIB);
    gpu.take(slice(10, 0).take_on(gpu.memory_total), false);
    let rules = Rules::default();
    assert!(fit_gpu(&slice(6, 0), &gpu, &rules).is_ok());
    let one_more = Shape {
        memory: MemoryQuantity::Bytes(6 * GIB + 1),
        ..slice(0, 0)
    };
    assert!(matches!(
        fit_gpu(&one_more, &gpu, &rules),
        Err(Misfit::Memory { .. })
    ));
}

#[test]
fn the_sharer_limit_refuses_one_slice_more_whatever_the_room() {
    let node = Node::new(
        vec![GpuRoom {
            sharers: 2,
            ..GpuRoom::idle(16 * GIB)
        }],
        2,
    );
    let ask = Ask {
        shape: slice(1, 0),
        gpus: 1,
        devices: &[],
        avoid: &[],
        models: &ANY_MODEL,
    };
    assert_eq!(fitting(&ask, &node), Err(NodeMisfit::TooFew { fitting: 0 }));
    assert!(!NodeMisfit::TooFew { fitting: 0 }.is_lasting(&ask, &node));
}

#[test]
fn a_whole_gpu_needs_a_gpu_nobody_shares_and_a_held_gpu_takes_nothing() {
    let rules = Rules::default();
    let mut shared = GpuRoom::idle(16 * GIB);
    shared.take(slice(1, 0).take_on(shared.memory_total), false);
    assert_eq!(
        fit_gpu(&Shape::whole(), &shared, &rules),
        Err(Misfit::InUse(1))
    );
    let mut held = GpuRoom::idle(16 * GIB);
    held.take(Shape::whole().take_on(held.memory_total), true);
    assert_eq!(fit_gpu(&slice(1, 0), &held, &rules), Err(Misfit::Exclusive));
}

#[test]
fn named_devices_get_exactly_those_gpus_or_say_which_is_missing_or_full() {
    let full = GpuRoom {
        memory_free: 0,
        ..GpuRoom::idle(16 * GIB)
    };
    let node = Node::new(
        vec![GpuRoom::idle(16 * GIB), full, GpuRoom::idle(16 * GIB)],
        16,
    );
    let devices = [
        DeviceSelector::Uuid("gpu-2".into()),
        DeviceSelector::Index(0),
    ];
    let ask = Ask {
        shape: slice(4, 0),
        gpus: 2,
        devices: &devices,
        avoid: &[],
        models: &ANY_MODEL,
    };
    assert_eq!(fitting(&ask, &node), Ok(vec![2, 0]));
    let missing = [DeviceSelector::Index(7)];
    let ask_missing = Ask {
        devices: &missing,
        gpus: 1,
        ..ask
    };
    assert_eq!(
        fitting(&ask_missing, &node),
        Err(NodeMisfit::NoSuchDevice { named: 0 })
    );
    let on_full = [DeviceSelector::Index(1)];
    let ask_full = Ask {
        devices: &on_full,
        gpus: 1,
        ..ask
    };
    assert!(matches!(
        fitting(&ask_full, &node),
        Err(NodeMisfit::Named { pos: 1, .. })
    ));
}

#[test]
fn chosen_gpus_must_be_eligible_distinct_fitting_and_as_many_as_asked() {
    let node = Node::new(vec![GpuRoom::idle(16 * GIB); 3], 16);
    let named = [DeviceSelector::Index(1)];
    let ask = Ask {
        shape: slice(4, 20),
        gpus: 1,
        devices: &named,
        avoid: &[],
        models: &ANY_MODEL,
    };
    assert_eq!(
        fit_chosen(&ask, &node, &[1]),
        Ok(vec![Take {
            memory_bytes: 4 * GIB,
            cores: 20
        }])
    );
    assert_eq!(
        fit_chosen(&ask, &node, &[0]),
        Err(ChosenMisfit::NotNamed { pos: 0 })
    );
    let any = Ask {
        devices: &[],
        gpus: 2,
        ..ask
    };
    assert_eq!(
        fit_chosen(&any, &node, &[2, 2]),
        Err(ChosenMisfit::Twice { pos: 2 })
    );
    assert_eq!(
        fit_chosen(&any, &node, &[2]),
        Err(ChosenMisfit::Count { chosen: 1 })
    );
}

#[test]
fn a_slice_larger_than_the_gpu_never_fits_and_says_so() {
    let node = Node::new(vec![GpuRoom::idle(8 * GIB)], 16);
    let ask = Ask {
        shape: slice(10, 0),
        gpus: 1,
        devices: &[],
        avoid: &[],
        models: &ANY_MODEL,
    };
    let e = fitting(&ask, &node).unwrap_err();
    assert!(e.is_lasting(&ask, &node));
}

#[test]
fn a_share_of_the_sms_without_memory_is_refused_naming_the_cores_annotation() {
    let ann: std::collections::BTreeMap<String, String> =
        [("gpuslice.io/cores".to_string(), "30".to_string())].into();
    let req = crate::annotations::parse(&ann).unwrap().unwrap();
    let e = Shape::of(&req).unwrap_err().to_string();
    assert_eq!(
        e,
        "annotation gpuslice.io/cores=\"30\": a share of the SMs needs a memory limit too (gpuslice.io/memory), or leave out gpuslice.io/cores for whole GPUs"
    );
}

#[test]
fn a_request_uses_only_the_models_it_accepts_and_never_the_gpus_it_avoids() {
    // GPUs 0 and 2 are A100s, 1 and 3 T4s.
    let node = Node::new(vec![GpuRoom::idle(16 * GIB); 4], 4);
    let a100 = crate::selection::ModelSelector::parse("k", "A100").unwrap();
    let no_a100 = crate::selection::ModelSelector::parse("k", "!a100").unwrap();
    let ask = |gpus, avoid, models| Ask {
        shape: slice(1, 0),
        gpus,
        devices: &[],
        avoid,
        models,
    };
    assert_eq!(fitting(&ask(2, &[], &a100), &node), Ok(vec![0, 2]));
    assert_eq!(fitting(&ask(1, &[], &no_a100), &node), Ok(vec![1, 3]));
    let avoid = [
        DeviceSelector::Index(0),
        DeviceSelector::Uuid("gpu-3".into()),
    ];
    assert_eq!(fitting(&ask(2, &avoid, &ANY_MODEL), &node), Ok(vec![1, 2]));
    assert_eq!(fitting(&ask(1, &avoid, &a100), &node), Ok(vec![2]));
    let three = ask(3, &[], &a100);
    let e = fitting(&three, &node).unwrap_err();
    assert_eq!(e, NodeMisfit::TooFew { fitting: 2 });
    assert!(
        e.is_lasting(&three, &node),
        "two A100s can never give three"
    );
    let named_t4 = [DeviceSelector::Index(1)];
    let named = Ask {
        devices: &named_t4,
        ..ask(1, &[], &a100)
    };
    assert_eq!(
        fitting(&named, &node),
        Err(NodeMisfit::NamedModel { pos: 1 })
    );
    assert_eq!(
        fit_chosen(&ask(1, &avoid, &ANY_MODEL), &node, &[0]),
        Err(ChosenMisfit::NotNamed { pos: 0 })
    );
    assert_eq!(
        fit_chosen(&ask(1, &[], &a100), &node, &[3]),
        Err(ChosenMisfit::NotNamed { pos: 3 })
    );
    assert!(fit_chosen(&ask(1, &[], &a100), &node, &[2]).is_ok());
}
