//! The wall as the host measures it. The simulated driver takes device memory for each
//! context, as a real one does (294 MiB on the simulated T4) and NVML reports it per process;
//! the agent measures what a context costs at start and charges it per context, and publishes
//! from NVML what the driver holds for each process beyond what the process counted. Every
//! test here checks the figure an operator checks: NVML's per-process `usedGpuMemory`.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use gpuslice_testsupport::{agent::Agent, bus::Bus, field, http, sim::SimNode, wait_for};
use nvml_wrapper::enums::device::UsedGpuMemory;

const MIB: u64 = 1 << 20;
const SLICE: u64 = 2 * GIB;
/// What the filling processes allocate at a time.
const CHUNK: u64 = 64 * MIB;

/// A container on the simulated node: a claim of a 2 GiB slice, activated with a first
/// process in a cgroup of its own, whose processes find the slice as a container's would.
struct Container {
    sim: SimNode,
    _bus: Bus,
    agent: Agent,
    cgroup: Cgroup,
    init: Child,
    wall: PathBuf,
    id: &'static str,
}

impl Container {
    async fn start(agent_args: &[&str]) -> Self {
        Self::start_on(SimNode::new(1, "T4", None), agent_args, &[]).await
    }

    /// As [`Container::start`], on `sim`, the claim asking for `more` besides the 2 GiB.
    async fn start_on(sim: SimNode, agent_args: &[&str], more: &[(&str, &str)]) -> Self {
        Self::start_claim(sim, agent_args, more, true).await
    }

    /// As [`Container::start_on`]; with `activate` false the claim is never activated, as a
    /// DRA plugin's or the CLI's is (the agent knows no process of its container).
    async fn start_claim(
        sim: SimNode,
        agent_args: &[&str],
        more: &[(&str, &str)],
        activate: bool,
    ) -> Self {
        let bus = Bus::start();
        let mut args = if agent_args.contains(&"--enforce-interval") {
            vec![]
        } else {
            vec!["--enforce-interval", "100ms"]
        };
        args.extend_from_slice(agent_args);
        let agent = Agent::start(&agent_exe(), &bus, &sim, &args);
        let wall = sim.wall_client();
        let id = "tenant";
        let p = proxy(&bus.address).await;
        let mut request = vec![("gpuslice.io/memory", "2Gi")];
        request.extend_from_slice(more);
        p.claim(id, ann(&request)).await.unwrap();
        let cgroup = Cgroup::new("share");
        let init = Command::new("sleep").arg("600").spawn().unwrap();
        cgroup.adopt(init.id());
        if activate {
            p.activate(id, init.id()).await.unwrap();
        }
        Self {
            sim,
            _bus: bus,
            agent,
            cgroup,
            init,
            wall,
            id,
        }
    }

    fn dir(&self) -> PathBuf {
        self.agent.run_dir.join(self.id)
    }

    /// Runs the wall client in the container: `path` with `bytes`, with the interception
    /// library in front of the driver (`fronted`) or the plain driver. The client finds the
    /// driver's functions as the CUDA 12 runtime does, by `cuGetProcAddress`, except where
    /// it makes extra contexts (`WALL_CONTEXTS`): it calls `cuCtxCreate_v2` as linked then.
    /// Returns the running process and the line it printed.
    fn run(&self, path: &str, bytes: u64, fronted: bool, env: &[(&str, &str)]) -> (Child, String) {
        let mode = if env.iter().any(|(k, _)| *k == "WALL_CONTEXTS") {
            "link"
        } else {
            "procaddr"
        };
        let libs = if fronted {
            self.sim.fronted_lib_dir()
        } else {
            self.sim.lib_dir()
        };
        let script = format!(
            "echo $$ > {} && exec {} {mode} {path} {bytes}",
            self.cgroup.procs_file().display(),
            self.wall.display()
        );
        let mut child = Command::new("/bin/sh")
            .args(["-c", &script])
            .env("LD_LIBRARY_PATH", libs)
            .env("GPUSLICE_LIMITS", self.dir().join("limits"))
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        (child, line)
    }

