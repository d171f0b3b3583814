//! Scheduler assignments at the agent: honoured only when signed with the shared key for this
//! node and pod and when they still fit; two pods racing for the last room on a GPU get one
//! placement.

mod common;

use std::collections::BTreeMap;

use common::*;
use gpuslice_core::Claim;
use gpuslice_core::assignment::{AssignedGpu, Assignment};
use gpuslice_testsupport::{agent::Agent, bus::Bus, sim::SimNode};

const KEY: &[u8] = b"a shared secret of the whole cluster";

struct Fixture {
    sim: SimNode,
    bus: Bus,
    _agent: Agent,
    _key_dir: tempfile::TempDir,
}

fn start() -> Fixture {
    let sim = SimNode::new(2, "T4", Some(15 * GIB));
    let bus = Bus::start();
    let key_dir = tempfile::tempdir().unwrap();
    let key = key_dir.path().join("key");
    std::fs::write(&key, [KEY, b"\n"].concat()).unwrap();
    let agent = Agent::start(
        &agent_exe(),
        &bus,
        &sim,
        &[
            "--assignment-key",
            key.to_str().unwrap(),
            "--node-name",
            "gpu-node-1",
        ],
    );
    Fixture {
        sim,
        bus,
        _agent: agent,
        _key_dir: key_dir,
    }
}

fn assignment(f: &Fixture, node: &str, pod: &str, gpu: usize, gib: u64) -> Assignment {
    Assignment {
        node: node.into(),
        pod_uid: pod.into(),
        containers: BTreeMap::from([(
            "app".into(),
            vec![AssignedGpu {
                uuid: f.sim.spec.gpus[gpu].uuid.clone(),
                memory_bytes: gib * GIB,
                cores: 0,
            }],
        )]),
    }
}

async fn claim(
    f: &Fixture,
    id: &str,
    memory: &str,
    pod: &str,
    signed: &str,
) -> Result<Claim, (String, String)> {
    let p = proxy(&f.bus.address).await;
    p.claim(
        id,
        ann(&[
            ("gpuslice.io/memory", memory),
            ("gpuslice.io/assignment", signed),
            ("io.kubernetes.cri.container-name", "app"),
            ("io.kubernetes.cri.sandbox-uid", pod),
        ]),
    )
    .await
    .map(|json| serde_json::from_str(&json).unwrap())
    .map_err(|e| method_error(&e).unwrap())
}

#[tokio::test]
async fn a_signed_assignment_is_honoured_on_the_gpu_it_names() {
    let f = start();
    // Binpack alone would choose GPU 0; the scheduler chose GPU 1.
    let signed = assignment(&f, "gpu-node-1", "pod-1", 1, 4)
        .sign(KEY)
        .unwrap();
    let c = claim(&f, "c1", "4Gi", "pod-1", &signed)
        .await
        .expect("honoured");
    assert_eq!(c.gpus.len(), 1);
    assert_eq!(c.gpus[0].uuid, f.sim.spec.gpus[1].uuid);
    assert_eq!(c.gpus[0].memory_bytes, 4 * GIB);
}

#[tokio::test]
async fn forged_misdirected_or_mismatched_assignments_are_refused() {
    let f = start();
    let good = assignment(&f, "gpu-node-1", "pod-1", 1, 4);
    let cases = [
        (
            good.sign(b"another key").unwrap(),
            "4Gi",
            "pod-1",
            "signature does not check",
        ),
        (
            "v1.eyJub2RlIjoiZ3B1LW5vZGUtMSJ9".to_string(),
            "4Gi",
            "pod-1",
            "not a gpuslice assignment",
        ),
        (
            assignment(&f, "gpu-node-2", "pod-1", 1, 4)
                .sign(KEY)
                .unwrap(),
            "4Gi",
            "pod-1",
            "assigned to node \"gpu-node-2\", this is node \"gpu-node-1\"",
        ),
        (
            good.sign(KEY).unwrap(),
            "4Gi",
            "pod-2",
            "made for pod \"pod-1\"",
        ),
        (
            good.sign(KEY).unwrap(),
            "6Gi",
            "pod-1",
            "the request asks for 6442450944 bytes",
        ),
    ];
    for (i, (signed, memory, pod, why)) in cases.iter().enumerate() {
        let (name, msg) = claim(&f, &format!("bad{i}"), memory, pod, signed)
            .await
            .expect_err("refused");
        assert!(name.starts_with("io.gpuslice"), "{name}");
        assert!(msg.contains("gpuslice.io/assignment="), "{msg}");
        assert!(msg.contains(why), "case {i}: {msg:?} lacks {why:?}");
    }
    assert!(status(&proxy(&f.bus.address).await).await.slices.is_empty());
}

