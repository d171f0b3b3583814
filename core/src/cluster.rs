//! Cluster placement: which node, and which GPUs on it, a pod gets. Policies on two axes
//! (node and GPU, binpack or spread), the classic baselines, and fragmentation-aware placement
//! (the FGD measure of "Beware of Fragmentation", ATC'23, over GPUs with memory and SM share).
//!
//! A GPU's free capacity is measured as its free share: the smaller of its free memory and free
//! SM share, each as a fraction of the GPU. For a task class, a GPU whose free capacity cannot
//! host the class is a fragment, and so is every free share of a node that cannot host the
//! class at all (CPU, memory, GPU model, too few GPUs). A node's expected fragmentation is the
//! mean over the task classes seen so far, weighted by how often each was seen; frag-aware
//! placement picks the candidate that grows it least. Ties break deterministically: the lower
//! node index, then the lower GPU indexes.

use std::collections::HashMap;

use crate::quantity::MemoryQuantity;

/// One GPU as the scheduler sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuState {
    pub memory_total: u64,
    pub memory_free: u64,
    pub cores_free: u32,
    pub sharers: u32,
    /// Held whole by one pod.
    pub exclusive: bool,
}

impl GpuState {
    #[must_use]
    pub fn idle(memory_total: u64) -> Self {
        Self {
            memory_total,
            memory_free: memory_total,
            cores_free: 100,
            sharers: 0,
            exclusive: false,
        }
    }

    /// Free capacity as a share of the GPU (0..=1): the scarcer of memory and SMs.
    #[must_use]
    pub fn free_share(&self) -> f64 {
        if self.exclusive || self.memory_total == 0 {
            return 0.0;
        }
        let mem = self.memory_free as f64 / self.memory_total as f64;
        mem.min(f64::from(self.cores_free) / 100.0)
    }

    fn untouched(&self) -> bool {
        self.sharers == 0 && !self.exclusive
    }
}

/// One node: host resources left and its GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeState {
    pub name: String,
    /// Index of the GPU model in the cluster's model table.
    pub model: u32,
    pub cpu_total: u64,
    pub cpu_free: u64,
    pub mem_total: u64,
    pub mem_free: u64,
    pub gpus: Vec<GpuState>,
}

impl NodeState {
    #[must_use]
    pub fn gpu_free_share(&self) -> f64 {
        self.gpus.iter().map(GpuState::free_share).sum()
    }
}

/// What a pod asks for: host resources, and per GPU either a whole GPU or a slice.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Demand {
    pub cpu: u64,
    pub mem: u64,
    /// GPUs wanted (0 for a pod without GPUs).
    pub gpus: u32,
    pub exclusive: bool,
    /// Per GPU, for slices.
    pub memory: MemoryQuantity,
    /// Per GPU, percent of the SMs, for slices.
    pub cores: u32,
    /// Bit set of the GPU models the pod accepts; None for any.
    pub models: Option<u64>,
}

impl Demand {
    /// The GPU share this demand takes (whole GPUs count 1 each).
    #[must_use]
    pub fn gpu_share(&self, memory_total: u64) -> f64 {
        if self.exclusive {
            return f64::from(self.gpus);
        }
        let mem = self.memory.bytes_of(memory_total) as f64 / memory_total.max(1) as f64;
        f64::from(self.gpus) * mem.max(f64::from(self.cores) / 100.0)
    }

    fn host_fits(&self, n: &NodeState) -> bool {
        self.cpu <= n.cpu_free
            && self.mem <= n.mem_free
            && self.models.is_none_or(|m| m & (1 << n.model) != 0)
            && self.gpus as usize <= n.gpus.len()
    }

    /// What this demand takes on GPU `g`, if it fits there.
    fn gpu_fit(&self, g: &GpuState) -> Option<(u64, u32)> {
        if self.exclusive {
            return g.untouched().then_some((g.memory_total, 100));
        }
        if g.exclusive {
            return None;
        }
        let m = self.memory.bytes_of(g.memory_total);
        (m > 0 && m <= g.memory_free && self.cores <= g.cores_free).then_some((m, self.cores))
    }

