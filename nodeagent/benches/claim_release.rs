//! Claim+release round trips over D-Bus against a real agent on a private bus and a simulated
//! node: latency percentiles and claims per second, with the ledger on a tmpfs (the agent's
//! default, /run) and on disk, over the bus and over the agent's private socket; and, as the
//! runtime wrapper and the hook make them, each claim and each release on a connection of its
//! own (`fresh`).
//!
//! Run: `cargo build --release --workspace && cargo bench -p gpuslice-nodeagent --bench claim_release`
//! Options (environment): `BENCH_PAIRS` (default 3000), `BENCH_CLIENTS` (default 1,8).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpuslice_agent_api::AgentProxy;
use gpuslice_testsupport::{agent::Agent, bus::Bus, sim::SimNode};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// How a client reaches the agent.
#[derive(Clone)]
struct Via {
    bus: String,
    private: Option<PathBuf>,
    /// A connection of its own for each call.
    fresh: bool,
}

impl Via {
    fn label(&self) -> String {
        let way = if self.private.is_some() {
            "private"
        } else {
            "bus"
        };
        if self.fresh {
            format!("{way}_fresh")
        } else {
            way.to_string()
        }
    }

    async fn proxy(&self) -> AgentProxy<'static> {
        let private = self.private.as_ref().map(|p| p.display().to_string());
        let conn = gpuslice_agent_api::connect_agent(Some(&self.bus), private.as_deref())
            .await
            .expect("agent");
        assert_eq!(
            conn.unique_name().is_none(),
            self.private.is_some(),
            "connected the other way"
        );
        AgentProxy::builder(&conn)
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
            .expect("proxy")
    }
}

async fn client(via: Via, name: String, pairs: usize) -> Vec<Duration> {
    let mut p = via.proxy().await;
    let annotations: std::collections::HashMap<&str, &str> =
        [("gpuslice.io/memory", "256Mi"), ("gpuslice.io/cores", "1")].into();
    let mut out = Vec::with_capacity(pairs);
    for i in 0..pairs {
        let id = format!("{name}-{i}");
        let t = Instant::now();
        if via.fresh {
            p = via.proxy().await;
        }
        p.claim(&id, annotations.clone()).await.expect("claim");
        if via.fresh {
            p = via.proxy().await;
        }
        p.release(&id).await.expect("release");
        out.push(t.elapsed());
    }
    out
}

fn run(base: &Path, label: &str, clients: usize, pairs: usize, private: bool, fresh: bool) {
    let sim = SimNode::new(2, "A10", None);
    let bus = Bus::start();
    let agent_exe = PathBuf::from(env!("CARGO_BIN_EXE_gpuslice-agent"));
    let agent = Agent::start_in(base, &agent_exe, &bus, &sim, &["--max-sharers", "64"], &[]);
    let via = Via {
        bus: bus.address.clone(),
        private: private.then(|| agent.private_socket()),
        fresh,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // Warm up the agent and the bus.
    rt.block_on(client(via.clone(), "warmup".into(), 200));
    let start = Instant::now();
    let mut all: Vec<Duration> = rt.block_on(async {
        let tasks: Vec<_> = (0..clients)
            .map(|c| tokio::spawn(client(via.clone(), format!("c{c}"), pairs / clients)))
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.expect("client"));
        }
        all
    });
    let wall = start.elapsed();
    all.sort_unstable();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    #[allow(clippy::cast_precision_loss)]
    let claims_per_s = all.len() as f64 / wall.as_secs_f64();
    println!(
        "bench=claim_release state={label} via={} clients={clients} pairs={} p50_us={:.0} p99_us={:.0} max_us={:.0} claims_per_s={:.0}",
        via.label(),
        all.len(),
        us(percentile(&all, 0.50)),
        us(percentile(&all, 0.99)),
        us(*all.last().expect("samples")),
        claims_per_s
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let pairs: usize = std::env::var("BENCH_PAIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let clients: Vec<usize> = std::env::var("BENCH_CLIENTS")
        .unwrap_or_else(|_| "1,8".into())
        .split(',')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    let tmpfs = gpuslice_testsupport::runtime_tmp();
    let disk = PathBuf::from("/var/tmp");
    for &c in &clients {
        run(&tmpfs, "tmpfs", c, pairs, false, false);
        run(&tmpfs, "tmpfs", c, pairs, true, false);
        run(&disk, "disk", c, pairs, false, false);
    }
    // As the wrapper and the hook call: a process, so a connection, per call.
    run(&tmpfs, "tmpfs", 1, pairs, false, true);
    run(&tmpfs, "tmpfs", 1, pairs, true, true);
}
