//! The packaged alert rules and Grafana dashboard (`packaging/monitoring/`) read only metrics
//! the agent exports, every agent metric is read by one of them, and `promtool` accepts the
//! rules and every dashboard query.

mod common;

use std::time::Duration;

use common::*;
use gpuslice_testsupport::{agent::Agent, bus::Bus, http, monitoring, sim::SimNode, wait_for};

#[tokio::test(flavor = "multi_thread")]
async fn every_query_of_the_alerts_and_the_dashboard_names_a_metric_the_agent_exports() {
    // Every family shows once it has a sample: a running slice with an SM share, and in it a
    // process holding more than the slice through the plain driver (over the limit, and
    // memory no slot accounts for).
    let sim = SimNode::new(1, "T4", None);
    let bus = Bus::start();
    let agent = Agent::start(&agent_exe(), &bus, &sim, &["--enforce-interval", "100ms"]);
    let p = proxy(&bus.address).await;
    p.claim(
        "watched",
        ann(&[("gpuslice.io/memory", "1Gi"), ("gpuslice.io/cores", "30")]),
    )
    .await
    .unwrap();
    let cgroup = Cgroup::new("monitoring");
    let mut holder = sim.hold(&sim.wall_client(), 1 << 30);
    cgroup.adopt(holder.id());
    p.activate("watched", holder.id()).await.unwrap();
    let scrape = || {
        http::get(&agent.metrics_address, "/metrics")
            .map(|(_, _, body)| body)
            .unwrap_or_default()
    };
    let complete = wait_for(Duration::from_secs(5), || {
        let s = scrape();
        s.contains("gpuslice_slice_over_limit_total{")
            && s.contains("kind=\"understated\"")
            && s.contains("gpuslice_slice_driver_memory_used_bytes{")
    });
    let scrape = scrape();
    drop(holder.stdin.take());
    let _ = holder.wait();
    assert!(complete, "{scrape}\n{}", agent.log());
    let unknown = monitoring::unknown_metrics(&scrape, "gpuslice_", "gpuslice_scheduler_");
    assert!(
        unknown.is_empty(),
        "not exported by the agent: {unknown:?}\n{scrape}"
    );
    let unused = monitoring::unused_metrics(&scrape, "gpuslice_", "gpuslice_scheduler_");
    assert!(unused.is_empty(), "read by no alert or panel: {unused:?}");
}

#[test]
fn promtool_accepts_the_alert_rules_and_every_dashboard_query() {
    if let Err(e) = monitoring::promtool_check() {
        panic!("{e}");
    }
}
