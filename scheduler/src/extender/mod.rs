//! The kube-scheduler extender: filter and prioritize over the GPUs each node agent publishes
//! on its Node (`gpuslice.io/node-state`). With `nodeCacheCapable: false` the Nodes come in
//! each request; with `true` only their names do, and the extender answers from its node
//! cache.

pub mod bind;
pub mod http;
pub mod metrics;
pub mod watch;
pub mod wire;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use gpuslice_core::annotations::{self, SliceRequest};
use gpuslice_core::assignment::Assignment;
use gpuslice_core::cluster::{
    self, ClusterPolicy, Demand, NODE_STATE_ANNOTATION, NodePublication, NodeState, TaskMix,
};
use gpuslice_core::placement::Policy;
use gpuslice_core::quantity::MemoryQuantity;
use gpuslice_core::resources::{self, Declared, Resolved};
use serde_json::Value;

use wire::{ExtenderArgs, ExtenderFilterResult, HostPriority, MAX_EXTENDER_PRIORITY, NodeList};

/// What a pod asks of the cluster.
#[derive(Debug, Clone, PartialEq)]
pub enum PodRequest {
    /// No gpuslice annotations: not this extender's business.
    None,
    /// One demand per container that asks for a slice, and the pod's node policy.
    Slices(Vec<Demand>, Option<ClusterPolicy>),
    /// Annotations no node can satisfy because they are malformed.
    Invalid(String),
}

/// The request of a pod: each container of `spec.containers` claims its own slice.
#[must_use]
pub fn pod_request(pod: &Value) -> PodRequest {
    match pod_slices(pod) {
        Err(e) => PodRequest::Invalid(e),
        Ok(p) if p.containers.is_empty() => PodRequest::None,
        Ok(p) => PodRequest::Slices(
            p.containers.into_iter().map(|c| c.demand).collect(),
            p.policy,
        ),
    }
}

/// A container that asks for a slice.
pub struct ContainerSlice {
    pub name: String,
    pub demand: Demand,
    /// Its annotations and declared resources put together.
    pub resolved: Resolved,
}

/// What a pod's containers ask for, and the pod's node policy.
pub struct PodSlices {
    pub containers: Vec<ContainerSlice>,
    pub policy: Option<ClusterPolicy>,
}

impl PodSlices {
    /// The annotations bind writes so that the node sees what the declared resources said:
    /// none when the annotations said it all, else every slice container's request in full
    /// (naming every container keeps the others' GPUs once per-container keys exist).
    #[must_use]
    pub fn annotations_to_write(&self) -> BTreeMap<String, String> {
        if !self.containers.iter().any(|c| c.resolved.completed) {
            return BTreeMap::new();
        }
        self.containers
            .iter()
            .flat_map(|c| c.resolved.annotations(&c.name))
            .collect()
    }
}

/// Each container that asks for a slice, by its annotations or its declared extended
/// resources (`gpuslice.io/gpu-memory`, `gpuslice.io/gpu-cores`), and the pod's node policy.
pub fn pod_slices(pod: &Value) -> Result<PodSlices, String> {
    let mut ann = wire::annotations(pod);
    let empty = Vec::new();
    let containers = pod["spec"]["containers"].as_array().unwrap_or(&empty);
    let mut slices = Vec::new();
    let policy = pod_node_policy(&ann)?;
    for c in containers {
        let Some(name) = c["name"].as_str() else {
            continue;
        };
        ann.insert(
            annotations::CRI_CONTAINER_NAME.to_string(),
            name.to_string(),
        );
        let request = annotations::parse(&ann).map_err(|e| e.to_string())?;
        let declared = Declared::of_container(c).map_err(|e| e.to_string())?;
        let Some(resolved) =
            resources::resolve(name, request, declared).map_err(|e| e.to_string())?
        else {
            continue;
        };
        slices.push(ContainerSlice {
            name: name.to_string(),
            demand: demand(&resolved.request)?,
            resolved,
        });
    }
    Ok(PodSlices {
        containers: slices,
        policy,
    })
}

