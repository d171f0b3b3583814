//! The packaged alert rules and Grafana dashboard (`packaging/monitoring/`) read only metrics
//! the scheduler extender exports, and read every one of them.

mod common;

use common::Extender;
use gpuslice_testsupport::{http, monitoring};

#[test]
fn every_query_of_the_alerts_and_the_dashboard_names_a_metric_the_extender_exports() {
    let extender = Extender::start(&[]);
    // The request counter shows once a request was answered: a pod and no nodes.
    let args = serde_json::json!({
        "Pod": {"metadata": {"name": "p", "namespace": "default", "uid": "u1"},
                "spec": {"containers": [{"name": "c"}]}},
        "Nodes": {"items": []},
    });
    let _ = extender.call("/filter", &args);
    let (_, _, scrape) = http::get(&extender.addr, "/metrics").expect("scrape");
    let unknown = monitoring::unknown_metrics(&scrape, "gpuslice_scheduler_", "");
    assert!(
        unknown.is_empty(),
        "not exported by the extender: {unknown:?}\n{scrape}"
    );
    let unused = monitoring::unused_metrics(&scrape, "gpuslice_scheduler_", "");
    assert!(unused.is_empty(), "read by no alert or panel: {unused:?}");
}
