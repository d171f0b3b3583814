use super::*;
use gpuslice_core::quantity::MemoryQuantity;

const GIB: u64 = 1 << 30;

fn node(name: &str, gpus: usize) -> NodeState {
    NodeState {
        topology: None,
        kinds: 0,
        name: name.into(),
        model: 0,
        cpu_total: 64_000,
        cpu_free: 64_000,
        mem_total: 256 * GIB,
        mem_free: 256 * GIB,
        gpus: vec![GpuRoom::idle(16 * GIB); gpus],
        ids: Arc::from([]),
        rules: Rules {
            max_sharers: u32::MAX,
        },
    }
}

fn slice(memory: u64) -> Demand {
    Demand {
        cpu: 1000,
        mem: GIB,
        gpus: 1,
        shape: Shape {
            exclusive: false,
            memory: MemoryQuantity::Bytes(memory),
            cores: 0,
        },
        devices: Vec::new(),
        avoid: Vec::new(),
        gpu_models: ModelSelector::default(),
        models: None,
    }
}

fn whole(gpus: u32) -> Demand {
    Demand {
        gpus,
        shape: Shape::whole(),
        ..slice(0)
    }
}

fn share(milli: u32) -> Demand {
    Demand {
        shape: Shape {
            exclusive: false,
            memory: MemoryQuantity::PercentBasisPoints(milli * 10),
            cores: milli / 10,
        },
        ..slice(0)
    }
}

/// Places `demands` one by one and returns (node, gpu) of each.
fn run(
    nodes: &mut [NodeState],
    demands: &[Demand],
    policy: ClusterPolicy,
) -> Vec<(usize, Vec<usize>)> {
    let mut mix = TaskMix::default();
    let mut never = |_: usize| -> usize { unreachable!("no random policy here") };
    demands
        .iter()
        .map(|d| {
            mix.observe(d);
            let p = choose(nodes, d, policy, &mix, &mut never).expect("placed");
            apply(&mut nodes[p.node], d, &p.gpus);
            (p.node, p.gpus)
        })
        .collect()
}

fn policy(s: &str) -> ClusterPolicy {
    s.parse().unwrap()
}

