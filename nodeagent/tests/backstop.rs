//! The enforcement backstop: a process that allocates device memory without the
//! interception library (here: plainly, with no preload at all) is seen by the agent through
//! the driver's per-process accounting (NVML), attributed to its container by its cgroup, and
//! killed when the container holds more than its slice; a container within its slice is left
//! alone.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use futures_util::StreamExt;
use gpuslice_testsupport::{agent::Agent, bus::Bus, http, sim::SimNode};

/// A cgroup of its own (a container's, as far as the agent can tell), removed when dropped.
struct Cgroup(PathBuf);

impl Cgroup {
    fn new(name: &str) -> Self {
        let path = gpuslice_testsupport::cgroup2_root()
            .join(format!("gpuslice-test-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }
    fn adopt(&self, pid: u32) {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string()).unwrap();
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The C client that holds `bytes` of device memory, called plainly through the simulated
/// driver (no interception library), until its stdin closes.
fn hold(sim: &SimNode, program: &Path, bytes: u64) -> Child {
    let mut child = Command::new(program)
        .args(["link", "hold", &bytes.to_string()])
        .env("LD_LIBRARY_PATH", sim.lib_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("fit=CUDA_SUCCESS"), "{line}");
    child
}

fn compile_wall(sim: &SimNode) -> PathBuf {
    let program = sim.root().join("wall");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shim/tests/c/wall.c");
    let ok = Command::new("gcc")
        .args(["-O1", "-o"])
        .arg(&program)
        .arg(&src)
        .arg(format!("-L{}", sim.lib_dir().display()))
        .args(["-lcuda", "-ldl"])
        .status()
        .expect("gcc")
        .success();
    assert!(ok);
    program
}

#[tokio::test(flavor = "multi_thread")]
async fn a_container_over_its_slice_behind_the_librarys_back_is_killed_and_one_within_is_not() {
    let sim = SimNode::new(1, "A10", None);
    let bus = Bus::start();
    let agent = Agent::start(
        &agent_exe(),
        &bus,
        &sim,
        &[
            "--enforce-interval",
            "100ms",
            "--over-limit-action",
            "kill",
            "--over-limit-tolerance",
            "0",
        ],
    );
    let program = compile_wall(&sim);
    let p = proxy(&bus.address).await;
    let mut signals = p.receive_over_limit().await.unwrap();
    p.claim("greedy", ann(&[("gpuslice.io/memory", "256Mi")]))
        .await
        .unwrap();
    p.claim("modest", ann(&[("gpuslice.io/memory", "1Gi")]))
        .await
        .unwrap();

    let (greedy_cg, modest_cg) = (Cgroup::new("greedy"), Cgroup::new("modest"));
    let mut modest = hold(&sim, &program, 512 << 20);
    modest_cg.adopt(modest.id());
    p.activate("modest", modest.id()).await.unwrap();
    let mut greedy = hold(&sim, &program, 512 << 20);
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
        ("greedy", 512 << 20, 256 << 20, "kill")
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
    drop(modest.stdin.take());
    let _ = modest.wait();
}
