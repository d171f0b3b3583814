//! The kube-scheduler extender: filter and prioritize over the GPUs each node agent publishes
//! on its Node (`gpuslice.io/node-state`). With `nodeCacheCapable: false` the Nodes come in
//! each request; with `true` only their names do, and the extender answers from its node
//! cache.

pub mod bind;
pub mod http;
pub mod watch;
pub mod wire;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

use gpuslice_core::annotations::{self, SliceRequest};
use gpuslice_core::cluster::{
    self, ClusterPolicy, Demand, NODE_STATE_ANNOTATION, NodePublication, NodeState, TaskMix,
};
use gpuslice_core::placement::Policy;
use gpuslice_core::quantity::MemoryQuantity;
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
    match container_demands(pod) {
        Err(e) => PodRequest::Invalid(e),
        Ok((d, _)) if d.is_empty() => PodRequest::None,
        Ok((d, policy)) => PodRequest::Slices(d.into_iter().map(|(_, d)| d).collect(), policy),
    }
}

/// Each container that asks for a slice (name, demand), and the pod's node policy.
pub type ContainerDemands = (Vec<(String, Demand)>, Option<ClusterPolicy>);

/// Each container that asks for a slice, with its demand, and the pod's node policy.
pub fn container_demands(pod: &Value) -> Result<ContainerDemands, String> {
    let mut ann = wire::annotations(pod);
    let containers: Vec<String> = pod["spec"]["containers"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter_map(|c| c["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let mut demands = Vec::new();
    let mut policy = None;
    for c in containers {
        ann.insert(annotations::CRI_CONTAINER_NAME.to_string(), c.clone());
        match annotations::parse(&ann) {
            Ok(None) => {}
            Ok(Some(req)) => {
                policy = policy.or(req.node_policy.map(node_policy));
                demands.push((c, demand(&req)?));
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok((demands, policy))
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

fn misfit(node: &NodeState, demands: &[Demand]) -> Misfit {
    let mut empty = node.clone();
    for g in &mut empty.gpus {
        *g = cluster::GpuState::idle(g.memory_total);
    }
    let describe = |n: &NodeState| {
        let gpus: Vec<String> = n
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                format!(
                    "GPU {i}: {} MiB of {} MiB and {}% of the SMs free{}",
                    g.memory_free >> 20,
                    g.memory_total >> 20,
                    g.cores_free,
                    if g.exclusive { ", held whole" } else { "" }
                )
            })
            .collect();
        format!("{} GPU(s): {}", n.gpus.len(), gpus.join("; "))
    };
    let mut probe = empty.clone();
    for d in demands {
        let mix = TaskMix::default();
        match cluster::best_on_node(&probe, d, ClusterPolicy::FragAware, &mix) {
            Some((_, gpus)) => cluster::apply(&mut probe, d, &gpus),
            None => {
                return Misfit::Never(format!(
                    "gpuslice: even empty, this node cannot host the pod ({})",
                    describe(&empty)
                ));
            }
        }
    }
    Misfit::Full(format!(
        "gpuslice: not enough free GPU capacity ({})",
        describe(node)
    ))
}

/// A node of a request: its name, the Node object when the request carried it, and its
/// GPUs or why they are not known.
type Candidate = (String, Option<Value>, Result<Arc<NodeState>, Misfit>);

pub struct Extender {
    /// Nodes by name, as their agents last published them.
    cache: RwLock<HashMap<String, Arc<NodeState>>>,
    mix: Mutex<(HashSet<String>, TaskMix)>,
    default_policy: ClusterPolicy,
}

impl Extender {
    #[must_use]
    pub fn new(default_policy: ClusterPolicy) -> Self {
        Self {
            cache: RwLock::new(HashMap::new()),
            mix: Mutex::new((HashSet::new(), TaskMix::default())),
            default_policy,
        }
    }

    /// Sets what a node publishes (from the Node watch), or forgets it.
    pub fn update_node(&self, name: &str, publication: Option<NodePublication>) {
        if let Ok(mut c) = self.cache.write() {
            match publication {
                Some(p) => c.insert(name.to_string(), Arc::new(p.node_state(name))),
                None => c.remove(name),
            };
        }
    }

    /// The node as last published, with what this extender placed there since.
    fn cached(&self, name: &str) -> Option<Arc<NodeState>> {
        self.cache.read().ok()?.get(name).cloned()
    }

    /// Counts a placement in the node cache until the node's agent publishes again.
    fn assume(&self, name: &str, state: NodeState) {
        if let Ok(mut c) = self.cache.write() {
            c.insert(name.to_string(), Arc::new(state));
        }
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
                        .map(|p| Arc::new(p.node_state(&name)));
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
        }
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
                (PodRequest::Slices(d, _), Ok(node)) => fit_all(&node, d),
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
        let mix = self.mix.lock().map(|m| m.1.clone()).unwrap_or_default();
        // Scores depend on a node's GPUs as a set, not on their order or the node's name:
        // nodes alike (common in a cluster) are scored once.
        let mut memo: HashMap<Vec<GpuKey>, Option<f64>> = HashMap::new();
        let scores: Vec<(String, Option<f64>)> = cands
            .into_iter()
            .map(|(name, _, state)| {
                let s = state.ok().and_then(|n| {
                    let mut key: Vec<GpuKey> = n
                        .gpus
                        .iter()
                        .map(|g| {
                            (
                                g.memory_total,
                                g.memory_free,
                                g.cores_free,
                                g.sharers,
                                g.exclusive,
                            )
                        })
                        .collect();
                    key.sort_unstable();
                    *memo
                        .entry(key)
                        .or_insert_with(|| node_score(&n, &demands, policy, &mix))
                });
                (name, s)
            })
            .collect();
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

/// Failure messages by node, for logs.
#[must_use]
pub fn failures(r: &ExtenderFilterResult) -> BTreeMap<String, String> {
    r.failed_nodes
        .iter()
        .chain(&r.failed_and_unresolvable_nodes)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}