    fn gpu_class(&self) -> GpuClass {
        GpuClass {
            gpus: self.gpus,
            exclusive: self.exclusive,
            memory: self.memory,
            cores: self.cores,
        }
    }
}

/// The GPU part of a demand: what decides whether a GPU is a fragment for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct GpuClass {
    gpus: u32,
    exclusive: bool,
    memory: MemoryQuantity,
    cores: u32,
}

/// How each pod seen counts in the mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Weighting {
    /// One per pod for its arrival, as the FGD paper weighs task popularity, and one more per
    /// GPU it asks for, since stranding the room of a large pod costs the GPUs it would have
    /// used (a whole 8-GPU pod weighs 9, a half-GPU pod 1.5).
    #[default]
    PodsAndGpus,
    /// By the GPUs it asks for only (a pod without GPUs does not count).
    GpuDemand,
    /// One per pod, as the FGD paper.
    Pods,
}

/// The task classes seen so far and how much of the workload each is: the workload
/// fragmentation is measured against.
#[derive(Debug, Clone, Default)]
pub struct TaskMix {
    weighting: Weighting,
    types: Vec<(Demand, usize, f64)>,
    index: HashMap<Demand, usize>,
    classes: Vec<GpuClass>,
    class_index: HashMap<GpuClass, usize>,
    total: f64,
}

/// GPU memory a slice given in bytes is measured against when weighing it.
const REFERENCE_GPU_MEMORY: u64 = 16 << 30;

impl TaskMix {
    #[must_use]
    pub fn new(weighting: Weighting) -> Self {
        Self {
            weighting,
            ..Self::default()
        }
    }

    /// Counts one more pod of this demand.
    pub fn observe(&mut self, d: &Demand) {
        let w = match self.weighting {
            Weighting::Pods => 1.0,
            Weighting::GpuDemand => d.gpu_share(REFERENCE_GPU_MEMORY),
            Weighting::PodsAndGpus => 1.0 + d.gpu_share(REFERENCE_GPU_MEMORY),
        };
        if w == 0.0 {
            return;
        }
        self.total += w;
        if let Some(&i) = self.index.get(d) {
            self.types[i].2 += w;
            return;
        }
        let class = d.gpu_class();
        let c = *self.class_index.entry(class).or_insert_with(|| {
            self.classes.push(class);
            self.classes.len() - 1
        });
        self.index.insert(d.clone(), self.types.len());
        self.types.push((d.clone(), c, w));
    }

    /// How far this mix's distribution over demands is from `other`'s: the total variation
    /// distance (half the sum of the differences of the shares; 0 alike, 1 disjoint).
    /// Fragmentation is measured against shares, not weights, so mixes at distance 0 score
    /// every placement alike.
    #[must_use]
    pub fn distance(&self, other: &TaskMix) -> f64 {
        let share = |m: &TaskMix, w: f64| if m.total > 0.0 { w / m.total } else { 0.0 };
        let mut sum = 0.0;
        for (d, _, w) in &self.types {
            let theirs = other
                .index
                .get(d)
                .map_or(0.0, |&j| share(other, other.types[j].2));
            sum += (share(self, *w) - theirs).abs();
        }
        for (d, _, w) in &other.types {
            if !self.index.contains_key(d) {
                sum += share(other, *w);
            }
        }
        sum / 2.0
    }

    /// The total weight of the pods seen.
    #[must_use]
    pub fn weight(&self) -> f64 {
        self.total
    }

    /// Expected fragmentation of `node` (in GPU shares) under this mix.
    #[must_use]
    pub fn fragmentation(&self, node: &NodeState) -> f64 {
        let free = node.gpu_free_share();
        if free == 0.0 || self.total == 0.0 {
            return 0.0;
        }
        let per_class: Vec<f64> = self
            .classes
            .iter()
            .map(|c| class_fragment(node, c, free))
            .collect();
        let sum: f64 = self
            .types
            .iter()
            .map(|(d, c, n)| {
                let f = if d.host_fits(node) {
                    per_class[*c]
                } else {
                    free
                };
                f * *n
            })
            .sum();
        sum / self.total
    }
}

