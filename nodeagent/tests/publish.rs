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
    let _agent = Agent::start(
        &agent_exe(),
        &bus,
        &sim,
        &[
            "--publish-node",
            "--kube-api",
            &api.url,
            "--node-name",
            "gpu-node-1",
            "--publish-interval",
            "100ms",
        ],
    );
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
