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
use std::sync::Arc;

use gpuslice_core::annotations::DeviceSelector;
use gpuslice_core::fit::{self, Ask, GpuRoom, NodeView, Rules, Shape};
use gpuslice_core::publication::NodePublication;
use gpuslice_core::selection::ModelSelector;
use gpuslice_core::topology::{self, Topology};

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
    pub gpus: Vec<GpuRoom>,
    /// Each GPU's identity, for requests that name GPUs or models; empty where GPUs have
    /// none (simulated clusters: GPU i is index i, and the node's model is `model`).
    pub ids: Arc<[GpuId]>,
    /// The node agent's rules.
    pub rules: Rules,
    /// How the GPUs are connected, when the agent publishes it.
    pub topology: Option<Arc<Topology>>,
    /// The kinds of GPU pods placed on the node ([`paper::kind`], or-ed), for the
    /// gpu-clustering baseline; 0 where unknown.
    pub kinds: u64,
}

impl NodeState {
    #[must_use]
    pub fn gpu_free_share(&self) -> f64 {
        self.gpus.iter().map(GpuRoom::free_share).sum()
    }

    /// The node as its agent publishes it. Host CPU and memory are left unconstrained:
    /// kube-scheduler checks them itself before the extender is asked.
    #[must_use]
    pub fn published(name: &str, p: &NodePublication) -> Self {
        Self {
            name: name.to_string(),
            model: 0,
            cpu_total: u64::MAX / 2,
            cpu_free: u64::MAX / 2,
            mem_total: u64::MAX / 2,
            mem_free: u64::MAX / 2,
            gpus: p.gpus.iter().map(|g| g.room()).collect(),
            ids: (0..p.gpus.len())
                .map(|i| GpuId {
                    index: p.index(i),
                    uuid: p.gpus[i].uuid.clone(),
                    model: p.gpus[i].model.clone(),
                })
                .collect(),
            rules: p.rules(),
            topology: NodeView::topology(p).cloned().map(Arc::new),
            kinds: 0,
        }
    }
}

/// A GPU's identity on its node, as its agent publishes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuId {
    /// Its index on the node (NVML order).
    pub index: u32,
    pub uuid: String,
    /// Its model name (NVML's).
    pub model: String,
}

impl NodeView for NodeState {
    fn gpu_count(&self) -> usize {
        self.gpus.len()
    }
    fn room(&self, pos: usize) -> GpuRoom {
        self.gpus[pos]
    }
    fn index(&self, pos: usize) -> u32 {
        self.ids
            .get(pos)
            .map_or_else(|| u32::try_from(pos).unwrap_or(u32::MAX), |id| id.index)
    }
    fn uuid(&self, pos: usize) -> &str {
        self.ids.get(pos).map_or("", |id| id.uuid.as_str())
    }
    fn model(&self, pos: usize) -> &str {
        self.ids.get(pos).map_or("", |id| id.model.as_str())
    }
    fn rules(&self) -> Rules {
        self.rules
    }
    fn topology(&self) -> Option<&Topology> {
        self.topology
            .as_deref()
            .filter(|t| t.covers(self.gpus.len()))
    }
}

/// What a pod asks for: host resources, and per GPU either a whole GPU or a slice.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Demand {
    pub cpu: u64,
    pub mem: u64,
    /// GPUs wanted (0 for a pod without GPUs).
    pub gpus: u32,
    /// What it asks of each GPU.
    pub shape: Shape,
    /// The GPUs it names (`gpuslice.io/devices`); empty for any.
    pub devices: Vec<DeviceSelector>,
    /// The GPUs it avoids (`gpuslice.io/devices` with `!`).
    pub avoid: Vec<DeviceSelector>,
    /// The GPU models it accepts by name (`gpuslice.io/gpu-model`), matched against each
    /// GPU's published model.
    pub gpu_models: ModelSelector,
    /// Bit set of the node models the pod accepts in the simulator's model table (traces
    /// name a model per node); None for any.
    pub models: Option<u64>,
}

impl Demand {
    /// Whether it names or avoids GPUs (by UUID or index): which GPU is which matters to it.
    #[must_use]
    pub fn names_gpus(&self) -> bool {
        !self.devices.is_empty() || !self.avoid.is_empty()
    }