/// Free GPU share of `node` that a pod of class `c` could not use.
fn class_fragment(node: &NodeState, c: &GpuClass, free: f64) -> f64 {
    if c.gpus == 0 {
        return 0.0;
    }
    let (mut fitting, mut stranded) = (0u32, 0.0);
    // The slice's bytes per GPU size, computed once per size (a node's GPUs are alike).
    let mut want = (u64::MAX, 0u64);
    for g in &node.gpus {
        if want.0 != g.memory_total {
            want = (g.memory_total, c.memory.bytes_of(g.memory_total));
        }
        let fits = if c.exclusive {
            g.untouched()
        } else {
            !g.exclusive && want.1 > 0 && want.1 <= g.memory_free && c.cores <= g.cores_free
        };
        if fits {
            fitting += 1;
        } else {
            stranded += g.free_share();
        }
    }
    if fitting < c.gpus { free } else { stranded }
}

/// Where a pod goes: a node and the indexes of its GPUs there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub node: usize,
    pub gpus: Vec<usize>,
}

/// Cluster policies: the 2x2 of node and GPU binpack/spread, the classic baselines of the
/// fragmentation paper, and frag-aware.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClusterPolicy {
    /// Node and GPU each chosen by binpack or spread.
    Axes {
        node: Axis,
        gpu: Axis,
    },
    Random,
    DotProduct,
    GpuPacking,
    BestFit,
    FragAware,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Axis {
    Binpack,
    Spread,
}

impl std::str::FromStr for ClusterPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        use Axis::{Binpack, Spread};
        Ok(match s {
            "binpack" => Self::Axes {
                node: Binpack,
                gpu: Binpack,
            },
            "spread" => Self::Axes {
                node: Spread,
                gpu: Spread,
            },
            "binpack-spread" => Self::Axes {
                node: Binpack,
                gpu: Spread,
            },
            "spread-binpack" => Self::Axes {
                node: Spread,
                gpu: Binpack,
            },
            "random" => Self::Random,
            "dot-product" => Self::DotProduct,
            "gpu-packing" => Self::GpuPacking,
            "best-fit" => Self::BestFit,
            "frag-aware" => Self::FragAware,
            _ => {
                return Err(format!(
                    "unknown policy {s:?} (random, dot-product, gpu-packing, best-fit, binpack, spread, binpack-spread, spread-binpack, frag-aware)"
                ));
            }
        })
    }
}

/// The ways `d` can go on `node`: GPU index sets, equivalent ones listed once.
#[must_use]
pub fn candidates(node: &NodeState, d: &Demand) -> Vec<Vec<usize>> {
    if !d.host_fits(node) {
        return Vec::new();
    }
    if d.gpus == 0 {
        return vec![Vec::new()];
    }
    let fitting: Vec<usize> = (0..node.gpus.len())
        .filter(|&i| d.gpu_fit(&node.gpus[i]).is_some())
        .collect();
    if fitting.len() < d.gpus as usize {
        return Vec::new();
    }
    if d.exclusive {
        return vec![fitting[..d.gpus as usize].to_vec()];
    }
    if d.gpus > 1 {
        let mut by_fill = fitting;
        by_fill.sort_by(|&a, &b| {
            node.gpus[a]
                .free_share()
                .total_cmp(&node.gpus[b].free_share())
                .then(a.cmp(&b))
        });
        by_fill.truncate(d.gpus as usize);
        by_fill.sort_unstable();
        return vec![by_fill];
    }
    let mut seen: Vec<(u64, u32, u32)> = Vec::new();
    let mut out = Vec::new();
    for i in fitting {
        let g = &node.gpus[i];
        let key = (g.memory_free, g.cores_free, g.sharers);
        if !seen.contains(&key) {
            seen.push(key);
            out.push(vec![i]);
        }
    }
    out
}

/// Whether `d` fits on `node` now (without saying where).
#[must_use]
pub fn fits(node: &NodeState, d: &Demand) -> bool {
    if !d.host_fits(node) {
        return false;
    }
    if d.gpus == 0 {
        return true;
    }
    let fitting = node.gpus.iter().filter(|g| d.gpu_fit(g).is_some()).count();
    fitting >= d.gpus as usize
}

