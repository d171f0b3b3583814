//! The Prometheus endpoint, parsed as Prometheus text, and garbage collection of claims whose
//! containers are gone.

mod common;

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use common::*;
use gpuslice_core::usage;
use gpuslice_testsupport::apiserver::ApiServer;
use gpuslice_testsupport::{agent::Agent, bus::Bus, field, http, sim::SimNode, wait_for};
use prometheus_parse::{Scrape, Value};

fn scrape(agent: &Agent) -> (String, Scrape) {
    let (status, headers, body) = http::get(&agent.metrics_address, "/metrics").expect("scrape");
    assert!(status.contains("200"), "{status}");
    let scrape = Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).expect("prometheus text");
    (headers, scrape)
}

fn value(s: &Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    s.samples
        .iter()
        .find(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .map(|x| match x.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
            _ => f64::NAN,
        })
}

/// Marks `bytes` in use on the container's first GPU, as a process of the container does.
fn write_usage(agent: &Agent, id: &str, pid: u32, bytes: u64) {
    let path = agent.run_dir.join(id).join(usage::FILE_NAME);
    let mut region = std::fs::read(&path).unwrap();
    let slot = usage::HEADER_SIZE;
    region[slot..slot + 4].copy_from_slice(&pid.to_le_bytes());
    region[slot + usage::SLOT_USED..slot + usage::SLOT_USED + 8]
        .copy_from_slice(&bytes.to_le_bytes());
    std::fs::write(&path, region).unwrap();
}

