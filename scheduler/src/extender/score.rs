//! Fit and scores of a pod on a node: whether its containers' slices fit one after the other
//! (the fit model the node agent admits with), the node-level score under a policy, the task
//! mix frag-aware scores against, and the memo that keeps scores between decisions.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuslice_core::fit::GpuRoom;
use serde_json::Value;

use super::request::PodDemands;
use crate::cluster::{self, Axis, ClusterPolicy, Demand, NodeState, SCARCITY_EVERY, TaskMix};

/// Why a node cannot take a pod. The messages are the same for every node in the same
/// situation, so that kube-scheduler's event sums them up ("12 gpuslice: …") instead of
/// listing thousands of nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unfit {
    /// Not now: what is allocated there would have to go first.
    #[error("{}", Self::Full.message())]
    Full,
    /// Never, even with the node empty: preemption would not help.
    #[error("{}", Self::Never.message())]
    Never,
}

const BINPACK: ClusterPolicy = ClusterPolicy::Axes {
    node: Axis::Binpack,
    gpu: Axis::Binpack,
};

impl Unfit {
    /// The message kube-scheduler shows for a node that cannot take the pod.
    #[must_use]
    pub fn message(self) -> &'static str {
        match self {
            Self::Full => "gpuslice: not enough free GPU memory or SMs on this node now",
            Self::Never => {
                "gpuslice: even empty, this node's GPUs are too few or too small for the pod (or lack the GPUs it names)"
            }
        }
    }
}

/// Whether `pod` fits `node`: each init container in turn beside the sidecars started before
/// it, then the app containers beside all sidecars, each placed on the GPUs binpack picks.
pub fn fit_pod(node: &NodeState, pod: &PodDemands) -> Result<(), Unfit> {
    if let ([], [d]) = (pod.init.as_slice(), pod.apps.as_slice()) {
        return if cluster::fits(node, d) {
            Ok(())
        } else {
            Err(unfit(node, pod))
        };
    }
    if place_all(node.clone(), pod) {
        Ok(())
    } else {
        Err(unfit(node, pod))
    }
}

/// Whether every step of `pod` can be placed on `node`.
fn place_all(mut node: NodeState, pod: &PodDemands) -> bool {
    let mix = TaskMix::default();
    for (d, sidecar) in &pod.init {
        match cluster::best_on_node(&node, d, BINPACK, &mix) {
            // A sidecar keeps its slice; a plain init container gives it back on exit.
            Some((_, gpus)) if *sidecar => cluster::apply(&mut node, d, &gpus),
            Some(_) => {}
            None => return false,
        }
    }
    for d in &pod.apps {
        match cluster::best_on_node(&node, d, BINPACK, &mix) {
            Some((_, gpus)) => cluster::apply(&mut node, d, &gpus),
            None => return false,
        }
    }
    true
}

/// Why `pod` does not fit `node`: for now, or even with the node empty.
fn unfit(node: &NodeState, pod: &PodDemands) -> Unfit {
    let mut empty = node.clone();
    for g in &mut empty.gpus {
        *g = GpuRoom::idle(g.memory_total);
    }
    if place_all(empty, pod) {
        Unfit::Full
    } else {
        Unfit::Never
    }
}

/// Sums over the pod's demands (placed one after the other) of the node-level scores under
/// `policy` (lower is better): the policy's own measure, and its tie-break on the node axis
/// (for frag-aware, binpack: the free GPU share left).
#[must_use]
pub fn node_score(
    node: &NodeState,
    demands: &[Demand],
    policy: ClusterPolicy,
    mix: &TaskMix,
) -> Option<(f64, f64)> {
    let mut n = node.clone();
    let (mut primary, mut secondary) = (0.0, 0.0);
    for d in demands {
        let ((p, s), gpus) = cluster::best_on_node(&n, d, policy, mix)?;
        primary += p;
        secondary += s;
        cluster::apply(&mut n, d, &gpus);
    }
    Some((primary, secondary))
}

/// Scores closer than this are equal (sums of fractions differ in their last bits).
const SCORE_TIE: f64 = 1e-9;