/// Takes what `d` asks for from `node` on `gpus`.
pub fn apply(node: &mut NodeState, d: &Demand, gpus: &[usize]) {
    node.cpu_free -= d.cpu.min(node.cpu_free);
    node.mem_free -= d.mem.min(node.mem_free);
    for &i in gpus {
        let g = &mut node.gpus[i];
        if let Some((m, c)) = d.gpu_fit(g) {
            g.memory_free -= m;
            g.cores_free -= c;
            g.sharers += 1;
            g.exclusive = d.exclusive;
        }
    }
}

/// `node` once `d` is placed on `gpus` (its name left out: only capacities matter here).
fn after(node: &NodeState, d: &Demand, gpus: &[usize]) -> NodeState {
    let mut n = NodeState {
        name: String::new(),
        gpus: node.gpus.clone(),
        ..*node
    };
    apply(&mut n, d, gpus);
    n
}

/// Scores closer than this are equal (sums of fractions differ in their last bits).
const TIE: f64 = 1e-9;

/// Chooses where `d` goes among `nodes`, or None when no node can take it. `random(n)` gives
/// a uniform index below n (used by the random policy only).
pub fn choose(
    nodes: &[NodeState],
    d: &Demand,
    policy: ClusterPolicy,
    mix: &TaskMix,
    random: &mut dyn FnMut(usize) -> usize,
) -> Option<Placement> {
    let options: Vec<(usize, Vec<Vec<usize>>)> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (i, candidates(n, d)))
        .filter(|(_, c)| !c.is_empty())
        .collect();
    if options.is_empty() {
        return None;
    }
    if policy == ClusterPolicy::Random {
        let (node, c) = &options[random(options.len())];
        return Some(Placement {
            node: *node,
            gpus: c[random(c.len())].clone(),
        });
    }
    // Lower is better; the first of equal scores wins (lower node, then GPU indexes).
    let mut best: Option<(f64, f64, usize, &Vec<usize>)> = None;
    for (i, cands) in &options {
        let node = &nodes[*i];
        let before = match policy {
            ClusterPolicy::FragAware => mix.fragmentation(node),
            _ => 0.0,
        };
        for c in cands {
            let (primary, secondary) = score(node, d, c, policy, mix, before);
            let better = match &best {
                None => true,
                Some((p, s, ..)) => {
                    primary < *p - TIE || ((primary - *p).abs() <= TIE && secondary < *s - TIE)
                }
            };
            if better {
                best = Some((primary, secondary, *i, c));
            }
        }
    }
    best.map(|(_, _, node, gpus)| Placement {
        node,
        gpus: gpus.clone(),
    })
}

/// The best (node score, GPU score) `d` can get on `node` under `policy`, lower being better,
/// and the GPUs that get it; None when `d` does not fit. Not for the random policy.
#[must_use]
pub fn best_on_node(
    node: &NodeState,
    d: &Demand,
    policy: ClusterPolicy,
    mix: &TaskMix,
) -> Option<((f64, f64), Vec<usize>)> {
    let before = match policy {
        ClusterPolicy::FragAware => mix.fragmentation(node),
        _ => 0.0,
    };
    let mut best: Option<((f64, f64), Vec<usize>)> = None;
    for c in candidates(node, d) {
        let s = score(node, d, &c, policy, mix, before);
        let better = best.as_ref().is_none_or(|((p, q), _)| {
            s.0 < *p - TIE || ((s.0 - *p).abs() <= TIE && s.1 < *q - TIE)
        });
        if better {
            best = Some((s, c));
        }
    }
    best
}