/// The pod's `gpuslice.io/node-policy`, however its containers ask for their slices.
fn pod_node_policy(ann: &BTreeMap<String, String>) -> Result<Option<ClusterPolicy>, String> {
    let key = format!("{}{}", annotations::PREFIX, annotations::NODE_POLICY);
    ann.get(&key)
        .map(|v| {
            v.trim()
                .parse::<Policy>()
                .map(node_policy)
                .map_err(|e| format!("annotation {key}={v:?}: {e}"))
        })
        .transpose()
}

fn node_policy(p: Policy) -> ClusterPolicy {
    use cluster::Axis;
    match p {
        Policy::Binpack => ClusterPolicy::Axes {
            node: Axis::Binpack,
            gpu: Axis::Binpack,
        },
        Policy::Spread => ClusterPolicy::Axes {
            node: Axis::Spread,
            gpu: Axis::Binpack,
        },
        Policy::FragAware => ClusterPolicy::FragAware,
    }
}

fn demand(req: &SliceRequest) -> Result<Demand, String> {
    if !req.is_exclusive() && req.memory.is_none() {
        return Err(format!(
            "annotation {}: a shared slice needs a memory limit (leave out cores too for whole GPUs)",
            req.key(annotations::MEMORY)
        ));
    }
    Ok(Demand {
        cpu: 0,
        mem: 0,
        gpus: req.gpus,
        exclusive: req.is_exclusive(),
        memory: req.memory.unwrap_or(MemoryQuantity::Bytes(0)),
        cores: req.cores.unwrap_or(0),
        models: None,
    })
}

/// Why a node cannot take a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Misfit {
    /// Not now: what is allocated there would have to go first.
    Full(String),
    /// Never, even with the node empty: preemption would not help.
    Never(String),
}

/// Places `demands` one after the other on `node`, each on the GPUs binpack picks.
fn fit_all(node: &NodeState, demands: &[Demand]) -> Result<(), Misfit> {
    if let [d] = demands {
        return if cluster::fits(node, d) {
            Ok(())
        } else {
            Err(misfit(node, demands))
        };
    }
    let mut n = node.clone();
    let mix = TaskMix::default();
    let binpack: ClusterPolicy = "binpack".parse().unwrap_or(ClusterPolicy::FragAware);
    for d in demands {
        match cluster::best_on_node(&n, d, binpack, &mix) {
            Some((_, gpus)) => cluster::apply(&mut n, d, &gpus),
            None => return Err(misfit(node, demands)),
        }
    }
    Ok(())
}

/// Why `demands` do not fit `node`. The messages are the same for every node in the same
/// situation, so that kube-scheduler's event sums them up ("12 gpuslice: …") instead of
/// listing thousands of nodes.
fn misfit(node: &NodeState, demands: &[Demand]) -> Misfit {
    let mut probe = node.clone();
    for g in &mut probe.gpus {
        *g = cluster::GpuState::idle(g.memory_total);
    }
    let binpack: ClusterPolicy = "binpack".parse().unwrap_or(ClusterPolicy::FragAware);
    for d in demands {
        match cluster::best_on_node(&probe, d, binpack, &TaskMix::default()) {
            Some((_, gpus)) => cluster::apply(&mut probe, d, &gpus),
            None => {
                return Misfit::Never(
                    "gpuslice: even empty, this node's GPUs are too few or too small for the pod"
                        .into(),
                );
            }
        }
    }
    Misfit::Full("gpuslice: not enough free GPU memory or SMs on this node now".into())
}

/// A node of a request: its name, the Node object when the request carried it, and its
/// GPUs or why they are not known.
type Candidate = (String, Option<Value>, Result<Arc<Known>, Misfit>);

/// A node's GPUs as placement sees them, with a hash of them as a set (what its scores
/// depend on), computed once per publication rather than once per decision.
pub struct Known {
    pub state: NodeState,
    gpu_set: u64,
}

