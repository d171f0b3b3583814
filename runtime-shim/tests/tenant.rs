//! A tenant attacking its slice from inside a real runc container, as an unprivileged user or
//! as root: the agent stays responsive, no container keeps more than its slice for longer than
//! the backstop's interval, nothing is killed that did not cross, and the tampering is
//! reported.

mod common;

use std::time::{Duration, Instant};

use common::{Node, text};
use gpuslice_testsupport::{field, wait_for};

const MIB: u64 = 1 << 20;

/// A bundle whose process runs as uid and gid 1000.
fn unprivileged(node: &Node, name: &str, script: &str, memory: &str) -> String {
    let bundle = node.bundle(
        name,
        &["/bin/sh", "-c", script],
        &[("gpuslice.io/memory", memory)],
    );
    let path = bundle.join("config.json");
    let mut spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    spec["process"]["user"] = serde_json::json!({"uid": 1000, "gid": 1000});
    std::fs::write(&path, serde_json::to_vec(&spec).unwrap()).unwrap();
    bundle.display().to_string()
}

/// A slice size that leaves `usable` MiB to allocate once each of `processes` processes has
/// its context (which the driver takes from the card, and the slice is charged for).
fn slice(node: &Node, usable: u64, processes: u64) -> String {
    format!("{}Mi", usable + processes * node.context_mib())
}

fn start(node: &Node, bundle: &str, id: &str) {
    let out = node.wrapper(&["create", "--bundle", bundle, id]);
    assert!(out.status.success(), "create failed: {}", text(&out));
    let out = node.wrapper(&["start", id]);
    assert!(out.status.success(), "start failed: {}", text(&out));
}

fn stop(node: &Node, id: &str) {
    let _ = node.runc(&["kill", id, "KILL"]);
    assert!(wait_for(Duration::from_secs(10), || text(
        &node.runc(&["state", id])
    )
    .contains("\"stopped\"")));
    let out = node.wrapper(&["delete", id]);
    assert!(out.status.success(), "delete failed: {}", text(&out));
}

/// The agent answers `status` quickly.
fn responsive(node: &Node) {
    let t = Instant::now();
    let _ = node.status();
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "status took {:?}",
        t.elapsed()
    );
}

fn processes(node: &Node, id: &str) -> String {
    text(&node.runc(&["ps", id]))
}

#[test]
fn an_unprivileged_tenant_zeroing_its_counters_is_stopped_by_the_backstop() {
    let node = Node::killing_over_its_slice();
    // A neighbour on the same GPU, within its slice, that must not be disturbed.
    let calm = node.bundle(
        "calm",
        &[
            "/bin/sh",
            "-c",
            "sleep 600 | /usr/bin/wall procaddr hold 134217728",
        ],
        &[("gpuslice.io/memory", &slice(&node, 256, 1))],
    );
    start(&node, &calm.display().to_string(), "calm1");
    let hold = 192 * MIB;
    // A holder takes 192 MiB of the 256 MiB left beside its context; then every slot is
    // zeroed (the header kept), so the region shows nothing held, and a second process tries
    // to take 192 MiB more. Either the agent's sample of the driver came first and the wall
    // refuses it (the first holder is charged to the container as a whole), or it gets it and
    // the backstop kills it: no more than one interval over the slice either way.
    let script = format!(
        "sleep 600 | /usr/bin/wall procaddr hold {hold} & \
         sleep 1; busybox dd if=/dev/zero of=/run/gpuslice/usage bs=64 seek=1 count=768 conv=notrunc 2>/dev/null; \
         sleep 600 | /usr/bin/wall procaddr hold {hold}"
    );
    let limit = 256 + node.context_mib();
    let bundle = unprivileged(&node, "zero", &script, &slice(&node, 256, 1));
    start(&node, &bundle, "zero1");
    // The rewritten region is reported as tampering, apart from anything else.
    let reported = wait_for(Duration::from_secs(10), || {
        node.agent
            .log()
            .lines()
            .any(|l| l.contains("zero1") && l.contains("counters were rewritten"))
    });
    assert!(reported, "{}", node.agent.log());
    responsive(&node);
    // The first holder runs on and the container is back within its slice as the host's
    // driver sees it.
    let within = wait_for(Duration::from_secs(10), || {
        let held = node.driver_held_mib("zero1");
        held > 192 && held <= limit
    });
    assert!(
        within,
        "the container holds {} MiB of {limit}:\n{}\n{}",
        node.driver_held_mib("zero1"),
        processes(&node, "zero1"),
        node.agent.log()
    );
    assert!(
        !node
            .agent
            .log()
            .lines()
            .any(|l| l.contains("calm1") && l.contains("over its slice")),
        "the neighbour was acted on:\n{}",
        node.agent.log()
    );
    assert!(
        processes(&node, "calm1")
            .lines()
            .any(|l| l.contains("/usr/bin/wall") && !l.contains("sh -c")),
        "the neighbour's holder died: {}",
        processes(&node, "calm1")
    );
    stop(&node, "zero1");
    stop(&node, "calm1");
}

