use super::*;

fn slice(id: &str) -> Slice {
    (id.to_string(), "GPU-0".to_string())
}

/// Runs `seconds` of passes every 100 ms for a slice with `share` and `burst` using `rate` of
/// the GPU; returns how many passes left it in debt.
fn passes_in_debt(b: &mut Balances, start: Instant, seconds: u32, share: f64, rate: f64) -> usize {
    let shares = BTreeMap::from([(slice("a"), (share, 3.0))]);
    (1..=seconds * 10)
        .filter(|i| {
            let now = start + Duration::from_millis(u64::from(*i) * 100);
            !b.pass(&shares, &[(slice("a"), rate * 0.1)], now).is_empty()
        })
        .count()
}

#[test]
fn a_slice_that_keeps_to_its_share_is_never_in_debt() {
    let mut b = Balances::default();
    let start = Instant::now();
    assert_eq!(passes_in_debt(&mut b, start, 600, 0.3, 0.3), 0);
}

#[test]
fn a_slice_over_its_share_runs_into_debt_once_its_burst_is_spent_and_out_of_it_at_its_share() {
    let mut b = Balances::default();
    let start = Instant::now();
    let shares = BTreeMap::from([(slice("a"), (0.3, 3.0))]);
    // Flat out: 0.7 s a second beyond its share; the 3 s burst lasts 4.3 s.
    let mut first_debt = None;
    for i in 1..=100u32 {
        let now = start + Duration::from_millis(u64::from(i) * 100);
        let debts = b.pass(&shares, &[(slice("a"), 0.1)], now);
        if !debts.is_empty() && first_debt.is_none() {
            first_debt = Some(i);
        }
    }
    assert_eq!(first_debt, Some(43), "4.3 s in");
    // The debt stops at the burst, then idle (held): it earns 0.3 s a second back.
    let later = start + Duration::from_secs(10);
    let debt = b.pass(&shares, &[], later)[&slice("a")];
    assert!((debt + 3.0).abs() < 1e-9, "{debt}");
    let back = b.pass(&shares, &[], later + Duration::from_millis(9_900));
    assert_eq!(back.len(), 1, "still 0.03 s in debt");
    let back = b.pass(&shares, &[], later + Duration::from_secs(10));
    assert!(back.is_empty(), "{back:?}");
    // A slice no longer measured is forgotten, and one measured again starts with its burst.
    b.pass(&BTreeMap::new(), &[], later + Duration::from_secs(11));
    assert!(b.slices.is_empty());
}

#[test]
fn the_time_held_brings_a_flat_out_slice_to_its_share_on_average() {
    // A flat-out slice is held whenever it is in debt: it runs only in the passes it is not.
    let mut b = Balances::default();
    let start = Instant::now();
    let shares = BTreeMap::from([(slice("a"), (0.3, 3.0))]);
    let mut ran = 0u32;
    let mut held = false;
    for i in 1..=6_000u32 {
        let now = start + Duration::from_millis(u64::from(i) * 100);
        let used = if held { 0.0 } else { 0.1 };
        ran += u32::from(!held);
        held = !b.pass(&shares, &[(slice("a"), used)], now).is_empty();
    }
    // 600 s: its share (180 s) and its burst (3 s).
    let used = f64::from(ran) * 0.1;
    assert!((used - 183.0).abs() <= 0.2, "{used}");
}

const HYBRID: &str = "\
25 1 0:23 / /sys/fs/cgroup ro,nosuid,nodev,noexec - tmpfs tmpfs ro,mode=755
26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw
30 25 0:28 / /sys/fs/cgroup/freezer rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,freezer
31 25 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,cpu,cpuacct
";