    /// The GPU share this demand takes (whole GPUs count 1 each).
    #[must_use]
    pub fn gpu_share(&self, memory_total: u64) -> f64 {
        if self.shape.exclusive {
            return f64::from(self.gpus);
        }
        let mem = self.shape.memory.bytes_of(memory_total) as f64 / memory_total.max(1) as f64;
        f64::from(self.gpus) * mem.max(f64::from(self.shape.cores) / 100.0)
    }

    /// The fit model's reading of this demand.
    #[must_use]
    pub fn ask(&self) -> Ask<'_> {
        Ask {
            shape: self.shape,
            gpus: self.gpus,
            devices: &self.devices,
            avoid: &self.avoid,
            models: &self.gpu_models,
        }
    }

    /// Whether the node has the host resources, the model and enough GPUs the pod may use.
    fn host_fits(&self, n: &NodeState) -> bool {
        self.cpu <= n.cpu_free
            && self.mem <= n.mem_free
            && self.models.is_none_or(|m| m & (1 << n.model) != 0)
            && self.gpus as usize <= n.gpus.len()
            && (!self.names_gpus() && self.gpu_models.is_any() || self.selectable(n))
    }

    /// Whether enough of the node's GPUs are ones the pod may use (named, not avoided, of
    /// an accepted model), whatever their room.
    fn selectable(&self, n: &NodeState) -> bool {
        let ask = self.ask();
        let usable = (0..n.gpus.len())
            .filter(|&p| fit::eligible(&ask, n, p))
            .count();
        usable >= self.gpus as usize
    }

    fn gpu_class(&self) -> GpuClass {
        GpuClass {
            gpus: self.gpus,
            shape: self.shape,
        }
    }
}

/// The GPU part of a demand: what decides whether a GPU is a fragment for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct GpuClass {
    gpus: u32,
    shape: Shape,
}

/// How each pod seen counts in the mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Weighting {
    /// One per pod, as the FGD paper weighs task popularity: the measure is then the GPU
    /// share the next pod to arrive could not use, and a large pod's GPUs count once, in
    /// the share stranded for it.
    #[default]
    Pods,
    /// One per pod for its arrival and one more per GPU it asks for (a whole 8-GPU pod
    /// weighs 9, a half-GPU pod 1.5).
    PodsAndGpus,
    /// By the GPUs it asks for only (a pod without GPUs does not count).
    GpuDemand,
}

/// The task classes seen so far and how much of the workload each is: the workload
/// fragmentation is measured against.
///
/// Two things make it adapt to the workload it sees rather than to one trace. Recent pods
/// count more: with a half-life set, a pod's weight halves each time pods asking for that many
/// GPUs in all have arrived after it. And each type is weighed by the scarcity of what it can
/// use ([`TaskMix::weigh_by_scarcity`]).
#[derive(Debug, Clone, Default)]
pub struct TaskMix {
    weighting: Weighting,
    /// Each type: its demand, its GPU class, its weight (decayed), its scarcity factor.
    types: Vec<MixType>,
    index: HashMap<Demand, usize>,
    classes: Vec<GpuClass>,
    class_index: HashMap<GpuClass, usize>,
    /// Sum of the types' weights.
    total: f64,
    /// Sum of the types' weights times their scarcity factors: what fragmentation is a mean
    /// over.
    scaled_total: f64,
    /// GPUs (in whole-GPU shares) whose arrival halves the weight of the pods seen before;
    /// None: no decay.
    half_life: Option<f64>,
    /// What a pod arriving now weighs per unit of its weighting (grows instead of every older
    /// weight shrinking; all are rescaled before it overflows).
    clock: f64,
    /// The FGD paper's reading of pods without GPUs: all of a node's free GPU share is a
    /// fragment to them (a constant per pod placed, which moves where its score is cut to an
    /// integer). Only in [`TaskMix::typical`], for the `fgd` baseline.
    gpuless_see_fragments: bool,
    /// What the pods with GPUs seen ask in all, each pod counted once (decayed alike): the
    /// workload's CPU and memory per GPU share ([`TaskMix::host_room`]).
    gpu_pods: HostDemand,
    /// Whether GPU share a node's CPU or memory cannot feed is left out of the measure, as
    /// in the paper (its `fgd` baseline only).
    paper_host_check: bool,
}