pub struct Extender {
    /// Nodes by name, as their agents last published them.
    cache: RwLock<HashMap<String, Arc<Known>>>,
    /// Pods seen (by UID) and the mix learned from them.
    mix: Mutex<(HashSet<String>, TaskMix)>,
    /// The mix frag-aware scores against: a snapshot, renewed when the learned mix has moved
    /// away from it by more than [`MIX_STALENESS`], so that scores can be reused between
    /// decisions.
    mix_view: Mutex<MixView>,
    /// Node scores by (mix generation, policy, demands, the node's GPUs as a set).
    scores: Mutex<(u64, ScoreMap)>,
    /// Held while bind places a pod and records the placement.
    placing: Mutex<()>,
    /// Placements bind made that the nodes' agents do not show yet, by node.
    assumed: Mutex<HashMap<String, Vec<Assumed>>>,
    default_policy: ClusterPolicy,
}

/// A container's slice placed by bind, counted on its node until the agent lists the
/// container in its publication's `claimed`.
struct Assumed {
    /// `<pod UID>/<container>`, as the agent will list it.
    container: String,
    demand: Demand,
    /// The GPUs' UUIDs.
    gpus: Vec<String>,
    since: Instant,
}

/// How long a placement counts without its agent showing it: long enough for kubelet to pull
/// an image and start the container. A pod deleted before it started holds its room that long.
pub const ASSUME_FOR: Duration = Duration::from_secs(15 * 60);

#[derive(Default)]
struct MixView {
    generation: u64,
    mix: Arc<TaskMix>,
}

/// Scores by a key already hashed with [`Mix64`].
type ScoreMap = HashMap<u64, Option<f64>, BuildHasherDefault<Mix64>>;

/// A fast multiply-rotate hasher (as FxHash) for keys this extender derives itself from node
/// states: not resistant to chosen inputs, which is fine for a cache of scores.
#[derive(Default, Clone, Copy)]
struct Mix64(u64);

impl Hasher for Mix64 {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
    fn finish(&self) -> u64 {
        // The multiply leaves the low bits poorly mixed, and hash tables index by them.
        self.0.rotate_left(26)
    }
}

/// How far (total variation distance) the learned mix may move from the snapshot scores are
/// computed against before the snapshot is renewed and the scores recomputed. Renewing when
/// the weight had grown by a twentieth bounded the distance by 0.048 and renewed ~60 times in
/// the first 200 pods even when the shares stood still; this bounds it by less and renews
/// only when the shares move.
const MIX_STALENESS: f64 = 0.04;

/// Scores kept between decisions before the memo starts afresh.
const SCORE_MEMO_LIMIT: usize = 200_000;

impl Extender {
    #[must_use]
    pub fn new(default_policy: ClusterPolicy) -> Self {
        Self {
            cache: RwLock::new(HashMap::new()),
            mix: Mutex::new((HashSet::new(), TaskMix::default())),
            mix_view: Mutex::new(MixView::default()),
            scores: Mutex::new((0, ScoreMap::default())),
            placing: Mutex::new(()),
            assumed: Mutex::new(HashMap::new()),
            default_policy,
        }
    }

    /// Sets what a node publishes (from the Node watch), or forgets it.
    pub fn update_node(&self, name: &str, publication: Option<NodePublication>) {
        match publication {
            Some(p) => self.take_in(name, &p),
            None => {
                if let Ok(mut c) = self.cache.write() {
                    c.remove(name);
                }
            }
        }
    }

    /// Caches node `name` as `publication` shows it, with the placements it does not show yet.
    fn take_in(&self, name: &str, publication: &NodePublication) {
        let known = Arc::new(self.known(name, publication));
        if let Ok(mut c) = self.cache.write() {
            c.insert(name.to_string(), known);
        }
    }

