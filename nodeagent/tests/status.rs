//! The agent on a simulated node, seen through `gpuslice status`, and its systemd protocol.

mod common;

use common::*;
use gpuslice_agent_api::Status;
use gpuslice_testsupport::{agent::Agent, bus::Bus, sim::SimNode};

#[test]
fn status_lists_the_four_gpus_of_a_simulated_node_with_their_memory() {
    let sim = SimNode::new(4, "A10", None);
    let bus = Bus::start();
    let _agent = Agent::start(&agent_exe(), &bus, &sim, &[]);
    let out = cli(&bus.address, &["status", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s: Status = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s.gpus.len(), 4);
    for (i, g) in s.gpus.iter().enumerate() {
        assert_eq!(g.memory_total, 24 * GIB);
        assert_eq!(g.uuid, sim.spec.gpus[i].uuid);
        assert_eq!(s.inventory.gpus[i].name, "NVIDIA A10");
    }
    let table = cli(&bus.address, &["status"]);
    let text = String::from_utf8_lossy(&table.stdout);
    for gpu in &sim.spec.gpus {
        assert!(
            text.contains(&gpu.uuid) && text.contains("24.0 GiB"),
            "{text}"
        );
    }
    // How the GPUs are connected, as nvidia-smi topo -m prints it: all four on NUMA node 0,
    // no NVLink, no shared PCIe switch.
    let topology = s.inventory.topology.as_ref().expect("a topology");
    assert_eq!(topology.link(0, 3).to_string(), "NODE");
    let row = text
        .lines()
        .find(|l| l.starts_with("GPU2 "))
        .unwrap_or_else(|| panic!("no topology row for GPU2: {text}"));
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>(),
        ["GPU2", "NODE", "NODE", "X", "NODE", "0"]
    );
}

#[test]
fn status_shows_engine_ids_short_as_engines_do_and_whole_on_request() {
    let sim = SimNode::new(1, "T4", None);
    let bus = Bus::start();
    let _agent = Agent::start(&agent_exe(), &bus, &sim, &[]);
    let engine_id = "4f1c2e9a7b3d".repeat(5) + "0a1b";
    for id in [engine_id.as_str(), "a-name-of-its-own"] {
        let claim = cli(&bus.address, &["claim", id, "-a", "gpuslice.io/memory=1Gi"]);
        assert!(
            claim.status.success(),
            "{}",
            String::from_utf8_lossy(&claim.stderr)
        );
    }
    let rows = |args: &[&str]| -> Vec<Vec<String>> {
        let out = cli(&bus.address, args);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .skip_while(|l| !l.starts_with("CONTAINER"))
            .map(|l| l.split_whitespace().map(str::to_string).collect())
            .collect()
    };
    let short = rows(&["status"]);
    assert_eq!(short.len(), 3, "{short:?}");
    assert_eq!(short[0][..3], ["CONTAINER", "GPU", "LIMIT"]);
    let ids: Vec<&str> = short[1..].iter().map(|r| r[0].as_str()).collect();
    assert!(
        ids.contains(&&engine_id[..12]) && ids.contains(&"a-name-of-its-own"),
        "{short:?}"
    );
    // Every row has its columns: the id did not run into the next one.
    assert!(
        short[1..].iter().all(|r| r[1] == "0" && r[2] == "1.0"),
        "{short:?}"
    );
    let whole = rows(&["status", "--no-trunc"]);
    assert!(whole[1..].iter().any(|r| r[0] == engine_id), "{whole:?}");
}

