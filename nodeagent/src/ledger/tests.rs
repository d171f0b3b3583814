use super::*;
use gpuslice_core::inventory::GpuInfo;

const GIB: u64 = 1 << 30;

fn inventory(n: u32) -> Inventory {
    Inventory {
        topology: None,
        driver_version: "550.54.15".into(),
        cuda_driver_version: Some(12040),
        gpus: (0..n)
            .map(|i| GpuInfo {
                index: i,
                uuid: format!("GPU-{i}"),
                name: "Tesla T4".into(),
                memory_total_bytes: 15 * GIB,
                memory_reserved_bytes: 0,
                minor: i,
                pci_bus_id: String::new(),
                numa_node: None,
                compute_capability: None,
                brand: None,
            })
            .collect(),
    }
}

fn open(dir: &std::path::Path) -> Ledger {
    let store = Store::open(&dir.join("state")).unwrap();
    let run = RunDir::new(dir.join("run")).unwrap();
    Ledger::open(inventory(2), store, run, Rules::default(), Policy::Binpack)
        .unwrap()
        .0
}

/// Annotations from `pairs`.
fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

fn mem(v: &str) -> BTreeMap<String, String> {
    ann(&[("gpuslice.io/memory", v)])
}

#[test]
fn a_claim_writes_the_limits_directory_and_survives_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let mut l = open(dir.path());
    let c = l.claim("c1", &mem("2Gi"), 1).unwrap();
    let limits = std::fs::read_to_string(dir.path().join("run/c1/limits")).unwrap();
    assert!(limits.contains("gpu.0.memory_bytes=2147483648"), "{limits}");
    drop(l);
    let l = open(dir.path());
    assert_eq!(l.get("c1"), Some(c.claim()));
}

#[test]
fn the_cgroups_read_at_activation_are_kept_across_reopening_and_a_second_report() {
    let dir = tempfile::tempdir().unwrap();
    let mut l = open(dir.path());
    l.claim("c1", &mem("1Gi"), 1).unwrap();
    let first = Some("4:memory:/c1\n".to_string());
    l.activate("c1", 7, 100, first.clone()).unwrap();
    drop(l);
    let mut l = open(dir.path());
    let cgroups = |l: &Ledger| match &l.get("c1").unwrap().state {
        ClaimState::Active { cgroups, .. } => cgroups.clone(),
        ClaimState::Pending => panic!("not active"),
    };
    assert_eq!(cgroups(&l), first);
    // The same process reported again after it moved: what was read first stands.
    l.activate("c1", 7, 100, Some("4:memory:/c1/escape\n".into()))
        .unwrap();
    assert_eq!(cgroups(&l), first);
    // Another container reported for the claim is read afresh and the first is kept while
    // its process lives.
    let second = Some("4:memory:/c2\n0::/c2\n".to_string());
    l.activate("c1", 8, 200, second.clone()).unwrap();
    assert_eq!(cgroups(&l), second);
    let pids = |l: &Ledger| -> Vec<u32> {
        l.get("c1")
            .unwrap()
            .state
            .reported()
            .iter()
            .map(|r| r.pid)
            .collect()
    };
    assert_eq!(pids(&l), [8, 7]);
    drop(l);
    let mut l = open(dir.path());
    assert_eq!(pids(&l), [8, 7], "kept across reopening");
    // The last one gone: the first is the claim's process again, with its first reading.
    l.forget_gone(|r| r.pid != 8).unwrap();
    assert_eq!(pids(&l), [7]);
    assert_eq!(cgroups(&l), first);
    // All gone: the state stays, the evidence that the containers are gone.
    l.forget_gone(|_| false).unwrap();
    assert_eq!(pids(&l), [7]);
}

#[test]
fn a_retried_claim_gets_the_same_answer_and_a_changed_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut l = open(dir.path());
    let first = l.claim("c1", &mem("2Gi"), 1).unwrap();
    let again = l.claim("c1", &mem("2Gi"), 2).unwrap();
    assert_eq!(again, Admission::Existing(first.claim().clone()));
    let e = l.claim("c1", &mem("3Gi"), 3).unwrap_err();
    assert!(
        matches!(
            e,
            LedgerError::Refused(Refusal {
                reason: RefusalReason::Conflict,
                ..
            })
        ),
        "{e}"
    );
}

#[test]
fn release_removes_claim_and_directory_and_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let mut l = open(dir.path());
    l.claim("c1", &mem("2Gi"), 1).unwrap();
    assert!(l.release("c1").unwrap().is_some());
    assert!(!dir.path().join("run/c1").exists());
    assert!(l.release("c1").unwrap().is_none());
    drop(l);
    assert!(open(dir.path()).get("c1").is_none());
}

