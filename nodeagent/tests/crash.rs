//! kill -9 of the agent at random instants during a claim storm: no acknowledged claim is
//! lost, none is held twice, and a claim whose answer never reached its client holds no
//! capacity for good.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use gpuslice_core::{Claim, GpuGrant};
use gpuslice_testsupport::{agent::Agent, bus::Bus, sim::SimNode, wait_for};
use rand::{Rng, SeedableRng};

const KILLS: usize = 24;
const PENDING_TIMEOUT: &str = "4s";

/// Repeats a call until the agent answers (admitted or refused); transport failures while
/// the agent is down are retried, as a runtime retries a create.
/// Evaluates to the answer and the number of attempts it took.
macro_rules! until_answered {
    ($call:expr) => {{
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            match tokio::time::timeout(Duration::from_secs(10), $call).await {
                Ok(Ok(v)) => break (Ok(v), attempts),
                Ok(Err(e)) => match method_error(&e) {
                    Some((name, _)) if name.starts_with("io.gpuslice.Agent1.Error.") => {
                        break (Err(e), attempts);
                    }
                    _ => tokio::time::sleep(Duration::from_millis(20)).await,
                },
                Err(_) => {}
            }
        }
    }};
}

/// Sends a Claim and closes the connection without reading the answer. It stays connected
/// a moment, as a runtime killed mid-create would, so that the agent can still check who it
/// is (a caller already gone is refused, since its uid can no longer be verified).
async fn send_and_vanish(address: &str, id: &str, memory: &str) {
    let conn = gpuslice_agent_api::connect(Some(address)).await.unwrap();
    let body: (&str, HashMap<&str, &str>) = (id, ann(&[("gpuslice.io/memory", memory)]));
    let msg = zbus::Message::method_call(gpuslice_nodeagent::OBJECT_PATH, "Claim")
        .unwrap()
        .destination(gpuslice_nodeagent::BUS_NAME)
        .unwrap()
        .interface(gpuslice_nodeagent::INTERFACE)
        .unwrap()
        .build(&body)
        .unwrap();
    let _ = conn.send(&msg).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(conn);
}

#[derive(Default)]
struct Ledger {
    /// Acknowledged and not released: id → the GPUs the answer gave.
    held: BTreeMap<String, Vec<GpuGrant>>,
    released: BTreeSet<String>,
    abandoned: BTreeSet<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_during_a_claim_storm_loses_nothing_and_doubles_nothing() {
    let sim = SimNode::new(2, "A10", None);
    let bus = Bus::start();
    let mut agent = Agent::start(
        &agent_exe(),
        &bus,
        &sim,
        &[
            "--pending-timeout",
            PENDING_TIMEOUT,
            "--gc-interval",
            "250ms",
            "--max-sharers",
            "64",
        ],
    );
    let me = std::process::id();
    let record = Arc::new(Mutex::new(Ledger::default()));
    let stop = Arc::new(AtomicBool::new(false));

    let mut clients = Vec::new();
    for worker in 0..6u64 {
        let (record, stop, address) = (Arc::clone(&record), Arc::clone(&stop), bus.address.clone());
        clients.push(tokio::spawn(async move {
            let p = proxy(&address).await;
            let mut rng = rand::rngs::StdRng::seed_from_u64(worker);
            let mut n = 0;
            let mut mine = std::collections::VecDeque::new();
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let id = format!("w{worker}-{n}");
                let memory = format!("{}Mi", rng.random_range(1..=8) * 128);
                if worker == 5 {
                    // A client that sends its claim and goes away before the answer.
                    send_and_vanish(&address, &id, &memory).await;
                    record.lock().unwrap().abandoned.insert(id);
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    continue;
                }
                let answer =
                    until_answered!(p.claim(&id, ann(&[("gpuslice.io/memory", &memory)]))).0;
                let json = answer.unwrap_or_else(|e| panic!("{id} refused: {e}"));
                let claim: Claim = serde_json::from_str(&json).unwrap();
                record
                    .lock()
                    .unwrap()
                    .held
                    .insert(id.clone(), claim.gpus.clone());
                until_answered!(p.activate(&id, me)).0.expect("activate");
                mine.push_back(id);
                // Each client holds at most six slices, so that the GPUs never fill up and
                // every refusal in this test would be a fault.
                if mine.len() > 6 || rng.random_bool(0.3) {
                    let id = mine.pop_front().expect("held");
                    let (released, attempts) = until_answered!(p.release(&id));
                    // A retried release whose first answer was lost finds the claim gone.
                    assert!(
                        released.expect("release") || attempts > 1,
                        "{id} was acknowledged but not held at release"
                    );
                    let mut r = record.lock().unwrap();
                    r.held.remove(&id);
                    r.released.insert(id);
                }
            }
        }));
    }

    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    for _ in 0..KILLS {
        tokio::time::sleep(Duration::from_millis(rng.random_range(30..250))).await;
        agent.restart();
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.expect("client");
    }