#[test]
fn the_hierarchies_are_found_in_a_mountinfo() {
    let h = Hierarchies::parse(HYBRID);
    assert_eq!(
        h.unified,
        [Mount {
            point: "/sys/fs/cgroup/unified".into(),
            root: "/".into()
        }]
    );
    assert_eq!(
        h.freezer
            .iter()
            .map(|m| m.point.clone())
            .collect::<Vec<_>>(),
        [PathBuf::from("/sys/fs/cgroup/freezer")]
    );
    let unified = Hierarchies::parse(
        "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n",
    );
    assert!(unified.unified.len() == 1 && unified.freezer.is_empty());
    // A mount of a cgroup below the root (a cgroup namespace's view) maps paths below it.
    let m = Mount {
        point: "/c".into(),
        root: "/kubepods".into(),
    };
    assert_eq!(
        m.dir_of("/kubepods/pod1/x"),
        Some(PathBuf::from("/c/pod1/x"))
    );
    assert_eq!(m.dir_of("/kubepods"), Some(PathBuf::from("/c/")));
    assert_eq!(m.dir_of("/kubepods1/x"), None);
    assert_eq!(m.dir_of("/other"), None);
    assert_eq!(m.dir_of("/kubepods/../x"), None);
}

/// A directory standing for the cgroup file systems: `unified/` and `freezer/`, each with
/// cgroups `c1` and `agent` holding a thawed freezer file.
fn fake_cgroupfs() -> (tempfile::TempDir, Hierarchies) {
    let dir = tempfile::tempdir().unwrap();
    for (h, file, thawed) in [
        ("unified", "cgroup.freeze", "0"),
        ("freezer", "freezer.state", "THAWED"),
    ] {
        for c in ["c1", "agent", "c2/sub"] {
            let d = dir.path().join(h).join(c);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join(file), thawed).unwrap();
        }
    }
    let mount = |h: &str| Mount {
        point: dir.path().join(h),
        root: "/".into(),
    };
    let h = Hierarchies {
        unified: vec![mount("unified")],
        freezer: vec![mount("freezer")],
    };
    (dir, h)
}

#[test]
fn a_container_is_frozen_through_its_unified_cgroup_else_its_v1_freezer_and_never_the_agents() {
    let (dir, h) = fake_cgroupfs();
    let own = Cgroups::parse("6:freezer:/agent\n0::/agent\n");
    let both = Cgroups::parse("6:freezer:/c1\n0::/c1\n");
    assert_eq!(
        h.freeze_file(&both, &own),
        Some(FreezeFile(dir.path().join("unified/c1/cgroup.freeze")))
    );
    // On a hybrid host whose runtime placed it in the v1 hierarchies alone.
    let v1_only = Cgroups::parse("6:freezer:/c1\n0::/\n");
    assert_eq!(
        h.freeze_file(&v1_only, &own),
        Some(FreezeFile(dir.path().join("freezer/c1/freezer.state")))
    );
    // The agent's own cgroup, one above it, the root and a cgroup without a freezer file.
    for cg in [
        "6:freezer:/agent\n0::/agent\n",
        "6:freezer:/\n0::/\n",
        "6:freezer:/gone\n0::/gone\n",
    ] {
        assert_eq!(h.freeze_file(&Cgroups::parse(cg), &own), None, "{cg}");
    }
    let inside = Cgroups::parse("0::/c2/sub/agent\n");
    assert_eq!(
        h.freeze_file(&Cgroups::parse("0::/c2/sub\n"), &inside),
        None,
        "the agent's own container"
    );
}

#[test]
fn a_hold_is_recorded_before_the_freeze_and_a_new_agent_thaws_what_a_dead_one_left() {
    let (dir, h) = fake_cgroupfs();
    let records = dir.path().join("frozen");
    let (mut f, thawed) = Freezer::open(records.clone()).unwrap();
    assert!(thawed.is_empty());
    let own = Cgroups::parse("0::/agent\n");
    let file = h.freeze_file(&Cgroups::parse("0::/c1\n"), &own).unwrap();
    assert!(f.hold("c1", std::slice::from_ref(&file)).unwrap());
    assert!(f.is_held("c1"));
    assert_eq!(std::fs::read_to_string(file.path()).unwrap(), "1");
    assert_eq!(
        std::fs::read_to_string(records.join("c1")).unwrap(),
        file.path().display().to_string()
    );
    // The agent dies holding it: the next one thaws it and forgets the record.
    drop(f);
    let (f, thawed) = Freezer::open(records.clone()).unwrap();
    assert_eq!(thawed, ["c1"]);
    assert_eq!(std::fs::read_to_string(file.path()).unwrap(), "0");
    assert!(!f.is_held("c1") && std::fs::read_dir(&records).unwrap().next().is_none());
}