#[test]
fn a_directory_without_a_claim_is_removed_when_the_ledger_opens() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path()));
    std::fs::create_dir_all(dir.path().join("run/ghost")).unwrap();
    std::fs::write(dir.path().join("run/ghost/limits"), "version=1\n").unwrap();
    std::fs::create_dir_all(dir.path().join("run/half")).unwrap();
    std::fs::write(dir.path().join("run/half/limits.tmp"), "vers").unwrap();
    drop(open(dir.path()));
    assert!(!dir.path().join("run/ghost").exists());
    assert!(
        !dir.path().join("run/half").exists(),
        "a directory whose creation was interrupted is left behind"
    );
}

#[test]
fn a_second_ledger_on_the_same_state_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _first = open(dir.path());
    assert!(matches!(
        Store::open(&dir.path().join("state")),
        Err(StoreError::Locked(_))
    ));
}

#[test]
fn capacity_is_never_exceeded_and_refusals_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let mut l = open(dir.path());
    for i in 0..4 {
        l.claim(&format!("c{i}"), &mem("7Gi"), 1).unwrap();
    }
    let e = l.claim("c9", &mem("7Gi"), 1).unwrap_err();
    assert!(e.to_string().contains("gpuslice.io/memory=\"7Gi\""), "{e}");
    assert!(
        l.loads()
            .iter()
            .all(|g| g.memory_allocated <= g.memory_total)
    );
}

#[test]
fn an_id_held_by_one_owner_is_neither_claimed_nor_released_by_another() {
    let dir = tempfile::tempdir().unwrap();
    let mut l = open(dir.path());
    let (a, b) = (
        Some("runtime-root:/run/runc"),
        Some("runtime-root:/run/other"),
    );
    assert!(matches!(
        l.claim_as(a, "twin", &mem("1Gi"), 1).unwrap(),
        Admission::New(_)
    ));
    let e = l
        .claim_as(b, "twin", &mem("1Gi"), 2)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("already holds a slice for a container of runtime-root:/run/runc"),
        "{e}"
    );
    let e = l.release_as(b, "twin").unwrap_err().to_string();
    assert!(e.contains("not of runtime-root:/run/other"), "{e}");
    assert_eq!(l.claims().count(), 1);
    // The same owner claims again (a retried create) and releases; a caller naming no owner
    // (the CLI, garbage collection) may release any claim.
    assert!(matches!(
        l.claim_as(a, "twin", &mem("1Gi"), 3).unwrap(),
        Admission::Existing(_)
    ));
    assert!(l.release_as(a, "twin").unwrap().is_some());
    l.claim_as(a, "twin", &mem("1Gi"), 4).unwrap();
    assert!(l.release("twin").unwrap().is_some());
    // Reopened, the owner is remembered.
    l.claim_as(a, "kept", &mem("1Gi"), 5).unwrap();
    drop(l);
    let l = open(dir.path());
    assert_eq!(l.claims().next().unwrap().owner.as_deref(), a);
}

fn share(cores: &str) -> BTreeMap<String, String> {
    ann(&[
        ("gpuslice.io/memory", "1Gi"),
        ("gpuslice.io/cores", cores),
        ("gpuslice.io/devices", "0"),
    ])
}

#[test]
fn shares_of_one_gpu_get_windows_of_the_cycle_that_never_overlap_and_reach_the_limits_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut l = open(dir.path());
    let window = |a: &Admission| a.claim().gpus[0].window;
    let w = |start, len| Some(SmWindow { start, len });
    let small = l.claim("small", &share("30"), 1).unwrap();
    let large = l.claim("large", &share("70"), 2).unwrap();
    assert_eq!((window(&small), window(&large)), (w(0, 30), w(30, 70)));
    let limits = std::fs::read_to_string(dir.path().join("run/large/limits")).unwrap();
    assert!(limits.contains("gpu.0.sm_window=30+70\n"), "{limits}");
    // The gap a released share leaves is given again; the windows survive a restart.
    l.release("small").unwrap();
    let next = l.claim("next", &share("20"), 3).unwrap();
    assert_eq!(window(&next), w(0, 20));
    drop(l);
    let l = open(dir.path());
    assert_eq!(l.get("large").unwrap().gpus[0].window, w(30, 70));
    // No share, no window.
    let mut l = l;
    let plain = l.claim("plain", &mem("1Gi"), 4).unwrap();
    assert_eq!(window(&plain), None);
}