    /// What NVML says process `pid` holds on the GPU.
    fn held_by(&self, pid: u32) -> u64 {
        let nvml = nvml_wrapper::Nvml::builder()
            .lib_path(self.sim.lib_dir().join("libnvidia-ml.so.1").as_os_str())
            .init()
            .unwrap();
        let device = nvml.device_by_index(0).unwrap();
        device
            .running_compute_processes()
            .unwrap()
            .into_iter()
            .find(|p| p.pid == pid)
            .map_or(0, |p| match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => b,
                UsedGpuMemory::Unavailable => 0,
            })
    }

    /// How many times the agent has published the driver's share for the container.
    fn samples(&self) -> u64 {
        let bytes = std::fs::read(self.dir().join(gpuslice_core::held::FILE_NAME)).unwrap();
        let at = gpuslice_core::held::HEADER_SAMPLES;
        u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
    }

    /// Waits until the agent has sampled the driver twice more.
    fn wait_for_samples(&self) {
        let from = self.samples();
        assert!(
            wait_for(Duration::from_secs(5), || self.samples() >= from + 2),
            "the agent publishes no driver share:\n{}",
            self.agent.log()
        );
    }

    fn context_bytes(&self) -> u64 {
        self.sim.spec.gpus[0].context_bytes
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = self.init.kill();
        let _ = self.init.wait();
    }
}

fn finish(mut child: Child) {
    drop(child.stdin.take());
    let _ = child.wait();
}