#[test]
fn an_unprivileged_tenant_truncating_its_usage_region_kills_nothing_and_is_reported() {
    let node = Node::new();
    // The holder frees its memory (touching the region) once /dev/shm/go exists, and its exit
    // status is kept.
    let script = format!(
        "(while [ ! -e /dev/shm/go ]; do sleep 0.1; done) | /usr/bin/wall procaddr hold {}; \
         echo \"holder exit $?\" > /dev/shm/holder.out; sleep 600",
        64 * MIB
    );
    let bundle = unprivileged(&node, "trunc", &script, &slice(&node, 256, 1));
    let held = format!("{} MiB", 64 + node.context_mib());
    start(&node, &bundle, "trunc1");
    let holding = wait_for(Duration::from_secs(10), || {
        text(&node.runc(&[
            "exec",
            "--user",
            "1000:1000",
            "trunc1",
            "/usr/bin/nvidia-smi",
            "--query-gpu=memory.used",
            "--format=csv,noheader",
        ]))
        .contains(&held)
    });
    assert!(
        holding,
        "the holder does not hold its 64 MiB and its context"
    );
    let out = node.runc(&[
        "exec",
        "--user",
        "1000:1000",
        "trunc1",
        "/bin/sh",
        "-c",
        ": > /run/gpuslice/usage && echo truncated",
    ]);
    assert!(text(&out).contains("truncated"), "{}", text(&out));
    // A new process meets a closed wall.
    let out = node.runc(&[
        "exec",
        "--user",
        "1000:1000",
        "trunc1",
        "/usr/bin/wall",
        "procaddr",
        "alloc",
        "1",
    ]);
    assert!(text(&out).contains("error=init"), "{}", text(&out));
    responsive(&node);
    let reported = wait_for(Duration::from_secs(10), || {
        node.agent.log().contains("trunc1") && node.agent.log().contains("tamper")
    });
    assert!(reported, "{}", node.agent.log());
    // The holder frees its memory through the truncated region and exits normally (SIGBUS
    // used to end it: exit status 135).
    let out = node.runc(&["exec", "trunc1", "/bin/sh", "-c", "touch /dev/shm/go"]);
    assert!(out.status.success(), "{}", text(&out));
    let exit = || text(&node.runc(&["exec", "trunc1", "/bin/cat", "/dev/shm/holder.out"]));
    assert!(
        wait_for(Duration::from_secs(10), || exit().contains("holder exit")),
        "{}",
        exit()
    );
    assert!(exit().contains("holder exit 0"), "{}", exit());
    stop(&node, "trunc1");
}

#[test]
fn with_the_stop_action_a_container_over_its_slice_is_stopped_whole() {
    let node = Node::with_agent_args(&[
        "--enforce-interval",
        "200ms",
        "--over-limit-action",
        "stop",
        "--over-limit-tolerance",
        "0",
    ]);
    let bundle = node.bundle(
        "stopped",
        &["/bin/sh", "-c", "sleep 600 | /usr/bin/door path 536870912"],
        &[("gpuslice.io/memory", "256Mi")],
    );
    std::fs::copy(node.door_program(), bundle.join("rootfs/usr/bin/door")).unwrap();
    start(&node, &bundle.display().to_string(), "stop1");
    let stopped = wait_for(Duration::from_secs(10), || {
        text(&node.runc(&["state", "stop1"])).contains("\"stopped\"")
    });
    let log = node.agent.log();
    assert!(stopped, "the container still runs:\n{log}");
    assert!(
        log.lines().any(|l| l.contains("stop1")
            && l.contains("over its slice")
            && l.contains("action=stop")),
        "{log}"
    );
    let out = node.wrapper(&["delete", "stop1"]);
    assert!(out.status.success(), "delete failed: {}", text(&out));
    assert!(node.status().slices.is_empty());
}

