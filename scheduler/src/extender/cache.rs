//! The node cache: each node's GPUs as its agent last published them (`gpuslice.io/node-state`),
//! with the placements bind made there that the agent does not show yet.

use std::collections::HashMap;
use std::sync::{Mutex, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use gpuslice_core::publication::{NODE_STATE_ANNOTATION, NodePublication};
use serde_json::Value;

use super::recorded::{self, Recorded};
use super::score::{Mix64, gpu_set_hash};
use super::wire;
use crate::cluster::{self, Demand, NodeState};

/// Why a node's GPUs are not known. Both are answered as unresolvable in either cache mode:
/// evicting pods from the node cannot make it publish GPUs (kube-scheduler still retries the
/// pod when the cluster changes, so a node whose agent publishes later is used then).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeError {
    /// No publication: no gpuslice agent runs there, or it has not published yet.
    #[error(
        "gpuslice: this node publishes no GPUs (annotation {NODE_STATE_ANNOTATION} absent: no gpuslice agent, or not published yet)"
    )]
    NoPublication,
    #[error("gpuslice: annotation {NODE_STATE_ANNOTATION} is not readable: {0}")]
    Unreadable(String),
}

impl NodeError {
    /// Whether preemption cannot help (always: see the type).
    #[must_use]
    pub fn is_lasting(&self) -> bool {
        true
    }
}

/// A node's GPUs as placement sees them, with a hash of them as a set (what its scores
/// depend on), computed once per publication rather than once per decision.
pub struct Known {
    pub state: NodeState,
    pub gpu_set: u64,
}

/// A container's slice placed by bind, counted on its node until the agent lists the
/// container in its publication's `claimed`.
#[derive(Debug)]
pub struct Assumed {
    /// `<pod UID>/<container>`, as the agent will list it.
    pub container: String,
    pub demand: Demand,
    /// The GPUs' UUIDs.
    pub gpus: Vec<String>,
    pub since: Instant,
    /// Learned from the placements recorded on the Node (by any replica) rather than made
    /// by this replica's bind: the Node's record is the authority on those.
    pub from_record: bool,
}

/// How long a placement counts without its agent showing it: long enough for kubelet to pull
/// an image and start the container. A pod deleted before it started holds its room that long.
pub const ASSUME_FOR: Duration = Duration::from_secs(15 * 60);

/// The node cache.
#[derive(Default)]
pub struct NodeCache {
    /// Nodes by name, as their agents last published them.
    nodes: RwLock<ByName>,
    /// Placements bind made that the nodes' agents do not show yet, by node.
    assumed: Mutex<HashMap<String, Vec<Assumed>>>,
}

impl NodeCache {
    /// Sets what a node publishes (from the Node watch), or forgets it.
    pub fn update(&self, name: &str, publication: Option<&NodePublication>) {
        match publication {
            Some(p) => self.take_in(name, p),
            None => {
                if let Ok(mut c) = self.nodes.write() {
                    c.remove(name);
                }
            }
        }
    }

    /// Caches node `name` as `publication` shows it, with the placements it does not show yet.
    pub fn take_in(&self, name: &str, publication: &NodePublication) {
        let known = self.known(name, publication);
        if let Ok(mut c) = self.nodes.write() {
            c.insert(name.to_string(), known);
        }
    }