/// kube-scheduler's extender priorities (0 to `max`) for node scores (lower is better; None
/// for a node that cannot take the pod, which gets 0). The nodes that can are ranked by their
/// scores, the policy's measure first and its node-axis tie-break second, equal ones alike;
/// the best gets `max`, the worst 0, and the ranks between spread evenly over the range, so
/// that the few distinct values a measure takes (fragmentation often moves in steps) still
/// leave the tie-break visible to kube-scheduler.
///
/// Each node's score is given as a slot in `distinct` (None: the node cannot take the pod);
/// nodes alike share a slot, so only the distinct scores are ranked.
#[must_use]
pub fn priorities_of(distinct: &[(f64, f64)], slots: &[Option<u32>], max: i64) -> Vec<i64> {
    let mut order: Vec<u32> = (0..u32::try_from(distinct.len()).unwrap_or(u32::MAX)).collect();
    let key = |i: u32| distinct[i as usize];
    order.sort_unstable_by(|&a, &b| {
        let (a, b) = (key(a), key(b));
        a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1))
    });
    let same = |a: (f64, f64), b: (f64, f64)| {
        (a.0 - b.0).abs() <= SCORE_TIE && (a.1 - b.1).abs() <= SCORE_TIE
    };
    let mut rank = vec![0usize; distinct.len()];
    let mut r = 0;
    for (k, &i) in order.iter().enumerate() {
        if k > 0 && !same(key(order[k - 1]), key(i)) {
            r += 1;
        }
        rank[i as usize] = r;
    }
    let last = r;
    slots
        .iter()
        .map(|i| {
            let Some(i) = i else { return 0 };
            if last == 0 {
                return max;
            }
            let p = (last - rank[*i as usize]) as f64 / last as f64 * max as f64;
            (p.round() as i64).clamp(0, max)
        })
        .collect()
}

/// A memoized node score, and where it stands among the distinct scores of the prioritize
/// call that last used it (so that a call ranks each distinct score once).
#[derive(Debug, Clone, Copy)]
pub struct ScoreEntry {
    pub score: Option<(f64, f64)>,
    /// The call that last gave it a slot, and the slot.
    pub call: u64,
    pub slot: u32,
}

/// How far (total variation distance) the learned mix may move from the snapshot scores are
/// computed against before the snapshot is renewed and the scores recomputed. Renewing when
/// the weight had grown by a twentieth bounded the distance by 0.048 and renewed ~60 times in
/// the first 200 pods even when the shares stood still; this bounds it by less and renews
/// only when the shares move.
const MIX_STALENESS: f64 = 0.04;

/// Scores kept between decisions before the memo starts afresh.
pub const SCORE_MEMO_LIMIT: usize = 200_000;

/// The task mix learned from the pods seen, and the snapshot of it that scores are computed
/// against (so that they can be reused between decisions).
#[derive(Default)]
pub struct Mix {
    /// Pods seen in the last [`REMEMBER_SEEN_FOR`], by UID, with when each was last seen: a
    /// pod filtered again is not counted again.
    seen: HashMap<String, Instant>,
    /// When `seen` was last swept of pods not seen for [`REMEMBER_SEEN_FOR`].
    swept: Option<Instant>,
    /// Pods counted.
    counted: usize,
    learned: TaskMix,
    /// Pods counted since scarcity was last measured.
    unweighed: usize,
    /// Bumped whenever the snapshot is renewed.
    pub generation: u64,
    pub snapshot: Arc<TaskMix>,
}

impl Mix {
    /// Counts a pod's demands into the mix, once per pod UID; every [`SCARCITY_EVERY`] pods,
    /// measures each type's scarcity on `nodes` (the cluster as the extender knows it) and
    /// sets the decay's half-life to their GPU count; renews the snapshot when the shares
    /// moved away from it.
    pub fn observe(&mut self, pod: &Value, demands: &[Demand], nodes: &[(&NodeState, usize)]) {
        self.observe_at(Instant::now(), pod, demands, nodes);
    }

