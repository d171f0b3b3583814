//! Trace replay with the protocol of the fragmentation paper (Weng et al., ATC'23): the pod
//! list is sampled with replacement until the GPU demand reaches 1.3x the cluster's GPU
//! capacity, the order is shuffled with the seed, pods arrive one by one and never leave, and
//! each is placed by the policy or fails. Node CPU and memory are constraints. Recorded at each
//! percent of arrived GPU demand (of capacity): GPU allocated, unallocated (100 − allocated)
//! and fragmentation (free GPU share stranded for the task mix, in % of capacity).

use std::collections::HashMap;

use gpuslice_core::topology::{Layout, Reach, Topology};

use crate::cluster::{self, ClusterPolicy, Demand, NodeState, TaskMix};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::trace::{PodRow, gpu_milli};

/// Arrived demand the workload is sampled up to, in % of GPU capacity.
pub const ARRIVED_MAX_PCT: u32 = 130;

/// One point of a run's curve.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub arrived_pct: u32,
    pub allocated_pct: f64,
    pub fragmentation_pct: f64,
}

/// One policy on one seed.
#[derive(Debug, Clone)]
pub struct Run {
    /// The pod list's name (empty until the caller names it).
    pub trace: String,
    pub policy: String,
    pub seed: u64,
    pub points: Vec<Point>,
    pub placed: usize,
    pub failed: usize,
    /// How close the GPUs of the multi-GPU pods placed were, when the nodes were given a
    /// layout to measure it by.
    pub closeness: Closeness,
}

/// The multi-GPU pods placed, by the farthest link between the GPUs each got.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Closeness {
    pub placed: usize,
    /// Every pair joined by NVLink.
    pub nvlink: usize,
    /// Not all NVLink, but all on one NUMA node (PCIe switch or host bridges).
    pub one_numa_node: usize,
    /// Across NUMA nodes.
    pub across: usize,
}

impl Closeness {
    /// Counts a placement on `gpus` of a node laid out as `topology`.
    pub fn count(&mut self, topology: &Topology, gpus: &[usize]) {
        if gpus.len() < 2 {
            return;
        }
        self.placed += 1;
        match topology.reach(gpus) {
            Reach::NvLink => self.nvlink += 1,
            Reach::OneNumaNode => self.one_numa_node += 1,
            Reach::AcrossNumaNodes => self.across += 1,
        }
    }
}

impl Run {
    /// Unallocated GPU % when the arrived demand first reached `pct` of capacity.
    #[must_use]
    pub fn unallocated_at(&self, pct: u32) -> Option<f64> {
        self.points
            .iter()
            .find(|p| p.arrived_pct == pct)
            .map(|p| 100.0 - p.allocated_pct)
    }
}

/// The sampled, shuffled workload of a seed: indexes into `pods`.
#[must_use]
pub fn workload(pods: &[PodRow], capacity_milli: u64, seed: u64) -> Vec<usize> {
    let mut rng = StdRng::seed_from_u64(seed);
    let target = capacity_milli * u64::from(ARRIVED_MAX_PCT) / 100;
    let mut sum = 0;
    let mut picked = Vec::new();
    while sum < target {
        let i = rng.random_range(0..pods.len());
        sum += gpu_milli(&pods[i]);
        picked.push(i);
    }
    picked.shuffle(&mut rng);
    picked
}

/// Replays `order` on a fresh copy of `nodes`. Frag-aware placement measures fragmentation
/// against `prior` plus every pod seen so far (learned online, older pods counting less: the
/// weight of a pod halves once pods asking for the cluster's GPU capacity have arrived after
/// it), each type weighed by the scarcity of the capacity it can use. With `measure`, each
/// multi-GPU placement is counted by how close its GPUs are on a node laid out so
/// ([`Closeness`]; the nodes themselves may carry the topology or not, for placement to use).
#[allow(clippy::too_many_arguments)]
pub fn replay(
    nodes: &[NodeState],
    demands: &[Demand],
    pods: &[PodRow],
    order: &[usize],
    policy: (&str, ClusterPolicy),
    prior: &TaskMix,
    seed: u64,
    measure: Option<Layout>,
) -> Run {
    let mut nodes = nodes.to_vec();
    let mut closeness = Closeness::default();
    let mut layouts: HashMap<usize, Topology> = HashMap::new();
    let capacity: u64 = nodes.iter().map(|n| n.gpus.len() as u64 * 1000).sum();
    let mut mix = prior.clone();
    mix.set_half_life(capacity as f64 / 1000.0);
    let mut rng = StdRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15);
    let mut random = |n: usize| rng.random_range(0..n);
    let (mut arrived, mut allocated) = (0u64, 0u64);
    let (mut placed, mut failed) = (0, 0);
    let mut points = Vec::new();
    let mut next = 1u32;
    for (decided, &i) in order.iter().enumerate() {
        let d = &demands[i];
        mix.observe(d);
        if decided % cluster::SCARCITY_EVERY == 0 {
            mix.weigh_by_scarcity(&nodes);
        }
        arrived += gpu_milli(&pods[i]);
        match cluster::choose(&nodes, d, policy.1, &mix, &mut random) {
            Some(p) => {
                if let Some(layout) = measure {
                    let gpus = nodes[p.node].gpus.len();
                    let t = layouts.entry(gpus).or_insert_with(|| layout.topology(gpus));
                    closeness.count(t, &p.gpus);
                }
                cluster::apply(&mut nodes[p.node], d, &p.gpus);
                allocated += gpu_milli(&pods[i]);
                placed += 1;
            }
            None => failed += 1,
        }
        while next <= ARRIVED_MAX_PCT && arrived * 100 >= u64::from(next) * capacity {
            let frag: f64 = nodes.iter().map(|n| mix.fragmentation(n)).sum();
            points.push(Point {
                arrived_pct: next,
                allocated_pct: allocated as f64 * 100.0 / capacity as f64,
                fragmentation_pct: frag * 100_000.0 / capacity as f64,
            });
            next += 1;
        }
    }
    Run {
        trace: String::new(),
        policy: policy.0.to_string(),
        seed,
        points,
        placed,
        failed,
        closeness,
    }
}

/// Mean and sample standard deviation.
#[must_use]
pub fn mean_sd(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}
