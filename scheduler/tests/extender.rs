//! The extender over HTTP, called with JSON exactly as kube-scheduler sends it (the Go field
//! names of k8s.io/kube-scheduler/extender/v1, full Pod and Node objects), in both node-cache
//! modes.

mod common;

use common::{Extender, GIB};
use gpuslice_core::publication::{NODE_STATE_ANNOTATION, NodePublication, PublishedGpu};
use serde_json::{Value, json};

fn serve(policy: &str) -> Extender {
    Extender::start(&["--default-node-policy", policy])
}

/// (memory total GiB, memory allocated GiB, sharers) per GPU.
fn publication(gpus: &[(u64, u64, u32)]) -> String {
    let models = vec!["NVIDIA A10"; gpus.len()];
    publication_of(gpus, &models)
}

/// As [`publication`], GPU i being of model `models[i]`.
fn publication_of(gpus: &[(u64, u64, u32)], models: &[&str]) -> String {
    let p = NodePublication {
        topology: None,
        max_sharers: 16,
        version: 1,
        claimed: Vec::new(),
        gpus: gpus
            .iter()
            .enumerate()
            .map(|(i, &(total, used, sharers))| PublishedGpu {
                index: None,
                uuid: format!("GPU-00000000-0000-4000-8000-00000000000{i}"),
                model: models[i].into(),
                memory_total: total * GIB,
                memory_allocated: used * GIB,
                cores_allocated: 0,
                sharers,
                exclusive: false,
            })
            .collect(),
    };
    serde_json::to_string(&p).unwrap()
}

