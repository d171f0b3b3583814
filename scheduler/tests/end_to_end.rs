//! Cluster placement end to end, every part a real process except the API server (the
//! stand-in, `gpuslice_testsupport::apiserver`; there is none on these machines): the node
//! agent publishes its GPUs and extended resources on its Node, the extender learns them from
//! its Node watch, filters, scores and binds pods that ask by extended resources, the agent
//! grants each container the slice its signed assignment names and publishes the new state,
//! and the extender then turns away the pod that no longer fits although the node's
//! extended-resource sums would still let it in.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gpuslice_core::assignment::Assignment;
use gpuslice_core::cluster::{NODE_STATE_ANNOTATION, NodePublication};
use gpuslice_testsupport::apiserver::ApiServer;
use gpuslice_testsupport::http::{free_port, get, post_json};
use gpuslice_testsupport::{agent::Agent, bus::Bus, sim::SimNode, wait_for};
use serde_json::{Value, json};

const GIB: u64 = 1 << 30;
const NODE: &str = "gpu-node-1";

struct Extender(Child, String);

impl Drop for Extender {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Extender {
    fn call(&self, verb: &str, body: &Value) -> Value {
        let (status, _, body) = post_json(&self.1, verb, &body.to_string()).unwrap();
        assert!(status.contains("200"), "{verb}: {status} {body}");
        serde_json::from_str(&body).unwrap()
    }

    fn metric(&self, name: &str) -> Option<f64> {
        let (_, _, body) = get(&self.1, "/metrics").ok()?;
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    }
}

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
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, "a key shared by the scheduler and every agent").unwrap();
    let bus = Bus::start();
    let _agent = Agent::start(
        &gpuslice_testsupport::binary("gpuslice-agent"),
        &bus,
        &sim,
        &[
            "--publish-node",
            "--kube-api",
            &api.url,
            "--node-name",
            NODE,
            "--publish-interval",
            "100ms",
            "--assignment-key",
            key.to_str().unwrap(),
        ],
    );
    let addr = format!("127.0.0.1:{}", free_port());
    let child = Command::new(env!("CARGO_BIN_EXE_gpuslice-scheduler"))
        .args(["serve", "--listen", &addr, "--api-server", &api.url])
        .arg("--assignment-key")
        .arg(&key)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ext = Extender(child, addr);
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
        let mut claim = Command::new(gpuslice_testsupport::binary("gpuslice"));
        claim
            .args(["--bus-address", &bus.address, "claim"])
            .arg(format!("ctr-{name}"))
            .arg("--json");
        for (k, v) in annotations.as_object().unwrap() {
            claim.args(["-a", &format!("{k}={}", v.as_str().unwrap())]);
        }
        let out = claim
            .args(["-a", "io.kubernetes.cri.container-name=app"])
            .args(["-a", &format!("io.kubernetes.cri.sandbox-uid=uid-{name}")])
            .output()
            .unwrap();
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