#[test]
fn an_unprivileged_tenant_looking_for_the_real_allocator_finds_the_wall() {
    let node = Node::new();
    // glibc's own dlsym (taken by version) on the driver's handle, and the CUDA 12 runtime's
    // way (cuGetProcAddress): both meet the wall 256 MiB beyond the context.
    let script = "/usr/bin/door dlsym 536870912; /usr/bin/wall procaddr alloc 268435456";
    let bundle = unprivileged(&node, "seeker", script, &slice(&node, 256, 1));
    std::fs::copy(
        node.door_program(),
        std::path::Path::new(&bundle).join("rootfs/usr/bin/door"),
    )
    .unwrap();
    let out = node.wrapper(&["run", "--bundle", &bundle, "seeker1"]);
    let t = text(&out);
    // 2: CUDA_ERROR_OUT_OF_MEMORY.
    assert!(t.contains("alloc=2"), "{t}");
    assert!(
        t.contains("fit=CUDA_SUCCESS") && t.contains("over=CUDA_ERROR_OUT_OF_MEMORY"),
        "{t}"
    );
    assert!(node.status().slices.is_empty());
}

/// `shim/tests/c/<name>.c`, linked against the node's driver, at `/usr/bin/<name>` in the
/// bundle's root.
fn copy_program(node: &Node, bundle: &str, name: &str) {
    let out = node.work.path().join(name);
    if !out.exists() {
        let ok = std::process::Command::new("gcc")
            .args(["-O1", "-o"])
            .arg(&out)
            .arg(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join(format!("../shim/tests/c/{name}.c")),
            )
            .arg(format!("-L{}", node.sim.lib_dir().display()))
            .arg("-lcuda")
            .arg("-ldl")
            .status()
            .unwrap();
        assert!(ok.success());
    }
    std::fs::copy(
        &out,
        std::path::Path::new(bundle).join(format!("rootfs/usr/bin/{name}")),
    )
    .unwrap();
}

#[test]
fn an_unprivileged_tenants_dead_and_execed_processes_hold_no_charge() {
    let node = Node::new();
    // A child killed and left a zombie (160 MiB), then a process that takes 160 MiB and execs
    // a program asking for the whole 256 MiB left beside its context: neither dead image keeps
    // its charge.
    let script = format!(
        "(sleep 600 | /usr/bin/lifecycle zombie {m} > /dev/shm/z.out) & \
         while ! grep -q zombie= /dev/shm/z.out 2>/dev/null; do sleep 0.1; done; cat /dev/shm/z.out; \
         /usr/bin/lifecycle exec {m} /usr/bin/wall procaddr alloc {all}",
        m = 160 * MIB,
        all = 256 * MIB
    );
    let bundle = unprivileged(&node, "lives", &script, &slice(&node, 256, 1));
    copy_program(&node, &bundle, "lifecycle");
    let out = node.wrapper(&["run", "--bundle", &bundle, "lives1"]);
    let t = text(&out);
    assert!(t.contains("child_alloc=0 zombie=Z"), "{t}");
    assert!(t.contains("alloc=0"), "{t}");
    assert!(
        t.contains("fit=CUDA_SUCCESS"),
        "a dead image kept its charge: {t}"
    );
    assert!(node.status().slices.is_empty());
}

