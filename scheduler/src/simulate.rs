//! Trace replay with the protocol of the fragmentation paper (Weng et al., ATC'23) as its
//! simulator runs it: every pod of the list once, shuffled with the seed, then pods drawn at
//! random from the list until the GPU demand reaches 1.3x the cluster's GPU capacity
//! ([`workload`]); pods arrive one by one and never leave, and each is placed by the policy or
//! fails. Node CPU and memory are constraints. Recorded at each percent of arrived GPU demand
//! (of capacity): GPU allocated, unallocated (100 − allocated) and fragmentation (free GPU
//! share stranded for the task mix, in % of capacity).

use std::collections::HashMap;

use gpuslice_core::topology::{Layout, Reach, Topology};

use crate::cluster::{self, ClusterPolicy, Demand, NodeState, TaskMix};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::trace::{PodRow, gpu_milli};

/// Arrived demand the workload is sampled up to, in % of GPU capacity.
pub const ARRIVED_MAX_PCT: u32 = 130;

/// Share of the pod list the FGD baseline's typical pods make up (the paper's experiments).
pub const FGD_TYPICAL_PODS: f64 = 0.95;

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

/// The workload of a seed, indexes into `pods`, as the paper's simulator tunes it: every pod
/// of the list once, shuffled with the seed; then, while the GPU demand is short of
/// [`ARRIVED_MAX_PCT`] of capacity, pods drawn at random from the list are appended in the
/// order drawn, until the next would pass it (a list already above it loses pods at random
/// until it is not). The list's own pods arrive first, so a list of about the cluster's
/// capacity is replayed whole, each pod once, before 100% arrived.
#[must_use]
pub fn workload(pods: &[PodRow], capacity_milli: u64, seed: u64) -> Vec<usize> {
    let mut rng = StdRng::seed_from_u64(seed);
    let target = capacity_milli * u64::from(ARRIVED_MAX_PCT) / 100;
    let mut order: Vec<usize> = (0..pods.len()).collect();
    order.shuffle(&mut rng);
    let mut sum: u64 = pods.iter().map(gpu_milli).sum();
    if sum > target {
        while sum > target && !order.is_empty() {
            let i = rng.random_range(0..order.len());
            sum -= gpu_milli(&pods[order.remove(i)]);
        }
        return order;
    }
    while sum < target && !pods.is_empty() {
        // The simulator compares the next pod's per-GPU share (not its total) with what is
        // left; for the pods of several whole GPUs this lets the sum pass the target a little.
        let i = rng.random_range(0..pods.len());
        if sum + u64::from(pods[i].gpu_milli) > target {
            break;
        }
        sum += gpu_milli(&pods[i]);
        order.push(i);
    }
    order
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
    // The FGD baseline knows its workload in advance, as in the paper; the others learn it.
    let learn = policy.1 != ClusterPolicy::Fgd;
    let mut mix = if learn {
        let mut mix = prior.clone();
        mix.set_half_life(capacity as f64 / 1000.0);
        mix
    } else {
        TaskMix::typical(demands, FGD_TYPICAL_PODS)
    };
    let mut rng = StdRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15);
    // The paper's simulator prefixes each node's name with its place in a random permutation
    // drawn per run; its baselines give equal scores to the node whose name sorts first, so
    // they break ties in an order random but fixed for the run.
    let mut places: Vec<usize> = (0..nodes.len()).collect();
    places.shuffle(&mut rng);
    let width = nodes.len().to_string().len();
    for (n, place) in nodes.iter_mut().zip(places) {
        n.name = format!("{place:0width$}-{}", n.name);
    }
    let mut random = |n: usize| rng.random_range(0..n);
    let (mut arrived, mut allocated) = (0u64, 0u64);
    let (mut placed, mut failed) = (0, 0);
    let mut points = Vec::new();
    let mut next = 1u32;
    for (decided, &i) in order.iter().enumerate() {
        let d = &demands[i];
        if learn {
            mix.observe(d);
            if decided % cluster::SCARCITY_EVERY == 0 {
                mix.weigh_by_scarcity(nodes.iter().map(|n| (n, 1)));
            }
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
            points.push(point(&nodes, &mix, next, allocated, capacity));
            next += 1;
        }
    }
    // The workload stops short of its end by less than one pod (drawing stops at the first
    // that would pass it): the points it stops short of by less than that are the end's.
    let largest = order
        .iter()
        .map(|&i| gpu_milli(&pods[i]))
        .max()
        .unwrap_or(0);
    while next <= ARRIVED_MAX_PCT && (arrived + largest) * 100 >= u64::from(next) * capacity {
        points.push(point(&nodes, &mix, next, allocated, capacity));
        next += 1;
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

/// The point at `arrived_pct` of a run whose placed pods take `allocated` of `capacity`.
fn point(
    nodes: &[NodeState],
    mix: &TaskMix,
    arrived_pct: u32,
    allocated: u64,
    capacity: u64,
) -> Point {
    let frag: f64 = nodes.iter().map(|n| mix.fragmentation(n)).sum();
    Point {
        arrived_pct,
        allocated_pct: allocated as f64 * 100.0 / capacity as f64,
        fragmentation_pct: frag * 100_000.0 / capacity as f64,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(num_gpu: u32, gpu_milli: u32) -> PodRow {
        PodRow {
            name: String::new(),
            cpu_milli: 1000,
            memory_mib: 1024,
            num_gpu,
            gpu_milli,
            gpu_spec: String::new(),
        }
    }

    #[test]
    fn the_workload_replays_every_pod_of_the_list_once_before_the_extra_ones() {
        let pods = vec![pod(1, 1000), pod(1, 500), pod(0, 0), pod(2, 1000)];
        // 3.5 GPUs asked of a 4-GPU cluster: 5.2 GPUs is 130%.
        let order = workload(&pods, 4000, 7);
        let mut first: Vec<usize> = order[..pods.len()].to_vec();
        first.sort_unstable();
        assert_eq!(first, [0, 1, 2, 3], "{order:?}");
        let total: u64 = order.iter().map(|&i| gpu_milli(&pods[i])).sum();
        // Drawing stops at the first pod that would pass 5.2 GPUs (compared by its per-GPU
        // share, so a 2-GPU pod may pass it by one GPU).
        assert!((4200..=6200).contains(&total), "{total}: {order:?}");
        assert!(order.len() > pods.len(), "{order:?}");
        assert_eq!(order, workload(&pods, 4000, 7), "the seed decides");
        // A list above 130% loses pods at random until it is not.
        let order = workload(&pods, 2000, 7);
        let total: u64 = order.iter().map(|&i| gpu_milli(&pods[i])).sum();
        assert!(total <= 2600 && order.len() < pods.len(), "{order:?}");
    }
}
