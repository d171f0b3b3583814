//! Many clients claiming at once never push a GPU over capacity, and every refusal says why.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::*;
use gpuslice_core::Claim;
use gpuslice_testsupport::{agent::Agent, bus::Bus, sim::SimNode};
use rand::{Rng, SeedableRng};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_concurrent_claims_never_overfill_two_gpus() {
    let sim = SimNode::new(2, "T4", None);
    let bus = Bus::start();
    let _agent = Agent::start(&agent_exe(), &bus, &sim, &[]);
    let capacity = 15 * GIB;

    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (done, address) = (Arc::clone(&done), bus.address.clone());
        tokio::spawn(async move {
            let p = proxy(&address).await;
            let mut samples = 0;
            while !done.load(Ordering::Relaxed) {
                assert_within_capacity(&status(&p).await);
                samples += 1;
            }
            samples
        })
    };

    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut tasks = Vec::new();
    for i in 0..200 {
        let memory = format!("{}Mi", rng.random_range(1..=16) * 256);
        let cores = rng.random_range(0..=40).to_string();
        let address = bus.address.clone();
        tasks.push(tokio::spawn(async move {
            let p = proxy(&address).await;
            let id = format!("client-{i}");
            let mut a = vec![("gpuslice.io/memory", memory.as_str())];
            if cores != "0" {
                a.push(("gpuslice.io/cores", cores.as_str()));
            }
            let r = p.claim(&id, ann(&a)).await;
            (id, memory, r)
        }));
    }
    let mut admitted: Vec<Claim> = Vec::new();
    let mut refused = 0;
    for t in tasks {
        let (id, memory, r) = t.await.unwrap();
        match r {
            Ok(json) => admitted.push(serde_json::from_str(&json).unwrap()),
            Err(e) => {
                let (name, msg) =
                    method_error(&e).unwrap_or_else(|| panic!("{id}: transport error {e}"));
                assert_eq!(name, "io.gpuslice.Agent1.Error.Refused", "{id}: {msg}");
                assert!(
                    msg.starts_with("annotation gpuslice.io/"),
                    "{id}: refusal names no annotation: {msg}"
                );
                assert!(
                    msg.contains(&format!("{memory:?}")) || msg.contains("gpuslice.io/cores"),
                    "{id}: {msg}"
                );
                assert!(
                    msg.contains("free") || msg.contains("SMs"),
                    "{id}: refusal gives no reason: {msg}"
                );
                refused += 1;
            }
        }
    }
    done.store(true, Ordering::Relaxed);
    let samples = watcher.await.unwrap();
    assert!(samples > 0);
    assert_eq!(admitted.len() + refused, 200);
    assert!(
        refused > 0 && admitted.len() > 10,
        "admitted {} refused {refused}",
        admitted.len()
    );

    // Our own account of what was acknowledged, independent of the agent's bookkeeping.
    let mut per_gpu: HashMap<String, (u64, u32)> = HashMap::new();
    for c in &admitted {
        for g in &c.gpus {
            let e = per_gpu.entry(g.uuid.clone()).or_default();
            e.0 += g.memory_bytes;
            e.1 += g.cores;
        }
    }
    for (uuid, (mem, cores)) in &per_gpu {
        assert!(
            *mem <= capacity,
            "{uuid}: {mem} bytes acknowledged on a {capacity}-byte GPU"
        );
        assert!(*cores <= 100, "{uuid}: {cores}% of SMs acknowledged");
    }
    let s = status(&proxy(&bus.address).await).await;
    assert_within_capacity(&s);
    assert_eq!(s.slices.len(), admitted.len());
}
