//! With `--kube-events`, the agent posts Kubernetes Events (events.k8s.io/v1) on the pod of a
//! slice it refused or found tampered with, against a stand-in API server
//! (`gpuslice_testsupport::apiserver`) that checks the fields the real one requires. The pod
//! is the one containerd's CRI plugin names in the container's annotations.

mod common;

use std::time::Duration;

use common::*;
use gpuslice_core::usage;
use gpuslice_testsupport::apiserver::ApiServer;
use gpuslice_testsupport::{agent::Agent, bus::Bus, sim::SimNode, wait_for};
use serde_json::Value;

/// The annotations containerd's CRI plugin gives container `model` of pod ml/embeddings.
fn pod_annotations(memory: &str) -> Vec<(&str, &str)> {
    vec![
        ("gpuslice.io/memory", memory),
        ("io.kubernetes.cri.sandbox-name", "embeddings"),
        ("io.kubernetes.cri.sandbox-namespace", "ml"),
        ("io.kubernetes.cri.sandbox-uid", "7f3e-uid"),
        ("io.kubernetes.cri.container-name", "model"),
    ]
}

fn events_with(api: &ApiServer, reason: &str) -> Vec<Value> {
    api.kube_events()
        .into_iter()
        .filter(|e| e["reason"] == reason)
        .collect()
}

fn agent(sim: &SimNode, bus: &Bus, api: &ApiServer, events: bool) -> Agent {
    let mut args = vec![
        "--kube-api",
        api.url.as_str(),
        "--node-name",
        "gpu-node-1",
        "--gc-interval",
        "200ms",
    ];
    if events {
        args.push("--kube-events");
    }
    Agent::start(&agent_exe(), bus, sim, &args)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_slice_and_a_tampered_one_become_warning_events_on_their_pod() {
    let sim = SimNode::new(1, "T4", Some(15 * GIB));
    let bus = Bus::start();
    let api = ApiServer::start();
    let agent = agent(&sim, &bus, &api, true);
    let p = proxy(&bus.address).await;

    // Refused: more memory than the GPU has. Twice: the second is the same event's series.
    for _ in 0..2 {
        let e = p
            .claim("c-refused", ann(&pod_annotations("100Gi")))
            .await
            .expect_err("100Gi on a 15Gi GPU");
        assert!(method_error(&e).is_some(), "{e}");
    }
    let posted = wait_for(Duration::from_secs(10), || {
        events_with(&api, "GPUSliceRefused")
            .first()
            .is_some_and(|e| e["series"]["count"] == 2)
    });
    let refused = events_with(&api, "GPUSliceRefused");
    assert!(
        posted,
        "no refusal event with a count of 2: {refused:#?}\n{}",
        agent.log()
    );
    assert_eq!(refused.len(), 1, "a repeat is a series, not a new event");
    let e = &refused[0];
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["action"], "Admit");
    assert_eq!(e["reportingController"], "gpuslice.io/agent");
    assert_eq!(e["reportingInstance"], "gpu-node-1");
    assert_eq!(e["metadata"]["namespace"], "ml");
    assert_eq!(
        (
            &e["regarding"]["kind"],
            &e["regarding"]["namespace"],
            &e["regarding"]["name"],
            &e["regarding"]["uid"]
        ),
        (
            &Value::from("Pod"),
            &Value::from("ml"),
            &Value::from("embeddings"),
            &Value::from("7f3e-uid")
        )
    );
    let note = e["note"].as_str().unwrap();
    assert!(note.starts_with("container model: "), "{note}");
    assert!(note.contains("100"), "the refusal's reason: {note}");

    // Tampered: the container's root replaces its usage region with garbage.
    p.claim("c-tamper", ann(&pod_annotations("2Gi")))
        .await
        .expect("2Gi fits");
    let region = agent.run_dir.join("c-tamper").join(usage::FILE_NAME);
    std::fs::remove_file(&region).unwrap();
    std::fs::write(
        &region,
        vec![0xA5u8; usage::region_size(usage::DEFAULT_SLOTS)],
    )
    .unwrap();
    let posted = wait_for(Duration::from_secs(10), || {
        !events_with(&api, "GPUSliceTampered").is_empty()
    });
    assert!(
        posted,
        "no tampering event: {:#?}\n{}",
        api.kube_events(),
        agent.log()
    );
    let e = &events_with(&api, "GPUSliceTampered")[0];
    assert_eq!(e["regarding"]["name"], "embeddings");
    assert_eq!(e["action"], "Enforce");
    assert!(
        e["note"]
            .as_str()
            .unwrap()
            .starts_with("container model: usage region tampered with"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn without_kube_events_or_outside_kubernetes_no_event_is_posted() {
    let sim = SimNode::new(1, "T4", Some(15 * GIB));
    let bus = Bus::start();
    let api = ApiServer::start();
    let _agent = agent(&sim, &bus, &api, false);
    let p = proxy(&bus.address).await;
    p.claim("c1", ann(&pod_annotations("100Gi")))
        .await
        .expect_err("refused");

    let bus2 = Bus::start();
    let sim2 = SimNode::new(1, "T4", Some(15 * GIB));
    let _with_events = agent(&sim2, &bus2, &api, true);
    let p2 = proxy(&bus2.address).await;
    // A container of podman or the CLI names no pod: there is nothing to post on.
    p2.claim("c2", ann(&[("gpuslice.io/memory", "100Gi")]))
        .await
        .expect_err("refused");
    // And one that does, so that the wait below ends on something the agent did post.
    p2.claim("c3", ann(&pod_annotations("100Gi")))
        .await
        .expect_err("refused");
    let posted = wait_for(Duration::from_secs(10), || !api.kube_events().is_empty());
    assert!(posted);
    std::thread::sleep(Duration::from_millis(300));
    let events = api.kube_events();
    assert_eq!(events.len(), 1, "{events:#?}");
    assert!(
        events[0]["note"]
            .as_str()
            .unwrap()
            .starts_with("container model:")
    );
    assert_eq!(events[0]["series"], Value::Null);
}