#[test]
fn a_container_paused_by_someone_else_is_left_to_them_and_a_stopping_agent_thaws_its_own() {
    let (dir, h) = fake_cgroupfs();
    let (mut f, _) = Freezer::open(dir.path().join("frozen")).unwrap();
    let own = Cgroups::parse("6:freezer:/agent\n0::/\n");
    let paused = h
        .freeze_file(&Cgroups::parse("6:freezer:/c1\n0::/\n"), &own)
        .unwrap();
    std::fs::write(paused.path(), "FROZEN\n").unwrap();
    assert!(
        !f.hold("c1", std::slice::from_ref(&paused)).unwrap(),
        "runc paused it"
    );
    assert!(!f.is_held("c1"));
    let mine = h
        .freeze_file(&Cgroups::parse("6:freezer:/c2/sub\n0::/\n"), &own)
        .unwrap();
    assert!(f.hold("c2", std::slice::from_ref(&mine)).unwrap());
    assert_eq!(std::fs::read_to_string(mine.path()).unwrap(), "FROZEN");
    f.stop();
    assert_eq!(std::fs::read_to_string(mine.path()).unwrap(), "THAWED");
    assert_eq!(std::fs::read_to_string(paused.path()).unwrap(), "FROZEN\n");
    assert!(
        !f.hold("c2", &[mine]).unwrap(),
        "a stopped agent holds nothing"
    );
    // A record naming anything but a freezer file is not written to.
    let records = dir.path().join("frozen");
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "kept").unwrap();
    std::fs::write(records.join("x"), victim.display().to_string()).unwrap();
    let (_, thawed) = Freezer::open(records).unwrap();
    assert!(thawed.is_empty());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "kept");
}

#[test]
fn a_claim_several_containers_use_is_held_whole_a_container_joining_it_too_and_thawed_whole() {
    let (dir, h) = fake_cgroupfs();
    let records = dir.path().join("frozen");
    let (mut f, _) = Freezer::open(records.clone()).unwrap();
    let own = Cgroups::parse("6:freezer:/agent\n0::/agent\n");
    let unified = |c: &str| {
        h.freeze_file(&Cgroups::parse(&format!("0::/{c}\n")), &own)
            .unwrap()
    };
    let (first, later) = (unified("c1"), unified("c2/sub"));
    let v1 = h
        .freeze_file(&Cgroups::parse("6:freezer:/c2/sub\n0::/\n"), &own)
        .unwrap();
    let state = |file: &FreezeFile| std::fs::read_to_string(file.path()).unwrap();
    assert!(f.hold("shared", std::slice::from_ref(&first)).unwrap());
    // A second container reported for the claim while it is held; the first given again.
    assert!(f.hold("shared", &[later.clone(), first.clone()]).unwrap());
    assert_eq!((state(&first), state(&later)), ("1".into(), "1".into()));
    assert_eq!(
        std::fs::read_to_string(records.join("shared")).unwrap(),
        format!("{}\n{}", first.path().display(), later.path().display())
    );
    f.release("shared").unwrap();
    assert_eq!((state(&first), state(&later)), ("0".into(), "0".into()));
    assert!(!f.is_held("shared") && !records.join("shared").exists());
    // A dead agent's record of several: the next one thaws each.
    assert!(f.hold("shared", &[first.clone(), v1.clone()]).unwrap());
    assert_eq!((state(&first), state(&v1)), ("1".into(), "FROZEN".into()));
    drop(f);
    let (_, thawed) = Freezer::open(records).unwrap();
    assert_eq!(thawed, ["shared"]);
    assert_eq!((state(&first), state(&v1)), ("0".into(), "THAWED".into()));
}