    /// [`Mix::observe`] at `now`.
    fn observe_at(
        &mut self,
        now: Instant,
        pod: &Value,
        demands: &[Demand],
        nodes: &[(&NodeState, usize)],
    ) {
        if self
            .swept
            .is_none_or(|t| now.saturating_duration_since(t) >= REMEMBER_SEEN_FOR / 4)
        {
            self.swept = Some(now);
            self.seen
                .retain(|_, last| now.saturating_duration_since(*last) < REMEMBER_SEEN_FOR);
        }
        let uid = pod["metadata"]["uid"].as_str().unwrap_or("");
        if !uid.is_empty() {
            if let Some(last) = self.seen.get_mut(uid) {
                *last = now;
                return;
            }
            self.seen.insert(uid.to_string(), now);
        }
        self.counted += 1;
        for d in demands {
            self.learned.observe(d);
        }
        self.unweighed += 1;
        if self.unweighed >= SCARCITY_EVERY && !nodes.is_empty() {
            self.unweighed = 0;
            let gpus: usize = nodes.iter().map(|(n, count)| n.gpus.len() * count).sum();
            self.learned.set_half_life(gpus as f64);
            self.learned.weigh_by_scarcity(nodes.iter().copied());
        }
        if self.learned.distance(&self.snapshot) > MIX_STALENESS {
            self.generation += 1;
            self.snapshot = Arc::new(self.learned.clone());
        }
    }

    /// Whether the next pod counted measures scarcity (and so needs the nodes): None if not,
    /// else whether a type of the mix names GPUs (so that nodes alike still differ for it).
    #[must_use]
    pub fn scarcity_due(&self) -> Option<bool> {
        (self.unweighed + 1 >= SCARCITY_EVERY).then(|| self.learned.names_gpus())
    }

    /// Pods counted.
    #[must_use]
    pub fn pods(&self) -> usize {
        self.counted
    }

    /// Pod UIDs remembered.
    #[must_use]
    pub fn remembered(&self) -> usize {
        self.seen.len()
    }
}

/// How long a pod's UID is remembered after it was last seen, so that it is not counted again
/// when it is filtered again: kube-scheduler retries a pod it could not place at least every
/// 5 minutes, and never filters a bound pod again, so an hour outlives every retry while the
/// UIDs of pods long placed (a cluster places millions) are let go.
pub const REMEMBER_SEEN_FOR: Duration = Duration::from_secs(3600);

/// Scores by a key already hashed with [`Mix64`].
pub type ScoreMap = HashMap<u64, ScoreEntry, BuildHasherDefault<Mix64>>;

/// A fast multiply-rotate hasher (as FxHash) for keys this extender derives itself from node
/// states: not resistant to chosen inputs, which is fine for a cache of scores.
#[derive(Default, Clone, Copy)]
pub struct Mix64(u64);

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

/// A GPU as far as scores go: total and free memory, free SMs, sharers, held whole, and a
/// hash of its model name (requests may accept some models only).
type GpuKey = (u64, u64, u32, u32, bool, u64);

