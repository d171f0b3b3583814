//! The enforcement backstop: a process that allocates device memory without the
//! interception library (here: plainly, with no preload at all) is seen by the agent through
//! the driver's per-process accounting (NVML), attributed to its container by its cgroup, and
//! killed when the container holds more than its slice; a container within its slice is left
//! alone. With `--kube-events`, the pod of the one killed gets a Warning Event saying so.

mod common;

use std::time::Duration;

use common::*;
use futures_util::StreamExt;
use gpuslice_testsupport::apiserver::ApiServer;
use gpuslice_testsupport::{agent::Agent, bus::Bus, http, sim::SimNode, wait_for};

/// A simulated A10 and an agent on a bus of its own whose backstop kills a process over its
/// slice, with no tolerance, every 100 ms; `more`: its other arguments.
fn killing_over_its_slice(more: &[&str]) -> (SimNode, Bus, Agent) {
    acting_over_its_slice(1, "kill", more)
}

/// As [`killing_over_its_slice`], on `gpus` simulated A10s, with `--over-limit-action action`.
fn acting_over_its_slice(gpus: u32, action: &str, more: &[&str]) -> (SimNode, Bus, Agent) {
    let sim = SimNode::new(gpus, "A10", None);
    let bus = Bus::start();
    let mut args = vec![
        "--enforce-interval",
        "100ms",
        "--over-limit-action",
        action,
        "--over-limit-tolerance",
        "0",
    ];
    args.extend_from_slice(more);
    let agent = Agent::start(&agent_exe(), &bus, &sim, &args);
    (sim, bus, agent)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_container_over_its_slice_behind_the_librarys_back_is_killed_and_one_within_is_not() {
    let api = ApiServer::start();
    let (sim, bus, agent) = killing_over_its_slice(&[
        "--kube-events",
        "--kube-api",
        &api.url,
        "--node-name",
        "gpu-node-1",
    ]);
    let program = sim.wall_client();
    let p = proxy(&bus.address).await;
    let mut signals = p.receive_over_limit().await.unwrap();
    p.claim(
        "greedy",
        ann(&[
            ("gpuslice.io/memory", "256Mi"),
            ("io.kubernetes.cri.sandbox-name", "trainer"),
            ("io.kubernetes.cri.sandbox-namespace", "research"),
            ("io.kubernetes.cri.container-name", "step"),
        ]),
    )
    .await
    .unwrap();
    p.claim("modest", ann(&[("gpuslice.io/memory", "1Gi")]))
        .await
        .unwrap();

    let (greedy_cg, modest_cg) = (Cgroup::new("greedy"), Cgroup::new("modest"));
    let mut modest = sim.hold(&program, 512 << 20);
    modest_cg.adopt(modest.id());
    p.activate("modest", modest.id()).await.unwrap();
    let mut greedy = sim.hold(&program, 512 << 20);
    greedy_cg.adopt(greedy.id());
    p.activate("greedy", greedy.id()).await.unwrap();

    // Detection within a few intervals: the greedy container's process is SIGKILLed.
    let mut status = None;
    for _ in 0..50 {
        if let Some(s) = greedy.try_wait().unwrap() {
            status = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = status.expect("the process over its slice is still running after 1 s");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "{status:?}"
    );
    let signal = tokio::time::timeout(Duration::from_secs(2), signals.next())
        .await
        .expect("an OverLimit signal")
        .unwrap();
    let args = signal.args().unwrap();
    assert_eq!(
        (
            *args.container_id(),
            *args.used(),
            *args.limit(),
            *args.action()
        ),
        (
            "greedy",
            (512 << 20) + sim.spec.gpus[0].context_bytes,
            256 << 20,
            "kill"
        ),
        "the driver's figure: what was allocated and the context"
    );
    // The container within its slice runs on.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        modest.try_wait().unwrap().is_none(),
        "the modest container was killed"
    );
    let (_, _, body) = http::get(&agent.metrics_address, "/metrics").unwrap();
    assert!(
        body.contains("gpuslice_slice_over_limit_total{container=\"greedy\",action=\"kill\"} 1"),
        "{body}"
    );
    assert!(!body.contains("container=\"modest\",action="), "{body}");
    // The pod's owner sees it in `kubectl describe pod research/trainer` (beside the
    // GPUSliceTampered event: memory no slot accounts for).
    let posted = wait_for(Duration::from_secs(5), || {
        api.kube_events()
            .iter()
            .any(|e| e["reason"] == "GPUSliceOverLimit")
    });
    let events = api.kube_events();
    assert!(posted, "{events:#?}");
    let e = events
        .iter()
        .find(|e| e["reason"] == "GPUSliceOverLimit")
        .unwrap();
    assert_eq!(
        (&e["regarding"]["namespace"], &e["regarding"]["name"]),
        (&"research".into(), &"trainer".into())
    );
    let note = e["note"].as_str().unwrap();
    assert!(
        note.starts_with("container step: the driver shows") && note.ends_with("action: kill"),
        "{note}"
    );
    drop(modest.stdin.take());
    let _ = modest.wait();
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_taken_through_the_graphics_driver_counts_and_a_container_over_its_slice_by_it_is_killed()
 {
    // An OpenGL or Vulkan program takes device memory with no CUDA call at all: NVML lists
    // it among the graphics processes, which the agent samples as it does the compute ones.
    let (sim, bus, _agent) = killing_over_its_slice(&[]);
    let p = proxy(&bus.address).await;
    let mut signals = p.receive_over_limit().await.unwrap();
    let mut tampered = p.receive_usage_tampered().await.unwrap();
    for (id, memory) in [("painter", "256Mi"), ("sketcher", "1Gi")] {
        p.claim(id, ann(&[("gpuslice.io/memory", memory)]))
            .await
            .unwrap();
    }
    let (painter_cg, sketcher_cg) = (Cgroup::new("painter"), Cgroup::new("sketcher"));
    let mut sketcher = sim.hold_graphics(0, 512 << 20);
    sketcher_cg.adopt(sketcher.id());
    p.activate("sketcher", sketcher.id()).await.unwrap();
    let mut painter = sim.hold_graphics(0, 512 << 20);
    painter_cg.adopt(painter.id());
    p.activate("painter", painter.id()).await.unwrap();

    let signal = tokio::time::timeout(Duration::from_secs(2), signals.next())
        .await
        .expect("an OverLimit signal")
        .unwrap();
    let args = signal.args().unwrap();
    assert_eq!(
        (*args.container_id(), *args.used(), *args.limit()),
        ("painter", 512 << 20, 256 << 20),
        "the driver's figure for the graphics process"
    );
    let killed = wait_for(Duration::from_secs(2), || {
        painter.try_wait().unwrap().is_some()
    });
    assert!(killed, "the graphics process over its slice still runs");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        sketcher.try_wait().unwrap().is_none(),
        "the container within its slice was killed"
    );
    // A process that only draws never had a slot to count in: its memory is charged as the
    // driver reports it, and it is not taken for a rewritten usage region (several passes
    // have run by now).
    let reported = tokio::time::timeout(Duration::from_millis(300), tampered.next()).await;
    assert!(
        reported.is_err(),
        "a graphics process within its slice was reported as tampering: {:?}",
        reported
            .ok()
            .flatten()
            .map(|s| s.args().map(|a| a.reason().to_string()))
    );
    drop(sketcher.stdin.take());
    let _ = sketcher.wait();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_two_containers_use_is_held_to_its_slice_in_both_behind_the_librarys_back() {
    let (sim, bus, agent) = killing_over_its_slice(&[]);
    let p = proxy(&bus.address).await;
    p.claim("shared", ann(&[("gpuslice.io/memory", "256Mi")]))
        .await
        .unwrap();
    // Two containers given the same slice (a ResourceClaim both name), each reporting its
    // pid: the first holds 512 MiB without the library, the second, reported last, nothing.
    let (first_cg, second_cg) = (Cgroup::new("shared-first"), Cgroup::new("shared-second"));
    let mut first = sim.hold(&sim.wall_client(), 512 << 20);
    first_cg.adopt(first.id());
    p.activate("shared", first.id()).await.unwrap();
    let mut second = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .unwrap();
    second_cg.adopt(second.id());
    p.activate("shared", second.id()).await.unwrap();
    // The first container's process is still the claim's: killed over the slice.
    let killed = wait_for(Duration::from_secs(3), || {
        first.try_wait().unwrap().is_some()
    });
    assert!(killed, "{}", agent.log());
    if let Err(log) = agent.log_once_it_says(
        "the driver shows the container over its slice",
        Duration::from_secs(2),
    ) {
        panic!("killed, but the agent never said why:\n{log}");
    }
    assert!(
        second.try_wait().unwrap().is_none(),
        "the second was killed"
    );
    let _ = second.kill();
    let _ = second.wait();
}

#[tokio::test(flavor = "multi_thread")]
async fn stopping_a_claim_two_containers_use_stops_the_container_holding_the_memory() {
    let (sim, bus, agent) = acting_over_its_slice(1, "stop", &[]);
    let p = proxy(&bus.address).await;
    p.claim("stopped", ann(&[("gpuslice.io/memory", "256Mi")]))
        .await
        .unwrap();
    // Two containers given the same slice, each reported with its first process: in the
    // first, another process holds 512 MiB without the library; the second, reported last,
    // holds nothing.
    let (first_cg, second_cg) = (Cgroup::new("stop-first"), Cgroup::new("stop-second"));
    let sleeper = |cg: &Cgroup| {
        let c = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        cg.adopt(c.id());
        c
    };
    let mut first = sleeper(&first_cg);
    p.activate("stopped", first.id()).await.unwrap();
    let mut hog = sim.hold(&sim.wall_client(), 512 << 20);
    first_cg.adopt(hog.id());
    let mut second = sleeper(&second_cg);
    p.activate("stopped", second.id()).await.unwrap();
    // The first container is stopped (its first process killed: its PID namespace's init,
    // whose end ends the rest); the second is left running.
    let stopped = wait_for(Duration::from_secs(3), || {
        first.try_wait().unwrap().is_some()
    });
    let _ = hog.kill();
    let _ = hog.wait();
    assert!(stopped, "{}", agent.log());
    if let Err(log) = agent.log_once_it_says("action=stop", Duration::from_secs(2)) {
        panic!("stopped, but the agent never said so:\n{log}");
    }
    assert!(
        second.try_wait().unwrap().is_none(),
        "the second container, holding nothing, was stopped"
    );
    let _ = second.kill();
    let _ = second.wait();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_container_given_claims_on_two_gpus_is_charged_each_gpu_to_the_claim_there() {
    let (sim, bus, agent) = acting_over_its_slice(2, "kill", &[]);
    let p = proxy(&bus.address).await;
    for (id, gpu) in [("pair-a", "0"), ("pair-b", "1")] {
        p.claim(
            id,
            ann(&[("gpuslice.io/memory", "1Gi"), ("gpuslice.io/devices", gpu)]),
        )
        .await
        .unwrap();
    }
    // One container given both slices (two ResourceClaims): each device's createRuntime hook
    // reports the container's first process for its claim.
    let cg = Cgroup::new("pair");
    let mut init = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .unwrap();
    cg.adopt(init.id());
    for id in ["pair-a", "pair-b"] {
        p.activate(id, init.id()).await.unwrap();
    }
    let on_second_gpu = |bytes: u64| {
        let mut cmd = std::process::Command::new(sim.wall_client());
        cmd.args(["link", "hold", &bytes.to_string()])
            .env("LD_LIBRARY_PATH", sim.lib_dir())
            .env("CUDA_VISIBLE_DEVICES", "1");
        let (child, line) = gpuslice_testsupport::sim::start_holding(cmd);
        assert!(line.contains("fit=CUDA_SUCCESS"), "{line}");
        cg.adopt(child.id());
        child
    };
    // 200 MiB and a context on the second GPU are within pair-b's slice there: left alone
    // for ten passes (counted against pair-a's, where it has no slice, it was killed).
    let mut within = on_second_gpu(200 << 20);
    let killed = wait_for(Duration::from_secs(1), || {
        within.try_wait().unwrap().is_some()
    });
    assert!(!killed, "killed within its slice\n{}", agent.log());
    // 512 MiB and a context more there are over pair-b's 1 GiB: the newer process is
    // killed, and the log names pair-b.
    let mut over = on_second_gpu(512 << 20);
    let killed = wait_for(Duration::from_secs(3), || {
        over.try_wait().unwrap().is_some()
    });
    assert!(killed, "{}", agent.log());
    let log = agent
        .log_once_it_says(
            "the driver shows the container over its slice",
            Duration::from_secs(2),
        )
        .unwrap_or_else(|log| panic!("killed, but the agent never said why:\n{log}"));
    let line = log
        .lines()
        .find(|l| l.contains("the driver shows the container over its slice"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(line.contains("container=pair-b"), "{line}");
    assert!(within.try_wait().unwrap().is_none(), "{log}");
    for c in [&mut within, &mut init] {
        let _ = c.kill();
        let _ = c.wait();
    }
}
