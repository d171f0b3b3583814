//! The kube-scheduler extender: filter and prioritize over the GPUs each node agent publishes
//! on its Node (`gpuslice.io/node-state`), and bind. With `nodeCacheCapable: false` the Nodes
//! come in each request; with `true` only their names do, and the extender answers from its
//! node cache.
//!
//! Its parts: [`request`] reads what a pod asks, [`cache`] keeps the nodes' GPUs and the
//! placements not yet shown, [`score`] decides fit (with the node agents' fit model) and
//! scores, [`bind`] commits a placement as a signed assignment; [`http`], [`tls`], [`watch`]
//! and [`metrics`] connect them to kube-scheduler and the API server.

pub mod bind;
pub mod cache;
pub mod http;
pub mod metrics;
pub mod recorded;
pub mod request;
pub mod score;
pub mod tls;
pub mod watch;
pub mod wire;

use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::{Arc, Mutex};

use gpuslice_core::annotations;
use gpuslice_core::assignment::Assignment;
use gpuslice_core::publication::{NodePublication, assigned_container};
use serde_json::Value;

pub use cache::{ASSUME_FOR, Assumed, Known, NodeCache, NodeError};
pub use request::{
    ContainerSlice, PodDemands, PodRequest, PodSlices, RequestError, pod_request, pod_slices,
};
pub use score::Unfit;

use crate::cluster::{ClusterPolicy, Demand, NodeState, TaskMix};
use score::{
    Mix, Mix64, SCORE_MEMO_LIMIT, ScoreEntry, ScoreMap, fit_pod, node_score, priorities_of,
};
use wire::{ExtenderArgs, ExtenderFilterResult, HostPriority, MAX_EXTENDER_PRIORITY, NodeList};

pub struct Extender {
    pub(crate) cache: NodeCache,
    /// The task mix learned from the pods seen.
    mix: Mutex<Mix>,
    /// Node scores by (mix generation, policy, demands, the node's GPUs as a set).
    /// The memo's mix generation, the memo, and the prioritize calls made (to give each
    /// call's distinct scores their slots).
    scores: Mutex<(u64, ScoreMap, u64)>,
    /// Held while bind places a pod and records the placement.
    placing: Mutex<()>,
    default_policy: ClusterPolicy,
    /// Watches (Nodes, bound pods) whose first list has not been taken in yet: until then the
    /// extender is not ready (`/readyz`), since it would answer from a partial cluster.
    unlisted: std::sync::atomic::AtomicUsize,
}

/// The pod's `namespace/name`, for spans and logs.
fn pod_name(pod: &Value) -> String {
    let m = &pod["metadata"];
    format!(
        "{}/{}",
        m["namespace"].as_str().unwrap_or(""),
        m["name"].as_str().unwrap_or("")
    )
}