#[test]
fn an_unprivileged_tenants_raw_forked_child_leaves_its_parents_charge_in_place() {
    let node = Node::new();
    // The parent holds 160 MiB; its child, made by the raw clone system call, exits through
    // exit(): 96 MiB are left beside the two processes' contexts, not the whole slice.
    let script = format!(
        "(sleep 600 | /usr/bin/lifecycle rawfork {m} > /dev/shm/f.out) & \
         while ! grep -q child_exited= /dev/shm/f.out 2>/dev/null; do sleep 0.1; done; cat /dev/shm/f.out; \
         /usr/bin/wall procaddr alloc {left}",
        m = 160 * MIB,
        left = 96 * MIB
    );
    let bundle = unprivileged(&node, "forks", &script, &slice(&node, 256, 2));
    copy_program(&node, &bundle, "lifecycle");
    let out = node.wrapper(&["run", "--bundle", &bundle, "forks1"]);
    let t = text(&out);
    assert!(t.contains("alloc=0 child_exited=1"), "{t}");
    assert!(t.contains("fit=CUDA_SUCCESS"), "{t}");
    assert!(
        t.contains("over=CUDA_ERROR_OUT_OF_MEMORY"),
        "the child's exit took its parent's charge away: {t}"
    );
}

#[test]
fn an_unprivileged_tenant_in_a_nested_pid_namespace_cannot_fill_its_slice_twice() {
    let node = Node::new();
    // A process in a new user and PID namespace (as any user may make) is pid 1 there and looks
    // like another process to the rest of the container; it holds 160 MiB while a second
    // process asks for the rest: 96 MiB fit beside the two contexts, a byte more does not.
    let script = format!(
        "(sleep 600 | busybox unshare -Urpf sh -c 'echo nested_pid=$$; exec /usr/bin/wall procaddr hold {m}' > /dev/shm/h.out 2>&1) & \
         n=0; while ! grep -q fit= /dev/shm/h.out 2>/dev/null && [ $n -lt 100 ]; do sleep 0.1; n=$((n+1)); done; cat /dev/shm/h.out; \
         /usr/bin/wall procaddr alloc {left}",
        m = 160 * MIB,
        left = 96 * MIB
    );
    let bundle = unprivileged(&node, "nested", &script, &slice(&node, 256, 2));
    let out = node.wrapper(&["run", "--bundle", &bundle, "nested1"]);
    let t = text(&out);
    assert!(
        t.contains("nested_pid=1\n"),
        "the holder is not in a PID namespace of its own: {t}"
    );
    assert!(
        t.contains("fit=CUDA_SUCCESS chunks=0"),
        "the nested holder got nothing: {t}"
    );
    assert!(t.contains("fit=CUDA_SUCCESS free_at_fit"), "{t}");
    assert!(
        t.contains("over=CUDA_ERROR_OUT_OF_MEMORY"),
        "the nested holder's charge was reaped while it held its memory: {t}"
    );
    responsive(&node);
}

#[test]
fn an_unprivileged_tenant_finds_no_allocator_the_wall_cannot_count() {
    let node = Node::new();
    // Released-while-mapped handles stay charged: four 64 MiB chunks fill the 256 MiB left
    // beside the context.
    // Every entry point whose memory the library cannot count answers NOT_SUPPORTED (801).
    // (Graph memory is counted: see the test below.)
    let script = format!(
        "/usr/bin/vmm {chunk} 6; /usr/bin/refused < /dev/null",
        chunk = 64 * MIB
    );
    let bundle = unprivileged(&node, "doors", &script, &slice(&node, 256, 1));
    copy_program(&node, &bundle, "vmm");
    copy_program(&node, &bundle, "refused");
    let out = node.wrapper(&["run", "--bundle", &bundle, "doors1"]);
    let t = text(&out);
    assert!(
        t.contains("mapped=4 "),
        "released handles were given back while mapped: {t}"
    );
    assert!(t.contains("after_unmap=0"), "{t}");
    for name in [
        "cuMemAlloc",
        "cuArrayCreate",
        "cuMemImportFromShareableHandle",
        "cuMemPoolImportPointer",
        "cuMulticastCreate",
    ] {
        let refused = format!("{name}=801");
        assert!(
            t.split_whitespace().any(|pair| pair == refused),
            "{name} was not refused: {t}"
        );
    }
    responsive(&node);
}

