//! `gpuslice-scheduler serve` as a real process against the stand-in API server with
//! `BENCH_NODES` Nodes (default 15,000) of 8 GPUs each, every one a Node object as a kubelet
//! and a gpuslice agent write it (labels, conditions, images, the node-state annotation): the
//! extender's resident memory once its watches have listed the cluster, and after
//! `BENCH_DECISIONS` (default 100) filter + prioritize decisions over HTTP with `NodeNames`;
//! its peak (`VmHWM`) over both; and the decisions' latency.
//!
//! Run: `cargo bench -p gpuslice-scheduler --bench serve_memory`.

#[path = "../tests/common/mod.rs"]
mod common;
mod load;

use load::GPUS;

use std::time::Instant;

use gpuslice_core::publication::NODE_STATE_ANNOTATION;
use gpuslice_testsupport::apiserver::ApiServer;
use serde_json::{Value, json};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A Node as kubelet and the gpuslice agent leave it: about 6 KB of JSON.
fn node(i: usize) -> Value {
    let name = format!("gpu-node-{i:05}");
    let publication = load::publication(
        |g| format!("GPU-{i:08x}-0000-4000-8000-{g:012x}"),
        |g| ((i * 7 + g * 3) % 5) as u64,
        true,
    );
    let images: Vec<Value> = (0..20)
        .map(|k| {
            json!({"names": [format!("registry.example/team-{k}/service@sha256:{:064x}", i * 20 + k),
                             format!("registry.example/team-{k}/service:v1.{k}")],
                   "sizeBytes": 100_000_000 + k * 1_000_000})
        })
        .collect();
    let condition = |t: &str, status: &str| {
        json!({"type": t, "status": status, "lastHeartbeatTime": "2026-11-25T10:00:00Z",
               "lastTransitionTime": "2026-11-01T10:00:00Z", "reason": format!("Kubelet{t}"),
               "message": format!("kubelet reports {t} is {status}")})
    };
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name, "uid": format!("{i:08x}-1111-4222-8333-444455556666"),
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "g5.48xlarge",
                       "topology.kubernetes.io/zone": format!("zone-{}", i % 3),
                       "topology.kubernetes.io/region": "region-1"},
            "annotations": {
                NODE_STATE_ANNOTATION: serde_json::to_string(&publication).unwrap(),
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true"
            }
        },
        "spec": {"podCIDR": format!("10.{}.{}.0/24", i / 256, i % 256)},
        "status": {
            "capacity": {"cpu": "192", "memory": "785782768Ki", "pods": "110"},
            "allocatable": {"cpu": "191500m", "memory": "784782768Ki", "pods": "110"},
            "conditions": [condition("MemoryPressure", "False"), condition("DiskPressure", "False"),
                           condition("PIDPressure", "False"), condition("Ready", "True")],
            "addresses": [{"type": "InternalIP", "address": format!("10.0.{}.{}", i / 256, i % 256)},
                          {"type": "Hostname", "address": name}],
            "nodeInfo": {"kubeletVersion": "v1.31.2", "containerRuntimeVersion": "containerd://1.7.22",
                         "kernelVersion": "6.1.0-26-amd64", "osImage": "Debian GNU/Linux 12 (bookworm)",
                         "architecture": "amd64", "operatingSystem": "linux"},
            "images": images
        }
    })
}

/// `VmRSS` and `VmHWM` of process `pid`, in MiB.
fn memory_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn main() {
    let nodes = env_or("BENCH_NODES", 15_000);
    let decisions = env_or("BENCH_DECISIONS", 100);
    let api = ApiServer::start();
    let names: Vec<String> = (0..nodes)
        .map(|i| {
            let n = node(i);
            let name = n["metadata"]["name"].as_str().unwrap().to_string();
            api.put_node(n);
            name
        })
        .collect();

    let started = Instant::now();
    // Ready once its watches have listed the cluster.
    let extender = common::Extender::with_api(&api.url, None);
    let listed_s = started.elapsed().as_secs_f64();
    let (rss_listed, _) = memory_mib(extender.pid());

    let sizes = ["2Gi", "4Gi", "6Gi", "12Gi", "20Gi"];
    let mut latencies = Vec::with_capacity(decisions);
    for i in 0..decisions {
        let pod = json!({
            "metadata": {"name": format!("p{i}"), "namespace": "default", "uid": format!("uid-{i}"),
                         "annotations": {"gpuslice.io/memory": sizes[i % sizes.len()]}},
            "spec": {"containers": [{"name": "app", "image": "x"}]}
        });
        let body = json!({"Pod": pod, "NodeNames": names}).to_string();
        let t = Instant::now();
        let (s1, _) = extender.post("/filter", &body);
        let (s2, _) = extender.post("/prioritize", &body);
        assert!(s1.contains("200") && s2.contains("200"), "{s1} {s2}");
        latencies.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let (rss_after, peak) = memory_mib(extender.pid());
    latencies.sort_by(f64::total_cmp);
    let p50 = latencies[latencies.len() / 2];
    println!(
        "bench=serve_memory nodes={nodes} gpus_per_node={GPUS} listed_s={listed_s:.1} rss_listed_mib={rss_listed:.0} rss_after_decisions_mib={rss_after:.0} peak_mib={peak:.0} decisions={decisions} decision_p50_ms={p50:.1}"
    );
}
