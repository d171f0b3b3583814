//! With `nodeCacheCapable: true`, the extender answers from a Node watch (list, then watch)
//! against the API-server stand-in: a node's publication, its change and its deletion are
//! seen. At start it learns the task mix from the pods already placed.

mod common;

use std::time::Duration;

use common::{Extender, GIB, key_file};
use gpuslice_core::publication::{NODE_STATE_ANNOTATION, NodePublication, PublishedGpu};
use gpuslice_testsupport::apiserver::ApiServer;
use gpuslice_testsupport::wait_for;
use serde_json::{Value, json};

fn node(name: &str, allocated_gib: u64) -> Value {
    let p = NodePublication {
        topology: None,
        max_sharers: 16,
        version: 1,
        claimed: Vec::new(),
        gpus: vec![PublishedGpu {
            index: None,
            uuid: format!("GPU-{name}"),
            model: "NVIDIA A10".into(),
            memory_total: 24 * GIB,
            memory_allocated: allocated_gib * GIB,
            cores_allocated: 0,
            sharers: u32::from(allocated_gib > 0),
            exclusive: false,
        }],
    };
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name,
           "annotations": {NODE_STATE_ANNOTATION: serde_json::to_string(&p).unwrap()}}})
}

fn filter(e: &Extender, names: &[&str]) -> Value {
    let args = json!({
        "Pod": {"metadata": {"name": "p", "namespace": "default", "uid": "u",
                             "annotations": {"gpuslice.io/memory": "8Gi"}},
                "spec": {"containers": [{"name": "app"}]}},
        "NodeNames": names
    });
    e.call("/filter", &args)
}

fn serve(api: &ApiServer) -> Extender {
    Extender::with_api(&api.url, None)
}

#[test]
fn the_node_cache_follows_publications_changes_and_deletions() {
    let api = ApiServer::start();
    api.put_node(node("a", 0));
    let e = serve(&api);

    let passes = |names: &[&str], want: Value| {
        wait_for(Duration::from_secs(10), || {
            filter(&e, names)["NodeNames"] == want
        })
    };
    assert!(
        passes(&["a", "b"], json!(["a"])),
        "listed node a: {}",
        filter(&e, &["a", "b"])
    );
    api.put_node(node("b", 0));
    assert!(
        passes(&["a", "b"], json!(["a", "b"])),
        "added node b: {}",
        filter(&e, &["a", "b"])
    );
    api.put_node(node("a", 20));
    assert!(
        passes(&["a", "b"], json!(["b"])),
        "node a filled: {}",
        filter(&e, &["a", "b"])
    );
    let r = filter(&e, &["a"]);
    assert!(
        r["FailedNodes"]["a"]
            .as_str()
            .unwrap()
            .contains("not enough free"),
        "{r}"
    );
    api.delete_node("b");
    assert!(
        passes(&["a", "b"], json!([])),
        "node b deleted: {}",
        filter(&e, &["a", "b"])
    );
}

#[test]
fn changes_made_while_the_node_list_is_paged_reach_the_cache_through_the_watch() {
    // More nodes than a page of the watcher's list (500): the list takes three pages, and
    // between the first and the second the cluster changes under it.
    let api = ApiServer::start();
    for i in 0..1200 {
        let free = i == 5;
        api.put_node(node(&format!("n{i:04}"), if free { 0 } else { 20 }));
    }
    api.between_node_pages(|o| {
        o.delete_node("n0005"); // listed on the first page as free, then deleted
        o.put_node(node("n0007", 0)); // listed full, then freed
        o.put_node(node("n1100", 0)); // freed before its page is served
        o.put_node(node("late", 0)); // added while the list was paged
    });
    let e = serve(&api);
    let names = ["n0005", "n0007", "n1100", "late", "n0008"];
    let settled = wait_for(Duration::from_secs(20), || {
        filter(&e, &names)["NodeNames"] == json!(["n0007", "n1100", "late"])
    });
    assert!(settled, "{}", filter(&e, &names));
    let r = filter(&e, &names);
    // A deleted node is one without an agent: unresolvable, as in every other mode.
    assert!(
        r["FailedAndUnresolvableNodes"]["n0005"]
            .as_str()
            .unwrap()
            .contains("publishes no GPUs"),
        "{r}"
    );
    assert!(
        r["FailedNodes"]["n0008"]
            .as_str()
            .unwrap()
            .contains("not enough free"),
        "{r}"
    );
}