/// CPU, memory and GPU share asked in all by a set of pods.
#[derive(Debug, Clone, Copy, Default)]
struct HostDemand {
    cpu: f64,
    mem: f64,
    gpu: f64,
}

#[derive(Debug, Clone)]
struct MixType {
    demand: Demand,
    class: usize,
    weight: f64,
    scarcity: f64,
}

/// GPU memory a slice given in bytes is measured against when weighing it.
const REFERENCE_GPU_MEMORY: u64 = 16 << 30;

/// Pods between two measures of each type's scarcity (a pass over the nodes), in the
/// simulator and the extender alike. The shares move little in 20 pods: measuring at every
/// decision changed the openb figures by less than their spread between seeds, every 100
/// made them worse by about as much.
pub const SCARCITY_EVERY: usize = 20;

/// Past this, the decay clock is folded into the weights.
const CLOCK_RESCALE: f64 = 1e100;

impl TaskMix {
    #[must_use]
    pub fn new(weighting: Weighting) -> Self {
        Self {
            weighting,
            clock: 1.0,
            ..Self::default()
        }
    }

    /// What one pod of `d` counts for in the mix (before decay).
    fn unit(&self, d: &Demand) -> f64 {
        let gpus = d.gpu_share(REFERENCE_GPU_MEMORY);
        match self.weighting {
            Weighting::Pods => 1.0,
            Weighting::GpuDemand => gpus,
            Weighting::PodsAndGpus => 1.0 + gpus,
        }
    }

    /// Makes older pods count less: a pod's weight halves once pods asking for `gpus` whole
    /// GPUs in all have arrived after it. The simulator and the extender set it to the
    /// cluster's GPU count: the workload that matters is the one that will fill the cluster.
    pub fn set_half_life(&mut self, gpus: f64) {
        self.half_life = (gpus.is_finite() && gpus > 0.0).then_some(gpus);
    }

    /// Counts one more pod of this demand.
    pub fn observe(&mut self, d: &Demand) {
        let gpus = d.gpu_share(REFERENCE_GPU_MEMORY);
        let unit = self.unit(d);
        if unit == 0.0 {
            return;
        }
        if self.clock == 0.0 {
            self.clock = 1.0;
        }
        if let Some(h) = self.half_life {
            self.clock *= (gpus / h).exp2();
            if self.clock > CLOCK_RESCALE {
                self.rescale();
            }
        }
        self.add(d, unit * self.clock);
    }

    /// Counts `w` more of this demand.
    fn add(&mut self, d: &Demand, w: f64) {
        self.total += w;
        let share = d.gpu_share(REFERENCE_GPU_MEMORY);
        if share > 0.0 {
            let pods = w / self.unit(d);
            self.gpu_pods.cpu += pods * d.cpu as f64;
            self.gpu_pods.mem += pods * d.mem as f64;
            self.gpu_pods.gpu += pods * share;
        }
        if let Some(&i) = self.index.get(d) {
            let t = &mut self.types[i];
            t.weight += w;
            self.scaled_total += w * t.scarcity;
            return;
        }
        let class = d.gpu_class();
        let c = *self.class_index.entry(class).or_insert_with(|| {
            self.classes.push(class);
            self.classes.len() - 1
        });
        self.index.insert(d.clone(), self.types.len());
        self.types.push(MixType {
            demand: d.clone(),
            class: c,
            weight: w,
            scarcity: 1.0,
        });
        self.scaled_total += w;
    }