#[tokio::test]
async fn the_metrics_endpoint_serves_prometheus_text_that_matches_the_ledger() {
    let sim = SimNode::new(2, "T4", None);
    let bus = Bus::start();
    let agent = Agent::start(&agent_exe(), &bus, &sim, &[]);
    let p = proxy(&bus.address).await;
    p.claim(
        "web",
        ann(&[("gpuslice.io/memory", "2Gi"), ("gpuslice.io/cores", "30")]),
    )
    .await
    .unwrap();
    p.claim("batch", ann(&[("gpuslice.io/memory", "3Gi")]))
        .await
        .unwrap();
    p.claim("huge", ann(&[("gpuslice.io/memory", "16Gi")]))
        .await
        .unwrap_err();
    p.claim("bad", ann(&[("gpuslice.io/memory", "-1")]))
        .await
        .unwrap_err();
    write_usage(&agent, "web", 4242, 1 << 30);

    let (headers, s) = scrape(&agent);
    assert!(
        headers
            .to_lowercase()
            .contains("content-type: application/openmetrics-text"),
        "{headers}"
    );
    let gpu0 = sim.spec.gpus[0].uuid.as_str();
    assert_eq!(
        value(
            &s,
            "gpuslice_gpu_memory_capacity_bytes",
            &[("uuid", gpu0), ("model", "Tesla T4")]
        ),
        Some((15 * GIB) as f64)
    );
    assert_eq!(
        value(&s, "gpuslice_gpu_memory_allocated_bytes", &[("uuid", gpu0)]),
        Some((5 * GIB) as f64)
    );
    assert_eq!(
        value(&s, "gpuslice_gpu_cores_allocated_ratio", &[("uuid", gpu0)]),
        Some(0.3)
    );
    assert_eq!(
        value(&s, "gpuslice_gpu_sharers", &[("uuid", gpu0)]),
        Some(2.0)
    );
    assert_eq!(
        value(
            &s,
            "gpuslice_slice_memory_limit_bytes",
            &[("container", "web")]
        ),
        Some((2 * GIB) as f64)
    );
    assert_eq!(
        value(
            &s,
            "gpuslice_slice_memory_used_bytes",
            &[("container", "web")]
        ),
        Some(GIB as f64)
    );
    assert_eq!(value(&s, "gpuslice_claims_admitted_total", &[]), Some(2.0));
    assert_eq!(
        value(
            &s,
            "gpuslice_claims_refused_total",
            &[("reason", "insufficient_memory")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &s,
            "gpuslice_claims_refused_total",
            &[("reason", "invalid_request")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&s, "gpuslice_claims", &[("state", "pending")]),
        Some(2.0)
    );
    let names: Vec<&str> = s.samples.iter().map(|x| x.metric.as_str()).collect();
    assert!(
        names.iter().all(|n| n.starts_with("gpuslice_")),
        "{names:?}"
    );
}

#[tokio::test]
async fn a_claim_is_released_when_its_container_process_dies() {
    let sim = SimNode::new(1, "T4", None);
    let bus = Bus::start();
    let agent = Agent::start(&agent_exe(), &bus, &sim, &["--gc-interval", "200ms"]);
    let p = proxy(&bus.address).await;
    let mut child = Command::new("sleep").arg("60").spawn().unwrap();
    p.claim("job", ann(&[("gpuslice.io/memory", "1Gi")]))
        .await
        .unwrap();
    p.activate("job", child.id()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        status(&p).await.slices.len(),
        1,
        "a running container's claim was collected"
    );
    let e = p.activate("job", u32::MAX - 7).await.unwrap_err();
    assert!(method_error(&e).unwrap().1.contains("no such process"));
    child.kill().unwrap();
    child.wait().unwrap();
    let gone = wait_for(Duration::from_secs(5), || {
        let (_, s) = scrape(&agent);
        value(&s, "gpuslice_claims_released_total", &[("cause", "gc")]) == Some(1.0)
    });
    assert!(
        gone,
        "claim of a dead container was not collected:\n{}",
        agent.log()
    );
    assert!(status(&p).await.slices.is_empty());
    assert!(!agent.run_dir.join("job").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pending_claim_stays_while_a_runtime_knows_the_container_and_goes_after_the_timeout() {
    let sim = SimNode::new(1, "T4", None);
    let bus = Bus::start();
    let runtime_root = tempfile::tempdir().unwrap();
    let root = runtime_root.path().display().to_string();
    let agent = Agent::start(
        &agent_exe(),
        &bus,
        &sim,
        &[
            "--gc-interval",
            "200ms",
            "--pending-timeout",
            "1s",
            "--runtime-root",
            &root,
        ],
    );
    let p = proxy(&bus.address).await;
    std::fs::create_dir_all(runtime_root.path().join("created")).unwrap();
    std::fs::write(runtime_root.path().join("created/state.json"), "{}").unwrap();
    for id in ["created", "forgotten"] {
        p.claim(id, ann(&[("gpuslice.io/memory", "1Gi")]))
            .await
            .unwrap();
    }
    let collected = wait_for(Duration::from_secs(5), || {
        let rt = tokio::runtime::Handle::current();
        let s = tokio::task::block_in_place(|| rt.block_on(status(&p)));
        s.slices.len() == 1
    });
    assert!(collected, "{}", agent.log());
    let ids: HashMap<String, ()> = status(&p)
        .await
        .slices
        .into_iter()
        .map(|s| (s.claim.container_id, ()))
        .collect();
    assert!(ids.contains_key("created"), "{ids:?}");
}

/// Runs `spin` (`shim/tests/c/spin.c`) in cgroup `cgroup`: 1,000-block kernels for `ms`,
/// through the interception library under the container `id`'s limits when `fronted`, else
/// through the plain driver; returns the GPU seconds its kernels stood for (1 µs a block).
fn spin_in(sim: &SimNode, agent: &Agent, cgroup: &Cgroup, id: &str, ms: u32, fronted: bool) -> f64 {
    let script = format!(
        "echo $$ > {} && exec {} 1000 {ms}",
        cgroup.procs_file().display(),
        sim.test_program("spin").display()
    );
    let libs = if fronted {
        sim.fronted_lib_dir()
    } else {
        sim.lib_dir()
    };
    let limits = agent.run_dir.join(id).join("limits");
    let text = script_output(&script, &libs, &limits, &[]);
    let blocks: f64 = field(&text, "blocks");
    blocks * 1e-6
}

#[tokio::test(flavor = "multi_thread")]
async fn each_slices_sm_time_is_the_gpu_time_the_driver_saw_its_processes_use() {
    // Kernels of 1 µs a block on a simulated T4 whose NVML samples per process every sixth
    // of a second, as the real driver does (one process named per period).
    let sim = SimNode::with_kernel_time(1, "T4", None, 1_000);
    let bus = Bus::start();
    let agent = Agent::start(&agent_exe(), &bus, &sim, &[]);
    let p = proxy(&bus.address).await;
    let before_claims = std::time::Instant::now();
    let mut inits = Vec::new();
    let mut cgroups = HashMap::new();
    for (id, cores) in [("paced", Some("30")), ("busy", None), ("idle", None)] {
        let mut request = vec![("gpuslice.io/memory", "1Gi")];
        request.extend(cores.map(|c| ("gpuslice.io/cores", c)));
        p.claim(id, ann(&request)).await.unwrap();
        let cgroup = Cgroup::new(&format!("sm-{id}"));
        let init = Command::new("sleep").arg("600").spawn().unwrap();
        cgroup.adopt(init.id());
        p.activate(id, init.id()).await.unwrap();
        inits.push(init);
        cgroups.insert(id, cgroup);
    }
    let claimed = std::time::Instant::now();
    let seconds = |s: &Scrape, id: &str| {
        value(
            s,
            "gpuslice_slice_sm_seconds_total",
            &[("container", id), ("gpu", "0")],
        )
    };
    let (_, s) = scrape(&agent);
    for id in ["paced", "busy", "idle"] {
        assert_eq!(seconds(&s, id), Some(0.0), "{id}: {:?}", s.samples);
    }
    // Counted once the driver has reported the last period and the agent has asked for it.
    // Each count is allowed a period missed (a poll delayed past one on a loaded machine) and
    // the last period of the process (not reported once it has exited), 0.2 s together.
    let settled = || std::thread::sleep(Duration::from_millis(600));

    // A 30% slice flat out for 3 s, then a slice without a share alone for 2 s.
    let paced = spin_in(&sim, &agent, &cgroups["paced"], "paced", 3000, true);
    settled();
    let busy = spin_in(&sim, &agent, &cgroups["busy"], "busy", 2000, false);
    settled();
    let (_, s) = scrape(&agent);
    let (paced_seen, busy_seen) = (seconds(&s, "paced").unwrap(), seconds(&s, "busy").unwrap());
    let log = agent.log();
    assert!(
        (paced_seen - paced).abs() <= 0.2 + 0.05 * paced,
        "the 30% slice's kernels took {paced:.3} s of the GPU; counted {paced_seen:.3} s\n{log}"
    );
    assert!(
        (0.25 * 3.0..=0.35 * 3.0).contains(&paced_seen),
        "the 30% slice used {paced_seen:.3} s of 3 s\n{log}"
    );
    assert!(
        (busy_seen - busy).abs() <= 0.2 + 0.05 * busy,
        "the unpaced slice's kernels took {busy:.3} s of the GPU; counted {busy_seen:.3} s\n{log}"
    );
    assert_eq!(seconds(&s, "idle"), Some(0.0));

    // `gpuslice status` shows each slice's share of the GPU's time since it was first
    // measured (under a minute ago: the agent's first pass after the claim).
    let out = cli(&bus.address, &["status", "--json"]);
    assert_success(&out);
    let now = std::time::Instant::now();
    let status: gpuslice_agent_api::Status = serde_json::from_slice(&out.stdout).unwrap();
    let used = |id: &str| -> Option<f64> {
        let slice = status
            .slices
            .iter()
            .find(|sl| sl.claim.container_id == id)
            .unwrap();
        slice.sm_used_percent[0]
    };
    let paced_percent = used("paced").expect("the paced slice's share is measured");
    let (least, most) = (
        100.0 * paced_seen / (now - before_claims).as_secs_f64(),
        // The agent's first pass after the claims may come one interval (100 ms) later.
        100.0 * paced_seen / (now - claimed - Duration::from_millis(100)).as_secs_f64(),
    );
    assert!(
        (least - 0.1..=most + 0.1).contains(&paced_percent),
        "{paced_percent}% shown for {paced_seen:.3} s of SM time over {:?} to {:?}",
        now - claimed,
        now - before_claims
    );
    assert_eq!(used("idle"), Some(0.0));
    let table = cli(&bus.address, &["status"]);
    let text = String::from_utf8_lossy(&table.stdout);
    // The percent columns of a slice's row: its share (none: `-`), then what it used.
    let percents = |id: &str| -> Vec<String> {
        let line = text
            .lines()
            .find(|l| l.starts_with(id))
            .unwrap_or_else(|| panic!("{text}"));
        line.split_whitespace()
            .filter(|w| w.ends_with('%'))
            .map(str::to_string)
            .collect()
    };
    assert!(text.contains("SM USED"), "{text}");
    assert_eq!(percents("idle"), ["0%"], "{text}");
    assert_eq!(
        percents("paced"),
        ["30%".to_string(), format!("{paced_percent:.0}%")],
        "{text}"
    );

    // Both at once for 2 s: the driver names one process a period, so each one's count is
    // right only over many periods, but together they are the GPU time both took.
    let (paced_more, busy_more) = std::thread::scope(|t| {
        let paced = t.spawn(|| spin_in(&sim, &agent, &cgroups["paced"], "paced", 2000, true));
        let busy = spin_in(&sim, &agent, &cgroups["busy"], "busy", 2000, false);
        (paced.join().unwrap(), busy)
    });
    settled();
    let (_, s) = scrape(&agent);
    let both =
        seconds(&s, "paced").unwrap() - paced_seen + seconds(&s, "busy").unwrap() - busy_seen;
    let took = paced_more + busy_more;
    assert!(
        (both - took).abs() <= 0.3 + 0.05 * took,
        "two slices' kernels took {took:.3} s of the GPU; counted {both:.3} s\n{}",
        agent.log()
    );
    assert_eq!(seconds(&s, "idle"), Some(0.0));
    let paced_seen = seconds(&s, "paced").unwrap();

    // A released slice's series goes; the others keep their counts.
    p.release("busy").await.unwrap();
    let (_, s) = scrape(&agent);
    assert_eq!(seconds(&s, "busy"), None);
    assert!(seconds(&s, "paced").unwrap() >= paced_seen);
    for mut init in inits {
        let _ = init.kill();
        let _ = init.wait();
    }
}

/// A shell in `cgroup` that runs `spin` (`shim/tests/c/spin.c`): 1,000-block kernels (1 ms
/// each on the simulated GPU here) back to back for `ms`, through the driver itself, so that
/// the interception library never paces them.
fn spin_around_the_library(sim: &SimNode, cgroup: &Cgroup, ms: u32) -> Command {
    let mut c = Command::new("/bin/sh");
    c.args([
        "-c",
        &format!(
            "echo $$ > {} && exec {} 1000 {ms}",
            cgroup.procs_file().display(),
            sim.test_program("spin").display()
        ),
    ])
    .env("LD_LIBRARY_PATH", sim.lib_dir());
    c
}

/// Claims a slice with a 30% share for container "greedy" (container "step" of pod
/// research/trainer), activated with a process in a cgroup of its own (named after
/// `cgroup`); returns the cgroup and the process.
async fn greedy_container(
    p: &gpuslice_agent_api::AgentProxy<'_>,
    cgroup: &str,
) -> (Cgroup, std::process::Child) {
    p.claim(
        "greedy",
        ann(&[
            ("gpuslice.io/memory", "1Gi"),
            ("gpuslice.io/cores", "30"),
            ("io.kubernetes.cri.sandbox-name", "trainer"),
            ("io.kubernetes.cri.sandbox-namespace", "research"),
            ("io.kubernetes.cri.container-name", "step"),
        ]),
    )
    .await
    .unwrap();
    let cgroup = Cgroup::new(cgroup);
    let init = Command::new("sleep").arg("600").spawn().unwrap();
    cgroup.adopt(init.id());
    p.activate("greedy", init.id()).await.unwrap();
    (cgroup, init)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_container_going_around_the_pacing_is_held_to_its_sm_share_and_never_left_frozen() {
    // A simulated T4 whose NVML names one process per sixth of a second, as a real driver;
    // the agent at its defaults (throttle, a tolerance of 10 points) but for a burst of 2 s
    // (30 s by default).
    let sim = SimNode::with_kernel_time(1, "T4", None, 1_000);
    let bus = Bus::start();
    let api = ApiServer::start();
    let mut agent = Agent::start(
        &agent_exe(),
        &bus,
        &sim,
        &[
            "--sm-share-burst",
            "2s",
            "--kube-events",
            "--kube-api",
            &api.url,
            "--node-name",
            "gpu-node-1",
        ],
    );
    let p = proxy(&bus.address).await;
    let (cgroup, mut init) = greedy_container(&p, "sm-greedy").await;

    // Flat out for 13 s; measured after the first 5 (the burst is spent by then): the GPU
    // time its kernels took of the time from then until they had all run.
    let out = spin_around_the_library(&sim, &cgroup, 13_000)
        .env("SPIN_WARMUP_MS", "5000")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    let used = field::<f64>(&text, "warm_blocks") * 1e-6;
    let elapsed = field::<f64>(&text, "warm_elapsed_ns") * 1e-9;
    let (_, s) = scrape(&agent);
    let throttled = value(
        &s,
        "gpuslice_slice_sm_throttled_seconds_total",
        &[("container", "greedy"), ("gpu", "0")],
    )
    .unwrap();
    let log = agent.log();
    eprintln!("used {used:.2} s of {elapsed:.2} s; held {throttled:.2} s");
    // Held to its share and the tolerance on average: off by at most what it queued before
    // each hold (about a second of kernels, as a real GPU queues) and a sampling period or
    // two of lag.
    assert!(
        (used / elapsed - 0.40).abs() <= 1.5 / elapsed,
        "the 30% container kept the GPU busy {used:.2} s of {elapsed:.2} s\n{log}"
    );
    assert!(throttled >= 3.0, "held {throttled:.2} s\n{log}");
    assert!(
        log.contains("beyond its share, its tolerance and its burst"),
        "the hold was not logged\n{log}"
    );
    // The pod's owner sees it in `kubectl describe pod research/trainer`.
    let events = api.kube_events();
    let e = events
        .iter()
        .find(|e| e["reason"] == "GPUSliceOverShare")
        .unwrap_or_else(|| panic!("{events:#?}"));
    assert_eq!(
        (&e["regarding"]["namespace"], &e["regarding"]["name"]),
        (&"research".into(), &"trainer".into())
    );
    let note = e["note"].as_str().unwrap();
    assert!(
        note.starts_with("container step: its processes kept")
            && note.contains("busier than 40% of its time")
            && note.ends_with("action: throttle"),
        "{note}"
    );

    // A stopping agent thaws what it holds; one killed leaves it frozen, and the next one
    // thaws it before it is ready. A container whose claim goes is thawed at once.
    let mut spin = spin_around_the_library(&sim, &cgroup, 60_000)
        .spawn()
        .unwrap();
    let held = |agent: &Agent| {
        assert!(
            wait_for(Duration::from_secs(10), || cgroup.frozen()),
            "never held\n{}",
            agent.log()
        );
    };
    held(&agent);
    // `gpuslice status` says so while it lasts.
    let said = wait_for(Duration::from_secs(5), || {
        let out = cli(&bus.address, &["status"]);
        String::from_utf8_lossy(&out.stdout).contains("running (pid")
            && String::from_utf8_lossy(&out.stdout).contains(", held over its SM share")
    });
    assert!(
        said,
        "{}",
        String::from_utf8_lossy(&cli(&bus.address, &["status"]).stdout)
    );
    agent.terminate();
    assert!(!cgroup.frozen(), "left frozen by the agent that stopped");
    agent.restart();
    held(&agent);
    agent.kill9();
    assert!(cgroup.frozen());
    agent.restart();
    assert!(!cgroup.frozen(), "left frozen by the agent that died");
    assert!(
        agent
            .log()
            .contains("thawed the containers a previous agent held")
    );
    held(&agent);
    p.release("greedy").await.unwrap();
    assert!(
        wait_for(Duration::from_secs(1), || !cgroup.frozen()),
        "still frozen after its claim went\n{}",
        agent.log()
    );
    spin.kill().unwrap();
    spin.wait().unwrap();
    init.kill().unwrap();
    init.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_two_containers_use_is_held_whole_when_one_goes_around_the_pacing() {
    let sim = SimNode::with_kernel_time(1, "T4", None, 1_000);
    let bus = Bus::start();
    let agent = Agent::start(&agent_exe(), &bus, &sim, &["--sm-share-burst", "2s"]);
    let p = proxy(&bus.address).await;
    // The first container of a 30% slice launches around the library; a second container
    // given the same slice (a ResourceClaim both name) is reported after it and idles.
    let (first, mut first_init) = greedy_container(&p, "sm-shared-first").await;
    let second = Cgroup::new("sm-shared-second");
    let mut second_init = Command::new("sleep").arg("600").spawn().unwrap();
    second.adopt(second_init.id());
    p.activate("greedy", second_init.id()).await.unwrap();
    let mut spin = spin_around_the_library(&sim, &first, 30_000)
        .spawn()
        .unwrap();
    let held = wait_for(Duration::from_secs(10), || {
        first.frozen() && second.frozen()
    });
    let (first_held, second_held) = (first.frozen(), second.frozen());
    p.release("greedy").await.unwrap();
    let thawed = wait_for(Duration::from_secs(1), || {
        !first.frozen() && !second.frozen()
    });
    for c in [&mut spin, &mut first_init, &mut second_init] {
        c.kill().unwrap();
        c.wait().unwrap();
    }
    let log = agent.log();
    assert!(
        held,
        "held: first {first_held}, second {second_held}\n{log}"
    );
    assert!(thawed, "still frozen after the claim went\n{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_in_a_cgroup_namespace_of_its_own_holds_a_container_outside_it() {
    // As in a pod: the agent runs in a cgroup of its own and a cgroup namespace rooted there,
    // in which the container's cgroup is not below the root (it reads `/../…`).
    let sim = SimNode::with_kernel_time(1, "T4", None, 1_000);
    let bus = Bus::start();
    let pod = Cgroup::new("agent-pod");
    let dir = tempfile::tempdir().unwrap();
    let in_a_pod = dir.path().join("in-a-pod");
    std::fs::write(
        &in_a_pod,
        format!(
            "#!/bin/sh\necho $$ > {}\nexec unshare --cgroup {} \"$@\"\n",
            pod.procs_file().display(),
            agent_exe().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &in_a_pod,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    // The namespace the test runs in stands for the host's (this machine's first process
    // may not be open to it).
    let host = format!("/proc/{}/ns/cgroup", std::process::id());
    let agent = Agent::start(
        &in_a_pod,
        &bus,
        &sim,
        &["--host-cgroup-namespace", &host, "--sm-share-burst", "2s"],
    );
    let p = proxy(&bus.address).await;
    let (cgroup, mut init) = greedy_container(&p, "sm-greedy-outside").await;
    let mut spin = spin_around_the_library(&sim, &cgroup, 30_000)
        .spawn()
        .unwrap();
    let held = wait_for(Duration::from_secs(10), || cgroup.frozen());
    for c in [&mut spin, &mut init] {
        c.kill().unwrap();
        c.wait().unwrap();
    }
    let log = agent.log();
    assert!(held, "never held\n{log}");
    assert!(log.contains("joined the host's cgroup namespace"), "{log}");
}