/// A v1.Node as kube-scheduler serialises it, with the agent's publication when given.
fn node(name: &str, published: Option<String>) -> Value {
    let mut annotations = json!({"node.alpha.kubernetes.io/ttl": "0"});
    if let Some(p) = published {
        annotations[NODE_STATE_ANNOTATION] = Value::String(p);
    }
    json!({
        "metadata": {
            "name": name,
            "uid": format!("uid-{name}"),
            "resourceVersion": "4242",
            "creationTimestamp": "2026-11-01T00:00:00Z",
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
            "annotations": annotations
        },
        "spec": {"podCIDR": "10.244.1.0/24"},
        "status": {
            "capacity": {"cpu": "32", "memory": "131072Mi", "pods": "110"},
            "allocatable": {"cpu": "31", "memory": "130000Mi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
            "nodeInfo": {"kubeletVersion": "v1.30.0"}
        }
    })
}

/// A v1.Pod as kube-scheduler serialises it.
fn pod(annotations: Value) -> Value {
    json!({
        "metadata": {
            "name": "web-7d9f",
            "namespace": "default",
            "uid": "0b4e2a54-8c1f-4a5e-9a67-3f1c2d7e9b10",
            "creationTimestamp": "2026-11-22T04:00:00Z",
            "annotations": annotations
        },
        "spec": {
            "containers": [{
                "name": "app",
                "image": "registry.example/web:1.2",
                "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}
            }],
            "restartPolicy": "Always",
            "schedulerName": "default-scheduler",
            "runtimeClassName": "gpuslice"
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"}
    })
}

fn nodes() -> Vec<Value> {
    vec![
        node("free", Some(publication(&[(24, 0, 0), (24, 0, 0)]))),
        node("busy", Some(publication(&[(16, 12, 3)]))),
        node("small", Some(publication(&[(8, 0, 0)]))),
        node("plain", None),
    ]
}

/// The names of the Nodes a filter answer with Node objects passes.
fn passed_names(r: &Value) -> Vec<String> {
    r["Nodes"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

fn call(server: &Extender, verb: &str, body: &Value) -> (String, Value) {
    server.post(verb, &body.to_string())
}

#[test]
fn filter_with_node_objects_returns_fitting_nodes_as_sent_and_tells_full_from_never() {
    let server = serve("frag-aware");
    let nodes = nodes();
    let args = json!({
        "Pod": pod(json!({"gpuslice.io/memory": "10Gi"})),
        "Nodes": {"metadata": {"resourceVersion": "4300"}, "items": nodes},
        "NodeNames": null
    });
    let (status, r) = call(&server, "/filter", &args);
    assert!(status.contains("200"), "{status}");
    let keys: Vec<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
    for k in [
        "Nodes",
        "NodeNames",
        "FailedNodes",
        "FailedAndUnresolvableNodes",
        "Error",
    ] {
        assert!(keys.contains(&k), "{k} missing from {r}");
    }
    assert_eq!(
        r["Nodes"]["items"],
        json!([nodes[0]]),
        "the fitting node comes back whole"
    );
    assert_eq!(r["Nodes"]["metadata"], json!({"resourceVersion": "4300"}));
    assert_eq!(r["NodeNames"], Value::Null);
    assert_eq!(r["Error"], "");
    let failed = r["FailedNodes"].as_object().unwrap();
    assert_eq!(failed.keys().collect::<Vec<_>>(), ["busy"]);
    assert!(
        failed["busy"]
            .as_str()
            .unwrap()
            .contains("not enough free GPU memory or SMs"),
        "{r}"
    );
    let never = r["FailedAndUnresolvableNodes"].as_object().unwrap();
    assert_eq!(never.keys().collect::<Vec<_>>(), ["plain", "small"]);
    assert!(
        never["small"].as_str().unwrap().contains("even empty"),
        "{r}"
    );
    assert!(
        never["plain"]
            .as_str()
            .unwrap()
            .contains("publishes no GPUs"),
        "{r}"
    );
}

#[test]
fn prioritize_scores_from_zero_to_ten_by_the_pod_node_policy() {
    let server = serve("frag-aware");
    let nodes = vec![
        node("empty", Some(publication(&[(24, 0, 0), (24, 0, 0)]))),
        node("half", Some(publication(&[(24, 12, 2), (24, 0, 0)]))),
        node("full", Some(publication(&[(24, 22, 4)]))),
    ];
    let score = |policy: &str| {
        let args = json!({
            "Pod": pod(json!({"gpuslice.io/memory": "4Gi", "gpuslice.io/node-policy": policy})),
            "Nodes": {"items": nodes},
        });
        let (status, r) = call(&server, "/prioritize", &args);
        assert!(status.contains("200"), "{status}");
        r.as_array()
            .unwrap()
            .iter()
            .map(|h| {
                (
                    h["Host"].as_str().unwrap().to_string(),
                    h["Score"].as_i64().unwrap(),
                )
            })
            .collect::<Vec<_>>()
    };
    let binpack = score("binpack");
    assert_eq!(
        binpack,
        [("empty".into(), 0), ("half".into(), 10), ("full".into(), 0)]
    );
    let spread = score("spread");
    assert_eq!(
        spread,
        [("empty".into(), 10), ("half".into(), 0), ("full".into(), 0)]
    );
    for (_, s) in binpack.iter().chain(&spread) {
        assert!((0..=10).contains(s));
    }
}

#[test]
fn with_node_names_the_extender_answers_from_what_it_knows_of_each_node() {
    let server = serve("binpack");
    let args = json!({
        "Pod": pod(json!({"gpuslice.io/memory": "2Gi"})),
        "Nodes": null,
        "NodeNames": ["gpu-1", "gpu-2"]
    });
    let (_, r) = call(&server, "/filter", &args);
    assert_eq!(r["Nodes"], Value::Null);
    assert_eq!(r["NodeNames"], json!([]));
    // Unresolvable, as the same node is when its Node object is sent without a publication.
    assert_eq!(r["FailedNodes"], json!({}), "{r}");
    let failed = r["FailedAndUnresolvableNodes"].as_object().unwrap();
    assert!(
        failed["gpu-1"]
            .as_str()
            .unwrap()
            .contains("publishes no GPUs"),
        "{r}"
    );
    let (_, r) = call(&server, "/prioritize", &args);
    assert_eq!(
        r,
        json!([{"Host": "gpu-1", "Score": 0}, {"Host": "gpu-2", "Score": 0}])
    );
}

#[test]
fn a_pod_without_gpuslice_annotations_passes_through_untouched() {
    let server = serve("frag-aware");
    let nodes = nodes();
    let args = json!({"Pod": pod(json!({"team": "web"})), "Nodes": {"items": nodes}});
    let (_, r) = call(&server, "/filter", &args);
    assert_eq!(r["Nodes"]["items"], json!(nodes));
    assert_eq!(r["FailedNodes"], json!({}));
    assert_eq!(r["FailedAndUnresolvableNodes"], json!({}));
    let args = json!({"Pod": pod(json!({})), "NodeNames": ["a", "b"]});
    let (_, r) = call(&server, "/filter", &args);
    assert_eq!(r["NodeNames"], json!(["a", "b"]));
}

#[test]
fn a_malformed_request_fails_every_node_for_good_and_a_broken_body_says_why() {
    let server = serve("frag-aware");
    let args = json!({
        "Pod": pod(json!({"gpuslice.io/memory": "-3Gi"})),
        "Nodes": {"items": nodes()}
    });
    let (_, r) = call(&server, "/filter", &args);
    assert_eq!(r["Nodes"]["items"], json!([]));
    let never = r["FailedAndUnresolvableNodes"].as_object().unwrap();
    assert_eq!(never.len(), 4);
    let why = never["free"].as_str().unwrap();
    assert!(
        why.contains("gpuslice.io/memory") && why.contains("-3Gi"),
        "{why}"
    );

    // A per-container key for a container the pod does not have would leave the container
    // meant without a GPU: the pod fits no node, and each says why.
    let args = json!({
        "Pod": pod(json!({"gpuslice.io/ap.memory": "2Gi"})),
        "Nodes": {"items": nodes()}
    });
    let (_, r) = call(&server, "/filter", &args);
    let why = r["FailedAndUnresolvableNodes"]["free"].as_str().unwrap();
    assert_eq!(
        why,
        "gpuslice: annotation gpuslice.io/ap.memory=\"2Gi\": the pod has no container \"ap\" (it has: app)"
    );

    let (status, r) = call(&server, "/filter", &json!({"Nodes": []}));
    assert!(status.contains("200"));
    assert!(
        r["Error"].as_str().unwrap().contains("not ExtenderArgs"),
        "{r}"
    );
    let (status, _) = call(&server, "/prioritize", &json!("nonsense"));
    assert!(status.contains("400"), "{status}");
}

#[test]
fn a_pod_asking_by_extended_resources_is_filtered_as_its_annotated_twin() {
    let server = serve("frag-aware");
    let mut by_resources = pod(json!({}));
    by_resources["spec"]["containers"][0]["resources"]["limits"] =
        json!({"gpuslice.io/gpu-memory": "10Gi", "cpu": "1"});
    let outcome = |p: &Value| {
        let args = json!({"Pod": p, "Nodes": {"items": nodes()}, "NodeNames": null});
        let (_, r) = call(&server, "/filter", &args);
        (
            r["Nodes"]["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n["metadata"]["name"].clone())
                .collect::<Vec<_>>(),
            r["FailedNodes"].clone(),
            r["FailedAndUnresolvableNodes"].clone(),
        )
    };
    let twin = outcome(&pod(json!({"gpuslice.io/memory": "10Gi"})));
    assert_eq!(outcome(&by_resources), twin);
    assert_eq!(twin.0, [json!("free")]);
}

#[test]
fn resources_that_contradict_the_annotations_fit_no_node_and_say_why() {
    let server = serve("frag-aware");
    let mut contradicting = pod(json!({"gpuslice.io/memory": "10Gi"}));
    contradicting["spec"]["containers"][0]["resources"]["limits"] =
        json!({"gpuslice.io/gpu-memory": "12Gi"});
    let args = json!({"Pod": contradicting, "Nodes": {"items": nodes()}, "NodeNames": null});
    let (_, r) = call(&server, "/filter", &args);
    assert_eq!(r["Nodes"]["items"], json!([]), "{r}");
    let never = r["FailedAndUnresolvableNodes"].as_object().unwrap();
    assert_eq!(never.len(), 4, "{r}");
    assert_eq!(
        never["free"],
        format!(
            "gpuslice: container app: resource gpuslice.io/gpu-memory={} disagrees with annotation gpuslice.io/memory=\"10Gi\" × 1 GPU(s) = {}",
            12u64 << 30,
            10u64 << 30
        )
    );
}

#[test]
fn gpu_models_and_avoided_devices_decide_which_nodes_pass_and_how_they_score() {
    let server = serve("binpack");
    let a100 = "NVIDIA A100-SXM4-80GB";
    let t4 = "Tesla T4";
    let nodes = vec![
        node(
            "a100s",
            Some(publication_of(&[(80, 0, 0), (80, 0, 0)], &[a100, a100])),
        ),
        node("t4", Some(publication_of(&[(15, 0, 0)], &[t4]))),
        node(
            "mixed",
            Some(publication_of(&[(80, 70, 1), (15, 0, 0)], &[a100, t4])),
        ),
    ];
    let filter = |annotations: Value| {
        let args = json!({"Pod": pod(annotations), "Nodes": {"items": nodes}});
        let (status, r) = call(&server, "/filter", &args);
        assert!(status.contains("200"), "{status}");
        let names = |v: &Value| -> Vec<String> {
            v.as_object()
                .map_or_else(Vec::new, |o| o.keys().cloned().collect())
        };
        let passed = passed_names(&r);
        (
            passed,
            names(&r["FailedNodes"]),
            names(&r["FailedAndUnresolvableNodes"]),
            r,
        )
    };
    // By model: only nodes with a T4; an A100-only node never can.
    let (passed, full, never, r) =
        filter(json!({"gpuslice.io/memory": "4Gi", "gpuslice.io/gpu-model": "T4"}));
    assert_eq!(passed, ["t4", "mixed"], "{r}");
    assert!(full.is_empty(), "{r}");
    assert_eq!(never, ["a100s"], "{r}");
    // Avoiding a model: the mixed node's A100 is too full now (but could be emptied), the
    // T4-only node never can.
    let (passed, full, never, r) =
        filter(json!({"gpuslice.io/memory": "20Gi", "gpuslice.io/gpu-model": "!T4"}));
    assert_eq!(
        (passed, full, never),
        (
            vec!["a100s".to_string()],
            vec!["mixed".to_string()],
            vec!["t4".to_string()]
        ),
        "{r}"
    );
    // Avoiding GPU 0: one GPU is left on the two-GPU nodes, none on the T4 node; two GPUs
    // avoiding GPU 0 fit nowhere, ever.
    let (passed, _, never, r) =
        filter(json!({"gpuslice.io/memory": "1Gi", "gpuslice.io/devices": "!0"}));
    assert_eq!(passed, ["a100s", "mixed"], "{r}");
    assert_eq!(never, ["t4"], "{r}");
    let (passed, _, never, r) = filter(
        json!({"gpuslice.io/memory": "1Gi", "gpuslice.io/gpus": "2", "gpuslice.io/devices": "!0"}),
    );
    assert!(passed.is_empty(), "{r}");
    assert_eq!(never, ["a100s", "mixed", "t4"], "{r}");
    // A malformed model list fails every node for good, naming the annotation.
    let (passed, _, never, r) =
        filter(json!({"gpuslice.io/memory": "1Gi", "gpuslice.io/gpu-model": "T4,,A100"}));
    assert!(passed.is_empty());
    assert_eq!(never.len(), 3);
    assert!(
        r["FailedAndUnresolvableNodes"]["t4"]
            .as_str()
            .unwrap()
            .contains("gpuslice.io/gpu-model"),
        "{r}"
    );
    // Scores see only the GPUs the pod may use: binpack prefers the mixed node's fuller A100
    // for an A100 pod, and is indifferent between T4s.
    let args = json!({"Pod": pod(json!({"gpuslice.io/memory": "4Gi", "gpuslice.io/gpu-model": "a100"})), "Nodes": {"items": nodes}});
    let (_, r) = call(&server, "/prioritize", &args);
    assert_eq!(
        r,
        json!([{"Host": "a100s", "Score": 0}, {"Host": "t4", "Score": 0}, {"Host": "mixed", "Score": 10}]),
        "{r}"
    );
    // The same answers from the node cache (node names only, Nodes watched on the API
    // server).
    let api = gpuslice_testsupport::apiserver::ApiServer::start();
    for n in &nodes {
        api.put_node(n.clone());
    }
    let cached = Extender::with_api(&api.url, None);
    let args = json!({"Pod": pod(json!({"gpuslice.io/memory": "4Gi", "gpuslice.io/gpu-model": "T4"})), "NodeNames": ["a100s", "t4", "mixed"]});
    let seen = gpuslice_testsupport::wait_for(std::time::Duration::from_secs(10), || {
        call(&cached, "/filter", &args).1["NodeNames"] == json!(["t4", "mixed"])
    });
    let (_, r) = call(&cached, "/filter", &args);
    assert!(seen, "{r}");
    assert!(r["FailedAndUnresolvableNodes"]["a100s"].is_string(), "{r}");
}

#[test]
fn nodes_alike_share_a_verdict_but_a_pod_naming_a_gpu_is_judged_node_by_node() {
    let server = serve("binpack");
    let uuid =
        |node: usize, gpu: usize| format!("GPU-00000000-0000-4000-8000-0000000000{node}{gpu}");
    // Three nodes with the same GPUs, one of them nearly full; only the GPUs' UUIDs differ.
    let with_uuids = |k: usize| {
        let mut p: Value = serde_json::from_str(&publication(&[(24, 0, 0), (24, 20, 1)])).unwrap();
        for (i, g) in p["gpus"].as_array_mut().unwrap().iter_mut().enumerate() {
            g["uuid"] = json!(uuid(k, i));
        }
        p.to_string()
    };
    let mut nodes: Vec<Value> = (0..3)
        .map(|k| node(&format!("n{k}"), Some(with_uuids(k))))
        .collect();
    // A fourth like them but for its second GPU's model.
    nodes.push(node(
        "other-model",
        Some(publication_of(
            &[(24, 0, 0), (24, 20, 1)],
            &["NVIDIA A10", "NVIDIA L4"],
        )),
    ));
    let filter = |annotations: Value| {
        let args = json!({"Pod": pod(annotations), "Nodes": {"items": nodes}});
        let (status, r) = call(&server, "/filter", &args);
        assert!(status.contains("200"), "{status}");
        let keys = |v: &Value| -> Vec<String> {
            v.as_object()
                .map_or_else(Vec::new, |o| o.keys().cloned().collect())
        };
        (
            passed_names(&r),
            keys(&r["FailedNodes"]),
            keys(&r["FailedAndUnresolvableNodes"]),
        )
    };
    let (passed, full, never) = filter(json!({"gpuslice.io/memory": "8Gi"}));
    assert_eq!(passed, ["n0", "n1", "n2", "other-model"]);
    assert!(full.is_empty() && never.is_empty());
    // Two such slices fit on none (one GPU has 4 GiB left), but could on an emptied node.
    let (passed, full, _) = filter(json!({"gpuslice.io/memory": "8Gi", "gpuslice.io/gpus": "2"}));
    assert!(passed.is_empty());
    assert_eq!(full, ["n0", "n1", "n2", "other-model"]);
    // Named by UUID: the named GPU's node alone, and the full GPU's node is full, not never.
    let (passed, _, never) =
        filter(json!({"gpuslice.io/memory": "8Gi", "gpuslice.io/devices": uuid(1, 0)}));
    assert_eq!(passed, ["n1"]);
    assert_eq!(never, ["n0", "n2", "other-model"]);
    let (passed, full, never) =
        filter(json!({"gpuslice.io/memory": "8Gi", "gpuslice.io/devices": uuid(2, 1)}));
    assert!(passed.is_empty());
    assert_eq!(
        (full, never),
        (
            vec!["n2".to_string()],
            vec!["n0".into(), "n1".into(), "other-model".into()]
        )
    );
    // By model: the node whose second GPU differs is told apart from the others.
    let (passed, _, never) =
        filter(json!({"gpuslice.io/memory": "2Gi", "gpuslice.io/gpu-model": "L4"}));
    assert_eq!(passed, ["other-model"]);
    assert_eq!(never, ["n0", "n1", "n2"]);
}

#[test]
fn a_node_must_take_each_init_container_in_turn_and_the_sidecars_beside_the_apps() {
    let server = serve("binpack");
    let nodes = vec![
        node("one-16", Some(publication(&[(16, 0, 0)]))),
        node("one-24", Some(publication(&[(24, 0, 0)]))),
        node("two-16", Some(publication(&[(16, 0, 0), (16, 0, 0)]))),
    ];
    let filter = |init: Value, annotations: Value| {
        let mut p = pod(annotations);
        p["spec"]["initContainers"] = init;
        let args = json!({"Pod": p, "Nodes": {"items": nodes}});
        let (_, r) = call(&server, "/filter", &args);
        let passed = passed_names(&r);
        (passed, r)
    };
    // A 20 GiB init container before a 4 GiB app: the init container rules (Kubernetes'
    // effective request), and a node too small for it never takes the pod.
    let (passed, r) = filter(
        json!([{"name": "warm", "image": "x"}]),
        json!({"gpuslice.io/warm.memory": "20Gi", "gpuslice.io/app.memory": "4Gi"}),
    );
    assert_eq!(passed, ["one-24"], "{r}");
    assert!(r["FailedAndUnresolvableNodes"]["one-16"].is_string(), "{r}");
    // Two 12 GiB init containers run one after the other: one 16 GiB GPU takes both.
    let (passed, r) = filter(
        json!([{"name": "a", "image": "x"}, {"name": "b", "image": "x"}]),
        json!({"gpuslice.io/a.memory": "12Gi", "gpuslice.io/b.memory": "12Gi",
               "gpuslice.io/app.memory": "12Gi"}),
    );
    assert_eq!(passed, ["one-16", "one-24", "two-16"], "{r}");
    // A 12 GiB sidecar keeps running beside the 12 GiB app: two GPUs of 16, or one of 24.
    let (passed, r) = filter(
        json!([{"name": "proxy", "image": "x", "restartPolicy": "Always"}]),
        json!({"gpuslice.io/proxy.memory": "12Gi", "gpuslice.io/app.memory": "12Gi"}),
    );
    assert_eq!(passed, ["one-24", "two-16"], "{r}");
    // Pod-level keys give every container a slice, init containers included (as the agent
    // does): 10 GiB each, in turn, fits one 16 GiB GPU.
    let (passed, r) = filter(
        json!([{"name": "warm", "image": "x"}]),
        json!({"gpuslice.io/memory": "10Gi"}),
    );
    assert_eq!(passed, ["one-16", "one-24", "two-16"], "{r}");
}

#[test]
fn frag_aware_scores_break_ties_on_the_node_axis_across_the_whole_range() {
    let server = serve("frag-aware");
    // A 4 GiB slice leaves no fragment on any of these nodes (each has an empty GPU): the
    // fragmentation measure ties, and binpack on the node axis decides.
    let nodes = vec![
        node("empty", Some(publication(&[(24, 0, 0), (24, 0, 0)]))),
        node("half", Some(publication(&[(24, 12, 1), (24, 0, 0)]))),
        node("fuller", Some(publication(&[(24, 18, 2), (24, 0, 0)]))),
        node("fullest", Some(publication(&[(24, 23, 3), (24, 0, 0)]))),
        node("cannot", Some(publication(&[(24, 23, 3)]))),
    ];
    let args = json!({"Pod": pod(json!({"gpuslice.io/memory": "4Gi"})), "Nodes": {"items": nodes}});
    call(&server, "/filter", &args);
    let (_, r) = call(&server, "/prioritize", &args);
    assert_eq!(
        r,
        json!([
            {"Host": "empty", "Score": 0}, {"Host": "half", "Score": 3},
            {"Host": "fuller", "Score": 7}, {"Host": "fullest", "Score": 10},
            {"Host": "cannot", "Score": 0}
        ]),
        "{r}"
    );
}

#[test]
fn spread_means_the_same_as_a_flag_and_as_an_annotation() {
    let nodes = vec![
        node("empty", Some(publication(&[(24, 0, 0), (24, 0, 0)]))),
        node("half", Some(publication(&[(24, 12, 2), (24, 0, 0)]))),
    ];
    let scores = |server: &Extender, annotations: Value| {
        let args = json!({"Pod": pod(annotations), "Nodes": {"items": nodes}});
        call(server, "/prioritize", &args).1
    };
    let by_annotation = scores(
        &serve("binpack"),
        json!({"gpuslice.io/memory": "4Gi", "gpuslice.io/node-policy": "spread"}),
    );
    let by_flag = scores(&serve("spread"), json!({"gpuslice.io/memory": "4Gi"}));
    assert_eq!(by_annotation, by_flag);
    assert_eq!(
        by_flag,
        json!([{"Host": "empty", "Score": 10}, {"Host": "half", "Score": 0}])
    );
    let out = std::process::Command::new(gpuslice_testsupport::binary("gpuslice-scheduler"))
        .args(["serve", "--default-node-policy", "spreed"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--default-node-policy \"spreed\"")
            && err.contains("binpack, spread or frag-aware"),
        "{err}"
    );
}