    /// The FGD paper's target workload, for its `fgd` baseline: every pod of the list counted
    /// once, then only the most common types that together make up `popularity` of the pods
    /// (its "typical pods", 95% in its experiments), with no decay and no scarcity.
    #[must_use]
    pub fn typical<'a>(demands: impl IntoIterator<Item = &'a Demand>, popularity: f64) -> Self {
        let mut all = Self::new(Weighting::Pods);
        for d in demands {
            all.observe(d);
        }
        let mut by_count: Vec<&MixType> = all.types.iter().collect();
        by_count.sort_by(|a, b| b.weight.total_cmp(&a.weight));
        let mut mix = Self::new(Weighting::Pods);
        mix.gpuless_see_fragments = true;
        mix.paper_host_check = true;
        let mut kept = 0.0;
        for t in by_count {
            if kept >= popularity * all.total {
                break;
            }
            kept += t.weight;
            mix.add(&t.demand, t.weight);
        }
        mix
    }

    /// Folds the decay clock into the weights (shares unchanged).
    fn rescale(&mut self) {
        let k = self.clock;
        for t in &mut self.types {
            t.weight /= k;
        }
        self.total /= k;
        self.scaled_total /= k;
        self.gpu_pods.cpu /= k;
        self.gpu_pods.mem /= k;
        self.gpu_pods.gpu /= k;
        self.clock = 1.0;
    }

    /// Weighs each type by the scarcity of the capacity it can use, measured on `nodes`: the
    /// free GPU share of the cluster over the free share the type could use (on nodes that
    /// can host it, of GPUs that fit it). A type that can use a tenth of what is free counts
    /// ten times for each unit; one that can use all of it, or nothing (it fails anywhere, and
    /// counts alike wherever the pod goes), counts once.
    ///
    /// Why: a placement changes each type's usable capacity, and frag-aware minimises the
    /// loss weighed by the types' shares of the workload. Weighed by share over usable
    /// capacity, that is each type's demand per unit of capacity it can use: taking room that
    /// only a few types can use, and that they need, costs more than taking room everyone
    /// can use. Without it, pods that could go anywhere filled the nodes of a model that other
    /// pods asked for by name (on the openb trace where a tenth of the GPU pods name a model,
    /// pods naming T4 failed from 25% arrived on).
    ///
    /// Each node comes with the number of nodes it stands for (1, or more for nodes alike).
    pub fn weigh_by_scarcity<'a>(
        &mut self,
        nodes: impl IntoIterator<Item = (&'a NodeState, usize)>,
    ) {
        let mut usable = vec![0.0; self.types.len()];
        let mut free_total = 0.0;
        let mut per_class = vec![0.0; self.classes.len()];
        for (n, count) in nodes {
            let free = n.gpu_free_share();
            if free == 0.0 || count == 0 {
                continue;
            }
            let times = count as f64;
            free_total += free * times;
            for (slot, c) in per_class.iter_mut().zip(&self.classes) {
                *slot = class_fragment(n, c, free);
            }
            let room = self.host_room(n);
            for (u, t) in usable.iter_mut().zip(&self.types) {
                if t.demand.gpus > 0 && t.demand.host_fits(n) {
                    *u += usable_share(free, per_class[t.class], room) * times;
                }
            }
        }
        self.scaled_total = 0.0;
        for (t, u) in self.types.iter_mut().zip(usable) {
            t.scarcity = if t.demand.gpus == 0 || u <= TIE {
                1.0
            } else {
                (free_total / u).max(1.0)
            };
            self.scaled_total += t.weight * t.scarcity;
        }
    }

    /// The GPU share that `node`'s free CPU and memory can still feed: each over what the
    /// pods with GPUs seen ask of it per GPU share (unbounded before any is seen, or in the
    /// `fgd` baseline).
    ///
    /// Why: GPU share is only ever taken by pods that bring their CPU and memory along. A
    /// node left with more free GPU than its CPU can feed at the workload's CPU per GPU
    /// share will strand the rest, even while each type still fits one pod there (all the
    /// paper's measure checks). Placing a pod heavy in CPU where CPU is short strands GPU
    /// share by that measure; where CPU is plentiful it strands nothing.
    fn host_room(&self, node: &NodeState) -> f64 {
        let HostDemand { cpu, mem, gpu } = self.gpu_pods;
        let mut room = f64::INFINITY;
        if self.paper_host_check || gpu <= 0.0 {
            return room;
        }
        if cpu > 0.0 {
            room = room.min(node.cpu_free as f64 * gpu / cpu);
        }
        if mem > 0.0 {
            room = room.min(node.mem_free as f64 * gpu / mem);
        }
        room
    }

    /// Whether a type of the mix names or avoids GPUs (by UUID or index).
    #[must_use]
    pub fn names_gpus(&self) -> bool {
        self.types.iter().any(|t| t.demand.names_gpus())
    }

    /// How far this mix's distribution over demands is from `other`'s: the total variation
    /// distance (half the sum of the differences of the shares; 0 alike, 1 disjoint), each
    /// type's share being its weight times its scarcity. Fragmentation is measured against
    /// these shares, so mixes at distance 0 score every placement alike.
    #[must_use]
    pub fn distance(&self, other: &TaskMix) -> f64 {
        let share = |m: &TaskMix, t: &MixType| {
            if m.scaled_total > 0.0 {
                t.weight * t.scarcity / m.scaled_total
            } else {
                0.0
            }
        };
        let mut sum = 0.0;
        for t in &self.types {
            let theirs = other
                .index
                .get(&t.demand)
                .map_or(0.0, |&j| share(other, &other.types[j]));
            sum += (share(self, t) - theirs).abs();
        }
        for t in &other.types {
            if !self.index.contains_key(&t.demand) {
                sum += share(other, t);
            }
        }
        sum / 2.0
    }

    /// The total weight of the pods seen.
    #[must_use]
    pub fn weight(&self) -> f64 {
        self.total
    }

    /// Expected fragmentation of `node` (in GPU shares) under this mix: the mean over the
    /// types, by weight times scarcity, of the free share the type could not use there
    /// (GPUs it does not fit, and what the node's CPU and memory cannot feed:
    /// [`TaskMix::host_room`]).
    #[must_use]
    pub fn fragmentation(&self, node: &NodeState) -> f64 {
        let free = node.gpu_free_share();
        if free == 0.0 || self.scaled_total == 0.0 {
            return 0.0;
        }
        let room = self.host_room(node);
        let per_class: Vec<f64> = self
            .classes
            .iter()
            .map(|c| class_fragment(node, c, free))
            .collect();
        let sum: f64 = self
            .types
            .iter()
            .map(|t| {
                let f = if t.demand.gpus == 0 && self.gpuless_see_fragments {
                    free
                } else if t.demand.host_fits(node) {
                    if t.demand.gpus == 0 {
                        0.0
                    } else {
                        free - usable_share(free, per_class[t.class], room)
                    }
                } else {
                    free
                };
                f * t.weight * t.scarcity
            })
            .sum();
        sum / self.scaled_total
    }
}

