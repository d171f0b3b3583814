//! Prometheus metrics of the extender, served as OpenMetrics text on `/metrics`: requests by
//! verb and outcome since start, and, read at each scrape, the nodes it knows and the pods its
//! learned task mix counts.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Extender;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `filter`, `prioritize` or `bind`.
    pub verb: &'static str,
    /// `ok`, `error` when the answer carried an error (a broken body, a failed bind), or
    /// `refused` for a caller that is not kube-scheduler.
    pub outcome: &'static str,
}

pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    nodes: Gauge,
    mix_pods: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("gpuslice_scheduler");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "requests",
            "Extender requests answered, by verb and outcome",
            requests.clone(),
        );
        let nodes = Gauge::default();
        registry.register(
            "nodes",
            "Nodes whose gpuslice agent publishes GPUs, as the node cache knows them",
            nodes.clone(),
        );
        let mix_pods = Gauge::default();
        registry.register(
            "mix_pods",
            "Pods the learned task mix counts (frag-aware measures fragmentation against it)",
            mix_pods.clone(),
        );
        Self {
            registry,
            requests,
            nodes,
            mix_pods,
        }
    }
}

impl Metrics {
    pub fn count(&self, verb: &'static str, ok: bool) {
        let outcome = if ok { "ok" } else { "error" };
        self.requests
            .get_or_create(&RequestLabels { verb, outcome })
            .inc();
    }

    /// Counts a request refused for who made it.
    pub fn count_refused(&self, verb: &'static str) {
        self.requests
            .get_or_create(&RequestLabels {
                verb,
                outcome: "refused",
            })
            .inc();
    }

    /// The text exposition, with the gauges read from `extender` now.
    #[must_use]
    pub fn render(&self, extender: &Extender) -> String {
        self.nodes
            .set(i64::try_from(extender.nodes_known()).unwrap_or(i64::MAX));
        self.mix_pods
            .set(i64::try_from(extender.mix_pods()).unwrap_or(i64::MAX));
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            out = format!("# encoding failed: {e}\n");
        }
        out
    }
}
