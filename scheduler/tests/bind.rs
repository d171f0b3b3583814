//! Bind: the extender writes a signed assignment onto the pod and creates its Binding, against
//! a stand-in API server (`gpuslice_testsupport::apiserver`); the node agent then honours the
//! assignment for the pod's container. Placements not yet published by the agent count.

mod common;

use std::process::Command;

use common::{
    Extender, GIB, claim_as_container, key_file, node_agent, publish, publish_one_gpu, t4,
};
use gpuslice_core::assignment::Assignment;
use gpuslice_testsupport::apiserver::ApiServer;
use gpuslice_testsupport::{bus::Bus, sim::SimNode};
use serde_json::{Value, json};

const KEY: &[u8] = b"shared between the scheduler and the agents";

fn extender(api: &ApiServer, key: &std::path::Path) -> Extender {
    Extender::with_api(&api.url, Some(key))
}

fn pod(name: &str, uid: &str, memory: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": uid, "resourceVersion": "1",
                     "annotations": {"gpuslice.io/memory": memory}},
        "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}],
                 "runtimeClassName": "gpuslice"},
        "status": {"phase": "Pending"}
    })
}

fn bind(e: &Extender, name: &str, uid: &str) -> String {
    let body =
        json!({"PodName": name, "PodNamespace": "default", "PodUID": uid, "Node": "gpu-node-1"});
    e.call("/bind", &body)["Error"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn bind_signs_an_assignment_the_agent_honours_and_counts_it_until_published() {
    let sim = SimNode::new(2, "T4", Some(15 * GIB));
    let api = ApiServer::start();
    // As the agent publishes it: GPU 0 has 12 of 15 GiB taken, GPU 1 is free.
    let gpus = &sim.spec.gpus;
    publish(
        &api,
        vec![t4(&gpus[0].uuid, 12 * GIB), t4(&gpus[1].uuid, 0)],
        &[],
    );
    api.put_pod(pod("web", "uid-web", "4Gi"));
    api.put_pod(pod("big", "uid-big", "12Gi"));
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, KEY).unwrap();
    let ext = extender(&api, &key);

    assert_eq!(bind(&ext, "web", "uid-web"), "");
    let web = api.pod("default", "web").unwrap();
    assert_eq!(web["spec"]["nodeName"], "gpu-node-1");
    let signed = web["metadata"]["annotations"]["gpuslice.io/assignment"]
        .as_str()
        .unwrap()
        .to_string();
    let a = Assignment::verify(&signed, KEY).expect("signed with the shared key");
    assert_eq!(a.node, "gpu-node-1");
    assert_eq!(a.pod_uid, "uid-web");
    let gpus = &a.containers["app"];
    assert_eq!(gpus.len(), 1);
    assert_eq!(
        gpus[0].uuid, sim.spec.gpus[1].uuid,
        "GPU 0 has only 3 GiB left"
    );
    assert_eq!(gpus[0].memory_bytes, 4 * GIB);
    {
        let o = api.objects.lock().unwrap();
        assert_eq!(o.bindings.len(), 1);
        assert_eq!(o.bindings[0]["target"]["name"], "gpu-node-1");
    }

    // The node agent honours it for the pod's container.
    let bus = Bus::start();
    let _agent = node_agent(&bus, &sim, &key, &[]);
    let out = Command::new(gpuslice_testsupport::binary("gpuslice"))
        .args(["--bus-address", &bus.address, "claim", "ctr-web", "--json"])
        .args(["-a", "gpuslice.io/memory=4Gi"])
        .args(["-a", &format!("gpuslice.io/assignment={signed}")])
        .args(["-a", "io.kubernetes.cri.container-name=app"])
        .args(["-a", "io.kubernetes.cri.sandbox-uid=uid-web"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let claim: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(claim["gpus"][0]["uuid"], sim.spec.gpus[1].uuid.as_str());

    // 12 GiB fitted GPU 1 before web; the agent has not published web yet, the extender
    // still counts it.
    let err = bind(&ext, "big", "uid-big");
    assert!(err.contains("no longer fits"), "{err}");
    assert!(api.pod("default", "big").unwrap()["spec"]["nodeName"].is_null());

    let err = bind(&ext, "ghost", "uid-ghost");
    assert!(err.contains("pods \"ghost\" not found"), "{err}");
}

#[test]
fn concurrent_binds_for_the_last_room_place_one_pod() {
    let api = ApiServer::start();
    publish_one_gpu(&api, 6 * GIB, &[]);
    let pods = ["p0", "p1", "p2", "p3"];
    for p in pods {
        api.put_pod(pod(p, &format!("uid-{p}"), "8Gi"));
    }
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, KEY).unwrap();
    let ext = extender(&api, &key);
    let errors: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .map(|p| {
                let ext = &ext;
                s.spawn(move || bind(ext, p, &format!("uid-{p}")))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let bound = errors.iter().filter(|e| e.is_empty()).count();
    assert_eq!(bound, 1, "9 GiB free, 8 GiB each: {errors:?}");
    assert!(
        errors
            .iter()
            .filter(|e| !e.is_empty())
            .all(|e| e.contains("no longer fits")),
        "{errors:?}"
    );
    assert_eq!(api.objects.lock().unwrap().bindings.len(), 1);
}

#[test]
fn a_pod_asking_by_extended_resources_gets_annotations_the_agent_reads() {
    let sim = SimNode::new(1, "T4", Some(15 * GIB));
    let api = ApiServer::start();
    publish(&api, vec![t4(&sim.spec.gpus[0].uuid, 0)], &[]);
    let mut p = pod("infer", "uid-infer", "unused");
    p["metadata"]["annotations"] = json!({});
    p["spec"]["containers"] = json!([
        {"name": "model", "image": "registry.example/model:3",
         "resources": {"limits": {"gpuslice.io/gpu-memory": "4Gi", "gpuslice.io/gpu-cores": "30"}}},
        {"name": "proxy", "image": "registry.example/proxy:1"}
    ]);
    api.put_pod(p);
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, KEY).unwrap();
    let ext = extender(&api, &key);
    assert_eq!(bind(&ext, "infer", "uid-infer"), "");

    let written = api.pod("default", "infer").unwrap()["metadata"]["annotations"].clone();
    assert_eq!(written["gpuslice.io/model.gpus"], "1");
    assert_eq!(written["gpuslice.io/model.memory"], (4 * GIB).to_string());
    assert_eq!(written["gpuslice.io/model.cores"], "30");
    let a = Assignment::verify(written["gpuslice.io/assignment"].as_str().unwrap(), KEY).unwrap();
    assert_eq!(
        a.containers.keys().collect::<Vec<_>>(),
        ["model"],
        "the proxy asks for nothing"
    );
    assert_eq!(a.containers["model"][0].memory_bytes, 4 * GIB);
    assert_eq!(a.containers["model"][0].cores, 30);

    // The node sees annotations, not resources: with the pod's annotations as containerd
    // copies them, the agent grants the model its slice and the proxy nothing.
    let bus = Bus::start();
    let _agent = node_agent(&bus, &sim, &key, &[]);
    let claim = |container: &str| claim_as_container(&bus, &written, container, "uid-infer");
    let out = claim("model");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let granted: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(granted["gpus"][0]["memory_bytes"], 4 * GIB, "{granted}");
    assert_eq!(granted["gpus"][0]["cores"], 30, "{granted}");
    // (The runtime would not even ask: the proxy's annotations ask for nothing.)
    let out = claim("proxy");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("nothing to claim"),
        "the proxy gets no GPU: {stderr}"
    );
}

#[test]
fn a_placement_counts_until_the_agent_lists_it_and_then_counts_once() {
    let api = ApiServer::start();
    publish_one_gpu(&api, 0, &[]);
    for (name, memory) in [("a", "8Gi"), ("b", "8Gi"), ("c", "7Gi")] {
        api.put_pod(pod(name, &format!("uid-{name}"), memory));
    }
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, KEY).unwrap();
    let ext = extender(&api, &key);

    assert_eq!(bind(&ext, "a", "uid-a"), "");
    // The agent publishes again before a's container has started (another claim, a restart):
    // a still counts.
    publish_one_gpu(&api, 0, &[]);
    let err = bind(&ext, "b", "uid-b");
    assert!(err.contains("no longer fits"), "{err}");
    // Now the agent shows a's slice and lists it: counted once, 7 GiB are left.
    publish_one_gpu(&api, 8 * GIB, &["uid-a/app"]);
    assert_eq!(bind(&ext, "c", "uid-c"), "", "7 GiB are left, not 0");
}

#[test]
fn a_pod_whose_binding_fails_gives_its_room_back_and_a_bound_pod_is_not_bound_again() {
    let api = ApiServer::start();
    publish_one_gpu(&api, 0, &[]);
    api.put_pod(pod("a", "uid-a", "8Gi"));
    api.put_pod(pod("b", "uid-b", "8Gi"));
    let (_dir, key) = key_file(KEY);
    let ext = extender(&api, &key);

    api.objects.lock().unwrap().refuse_bindings = true;
    let err = bind(&ext, "a", "uid-a");
    assert!(err.contains("409") || err.contains("Conflict"), "{err}");
    api.objects.lock().unwrap().refuse_bindings = false;
    assert_eq!(bind(&ext, "b", "uid-b"), "", "a's 8 GiB are free again");

    let err = bind(&ext, "b", "uid-b");
    assert!(
        err.contains("already bound to node \"gpu-node-1\""),
        "{err}"
    );
    assert_eq!(api.objects.lock().unwrap().bindings.len(), 1);
}

#[test]
fn a_pod_deleted_before_its_container_started_gives_its_room_back() {
    let api = ApiServer::start();
    publish_one_gpu(&api, 0, &[]);
    api.put_pod(pod("a", "uid-a", "8Gi"));
    api.put_pod(pod("b", "uid-b", "8Gi"));
    let (_dir, key) = key_file(KEY);
    let ext = extender(&api, &key);

    assert_eq!(bind(&ext, "a", "uid-a"), "");
    let err = bind(&ext, "b", "uid-b");
    assert!(err.contains("no longer fits"), "{err}");
    // a is deleted before kubelet started it: its agent never shows it.
    api.delete_pod("default", "a");
    let bound = gpuslice_testsupport::wait_for(std::time::Duration::from_secs(10), || {
        bind(&ext, "b", "uid-b").is_empty()
    });
    assert!(bound, "a's 8 GiB were not given back");
}

#[tokio::test]
async fn an_init_container_gets_its_own_slice_and_the_app_gets_the_room_it_leaves() {
    // One 15 GiB GPU: a 10 GiB init container, then a 10 GiB app container. They never run
    // together, so the pod fits; the agent admits each in its turn.
    let sim = SimNode::new(1, "T4", Some(15 * GIB));
    let api = ApiServer::start();
    publish(&api, vec![t4(&sim.spec.gpus[0].uuid, 0)], &[]);
    let annotations = json!({"gpuslice.io/fetch.memory": "10Gi", "gpuslice.io/app.memory": "10Gi"});
    api.put_pod(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "model", "namespace": "default", "uid": "uid-model",
                     "resourceVersion": "1", "annotations": annotations},
        "spec": {"initContainers": [{"name": "fetch", "image": "registry.example/fetch:1"}],
                 "containers": [{"name": "app", "image": "registry.example/app:1"}]},
        "status": {"phase": "Pending"}
    }));
    let (_dir, key) = key_file(KEY);
    let ext = extender(&api, &key);
    assert_eq!(bind(&ext, "model", "uid-model"), "");
    let pod = api.pod("default", "model").unwrap();
    let signed = pod["metadata"]["annotations"]["gpuslice.io/assignment"]
        .as_str()
        .unwrap()
        .to_string();
    let a = Assignment::verify(&signed, KEY).unwrap();
    assert_eq!(a.containers.keys().collect::<Vec<_>>(), ["app", "fetch"]);
    assert_eq!(a.containers["fetch"][0].memory_bytes, 10 * GIB);

    let bus = Bus::start();
    let _agent = node_agent(&bus, &sim, &key, &[]);
    let signed_pod = pod["metadata"]["annotations"].clone();
    let fetch = claim_as_container(&bus, &signed_pod, "fetch", "uid-model");
    assert!(
        fetch.status.success(),
        "{}",
        String::from_utf8_lossy(&fetch.stderr)
    );
    // While the init container holds its slice, the app's does not fit: they run in turn.
    let early = claim_as_container(&bus, &signed_pod, "app", "uid-model");
    assert!(!early.status.success());
    let out = Command::new(gpuslice_testsupport::binary("gpuslice"))
        .args([
            "--bus-address",
            &bus.address,
            "release",
            "ctr-uid-model-fetch",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let app = claim_as_container(&bus, &signed_pod, "app", "uid-model");
    assert!(
        app.status.success(),
        "{}",
        String::from_utf8_lossy(&app.stderr)
    );
    // Placed, the pod counts only what stays (the app): a 5 GiB pod still fits beside it.
    api.put_pod(crate::pod("next", "uid-next", "5Gi"));
    assert_eq!(bind(&ext, "next", "uid-next"), "");
}

#[test]
fn bind_chooses_gpus_within_the_node_by_the_container_gpu_policy() {
    let api = ApiServer::start();
    // GPU 0 has 10 of 15 GiB taken, GPU 1 is free.
    let publication = publish(
        &api,
        vec![
            t4("GPU-00000000-0000-4000-8000-000000000000", 10 * GIB),
            t4("GPU-00000000-0000-4000-8000-000000000001", 0),
        ],
        &[],
    );
    let mut packed = pod("packed", "uid-packed", "2Gi");
    packed["metadata"]["annotations"]["gpuslice.io/node-policy"] = json!("spread");
    let mut spread = pod("spread", "uid-spread", "2Gi");
    spread["metadata"]["annotations"]["gpuslice.io/node-policy"] = json!("spread");
    spread["metadata"]["annotations"]["gpuslice.io/gpu-policy"] = json!("spread");
    api.put_pod(packed);
    api.put_pod(spread);
    let (_dir, key) = key_file(KEY);
    let ext = extender(&api, &key);
    let gpu_of = |name: &str, uid: &str| {
        assert_eq!(bind(&ext, name, uid), "");
        let signed =
            api.pod("default", name).unwrap()["metadata"]["annotations"]["gpuslice.io/assignment"]
                .as_str()
                .unwrap()
                .to_string();
        Assignment::verify(&signed, KEY).unwrap().containers["app"][0]
            .uuid
            .clone()
    };
    // Node spread, GPUs binpacked: the fuller GPU; with gpu-policy spread: the emptier.
    assert_eq!(gpu_of("packed", "uid-packed"), publication.gpus[0].uuid);
    assert_eq!(gpu_of("spread", "uid-spread"), publication.gpus[1].uuid);
}

#[test]
fn two_replicas_binding_at_once_never_oversubscribe_a_gpu_and_lose_no_pod() {
    // One 15 GiB GPU, nothing on it; twelve 4 GiB pods bound at once, half through each of
    // two extender replicas that share nothing but the API server: three fit.
    let api = ApiServer::start();
    publish_one_gpu(&api, 0, &[]);
    let pods: Vec<String> = (0..12).map(|i| format!("p{i}")).collect();
    for p in &pods {
        api.put_pod(pod(p, &format!("uid-{p}"), "4Gi"));
    }
    let (_dir, key) = key_file(KEY);
    let replicas = [extender(&api, &key), extender(&api, &key)];
    let errors: Vec<(String, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let ext = &replicas[i % 2];
                s.spawn(move || (p.clone(), bind(ext, p, &format!("uid-{p}"))))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let bound: Vec<&String> = errors
        .iter()
        .filter(|(_, e)| e.is_empty())
        .map(|(p, _)| p)
        .collect();
    assert_eq!(bound.len(), 3, "15 GiB free, 4 GiB each: {errors:?}");
    for (p, e) in &errors {
        assert!(
            e.is_empty() || e.contains("no longer fits"),
            "{p}: refused for another reason: {e}"
        );
    }
    // Every bound pod has its Binding and its assignment; nothing else was bound.
    let o = api.objects.lock().unwrap();
    assert_eq!(o.bindings.len(), 3);
    drop(o);
    let mut assigned = 0;
    for p in &bound {
        let pod = api.pod("default", p).unwrap();
        assert_eq!(pod["spec"]["nodeName"], "gpu-node-1");
        let signed = pod["metadata"]["annotations"]["gpuslice.io/assignment"]
            .as_str()
            .unwrap();
        let a = Assignment::verify(signed, KEY).unwrap();
        assigned += a.containers["app"][0].memory_bytes;
    }
    assert!(
        assigned <= 15 * GIB,
        "{assigned} bytes assigned on a 15 GiB GPU"
    );
    // The Node records exactly the bound pods' placements, for every replica to count.
    let node = api.node("gpu-node-1").unwrap();
    let record: Vec<Value> = serde_json::from_str(
        node["metadata"]["annotations"]["gpuslice.io/placements"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let mut recorded: Vec<String> = record
        .iter()
        .map(|r| r["container"].as_str().unwrap().to_string())
        .collect();
    recorded.sort();
    let mut want: Vec<String> = bound.iter().map(|p| format!("uid-{p}/app")).collect();
    want.sort();
    assert_eq!(recorded, want);
    drop(replicas);
}