    // A last burst of clients that go away before their answer, with the agent up, so that
    // some abandoned claims are certainly admitted.
    for i in 0..10 {
        let id = format!("late-{i}");
        send_and_vanish(&bus.address, &id, "128Mi").await;
        record.lock().unwrap().abandoned.insert(id);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    let p = proxy(&bus.address).await;
    let r = std::mem::take(&mut *record.lock().unwrap());
    let before_gc = status(&p).await;
    let abandoned_admitted = before_gc
        .slices
        .iter()
        .filter(|s| r.abandoned.contains(&s.claim.container_id))
        .count();
    assert!(
        abandoned_admitted > 0,
        "no abandoned claim was ever admitted; the test proves nothing:\n{}",
        agent
            .log()
            .lines()
            .filter(|l| l.contains("late-") || l.contains("w5-"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    // Abandoned claims never start; once the pending timeout passes they are collected.
    let collected = wait_for(Duration::from_secs(20), || {
        let rt = tokio::runtime::Handle::current();
        let s = tokio::task::block_in_place(|| rt.block_on(status(&p)));
        !s.slices
            .iter()
            .any(|s| r.abandoned.contains(&s.claim.container_id))
    });
    assert!(
        collected,
        "abandoned claims still hold capacity:\n{}",
        agent.log()
    );

    let s = status(&p).await;
    assert_within_capacity(&s);
    let listed: BTreeMap<String, Vec<GpuGrant>> = s
        .slices
        .iter()
        .map(|s| (s.claim.container_id.clone(), s.claim.gpus.clone()))
        .collect();
    assert_eq!(
        listed.len(),
        s.slices.len(),
        "a container id is listed twice"
    );
    for (id, gpus) in &r.held {
        assert_eq!(
            listed.get(id),
            Some(gpus),
            "acknowledged claim {id} lost or changed"
        );
    }
    for id in listed.keys() {
        assert!(
            r.held.contains_key(id),
            "{id} holds capacity but no client holds it"
        );
    }
    let files = std::fs::read_dir(agent.state_dir.join("claims"))
        .unwrap()
        .count();
    let dir_names: Vec<String> = std::fs::read_dir(&agent.run_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let dirs = dir_names.len();
    let extra: Vec<&String> = dir_names
        .iter()
        .filter(|d| !listed.contains_key(*d))
        .collect();
    assert!(
        extra.is_empty(),
        "directories without a claim: {extra:?}\n{}",
        agent
            .log()
            .lines()
            .filter(|l| extra
                .iter()
                .any(|x| l.contains(&format!("={x} ")) || l.ends_with(&format!("={x}"))))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(
        (files, dirs),
        (listed.len(), listed.len()),
        "ledger files or directories left behind"
    );
    assert!(
        r.held.len() + r.released.len() > 20,
        "too little happened: {} held, {} released",
        r.held.len(),
        r.released.len()
    );
    eprintln!(
        "held {}, released {}, abandoned {} ({abandoned_admitted} admitted before collection)",
        r.held.len(),
        r.released.len(),
        r.abandoned.len()
    );
    let kills = agent.log().matches("ledger loaded").count() - 1;
    assert_eq!(kills, KILLS);
}