/// A hash of what placement reads of `node` apart from its GPUs' identities: its GPUs as a
/// set (sorted; in order, with the topology, where it has one), its rules, its model and its
/// host room, continuing `prefix`. Nodes with the same hash get the same fit and the same
/// scores for a pod that names no GPU; a pod that names GPUs is judged by their identities
/// too (see the callers).
#[must_use]
pub fn alike_hash(prefix: &Mix64, node: &NodeState) -> u64 {
    use std::hash::{Hash, Hasher as _};
    let model = |pos: usize| {
        let mut h = Mix64::default();
        h.write(gpuslice_core::fit::NodeView::model(node, pos).as_bytes());
        h.finish()
    };
    let key = |pos: usize, g: &GpuRoom| -> GpuKey {
        (
            g.memory_total,
            g.memory_free,
            g.cores_free,
            g.sharers,
            g.exclusive,
            model(pos),
        )
    };
    let mut h = *prefix;
    node.rules.max_sharers.hash(&mut h);
    (node.model, node.cpu_free, node.mem_free).hash(&mut h);
    if let Some(t) = gpuslice_core::fit::NodeView::topology(node) {
        // Which GPUs a pod for several gets depends on where each GPU sits: the GPUs in
        // their order, with the topology.
        t.hash(&mut h);
        for (pos, g) in node.gpus.iter().enumerate() {
            key(pos, g).hash(&mut h);
        }
        return h.finish();
    }
    let mut small = [(0u64, 0u64, 0u32, 0u32, false, 0u64); 16];
    if node.gpus.len() <= small.len() {
        for (pos, (slot, g)) in small.iter_mut().zip(&node.gpus).enumerate() {
            *slot = key(pos, g);
        }
        let used = &mut small[..node.gpus.len()];
        used.sort_unstable();
        used.hash(&mut h);
    } else {
        let mut all: Vec<GpuKey> = node
            .gpus
            .iter()
            .enumerate()
            .map(|(p, g)| key(p, g))
            .collect();
        all.sort_unstable();
        all.hash(&mut h);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::{Duration, Instant};

    use super::{Mix, REMEMBER_SEEN_FOR, priorities_of};

    #[test]
    fn a_pod_filtered_again_counts_once_and_uids_long_unseen_are_let_go() {
        let mut mix = Mix::default();
        let pod = |uid: &str| serde_json::json!({"metadata": {"uid": uid}});
        let t0 = Instant::now();
        mix.observe_at(t0, &pod("a"), &[], &[]);
        mix.observe_at(t0 + Duration::from_secs(240), &pod("a"), &[], &[]);
        mix.observe_at(t0 + Duration::from_secs(300), &pod("b"), &[], &[]);
        assert_eq!((mix.pods(), mix.remembered()), (2, 2));
        // a is retried within the hour after it was last seen: still not counted again.
        mix.observe_at(t0 + REMEMBER_SEEN_FOR, &pod("a"), &[], &[]);
        assert_eq!(mix.pods(), 2);
        // b, bound long ago, is let go; a, seen recently, is kept.
        let later = t0 + REMEMBER_SEEN_FOR + Duration::from_secs(1800);
        mix.observe_at(later, &pod("c"), &[], &[]);
        assert_eq!((mix.pods(), mix.remembered()), (3, 2));
    }

    type Index = HashMap<(u64, u64), u32>;

    /// [`priorities_of`] for one score per node.
    fn priorities(scores: &[Option<(f64, f64)>], max: i64) -> Vec<i64> {
        let mut index = Index::new();
        let mut distinct: Vec<(f64, f64)> = Vec::new();
        let slots: Vec<Option<u32>> = scores
            .iter()
            .map(|s| {
                let s = (*s)?;
                Some(
                    *index
                        .entry((s.0.to_bits(), s.1.to_bits()))
                        .or_insert_with(|| {
                            distinct.push(s);
                            u32::try_from(distinct.len() - 1).unwrap_or(u32::MAX)
                        }),
                )
            })
            .collect();
        priorities_of(&distinct, &slots, max)
    }

    #[test]
    fn priorities_rank_by_the_measure_then_the_tie_break_over_the_whole_range() {
        // Three nodes tie on the measure (0.0) and differ by the tie-break; one is worse.
        let scores = [
            Some((0.0, 3.0)),
            Some((0.0, 1.0)),
            None,
            Some((0.0, 2.0)),
            Some((0.5, 0.0)),
            Some((0.0, 1.0 + 1e-12)),
        ];
        assert_eq!(priorities(&scores, 10), [3, 10, 0, 7, 0, 10]);
        assert_eq!(priorities(&[Some((1.0, 1.0)), None], 10), [10, 0]);
        assert_eq!(priorities(&[None, None], 10), [0, 0]);
        // Many distinct scores use every level from 0 to 10.
        let many: Vec<Option<(f64, f64)>> = (0..100).map(|i| Some((f64::from(i), 0.0))).collect();
        let p = priorities(&many, 10);
        assert_eq!((p[0], p[99]), (10, 0));
        for level in 0..=10 {
            assert!(p.contains(&level), "{level} unused: {p:?}");
        }
    }
}
