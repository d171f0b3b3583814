//! What one pass of the enforcement backstop costs with 64 processes holding device memory in
//! 8 containers (8 each, each container its own cgroup): the NVML query of every process's
//! memory, the attribution of each process to its container by cgroup, and the comparison with
//! the slices. CPU time (this thread's) and wall time per pass, medians and 99th percentiles
//! over 200 passes. A container that crosses its slice is seen within one interval plus one
//! pass.
//!
//! Run: `cargo build --release --workspace && cargo bench -p gpuslice-nodeagent --bench backstop`
//! (as root: it makes cgroups).

use std::time::Instant;

use gpuslice_core::claim::{Claim, ClaimState, GpuGrant};
use gpuslice_nodeagent::backstop::{self, Procs};
use gpuslice_testsupport::sim::SimNode;

const CONTAINERS: usize = 8;
const PER_CONTAINER: usize = 8;
const PASSES: usize = 200;
const MIB: u64 = 1 << 20;

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec.
    #[allow(unsafe_code)]
    unsafe {
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut ts)
    };
    ts.tv_sec.unsigned_abs() * 1_000_000_000 + ts.tv_nsec.unsigned_abs()
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let sim = SimNode::new(1, "A100", None);
    let program = sim.wall_client();
    let procs = Procs {
        root: "/proc".into(),
    };
    let uuid = sim.spec.gpus[0].uuid.clone();
    let mut children = Vec::new();
    let mut cgroups = Vec::new();
    let mut claims = Vec::new();
    for c in 0..CONTAINERS {
        let cg = gpuslice_testsupport::cgroup2_root()
            .join(format!("gpuslice-bench-{c}-{}", std::process::id()));
        std::fs::create_dir_all(&cg).unwrap();
        let mut first = None;
        for _ in 0..PER_CONTAINER {
            let child = sim.hold(&program, 16 * MIB);
            std::fs::write(cg.join("cgroup.procs"), child.id().to_string()).unwrap();
            first.get_or_insert(child.id());
            children.push(child);
        }
        let pid = first.unwrap();
        claims.push(Claim {
            container_id: format!("c{c}"),
            request: gpuslice_core::annotations::parse(
                &[("gpuslice.io/memory".to_string(), "1Gi".to_string())].into(),
            )
            .unwrap()
            .unwrap(),
            exclusive: false,
            gpus: vec![GpuGrant {
                index: 0,
                uuid: uuid.clone(),
                minor: 0,
                // The first container is over its slice, so every pass finds one violation;
                // the others hold their processes' memory and contexts with room to spare.
                memory_bytes: if c == 0 {
                    64 * MIB
                } else {
                    PER_CONTAINER as u64 * (16 * MIB + sim.spec.gpus[0].context_bytes) + 64 * MIB
                },
                cores: 0,
                window: None,
            }],
            state: ClaimState::Active {
                pid,
                start_time: procs.start_time(pid).unwrap(),
                cgroups: std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok(),
                earlier: vec![],
            },
            created_unix_ms: 0,
            assigned_as: None,
            owner: None,
            pod: None,
        });
        cgroups.push(cg);
    }
    let nvml = nvml_wrapper::Nvml::builder()
        .lib_path(sim.lib_dir().join("libnvidia-ml.so.1").as_os_str())
        .init()
        .expect("simulated NVML");
    let uuids = vec![uuid];
    let (mut cpu, mut wall) = (Vec::new(), Vec::new());
    let mut found = (0, 0);
    for _ in 0..PASSES {
        let (c0, w0) = (thread_cpu_ns(), Instant::now());
        let samples = backstop::sample(&nvml, &uuids);
        let violations = backstop::violations(&claims, &samples, &procs, 0);
        wall.push(w0.elapsed().as_secs_f64() * 1e6);
        cpu.push((thread_cpu_ns() - c0) as f64 / 1e3);
        found = (samples.len(), violations.len());
    }
    assert_eq!(
        found,
        (CONTAINERS * PER_CONTAINER, 1),
        "samples, violations"
    );
    let cpu_median_copy = cpu.clone();
    println!(
        "backstop pass, {} processes in {CONTAINERS} containers ({PASSES} passes): CPU median {:.0} µs, p99 {:.0} µs; wall median {:.0} µs, p99 {:.0} µs",
        found.0,
        percentile(cpu.clone(), 0.5),
        percentile(cpu, 0.99),
        percentile(wall.clone(), 0.5),
        percentile(wall.clone(), 0.99),
    );
    println!(
        "detection within one interval plus one pass: at --enforce-interval 1s, 1s + {:.1} ms (p99); CPU share at 1s: {:.3}%",
        percentile(wall, 0.99) / 1e3,
        percentile(cpu_median_copy, 0.5) / 1e4
    );
    for mut child in children {
        drop(child.stdin.take());
        let _ = child.wait();
    }
    for cg in cgroups {
        let _ = std::fs::remove_dir(cg);
    }
}
