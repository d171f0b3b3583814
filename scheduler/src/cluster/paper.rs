//! The baselines of the FGD paper (Weng et al., "Beware of Fragmentation", ATC'23) and FGD
//! itself, as the paper's public simulator runs them (hkust-adsl/kubernetes-scheduler-simulator,
//! read for its definitions). Each is a kube-scheduler score plugin there: a node's score is
//! an integer, normalized over the nodes that fit where the plugin normalizes (best-fit), the
//! highest wins, and equal scores go to the node whose name sorts first (that simulator's
//! kube-scheduler is patched so "for reproducibility"; upstream picks at random). On the node
//! the GPU is chosen as its default "best" selection does: the fitting GPU with least free
//! share, the first of equal ones (whole GPUs: the first idle ones); FGD by its own score.

use super::{ClusterPolicy, Demand, NodeState, Placement, TIE, TaskMix, after};
use gpuslice_core::fit::GpuRoom;

/// kube-scheduler's highest node score.
const MAX_NODE_SCORE: i64 = 100;

/// The simulator's normalization of CPU (milli-CPU of its largest node) and GPU (milli-GPU of
/// 8 GPUs) for best-fit and dot-product, and of a node's free GPU for gpu-clustering.
const CPU_SPEC: f64 = 128_000.0;
const GPU_SPEC: f64 = 8_000.0;
const GPU_SPEC_MILLI: i64 = 8_000;

/// Whether `policy` is one of the paper's, placed by [`pick`].
pub(super) fn is_paper_policy(policy: ClusterPolicy) -> bool {
    matches!(
        policy,
        ClusterPolicy::BestFit
            | ClusterPolicy::DotProduct
            | ClusterPolicy::GpuPacking
            | ClusterPolicy::GpuClustering
            | ClusterPolicy::Fgd
    )
}

/// Where the paper's simulator puts `d` under `policy`, of the nodes and GPU sets in
/// `options`; `mix` is FGD's typical pods.
pub(super) fn pick(
    nodes: &[NodeState],
    options: &[(usize, Vec<Vec<usize>>)],
    d: &Demand,
    policy: ClusterPolicy,
    mix: &TaskMix,
) -> Option<Placement> {
    let scored: Vec<(i64, usize, &Vec<usize>)> = options
        .iter()
        .filter_map(|(i, cands)| {
            let node = &nodes[*i];
            let (points, gpus) = if policy == ClusterPolicy::Fgd {
                fgd(node, d, cands, mix)?
            } else {
                let gpus = best_fit_gpus(node, cands)?;
                (points(policy, node, d, gpus), gpus)
            };
            Some((points, *i, gpus))
        })
        .collect();
    let lowest = scored.iter().map(|s| s.0).min()?;
    let highest = scored.iter().map(|s| s.0).max()?;
    let normalize = policy == ClusterPolicy::BestFit;
    let normalized = |p: i64| match (normalize, highest == lowest) {
        (false, _) => p,
        (true, true) => 0,
        (true, false) => (p - lowest) * MAX_NODE_SCORE / (highest - lowest),
    };
    let top = scored.iter().map(|s| normalized(s.0)).max()?;
    let (_, node, gpus) = scored
        .iter()
        .filter(|s| normalized(s.0) == top)
        .min_by(|a, b| nodes[a.1].name.cmp(&nodes[b.1].name))?;
    Some(Placement {
        node: *node,
        gpus: (*gpus).clone(),
    })
}

/// The simulator's "best" GPU selection: the candidate whose GPUs have least free share (the
/// same is taken from each candidate), the first of equal ones.
fn best_fit_gpus<'a>(node: &NodeState, cands: &'a [Vec<usize>]) -> Option<&'a Vec<usize>> {
    let free = |c: &[usize]| -> f64 { c.iter().map(|&i| node.gpus[i].free_share()).sum() };
    let mut best: Option<(f64, &Vec<usize>)> = None;
    for c in cands {
        let f = free(c);
        if best.is_none_or(|(b, _)| f < b - TIE) {
            best = Some((f, c));
        }
    }
    best.map(|(_, c)| c)
}

/// A node's integer score under a baseline other than FGD, `d` going on `gpus`.
#[allow(clippy::cast_possible_truncation)]
fn points(policy: ClusterPolicy, node: &NodeState, d: &Demand, gpus: &[usize]) -> i64 {
    match policy {
        ClusterPolicy::BestFit => {
            // What is left, CPU and GPU weighed equally, each against the cluster-wide
            // maximum (not the node's own size); the least wins.
            let next = after(node, d, gpus);
            let left = 0.5 * next.cpu_free as f64 / CPU_SPEC
                + 0.5 * next.gpu_free_share() * 1000.0 / GPU_SPEC;
            ((1.0 - left) * 100.0) as i64
        }
        ClusterPolicy::DotProduct => ((1.0 - dot_product_figure(node, d)) * 100.0) as i64,
        ClusterPolicy::GpuPacking => packing_points(node, d, gpus),
        ClusterPolicy::GpuClustering => clustering_points(node, d),
        _ => 0,
    }
}

