//! create+start+delete of a trivial container (`/bin/true`), plain runc against the wrapper,
//! interleaved in one run: a container without a GPU (pure pass-through) and a GPU container
//! (claim, spec edit, hooks, release). Containers are created with `--pid-file`, as containerd
//! and podman create them; a fourth kind, a GPU container created without one (its pid is
//! reported by a createRuntime hook), shows what the wrapper's own report saves, and a fifth, a
//! GPU container whose wrapper reaches the agent over the bus instead of the agent's private
//! socket, what the socket saves. Prints medians and the ratio / difference.
//!
//! Run: `cargo build --release --workspace && scripts/static-programs && cargo bench -p gpuslice-runtime-shim --bench lifecycle`
//! (`BENCH_ROUNDS`, default 30). Needs root, runc, busybox and gcc.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpuslice_testsupport::bench::{median, rounds};
use gpuslice_testsupport::{agent::Agent, binary, bus::Bus, rootfs, sim::SimNode};

struct Setup {
    work: PathBuf,
    env: Vec<(String, String)>,
}

fn bundle(work: &Path, name: &str, annotations: &[(&str, &str)]) -> PathBuf {
    let b = work.join(name);
    rootfs::busybox(&b.join("rootfs"), &[]);
    assert!(
        Command::new("runc")
            .arg("spec")
            .current_dir(&b)
            .status()
            .expect("runc")
            .success()
    );
    let path = b.join("config.json");
    let mut spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("spec")).expect("json");
    spec["process"]["terminal"] = false.into();
    spec["process"]["args"] = serde_json::json!(["/bin/true"]);
    spec["annotations"] = annotations
        .iter()
        .map(|(k, v)| ((*k).to_string(), serde_json::Value::from(*v)))
        .collect();
    std::fs::write(&path, serde_json::to_vec(&spec).expect("json")).expect("write");
    b
}