#[test]
fn an_unprivileged_tenant_cannot_outgrow_its_slice_through_graph_memory() {
    let node = Node::new();
    // `graphs` (shim/tests/c/graphs.c) with 512 MiB beside its context: a graph holding 200 MiB, freed
    // into the graph pool, leaves no room for 400 MiB more; a 600 MiB graph is refused at
    // launch and at upload; a free captured into a graph and never run gives nothing back.
    let bundle = unprivileged(&node, "graphmem", "/usr/bin/graphs", &slice(&node, 512, 1));
    copy_program(&node, &bundle, "graphs");
    let out = node.wrapper(&["run", "--bundle", &bundle, "graphmem1"]);
    let t = text(&out);
    let facts: std::collections::HashMap<&str, &str> = t
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .collect();
    let num = |k: &str| -> u64 {
        facts
            .get(k)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{k} missing: {t}"))
    };
    let start = num("start");
    assert_eq!(num("after_launch"), start - 200, "{t}");
    assert_eq!(num("after_free"), start - 200, "{t}");
    for (k, v) in [
        ("launch", "0"),
        ("alloc_over_pool", "2"),
        ("alloc_beside_pool", "0"),
        ("too_big", "2"),
        ("upload_too_big", "2"),
        ("trim", "0"),
        ("freed_by_graph", "0"),
    ] {
        assert_eq!(facts.get(k).copied(), Some(v), "{k}: {t}");
    }
    assert_eq!(num("after_trim"), start, "{t}");
    assert_eq!(num("after_captured_free"), num("with_m"), "{t}");
    assert_eq!(num("end"), start, "{t}");
    responsive(&node);
}