#[test]
fn the_four_patterns_of_node_and_gpu_binpack_and_spread() {
    let four = vec![slice(4 * GIB); 4];
    let cases = [
        ("binpack", [(0, 0), (0, 0), (0, 0), (0, 0)]),
        ("binpack-spread", [(0, 0), (0, 1), (0, 2), (0, 3)]),
        ("spread-binpack", [(0, 0), (1, 0), (0, 0), (1, 0)]),
        ("spread-spread", [(0, 0), (1, 0), (0, 1), (1, 1)]),
        // Spread means the node axis, wherever it is written.
        ("spread", [(0, 0), (1, 0), (0, 0), (1, 0)]),
    ];
    for (name, want) in cases {
        let mut nodes = vec![node("a", 4), node("b", 4)];
        let got: Vec<(usize, usize)> = run(&mut nodes, &four, policy(name))
            .into_iter()
            .map(|(n, g)| (n, g[0]))
            .collect();
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn nothing_is_placed_past_a_gpu_or_a_node() {
    let mut nodes = vec![node("a", 1)];
    let mut mix = TaskMix::default();
    let d = slice(10 * GIB);
    mix.observe(&d);
    let mut never = |_: usize| 0;
    let p = choose(&nodes, &d, policy("binpack"), &mix, &mut never).unwrap();
    apply(&mut nodes[p.node], &d, &p.gpus);
    assert_eq!(
        choose(&nodes, &d, policy("binpack"), &mix, &mut never),
        None
    );
    assert_eq!(
        choose(&nodes, &whole(1), policy("binpack"), &mix, &mut never),
        None
    );
    let hungry = Demand {
        cpu: 65_000,
        ..slice(GIB)
    };
    assert_eq!(
        choose(&nodes, &hungry, policy("binpack"), &mix, &mut never),
        None
    );
}

#[test]
fn frag_aware_puts_a_half_gpu_beside_another_half_when_whole_gpus_are_wanted() {
    // Node a: one GPU half used. Spread would take an idle GPU; with whole-GPU pods in the
    // mix, frag-aware fills the half GPU and keeps the idle ones whole.
    let mut nodes = vec![node("a", 2), node("b", 2)];
    apply(&mut nodes[0], &share(500), &[0]);
    let mut mix = TaskMix::default();
    for _ in 0..3 {
        mix.observe(&whole(1));
    }
    mix.observe(&share(500));
    let mut never = |_: usize| 0;
    let p = choose(
        &nodes,
        &share(500),
        ClusterPolicy::FragAware,
        &mix,
        &mut never,
    )
    .unwrap();
    assert_eq!((p.node, p.gpus), (0, vec![0]));
    let spread = choose(&nodes, &share(500), policy("spread"), &mix, &mut never).unwrap();
    assert_ne!((spread.node, spread.gpus), (0, vec![0]));
}

#[test]
fn frag_aware_puts_a_pod_heavy_in_cpu_where_cpu_is_plentiful_and_not_where_it_strands_gpus() {
    // Two 8-GPU nodes alike but for their CPUs: 96 (12 a GPU) and 200.
    let mut nodes = vec![node("short", 8), node("plenty", 8)];
    for (n, cpus) in nodes.iter_mut().zip([96_000, 200_000]) {
        (n.cpu_total, n.cpu_free) = (cpus, cpus);
    }
    // The workload: whole GPUs with 12 CPUs each; then a half GPU with 40 CPUs.
    let gpu_pod = Demand {
        cpu: 12_000,
        ..whole(1)
    };
    let heavy = Demand {
        cpu: 40_000,
        ..share(500)
    };
    let mut mix = TaskMix::new(Weighting::Pods);
    for _ in 0..10 {
        mix.observe(&gpu_pod);
    }
    // On the short node it would leave 56 CPUs, enough for 4.67 of its 7.5 free GPUs at
    // 12 CPUs a GPU: the rest is stranded, though one more pod of each type still fits.
    let mut short = nodes[0].clone();
    apply(&mut short, &heavy, &[0]);
    let expected = 7.5 - 56.0 / 12.0;
    assert!(
        (mix.fragmentation(&short) - expected).abs() < 1e-9,
        "{} against {expected}",
        mix.fragmentation(&short)
    );
    let mut never = |_: usize| 0;
    let p = choose(&nodes, &heavy, ClusterPolicy::FragAware, &mix, &mut never).unwrap();
    assert_eq!(p.node, 1, "the node whose CPUs can feed its GPUs");
    // The paper's measure checks only that one pod of each type still fits: both nodes
    // score alike there, and the first wins.
    let paper = TaskMix::typical(&[gpu_pod], 1.0);
    assert_eq!(paper.fragmentation(&short), 0.5, "the half GPU left only");
    let p = choose(&nodes, &heavy, ClusterPolicy::FragAware, &paper, &mut never).unwrap();
    assert_eq!(p.node, 0);
}

#[test]
fn a_node_that_cannot_host_a_class_counts_all_its_free_share_as_fragment() {
    let mut n = node("a", 2);
    let mut mix = TaskMix::default();
    mix.observe(&share(500));
    assert_eq!(
        mix.fragmentation(&n),
        0.0,
        "an idle node strands nothing for half GPUs"
    );
    n.cpu_free = 500;
    assert!(
        (mix.fragmentation(&n) - 2.0).abs() < 1e-9,
        "no CPU left: both GPUs stranded"
    );
    let mut m = node("b", 2);
    apply(&mut m, &share(700), &[0]);
    // 0.3 left on GPU 0 cannot host a half: a fragment; GPU 1 can.
    assert!((mix.fragmentation(&m) - 0.3).abs() < 1e-9);
}

#[test]
fn a_pod_goes_only_to_the_gpu_models_it_accepts() {
    let mut nodes = vec![node("a", 2), node("b", 2)];
    nodes[1].model = 3;
    let d = Demand {
        models: Some(1 << 3),
        ..share(250)
    };
    let got = run(&mut nodes, &[d.clone(), d], policy("binpack"));
    assert!(got.iter().all(|(n, _)| *n == 1), "{got:?}");
}

#[test]
fn multi_gpu_and_whole_gpu_pods_take_distinct_untouched_gpus() {
    let mut nodes = vec![node("a", 4)];
    apply(&mut nodes[0], &share(100), &[1]);
    let got = run(&mut nodes, &[whole(2)], policy("binpack"));
    assert_eq!(got, vec![(0, vec![0, 2])]);
    assert!(nodes[0].gpus[0].exclusive && nodes[0].gpus[2].exclusive);
    let mut never = |_: usize| 0;
    assert_eq!(
        choose(
            &nodes,
            &whole(2),
            policy("binpack"),
            &TaskMix::default(),
            &mut never
        ),
        None
    );
}

#[test]
fn mixes_of_the_same_shares_are_at_distance_zero_and_disjoint_ones_at_one() {
    let mut a = TaskMix::new(Weighting::Pods);
    let mut b = TaskMix::new(Weighting::Pods);
    for d in [slice(GIB), slice(2 * GIB)] {
        a.observe(&d);
        b.observe(&d);
        b.observe(&d);
    }
    assert!(a.distance(&b).abs() < 1e-12, "twice the pods, same shares");
    let mut c = TaskMix::new(Weighting::Pods);
    c.observe(&whole(1));
    assert!((a.distance(&c) - 1.0).abs() < 1e-12);
    assert!((c.distance(&a) - 1.0).abs() < 1e-12);
    // a: 1/2, 1/2; a + one 4 GiB pod: 1/3, 1/3, 1/3 → (1/6 + 1/6 + 1/3) / 2 = 1/3.
    let mut d = a.clone();
    d.observe(&slice(4 * GIB));
    assert!((a.distance(&d) - 1.0 / 3.0).abs() < 1e-12);
    assert_eq!(TaskMix::default().distance(&TaskMix::default()), 0.0);
}

#[test]
fn best_fit_scores_as_the_fgd_simulator_does_and_gives_ties_to_the_name_that_sorts_first() {
    // Node 0 has half its CPUs taken and one GPU half used; nodes 1 and 2 are idle and equal.
    let mut nodes = vec![node("a", 2), node("b", 2), node("c", 2)];
    apply(
        &mut nodes[0],
        &Demand {
            cpu: 32_000,
            ..share(500)
        },
        &[0],
    );
    let mix = TaskMix::default();
    let d = share(250);
    let mut never = |_: usize| -> usize { unreachable!("no random pick") };
    let p = choose(&nodes, &d, ClusterPolicy::BestFit, &mix, &mut never).unwrap();
    assert_eq!(
        (p.node, p.gpus),
        (0, vec![0]),
        "best fit on the fullest node and GPU"
    );
    // Among equal nodes, the one whose name sorts first (the simulator names nodes by a
    // random permutation per run), wherever it is in the list.
    let idle = vec![node("2-b", 2), node("0-c", 2), node("1-a", 2)];
    let p = choose(&idle, &d, ClusterPolicy::BestFit, &mix, &mut never).unwrap();
    assert_eq!(p.node, 1);
}

#[test]
fn dot_product_prefers_the_node_whose_free_resources_align_least_with_the_request() {
    // As the FGD simulator's plugin scores it: (1 − (free · request) / 2) × 100, truncated,
    // the highest wins: 93 for the idle node, 94 for the busy one.
    let mut nodes = vec![node("idle", 8), node("busy", 8)];
    apply(
        &mut nodes[1],
        &Demand {
            cpu: 48_000,
            ..whole(1)
        },
        &[0],
    );
    let mix = TaskMix::default();
    let mut never = |_: usize| -> usize { unreachable!("no random pick") };
    let p = choose(
        &nodes,
        &whole(1),
        ClusterPolicy::DotProduct,
        &mix,
        &mut never,
    )
    .unwrap();
    assert_eq!(p.node, 1, "the busy node has less free where the pod asks");
    // Scores that truncate to the same integer tie, and the name decides.
    // y has a little less free (it would win untruncated); x sorts first.
    let mut small = vec![node("y", 2), node("x", 2)];
    apply(&mut small[0], &share(50), &[0]);
    let p = choose(
        &small,
        &share(100),
        ClusterPolicy::DotProduct,
        &mix,
        &mut never,
    )
    .unwrap();
    assert_eq!(p.node, 1, "both score 99: x sorts first");
}

#[test]
fn gpu_packing_takes_a_shared_gpu_then_an_idle_gpu_of_a_busy_node_then_an_idle_node() {
    // The simulator's three tiers: a shared GPU scores 100 − its free % / 10 (at least 50),
    // an idle GPU of a busy node 50 − the idle GPUs taken, an idle node 33 − its GPUs.
    let mut nodes = vec![node("a-idle", 2), node("b-busy", 2), node("c-shared", 2)];
    apply(&mut nodes[1], &whole(1), &[0]);
    apply(&mut nodes[2], &share(300), &[1]);
    let mix = TaskMix::default();
    let mut never = |_: usize| -> usize { unreachable!("no random pick") };
    let mut pick = |nodes: &[NodeState], d: &Demand| {
        let p = choose(nodes, d, ClusterPolicy::GpuPacking, &mix, &mut never).unwrap();
        (p.node, p.gpus)
    };
    assert_eq!(pick(&nodes, &share(500)), (2, vec![1]), "the shared GPU");
    assert_eq!(
        pick(&nodes, &share(800)),
        (1, vec![1]),
        "too big for the shared GPU: the idle GPU of the busy node"
    );
    assert_eq!(
        pick(&nodes, &whole(2)),
        (0, vec![0, 1]),
        "only the idle node fits"
    );
    // Pods without GPUs score 0 everywhere: the name decides.
    let cpu_only = Demand {
        gpus: 0,
        ..share(0)
    };
    assert_eq!(pick(&nodes, &cpu_only).0, 0);
}

#[test]
fn gpu_clustering_gathers_each_kind_of_gpu_pod_on_nodes_that_hold_that_kind() {
    let mut nodes = vec![node("a", 4), node("b", 4), node("c", 4)];
    apply(&mut nodes[1], &share(500), &[0]);
    apply(&mut nodes[2], &whole(1), &[0]);
    assert_eq!(nodes[1].kinds, paper::kind(&share(100)));
    let mix = TaskMix::default();
    let mut never = |_: usize| -> usize { unreachable!("no random pick") };
    let mut pick = |d: &Demand| {
        choose(&nodes, d, ClusterPolicy::GpuClustering, &mix, &mut never)
            .unwrap()
            .node
    };
    assert_eq!(pick(&share(200)), 1, "with the other shared-GPU pod");
    assert_eq!(pick(&whole(1)), 2, "with the other one-GPU pod");
    assert_eq!(
        pick(&whole(2)),
        0,
        "a new kind: the idle node before mixed ones"
    );
}

#[test]
fn fgd_measures_against_the_most_common_types_that_make_up_95_percent() {
    // 96 pods of one type and 4 of another: the rare type is left out, so the mix is the
    // common type alone.
    let common = share(500);
    let rare = whole(2);
    let list: Vec<Demand> = std::iter::repeat_n(common.clone(), 96)
        .chain(std::iter::repeat_n(rare.clone(), 4))
        .collect();
    let typical = TaskMix::typical(&list, 0.95);
    let mut alone = TaskMix::new(Weighting::Pods);
    alone.observe(&common);
    assert!(typical.distance(&alone) < 1e-12);
    let all = TaskMix::typical(&list, 1.0);
    assert!(all.distance(&alone) > 0.03);
    // Pods without GPUs see all of a node's free GPU as fragment (the paper's reading).
    let cpu_only = Demand {
        gpus: 0,
        ..share(0)
    };
    let with_cpu = TaskMix::typical(&[cpu_only], 1.0);
    let n = node("a", 2);
    assert!((with_cpu.fragmentation(&n) - 2.0).abs() < 1e-9);
}

#[test]
fn a_pod_that_could_go_anywhere_leaves_alone_the_scarce_model_other_pods_name() {
    // Node 0: two GPUs of model 1, the only ones pods naming that model can use. Nodes 1-3:
    // eight GPUs of model 0. The mix: as many 8-GPU pods as pods naming model 1.
    let mut scarce = node("scarce", 2);
    scarce.model = 1;
    let cluster = vec![scarce, node("a", 8), node("b", 8), node("c", 8)];
    let named = Demand {
        models: Some(1 << 1),
        ..whole(1)
    };
    let mut mix = TaskMix::new(Weighting::Pods);
    for _ in 0..10 {
        mix.observe(&whole(8));
        mix.observe(&named);
    }
    mix.observe(&whole(1));
    let mut never = |_: usize| -> usize { unreachable!("no random policy here") };
    let place = |mix: &TaskMix, never: &mut dyn FnMut(usize) -> usize| {
        choose(&cluster, &whole(1), ClusterPolicy::FragAware, mix, never)
            .unwrap()
            .node
    };
    // Counted by share alone, the scarce node looks like room the 8-GPU pods cannot use.
    assert_eq!(place(&mix, &mut never), 0);
    // Weighed by scarcity (26 GPUs free, 2 of them usable by the named pods, 24 by the
    // 8-GPU pods), the pod goes where only the plentiful capacity shrinks.
    mix.weigh_by_scarcity(cluster.iter().map(|n| (n, 1)));
    assert_ne!(place(&mix, &mut never), 0);
}

#[test]
fn nodes_alike_given_once_with_their_count_weigh_as_much_as_each_given_alone() {
    let mut scarce = node("scarce", 2);
    scarce.model = 1;
    let mut half = node("half", 8);
    apply(&mut half, &whole(4), &[0, 1, 2, 3]);
    let each = [
        scarce.clone(),
        node("a", 8),
        node("b", 8),
        half.clone(),
        half.clone(),
    ];
    let grouped = [(&scarce, 1), (&each[1], 2), (&half, 2)];
    let named = Demand {
        models: Some(1 << 1),
        ..whole(1)
    };
    let observed = || {
        let mut mix = TaskMix::new(Weighting::Pods);
        for _ in 0..10 {
            mix.observe(&whole(8));
            mix.observe(&named);
            mix.observe(&share(300));
        }
        mix
    };
    let (mut one_by_one, mut by_kind) = (observed(), observed());
    one_by_one.weigh_by_scarcity(each.iter().map(|n| (n, 1)));
    by_kind.weigh_by_scarcity(grouped);
    let before = observed();
    assert!(
        one_by_one.distance(&before) > 0.01,
        "scarcity changed nothing"
    );
    assert!(
        one_by_one.distance(&by_kind) < 1e-12,
        "grouped {}",
        one_by_one.distance(&by_kind)
    );
}

#[test]
fn recent_pods_count_more_once_a_half_life_is_set() {
    let (a, b) = (whole(1), share(500));
    let mut steady = TaskMix::new(Weighting::Pods);
    let mut decaying = TaskMix::new(Weighting::Pods);
    decaying.set_half_life(10.0);
    for m in [&mut steady, &mut decaying] {
        for _ in 0..40 {
            m.observe(&a);
        }
        for _ in 0..40 {
            m.observe(&b);
        }
    }
    let only_b = {
        let mut m = TaskMix::new(Weighting::Pods);
        m.observe(&b);
        m
    };
    // Without decay the two halves weigh alike; with a half-life of 10 GPUs, the 40 whole
    // GPUs asked for 20 GPUs ago (two half-lives and more) weigh about a tenth of b's.
    assert!((steady.distance(&only_b) - 0.5).abs() < 1e-9);
    let d = decaying.distance(&only_b);
    assert!(d > 0.05 && d < 0.2, "{d}");
    // Long runs fold the clock into the weights without losing the shares.
    for _ in 0..100_000 {
        decaying.observe(&a);
    }
    assert!(decaying.distance(&only_b) > 0.99);
    assert!(decaying.weight().is_finite());
}

/// Four GPUs, pairs (0,1) and (2,3) bridged by NVLink, each pair behind its own PCIe switch.
fn bridged_pairs() -> Topology {
    gpuslice_core::topology::Layout::NvlinkPairs.topology(4)
}

#[test]
fn a_pod_for_two_gpus_gets_an_nvlink_pair_where_the_node_publishes_its_topology() {
    let mut n = node("n", 4);
    // GPUs 1 and 2 are the fullest: binpack alone takes them, across the pairs.
    apply(&mut n, &slice(8 * GIB), &[1]);
    apply(&mut n, &slice(8 * GIB), &[2]);
    let mut two = slice(4 * GIB);
    two.gpus = 2;
    assert_eq!(candidates(&n, &two), vec![vec![1, 2]]);
    n.topology = Some(Arc::new(bridged_pairs()));
    let pair = candidates(&n, &two);
    assert!(pair == [vec![0, 1]] || pair == [vec![2, 3]], "{pair:?}");
    // Whole GPUs alike: with GPU 1 in use, the first two untouched (0 and 2) are not bridged;
    // 2 and 3 are a pair.
    let mut n = node("n", 4);
    apply(&mut n, &slice(8 * GIB), &[1]);
    assert_eq!(candidates(&n, &whole(2)), vec![vec![0, 2]]);
    n.topology = Some(Arc::new(bridged_pairs()));
    assert_eq!(candidates(&n, &whole(2)), vec![vec![2, 3]]);
    // A topology that does not match the GPUs is not trusted.
    n.topology = Some(Arc::new(Topology::default()));
    assert_eq!(NodeView::topology(&n), None);
}

#[test]
fn a_pod_for_two_gpus_goes_to_the_node_where_they_are_closest_under_gpuslices_policies() {
    // Node 0 is fuller (binpack's choice) but its two free GPUs are not bridged; node 1 is
    // empty and has an NVLink pair.
    let mut fuller = node("fuller", 4);
    apply(&mut fuller, &slice(12 * GIB), &[1]);
    apply(&mut fuller, &slice(12 * GIB), &[3]);
    let mut nodes = vec![fuller, node("empty", 4)];
    let mut two = slice(12 * GIB);
    two.gpus = 2;
    let mix = TaskMix::default();
    let binpack = ClusterPolicy::Axes {
        node: Axis::Binpack,
        gpu: Axis::Binpack,
    };
    let chosen = |nodes: &[NodeState], policy| {
        choose(nodes, &two, policy, &mix, &mut |_| 0).map(|p| (p.node, p.gpus))
    };
    assert_eq!(chosen(&nodes, binpack), Some((0, vec![0, 2])));
    for n in &mut nodes {
        n.topology = Some(Arc::new(bridged_pairs()));
    }
    for policy in [binpack, ClusterPolicy::FragAware] {
        assert_eq!(chosen(&nodes, policy), Some((1, vec![0, 1])), "{policy:?}");
    }
}