#[test]
fn anyone_may_read_the_ledger_but_only_root_may_change_it() {
    let sim = SimNode::new(1, "T4", None);
    let bus = Bus::start();
    let _agent = Agent::start(&agent_exe(), &bus, &sim, &[]);
    let read = cli_as_nobody(&bus.address, &["status", "--json"]);
    assert!(
        read.status.success(),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    let write = cli_as_nobody(
        &bus.address,
        &["claim", "c1", "-a", "gpuslice.io/memory=1Gi"],
    );
    assert!(!write.status.success());
    let err = String::from_utf8_lossy(&write.stderr);
    assert!(
        err.contains("uid 65534 may not change the ledger") && err.contains("AccessDenied"),
        "{err}"
    );
    let root = cli(
        &bus.address,
        &["claim", "c1", "-a", "gpuslice.io/memory=1Gi"],
    );
    assert!(
        root.status.success(),
        "{}",
        String::from_utf8_lossy(&root.stderr)
    );
}

#[test]
fn the_packaged_bus_policy_lets_root_claim_and_others_only_read() {
    let policy = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../packaging/dbus/io.gpuslice.Agent1.conf");
    let policy = policy.canonicalize().expect("packaged policy");
    let bus = Bus::start_system_like(&format!("<include>{}</include>", policy.display()));
    let sim = SimNode::new(1, "T4", None);
    let _agent = Agent::start(&agent_exe(), &bus, &sim, &[]);
    let root = cli(
        &bus.address,
        &["claim", "c1", "-a", "gpuslice.io/memory=1Gi"],
    );
    assert!(
        root.status.success(),
        "{}",
        String::from_utf8_lossy(&root.stderr)
    );
    let read = cli_as_nobody(&bus.address, &["status"]);
    assert!(
        read.status.success(),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    let write = cli_as_nobody(&bus.address, &["release", "c1"]);
    let err = String::from_utf8_lossy(&write.stderr);
    assert!(
        !write.status.success()
            && err.contains("Rejected send message")
            && err.contains("(AccessDenied)"),
        "{err}"
    );
}

#[test]
fn the_agent_reports_ready_pings_the_watchdog_and_stops_on_sigterm() {
    let sim = SimNode::new(1, "T4", None);
    let bus = Bus::start();
    let mut agent = Agent::start_with_env(
        &agent_exe(),
        &bus,
        &sim,
        &[],
        &[("WATCHDOG_USEC", "200000")],
    );
    let ok = gpuslice_testsupport::wait_for(std::time::Duration::from_secs(5), || {
        agent
            .notifications()
            .iter()
            .any(|m| m.contains("WATCHDOG=1"))
    });
    assert!(ok, "no watchdog ping:\n{}", agent.log());
    let status = agent.terminate().expect("exit status");
    assert!(status.success(), "{status}");
    assert!(
        agent
            .notifications()
            .iter()
            .any(|m| m.contains("STOPPING=1"))
    );
}

#[test]
fn a_second_agent_on_the_same_ledger_refuses_to_start() {
    let sim = SimNode::new(1, "T4", None);
    let bus = Bus::start();
    let agent = Agent::start(&agent_exe(), &bus, &sim, &[]);
    let out = std::process::Command::new(agent_exe())
        .args(["--driver-root", &sim.root().display().to_string()])
        .args(["--state-dir", &agent.state_dir.display().to_string()])
        .args(["--run-dir", &agent.run_dir.display().to_string()])
        .args(["--bus-address", &bus.address, "--metrics-address", "off"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("another gpuslice-agent holds the ledger"),
        "{err}"
    );
}

#[test]
fn claims_survive_a_restart_and_release_removes_the_container_directory() {
    let sim = SimNode::new(2, "T4", None);
    let bus = Bus::start();
    let mut agent = Agent::start(&agent_exe(), &bus, &sim, &[]);
    let out = cli(
        &bus.address,
        &[
            "claim",
            "web-1",
            "-a",
            "gpuslice.io/memory=2Gi",
            "-a",
            "gpuslice.io/cores=25",
            "--json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let limits = std::fs::read_to_string(agent.run_dir.join("web-1/limits")).unwrap();
    assert!(
        limits.contains("gpu.0.memory_bytes=2147483648") && limits.contains("gpu.0.cores=25"),
        "{limits}"
    );
    let meta = std::fs::metadata(agent.run_dir.join("web-1/limits")).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
        0o444
    );
    agent.restart();
    let s: Status =
        serde_json::from_slice(&cli(&bus.address, &["status", "--json"]).stdout).unwrap();
    assert_eq!(s.slices.len(), 1);
    assert_eq!(s.slices[0].claim.gpus[0].memory_bytes, 2 * GIB);
    assert!(cli(&bus.address, &["release", "web-1"]).status.success());
    assert!(!agent.run_dir.join("web-1").exists());
}

#[test]
fn the_agent_exits_with_an_error_when_its_bus_goes_away() {
    let sim = SimNode::new(1, "T4", None);
    let bus = Bus::start();
    let mut agent = Agent::start(&agent_exe(), &bus, &sim, &[]);
    drop(bus);
    let status = agent
        .wait_exit(std::time::Duration::from_secs(15))
        .expect("agent still running without its bus");
    assert!(!status.success());
    assert!(
        agent.log().contains("lost the D-Bus connection"),
        "{}",
        agent.log()
    );
}

#[test]
fn the_context_reservation_reaches_every_limits_file_and_a_bad_one_is_refused() {
    let sim = SimNode::new(1, "T4", None);
    let bus = Bus::start();
    let agent = Agent::start(
        &agent_exe(),
        &bus,
        &sim,
        &["--context-reservation", "300Mi"],
    );
    let out = cli(
        &bus.address,
        &["claim", "web-1", "-a", "gpuslice.io/memory=2Gi"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let limits = std::fs::read_to_string(agent.run_dir.join("web-1/limits")).unwrap();
    assert!(limits.contains("gpu.0.context_bytes=314572800"), "{limits}");

    let out = std::process::Command::new(agent_exe())
        .args(["--context-reservation", "25%"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--context-reservation") && err.contains("25%"),
        "{err}"
    );
}

/// A bus address where no bus is: a client that reaches the agent with it went another way.
fn no_bus(agent: &Agent) -> String {
    format!("unix:path={}", agent.state_dir.join("no-bus").display())
}

/// `gpuslice` arguments claiming 1 GiB for `c1` over the private socket `sock`.
fn claim_over(sock: &str) -> [&str; 6] {
    [
        "--agent-socket",
        sock,
        "claim",
        "c1",
        "-a",
        "gpuslice.io/memory=1Gi",
    ]
}

#[test]
fn root_reaches_the_agent_over_its_private_socket_without_the_bus() {
    use std::os::unix::fs::PermissionsExt;
    let sim = SimNode::new(1, "T4", None);
    let bus = Bus::start();
    let agent = Agent::start(&agent_exe(), &bus, &sim, &[]);
    let socket = agent.private_socket();
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{}", socket.display());
    let (no_bus, sock) = (no_bus(&agent), socket.display().to_string());
    let without = cli(&no_bus, &["status"]);
    assert!(!without.status.success(), "the dead bus answered");
    assert_success(&cli(&no_bus, &claim_over(&sock)));
    // The same ledger, seen over the bus.
    let listed = |bus: &str| -> Vec<String> {
        let out = cli(bus, &["status", "--json"]);
        assert_success(&out);
        let s: Status = serde_json::from_slice(&out.stdout).unwrap();
        s.slices.into_iter().map(|s| s.claim.container_id).collect()
    };
    assert_eq!(listed(&bus.address), ["c1"]);
    let release = cli(&no_bus, &["--agent-socket", &sock, "release", "c1"]);
    assert_success(&release);
    assert!(listed(&bus.address).is_empty());
}

#[test]
fn only_root_may_change_the_ledger_over_the_private_socket_even_when_it_is_left_open() {
    use std::os::unix::fs::PermissionsExt;
    let sim = SimNode::new(1, "T4", None);
    let bus = Bus::start();
    let agent = Agent::start(&agent_exe(), &bus, &sim, &[]);
    let (no_bus, sock) = (no_bus(&agent), agent.private_socket().display().to_string());
    let claim = claim_over(&sock);
    // As made (mode 0600), another user cannot connect at all.
    let shut = cli_as_nobody(&no_bus, &["--agent-socket", &sock, "status"]);
    assert!(!shut.status.success(), "nobody reached the agent");
    // Opened to everyone by mistake, it still answers reads only.
    let open = |p: &std::path::Path, mode| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    open(agent.state_dir.parent().unwrap(), 0o711);
    open(&agent.state_dir, 0o711);
    open(&agent.private_socket(), 0o666);
    let read = cli_as_nobody(&no_bus, &["--agent-socket", &sock, "status", "--json"]);
    assert_success(&read);
    let write = cli_as_nobody(&no_bus, &claim);
    assert!(!write.status.success());
    let err = String::from_utf8_lossy(&write.stderr);
    assert!(err.contains("uid 65534 may not change the ledger"), "{err}");
    let root = cli(&no_bus, &claim);
    assert_success(&root);
}

#[test]
fn the_agent_makes_no_private_socket_in_a_directory_others_can_write_and_serves_the_bus() {
    use std::os::unix::fs::PermissionsExt;
    let sim = SimNode::new(1, "T4", None);
    let bus = Bus::start();
    let open = tempfile::tempdir().unwrap();
    std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let socket = open.path().join("private");
    let agent = Agent::start(
        &agent_exe(),
        &bus,
        &sim,
        &["--private-socket", &socket.display().to_string()],
    );
    assert!(!socket.exists() && !open.path().join("private.new").exists());
    let log = agent.log();
    assert!(
        log.contains("lets others write") && log.contains(&open.path().display().to_string()),
        "{log}"
    );
    assert_success(&cli(&bus.address, &["status"]));
}

#[test]
fn a_client_takes_the_private_socket_only_from_root_and_otherwise_uses_the_bus() {
    use std::os::unix::fs::PermissionsExt;
    let sim = SimNode::new(1, "T4", None);
    let bus = Bus::start();
    let _agent = Agent::start(&agent_exe(), &bus, &sim, &[]);
    // Another user listens where a client was told the agent's socket is, and never answers.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let fake = dir.path().join("private");
    let mut impostor = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
        ])
        .arg(
            "import socket,sys,time\n\
             s=socket.socket(socket.AF_UNIX)\n\
             s.bind(sys.argv[1]); s.listen(8)\n\
             held=[]\n\
             while True: held.append(s.accept())\n",
        )
        .arg(&fake)
        .spawn()
        .unwrap();
    assert!(gpuslice_testsupport::wait_for(
        std::time::Duration::from_secs(10),
        || fake.exists()
    ));
    let out = std::process::Command::new("timeout")
        .arg("20")
        .arg(env!("CARGO_BIN_EXE_gpuslice"))
        .args(["--bus-address", &bus.address, "--agent-socket"])
        .arg(&fake)
        .args(["claim", "c1", "-a", "gpuslice.io/memory=1Gi"])
        .output()
        .unwrap();
    let _ = impostor.kill();
    let _ = impostor.wait();
    assert_success(&out);
    let status = cli(&bus.address, &["status", "--json"]);
    let s: Status = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(s.slices.len(), 1, "the claim went to the real agent");
}
