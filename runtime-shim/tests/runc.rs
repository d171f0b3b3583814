//! The wrapper in front of the real runc: a GPU container gets its devices, driver, limits and
//! preload list; the agent holds its claim while it runs and not after; bad requests fail the
//! create with runc's JSON log and leave nothing behind; other containers pass untouched.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{CHECKS, Node, text};
use gpuslice_testsupport::wait_for;

#[test]
fn a_gpu_container_run_by_runc_through_the_wrapper_gets_its_slice() {
    let node = Node::new();
    let bundle = node.bundle(
        "gpu",
        &["/bin/sleep", "60"],
        &[("gpuslice.io/memory", "2Gi")],
    );
    let b = bundle.display().to_string();
    let out = node.wrapper(&["create", "--bundle", &b, "gpu1"]);
    assert!(out.status.success(), "create failed: {}", text(&out));
    let out = node.wrapper(&["start", "gpu1"]);
    assert!(out.status.success(), "start failed: {}", text(&out));

    let s = node.status();
    assert_eq!(s.slices.len(), 1);
    let claim = &s.slices[0].claim;
    assert_eq!(claim.container_id, "gpu1");
    assert!(
        matches!(claim.state, gpuslice_core::ClaimState::Active { .. }),
        "the createRuntime hook did not activate: {claim:?}"
    );
    assert_eq!(claim.gpus[0].minor, 0);

    let out = node.runc(&["exec", "gpu1", "/bin/sh", "-c", CHECKS]);
    let t = text(&out);
    common::assert_gpu_checks(&t);

    let out = node.runc(&["kill", "gpu1", "KILL"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(wait_for(Duration::from_secs(10), || text(
        &node.runc(&["state", "gpu1"])
    )
    .contains("\"stopped\"")));
    let out = node.wrapper(&["delete", "gpu1"]);
    assert!(out.status.success(), "delete failed: {}", text(&out));
    assert!(
        node.status().slices.is_empty(),
        "claim outlived its container"
    );
    assert!(!node.agent.run_dir.join("gpu1").exists());
}

#[test]
fn a_bad_request_fails_the_create_with_a_runc_json_log_and_leaves_nothing() {
    let node = Node::new();
    for (i, (key, value, why)) in [
        ("gpuslice.io/memory", "-1Gi", "negative"),
        ("gpuslice.io/memory", "64Gi", "has only 15Gi"),
    ]
    .iter()
    .enumerate()
    {
        let id = format!("bad{i}");
        let bundle = node.bundle(&id, &["/bin/true"], &[(key, value)]);
        let log = node.work.path().join(format!("{id}.log"));
        let (b, l) = (bundle.display().to_string(), log.display().to_string());
        let out = node.wrapper(&[
            "--log",
            &l,
            "--log-format",
            "json",
            "create",
            "--bundle",
            &b,
            &id,
        ]);
        assert!(!out.status.success(), "{id} was created");
        let line = std::fs::read_to_string(&log).unwrap();
        let entry: serde_json::Value = serde_json::from_str(line.lines().last().unwrap()).unwrap();
        assert_eq!(entry["level"], "error");
        let msg = entry["msg"].as_str().unwrap();
        assert!(
            msg.contains(&format!("annotation {key}={value:?}")) && msg.contains(why),
            "{msg}"
        );
        assert!(
            !text(&node.runc(&["state", &id])).contains("\"id\""),
            "runc knows {id}"
        );
        assert!(node.status().slices.is_empty());
        assert!(!node.agent.run_dir.join(&id).exists());
    }
}

#[test]
fn a_container_without_gpuslice_annotations_keeps_a_byte_identical_spec() {
    let node = Node::new();
    let bundle = node.bundle("plain", &["/bin/true"], &[("org.example/x", "1")]);
    let before = std::fs::read(bundle.join("config.json")).unwrap();
    let b = bundle.display().to_string();
    let out = node.wrapper(&["run", "--bundle", &b, "plain1"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(std::fs::read(bundle.join("config.json")).unwrap(), before);
    assert!(node.status().slices.is_empty());
}

#[test]
fn a_missing_interception_library_fails_the_create_and_releases_the_claim() {
    let mut node = Node::new();
    node.interception_library = Path::new("/nonexistent/libgpuslice.so").to_path_buf();
    let bundle = node.bundle("nolib", &["/bin/true"], &[("gpuslice.io/memory", "1Gi")]);
    let b = bundle.display().to_string();
    let out = node.wrapper(&["create", "--bundle", &b, "nolib1"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("interception library /nonexistent/libgpuslice.so is missing"),
        "{}",
        text(&out)
    );
    assert!(
        node.status().slices.is_empty(),
        "the claim of a container that was not created is held"
    );
}

#[test]
fn a_create_that_runc_fails_after_the_claim_gives_the_slice_back_at_once() {
    let node = Node::new();
    let bundle = node.bundle(
        "nobin",
        &["/no/such/program"],
        &[("gpuslice.io/memory", "1Gi")],
    );
    let b = bundle.display().to_string();
    let out = node.wrapper(&["create", "--bundle", &b, "nobin1"]);
    assert!(
        !out.status.success(),
        "runc created a container without its program"
    );
    assert!(text(&out).contains("/no/such/program"), "{}", text(&out));
    assert!(
        node.status().slices.is_empty(),
        "the claim of a container runc did not create is held: {:?}",
        node.status().slices
    );
}

#[test]
fn a_gpu_container_run_in_the_foreground_gives_its_slice_back_when_it_exits() {
    let node = Node::new();
    let bundle = node.bundle("fg", &["/bin/true"], &[("gpuslice.io/memory", "1Gi")]);
    let spec_path = bundle.join("config.json");
    let b = bundle.display().to_string();
    let out = node.wrapper(&["run", "--bundle", &b, "fg1"]);
    assert!(out.status.success(), "run failed: {}", text(&out));
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(spec_path).unwrap()).unwrap();
    assert!(
        spec["hooks"]["poststop"]
            .as_array()
            .is_some_and(|h| !h.is_empty()),
        "run needs a poststop hook"
    );
    assert!(
        node.status().slices.is_empty(),
        "the claim outlived the container"
    );
}

#[test]
fn two_containers_share_one_gpu_each_behind_its_own_wall() {
    let node = Node::new();
    // Each process's context is charged to its slice, as the driver takes it from the card.
    let ctx = node.sim.spec.gpus[0].context_bytes;
    // worker-b takes the whole of its 3 GiB and holds it while it runs.
    let hold = format!(
        "sleep 600 | /usr/bin/wall procaddr hold {}",
        (3u64 << 30) - ctx
    );
    let b = node.bundle(
        "b",
        &["/bin/sh", "-c", &hold],
        &[("gpuslice.io/memory", "3Gi")],
    );
    let b = b.display().to_string();
    let out = node.wrapper(&["create", "--bundle", &b, "worker-b"]);
    assert!(out.status.success(), "create failed: {}", text(&out));
    let out = node.wrapper(&["start", "worker-b"]);
    assert!(out.status.success(), "start failed: {}", text(&out));
    let used = || {
        text(&node.runc(&[
            "exec",
            "worker-b",
            "/usr/bin/nvidia-smi",
            "--query-gpu=memory.used,memory.total",
            "--format=csv,noheader",
        ]))
    };
    assert!(
        wait_for(Duration::from_secs(10), || used()
            .contains("3072 MiB, 3072 MiB")),
        "worker-b does not hold its slice: {}",
        used()
    );

    // worker-a, on the same GPU, meets its own wall at 2 GiB (its context included).
    let room = ((2u64 << 30) - ctx).to_string();
    let a = node.bundle(
        "a",
        &["/usr/bin/wall", "procaddr", "alloc", &room],
        &[("gpuslice.io/memory", "2Gi")],
    );
    let a = a.display().to_string();
    let out = node.wrapper(&["run", "--bundle", &a, "worker-a"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    for want in [
        "total=2147483648 ",
        &format!("start_free={room} "),
        "fit=CUDA_SUCCESS",
        "free_at_fit=0 ",
        "over=CUDA_ERROR_OUT_OF_MEMORY",
    ] {
        assert!(t.contains(want), "{want:?} not in {t}");
    }
    assert!(
        node.status()
            .slices
            .iter()
            .all(|s| s.claim.container_id != "worker-a")
    );

    let s = node.status();
    assert_eq!(s.slices.len(), 1);
    assert_eq!(s.slices[0].claim.gpus[0].minor, 0);
    let out = node.runc(&[
        "exec",
        "worker-b",
        "/usr/bin/wall",
        "procaddr",
        "alloc",
        "1",
    ]);
    // The slice is full: a second process of worker-b cannot even have its context.
    assert!(text(&out).contains("error=init"), "{}", text(&out));

    let out = node.runc(&["kill", "worker-b", "KILL"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(wait_for(Duration::from_secs(10), || text(
        &node.runc(&["state", "worker-b"])
    )
    .contains("\"stopped\"")));
    let out = node.wrapper(&["delete", "worker-b"]);
    assert!(out.status.success(), "delete failed: {}", text(&out));
    assert!(node.status().slices.is_empty());
}

#[test]
fn glibcs_own_dlsym_on_the_drivers_handle_finds_the_library_in_front_of_the_driver() {
    let node = Node::new();
    let bundle = node.bundle(
        "dlsym",
        &["/usr/bin/door", "dlsym", "536870912"],
        &[("gpuslice.io/memory", "512Mi")],
    );
    std::fs::copy(node.door_program(), bundle.join("rootfs/usr/bin/door")).unwrap();
    let b = bundle.display().to_string();
    let out = node.wrapper(&["run", "--bundle", &b, "dlsym1"]);
    // 2: CUDA_ERROR_OUT_OF_MEMORY, from the wall (the context already holds part of it).
    assert!(text(&out).contains("alloc=2"), "{}", text(&out));
    assert!(node.status().slices.is_empty());
}

#[test]
fn a_process_that_goes_around_the_library_is_caught_by_the_agent_and_killed() {
    let node = Node::killing_over_its_slice();
    let bundle = node.bundle(
        "door",
        &["/bin/sh", "-c", "sleep 600 | /usr/bin/door path 536870912"],
        &[("gpuslice.io/memory", "256Mi")],
    );
    std::fs::copy(node.door_program(), bundle.join("rootfs/usr/bin/door")).unwrap();
    let b = bundle.display().to_string();
    let out = node.wrapper(&["create", "--bundle", &b, "door1"]);
    assert!(out.status.success(), "create failed: {}", text(&out));
    let out = node.wrapper(&["start", "door1"]);
    assert!(out.status.success(), "start failed: {}", text(&out));
    // The real driver loaded by its own path: the library never saw the 512 MiB; the driver
    // did, for a pid in the container's own
    // namespace, and the agent finds it by the container's cgroup.
    let caught = gpuslice_testsupport::wait_for(std::time::Duration::from_secs(5), || {
        node.agent
            .log()
            .contains("the driver shows the container over its slice")
    });
    let log = node.agent.log();
    assert!(caught, "the agent did not catch it:\n{log}");
    // What the driver holds for it: the 512 MiB and its context.
    let used = format!(
        "used={}",
        (512u64 << 20) + node.sim.spec.gpus[0].context_bytes
    );
    assert!(
        log.contains("door1") && log.contains(&used) && log.contains("action=kill"),
        "{log}"
    );
    // The process over the slice is gone; the rest of the container (its shell, `sleep`)
    // runs on.
    let ps = || text(&node.runc(&["ps", "door1"]));
    let gone = gpuslice_testsupport::wait_for(std::time::Duration::from_secs(5), || {
        let t = ps();
        t.contains("sleep 600")
            && !t
                .lines()
                .any(|l| l.contains("/usr/bin/door") && !l.contains("sh -c"))
    });
    assert!(gone, "the process over its slice still runs:\n{}", ps());
    let _ = node.runc(&["kill", "door1", "KILL"]);
    assert!(gpuslice_testsupport::wait_for(
        std::time::Duration::from_secs(5),
        || text(&node.runc(&["state", "door1"])).contains("\"stopped\"")
    ));
    let out = node.wrapper(&["delete", "door1"]);
    assert!(out.status.success(), "delete failed: {}", text(&out));
}

#[test]
fn a_privileged_container_gets_no_slice_and_holds_no_claim() {
    let node = Node::new();
    let bundle = node.bundle("priv", &["/bin/true"], &[("gpuslice.io/memory", "1Gi")]);
    let path = bundle.join("config.json");
    let mut spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    for set in ["bounding", "effective", "permitted"] {
        spec["process"]["capabilities"][set]
            .as_array_mut()
            .unwrap()
            .push("CAP_SYS_ADMIN".into());
    }
    std::fs::write(&path, serde_json::to_vec(&spec).unwrap()).unwrap();
    let b = bundle.display().to_string();
    let out = node.wrapper(&["create", "--bundle", &b, "priv1"]);
    assert!(!out.status.success(), "a privileged container got a slice");
    assert!(
        text(&out).contains("is privileged (it has CAP_SYS_ADMIN)")
            && text(&out).contains("allow_privileged"),
        "{}",
        text(&out)
    );
    assert!(node.status().slices.is_empty(), "a claim is held");
}

#[test]
fn a_limits_file_removed_from_under_a_container_closes_its_wall() {
    let node = Node::new();
    let bundle = node.bundle(
        "gone",
        &["/bin/sleep", "600"],
        &[("gpuslice.io/memory", "1Gi")],
    );
    let b = bundle.display().to_string();
    let out = node.wrapper(&["create", "--bundle", &b, "gone1"]);
    assert!(out.status.success(), "create failed: {}", text(&out));
    let out = node.wrapper(&["start", "gone1"]);
    assert!(out.status.success(), "start failed: {}", text(&out));
    // What deleting a container of the same id elsewhere once did to this one's directory.
    std::fs::remove_file(node.agent.run_dir.join("gone1/limits")).unwrap();
    let out = node.runc(&[
        "exec",
        "gone1",
        "/usr/bin/wall",
        "procaddr",
        "alloc",
        "4294967296",
    ]);
    let t = text(&out);
    assert!(
        !t.contains("fit=CUDA_SUCCESS"),
        "no limits file meant no limit: {t}"
    );
    assert!(t.contains("error=init"), "{t}");
    let _ = node.runc(&["kill", "gone1", "KILL"]);
    assert!(wait_for(Duration::from_secs(10), || text(
        &node.runc(&["state", "gone1"])
    )
    .contains("\"stopped\"")));
    let out = node.wrapper(&["delete", "gone1"]);
    assert!(out.status.success(), "delete failed: {}", text(&out));
}

#[test]
fn a_container_id_taken_under_another_runtime_root_gets_no_slice_and_takes_none_away() {
    let node = Node::new();
    let first = node.bundle(
        "twin-a",
        &["/bin/sleep", "600"],
        &[("gpuslice.io/memory", "1Gi")],
    );
    let out = node.wrapper(&["create", "--bundle", &first.display().to_string(), "twin"]);
    assert!(out.status.success(), "create failed: {}", text(&out));
    // The same id under another runtime root (another containerd namespace, say).
    let other_root = node.work.path().join("other-root");
    let second = node.bundle("twin-b", &["/bin/true"], &[("gpuslice.io/memory", "1Gi")]);
    let in_other_root = |args: &[&str]| {
        let mut cmd = std::process::Command::new(gpuslice_testsupport::binary("gpuslice-runtime"));
        cmd.arg("--root")
            .arg(&other_root)
            .args(args)
            .envs(node.env());
        common::output_via_files(&mut cmd)
    };
    let out = in_other_root(&["create", "--bundle", &second.display().to_string(), "twin"]);
    assert!(!out.status.success(), "the second container was created");
    assert!(
        text(&out).contains("already holds a slice for a container of runtime-root:"),
        "{}",
        text(&out)
    );
    let _ = in_other_root(&["delete", "--force", "twin"]);
    // The first container keeps its claim and its limits.
    let s = node.status();
    assert_eq!(s.slices.len(), 1, "{s:?}");
    assert!(node.agent.run_dir.join("twin/limits").exists());
    let out = node.wrapper(&["delete", "twin"]);
    assert!(out.status.success(), "delete failed: {}", text(&out));
    assert!(node.status().slices.is_empty());
}

#[test]
fn a_container_sees_only_the_gpu_of_its_slice_through_cuda_and_nvml() {
    let node = Node::new();
    // The first container fills most of GPU 0; the second's slice lands on GPU 1.
    for (name, id, memory) in [("big", "fills0", "15Gi"), ("small", "on1", "4Gi")] {
        let b = node.bundle(
            name,
            &["/bin/sleep", "60"],
            &[("gpuslice.io/memory", memory)],
        );
        let b = b.display().to_string();
        let out = node.wrapper(&["create", "--bundle", &b, id]);
        assert!(out.status.success(), "create failed: {}", text(&out));
        let out = node.wrapper(&["start", id]);
        assert!(out.status.success(), "start failed: {}", text(&out));
    }
    let s = node.status();
    let on1 = s
        .slices
        .iter()
        .find(|sl| sl.claim.container_id == "on1")
        .unwrap();
    assert_eq!(on1.claim.gpus[0].minor, 1);
    let bus = node.sim.spec.gpus[1].pci_bus_id.clone();
    let smi = text(&node.runc(&[
        "exec",
        "on1",
        "/usr/bin/nvidia-smi",
        "--query-gpu=index,pci.bus_id,memory.total",
        "--format=csv,noheader",
    ]));
    assert_eq!(
        smi.trim(),
        format!("0, {bus}, 4096 MiB"),
        "NVML shows other GPUs"
    );
    let wall = text(&node.runc(&["exec", "on1", "/usr/bin/wall", "procaddr", "alloc", "1"]));
    assert!(wall.contains("total=4294967296 "), "{wall}");
    let count = text(&node.runc(&[
        "exec",
        "on1",
        "/bin/sh",
        "-c",
        "CUDA_VISIBLE_DEVICES=1 /usr/bin/wall procaddr alloc 1",
    ]));
    assert!(
        count.contains("error=init"),
        "CUDA_VISIBLE_DEVICES=1 named a GPU the container cannot open: {count}"
    );
    for id in ["fills0", "on1"] {
        let _ = node.runc(&["kill", id, "KILL"]);
        assert!(wait_for(Duration::from_secs(10), || text(
            &node.runc(&["state", id])
        )
        .contains("\"stopped\"")));
        assert!(node.wrapper(&["delete", id]).status.success());
    }
}

#[test]
fn a_create_with_a_pid_file_reports_the_pid_itself_and_the_container_carries_no_activation_hook() {
    let node = Node::new();
    let b = node.bundle(
        "pidfile",
        &["/bin/sleep", "60"],
        &[("gpuslice.io/memory", "1Gi")],
    );
    let pid_file = b.join("init.pid");
    let out = node.wrapper(&[
        "create",
        "--bundle",
        &b.display().to_string(),
        "--pid-file",
        &pid_file.display().to_string(),
        "withpid",
    ]);
    assert!(out.status.success(), "create failed: {}", text(&out));
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Before start: the agent already knows the container's process.
    let s = node.status();
    match s.slices[0].claim.state {
        gpuslice_core::ClaimState::Active { pid: active, .. } => assert_eq!(active, pid),
        ref other => panic!("the claim is {other:?}, not active with pid {pid}"),
    }
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(b.join("config.json")).unwrap()).unwrap();
    assert!(
        spec["hooks"]["createRuntime"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "{}",
        spec["hooks"]
    );
    assert!(node.wrapper(&["start", "withpid"]).status.success());
    let _ = node.runc(&["kill", "withpid", "KILL"]);
    assert!(wait_for(Duration::from_secs(10), || text(
        &node.runc(&["state", "withpid"])
    )
    .contains("\"stopped\"")));
    assert!(node.wrapper(&["delete", "withpid"]).status.success());
    assert!(node.status().slices.is_empty());
}

#[test]
fn the_wrapper_and_its_hooks_reach_the_agent_over_its_private_socket_without_the_bus() {
    let node = Node::new();
    let dead_bus = format!(
        "unix:path={}",
        node.agent.state_dir.join("no-bus").display()
    );
    let socket = node.agent.private_socket().display().to_string();
    let wrapper = |args: &[&str]| {
        let mut cmd = std::process::Command::new(gpuslice_testsupport::binary("gpuslice-runtime"));
        cmd.arg("--root").arg(node.runc_root()).args(args);
        for (k, v) in node.env() {
            match k.as_str() {
                "GPUSLICE_BUS_ADDRESS" => cmd.env(k, &dead_bus),
                _ => cmd.env(k, v),
            };
        }
        cmd.env("GPUSLICE_AGENT_SOCKET", &socket);
        common::output_via_files(&mut cmd)
    };
    // The wrapper claims, reports the pid and releases.
    let b = node.bundle(
        "p2p",
        &["/bin/sleep", "60"],
        &[("gpuslice.io/memory", "1Gi")],
    );
    let pid_file = b.join("init.pid").display().to_string();
    let bundle = b.display().to_string();
    let out = wrapper(&[
        "create",
        "--bundle",
        &bundle,
        "--pid-file",
        &pid_file,
        "p2p1",
    ]);
    assert!(out.status.success(), "create failed: {}", text(&out));
    assert!(matches!(
        node.status().slices[0].claim.state,
        gpuslice_core::ClaimState::Active { .. }
    ));
    let _ = node.runc(&["kill", "p2p1", "KILL"]);
    assert!(wait_for(Duration::from_secs(10), || text(
        &node.runc(&["state", "p2p1"])
    )
    .contains("\"stopped\"")));
    let out = wrapper(&["delete", "p2p1"]);
    assert!(out.status.success(), "delete failed: {}", text(&out));
    assert!(
        node.status().slices.is_empty(),
        "the wrapper did not release"
    );
    // In the foreground the hooks report the start and release at the stop, with the
    // environment the wrapper gives them. Root inside finds no way to the socket: neither
    // the agent's path nor the default one exists in the container.
    let look = format!(
        "test ! -e {socket} && test ! -e {} && test ! -e /run/gpuslice-agent",
        gpuslice_agent_api::PRIVATE_SOCKET
    );
    let b = node.bundle(
        "p2pfg",
        &["/bin/sh", "-c", &look],
        &[("gpuslice.io/memory", "1Gi")],
    );
    let out = wrapper(&["run", "--bundle", &b.display().to_string(), "p2p2"]);
    assert!(out.status.success(), "run failed: {}", text(&out));
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(b.join("config.json")).unwrap()).unwrap();
    let socket_env = format!("GPUSLICE_AGENT_SOCKET={socket}");
    assert!(
        spec["hooks"]["poststop"][0]["env"]
            .as_array()
            .is_some_and(|e| e.iter().any(|v| v.as_str() == Some(socket_env.as_str()))),
        "{}",
        spec["hooks"]
    );
    assert!(
        node.status().slices.is_empty(),
        "the poststop hook did not release"
    );
}