/// The number of samples the agent has begun for container `id`.
fn samples_begun(node: &Node, id: &str) -> u64 {
    let bytes = std::fs::read(node.agent.run_dir.join(id).join("held")).unwrap();
    let at = gpuslice_core::held::HEADER_BEGUN;
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

#[test]
fn root_in_the_container_flooding_the_sample_requests_costs_the_agent_one_sample_per_gap() {
    let node = Node::new();
    let bundle = node.bundle(
        "flood",
        &["/bin/sh", "-c", "sleep 600"],
        &[("gpuslice.io/memory", "1Gi")],
    );
    std::fs::copy(node.c_program("flood"), bundle.join("rootfs/usr/bin/flood")).unwrap();
    start(&node, &bundle.display().to_string(), "flood1");
    for attack in [
        "rm -f /run/gpuslice/sample.sock",
        "mv /run/gpuslice/sample.sock /run/gpuslice/x",
    ] {
        let out = node.runc(&["exec", "flood1", "/bin/sh", "-c", attack]);
        assert!(!out.status.success(), "{attack} succeeded: {}", text(&out));
    }
    let before = samples_begun(&node, "flood1");
    let seconds = 3;
    let root = node.runc_root();
    let flood = std::thread::spawn(move || {
        std::process::Command::new("runc")
            .arg("--root")
            .arg(root)
            .args([
                "exec",
                "flood1",
                "/usr/bin/flood",
                "/run/gpuslice/sample.sock",
            ])
            .arg(seconds.to_string())
            .output()
            .unwrap()
    });
    std::thread::sleep(Duration::from_secs(1));
    responsive(&node);
    let out = flood.join().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    let sent: u64 = said
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("sent="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "flood said: {said} {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let served = samples_begun(&node, "flood1") - before;
    // One sample per 10 ms gap at most, and one a second of the agent's own; some slack for
    // the time runc exec takes to start and end.
    let most = (seconds + 1) * (1000 / 10 + 1);
    eprintln!("{sent} requests sent, {served} samples taken");
    assert!(sent > most, "the tenant sent only {sent} requests");
    assert!(served > 0, "no request was served");
    assert!(
        served <= most,
        "{served} samples for {sent} requests in {seconds} s"
    );
    responsive(&node);
    stop(&node, "flood1");
}

#[test]
fn root_in_the_container_cannot_rewrite_or_replace_what_the_driver_is_said_to_hold() {
    let node = Node::new();
    let bundle = node.bundle(
        "share",
        &["/bin/sh", "-c", "sleep 600"],
        &[("gpuslice.io/memory", "1Gi")],
    );
    start(&node, &bundle.display().to_string(), "share1");
    // As root in the container: write over the driver's share, truncate it, move it aside,
    // plant another file beside it. Each must fail.
    for attack in [
        "busybox dd if=/dev/zero of=/run/gpuslice/held bs=8 count=1 conv=notrunc",
        ": > /run/gpuslice/held",
        "mv /run/gpuslice/held /run/gpuslice/held.old",
        "rm -f /run/gpuslice/held",
        "echo x > /run/gpuslice/held.new",
    ] {
        let out = node.runc(&["exec", "share1", "/bin/sh", "-c", attack]);
        assert!(!out.status.success(), "{attack} succeeded: {}", text(&out));
    }
    let host = node.agent.run_dir.join("share1").join("held");
    let bytes = std::fs::read(&host).unwrap();
    assert_eq!(&bytes[..8], b"GPSLHLD1", "the agent's file is intact");
    assert_eq!(bytes.len(), gpuslice_core::held::file_size(256));
    stop(&node, "share1");
}

/// The `key=value` pairs of each line a program printed, in order.
fn lines_of_facts(t: &str) -> Vec<std::collections::HashMap<&str, &str>> {
    t.lines()
        .map(|l| {
            l.split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .collect()
        })
        .collect()
}

#[test]
fn root_in_the_container_meets_the_wall_on_the_memory_the_driver_takes_by_itself() {
    let node = Node::new();
    let ctx = node.context_mib() * MIB;
    // Room for four contexts and a half beside the process's own, as root (runc's default
    // user) with the agent at its defaults: green contexts until refused, module globals of
    // exactly the room and a byte more, memory left in contexts the process destroys, a
    // stack raised to the room and a byte past it, kernels whose local memory grows the stack
    // at their launch to the room and a byte past it (`shim/tests/c/wall.c`, reached as the
    // CUDA 12 runtime reaches the driver).
    let room = 4 * ctx + ctx / 2;
    let script = format!(
        "for p in green module ctx_gone stack local; do echo path=$p; /usr/bin/wall procaddr $p {room}; done"
    );
    let memory = format!("{}Mi", (room + ctx) / MIB);
    let bundle = node.bundle(
        "driver",
        &["/bin/sh", "-c", &script],
        &[("gpuslice.io/memory", &memory)],
    );
    let out = node.wrapper(&["run", "--bundle", &bundle.display().to_string(), "driver1"]);
    let t = text(&out);
    let lines = lines_of_facts(&t);
    let path = |name: &str| {
        let at = lines
            .iter()
            .position(|f| f.get("path") == Some(&name))
            .unwrap_or_else(|| panic!("{name} never ran: {t}"));
        lines
            .get(at + 1)
            .unwrap_or_else(|| panic!("{name} printed nothing: {t}"))
    };
    let num = |f: &std::collections::HashMap<&str, &str>, k: &str| -> u64 {
        f.get(k)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{k} missing: {t}"))
    };
    for name in ["green", "module", "ctx_gone", "stack", "local"] {
        let f = path(name);
        assert_eq!(
            f.get("over"),
            Some(&"CUDA_ERROR_OUT_OF_MEMORY"),
            "{name}: {t}"
        );
        assert_eq!(num(f, "end_free"), room, "{name} kept a charge: {t}");
    }
    let green = path("green");
    assert_eq!(num(green, "made"), 4, "{t}");
    assert_eq!(num(green, "after_destroy"), room, "{t}");
    let module = path("module");
    assert_eq!(module.get("fit"), Some(&"CUDA_SUCCESS"), "{t}");
    assert_eq!(num(module, "free_at_fit"), 0, "{t}");
    assert_eq!(num(module, "after_ctx"), room, "{t}");
    let gone = path("ctx_gone");
    assert_eq!(num(gone, "after_destroy"), room, "{t}");
    assert_eq!(num(gone, "after_release"), room, "{t}");
    let stack = path("stack");
    assert_eq!(stack.get("fit"), Some(&"CUDA_SUCCESS"), "{t}");
    assert_eq!(num(stack, "kept_after_over"), 1, "{t}");
    let local = path("local");
    assert_eq!(local.get("fit"), Some(&"CUDA_SUCCESS"), "{t}");
    assert_eq!(num(local, "kept_after_over"), 1, "{t}");
    assert_eq!(local.get("graph_fit"), Some(&"CUDA_SUCCESS"), "{t}");
    assert_eq!(
        local.get("graph_over"),
        Some(&"CUDA_ERROR_OUT_OF_MEMORY"),
        "{t}"
    );

    // A process that first makes three more contexts and then fills the slice in 64 MiB
    // chunks: the host's driver sees the container within its slice, and holding at least
    // the slice less one context and one chunk.
    let chunk = 64 * MIB;
    let script = format!(
        "sleep 600 | WALL_CONTEXTS=3 /usr/bin/wall procaddr fill {chunk} > /dev/shm/fill.out"
    );
    let bundle = node.bundle(
        "contexts",
        &["/bin/sh", "-c", &script],
        &[("gpuslice.io/memory", &memory)],
    );
    start(&node, &bundle.display().to_string(), "contexts1");
    let said = || text(&node.runc(&["exec", "contexts1", "cat", "/dev/shm/fill.out"]));
    assert!(
        wait_for(Duration::from_secs(20), || said().contains("fit=")),
        "{}",
        said()
    );
    let line = said();
    assert!(line.contains("contexts=3 "), "{line}");
    assert!(line.contains("fit=CUDA_ERROR_OUT_OF_MEMORY"), "{line}");
    let limit = (room + ctx) / MIB;
    let held = node.driver_held_mib("contexts1");
    assert!(
        held <= limit,
        "the host sees {held} MiB held in a {limit} MiB slice: {line}"
    );
    assert!(
        held * MIB + ctx + chunk >= room + ctx,
        "the host sees only {held} MiB held in a {limit} MiB slice: {line}"
    );
    responsive(&node);
    stop(&node, "contexts1");
}

/// Runs `script` as root in a container `id` of a 30% slice, whose `/door` holds a
/// `libcuda.so.1` that is the real driver at the private path it is mounted at (so a program
/// run with `LD_LIBRARY_PATH=/door` launches around the interception library), on an agent at
/// its defaults but for a burst of 2 s; with `writable_cgroups`, the container's cgroup file
/// system is mounted read-write. Returns what the container printed and the agent's log.
fn around_the_pacing(id: &str, script: &str, writable_cgroups: bool) -> (String, String) {
    // 1 µs a block on the simulated T4s, whose NVML names one process per sixth of a second.
    let node = Node::on(
        gpuslice_testsupport::sim::SimNode::with_kernel_time(2, "T4", None, 1_000),
        &["--sm-share-burst", "2s"],
    );
    let bundle = node.bundle(
        id,
        &["/bin/sh", "-c", script],
        &[("gpuslice.io/memory", "1Gi"), ("gpuslice.io/cores", "30")],
    );
    if writable_cgroups {
        writable_cgroup_mounts(&bundle);
    }
    let b = bundle.display().to_string();
    copy_program(&node, &b, "spin");
    std::fs::create_dir_all(bundle.join("rootfs/door")).unwrap();
    std::os::unix::fs::symlink(
        "/usr/lib/gpuslice/driver/libgpuslice-driver-cuda.so.1",
        bundle.join("rootfs/door/libcuda.so.1"),
    )
    .unwrap();
    let out = node.wrapper(&["run", "--bundle", &b, &format!("{id}1")]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(node.status().slices.is_empty());
    (t, node.agent.log())
}

/// Asserts that `spin` (its output in `t`) kept the GPU busy for the 30% share and the
/// default 10-point tolerance after its burst, and that the agent held container `id`.
fn assert_held_to_its_share(id: &str, t: &str, log: &str) {
    let (used, elapsed) = (
        field::<f64>(t, "warm_blocks") * 1e-6,
        field::<f64>(t, "warm_elapsed_ns") * 1e-9,
    );
    eprintln!("used {used:.2} s of {elapsed:.2} s");
    assert!(
        (used / elapsed - 0.40).abs() <= 1.5 / elapsed,
        "the 30% container kept the GPU busy {used:.2} s of {elapsed:.2} s\n{t}\n{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains(id) && l.contains("beyond its share")),
        "{log}"
    );
}

/// Mounts the container's cgroup file system read-write (as for a container in systemd mode).
fn writable_cgroup_mounts(bundle: &std::path::Path) {
    let path = bundle.join("config.json");
    let mut spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    for m in spec["mounts"].as_array_mut().unwrap() {
        if m["type"] == "cgroup" {
            m["options"] = serde_json::json!(["nosuid", "noexec", "nodev", "relatime", "rw"]);
        }
    }
    std::fs::write(&path, serde_json::to_vec(&spec).unwrap()).unwrap();
}

/// Moves the shell running it into a cgroup `escape` below the container's, in every
/// hierarchy it can.
const MOVE_FIRST_PROCESS: &str = "for d in /sys/fs/cgroup/*/; do mkdir -p \"$d\"escape && echo $$ > \"$d\"escape/cgroup.procs; done";

#[test]
fn root_in_the_container_launching_around_the_pacing_is_held_to_its_sm_share() {
    // `spin` finds a libcuda.so.1 of its own first, so the interception library never sees
    // its launches. Flat out for 13 s, measured after the first 5 (its burst is spent by
    // then).
    let (t, log) = around_the_pacing(
        "hog",
        "SPIN_WARMUP_MS=5000 LD_LIBRARY_PATH=/door exec /usr/bin/spin 1000 13000",
        false,
    );
    assert_held_to_its_share("hog1", &t, &log);
}

#[test]
fn root_in_the_container_moving_its_first_process_away_from_a_process_launching_around_the_pacing_is_held_whole()
 {
    // The first process starts the same `spin` in the container's cgroup, then moves itself
    // into a cgroup below it: the agent freezes the container's cgroup, recorded when it was
    // activated, and everything below it, not the one the first process went to.
    let script = format!(
        "SPIN_WARMUP_MS=5000 LD_LIBRARY_PATH=/door /usr/bin/spin 1000 13000 & {MOVE_FIRST_PROCESS}; \
         grep freezer /proc/self/cgroup; wait"
    );
    let (t, log) = around_the_pacing("shifter", &script, true);
    assert!(
        t.lines()
            .any(|l| l.contains("freezer:") && l.ends_with("/escape")),
        "the first process did not move: {t}"
    );
    assert_held_to_its_share("shifter1", &t, &log);
}

#[test]
fn root_in_the_container_moving_its_first_process_to_a_cgroup_of_its_own_leaves_its_others_charged()
{
    let node = Node::killing_over_its_slice();
    // The container's cgroup file system is writable (as for a container run in systemd
    // mode). Its first process, the one the container was activated with, starts a process
    // that goes around the library two seconds later (the real driver by its private path,
    // 512 MiB in a 256 MiB slice), then moves itself into a cgroup of its own in every
    // hierarchy it can, leaving that process in the container's cgroup above it.
    let script = format!(
        "(sleep 2; sleep 600 | /usr/bin/door path 536870912) & {MOVE_FIRST_PROCESS}; exec sleep 600"
    );
    let bundle = node.bundle(
        "mover",
        &["/bin/sh", "-c", &script],
        &[("gpuslice.io/memory", "256Mi")],
    );
    writable_cgroup_mounts(&bundle);
    std::fs::copy(node.door_program(), bundle.join("rootfs/usr/bin/door")).unwrap();
    start(&node, &bundle.display().to_string(), "mover1");
    // The move happened: the first process is in a cgroup below the container's.
    let state: serde_json::Value =
        serde_json::from_str(&text(&node.runc(&["state", "mover1"]))).unwrap();
    let init = state["pid"].as_u64().unwrap();
    let moved = wait_for(Duration::from_secs(5), || {
        std::fs::read_to_string(format!("/proc/{init}/cgroup"))
            .is_ok_and(|c| c.contains("/mover1/escape"))
    });
    assert!(
        moved,
        "{}",
        std::fs::read_to_string(format!("/proc/{init}/cgroup")).unwrap_or_default()
    );
    // The process left in the container's own cgroup is still the container's: caught over
    // its slice and killed; the first process runs on.
    let caught = wait_for(Duration::from_secs(10), || {
        node.agent.log().lines().any(|l| {
            l.contains("mover1") && l.contains("over its slice") && l.contains("action=kill")
        })
    });
    assert!(caught, "{}", node.agent.log());
    let gone = wait_for(Duration::from_secs(5), || {
        !processes(&node, "mover1")
            .lines()
            .any(|l| l.contains("/usr/bin/door") && !l.contains("sh -c"))
    });
    assert!(gone, "{}", processes(&node, "mover1"));
    assert!(std::path::Path::new(&format!("/proc/{init}")).exists());
    stop(&node, "mover1");
}