    /// A node as `publication` shows it, with the placements bind made there that it does
    /// not show yet. Placements it shows (or older than [`ASSUME_FOR`]) are forgotten.
    fn known(&self, name: &str, publication: &NodePublication) -> Known {
        let mut state = publication.node_state(name);
        if let Ok(mut assumed) = self.assumed.lock()
            && let Some(list) = assumed.get_mut(name)
        {
            list.retain(|a| {
                a.since.elapsed() < ASSUME_FOR && !publication.claimed.contains(&a.container)
            });
            for a in list.iter() {
                let gpus: Vec<usize> = a
                    .gpus
                    .iter()
                    .filter_map(|u| publication.gpus.iter().position(|g| g.uuid == *u))
                    .collect();
                if gpus.len() == a.gpus.len() {
                    cluster::apply(&mut state, &a.demand, &gpus);
                }
            }
            if list.is_empty() {
                assumed.remove(name);
            }
        }
        Known {
            gpu_set: gpu_set_hash(&Mix64::default(), &state),
            state,
        }
    }

    /// Nodes whose publication is known.
    #[must_use]
    pub fn nodes_known(&self) -> usize {
        self.cache.read().map_or(0, |c| c.len())
    }

    /// Pods the learned task mix counts.
    #[must_use]
    pub fn mix_pods(&self) -> usize {
        self.mix.lock().map_or(0, |m| m.0.len())
    }

    /// Takes in a pod found placed at start: counts it into the learned mix (once), and, when
    /// it carries an assignment signed with `key`, counts its placement on its node until the
    /// node's agent shows it, as bind would have (a restarted extender has not forgotten
    /// placements whose containers have not started yet). Call it before the node cache is
    /// filled: the placements count from the node's next publication on.
    pub fn learn_placed(&self, pod: &Value, key: Option<&[u8]>) {
        let Ok(slices) = pod_slices(pod) else {
            return;
        };
        let demands: Vec<Demand> = slices.containers.iter().map(|c| c.demand.clone()).collect();
        if demands.is_empty() {
            return;
        }
        self.observe(pod, &demands);
        let assignment_key = format!("{}{}", annotations::PREFIX, annotations::ASSIGNMENT);
        let (Some(key), Some(value)) = (key, wire::annotations(pod).remove(&assignment_key)) else {
            return;
        };
        let Ok(a) = Assignment::verify(&value, key) else {
            return;
        };
        let placed: Vec<Assumed> = slices
            .containers
            .iter()
            .filter_map(|c| {
                let gpus = a.containers.get(&c.name)?;
                Some(Assumed {
                    container: cluster::assigned_container(&a.pod_uid, &c.name),
                    demand: c.demand.clone(),
                    gpus: gpus.iter().map(|g| g.uuid.clone()).collect(),
                    since: Instant::now(),
                })
            })
            .collect();
        if let Ok(mut assumed) = self.assumed.lock() {
            assumed.entry(a.node).or_default().extend(placed);
        }
    }

    /// Stops counting the placements of pod `pod_uid` wherever they are (the pod is gone);
    /// returns the nodes it had placements on, whose state must be taken in again.
    #[must_use]
    pub fn forget_pod(&self, pod_uid: &str) -> Vec<String> {
        let prefix = cluster::assigned_container(pod_uid, "");
        let Ok(mut assumed) = self.assumed.lock() else {
            return Vec::new();
        };
        let mut nodes = Vec::new();
        for (node, list) in assumed.iter_mut() {
            let before = list.len();
            list.retain(|a| !a.container.starts_with(&prefix));
            if list.len() != before {
                nodes.push(node.clone());
            }
        }
        assumed.retain(|_, list| !list.is_empty());
        nodes
    }

    /// Stops counting the placements of pod `pod_uid` on node `name` (its binding failed).
    fn unassume(&self, name: &str, pod_uid: &str, publication: &NodePublication) {
        let _ = self.forget_pod(pod_uid);
        self.take_in(name, publication);
    }