#[test]
fn a_container_two_claims_hold_stays_frozen_until_neither_does() {
    let (dir, h) = fake_cgroupfs();
    let (mut f, _) = Freezer::open(dir.path().join("frozen")).unwrap();
    let file = h
        .freeze_file(&Cgroups::parse("0::/c1\n"), &Cgroups::parse("0::/agent\n"))
        .unwrap();
    let frozen = || std::fs::read_to_string(file.path()).unwrap() == "1";
    // One container given two ResourceClaims, each over its share.
    assert!(f.hold("gpu-a", std::slice::from_ref(&file)).unwrap());
    assert!(f.hold("gpu-b", std::slice::from_ref(&file)).unwrap());
    f.release("gpu-a").unwrap();
    assert!(frozen() && f.is_held("gpu-b") && !f.is_held("gpu-a"));
    f.release("gpu-b").unwrap();
    assert!(!frozen());
}

#[test]
fn a_container_whose_cgroup_is_gone_is_thawed_by_forgetting_it() {
    let (dir, h) = fake_cgroupfs();
    let (mut f, _) = Freezer::open(dir.path().join("frozen")).unwrap();
    let file = h
        .freeze_file(&Cgroups::parse("0::/c1\n"), &Cgroups::parse("0::/agent\n"))
        .unwrap();
    assert!(f.hold("c1", &[file]).unwrap());
    std::fs::remove_dir_all(dir.path().join("unified/c1")).unwrap();
    f.release("c1").unwrap();
    assert!(!f.is_held("c1"));
    assert!(!dir.path().join("frozen/c1").exists());
}

#[test]
fn a_cgroup_outside_the_agents_own_mount_is_found_under_the_hosts() {
    // An agent in a pod: its /sys/fs/cgroup shows its own cgroup; the host's root is mounted
    // at /host. Another pod's container is found under the host's mount.
    let (dir, mut h) = fake_cgroupfs();
    let own_view = dir.path().join("pod-view");
    std::fs::create_dir_all(&own_view).unwrap();
    std::fs::write(own_view.join("cgroup.freeze"), "0").unwrap();
    h.unified.insert(
        0,
        Mount {
            point: own_view,
            root: "/agent".into(),
        },
    );
    let own = Cgroups::parse("0::/agent\n");
    assert_eq!(
        h.freeze_file(&Cgroups::parse("0::/c2/sub\n"), &own),
        Some(FreezeFile(dir.path().join("unified/c2/sub/cgroup.freeze")))
    );
}

/// Passes in which either of two slices sharing a GPU, each keeping to its share (`a` and
/// 1 − `a`, the GPU always busy), is in debt over `hours`, counted as the driver counts them:
/// each period (a sixth of a second) names one, with the whole GPU's figure, drawn for runs
/// of ten periods with odds of its share.
fn held_sharing(a: f64, tolerance: f64, burst: f64, hours: u32) -> usize {
    let period = Duration::from_micros(166_667);
    let shares = BTreeMap::from([
        (slice("a"), ((a + tolerance).min(1.0), burst)),
        (slice("b"), ((1.0 - a + tolerance).min(1.0), burst)),
    ]);
    let mut b = Balances::default();
    let start = Instant::now();
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut named = slice("a");
    (1..=hours * 3600 * 6)
        .filter(|i| {
            if i % 10 == 1 {
                // xorshift64: a fixed sequence, the same on every run of the test.
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let draw = (seed >> 11) as f64 / (1u64 << 53) as f64;
                named = slice(if draw < a { "a" } else { "b" });
            }
            let now = start + period * *i;
            !b.pass(&shares, &[(named.clone(), period.as_secs_f64())], now)
                .is_empty()
        })
        .count()
}

#[test]
fn slices_keeping_to_their_shares_are_never_held_for_the_drivers_noise() {
    // Without a margin, the driver's count of each (right on average) holds them often.
    assert!(held_sharing(0.3, 0.0, 3.0, 1) > 1_000);
    let burst = DEFAULT_BURST.as_secs_f64();
    for a in [0.3, 0.5] {
        assert_eq!(held_sharing(a, DEFAULT_TOLERANCE, burst, 4), 0, "{a}");
    }
}
