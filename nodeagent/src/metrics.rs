//! Prometheus metrics, served as OpenMetrics text on `/metrics`.
//!
//! GPU and slice gauges are rebuilt from the ledger at every scrape, so they can never drift
//! from it; counters count events since the agent started.

use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, PoisonError};

use gpuslice_core::fit::RefusalReason;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::dbus::Snapshot;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GpuLabels {
    pub gpu: String,
    pub uuid: String,
    pub model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SliceLabels {
    pub container: String,
    pub gpu: String,
    pub uuid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TamperLabels {
    pub container: String,
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

/// Why a claim was released: `request` (Release over D-Bus) or `gc` (its container is gone).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabels {
    pub cause: &'static str,
}

impl CauseLabels {
    pub const REQUEST: Self = Self { cause: "request" };
    pub const GC: Self = Self { cause: "gc" };
}

/// Claim state: `pending` or `active`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: &'static str,
}

pub struct Metrics {
    registry: Registry,
    gpu_memory_capacity: Family<GpuLabels, Gauge>,
    gpu_memory_allocated: Family<GpuLabels, Gauge>,
    gpu_cores_allocated: Family<GpuLabels, Gauge<f64, AtomicU64>>,
    gpu_sharers: Family<GpuLabels, Gauge>,
    slice_memory_limit: Family<SliceLabels, Gauge>,
    slice_memory_used: Family<SliceLabels, Gauge>,
    slice_driver_memory_used: Family<SliceLabels, Gauge>,
    slice_tampered: Family<TamperLabels, Gauge>,
    slice_cores: Family<SliceLabels, Gauge<f64, AtomicU64>>,
    slice_sm_seconds: Family<SliceLabels, Counter<f64, AtomicU64>>,
    slice_sm_throttled: Family<SliceLabels, Counter<f64, AtomicU64>>,
    /// The series of `slice_sm_seconds` made, so that those of claims gone are removed.
    sm_series: Mutex<HashSet<SliceLabels>>,
    claims: Family<StateLabels, Gauge>,
    pub admitted: Counter,
    pub refused: Family<ReasonLabels, Counter>,
    pub released: Family<CauseLabels, Counter>,
    /// Containers found over their slice by the backstop, by container and action.
    pub over_limit: Family<OverLimitLabels, Counter>,
    /// Requests for `/metrics` refused: no client certificate the agent knows its scraper by.
    pub scrapes_refused: Counter,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OverLimitLabels {
    pub container: String,
    pub action: String,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    #[must_use]
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let m = Self {
            registry: Registry::default(),
            gpu_memory_capacity: Family::default(),
            gpu_memory_allocated: Family::default(),
            gpu_cores_allocated: Family::default(),
            gpu_sharers: Family::default(),
            slice_memory_limit: Family::default(),
            slice_memory_used: Family::default(),
            slice_driver_memory_used: Family::default(),
            slice_tampered: Family::default(),
            slice_cores: Family::default(),
            slice_sm_seconds: Family::default(),
            slice_sm_throttled: Family::default(),
            sm_series: Mutex::default(),
            claims: Family::default(),
            admitted: Counter::default(),
            refused: Family::default(),
            released: Family::default(),
            over_limit: Family::default(),
            scrapes_refused: Counter::default(),
        };
        registry.register(
            "gpuslice_gpu_memory_capacity_bytes",
            "Device memory slices can be given on the GPU (its total less the driver's reservation)",
            m.gpu_memory_capacity.clone(),
        );
        registry.register(
            "gpuslice_gpu_memory_allocated_bytes",
            "Device memory of the GPU given to slices",
            m.gpu_memory_allocated.clone(),
        );
        registry.register(
            "gpuslice_gpu_cores_allocated_ratio",
            "Share of the GPU's SMs reserved by slices (0 to 1)",
            m.gpu_cores_allocated.clone(),
        );
        registry.register(
            "gpuslice_gpu_sharers",
            "Slices on the GPU",
            m.gpu_sharers.clone(),
        );
        registry.register(
            "gpuslice_slice_memory_limit_bytes",
            "Device-memory wall of a container on a GPU",
            m.slice_memory_limit.clone(),
        );
        registry.register(
            "gpuslice_slice_memory_used_bytes",
            "Device memory a container holds on a GPU, from its usage region",
            m.slice_memory_used.clone(),
        );
        registry.register(
            "gpuslice_slice_driver_memory_used_bytes",
            "Device memory the driver (NVML, per process) shows a container's processes holding on a GPU, at the enforcement backstop's last pass: the figure the wall holds on",
            m.slice_driver_memory_used.clone(),
        );
        registry.register(
            "gpuslice_slice_usage_tampered",
            "1 while a container's usage region is not believed (replaced, resized or rewritten from inside), by kind",
            m.slice_tampered.clone(),
        );
        registry.register(
            "gpuslice_slice_cores_ratio",
            "Share of the GPU's SMs reserved for a container (0 for none)",
            m.slice_cores.clone(),
        );
        registry.register(
            "gpuslice_slice_sm_seconds",
            "SM time of the GPU the driver's per-process utilization samples give to a container's processes, in seconds; its rate is the share of the GPU the slice kept busy",
            m.slice_sm_seconds.clone(),
        );
        registry.register(
            "gpuslice_slice_sm_throttled_seconds",
            "Time a container was held frozen because its processes kept a GPU busier than its SM share (beyond its burst), by the slice over it, in seconds",
            m.slice_sm_throttled.clone(),
        );
        registry.register(
            "gpuslice_claims",
            "Claims in the ledger by state",
            m.claims.clone(),
        );
        registry.register(
            "gpuslice_metrics_scrapes_refused",
            "Requests for /metrics refused for want of a client certificate the agent knows its scraper by",
            m.scrapes_refused.clone(),
        );
        registry.register(
            "gpuslice_claims_admitted",
            "Claims admitted",
            m.admitted.clone(),
        );
        registry.register(
            "gpuslice_claims_refused",
            "Claims refused, by reason",
            m.refused.clone(),
        );
        registry.register(
            "gpuslice_claims_released",
            "Claims released, by cause",
            m.released.clone(),
        );
        registry.register(
            "gpuslice_slice_over_limit",
            "Times the driver showed a container holding more than its slice (plus the tolerance), by the action taken",
            m.over_limit.clone(),
        );
        for cause in [CauseLabels::REQUEST, CauseLabels::GC] {
            let _ = m.released.get_or_create(&cause);
        }
        for reason in RefusalReason::ALL {
            let _ = m.refused.get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            });
        }
        Self { registry, ..m }
    }

    /// A request for `/metrics` was refused ([`crate::metrics_http`]).
    pub fn count_metrics_refused(&self) {
        self.scrapes_refused.inc();
    }

    pub fn count_refusal(&self, reason: RefusalReason) {
        self.refused
            .get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            })
            .inc();
    }

    /// Adds `seconds` of SM time to a container's count on a GPU ([`crate::sm_time`]).
    pub fn add_sm_seconds(&self, slice: SliceLabels, seconds: f64) {
        self.slice_sm_seconds.get_or_create(&slice).inc_by(seconds);
        self.sm_series
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(slice);
    }

    /// Adds `seconds` to the time a container was held over its share on a GPU
    /// ([`crate::throttle`]).
    pub fn add_sm_throttled_seconds(&self, slice: SliceLabels, seconds: f64) {
        self.slice_sm_throttled
            .get_or_create(&slice)
            .inc_by(seconds);
        self.sm_series
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(slice);
    }

    /// Makes each claim's SM-time and throttled series (0 until it uses some) and removes those of claims
    /// gone, keeping every other's count.
    fn keep_sm_series(&self, live: HashSet<SliceLabels>) {
        let mut series = self
            .sm_series
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for gone in series.difference(&live) {
            self.slice_sm_seconds.remove(gone);
            self.slice_sm_throttled.remove(gone);
        }
        for k in &live {
            let _ = self.slice_sm_seconds.get_or_create(k);
            let _ = self.slice_sm_throttled.get_or_create(k);
        }
        *series = live;
    }

    /// Rebuilds the gauges from a snapshot of the ledger and encodes every metric.
    pub fn render(&self, snapshot: &Snapshot) -> String {
        let gpus = &snapshot.inventory.gpus;
        let labels = |index: u32, uuid: &str| GpuLabels {
            gpu: index.to_string(),
            uuid: uuid.to_string(),
            model: gpus
                .iter()
                .find(|g| g.uuid == uuid)
                .map(|g| g.name.clone())
                .unwrap_or_default(),
        };
        for f in [
            &self.gpu_memory_capacity,
            &self.gpu_memory_allocated,
            &self.gpu_sharers,
        ] {
            f.clear();
        }
        self.gpu_cores_allocated.clear();
        for l in &snapshot.loads {
            let k = labels(l.index, &l.uuid);
            self.gpu_memory_capacity
                .get_or_create(&k)
                .set(clamp(l.memory_total));
            self.gpu_memory_allocated
                .get_or_create(&k)
                .set(clamp(l.memory_allocated));
            self.gpu_cores_allocated
                .get_or_create(&k)
                .set(f64::from(l.cores_allocated) / 100.0);
            self.gpu_sharers.get_or_create(&k).set(i64::from(l.sharers));
        }
        self.slice_memory_limit.clear();
        self.slice_memory_used.clear();
        self.slice_driver_memory_used.clear();
        self.slice_tampered.clear();
        self.slice_cores.clear();
        self.claims.clear();
        for id in &snapshot.understated {
            self.slice_tampered
                .get_or_create(&TamperLabels {
                    container: id.clone(),
                    kind: "understated",
                })
                .set(1);
        }
        let (mut pending, mut active) = (0, 0);
        let mut sm_series = HashSet::new();
        for (claim, usage) in snapshot.claims.iter().zip(&snapshot.usage) {
            let running = match claim.state {
                gpuslice_core::ClaimState::Pending => {
                    pending += 1;
                    false
                }
                gpuslice_core::ClaimState::Active { .. } => {
                    active += 1;
                    true
                }
            };
            let used = match usage {
                Ok(u) => u.clone(),
                Err(t) => {
                    if running || !t.is_missing() {
                        self.slice_tampered
                            .get_or_create(&TamperLabels {
                                container: claim.container_id.clone(),
                                kind: t.kind(),
                            })
                            .set(1);
                    }
                    Vec::new()
                }
            };
            for (pos, g) in claim.gpus.iter().enumerate() {
                let k = SliceLabels {
                    container: claim.container_id.clone(),
                    gpu: g.index.to_string(),
                    uuid: g.uuid.clone(),
                };
                self.slice_memory_limit
                    .get_or_create(&k)
                    .set(clamp(g.memory_bytes));
                self.slice_memory_used
                    .get_or_create(&k)
                    .set(clamp(used.get(pos).copied().unwrap_or(0)));
                if let Some(held) = snapshot
                    .driver_held
                    .get(&(claim.container_id.clone(), g.uuid.clone()))
                {
                    self.slice_driver_memory_used
                        .get_or_create(&k)
                        .set(clamp(*held));
                }
                self.slice_cores
                    .get_or_create(&k)
                    .set(f64::from(g.cores) / 100.0);
                sm_series.insert(k);
            }
        }
        self.keep_sm_series(sm_series);
        self.claims
            .get_or_create(&StateLabels { state: "pending" })
            .set(pending);
        self.claims
            .get_or_create(&StateLabels { state: "active" })
            .set(active);
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The content type of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
