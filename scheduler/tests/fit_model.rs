//! One fit model on both sides: random node states and random pods go through the extender
//! (filter, then bind's placement) and through the node agent's real ledger (admission of
//! each container with the signed assignment bind made, as at container create). The
//! extender never binds what the agent refuses, binds every pod that passed its filter, and
//! passes every node on which the agent's own placement admits a one-container pod.

use std::collections::BTreeMap;

use gpuslice_core::annotations::{CRI_CONTAINER_NAME, PREFIX};
use gpuslice_core::assignment::Assignment;
use gpuslice_core::fit::Rules;
use gpuslice_core::inventory::{GpuInfo, Inventory};
use gpuslice_core::policy::Policy;
use gpuslice_nodeagent::ledger::{Ledger, Trust};
use gpuslice_nodeagent::rundir::RunDir;
use gpuslice_nodeagent::store::Store;
use gpuslice_nodeagent::{placement, publish};
use gpuslice_scheduler::cluster::{ClusterPolicy, NodeState, TaskMix};
use gpuslice_scheduler::extender::wire::ExtenderArgs;
use gpuslice_scheduler::extender::{Extender, bind, pod_slices};
use proptest::prelude::*;
use serde_json::{Value, json};

const GIB: u64 = 1 << 30;
const KEY: &[u8] = b"a shared secret of the whole cluster, 32+ bytes";
const NODE: &str = "gpu-node-1";
const POD_UID: &str = "5f0c7d4e-0000-4000-8000-00000000abcd";

/// One container's request, as annotation values.
#[derive(Debug, Clone)]
struct Request {
    gpus: Option<u32>,
    memory: Option<String>,
    cores: Option<u32>,
    devices: Option<String>,
    model: Option<String>,
}

impl Request {
    /// Its annotations, pod-level or for container `name`.
    fn annotations(&self, name: Option<&str>) -> BTreeMap<String, String> {
        let key = |field: &str| match name {
            Some(n) => format!("{PREFIX}{n}.{field}"),
            None => format!("{PREFIX}{field}"),
        };
        let mut a = BTreeMap::new();
        if let Some(g) = self.gpus {
            a.insert(key("gpus"), g.to_string());
        }
        if let Some(m) = &self.memory {
            a.insert(key("memory"), m.clone());
        }
        if let Some(c) = self.cores {
            a.insert(key("cores"), c.to_string());
        }
        if let Some(d) = &self.devices {
            a.insert(key("devices"), d.clone());
        }
        if let Some(m) = &self.model {
            a.insert(key("gpu-model"), m.clone());
        }
        a
    }
}

fn request() -> impl Strategy<Value = Request> {
    let memory = prop_oneof![
        2 => Just(None),
        3 => (1u64..=12).prop_map(|g| Some(format!("{g}Gi"))),
        1 => (1u32..=100).prop_map(|p| Some(format!("{p}%"))),
        1 => Just(Some("30Gi".to_string())),
    ];
    let cores = prop_oneof![3 => Just(None), 2 => (1u32..=100).prop_map(Some)];
    let devices = prop_oneof![
        4 => Just(None),
        1 => (0u32..5).prop_map(|i| Some(i.to_string())),
        1 => (0u32..5).prop_map(|i| Some(format!("GPU-00000000-0000-4000-8000-00000000000{i}"))),
        1 => (0u32..4, 0u32..4).prop_map(|(a, b)| Some(format!("{a},{b}"))),
        1 => (0u32..5).prop_map(|i| Some(format!("!{i}"))),
    ];
    // The node's GPUs alternate A100 and T4 (see `inventory`).
    let model = prop_oneof![
        6 => Just(None),
        1 => Just(Some("A100".to_string())),
        1 => Just(Some("t4".to_string())),
        1 => Just(Some("!T4".to_string())),
        1 => Just(Some("A100-SXM4, !80GB".to_string())),
        1 => Just(Some("H100".to_string())),
    ];
    (prop::option::of(1u32..=3), memory, cores, devices, model).prop_map(
        |(gpus, memory, mut cores, devices, model)| {
            // Cores alone are not a request the parser takes; keep those that mean a slice.
            if memory.is_none() && cores.is_some_and(|c| c < 100) {
                cores = None;
            }
            let gpus = match &devices {
                Some(d) if !d.starts_with('!') => Some(d.split(',').count() as u32),
                _ => gpus,
            };
            Request {
                gpus,
                memory,
                cores,
                devices,
                model,
            }
        },
    )
}

/// A node: GPU sizes, the sharer limit, and claims made before (by the agent itself).
#[derive(Debug, Clone)]
struct Node {
    gpus: Vec<u64>,
    max_sharers: u32,
    before: Vec<Request>,
}

fn node() -> impl Strategy<Value = Node> {
    (
        prop::collection::vec(
            prop_oneof![Just(8 * GIB), Just(16 * GIB), Just(24 * GIB)],
            1..=4,
        ),
        1u32..=4,
        prop::collection::vec(request(), 0..8),
    )
        .prop_map(|(gpus, max_sharers, before)| Node {
            gpus,
            max_sharers,
            before,
        })
}

fn policy() -> impl Strategy<Value = &'static str> {
    prop_oneof![Just("binpack"), Just("spread"), Just("frag-aware")]
}