#[tokio::test]
async fn an_agent_without_the_key_honours_no_assignment() {
    let sim = SimNode::new(1, "T4", None);
    let bus = Bus::start();
    let _agent = Agent::start(&agent_exe(), &bus, &sim, &["--node-name", "gpu-node-1"]);
    let p = proxy(&bus.address).await;
    let signed = Assignment {
        node: "gpu-node-1".into(),
        pod_uid: "pod-1".into(),
        containers: BTreeMap::from([("app".into(), vec![])]),
    }
    .sign(KEY)
    .unwrap();
    let err = p
        .claim(
            "c",
            ann(&[
                ("gpuslice.io/memory", "1Gi"),
                ("gpuslice.io/assignment", &signed),
            ]),
        )
        .await
        .expect_err("refused");
    let (_, msg) = method_error(&err).unwrap();
    assert!(msg.contains("--assignment-key"), "{msg}");
}

#[tokio::test]
async fn two_pods_racing_for_the_last_room_on_a_gpu_get_one_placement() {
    let f = start();
    // GPU 1 has 15 GiB; 10 GiB are taken, so one of two 5 GiB pods fits.
    let first = assignment(&f, "gpu-node-1", "pod-0", 1, 10)
        .sign(KEY)
        .unwrap();
    claim(&f, "c0", "10Gi", "pod-0", &first)
        .await
        .expect("first");
    let a = assignment(&f, "gpu-node-1", "pod-a", 1, 5)
        .sign(KEY)
        .unwrap();
    let b = assignment(&f, "gpu-node-1", "pod-b", 1, 5)
        .sign(KEY)
        .unwrap();
    let (ra, rb) = tokio::join!(
        claim(&f, "ca", "5Gi", "pod-a", &a),
        claim(&f, "cb", "5Gi", "pod-b", &b)
    );
    assert!(ra.is_ok() != rb.is_ok(), "exactly one: {ra:?} {rb:?}");
    let loser = ra.err().or(rb.err()).unwrap();
    assert!(loser.1.contains("no longer fits"), "{loser:?}");
    let s = status(&proxy(&f.bus.address).await).await;
    assert_within_capacity(&s);
    assert_eq!(s.gpus[1].memory_allocated, 15 * GIB);
}

#[tokio::test]
async fn each_container_of_a_pod_asking_by_pod_level_keys_gets_its_own_assigned_gpu() {
    let f = start();
    let mut a = assignment(&f, "gpu-node-1", "pod-2", 0, 4);
    let web = a.containers["app"].clone();
    a.containers.insert(
        "worker".into(),
        vec![AssignedGpu {
            uuid: f.sim.spec.gpus[1].uuid.clone(),
            ..web[0].clone()
        }],
    );
    let signed = a.sign(KEY).unwrap();
    let p = proxy(&f.bus.address).await;
    let mut granted = Vec::new();
    for (id, container) in [("c-app", "app"), ("c-worker", "worker")] {
        let json = p
            .claim(
                id,
                ann(&[
                    ("gpuslice.io/memory", "4Gi"),
                    ("gpuslice.io/assignment", &signed),
                    ("io.kubernetes.cri.container-name", container),
                    ("io.kubernetes.cri.sandbox-uid", "pod-2"),
                ]),
            )
            .await
            .unwrap_or_else(|e| panic!("{container}: {:?}", method_error(&e)));
        let c: Claim = serde_json::from_str(&json).unwrap();
        assert_eq!(
            c.assigned_as.as_deref(),
            Some(format!("pod-2/{container}").as_str())
        );
        granted.push(c.gpus[0].uuid.clone());
    }
    assert_eq!(
        granted,
        [
            f.sim.spec.gpus[0].uuid.clone(),
            f.sim.spec.gpus[1].uuid.clone()
        ]
    );
}