impl Extender {
    #[must_use]
    pub fn new(default_policy: ClusterPolicy) -> Self {
        Self {
            cache: NodeCache::default(),
            mix: Mutex::new(Mix::default()),
            scores: Mutex::new((0, ScoreMap::default(), 0)),
            placing: Mutex::new(()),
            default_policy,
            unlisted: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Expects `n` watches to list the cluster before the extender is ready.
    pub fn expect_watches(&self, n: usize) {
        self.unlisted
            .fetch_add(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// One expected watch has taken in its first list.
    pub fn watch_listed(&self) {
        let _ = self.unlisted.fetch_update(
            std::sync::atomic::Ordering::SeqCst,
            std::sync::atomic::Ordering::SeqCst,
            |n| n.checked_sub(1),
        );
    }

    /// Whether every expected watch has listed the cluster.
    #[must_use]
    pub fn ready(&self) -> bool {
        self.unlisted.load(std::sync::atomic::Ordering::SeqCst) == 0
    }

    /// Sets what a node publishes (from the Node watch), or forgets it.
    pub fn update_node(&self, name: &str, publication: Option<NodePublication>) {
        self.cache.update(name, publication.as_ref());
    }

    /// Counts the placements recorded on node `name` by any replica until its agent shows
    /// them.
    pub fn learn_recorded(&self, name: &str, recorded: &[recorded::Recorded]) {
        self.cache.learn_recorded(name, recorded);
    }

    /// Nodes whose publication is known.
    #[must_use]
    pub fn nodes_known(&self) -> usize {
        self.cache.len()
    }

    /// Pods the learned task mix counts.
    #[must_use]
    pub fn mix_pods(&self) -> usize {
        self.mix.lock().map_or(0, |m| m.pods())
    }

    /// Stops counting the placements of pod `pod_uid` wherever they are (the pod is gone);
    /// returns the nodes it had placements on, whose state must be taken in again.
    #[must_use]
    pub fn forget_pod(&self, pod_uid: &str) -> Vec<String> {
        self.cache.forget_pod(pod_uid)
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
        let demands = slices.demands().running();
        if demands.is_empty() {
            return;
        }
        self.observe(pod, &demands, &[]);
        let assignment_key = format!("{}{}", annotations::PREFIX, annotations::ASSIGNMENT);
        let (Some(key), Some(value)) = (key, wire::annotations(pod).remove(&assignment_key)) else {
            return;
        };
        let Ok(a) = Assignment::verify(&value, key) else {
            return;
        };
        // What the pod holds once started: its sidecars and app containers.
        let placed: Vec<Assumed> = slices
            .init
            .iter()
            .filter(|(_, sidecar)| *sidecar)
            .map(|(c, _)| c)
            .chain(&slices.containers)
            .filter_map(|c| {
                let gpus = a.containers.get(&c.name)?;
                Some(Assumed {
                    container: assigned_container(&a.pod_uid, &c.name),
                    demand: c.demand.clone(),
                    gpus: gpus.iter().map(|g| g.uuid.clone()).collect(),
                    since: std::time::Instant::now(),
                    from_record: false,
                })
            })
            .collect();
        self.cache.assume(&a.node, placed);
    }

    fn observe(&self, pod: &Value, demands: &[Demand], nodes: &[(&NodeState, usize)]) {
        if let Ok(mut m) = self.mix.lock() {
            m.observe(pod, demands, nodes);
        }
    }

    /// The task mix frag-aware scores against now, and its generation.
    fn mix_snapshot(&self) -> (u64, Arc<TaskMix>) {
        self.mix
            .lock()
            .map(|m| (m.generation, Arc::clone(&m.snapshot)))
            .unwrap_or_default()
    }

    /// The filter verb.
    pub fn filter<'r>(&self, args: &'r ExtenderArgs<'r>) -> ExtenderFilterResult<'r> {
        let span = tracing::debug_span!("filter", pod = %pod_name(&args.pod));
        let _entered = span.enter();
        let lookup = self.cache.lookup(args);
        let mut result = ExtenderFilterResult::default();
        let request = pod_request(&args.pod);
        let invalid = match &request {
            PodRequest::Invalid(e) => format!("gpuslice: {e}"),
            _ => String::new(),
        };
        // Nodes alike (the same GPUs as a set, the same rules and host room) get the same
        // verdict for a pod that names no GPU: it is decided once per call. In a cluster
        // of thousands of nodes most are alike, and most of the rest is the name lookup.
        let names_gpus = matches!(&request, PodRequest::Slices(d, _)
            if d.running().iter().chain(d.init.iter().map(|(d, _)| d)).any(Demand::names_gpus));
        let mut verdicts: HashMap<u64, Result<(), Unfit>, BuildHasherDefault<Mix64>> =
            HashMap::default();
        const MEMO_FROM: usize = 64;
        let mut judged = 0usize;
        let mut passing = Vec::new();
        for (name, object, state) in lookup.candidates() {
            let verdict: Result<(), (bool, Cow<'r, str>)> = match (&request, state) {
                (PodRequest::None, _) => Ok(()),
                (PodRequest::Invalid(_), _) => Err((true, invalid.clone().into())),
                (PodRequest::Slices(..), Err(why)) => {
                    Err((why.is_lasting(), why.to_string().into()))
                }
                (PodRequest::Slices(d, _), Ok(node)) => {
                    // Where nodes are seldom alike, the memo would only cost: it is left
                    // once it holds more than half of the nodes seen.
                    judged += 1;
                    let fit = if names_gpus || verdicts.len() > MEMO_FROM.max(judged / 2) {
                        fit_pod(&node.state, d)
                    } else {
                        *verdicts
                            .entry(node.alike)
                            .or_insert_with(|| fit_pod(&node.state, d))
                    };
                    fit.map_err(|u| (matches!(u, Unfit::Never), u.message().into()))
                }
            };
            match verdict {
                Ok(()) => passing.push((name, object)),
                Err((false, why)) => {
                    result.failed_nodes.insert(name.into(), why);
                }
                Err((true, why)) => {
                    result
                        .failed_and_unresolvable_nodes
                        .insert(name.into(), why);
                }
            }
        }
        if let PodRequest::Slices(d, _) = &request {
            // Scarcity is measured, now and then, on the cluster as the extender knows it: the
            // node cache, or, without it, the nodes of this request.
            // Nodes alike weigh the same, so each kind is measured once, unless a type of
            // the mix names GPUs (then which GPU is which matters).
            let due = self.mix.lock().ok().and_then(|m| m.scarcity_due());
            let nodes = due.map_or_else(Vec::new, |names_gpus| lookup.cluster(!names_gpus));
            self.observe(&args.pod, &d.running(), &nodes);
        }
        tracing::debug!(
            passing = passing.len(),
            failed = result.failed_nodes.len() + result.failed_and_unresolvable_nodes.len(),
            "filtered"
        );
        if let Some(list) = &args.nodes {
            result.nodes = Some(NodeList {
                items: passing
                    .into_iter()
                    .filter_map(|(_, o)| o.cloned())
                    .collect(),
                rest: list.rest.clone(),
            });
        } else {
            result.node_names = Some(passing.into_iter().map(|(n, _)| n.into()).collect());
        }
        result
    }

    /// The prioritize verb: 10 for the node the policy likes best, 0 for the one it likes
    /// least and for nodes that cannot take the pod, by rank in between ([`score::priorities_of`]).
    pub fn prioritize<'r>(&self, args: &'r ExtenderArgs<'r>) -> Vec<HostPriority<'r>> {
        let span = tracing::debug_span!("prioritize", pod = %pod_name(&args.pod));
        let _entered = span.enter();
        let lookup = self.cache.lookup(args);
        let request = pod_request(&args.pod);
        let PodRequest::Slices(pod, policy) = request else {
            return lookup
                .candidates()
                .map(|(host, ..)| HostPriority {
                    host: host.into(),
                    score: 0,
                })
                .collect();
        };
        // Scores count what the pod holds once started; filter checked its init steps.
        let demands = pod.running();
        let policy = policy.unwrap_or(self.default_policy);
        let (generation, mix) = self.mix_snapshot();
        // Scores depend on a node's GPUs as a set, not on their order or the node's name:
        // nodes alike (common in a cluster, and unchanged between decisions) are scored once.
        // A pod that names or avoids GPUs depends on which GPU is which: it is scored afresh.
        let names_gpus = demands.iter().any(Demand::names_gpus);
        let mut prefix = Mix64::default();
        (generation, policy, &demands).hash(&mut prefix);
        let Ok(mut memo) = self.scores.lock() else {
            return Vec::new();
        };
        if memo.0 != generation || memo.1.len() > SCORE_MEMO_LIMIT {
            memo.0 = generation;
            memo.1 = ScoreMap::default();
        }
        memo.2 += 1;
        let call = memo.2;
        // Each node's score as a slot among this call's distinct scores.
        let mut distinct: Vec<(f64, f64)> = Vec::new();
        let slot_of = |score: Option<(f64, f64)>, distinct: &mut Vec<(f64, f64)>| {
            score.map(|s| {
                distinct.push(s);
                u32::try_from(distinct.len() - 1).unwrap_or(u32::MAX)
            })
        };
        let slots: Vec<Option<u32>> = lookup
            .candidates()
            .map(|(_, _, state)| {
                let Ok(n) = state else {
                    return None;
                };
                if names_gpus {
                    let s = node_score(&n.state, &demands, policy, &mix);
                    return slot_of(s, &mut distinct);
                }
                let mut key = prefix;
                key.write_u64(n.alike);
                let entry = memo.1.entry(key.finish()).or_insert_with(|| ScoreEntry {
                    score: node_score(&n.state, &demands, policy, &mix),
                    call: 0,
                    slot: 0,
                });
                entry.score?;
                if entry.call != call {
                    entry.call = call;
                    entry.slot = slot_of(entry.score, &mut distinct).unwrap_or(0);
                }
                Some(entry.slot)
            })
            .collect();
        drop(memo);
        lookup
            .names()
            .zip(priorities_of(&distinct, &slots, MAX_EXTENDER_PRIORITY))
            .map(|(host, score)| HostPriority {
                host: host.into(),
                score,
            })
            .collect()
    }
}
