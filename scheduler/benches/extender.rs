//! Filter + prioritize for one pod on 5,000 nodes × 8 GPUs at half occupancy: decisions per
//! second in-process, and the latency of a decision (both calls) over HTTP with `NodeNames`
//! (nodeCacheCapable), the way kube-scheduler calls.
//!
//! Run: `cargo bench -p gpuslice-scheduler --bench extender` (`BENCH_DECISIONS`, default 200;
//! `BENCH_NODES`, default 5,000; `BENCH_DISTINCT=1`: no two nodes alike). Also prints the process's resident memory once the node
//! cache is filled (before any request is built), which is what the extender holds for the
//! nodes.

use std::sync::Arc;
use std::time::Instant;

use gpuslice_scheduler::cluster::ClusterPolicy;
use gpuslice_scheduler::extender::{Extender, http, wire::ExtenderArgs};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

mod load;

use load::GPUS;

const DEFAULT_NODES: usize = 5000;

/// The process's resident memory in MiB (`VmRSS` of /proc/self/status).
fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let decisions: usize = std::env::var("BENCH_DECISIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let nodes_wanted: usize = std::env::var("BENCH_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_NODES);
    let rss_before = rss_mib();
    let policy: ClusterPolicy = "frag-aware".parse().unwrap();
    let ext = Arc::new(Extender::new(policy));
    let mut rng = StdRng::seed_from_u64(7);
    let names: Vec<String> = (0..nodes_wanted)
        .map(|i| format!("gpu-node-{i:04}"))
        .collect();
    // BENCH_DISTINCT=1: every node differs (its first GPU has as many more MiB taken as its
    // number), so that no two nodes are alike.
    let distinct = std::env::var_os("BENCH_DISTINCT").is_some_and(|v| v == "1");
    for (i, name) in names.iter().enumerate() {
        let mut publication = load::publication(
            |g| format!("GPU-{name}-{g}"),
            |_| rng.random_range(0..=4u64),
            false,
        );
        if distinct {
            publication.gpus[0].memory_allocated += (i as u64) << 20;
        }
        ext.update_node(name, Some(publication));
    }
    println!(
        "bench=extender nodes={nodes_wanted} node_cache_rss_mib={:.0}",
        rss_mib() - rss_before
    );
    let pod = |i: usize, mem: &str| {
        json!({
            "metadata": {"name": format!("p{i}"), "namespace": "default", "uid": format!("uid-{i}"),
                         "annotations": {"gpuslice.io/memory": mem}},
            "spec": {"containers": [{"name": "app", "image": "x"}]}
        })
    };
    let sizes = ["2Gi", "4Gi", "6Gi", "12Gi", "20Gi"];
    let args = |i: usize| json!({"Pod": pod(i, sizes[i % sizes.len()]), "NodeNames": names});

    // In-process, from the request bodies kube-scheduler would send (the names are borrowed).
    let bodies: Vec<String> = (0..decisions).map(|i| args(i).to_string()).collect();
    let parsed: Vec<ExtenderArgs> = bodies
        .iter()
        .map(|b| serde_json::from_str(b).unwrap())
        .collect();
    let started = Instant::now();
    let mut passing = 0;
    for a in &parsed {
        passing += ext.filter(a).node_names.map_or(0, |n| n.len());
        let scores = ext.prioritize(a);
        assert_eq!(scores.len(), nodes_wanted);
    }
    let secs = started.elapsed().as_secs_f64();
    let t = Instant::now();
    for a in &parsed {
        std::hint::black_box(ext.filter(a));
    }
    let filter_ms = t.elapsed().as_secs_f64() * 1000.0 / decisions as f64;
    let t = Instant::now();
    for a in &parsed {
        std::hint::black_box(ext.prioritize(a));
    }
    let prioritize_ms = t.elapsed().as_secs_f64() * 1000.0 / decisions as f64;
    println!("bench=extender in_process filter_ms={filter_ms:.3} prioritize_ms={prioritize_ms:.3}");
    println!(
        "bench=extender in_process nodes={nodes_wanted} gpus_per_node={GPUS} decisions={decisions} decisions_per_s={:.0} mean_passing_nodes={}",
        decisions as f64 / secs,
        passing / decisions
    );

    // Over HTTP, kube-scheduler style: filter then prioritize, NodeNames only.
    let addr = format!("127.0.0.1:{}", gpuslice_testsupport::http::free_port());
    let server = {
        let (ext, addr) = (ext.clone(), addr.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let l = tokio::net::TcpListener::bind(&addr).await.unwrap();
                // As the extender serves plain HTTP on a loopback address.
                gpuslice_scheduler::extender::tls::serve_plain(l, http::router(ext), true)
                    .await
                    .unwrap();
            });
        })
    };
    assert!(gpuslice_testsupport::wait_for(
        std::time::Duration::from_secs(10),
        || { gpuslice_testsupport::http::get(&addr, "/healthz").is_ok() }
    ));
    let mut latencies = Vec::with_capacity(decisions);
    for body in &bodies {
        let t = Instant::now();
        let (s1, _, _) = gpuslice_testsupport::http::post_json(&addr, "/filter", body).unwrap();
        let (s2, _, _) = gpuslice_testsupport::http::post_json(&addr, "/prioritize", body).unwrap();
        assert!(s1.contains("200") && s2.contains("200"));
        latencies.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let (p50, p99) = (
        percentile(&mut latencies.clone(), 0.5),
        percentile(&mut latencies, 0.99),
    );
    println!(
        "bench=extender http nodes={nodes_wanted} request_bytes={} decision_p50_ms={p50:.2} decision_p99_ms={p99:.2}",
        bodies[0].len()
    );
    drop(server);
}
