//! Cluster placement end to end, every part a real process except the API server (the
//! stand-in, `gpuslice_testsupport::apiserver`; there is none on these machines): the node
//! agent publishes its GPUs and extended resources on its Node, the extender learns them from
//! its Node watch, filters, scores and binds pods that ask by extended resources, the agent
//! grants each container the slice its signed assignment names and publishes the new state,
//! and the extender then turns away the pod that no longer fits although the node's
//! extended-resource sums would still let it in.

mod common;

use std::time::Duration;

use common::{Extender, GIB, claim_as_container, key_file, node_agent};
use gpuslice_core::assignment::Assignment;
use gpuslice_core::publication::{NODE_STATE_ANNOTATION, NodePublication};
use gpuslice_testsupport::apiserver::ApiServer;
use gpuslice_testsupport::{bus::Bus, sim::SimNode, wait_for};
use serde_json::{Value, json};

const NODE: &str = "gpu-node-1";

fn pod(name: &str, memory: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                     "resourceVersion": "1", "annotations": {}},
        "spec": {"runtimeClassName": "gpuslice", "containers": [{
            "name": "app", "image": "registry.example/app:1",
            "resources": {"limits": {"gpuslice.io/gpu-memory": memory}}}]},
        "status": {"phase": "Pending"}
    })
}

fn published(api: &ApiServer) -> Option<NodePublication> {
    let node = api.node(NODE)?;
    serde_json::from_str(node["metadata"]["annotations"][NODE_STATE_ANNOTATION].as_str()?).ok()
}

#[test]
fn pods_asking_by_extended_resources_are_placed_granted_and_then_turned_away_when_full() {
    let sim = SimNode::new(2, "T4", Some(15 * GIB));
    let api = ApiServer::start();
    api.put_node(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE, "labels": {"gpuslice.io/node": "true"}},
        "status": {"capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"}}
    }));
    let (_dir, key) = key_file(b"a key shared by the scheduler and every agent");
    let bus = Bus::start();
    let _agent = node_agent(
        &bus,
        &sim,
        &key,
        &[
            "--publish-node",
            "--kube-api",
            &api.url,
            "--publish-interval",
            "100ms",
        ],
    );
    let ext = Extender::with_api(&api.url, Some(&key));
    assert!(wait_for(Duration::from_secs(10), || {
        ext.metric("gpuslice_scheduler_nodes") == Some(1.0)
    }));
    let capacity = api.node(NODE).unwrap()["status"]["capacity"].clone();
    assert_eq!(capacity["gpuslice.io/gpu-memory"], (30 * GIB).to_string());
    assert_eq!(capacity["gpuslice.io/gpu-cores"], "200");

    // kube-scheduler's cycle for a pod: filter, prioritize, bind; then kubelet starts it and
    // the runtime claims its slice with the pod's annotations, as containerd copies them.
    let schedule = |name: &str| -> (Value, Value) {
        let p = api.pod("default", name).unwrap();
        let args = json!({"Pod": p, "NodeNames": [NODE], "Nodes": null});
        let filtered = ext.call("/filter", &args);
        if filtered["NodeNames"] != json!([NODE]) {
            return (filtered, Value::Null);
        }
        let scores = ext.call("/prioritize", &args);
        assert_eq!(scores, json!([{"Host": NODE, "Score": 10}]));
        let bound = ext.call(
            "/bind",
            &json!({"PodName": name, "PodNamespace": "default",
                    "PodUID": format!("uid-{name}"), "Node": NODE}),
        );
        assert_eq!(bound["Error"], "", "{bound}");
        let annotations = api.pod("default", name).unwrap()["metadata"]["annotations"].clone();
        let out = claim_as_container(&bus, &annotations, "app", &format!("uid-{name}"));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (annotations, serde_json::from_slice(&out.stdout).unwrap())
    };

    api.put_pod(pod("first", "10Gi"));
    let (annotations, granted) = schedule("first");
    let a = Assignment::verify(
        annotations["gpuslice.io/assignment"].as_str().unwrap(),
        std::fs::read(&key).unwrap().as_slice(),
    )
    .unwrap();
    assert_eq!(
        granted["gpus"][0]["uuid"],
        a.containers["app"][0].uuid.as_str()
    );
    assert_eq!(granted["gpus"][0]["memory_bytes"], 10 * GIB);
    let first_gpu = a.containers["app"][0].uuid.clone();
    assert!(
        wait_for(Duration::from_secs(10), || published(&api).is_some_and(
            |p| p.gpus.iter().map(|g| g.memory_allocated).sum::<u64>() == 10 * GIB
        )),
        "the agent publishes the grant: {:?}",
        published(&api)
    );
    assert_eq!(
        published(&api).unwrap().claimed,
        ["uid-first/app"],
        "and lists the container, so that the extender stops counting its own placement"
    );

    api.put_pod(pod("second", "10Gi"));
    let (_, granted) = schedule("second");
    assert_eq!(granted["gpus"][0]["memory_bytes"], 10 * GIB);
    assert_ne!(
        granted["gpus"][0]["uuid"],
        first_gpu.as_str(),
        "5 GiB left on the first GPU"
    );

    // 10 of the node's 30 GiB are not declared yet, so kubelet and kube-scheduler's node sums
    // would admit a third 10 GiB pod; but each GPU has 5 GiB left.
    api.put_pod(pod("third", "10Gi"));
    let (filtered, _) = schedule("third");
    assert_eq!(filtered["NodeNames"], json!([]), "{filtered}");
    assert!(
        filtered["FailedNodes"][NODE]
            .as_str()
            .unwrap()
            .contains("not enough free GPU memory"),
        "{filtered}"
    );
    assert!(api.pod("default", "third").unwrap()["spec"]["nodeName"].is_null());
}
