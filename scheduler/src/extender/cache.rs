//! The node cache: each node's GPUs as its agent last published them (`gpuslice.io/node-state`),
//! with the placements bind made there that the agent does not show yet.

use std::collections::HashMap;
use std::sync::{Mutex, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use gpuslice_core::publication::{NODE_STATE_ANNOTATION, NodePublication};
use serde_json::Value;

use super::recorded::{self, Recorded};
use super::score::{Mix64, alike_hash};
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

/// A node's GPUs as placement sees them, with the hash of what its fit and scores depend on
/// ([`alike_hash`]: nodes alike share it), computed once per publication rather than once
/// per decision.
pub struct Known {
    pub state: NodeState,
    pub alike: u64,
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
            c.insert(name, known);
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
            alike: alike_hash(&Mix64::default(), &state),
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
    pub fn lookup<'a, 'r>(&'a self, args: &'r wire::ExtenderArgs<'_>) -> Lookup<'a, 'r> {
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

/// Nodes by name. A decision looks every node of the request up by name, so the lookup is
/// kept small and in order: the index holds only each node's slot (4 bytes; hashed with
/// foldhash: node names come from the API server, not from tenants, and the hasher is seeded
/// per map), the names sit one after the other in one buffer and the nodes in a slab, both in
/// the order the nodes arrived: the order the API server lists them and, roughly, the order
/// kube-scheduler names them in. A decision over thousands of nodes then walks memory in
/// order instead of jumping across a large table (at 15,000 nodes the cache does not fit
/// the processor's cache).
#[derive(Default)]
struct ByName {
    index: hashbrown::HashTable<u32>,
    hasher: foldhash::fast::RandomState,
    /// The names, one after the other; each slot's is at its span.
    names: String,
    slots: Vec<Slot>,
    /// Slots of removed nodes, reused first.
    free: Vec<u32>,
    /// Bytes of `names` that no slot uses any more (compacted once they are half of it).
    dead: usize,
}

struct Slot {
    name: std::ops::Range<usize>,
    known: Option<Known>,
}

impl ByName {
    fn hash(&self, name: &str) -> u64 {
        std::hash::BuildHasher::hash_one(&self.hasher, name)
    }

    fn slot(&self, name: &str) -> Option<u32> {
        let (names, slots) = (&self.names, &self.slots);
        self.index
            .find(self.hash(name), |&s| {
                names.get(slots[s as usize].name.clone()) == Some(name)
            })
            .copied()
    }

    fn get(&self, name: &str) -> Option<&Known> {
        self.slots.get(self.slot(name)? as usize)?.known.as_ref()
    }

    fn insert(&mut self, name: &str, known: Known) {
        if let Some(slot) = self.slot(name) {
            self.slots[slot as usize].known = Some(known);
            return;
        }
        let span = self.names.len()..self.names.len() + name.len();
        self.names.push_str(name);
        let entry = Slot {
            name: span,
            known: Some(known),
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = entry;
                slot
            }
            None => {
                self.slots.push(entry);
                u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX)
            }
        };
        let (names, slots, hasher) = (&self.names, &self.slots, &self.hasher);
        self.index.insert_unique(self.hash(name), slot, |&s| {
            std::hash::BuildHasher::hash_one(hasher, &names[slots[s as usize].name.clone()])
        });
    }

    fn remove(&mut self, name: &str) {
        let hash = self.hash(name);
        let (names, slots) = (&self.names, &self.slots);
        let Ok(found) = self
            .index
            .find_entry(hash, |&s| &names[slots[s as usize].name.clone()] == name)
        else {
            return;
        };
        let (slot, _) = found.remove();
        let entry = &mut self.slots[slot as usize];
        self.dead += entry.name.len();
        entry.name = 0..0;
        entry.known = None;
        self.free.push(slot);
        if self.dead > self.names.len() / 2 {
            self.compact();
        }
    }

    /// Writes the names of the slots in use again, in slot order, without the removed ones.
    fn compact(&mut self) {
        let mut names = String::with_capacity(self.names.len() - self.dead);
        for entry in &mut self.slots {
            let span = names.len()..names.len() + entry.name.len();
            names.push_str(&self.names[entry.name.clone()]);
            entry.name = span;
        }
        self.names = names;
        self.dead = 0;
    }

    fn len(&self) -> usize {
        self.index.len()
    }

    fn values(&self) -> impl Iterator<Item = &Known> {
        self.slots.iter().filter_map(|s| s.known.as_ref())
    }
}

/// A request's nodes as [`NodeCache::lookup`] found them: `'a` is the cache's read lock,
/// `'r` the request (whose names the answers borrow).
pub struct Lookup<'a, 'r> {
    args: &'r wire::ExtenderArgs<'r>,
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
pub type Candidate<'a, 'r> = (&'r str, Option<&'r Value>, Result<&'a Known, NodeError>);

impl<'r> Lookup<'_, 'r> {
    /// The request's nodes, in its order.
    pub fn candidates(&self) -> Box<dyn Iterator<Item = Candidate<'_, 'r>> + '_> {
        match (&self.source, &self.args.nodes) {
            (Source::Objects(parsed), Some(list)) => {
                Box::new(list.items.iter().zip(parsed).map(|(n, state)| {
                    (wire::name(n), Some(n), state.as_ref().map_err(Clone::clone))
                }))
            }
            (Source::Cache(cache), _) => {
                Box::new(self.args.node_names.iter().flatten().map(|name| {
                    let state = cache.get(name.as_ref()).ok_or(NodeError::NoPublication);
                    (name.as_ref(), None, state)
                }))
            }
            _ => Box::new(std::iter::empty()),
        }
    }

    /// The request's node names, in its order.
    pub fn names(&self) -> Box<dyn Iterator<Item = &'r str> + 'r> {
        match (&self.args.nodes, &self.args.node_names) {
            (Some(list), _) => Box::new(list.items.iter().map(wire::name)),
            (None, Some(names)) => Box::new(names.iter().map(AsRef::as_ref)),
            (None, None) => Box::new(std::iter::empty()),
        }
    }

    /// Every node the extender knows of (the whole node cache, or, when the request carries
    /// its Nodes, those whose GPUs are known), each with the number of nodes it stands for:
    /// with `group`, nodes alike ([`Known::alike`]) are given once.
    #[must_use]
    pub fn cluster(&self, group: bool) -> Vec<(&NodeState, usize)> {
        let known: Box<dyn Iterator<Item = &Known>> = match &self.source {
            Source::Objects(parsed) => Box::new(parsed.iter().flatten()),
            Source::Cache(cache) => Box::new(cache.values()),
            Source::Unavailable => return Vec::new(),
        };
        if !group {
            return known.map(|k| (&k.state, 1)).collect();
        }
        let mut at: HashMap<u64, usize, std::hash::BuildHasherDefault<Mix64>> = HashMap::default();
        let mut nodes = Vec::new();
        for k in known {
            let i = *at.entry(k.alike).or_insert_with(|| {
                nodes.push((&k.state, 0));
                nodes.len() - 1
            });
            nodes[i].1 += 1;
        }
        nodes
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
    fn nodes_removed_and_added_again_are_found_by_name_after_their_names_are_compacted() {
        let mut nodes = ByName::default();
        let cache = NodeCache::default();
        let with_memory = |gib: u64| {
            let mut p = publication();
            p.gpus[0].memory_total = gib * GIB;
            cache.known("n", &p)
        };
        for i in 0..100 {
            nodes.insert(&format!("node-{i}"), with_memory(i + 1));
        }
        // Removing 60 leaves more dead names than live ones: the names are written again.
        let written = nodes.names.len();
        for i in 0..60 {
            nodes.remove(&format!("node-{i}"));
        }
        assert!(nodes.names.len() < written, "compacted");
        assert_eq!(nodes.names.len() - nodes.dead, 40 * "node-60".len());
        assert_eq!(nodes.len(), 40);
        for i in 0..100 {
            let found = nodes
                .get(&format!("node-{i}"))
                .map(|k| k.state.gpus[0].memory_total);
            assert_eq!(found, (i >= 60).then_some((i + 1) * GIB), "node-{i}");
        }
        // Slots are reused, names of another length included; an update keeps the slot.
        nodes.insert("a-much-longer-node-name-0", with_memory(7));
        nodes.insert("node-99", with_memory(9));
        nodes.remove("node-61");
        assert_eq!(nodes.slots.len(), 100);
        assert_eq!(nodes.len(), 40);
        let memory = |name: &str| nodes.get(name).map(|k| k.state.gpus[0].memory_total);
        assert_eq!(memory("a-much-longer-node-name-0"), Some(7 * GIB));
        assert_eq!(memory("node-99"), Some(9 * GIB));
        assert_eq!(memory("node-62"), Some(63 * GIB));
        assert_eq!((memory("node-61"), memory("node-0")), (None, None));
        assert_eq!(nodes.values().count(), 40);
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