    /// Counts placements on node `name` (as of `publication`) until its agent shows them.
    fn assume(&self, name: &str, placed: Vec<Assumed>, publication: &NodePublication) {
        if let Ok(mut assumed) = self.assumed.lock() {
            assumed.entry(name.to_string()).or_default().extend(placed);
        }
        self.take_in(name, publication);
    }

    /// The candidate nodes of a request: (name, the Node object if it came in the request,
    /// its state or why there is none).
    fn candidates(&self, args: &ExtenderArgs) -> Vec<Candidate> {
        if let Some(list) = &args.nodes {
            return list
                .items
                .iter()
                .map(|n| {
                    let name = wire::name(n).to_string();
                    let state = wire::annotations(n)
                        .get(NODE_STATE_ANNOTATION)
                        .ok_or_else(|| {
                            Misfit::Never(
                                "gpuslice: this node publishes no GPUs (no gpuslice agent)".into(),
                            )
                        })
                        .and_then(|v| {
                            serde_json::from_str::<NodePublication>(v).map_err(|e| {
                                Misfit::Never(format!(
                                    "gpuslice: annotation {NODE_STATE_ANNOTATION} is not readable: {e}"
                                ))
                            })
                        })
                        .map(|p| Arc::new(self.known(&name, &p)));
                    (name, Some(n.clone()), state)
                })
                .collect();
        }
        let Ok(cache) = self.cache.read() else {
            return Vec::new();
        };
        args.node_names
            .iter()
            .flatten()
            .map(|name| {
                let state = cache.get(name).cloned().ok_or_else(|| {
                    // It may publish soon (a new node, an agent restarting).
                    Misfit::Full("gpuslice: no GPUs published by this node (yet)".into())
                });
                (name.clone(), None, state)
            })
            .collect()
    }

    fn observe(&self, pod: &Value, demands: &[Demand]) {
        let uid = pod["metadata"]["uid"].as_str().unwrap_or("").to_string();
        if let Ok(mut m) = self.mix.lock()
            && (uid.is_empty() || m.0.insert(uid))
        {
            for d in demands {
                m.1.observe(d);
            }
            if let Ok(mut view) = self.mix_view.lock()
                && m.1.distance(&view.mix) > MIX_STALENESS
            {
                view.generation += 1;
                view.mix = Arc::new(m.1.clone());
            }
        }
    }

    /// The task mix frag-aware scores against now.
    fn mix_snapshot(&self) -> Arc<TaskMix> {
        self.mix_view
            .lock()
            .map(|v| Arc::clone(&v.mix))
            .unwrap_or_default()
    }

    /// The filter verb.
    pub fn filter(&self, args: &ExtenderArgs) -> ExtenderFilterResult {
        let cands = self.candidates(args);
        let mut result = ExtenderFilterResult::default();
        let request = pod_request(&args.pod);
        let mut passing = Vec::new();
        for (name, object, state) in cands {
            let verdict = match (&request, state) {
                (PodRequest::None, _) => Ok(()),
                (PodRequest::Invalid(e), _) => Err(Misfit::Never(format!("gpuslice: {e}"))),
                (PodRequest::Slices(..), Err(why)) => Err(why),
                (PodRequest::Slices(d, _), Ok(node)) => fit_all(&node.state, d),
            };
            match verdict {
                Ok(()) => passing.push((name, object)),
                Err(Misfit::Full(why)) => {
                    result.failed_nodes.insert(name, why);
                }
                Err(Misfit::Never(why)) => {
                    result.failed_and_unresolvable_nodes.insert(name, why);
                }
            }
        }
        if let PodRequest::Slices(d, _) = &request {
            self.observe(&args.pod, d);
        }
        if let Some(list) = &args.nodes {
            result.nodes = Some(NodeList {
                items: passing.into_iter().filter_map(|(_, o)| o).collect(),
                rest: list.rest.clone(),
            });
        } else {
            result.node_names = Some(passing.into_iter().map(|(n, _)| n).collect());
        }
        result
    }