#[test]
fn a_restarted_extender_learns_the_task_mix_from_the_pods_already_placed() {
    let api = ApiServer::start();
    api.put_node(node("a", 0));
    let pod = |name: &str, annotations: Value, node: Option<&str>, phase: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                            "annotations": annotations},
               "spec": {"containers": [{"name": "app", "image": "x"}], "nodeName": node},
               "status": {"phase": phase}})
    };
    // More than one page of placed slice pods (the extender lists 500 at a time).
    for i in 0..600 {
        api.put_pod(pod(
            &format!("web-{i:03}"),
            json!({"gpuslice.io/memory": "4Gi"}),
            Some("a"),
            "Running",
        ));
    }
    let mut by_resources = pod("model", json!({}), Some("a"), "Running");
    by_resources["spec"]["containers"][0]["resources"] =
        json!({"limits": {"gpuslice.io/gpu-memory": "8Gi"}});
    api.put_pod(by_resources);
    api.put_pod(pod("plain", json!({}), Some("a"), "Running"));
    api.put_pod(pod(
        "done",
        json!({"gpuslice.io/memory": "4Gi"}),
        Some("a"),
        "Succeeded",
    ));
    api.put_pod(pod(
        "pending",
        json!({"gpuslice.io/memory": "4Gi"}),
        None,
        "Pending",
    ));

    let e = serve(&api);
    let learned = wait_for(Duration::from_secs(10), || {
        e.metric("gpuslice_scheduler_mix_pods") == Some(601.0)
    });
    assert!(
        learned,
        "mix pods: {:?}",
        e.metric("gpuslice_scheduler_mix_pods")
    );
    let pages: Vec<String> = api.objects.lock().unwrap().pod_lists.clone();
    let learning: Vec<&String> = pages.iter().filter(|q| q.contains("limit=500")).collect();
    assert!(
        learning.len() >= 2 && learning[1].contains("continue=500-"),
        "two pages of 500: {pages:?}"
    );
    assert!(wait_for(Duration::from_secs(10), || {
        e.metric("gpuslice_scheduler_nodes") == Some(1.0)
    }));

    // A new pod is counted once, however often it is filtered.
    filter(&e, &["a"]);
    filter(&e, &["a"]);
    assert_eq!(e.metric("gpuslice_scheduler_mix_pods"), Some(602.0));
    assert_eq!(
        e.metric("gpuslice_scheduler_requests_total{verb=\"filter\",outcome=\"ok\"}"),
        Some(2.0)
    );
    let (status, _) = e.post("/prioritize", "not json");
    assert!(status.contains("400"), "{status}");
    assert_eq!(
        e.metric("gpuslice_scheduler_requests_total{verb=\"prioritize\",outcome=\"error\"}"),
        Some(1.0)
    );
}

#[test]
fn a_restarted_extender_still_counts_assigned_placements_the_agent_does_not_show_yet() {
    use gpuslice_core::assignment::{AssignedGpu, Assignment};
    const KEY: &[u8] = b"a key shared by the scheduler and every agent";
    let api = ApiServer::start();
    // The agent shows 8 GiB taken, by "old", whose container runs.
    let mut a = node("a", 8);
    let mut p: NodePublication = serde_json::from_str(
        a["metadata"]["annotations"][NODE_STATE_ANNOTATION]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    p.claimed = vec!["uid-old/app".into()];
    a["metadata"]["annotations"][NODE_STATE_ANNOTATION] =
        Value::String(serde_json::to_string(&p).unwrap());
    api.put_node(a);
    let bound = |name: &str, gib: u64| {
        let signed = Assignment {
            node: "a".into(),
            pod_uid: format!("uid-{name}"),
            containers: [(
                "app".to_string(),
                vec![AssignedGpu {
                    uuid: "GPU-a".into(),
                    memory_bytes: gib * GIB,
                    cores: 0,
                }],
            )]
            .into(),
        }
        .sign(KEY)
        .unwrap();
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                            "annotations": {"gpuslice.io/memory": format!("{gib}Gi"),
                                            "gpuslice.io/assignment": signed}},
               "spec": {"containers": [{"name": "app", "image": "x"}], "nodeName": "a"},
               "status": {"phase": "Pending"}})
    };
    api.put_pod(bound("old", 8));
    // Bound before the restart; its container has not started, so the agent does not show it.
    api.put_pod(bound("fresh", 10));

    let (_dir, key) = key_file(KEY);
    let e = Extender::with_api(&api.url, Some(&key));
    let fits = |memory: &str| {
        let args = json!({
            "Pod": {"metadata": {"name": "next", "namespace": "default", "uid": "uid-next",
                                 "annotations": {"gpuslice.io/memory": memory}},
                    "spec": {"containers": [{"name": "app"}]}},
            "NodeNames": ["a"]
        });
        e.call("/filter", &args)["NodeNames"] == json!(["a"])
    };
    // 24 GiB − 8 (old, shown once) − 10 (fresh, not shown yet) = 6 GiB: 6 fit, 7 do not. (A
    // node not known yet fits nothing; fresh not counted would fit 7, old counted twice not 6.)
    assert!(
        wait_for(Duration::from_secs(10), || fits("6Gi") && !fits("7Gi")),
        "6 GiB fit: {}, 7 GiB fit: {}",
        fits("6Gi"),
        fits("7Gi")
    );
}