/// One create+start+delete with `exe`; returns its wall time and that of each command.
/// `pid_file`: create with `--pid-file`, as containerd and podman (conmon) do.
fn lifecycle(
    setup: &Setup,
    exe: &Path,
    bundle: &Path,
    id: &str,
    pid_file: bool,
) -> (Duration, [Duration; 3]) {
    // The bundle's spec is edited in place by the wrapper: start from the pristine copy.
    std::fs::copy(bundle.join("config.json.orig"), bundle.join("config.json"))
        .expect("restore spec");
    let root = setup.work.join("runc-root");
    let run = |args: &[&str]| {
        let st = Command::new(exe)
            .arg("--root")
            .arg(&root)
            .args(args)
            .envs(setup.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(if std::env::var_os("GPUSLICE_RUNTIME_DEBUG").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .status()
            .expect("runtime");
        assert!(st.success(), "{} {args:?} failed", exe.display());
    };
    let b = bundle.display().to_string();
    let pid = bundle.join("init.pid").display().to_string();
    let mut create = vec!["create", "--bundle", &b];
    if pid_file {
        create.extend(["--pid-file", &pid]);
    }
    create.push(id);
    let t = Instant::now();
    run(&create);
    let created = t.elapsed();
    run(&["start", id]);
    let started = t.elapsed();
    run(&["delete", "--force", id]);
    let total = t.elapsed();
    (total, [created, started - created, total - started])
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rounds = rounds(30);
    let sim = SimNode::new(2, "T4", None);
    let bus = Bus::start();
    let agent = Agent::start(&binary("gpuslice-agent"), &bus, &sim, &[]);
    let work = tempfile::tempdir().expect("tempdir");
    let lib = gpuslice_testsupport::target_dir().join("libgpuslice.so");
    assert!(
        lib.exists(),
        "{} (cargo build --release --workspace)",
        lib.display()
    );
    // The simulated node is selected by its runtime configuration, as an operator would.
    let config = work.path().join("runtime.json");
    std::fs::write(&config, sim.runtime_config().to_string()).expect("runtime.json");
    let setup = Setup {
        work: work.path().to_path_buf(),
        env: vec![
            (
                "GPUSLICE_RUNTIME_CONFIG".into(),
                config.display().to_string(),
            ),
            ("GPUSLICE_LOW_LEVEL_RUNTIME".into(), "runc".into()),
            (
                "GPUSLICE_RUN_DIR".into(),
                agent.run_dir.display().to_string(),
            ),
            ("GPUSLICE_BUS_ADDRESS".into(), bus.address.clone()),
            (
                "GPUSLICE_INTERCEPTION_LIBRARY".into(),
                lib.display().to_string(),
            ),
            (
                "GPUSLICE_HOOK".into(),
                binary("gpuslice-hook").display().to_string(),
            ),
            (
                "GPUSLICE_AGENT_SOCKET".into(),
                agent.private_socket().display().to_string(),
            ),
        ],
    };
    // The same, the agent reached over the bus only.
    let over_bus = Setup {
        work: setup.work.clone(),
        env: setup
            .env
            .iter()
            .filter(|(k, _)| k != "GPUSLICE_AGENT_SOCKET")
            .cloned()
            .collect(),
    };
    let plain = bundle(work.path(), "plain", &[]);
    let gpu = bundle(work.path(), "gpu", &[("gpuslice.io/memory", "1Gi")]);
    for b in [&plain, &gpu] {
        std::fs::copy(b.join("config.json"), b.join("config.json.orig")).expect("copy");
    }
    let runc = PathBuf::from("runc");
    let wrapper = binary("gpuslice-runtime");
    let (mut base, mut wrapped_plain, mut wrapped_gpu) = (Vec::new(), Vec::new(), Vec::new());
    let (mut gpu_no_pid_file, mut gpu_over_bus) = (Vec::new(), Vec::new());
    let mut phases: [[Vec<Duration>; 3]; 2] = Default::default();
    for i in 0..rounds + 3 {
        let samples = [
            lifecycle(&setup, &runc, &plain, &format!("r{i}"), true),
            lifecycle(&setup, &wrapper, &plain, &format!("w{i}"), true),
            lifecycle(&setup, &wrapper, &gpu, &format!("g{i}"), true),
            lifecycle(&setup, &wrapper, &gpu, &format!("h{i}"), false),
            lifecycle(&over_bus, &wrapper, &gpu, &format!("b{i}"), true),
        ];
        if i >= 3 {
            base.push(samples[0].0);
            wrapped_plain.push(samples[1].0);
            wrapped_gpu.push(samples[2].0);
            gpu_no_pid_file.push(samples[3].0);
            gpu_over_bus.push(samples[4].0);
            for (k, (plain, gpu)) in samples[0].1.iter().zip(samples[2].1.iter()).enumerate() {
                phases[0][k].push(*plain);
                phases[1][k].push(*gpu);
            }
        }
    }
    let (b, p, g) = (median(base), median(wrapped_plain), median(wrapped_gpu));
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "bench=lifecycle rounds={rounds} runc_ms={:.2} wrapper_plain_ms={:.2} wrapper_gpu_ms={:.2} wrapper_gpu_without_pid_file_ms={:.2} wrapper_gpu_over_bus_ms={:.2}",
        ms(b),
        ms(p),
        ms(g),
        ms(median(gpu_no_pid_file)),
        ms(median(gpu_over_bus))
    );
    for (name, p) in [("runc", &phases[0]), ("wrapper_gpu", &phases[1])] {
        let m: Vec<String> = ["create", "start", "delete"]
            .iter()
            .zip(p.iter())
            .map(|(verb, v)| format!("{verb}_ms={:.2}", ms(median(v.clone()))))
            .collect();
        println!("bench=lifecycle phases={name} {}", m.join(" "));
    }
    println!(
        "bench=lifecycle non_gpu_ratio={:.3} gpu_over_runc_ms={:.2}",
        p.as_secs_f64() / b.as_secs_f64(),
        ms(g) - ms(b)
    );
}