    /// The prioritize verb: 10 for the node the policy likes best, 0 for the one it likes
    /// least and for nodes that cannot take the pod, linear in between.
    pub fn prioritize(&self, args: &ExtenderArgs) -> Vec<HostPriority> {
        let cands = self.candidates(args);
        let request = pod_request(&args.pod);
        let PodRequest::Slices(demands, policy) = request else {
            return cands
                .into_iter()
                .map(|(host, ..)| HostPriority { host, score: 0 })
                .collect();
        };
        let policy = policy.unwrap_or(self.default_policy);
        let (generation, mix) = self
            .mix_view
            .lock()
            .map(|v| (v.generation, Arc::clone(&v.mix)))
            .unwrap_or_default();
        // Scores depend on a node's GPUs as a set, not on their order or the node's name:
        // nodes alike (common in a cluster, and unchanged between decisions) are scored once.
        let mut prefix = Mix64::default();
        (generation, policy, &demands).hash(&mut prefix);
        let Ok(mut memo) = self.scores.lock() else {
            return Vec::new();
        };
        if memo.0 != generation || memo.1.len() > SCORE_MEMO_LIMIT {
            *memo = (generation, ScoreMap::default());
        }
        let scores: Vec<(String, Option<f64>)> = cands
            .into_iter()
            .map(|(name, _, state)| {
                let s = state.ok().and_then(|n| {
                    let mut key = prefix;
                    key.write_u64(n.gpu_set);
                    *memo
                        .1
                        .entry(key.finish())
                        .or_insert_with(|| node_score(&n.state, &demands, policy, &mix))
                });
                (name, s)
            })
            .collect();
        drop(memo);
        let known: Vec<f64> = scores.iter().filter_map(|(_, s)| *s).collect();
        let best = known.iter().copied().fold(f64::INFINITY, f64::min);
        let worst = known.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        scores
            .into_iter()
            .map(|(host, s)| {
                let score = match s {
                    None => 0,
                    Some(_) if worst - best < 1e-12 => MAX_EXTENDER_PRIORITY,
                    Some(v) => {
                        let r = (worst - v) / (worst - best) * MAX_EXTENDER_PRIORITY as f64;
                        (r.round() as i64).clamp(0, MAX_EXTENDER_PRIORITY)
                    }
                };
                HostPriority { host, score }
            })
            .collect()
    }
}

/// A GPU as far as scores go: total and free memory, free SMs, sharers, held whole.
type GpuKey = (u64, u64, u32, u32, bool);

/// A hash of `node`'s GPUs as a set (sorted), continuing `prefix`.
fn gpu_set_hash(prefix: &Mix64, node: &NodeState) -> u64 {
    let key = |g: &cluster::GpuState| -> GpuKey {
        (
            g.memory_total,
            g.memory_free,
            g.cores_free,
            g.sharers,
            g.exclusive,
        )
    };
    let mut h = *prefix;
    let mut small = [(0u64, 0u64, 0u32, 0u32, false); 16];
    if node.gpus.len() <= small.len() {
        for (slot, g) in small.iter_mut().zip(&node.gpus) {
            *slot = key(g);
        }
        let used = &mut small[..node.gpus.len()];
        used.sort_unstable();
        used.hash(&mut h);
    } else {
        let mut all: Vec<GpuKey> = node.gpus.iter().map(key).collect();
        all.sort_unstable();
        all.hash(&mut h);
    }
    h.finish()
}

/// Sum over the pod's demands (placed one after the other) of the node-level score.
fn node_score(
    node: &NodeState,
    demands: &[Demand],
    policy: ClusterPolicy,
    mix: &TaskMix,
) -> Option<f64> {
    let mut n = node.clone();
    let mut total = 0.0;
    for d in demands {
        let ((primary, _), gpus) = cluster::best_on_node(&n, d, policy, mix)?;
        total += primary;
        cluster::apply(&mut n, d, &gpus);
    }
    Some(total)
}
