//! The agent's D-Bus methods (`Claim`, `Activate`, `Release`) with any arguments, in any
//! order, over its real ledger (store and run directory on disk): no panic, no GPU ever
//! oversubscribed, and what was acknowledged survives reopening.
//!
//! Input: one call per line, `claim ID KEY=VALUE ...`, `claim_as OWNER ID KEY=VALUE ...`,
//! `activate ID PID`, `release ID` or `release_as OWNER ID`.
#![no_main]

use std::collections::BTreeMap;

use gpuslice_core::fit::Rules;
use gpuslice_core::inventory::{GpuInfo, Inventory};
use gpuslice_core::policy::Policy;
use gpuslice_core::topology::{Link, Topology};
use gpuslice_nodeagent::ledger::Ledger;
use gpuslice_nodeagent::rundir::RunDir;
use gpuslice_nodeagent::store::Store;
use libfuzzer_sys::fuzz_target;

const GIB: u64 = 1 << 30;

fn inventory() -> Inventory {
    Inventory {
        driver_version: "550.54.15".into(),
        cuda_driver_version: Some(12040),
        gpus: (0..2)
            .map(|i| GpuInfo {
                index: i,
                uuid: format!("GPU-{i}"),
                name: "NVIDIA A10".into(),
                memory_total_bytes: 24 * GIB,
                memory_reserved_bytes: 0,
                minor: i,
                pci_bus_id: String::new(),
                numa_node: None,
                compute_capability: None,
                brand: None,
            })
            .collect(),
        // Two GPUs bridged by NVLink: requests for both go through the closest-set choice.
        topology: Some(Topology {
            numa: vec![None, None],
            links: vec![
                vec![Link::Same, Link::NvLink(2)],
                vec![Link::NvLink(2), Link::Same],
            ],
        }),
    }
}

fn open(dir: &std::path::Path) -> Ledger {
    let store = Store::open(&dir.join("state")).unwrap();
    let run = RunDir::new(dir.join("run")).unwrap();
    Ledger::open(inventory(), store, run, Rules::default(), Policy::Binpack)
        .unwrap()
        .0
}

fn check(ledger: &Ledger) {
    let rules = Rules::default();
    for load in ledger.loads() {
        assert!(load.memory_allocated <= load.memory_total, "{load:?}");
        assert!(load.cores_allocated <= 100, "{load:?}");
        assert!(load.sharers <= rules.max_sharers, "{load:?}");
        assert!(!load.exclusive || load.sharers == 1, "{load:?}");
    }
}

fuzz_target!(|text: &str| {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = open(dir.path());
    for line in text.lines().take(64) {
        let mut words = line.split(' ');
        match (words.next(), words.next()) {
            (Some("claim"), Some(id)) => {
                let annotations: BTreeMap<String, String> = words
                    .filter_map(|w| w.split_once('='))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                let _ = ledger.claim(id, &annotations, 1);
            }
            (Some("claim_as"), Some(owner)) => {
                let id = words.next().unwrap_or_default();
                let annotations: BTreeMap<String, String> = words
                    .filter_map(|w| w.split_once('='))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                let _ = ledger.claim_as(Some(owner), id, &annotations, 1);
            }
            (Some("release_as"), Some(owner)) => {
                let id = words.next().unwrap_or_default();
                let held_by_other = ledger.claims().any(|c| {
                    c.container_id == id && c.owner.as_deref().is_some_and(|o| o != owner)
                });
                let released = ledger.release_as(Some(owner), id);
                assert!(
                    !(held_by_other && matches!(released, Ok(Some(_)))),
                    "another owner's claim was released"
                );
            }
            (Some("activate"), Some(id)) => {
                let pid = words.next().and_then(|p| p.parse().ok()).unwrap_or(0);
                let _ = ledger.activate(id, pid, 1, None);
            }
            (Some("release"), Some(id)) => {
                let _ = ledger.release(id);
            }
            _ => {}
        }
        check(&ledger);
    }
    let before: Vec<_> = ledger.claims().cloned().collect();
    drop(ledger);
    let reopened = open(dir.path());
    let after: Vec<_> = reopened.claims().cloned().collect();
    assert_eq!(
        before, after,
        "acknowledged claims are what a restart finds"
    );
});