    /// A node as `publication` shows it, with the placements bind made there that it does
    /// not show yet. Placements it shows (or older than [`ASSUME_FOR`]) are forgotten.
    pub fn known(&self, name: &str, publication: &NodePublication) -> Known {
        let mut state = NodeState::published(name, publication);
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
    pub fn len(&self) -> usize {
        self.nodes.read().map_or(0, |c| c.len())
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Counts the placements recorded on node `name` (by any replica) until its agent shows
    /// them. The record read last is the authority: placements learned from an earlier
    /// record and absent from this one (their pod went away) stop counting; this replica's
    /// own placements count as they did.
    pub fn learn_recorded(&self, name: &str, recorded: &[Recorded]) {
        let Ok(mut assumed) = self.assumed.lock() else {
            return;
        };
        if recorded.is_empty() && !assumed.contains_key(name) {
            return;
        }
        let list = assumed.entry(name.to_string()).or_default();
        list.retain(|a| !a.from_record);
        for r in recorded {
            if !r.counts() || list.iter().any(|a| a.container == r.container) {
                continue;
            }
            let age = r.age();
            list.push(Assumed {
                container: r.container.clone(),
                demand: r.demand(),
                gpus: r.gpus.iter().map(|g| g.uuid.clone()).collect(),
                since: Instant::now().checked_sub(age).unwrap_or_else(Instant::now),
                from_record: true,
            });
        }
        if list.is_empty() {
            assumed.remove(name);
        }
    }

    /// Counts placements on node `name` until its agent shows them.
    pub fn assume(&self, name: &str, placed: Vec<Assumed>) {
        if let Ok(mut assumed) = self.assumed.lock() {
            assumed.entry(name.to_string()).or_default().extend(placed);
        }
    }

    /// Stops counting the placements of pod `pod_uid` wherever they are (the pod is gone);
    /// returns the nodes it had placements on, whose state must be taken in again.
    #[must_use]
    pub fn forget_pod(&self, pod_uid: &str) -> Vec<String> {
        let prefix = gpuslice_core::publication::assigned_container(pod_uid, "");
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

    /// The nodes of a request, each with its GPUs or why they are not known: from the Node
    /// objects when the request carries them, else from the cache by name. The cache is read
    /// under one lock for the whole decision rather than copied out node by node.
    pub fn lookup<'a>(&'a self, args: &'a wire::ExtenderArgs) -> Lookup<'a> {
        if let Some(list) = &args.nodes {
            let parsed = list
                .items
                .iter()
                .map(|n| {
                    let name = wire::name(n);
                    let annotations = wire::annotations(n);
                    self.learn_recorded(name, &recorded::read(Some(&annotations)));
                    annotations
                        .get(NODE_STATE_ANNOTATION)
                        .ok_or(NodeError::NoPublication)
                        .and_then(|v| {
                            serde_json::from_str::<NodePublication>(v)
                                .map_err(|e| NodeError::Unreadable(e.to_string()))
                        })
                        .map(|p| self.known(name, &p))
                })
                .collect();
            return Lookup {
                args,
                source: Source::Objects(parsed),
            };
        }
        Lookup {
            args,
            source: self.nodes.read().map_or(Source::Unavailable, Source::Cache),
        }
    }
}

/// Nodes by name, hashed with foldhash (a decision looks every node up by name; node names
/// come from the API server, not from tenants, and the hasher is seeded per map).
type ByName = HashMap<String, Known, foldhash::fast::RandomState>;

/// A request's nodes as [`NodeCache::lookup`] found them.
pub struct Lookup<'a> {
    args: &'a wire::ExtenderArgs,
    source: Source<'a>,
}

enum Source<'a> {
    /// Read from the Node objects the request carries, in their order.
    Objects(Vec<Result<Known, NodeError>>),
    /// The node cache, read-locked until the lookup is dropped.
    Cache(RwLockReadGuard<'a, ByName>),
    /// The cache's lock was poisoned: no node is known.
    Unavailable,
}

/// A node of a request: its name, the Node object when the request carried it, and its
/// GPUs or why they are not known.
pub type Candidate<'a> = (&'a str, Option<&'a Value>, Result<&'a Known, NodeError>);

impl Lookup<'_> {
    /// The request's nodes, in its order.
    pub fn candidates(&self) -> Box<dyn Iterator<Item = Candidate<'_>> + '_> {
        match (&self.source, &self.args.nodes) {
            (Source::Objects(parsed), Some(list)) => {
                Box::new(list.items.iter().zip(parsed).map(|(n, state)| {
                    (wire::name(n), Some(n), state.as_ref().map_err(Clone::clone))
                }))
            }
            (Source::Cache(cache), _) => {
                Box::new(self.args.node_names.iter().flatten().map(|name| {
                    let state = cache.get(name).ok_or(NodeError::NoPublication);
                    (name.as_str(), None, state)
                }))
            }
            _ => Box::new(std::iter::empty()),
        }
    }

