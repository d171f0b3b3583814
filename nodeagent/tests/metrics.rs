//! The Prometheus endpoint, parsed as Prometheus text, and garbage collection of claims whose
//! containers are gone.

mod common;

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use common::*;
use gpuslice_core::usage;
use gpuslice_testsupport::{agent::Agent, bus::Bus, http, sim::SimNode, wait_for};
use prometheus_parse::{Scrape, Value};

fn scrape(agent: &Agent) -> (String, Scrape) {
    let (status, headers, body) = http::get(&agent.metrics_address, "/metrics").expect("scrape");
    assert!(status.contains("200"), "{status}");
    let scrape = Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).expect("prometheus text");
    (headers, scrape)
}

fn value(s: &Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    s.samples
        .iter()
        .find(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .map(|x| match x.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
            _ => f64::NAN,
        })
}

/// Marks `bytes` in use on the container's first GPU, as a process of the container does.
fn write_usage(agent: &Agent, id: &str, pid: u32, bytes: u64) {
    let path = agent.run_dir.join(id).join(usage::FILE_NAME);
    let mut region = std::fs::read(&path).unwrap();
    let slot = usage::HEADER_SIZE;
    region[slot..slot + 4].copy_from_slice(&pid.to_le_bytes());
    region[slot + usage::SLOT_USED..slot + usage::SLOT_USED + 8]
        .copy_from_slice(&bytes.to_le_bytes());
    std::fs::write(&path, region).unwrap();
}

#[tokio::test]
async fn the_metrics_endpoint_serves_prometheus_text_that_matches_the_ledger() {
    let sim = SimNode::new(2, "T4", None);
    let bus = Bus::start();
    let agent = Agent::start(&agent_exe(), &bus, &sim, &[]);
    let p = proxy(&bus.address).await;
    p.claim(
        "web",
        ann(&[("gpuslice.io/memory", "2Gi"), ("gpuslice.io/cores", "30")]),
    )
    .await
    .unwrap();
    p.claim("batch", ann(&[("gpuslice.io/memory", "3Gi")]))
        .await
        .unwrap();
    p.claim("huge", ann(&[("gpuslice.io/memory", "16Gi")]))
        .await
        .unwrap_err();
    p.claim("bad", ann(&[("gpuslice.io/memory", "-1")]))
        .await
        .unwrap_err();
    write_usage(&agent, "web", 4242, 1 << 30);

    let (headers, s) = scrape(&agent);
    assert!(
        headers
            .to_lowercase()
            .contains("content-type: application/openmetrics-text"),
        "{headers}"
    );
    let gpu0 = sim.spec.gpus[0].uuid.as_str();
    assert_eq!(
        value(
            &s,
            "gpuslice_gpu_memory_capacity_bytes",
            &[("uuid", gpu0), ("model", "Tesla T4")]
        ),
        Some((15 * GIB) as f64)
    );
    assert_eq!(
        value(&s, "gpuslice_gpu_memory_allocated_bytes", &[("uuid", gpu0)]),
        Some((5 * GIB) as f64)
    );
    assert_eq!(
        value(&s, "gpuslice_gpu_cores_allocated_ratio", &[("uuid", gpu0)]),
        Some(0.3)
    );
    assert_eq!(
        value(&s, "gpuslice_gpu_sharers", &[("uuid", gpu0)]),
        Some(2.0)
    );
    assert_eq!(
        value(
            &s,
            "gpuslice_slice_memory_limit_bytes",
            &[("container", "web")]
        ),
        Some((2 * GIB) as f64)
    );
    assert_eq!(
        value(
            &s,
            "gpuslice_slice_memory_used_bytes",
            &[("container", "web")]
        ),
        Some(GIB as f64)
    );
    assert_eq!(value(&s, "gpuslice_claims_admitted_total", &[]), Some(2.0));
    assert_eq!(
        value(
            &s,
            "gpuslice_claims_refused_total",
            &[("reason", "insufficient_memory")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &s,
            "gpuslice_claims_refused_total",
            &[("reason", "invalid_request")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&s, "gpuslice_claims", &[("state", "pending")]),
        Some(2.0)
    );
    let names: Vec<&str> = s.samples.iter().map(|x| x.metric.as_str()).collect();
    assert!(
        names.iter().all(|n| n.starts_with("gpuslice_")),
        "{names:?}"
    );
}

#[tokio::test]
async fn a_claim_is_released_when_its_container_process_dies() {
    let sim = SimNode::new(1, "T4", None);
    let bus = Bus::start();
    let agent = Agent::start(&agent_exe(), &bus, &sim, &["--gc-interval", "200ms"]);
    let p = proxy(&bus.address).await;
    let mut child = Command::new("sleep").arg("60").spawn().unwrap();
    p.claim("job", ann(&[("gpuslice.io/memory", "1Gi")]))
        .await
        .unwrap();
    p.activate("job", child.id()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        status(&p).await.slices.len(),
        1,
        "a running container's claim was collected"
    );
    let e = p.activate("job", u32::MAX - 7).await.unwrap_err();
    assert!(method_error(&e).unwrap().1.contains("no such process"));
    child.kill().unwrap();
    child.wait().unwrap();
    let gone = wait_for(Duration::from_secs(5), || {
        let (_, s) = scrape(&agent);
        value(&s, "gpuslice_claims_released_total", &[("cause", "gc")]) == Some(1.0)
    });
    assert!(
        gone,
        "claim of a dead container was not collected:\n{}",
        agent.log()
    );
    assert!(status(&p).await.slices.is_empty());
    assert!(!agent.run_dir.join("job").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pending_claim_stays_while_a_runtime_knows_the_container_and_goes_after_the_timeout() {
    let sim = SimNode::new(1, "T4", None);
    let bus = Bus::start();
    let runtime_root = tempfile::tempdir().unwrap();
    let root = runtime_root.path().display().to_string();
    let agent = Agent::start(
        &agent_exe(),
        &bus,
        &sim,
        &[
            "--gc-interval",
            "200ms",
            "--pending-timeout",
            "1s",
            "--runtime-root",
            &root,
        ],
    );
    let p = proxy(&bus.address).await;
    std::fs::create_dir_all(runtime_root.path().join("created")).unwrap();
    std::fs::write(runtime_root.path().join("created/state.json"), "{}").unwrap();
    for id in ["created", "forgotten"] {
        p.claim(id, ann(&[("gpuslice.io/memory", "1Gi")]))
            .await
            .unwrap();
    }
    let collected = wait_for(Duration::from_secs(5), || {
        let rt = tokio::runtime::Handle::current();
        let s = tokio::task::block_in_place(|| rt.block_on(status(&p)));
        s.slices.len() == 1
    });
    assert!(collected, "{}", agent.log());
    let ids: HashMap<String, ()> = status(&p)
        .await
        .slices
        .into_iter()
        .map(|s| (s.claim.container_id, ()))
        .collect();
    assert!(ids.contains_key("created"), "{ids:?}");
}