/// Dot-product as the paper ran it ("merge" dimensions, "max" norm): the node's free CPU and
/// free GPU share (summed over its GPUs), before the pod, against the pod's request, each over
/// the cluster-wide maximum, averaged over the two. The smallest wins: the node with least
/// free where the pod asks most.
fn dot_product_figure(node: &NodeState, d: &Demand) -> f64 {
    let req_gpu = if d.gpus == 0 {
        0.0
    } else {
        let total = node.gpus.first().map_or(1, |g| g.memory_total);
        d.gpu_share(total) * 1000.0
    };
    let dot = (node.cpu_free as f64 / CPU_SPEC) * (d.cpu as f64 / CPU_SPEC)
        + (node.gpu_free_share() * 1000.0 / GPU_SPEC) * (req_gpu / GPU_SPEC);
    dot / 2.0
}

/// A GPU's free share in milli-GPU, as the simulator counts it.
#[allow(clippy::cast_possible_truncation)]
fn milli(g: &GpuRoom) -> i64 {
    (g.free_share() * 1000.0).round() as i64
}

/// gpu-packing, in three tiers from high to low: GPUs already shared
/// (100 − their free % / 10, at least 50), then idle GPUs of a node in use (50 − the idle GPUs
/// it takes, at least 33), then an idle node (33 − its GPUs). Pods without GPUs score 0.
fn packing_points(node: &NodeState, d: &Demand, gpus: &[usize]) -> i64 {
    if d.gpus == 0 {
        return 0;
    }
    let count = |it: &mut dyn Iterator<Item = &GpuRoom>| {
        i64::try_from(it.filter(|g| g.untouched()).count()).unwrap_or(i64::MAX)
    };
    let idle = count(&mut node.gpus.iter());
    if idle == node.gpus.len() as i64 {
        return (MAX_NODE_SCORE / 3 - idle).max(idle);
    }
    let idle_taken = count(&mut gpus.iter().map(|&i| &node.gpus[i]));
    if idle_taken > 0 {
        return (MAX_NODE_SCORE / 2 - idle_taken).max(MAX_NODE_SCORE / 3);
    }
    let free_pct: i64 = gpus
        .iter()
        .map(|&i| milli(&node.gpus[i]) * 100 / 1000)
        .sum();
    (MAX_NODE_SCORE - free_pct / 10).max(MAX_NODE_SCORE / 2)
}

/// The kind of GPU pod `d` is, for gpu-clustering: bit 0 a shared GPU, bit k k whole GPUs
/// (k ≥ 63 sharing the last bit); 0 for a pod without GPUs.
#[must_use]
pub fn kind(d: &Demand) -> u64 {
    match (d.gpus, d.shape.exclusive) {
        (0, _) => 0,
        (_, false) => 1,
        (k, true) => 1 << k.min(63),
    }
}

/// gpu-clustering: pods of a kind gathered on nodes holding only that kind (75–100), then on
/// nodes holding it among others (50–75), then idle nodes (25–50), then the rest (0–25); within
/// each band, the node with least free GPU first. Pods without GPUs score 0.
fn clustering_points(node: &NodeState, d: &Demand) -> i64 {
    let mine = kind(d);
    if mine == 0 {
        return 0;
    }
    let left: i64 = node.gpus.iter().map(milli).sum();
    let fill = MAX_NODE_SCORE / 4 * (GPU_SPEC_MILLI - left) / GPU_SPEC_MILLI;
    let band = if node.kinds & mine != 0 {
        if node.kinds == mine { 3 } else { 2 }
    } else if node.kinds == 0 {
        1
    } else {
        0
    };
    fill + band * MAX_NODE_SCORE / 4
}

/// FGD: each candidate scores `sigmoid(fragmentation before − after, in GPUs) × 100`,
/// truncated (the simulator's milli-GPU over 1000); a node scores its best candidate, the
/// first of equal ones (for a pod of whole GPUs, the first idle ones).
#[allow(clippy::cast_possible_truncation)]
fn fgd<'a>(
    node: &NodeState,
    d: &Demand,
    cands: &'a [Vec<usize>],
    mix: &TaskMix,
) -> Option<(i64, &'a Vec<usize>)> {
    let before = mix.fragmentation(node);
    let points = |drop: f64| (MAX_NODE_SCORE as f64 / (1.0 + (-drop).exp())) as i64;
    let mut best: Option<(i64, &Vec<usize>)> = None;
    for c in cands {
        let p = points(before - mix.fragmentation(&after(node, d, c)));
        if best.is_none_or(|(b, _)| p > b) {
            best = Some((p, c));
        }
    }
    best
}