fn inventory(gpus: &[u64]) -> Inventory {
    Inventory {
        topology: None,
        driver_version: "550.54.15".into(),
        cuda_driver_version: Some(12040),
        gpus: gpus
            .iter()
            .enumerate()
            .map(|(i, &total)| GpuInfo {
                index: i as u32,
                uuid: format!("GPU-00000000-0000-4000-8000-00000000000{i}"),
                name: if i % 2 == 0 {
                    "NVIDIA A100-SXM4-80GB"
                } else {
                    "Tesla T4"
                }
                .into(),
                memory_total_bytes: total,
                memory_reserved_bytes: 0,
                minor: i as u32,
                pci_bus_id: String::new(),
                numa_node: None,
                compute_capability: None,
                brand: None,
            })
            .collect(),
    }
}

/// The agent's ledger for `node`, with the earlier claims it admitted.
fn agent(dir: &std::path::Path, node: &Node) -> Ledger {
    let store = Store::open(&dir.join("state")).unwrap();
    let run = RunDir::new(dir.join("run")).unwrap();
    let rules = Rules {
        max_sharers: node.max_sharers,
    };
    let (mut ledger, _) =
        Ledger::open(inventory(&node.gpus), store, run, rules, Policy::Binpack).unwrap();
    ledger = ledger.with_trust(Trust {
        key: Some(KEY.to_vec()),
        node: NODE.into(),
    });
    for (i, r) in node.before.iter().enumerate() {
        // Refusals are fine: they leave the node as it was.
        let _ = ledger.claim(&format!("before-{i}"), &r.annotations(None), 1);
    }
    ledger
}

/// A pod of app containers `c0`, `c1`… and, when given, an init container `i0` (a sidecar
/// when its flag says so).
fn pod(containers: &[Request], init: Option<&(Request, bool)>) -> Value {
    let per_container = containers.len() > 1 || init.is_some();
    let mut annotations = BTreeMap::new();
    for (i, c) in containers.iter().enumerate() {
        let name = format!("c{i}");
        annotations.extend(c.annotations(per_container.then_some(name.as_str())));
    }
    let mut init_containers = Vec::new();
    if let Some((r, sidecar)) = init {
        annotations.extend(r.annotations(Some("i0")));
        let mut c = json!({"name": "i0"});
        if *sidecar {
            c["restartPolicy"] = json!("Always");
        }
        init_containers.push(c);
    }
    json!({
        "metadata": {"name": "p", "namespace": "default", "uid": POD_UID, "annotations": annotations},
        "spec": {
            "initContainers": init_containers,
            "containers": (0..containers.len()).map(|i| json!({"name": format!("c{i}")})).collect::<Vec<_>>()
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    #[test]
    fn the_extender_binds_only_what_the_agent_admits_and_what_it_passes_it_binds(
        node in node(),
        containers in prop::collection::vec(request(), 1..=2),
        init in prop::option::weighted(0.3, (request(), any::<bool>())),
        policy in policy(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = agent(dir.path(), &node);
        let publication = publish::publication(&ledger);
        let extender = Extender::new(policy.parse::<ClusterPolicy>().unwrap());
        extender.update_node(NODE, Some(publication.clone()));
        let pod = pod(&containers, init.as_ref());
        let body = json!({"Pod": pod, "NodeNames": [NODE]}).to_string();
        let args: ExtenderArgs = serde_json::from_str(&body).unwrap();
        let filtered = extender.filter(&args);
        let passed = filtered.node_names.as_ref().is_some_and(|n| n.iter().any(|x| x == NODE));

        // The agent's own placement of a one-container pod, on the same state.
        if containers.len() == 1 && init.is_none() {
            let mut ann = containers[0].annotations(None);
            ann.insert(CRI_CONTAINER_NAME.into(), "c0".into());
            let own = gpuslice_core::annotations::parse(&ann)
                .ok()
                .flatten()
                .map(|req| placement::place(&req, &ledger.loads(), ledger.rules(), Policy::Binpack));
            if let Some(Ok(_)) = own {
                prop_assert!(passed, "the agent would place it, the extender filtered the node out: {filtered:?}");
            }
        }
        if !passed {
            return Ok(());
        }
        // Bind's placement, exactly as bind makes it (from the node as published).
        let slices = pod_slices(&pod).unwrap();
        let placed = bind::place_pod(
            &NodeState::published(NODE, &publication),
            &publication,
            POD_UID,
            &slices,
            policy.parse().unwrap(),
            &TaskMix::default(),
        );
        // A node that passes the filter takes the pod at bind.
        let (assigned, _) = placed.map_err(|e| {
            TestCaseError::fail(format!("passed the filter but bind could not place it: {e}"))
        })?;
        let signed = Assignment { node: NODE.into(), pod_uid: POD_UID.into(), containers: assigned.clone() }
            .sign(KEY)
            .unwrap();
        // Each container starts: the agent admits it with the assignment, as containerd asks;
        // a plain init container exits (its claim released) before the next one starts.
        let steps = slices
            .init
            .iter()
            .map(|(c, sidecar)| (c, *sidecar))
            .chain(slices.containers.iter().map(|c| (c, true)));
        for (i, (c, stays)) in steps.enumerate() {
            let mut ann: BTreeMap<String, String> = pod["metadata"]["annotations"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect();
            ann.insert(format!("{PREFIX}assignment"), signed.clone());
            ann.insert(CRI_CONTAINER_NAME.into(), c.name.clone());
            ann.insert("io.kubernetes.cri.sandbox-uid".into(), POD_UID.into());
            let admitted = ledger.claim(&format!("pod-{i}"), &ann, 2);
            prop_assert!(
                admitted.is_ok(),
                "the extender bound {} to {:?}, the agent refused: {:?}",
                c.name, assigned[&c.name], admitted.err().map(|e| e.to_string())
            );
            if !stays {
                ledger.release(&format!("pod-{i}")).unwrap();
            }
        }
    }
}