/// (node score, GPU score) of a candidate under `policy`; lower is better.
fn score(
    node: &NodeState,
    d: &Demand,
    gpus: &[usize],
    policy: ClusterPolicy,
    mix: &TaskMix,
    frag_before: f64,
) -> (f64, f64) {
    let next = after(node, d, gpus);
    let gpu_left: f64 = gpus.iter().map(|&i| next.gpus[i].free_share()).sum();
    let node_left = next.gpu_free_share();
    let frac = |free: u64, total: u64| free as f64 / total.max(1) as f64;
    match policy {
        ClusterPolicy::Axes { node: n, gpu: g } => {
            let node_score = match n {
                Axis::Binpack => node_left,
                Axis::Spread => -node_left,
            };
            let gpu_score = match g {
                Axis::Binpack => gpu_left,
                Axis::Spread => -gpu_left,
            };
            (node_score, gpu_score)
        }
        ClusterPolicy::BestFit => {
            let gpus = node.gpus.len().max(1) as f64;
            let left = frac(next.cpu_free, node.cpu_total)
                + frac(next.mem_free, node.mem_total)
                + node_left / gpus;
            (left, gpu_left)
        }
        ClusterPolicy::DotProduct => {
            // Alignment of the request with what the node has free (Tetris): larger is better.
            let gpus = node.gpus.len().max(1) as f64;
            let req_gpu = gpus_share(node, d, gpus);
            let dot = frac(d.cpu, node.cpu_total) * frac(node.cpu_free, node.cpu_total)
                + frac(d.mem, node.mem_total) * frac(node.mem_free, node.mem_total)
                + req_gpu * (node.gpu_free_share() / gpus);
            (-dot, gpu_left)
        }
        ClusterPolicy::GpuPacking => {
            // Shared GPUs first, then idle GPUs of busy nodes, then idle nodes.
            let on_used = gpus.iter().any(|&i| node.gpus[i].sharers > 0);
            let busy = node.gpus.iter().any(|g| !g.untouched());
            let tier = if on_used {
                0.0
            } else if busy {
                1.0
            } else {
                2.0
            };
            (tier, gpu_left)
        }
        ClusterPolicy::FragAware => (mix.fragmentation(&next) - frag_before, node_left),
        ClusterPolicy::Random => (0.0, 0.0),
    }
}

fn gpus_share(node: &NodeState, d: &Demand, gpus: f64) -> f64 {
    let total = node.gpus.first().map_or(1, |g| g.memory_total);
    d.gpu_share(total) / gpus
}

#[cfg(test)]
mod tests;

/// The Node annotation on which a node agent publishes its GPUs for the cluster scheduler.
pub const NODE_STATE_ANNOTATION: &str = "gpuslice.io/node-state";

/// What a node agent publishes on its Node: each GPU and what is allocated on it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodePublication {
    pub version: u32,
    pub gpus: Vec<PublishedGpu>,
    /// The containers holding a claim made by a scheduler assignment, as
    /// [`assigned_container`] keys, sorted: once a container shows here, its slice is in
    /// `gpus` and the scheduler stops counting its own placement of it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claimed: Vec<String>,
}

/// How a publication names a container placed by the scheduler: `<pod UID>/<container>`.
#[must_use]
pub fn assigned_container(pod_uid: &str, container: &str) -> String {
    format!("{pod_uid}/{container}")
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PublishedGpu {
    pub uuid: String,
    #[serde(default)]
    pub model: String,
    pub memory_total: u64,
    pub memory_allocated: u64,
    pub cores_allocated: u32,
    pub sharers: u32,
    pub exclusive: bool,
}

impl NodePublication {
    /// The node as placement sees it. Host CPU and memory are left unconstrained: kube-scheduler
    /// checks them itself before the extender is asked.
    #[must_use]
    pub fn node_state(&self, name: &str) -> NodeState {
        NodeState {
            name: name.to_string(),
            model: 0,
            cpu_total: u64::MAX / 2,
            cpu_free: u64::MAX / 2,
            mem_total: u64::MAX / 2,
            mem_free: u64::MAX / 2,
            gpus: self
                .gpus
                .iter()
                .map(|g| GpuState {
                    memory_total: g.memory_total,
                    memory_free: g.memory_total.saturating_sub(g.memory_allocated),
                    cores_free: 100u32.saturating_sub(g.cores_allocated),
                    sharers: g.sharers,
                    exclusive: g.exclusive,
                })
                .collect(),
        }
    }
}