    /// The request's node names, in its order.
    pub fn names(&self) -> Box<dyn Iterator<Item = &str> + '_> {
        match (&self.args.nodes, &self.args.node_names) {
            (Some(list), _) => Box::new(list.items.iter().map(wire::name)),
            (None, Some(names)) => Box::new(names.iter().map(String::as_str)),
            (None, None) => Box::new(std::iter::empty()),
        }
    }

    /// Every node the extender knows of: the whole node cache, or, when the request carries
    /// its Nodes, those whose GPUs are known.
    #[must_use]
    pub fn cluster(&self) -> Vec<&NodeState> {
        match &self.source {
            Source::Objects(parsed) => parsed.iter().flatten().map(|k| &k.state).collect(),
            Source::Cache(cache) => cache.values().map(|k| &k.state).collect(),
            Source::Unavailable => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use gpuslice_core::assignment::AssignedGpu;
    use gpuslice_core::publication::{NodePublication, PublishedGpu};

    use super::*;

    const GIB: u64 = 1 << 30;

    fn publication() -> NodePublication {
        NodePublication {
            topology: None,
            version: 1,
            max_sharers: 16,
            claimed: Vec::new(),
            gpus: vec![PublishedGpu {
                index: None,
                uuid: "GPU-1".into(),
                model: "Tesla T4".into(),
                memory_total: 16 * GIB,
                memory_allocated: 0,
                cores_allocated: 0,
                sharers: 0,
                exclusive: false,
            }],
        }
    }

    fn record(pod: &str) -> Recorded {
        Recorded {
            container: format!("{pod}/app"),
            gpus: vec![AssignedGpu {
                uuid: "GPU-1".into(),
                memory_bytes: 8 * GIB,
                cores: 0,
            }],
            exclusive: false,
            at_ms: recorded::now_ms(),
        }
    }

    fn free(cache: &NodeCache) -> u64 {
        cache.known("n", &publication()).state.gpus[0].memory_free
    }

    #[test]
    fn the_latest_record_on_the_node_decides_what_other_replicas_placed() {
        let cache = NodeCache::default();
        cache.learn_recorded("n", &[record("a"), record("b")]);
        assert_eq!(free(&cache), 0);
        // An older record read late (a Node event from before a was removed) counts a again,
        // and the record without it, read next, stops counting it.
        cache.learn_recorded("n", &[record("a")]);
        assert_eq!(free(&cache), 8 * GIB);
        cache.learn_recorded("n", &[]);
        assert_eq!(free(&cache), 16 * GIB);
        // This replica's own placement counts whatever the record says until it is forgotten.
        cache.assume(
            "n",
            vec![Assumed {
                container: "c/app".into(),
                demand: record("c").demand(),
                gpus: vec!["GPU-1".into()],
                since: Instant::now(),
                from_record: false,
            }],
        );
        cache.learn_recorded("n", &[]);
        assert_eq!(free(&cache), 8 * GIB);
        assert_eq!(cache.forget_pod("c"), vec!["n".to_string()]);
        assert_eq!(free(&cache), 16 * GIB);
    }

    #[test]
    fn a_forged_record_takes_nothing_from_other_nodes_or_gpus_the_node_does_not_have() {
        // Whoever can write node m's object (its kubelet, say) records placements there:
        // dated for ever ahead, naming GPUs of node n or GPUs that do not exist.
        let cache = NodeCache::default();
        let forever = Recorded {
            at_ms: u64::MAX,
            ..record("f")
        };
        let elsewhere = Recorded {
            gpus: vec![AssignedGpu {
                uuid: "GPU-of-no-node".into(),
                memory_bytes: 16 * GIB,
                cores: 100,
            }],
            ..record("g")
        };
        cache.learn_recorded("m", &[forever.clone(), elsewhere]);
        assert_eq!(free(&cache), 16 * GIB, "node n is not touched");
        let m = cache.known("m", &publication()).state;
        assert_eq!(
            m.gpus[0].memory_free,
            16 * GIB,
            "neither record counts on m"
        );
        // Read on n itself, the one dated ahead does not count either.
        cache.learn_recorded("n", &[forever]);
        assert_eq!(free(&cache), 16 * GIB);
    }
}