/// Of a node's `free` GPU share, what a type with GPUs whose host fits could use: all but its
/// class's `fragment`, and no more than the node's host can feed (`room`).
fn usable_share(free: f64, fragment: f64, room: f64) -> f64 {
    (free - fragment).min(room)
}

/// Free GPU share of `node` that a pod of class `c` could not use.
fn class_fragment(node: &NodeState, c: &GpuClass, free: f64) -> f64 {
    if c.gpus == 0 {
        return 0.0;
    }
    let (mut fitting, mut stranded) = (0u32, 0.0);
    for g in &node.gpus {
        if fit::fit_gpu(&c.shape, g, &node.rules).is_ok() {
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
    GpuClustering,
    BestFit,
    /// The FGD paper's own policy as its simulator runs it, for comparison: fragmentation
    /// against the typical pods of the whole pod list known in advance
    /// ([`TaskMix::typical`]), an integer score, equal scores to the node whose name sorts
    /// first.
    Fgd,
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
            // Spread means spreading pods over nodes, as in a pod's node policy; within a
            // node, GPUs are binpacked (as the agent does by default) unless asked otherwise.
            "spread" | "spread-binpack" => Self::Axes {
                node: Spread,
                gpu: Binpack,
            },
            "spread-spread" => Self::Axes {
                node: Spread,
                gpu: Spread,
            },
            "binpack-spread" => Self::Axes {
                node: Binpack,
                gpu: Spread,
            },
            "random" => Self::Random,
            "dot-product" => Self::DotProduct,
            "gpu-packing" => Self::GpuPacking,
            "gpu-clustering" => Self::GpuClustering,
            "best-fit" => Self::BestFit,
            "fgd" => Self::Fgd,
            "frag-aware" => Self::FragAware,
            _ => {
                return Err(format!(
                    "unknown policy {s:?} (random, dot-product, gpu-packing, gpu-clustering, best-fit, fgd, binpack, spread, binpack-spread, spread-binpack, spread-spread, frag-aware)"
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
    let Some(fitting) = fitting_gpus(node, d) else {
        return Vec::new();
    };
    if !d.devices.is_empty() {
        // Named GPUs: exactly those.
        return vec![fitting];
    }
    let k = d.gpus as usize;
    if d.shape.exclusive {
        let mut set = topology::closest_set(NodeView::topology(node), &fitting, k);
        set.sort_unstable();
        return vec![set];
    }
    if d.gpus > 1 {
        // The fullest GPUs first; with a topology, the closest set, the fullest among equals.
        let mut by_fill = fitting;
        by_fill.sort_by(|&a, &b| {
            node.gpus[a]
                .free_share()
                .total_cmp(&node.gpus[b].free_share())
                .then(a.cmp(&b))
        });
        let mut set = topology::closest_set(NodeView::topology(node), &by_fill, k);
        set.sort_unstable();
        return vec![set];
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

/// The GPUs of `node` that can take `d`'s share each, in index order; None when too few can.
fn fitting_gpus(node: &NodeState, d: &Demand) -> Option<Vec<usize>> {
    let mut fitting: Vec<usize> = Vec::new();
    fit::fit_node(&d.ask(), node, |pos, _| fitting.push(pos)).ok()?;
    Some(fitting)
}

/// Whether `d` fits on `node` now (without saying where).
#[must_use]
pub fn fits(node: &NodeState, d: &Demand) -> bool {
    if !d.host_fits(node) {
        return false;
    }
    d.gpus == 0 || fit::fits_node(&d.ask(), node)
}

/// Takes what `d` asks for from `node` on `gpus`.
pub fn apply(node: &mut NodeState, d: &Demand, gpus: &[usize]) {
    node.cpu_free -= d.cpu.min(node.cpu_free);
    node.mem_free -= d.mem.min(node.mem_free);
    node.kinds |= paper::kind(d);
    for &i in gpus {
        let g = &mut node.gpus[i];
        if let Ok(take) = fit::fit_gpu(&d.shape, g, &node.rules) {
            g.take(take, d.shape.exclusive);
        }
    }
}

/// `node` once `d` is placed on `gpus` (its name left out: only capacities matter here).
fn after(node: &NodeState, d: &Demand, gpus: &[usize]) -> NodeState {
    let mut n = NodeState {
        name: String::new(),
        gpus: node.gpus.clone(),
        ids: Arc::clone(&node.ids),
        topology: node.topology.clone(),
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
        // A node uniformly among those that fit; on it, a slice goes on any fitting GPU
        // uniformly, whole GPUs on the policy-free set (as the paper's random baseline).
        let (node, c) = &options[random(options.len())];
        let shared = d.gpus == 1 && !d.shape.exclusive && d.devices.is_empty();
        let gpus = match fitting_gpus(&nodes[*node], d) {
            Some(fitting) if shared && !fitting.is_empty() => {
                vec![fitting[random(fitting.len())]]
            }
            _ => c[0].clone(),
        };
        return Some(Placement { node: *node, gpus });
    }
    if paper::is_paper_policy(policy) {
        return paper::pick(nodes, &options, d, policy, mix);
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
    // gpuslice's own policies put a pod for several GPUs where they are closest first.
    let apart = || apart(node, gpus) * TOPOLOGY_STEP;
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
            (apart() + node_score, gpu_score)
        }
        ClusterPolicy::FragAware => (apart() + mix.fragmentation(&next) - frag_before, node_left),
        // The paper's baselines score nodes themselves (`paper`); on a node, best fit.
        _ => (0.0, gpu_left),
    }
}

/// How much a step of [`apart`] weighs in a score: more than any policy's own measure moves
/// on one node, so that a pod for several GPUs goes where its GPUs are closest, the policy
/// deciding among nodes where they are equally close.
const TOPOLOGY_STEP: f64 = 1000.0;

/// How far apart `gpus` are on `node` (0 for one GPU or a node without a topology): the
/// step of their [`topology::Reach`] (0 all NVLink, 1 one NUMA node, 2 across).
fn apart(node: &NodeState, gpus: &[usize]) -> f64 {
    NodeView::topology(node)
        .filter(|_| gpus.len() > 1)
        .map_or(0.0, |t| f64::from(t.reach(gpus) as u8))
}

mod paper;
#[cfg(test)]
mod tests;