/// A process that filled its slice: the host sees it within the slice, and holding at least
/// the slice less one context and one allocation.
fn assert_filled(c: &Container, pid: u32, line: &str) {
    let held = c.held_by(pid);
    assert!(
        held <= SLICE,
        "the host sees {} MiB held in a {} MiB slice: {line}",
        held / MIB,
        SLICE / MIB
    );
    assert!(
        held + c.context_bytes() + CHUNK >= SLICE,
        "the host sees only {} MiB held in a {} MiB slice: {line}",
        held / MIB,
        SLICE / MIB
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_agent_measures_what_a_context_costs_and_charges_it_to_each_process() {
    let c = Container::start(&[]).await;
    let ctx = c.context_bytes();
    assert_eq!(ctx, 294 * MIB, "the simulated T4's context");
    let limits = std::fs::read_to_string(c.dir().join("limits")).unwrap();
    assert!(
        limits.contains(&format!("gpu.0.context_bytes={ctx}\n")),
        "{limits}\n{}",
        c.agent.log()
    );
    assert!(
        c.agent
            .log()
            .contains("measured what one CUDA context costs"),
        "{}",
        c.agent.log()
    );
    // A process that only has its context: the host sees it hold the context, and the
    // process sees the rest of its slice free.
    let (idle, line) = c.run("idle", 0, true, &[]);
    assert_eq!(c.held_by(idle.id()), ctx, "{line}");
    assert_eq!(field::<u64>(&line, "start_free"), SLICE - ctx, "{line}");
    finish(idle);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_process_filling_its_slice_ends_within_it_as_the_host_sees_it() {
    let c = Container::start(&[]).await;
    let (filler, line) = c.run("fill", CHUNK, true, &[]);
    assert!(line.contains("fit=CUDA_ERROR_OUT_OF_MEMORY"), "{line}");
    assert_filled(&c, filler.id(), &line);
    // The operator's figure is exported: what the driver shows the container holding.
    let held = c.held_by(filler.id());
    let want = format!(
        "gpuslice_slice_driver_memory_used_bytes{{container=\"tenant\",gpu=\"0\",uuid=\"{}\"}} {held}",
        c.sim.spec.gpus[0].uuid
    );
    let exported = wait_for(Duration::from_secs(5), || {
        http::get(&c.agent.metrics_address, "/metrics")
            .is_ok_and(|(_, _, body)| body.contains(&want))
    });
    assert!(exported, "{want} not exported");
    finish(filler);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_process_that_makes_extra_contexts_first_still_ends_within_its_slice() {
    let c = Container::start(&[]).await;
    let (filler, line) = c.run("fill", CHUNK, true, &[("WALL_CONTEXTS", "3")]);
    assert!(line.contains("contexts=3 "), "{line}");
    assert!(line.contains("fit=CUDA_ERROR_OUT_OF_MEMORY"), "{line}");
    assert_filled(&c, filler.id(), &line);
    finish(filler);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_asking_for_a_stack_larger_than_its_slice_is_refused_and_stays_within_it() {
    let c = Container::start(&[]).await;
    // 64 KiB for each of the T4's 40 × 1024 resident threads: 2.5 GiB.
    let (filler, line) = c.run("fill", CHUNK, true, &[("WALL_STACK", "65536")]);
    assert!(line.contains("stack=CUDA_ERROR_OUT_OF_MEMORY"), "{line}");
    assert!(line.contains("fit=CUDA_ERROR_OUT_OF_MEMORY"), "{line}");
    assert_filled(&c, filler.id(), &line);
    finish(filler);
    // 4 KiB a thread (160 MiB) fits, and is part of what fills the slice.
    let (filler, line) = c.run("fill", CHUNK, true, &[("WALL_STACK", "4096")]);
    assert!(line.contains("stack=CUDA_SUCCESS"), "{line}");
    assert_filled(&c, filler.id(), &line);
    finish(filler);
}

#[tokio::test(flavor = "multi_thread")]
async fn what_the_driver_took_unseen_since_the_last_sample_is_charged_before_the_last_bytes() {
    // The agent samples on its own only every minute and is told a context costs 96 MiB less
    // than it does: the sample that charges what the process's two contexts really took is
    // the one the library asks for when the container comes near its limit.
    let unseen = 96 * MIB;
    let sim = SimNode::new(1, "T4", None);
    let told = format!("{}Mi", (sim.spec.gpus[0].context_bytes - unseen) / MIB);
    let args = ["--enforce-interval", "60s", "--context-reservation", &told];
    let c = Container::start_on(sim, &args, &[]).await;
    let (filler, line) = c.run("fill", CHUNK, true, &[("WALL_CONTEXTS", "1")]);
    assert!(line.contains("contexts=1 "), "{line}");
    assert_eq!(
        field::<u64>(&line, "start_free"),
        SLICE - 2 * (c.context_bytes() - unseen),
        "{line}"
    );
    assert!(line.contains("fit=CUDA_ERROR_OUT_OF_MEMORY"), "{line}");
    assert_filled(&c, filler.id(), &line);
    // Without the request it would have ended 192 MiB over.
    assert!(c.held_by(filler.id()) >= 2 * c.context_bytes(), "{line}");
    finish(filler);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_module_whose_globals_do_not_fit_the_slice_is_refused_before_the_driver_loads_it() {
    let c = Container::start(&[]).await;
    // A tenant's module declaring a global as large as the slice (2 GiB on a 16 GiB card).
    let (filler, line) = c.run(
        "fill",
        CHUNK,
        true,
        &[("WALL_MODULE_BYTES", &SLICE.to_string())],
    );
    assert!(line.contains("module=CUDA_ERROR_OUT_OF_MEMORY "), "{line}");
    assert_filled(&c, filler.id(), &line);
    finish(filler);
    // One that fits is charged from the start.
    let module = 192 * MIB;
    let (filler, line) = c.run(
        "fill",
        CHUNK,
        true,
        &[("WALL_MODULE_BYTES", &module.to_string())],
    );
    assert!(line.contains("module=CUDA_SUCCESS "), "{line}");
    assert_eq!(
        field::<u64>(&line, "start_free"),
        SLICE - c.context_bytes() - module,
        "{line}"
    );
    assert_filled(&c, filler.id(), &line);
    finish(filler);
}

#[tokio::test(flavor = "multi_thread")]
async fn contexts_charged_nothing_up_front_are_charged_from_the_drivers_figure() {
    // The charge per context given as 0: only the agent's sampling of the driver charges the
    // four contexts, and the process still stops within its slice once it has.
    let c = Container::start(&["--context-reservation", "0"]).await;
    let (filler, line) = c.run(
        "fill",
        CHUNK,
        true,
        &[("WALL_CONTEXTS", "3"), ("WALL_SETTLE_MS", "1000")],
    );
    assert!(line.contains("contexts=3 "), "{line}");
    assert_eq!(
        field::<u64>(&line, "start_free"),
        SLICE - 4 * c.context_bytes(),
        "the process sees its contexts charged: {line}"
    );
    assert_filled(&c, filler.id(), &line);
    finish(filler);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_never_activated_is_charged_the_drivers_figure_for_the_processes_using_it() {
    // A DRA plugin's claim: no activation, so no container cgroup; the processes that map the
    // claim's usage region are its processes.
    let c = Container::start_claim(
        SimNode::new(1, "T4", None),
        &["--context-reservation", "0"],
        &[],
        false,
    )
    .await;
    let (filler, line) = c.run(
        "fill",
        CHUNK,
        true,
        &[("WALL_CONTEXTS", "3"), ("WALL_SETTLE_MS", "1000")],
    );
    assert_eq!(
        field::<u64>(&line, "start_free"),
        SLICE - 4 * c.context_bytes(),
        "the process sees its contexts charged: {line}\n{}",
        c.agent.log()
    );
    assert_filled(&c, filler.id(), &line);
    finish(filler);
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_held_behind_the_librarys_back_is_charged_to_the_rest_of_the_container() {
    let c = Container::start(&[]).await;
    // The plain driver, no interception library: the library never sees these 512 MiB.
    let (around, line) = c.run("hold", 512 * MIB, false, &[]);
    assert!(line.contains("fit=CUDA_SUCCESS"), "{line}");
    let behind = c.held_by(around.id());
    assert_eq!(behind, 512 * MIB + c.context_bytes());
    c.wait_for_samples();
    let (filler, line) = c.run("fill", CHUNK, true, &[]);
    assert!(line.contains("fit=CUDA_ERROR_OUT_OF_MEMORY"), "{line}");
    let held = c.held_by(filler.id()) + behind;
    assert!(
        held <= SLICE && held + c.context_bytes() + CHUNK >= SLICE,
        "the container holds {} MiB of its {} MiB as the host sees it: {line}",
        held / MIB,
        SLICE / MIB
    );
    // And the agent says so.
    assert!(
        wait_for(Duration::from_secs(5), || c
            .agent
            .log()
            .contains("that no slot of its usage region accounts for")),
        "{}",
        c.agent.log()
    );
    finish(filler);
    finish(around);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_process_in_a_pid_namespace_of_its_own_is_paced_by_the_pid_nvml_gives_it() {
    // NVML names processes by their host pids wherever it is asked (the driver knows nothing
    // of PID namespaces); a process that is pid 1 in a namespace of its own finds itself in
    // NVML's samples by the host pid the agent published for its slot.
    let sim = SimNode::with_kernel_time(1, "T4", None, 1_000);
    let c = Container::start_on(sim, &[], &[("gpuslice.io/cores", "30")]).await;
    let spin = c.sim.test_program("spin");
    let script = format!(
        "echo $$ > {} && exec unshare --pid --fork --mount-proc sh -c 'echo nspid=$$; exec {} 1000 4000'",
        c.cgroup.procs_file().display(),
        spin.display()
    );
    let text = script_output(
        &script,
        &c.sim.fronted_lib_dir(),
        &c.dir().join("limits"),
        &[("SPIN_WARMUP_MS", "2000")],
    );
    assert!(text.contains("nspid=1\n"), "{text}");
    let field = |k: &str| -> f64 { field(&text, k) };
    // 1,000-block kernels of 1 µs a block; measured after 2 s (the agent samples every
    // 100 ms here, the driver every sixth of a second).
    let busy = field("warm_blocks") * 1_000.0 * 100.0 / field("warm_elapsed_ns");
    assert!(
        (25.0..=35.0).contains(&busy),
        "a 30% share kept the GPU {busy:.1}% busy: {text}\n{}",
        c.agent.log()
    );
}
