//! The agent publishes its GPUs on its Node for the cluster scheduler, and its extended
//! resources for kubelet, against a stand-in API server (`gpuslice_testsupport::apiserver`),
//! and keeps the publication current.

mod common;

use std::time::Duration;

use common::*;
use gpuslice_core::publication::{NODE_STATE_ANNOTATION, NodePublication};
use gpuslice_core::resources;
use gpuslice_testsupport::apiserver::ApiServer;
use gpuslice_testsupport::{agent::Agent, bus::Bus, sim::SimNode, wait_for};
use serde_json::json;

fn published(api: &ApiServer) -> Option<NodePublication> {
    let node = api.node("gpu-node-1")?;
    let text = node["metadata"]["annotations"][NODE_STATE_ANNOTATION]
        .as_str()?
        .to_string();
    serde_json::from_str(&text).ok()
}

/// An agent on `sim` publishing Node gpu-node-1 every 100 ms through `api`.
fn publishing_agent(sim: &SimNode, api: &ApiServer, bus: &Bus) -> Agent {
    Agent::start(
        &agent_exe(),
        bus,
        sim,
        &[
            "--publish-node",
            "--kube-api",
            &api.url,
            "--node-name",
            "gpu-node-1",
            "--publish-interval",
            "100ms",
        ],
    )
}

#[test]
fn the_node_annotation_follows_claims_and_releases_and_capacity_is_advertised() {
    let sim = SimNode::new(2, "T4", Some(15 * GIB));
    let api = ApiServer::start();
    api.put_node(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "gpu-node-1", "resourceVersion": "1",
                     "labels": {"gpuslice.io/node": "true"}},
        "status": {"capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"}}
    }));
    let bus = Bus::start();
    let _agent = publishing_agent(&sim, &api, &bus);
    let first = wait_for(Duration::from_secs(10), || published(&api).is_some());
    assert!(first, "nothing published: {:?}", api.node("gpu-node-1"));
    let p = published(&api).unwrap();
    assert_eq!(p.gpus.len(), 2);
    assert_eq!(p.gpus[0].uuid, sim.spec.gpus[0].uuid);
    assert_eq!(p.gpus[0].memory_total, 15 * GIB);
    assert_eq!(p.gpus[0].memory_allocated, 0);
    let capacity = |api: &ApiServer| api.node("gpu-node-1").unwrap()["status"]["capacity"].clone();
    let advertised = wait_for(Duration::from_secs(10), || {
        capacity(&api)[resources::GPU_MEMORY].is_string()
    });
    assert!(
        advertised,
        "no extended resources: {:?}",
        api.node("gpu-node-1")
    );
    assert_eq!(
        capacity(&api),
        json!({"cpu": "16", "memory": "64Gi", "pods": "110",
               "gpuslice.io/gpu-memory": (30 * GIB).to_string(), "gpuslice.io/gpu-cores": "200"}),
        "kubelet's own capacity is kept"
    );

    let out = cli(
        &bus.address,
        &["claim", "web", "-a", "gpuslice.io/memory=2Gi"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shows = |bytes: u64| {
        wait_for(Duration::from_secs(10), || {
            published(&api)
                .is_some_and(|p| p.gpus.iter().map(|g| g.memory_allocated).sum::<u64>() == bytes)
        })
    };
    assert!(shows(2 * GIB), "claim not published: {:?}", published(&api));
    let labels = &api.node("gpu-node-1").unwrap()["metadata"]["labels"];
    assert_eq!(
        labels["gpuslice.io/node"], "true",
        "the rest of the Node is kept"
    );
    let out = cli(&bus.address, &["release", "web"]);
    assert!(out.status.success());
    assert!(shows(0), "release not published: {:?}", published(&api));
}

/// An agent on `sim` publishing bare Node gpu-node-1, once it has published.
fn published_topology_of(sim: &SimNode) -> (ApiServer, Bus, Agent) {
    let api = ApiServer::start();
    api.put_node(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "gpu-node-1", "resourceVersion": "1"}
    }));
    let bus = Bus::start();
    let agent = publishing_agent(sim, &api, &bus);
    assert!(wait_for(Duration::from_secs(10), || published(&api).is_some()));
    (api, bus, agent)
}

#[test]
fn the_agent_publishes_how_its_gpus_are_connected_and_gives_two_gpus_an_nvlink_pair() {
    // Four A10s: pairs (0,1) and (2,3) bridged by NVLink, 0–3 on one NUMA node.
    let sim = SimNode::with_layout(4, "A10", "nvlink-pairs");
    let (api, bus, _agent) = published_topology_of(&sim);
    let topology = published(&api).unwrap().topology.expect("a topology");
    let row =
        |g: usize| -> Vec<String> { topology.links[g].iter().map(ToString::to_string).collect() };
    assert_eq!(row(0), ["X", "NV4", "NODE", "NODE"]);
    assert_eq!(row(3), ["NODE", "NODE", "NV4", "X"]);
    assert_eq!(topology.numa, vec![Some(0); 4]);

    // GPU 1 and GPU 2 are the fullest, so binpack alone would give a two-GPU slice those
    // two, across the pairs; it gets a bridged pair instead.
    for (name, device) in [("a", "1"), ("b", "2")] {
        let out = cli(
            &bus.address,
            &[
                "claim",
                name,
                "-a",
                "gpuslice.io/memory=12Gi",
                "-a",
                &format!("gpuslice.io/devices={device}"),
            ],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = cli(
        &bus.address,
        &[
            "claim",
            "pair",
            "--json",
            "-a",
            "gpuslice.io/memory=4Gi",
            "-a",
            "gpuslice.io/gpus=2",
            "-a",
            "gpuslice.io/gpu-policy=binpack",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let claim: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut indexes: Vec<u64> = claim["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|g| g["index"].as_u64())
        .collect();
    indexes.sort_unstable();
    assert!(
        indexes == [0, 1] || indexes == [2, 3],
        "a two-GPU slice across the NVLink pairs: {claim}"
    );
}

#[test]
fn gpus_joined_through_nvswitches_are_published_as_nvlinked_pairs() {
    // An HGX-like node: every GPU's 18 NVLinks reach NVSwitches, none another GPU directly.
    let sim = SimNode::with_layout(8, "H100", "nvswitch");
    let (api, _bus, _agent) = published_topology_of(&sim);
    let topology = published(&api).unwrap().topology.expect("a topology");
    for (a, row) in topology.links.iter().enumerate() {
        for (b, link) in row.iter().enumerate() {
            let want = if a == b { "X" } else { "NV18" };
            assert_eq!(link.to_string(), want, "GPU {a} to GPU {b}");
        }
    }
    assert_eq!(topology.numa[7], Some(1));
}
