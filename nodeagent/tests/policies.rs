//! GPU-axis binpack and spread, whole GPUs and multi-GPU claims through the agent.

mod common;

use std::collections::BTreeSet;

use common::*;
use gpuslice_core::Claim;
use gpuslice_testsupport::{agent::Agent, bus::Bus, sim::SimNode};

async fn gpus_used_by_four_half_card_slices(policy: &str) -> usize {
    let sim = SimNode::new(4, "T4", Some(15 * GIB));
    let bus = Bus::start();
    let _agent = Agent::start(&agent_exe(), &bus, &sim, &[]);
    let p = proxy(&bus.address).await;
    let mut used = BTreeSet::new();
    for i in 0..4 {
        let json = p
            .claim(
                &format!("worker-{i}"),
                ann(&[
                    ("gpuslice.io/memory", "7.5Gi"),
                    ("gpuslice.io/gpu-policy", policy),
                ]),
            )
            .await
            .expect("claim");
        let c: Claim = serde_json::from_str(&json).unwrap();
        used.insert(c.gpus[0].index);
    }
    used.len()
}

#[tokio::test]
async fn binpack_puts_four_7_5_gib_slices_on_two_15_gib_gpus() {
    assert_eq!(gpus_used_by_four_half_card_slices("binpack").await, 2);
}

#[tokio::test]
async fn spread_puts_four_7_5_gib_slices_on_four_15_gib_gpus() {
    assert_eq!(gpus_used_by_four_half_card_slices("spread").await, 4);
}

#[tokio::test]
async fn whole_gpu_claims_exclude_slices_and_multi_gpu_claims_take_distinct_gpus() {
    let sim = SimNode::new(4, "A10", None);
    let bus = Bus::start();
    let _agent = Agent::start(&agent_exe(), &bus, &sim, &[]);
    let p = proxy(&bus.address).await;
    let whole: Claim = serde_json::from_str(
        &p.claim("trainer", ann(&[("gpuslice.io/gpus", "2")]))
            .await
            .unwrap(),
    )
    .unwrap();
    assert!(whole.exclusive);
    assert_eq!(whole.gpus.len(), 2);
    assert!(
        whole
            .gpus
            .iter()
            .all(|g| g.memory_bytes == 24 * GIB && g.cores == 100)
    );
    let named = sim.spec.gpus[whole.gpus[0].index as usize].uuid.clone();
    let e = p
        .claim(
            "intruder",
            ann(&[
                ("gpuslice.io/devices", &named),
                ("gpuslice.io/memory", "1Gi"),
            ]),
        )
        .await
        .unwrap_err();
    let (_, msg) = method_error(&e).unwrap();
    assert!(
        msg.contains("gpuslice.io/devices") && msg.contains("held whole"),
        "{msg}"
    );
    let multi: Claim = serde_json::from_str(
        &p.claim(
            "pair",
            ann(&[("gpuslice.io/gpus", "2"), ("gpuslice.io/memory", "25%")]),
        )
        .await
        .unwrap(),
    )
    .unwrap();
    let idx: BTreeSet<u32> = multi.gpus.iter().map(|g| g.index).collect();
    assert_eq!(idx.len(), 2);
    assert!(multi.gpus.iter().all(|g| g.memory_bytes == 6 * GIB));
    assert!(
        idx.iter()
            .all(|i| !whole.gpus.iter().any(|w| w.index == *i))
    );
    let e = p
        .claim(
            "third",
            ann(&[("gpuslice.io/gpus", "3"), ("gpuslice.io/memory", "1Gi")]),
        )
        .await
        .unwrap_err();
    let (name, msg) = method_error(&e).unwrap();
    assert_eq!(name, "io.gpuslice.Agent1.Error.Refused");
    assert!(msg.contains("gpuslice.io/gpus=\"3\""), "{msg}");
}

#[tokio::test]
async fn a_gpu_is_sliced_only_up_to_what_its_driver_does_not_keep_for_itself() {
    // The driver reserves 384 MiB of each 15 GiB T4 (NVML's `reserved`): slices, whole GPUs
    // and shares of a GPU are cut from the rest, so slices that fill the card never ask the
    // driver for memory it cannot give.
    let reserved = 384 << 20;
    let sim = SimNode::with_reserved_bytes(1, "T4", reserved);
    let bus = Bus::start();
    let _agent = Agent::start(&agent_exe(), &bus, &sim, &[]);
    let p = proxy(&bus.address).await;
    let s = status(&p).await;
    assert_eq!(s.inventory.gpus[0].memory_total_bytes, 15 * GIB);
    assert_eq!(s.inventory.gpus[0].memory_reserved_bytes, reserved);
    assert_eq!(s.gpus[0].memory_total, 15 * GIB - reserved);
    let shown = cli(&bus.address, &["status"]);
    assert_success(&shown);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(
        text.contains("14.6 GiB")
            && text.contains("GPU 0: 384.0 MiB of its 15.0 GiB kept by the driver"),
        "{text}"
    );

    let e = p
        .claim("card", ann(&[("gpuslice.io/memory", "15Gi")]))
        .await
        .unwrap_err();
    let (name, msg) = method_error(&e).unwrap();
    assert_eq!(name, "io.gpuslice.Agent1.Error.Refused", "{msg}");
    assert!(msg.contains("15Gi"), "{msg}");

    let half: Claim = serde_json::from_str(
        &p.claim("half", ann(&[("gpuslice.io/memory", "50%")]))
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(half.gpus[0].memory_bytes, (15 * GIB - reserved) / 2);
    let rest = format!(
        "{}Mi",
        (15 * GIB - reserved - half.gpus[0].memory_bytes) >> 20
    );
    p.claim("rest", ann(&[("gpuslice.io/memory", &rest)]))
        .await
        .expect("the rest of what the driver gives");
    let e = p
        .claim("one-more", ann(&[("gpuslice.io/memory", "1Mi")]))
        .await
        .unwrap_err();
    assert_eq!(
        method_error(&e).unwrap().0,
        "io.gpuslice.Agent1.Error.Refused"
    );
    assert_within_capacity(&status(&p).await);
    p.release("half").await.unwrap();
    p.release("rest").await.unwrap();

    let whole: Claim = serde_json::from_str(
        &p.claim("whole", ann(&[("gpuslice.io/gpus", "1")]))
            .await
            .unwrap(),
    )
    .unwrap();
    assert!(whole.exclusive);
    assert_eq!(whole.gpus[0].memory_bytes, 15 * GIB - reserved);
}
