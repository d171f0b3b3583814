//! The SM share on the simulated node, whose kernels take simulated time (`kernel_ns_per_block`)
//! on one timeline per GPU shared by all processes, and whose NVML reports SM utilization as
//! the real driver does: once per sampling period (a sixth of a second), once it has ended,
//! one sample naming one busy process with the whole GPU's figure. Over 5 s after a 1 s
//! warm-up, a slice with 10, 30, 50 or 70% of the SMs keeps the GPU within 5 points of its
//! share, alone or split over two processes, paced from NVML's samples or in the window of
//! each cycle the agent gives it; in windows, two slices busy at once each keep theirs, and
//! from samples neither starves; without a share, or without the library, the same program
//! keeps it fully busy.

mod common;

use std::path::PathBuf;
use std::process::Command;

use gpuslice_core::limits::{GpuLimit, Limits, SmWindow};
use gpuslice_testsupport::sim::SimNode;

/// Simulated GPU time per thread block; a kernel of 1,000 blocks takes 1 ms.
const NS_PER_BLOCK: u64 = 1_000;
/// Simulated GPU time of a memset per KiB it sets: a block's per 256 bytes, so that `spin`'s
/// memsets of BLOCKS × 256 bytes take as long as its kernels of BLOCKS blocks.
const MEMSET_NS_PER_KIB: u64 = NS_PER_BLOCK * 4;
/// Thread blocks of each kernel the programs launch, unless a test says otherwise.
const BLOCKS: u32 = 1_000;
/// Every run: a warm-up (the first utilization samples arrive after a sixth and a third of a
/// second), then the part measured; 5 s for the share levels, 2 s for the rest.
const WARMUP_MS: u64 = 1_000;
const MEASURED_MS: u64 = 5_000;
const RUN_MS: u64 = WARMUP_MS + 2_000;

struct Setup {
    sim: std::sync::Arc<SimNode>,
    dir: tempfile::TempDir,
    spin: PathBuf,
    /// Threads the program launches from, each on a stream of its own.
    threads: u32,
    /// Thread blocks of each kernel it launches.
    blocks: u32,
    /// Launches after which it waits for its work (0: never).
    batch: u32,
}

fn setup(cores: u32) -> Setup {
    let sim = SimNode::with_kernel_time(1, "T4", None, NS_PER_BLOCK);
    setup_on(std::sync::Arc::new(sim), cores)
}

/// A slice with `cores` of GPU 0 of `sim`, a container of its own, paced from NVML's samples
/// (no window of the cycle: a share the agent had no window left for).
fn setup_on(sim: std::sync::Arc<SimNode>, cores: u32) -> Setup {
    setup_in(sim, cores, None)
}

/// A slice with `cores` of GPU 0 of `sim` in the window `start..start + cores` percent of each
/// cycle, as the agent gives one.
fn setup_windowed(sim: std::sync::Arc<SimNode>, cores: u32, start: u32) -> Setup {
    setup_in(sim, cores, Some(SmWindow { start, len: cores }))
}

fn setup_in(sim: std::sync::Arc<SimNode>, cores: u32, window: Option<SmWindow>) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits {
        container_id: "pacing-test".into(),
        gpus: vec![GpuLimit {
            uuid: sim.spec.gpus[0].uuid.clone(),
            memory_bytes: 1 << 30,
            cores,
            context_bytes: 0,
            window,
        }],
    };
    common::write_slice(dir.path(), &limits);
    let spin = common::compile(&sim, "spin");
    Setup {
        sim,
        dir,
        spin,
        threads: 1,
        blocks: BLOCKS,
        batch: 0,
    }
}

impl Setup {
    fn command(&self, intercepted: bool) -> Command {
        self.command_via(intercepted, "kernel")
    }

    /// The program launching through `how`: `kernel`, `ex` or `coop`.
    /// With `intercepted`, the driver is loaded as in a container (through its front);
    /// without, the simulated driver is loaded directly.
    fn command_via(&self, intercepted: bool, how: &str) -> Command {
        self.command_for(intercepted, how, RUN_MS)
    }

    /// As [`Setup::command_via`], running for `run_ms`.
    fn command_for(&self, intercepted: bool, how: &str, run_ms: u64) -> Command {
        let libs = if intercepted {
            self.sim.fronted_lib_dir()
        } else {
            self.sim.lib_dir()
        };
        let mut c = Command::new(&self.spin);
        c.args([&self.blocks.to_string(), &run_ms.to_string(), how])
            .env("SPIN_WARMUP_MS", WARMUP_MS.to_string())
            .env("SPIN_THREADS", self.threads.to_string())
            .env("SPIN_BATCH", self.batch.to_string())
            .env("LD_LIBRARY_PATH", libs)
            .env("GPUSLICE_LIMITS", self.dir.path().join("limits"));
        c
    }
}

/// Percent of the measured part of the run (after the warm-up) the GPU spent on the
/// program's kernels.
fn busy_percent(out: &std::process::Output) -> f64 {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    warm_busy_percent(&text)
}

/// Percent of the measured part of the run (after the warm-up) the GPU spent on the
/// program's kernels.
fn warm_busy_percent(text: &str) -> f64 {
    let field = |k: &str| -> f64 {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(k)?.parse().ok())
            .unwrap_or_else(|| panic!("no {k} in {text:?}"))
    };
    field("warm_blocks=") * NS_PER_BLOCK as f64 * 100.0 / field("warm_elapsed_ns=")
}

/// Runs each setup's program at once (launching together) for `run_ms` (the warm-up and the
/// measured part), and returns what each kept the GPU busy over the measured part.
fn measured_together(setups: &[&Setup], run_ms: u64) -> Vec<f64> {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut children: Vec<_> = setups
        .iter()
        .map(|s| {
            s.command_for(true, "kernel", run_ms)
                .arg("wait")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut outputs = Vec::new();
    for c in &mut children {
        let mut out = BufReader::new(c.stdout.take().unwrap());
        let mut ready = String::new();
        out.read_line(&mut ready).unwrap();
        assert_eq!(ready, "ready\n");
        outputs.push(out);
    }
    for c in &mut children {
        c.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    }
    children
        .into_iter()
        .zip(outputs)
        .map(|(c, mut out)| {
            let mut text = String::new();
            out.read_to_string(&mut text).unwrap();
            let status = c.wait_with_output().unwrap().status;
            assert!(status.success(), "{text}");
            warm_busy_percent(&text)
        })
        .collect()
}

/// The share levels measured alone, each slice on a GPU of its own.
const LEVELS: [u32; 4] = [10, 30, 50, 70];

/// Runs `setups` (one per level of [`LEVELS`]) at once and checks that each kept its GPU
/// within 5 points of its share over the measured part.
fn assert_each_level_kept(setups: &[Setup], how: &str) {
    let busy = measured_together(&setups.iter().collect::<Vec<_>>(), WARMUP_MS + MEASURED_MS);
    eprintln!("shares {LEVELS:?}, {how}: busy {busy:.1?}");
    for (share, b) in LEVELS.iter().zip(&busy) {
        assert!(
            (b - f64::from(*share)).abs() <= 5.0,
            "a {share}% share, {how}, kept the GPU {b:.1}% busy (all: {busy:.1?})"
        );
    }
}

/// The window a control slice gets: all of the cycle but 1%, so that it is held to windows
/// like the others (100 is not a share).
const CONTROL_WINDOW: u32 = 99;

/// A slice in a window of [`CONTROL_WINDOW`]% of each cycle, on a GPU of its own.
fn control() -> Setup {
    let sim = SimNode::with_kernel_time(1, "T4", None, NS_PER_BLOCK);
    setup_windowed(std::sync::Arc::new(sim), CONTROL_WINDOW, 0)
}

/// How much of its windows a program held to windows could use, from the control's busy
/// figure: a window is open time, and a program the machine does not run (a loaded CI
/// machine stalls its processes for milliseconds at a time) leaves the GPU idle in it; a
/// window does not make up for that, and pacing is not what is measured then.
fn usable(control_busy: f64) -> f64 {
    let usable = control_busy / f64::from(CONTROL_WINDOW);
    assert!(
        usable >= 0.5,
        "a program in a {CONTROL_WINDOW}% window kept its GPU only {control_busy:.1}% busy: \
         this machine is too loaded to measure windows on"
    );
    usable.min(1.0)
}

/// Checks that a slice whose window is `share`% of the cycle kept its GPU `busy`% busy: never
/// more than 5 points above its share, and no less than 5 points below its share of what a
/// program in windows could use beside it ([`usable`]).
fn assert_window_kept(share: f64, busy: f64, usable: f64, what: &str) {
    assert!(
        busy <= share + 5.0 && busy >= share * usable - 5.0,
        "a {share}% window, {what}, kept the GPU {busy:.1}% busy ({:.1}% of its windows \
         usable beside it)",
        usable * 100.0
    );
}

#[test]
fn each_share_is_kept_within_five_points_after_a_second() {
    let setups: Vec<Setup> = LEVELS.iter().map(|&c| setup(c)).collect();
    assert_each_level_kept(&setups, "paced from NVML's samples");
}

/// A 30% and a 70% slice on one GPU, run at once: what each kept the GPU busy over the
/// measured part.
fn thirty_beside_seventy() -> Vec<f64> {
    let small = setup(30);
    let large = setup_on(std::sync::Arc::clone(&small.sim), 70);
    let busy = measured_together(&[&small, &large], WARMUP_MS + MEASURED_MS);
    eprintln!("30% and 70% at once: busy {busy:.1?}");
    busy
}

#[test]
fn each_share_in_its_window_is_kept_within_five_points() {
    let mut setups: Vec<Setup> = LEVELS
        .iter()
        .map(|&c| {
            let sim = SimNode::with_kernel_time(1, "T4", None, NS_PER_BLOCK);
            setup_windowed(std::sync::Arc::new(sim), c, 0)
        })
        .collect();
    setups.push(control());
    let busy = measured_together(&setups.iter().collect::<Vec<_>>(), WARMUP_MS + MEASURED_MS);
    eprintln!("shares {LEVELS:?} and {CONTROL_WINDOW}, in windows: busy {busy:.1?}");
    let usable = usable(busy[LEVELS.len()]);
    for (share, b) in LEVELS.iter().zip(&busy) {
        assert_window_kept(f64::from(*share), *b, usable, "alone");
    }
}

#[test]
fn many_threads_launching_at_once_on_streams_of_their_own_are_held_to_the_share() {
    // A tenant queueing more than its share: 32 threads, each on a stream of its own, launch
    // at the same moment (a window's opening, a refill), each past the check of how much the
    // process has queued before any of them is counted there.
    let swarm = |window: bool| {
        let sim = std::sync::Arc::new(SimNode::with_kernel_time(1, "T4", None, NS_PER_BLOCK));
        let mut s = if window {
            setup_windowed(sim, 30, 0)
        } else {
            setup_on(sim, 30)
        };
        s.threads = 32;
        s
    };
    let (windowed, sampled, control) = (swarm(true), swarm(false), control());
    let busy = measured_together(&[&windowed, &sampled, &control], WARMUP_MS + MEASURED_MS);
    eprintln!(
        "30% from 32 threads, in a window and from samples, and a {CONTROL_WINDOW}% window: \
         busy {busy:.1?}"
    );
    assert_window_kept(30.0, busy[0], usable(busy[2]), "launched from 32 threads");
    assert!(
        (busy[1] - 30.0).abs() <= 5.0,
        "a 30% share paced from samples, launched from 32 threads, kept the GPU {:.1}% busy",
        busy[1]
    );
}

#[test]
fn eight_processes_of_one_container_launching_at_once_are_held_to_its_window_together() {
    // Each process may queue only what is left of the container's few places, so eight do
    // not queue eight times as much at the window's opening; and each measures how far the
    // container's work, not only its own, ran past the window's end.
    let sim = std::sync::Arc::new(SimNode::with_kernel_time(1, "T4", None, NS_PER_BLOCK));
    let windowed = setup_windowed(sim, 30, 0);
    let control = control();
    let mut setups = vec![&windowed; 8];
    setups.push(&control);
    let busy = measured_together(&setups, WARMUP_MS + MEASURED_MS);
    let together: f64 = busy[..8].iter().sum();
    eprintln!(
        "8 processes in a 30% window: {together:.1}% busy ({:.1?}); a {CONTROL_WINDOW}% \
         window: {:.1}",
        &busy[..8],
        busy[8]
    );
    assert_window_kept(30.0, together, usable(busy[8]), "eight processes together");
}

#[test]
fn kernels_so_long_that_a_few_outlast_the_window_are_held_to_it() {
    // Eight kernels of 5 ms launched at a 10 ms window's opening run 40 ms, and eight of
    // 10 ms in a 30 ms window 80: no margin before the window's end can take that back, so
    // fewer may be left unfinished.
    let windowed = |cores: u32, blocks: u32| {
        let sim = std::sync::Arc::new(SimNode::with_kernel_time(1, "T4", None, NS_PER_BLOCK));
        let mut s = setup_windowed(sim, cores, 0);
        s.blocks = blocks;
        s
    };
    let (ten, thirty, control) = (windowed(10, 5_000), windowed(30, 10_000), control());
    let busy = measured_together(&[&ten, &thirty, &control], WARMUP_MS + MEASURED_MS);
    eprintln!(
        "5 ms kernels in a 10% window, 10 ms kernels in a 30% window, and a {CONTROL_WINDOW}% \
         window: busy {busy:.1?}"
    );
    let usable = usable(busy[2]);
    assert_window_kept(10.0, busy[0], usable, "with kernels of 5 ms");
    assert_window_kept(30.0, busy[1], usable, "with kernels of 10 ms");
}

#[test]
fn kernels_longer_than_the_window_are_held_to_it_on_average() {
    // As PyTorch's rate loop on this node: 16,384-block elementwise kernels (16 ms), a
    // synchronize after every four, in a 10 ms window. Each kernel runs past the window's end
    // whatever is done; later windows open late (or are skipped) to pay it back.
    let sim = std::sync::Arc::new(SimNode::with_kernel_time(1, "T4", None, NS_PER_BLOCK));
    let mut ten = setup_windowed(sim, 10, 0);
    (ten.blocks, ten.batch) = (16_384, 4);
    let control = control();
    let busy = measured_together(&[&ten, &control], WARMUP_MS + MEASURED_MS);
    eprintln!(
        "steps of four 16 ms kernels in a 10% window, and a {CONTROL_WINDOW}% window: busy \
         {busy:.1?}"
    );
    assert_window_kept(10.0, busy[0], usable(busy[1]), "with kernels of 16 ms");
}

#[test]
fn kernels_longer_than_the_cycle_are_held_to_the_share_on_average() {
    // One kernel at a time, each running through one or two more cycles (150 to 250 ms of a
    // 100 ms cycle): the slice's own windows it ran through are its own, the rest of its run
    // past its window is owed, and later windows are skipped to pay it back. The same from
    // eight threads, each waiting for its own kernel: a launch let through in one window
    // that waited for its place into a later one must not leave the first unmeasured (a 50%
    // window read 59.1 and 62.7% when it did). And from a program that never waits: the
    // window's work is measured to its end, past the next window's opening (a 10% window
    // read 18.2% when it was measured only that far).
    let shapes = [
        (10, 200u32, 1u32, 1u32),
        (30, 150, 1, 1),
        (50, 200, 1, 1),
        (70, 250, 1, 1),
        (50, 200, 8, 1),
        (10, 200, 1, 0),
    ];
    let mut setups: Vec<Setup> = shapes
        .iter()
        .map(|&(cores, ms, threads, batch)| {
            let sim = SimNode::with_kernel_time(1, "T4", None, NS_PER_BLOCK);
            let mut s = setup_windowed(std::sync::Arc::new(sim), cores, 0);
            (s.blocks, s.batch, s.threads) = (ms * 1_000, batch, threads);
            s
        })
        .collect();
    setups.push(control());
    // Measured over twice the usual time: the measured part ends where the last kernel does,
    // so it leaves out the gap that would follow it, and one kernel of 250 ms is 6 points of
    // 4 s (a 70% window measured at 76.3% once, one kernel more than its share), 3 of 8 s.
    let busy = measured_together(
        &setups.iter().collect::<Vec<_>>(),
        WARMUP_MS + 2 * MEASURED_MS,
    );
    eprintln!(
        "(share, kernel ms, threads, batch) {shapes:?} and a {CONTROL_WINDOW}% window: busy \
         {busy:.1?}"
    );
    let usable = usable(busy[shapes.len()]);
    for (&(share, ms, threads, batch), b) in shapes.iter().zip(&busy) {
        let what =
            format!("with kernels of {ms} ms from {threads} threads waited for every {batch}");
        assert_window_kept(f64::from(share), *b, usable, &what);
    }
}

#[test]
fn steps_that_do_not_divide_the_window_are_held_to_it_on_average() {
    // Steps of four 16 ms kernels in a 50 ms window (the fourth cannot end in it), and
    // kernels of 45, 35 and 60 ms, each waited for, in windows of 30, 50 and 70 ms: a launch
    // goes only where the queued work is predicted to end in the window, or with what earlier
    // windows left unused; what runs past the end is paid back.
    let shapes = [
        (50, 16_384, 4),
        (30, 45_000, 1),
        (50, 35_000, 1),
        (70, 60_000, 1),
    ];
    let mut setups: Vec<Setup> = shapes
        .iter()
        .map(|&(cores, blocks, batch)| {
            let sim = std::sync::Arc::new(SimNode::with_kernel_time(1, "T4", None, NS_PER_BLOCK));
            let mut s = setup_windowed(sim, cores, 0);
            (s.blocks, s.batch) = (blocks, batch);
            s
        })
        .collect();
    setups.push(control());
    let busy = measured_together(&setups.iter().collect::<Vec<_>>(), WARMUP_MS + MEASURED_MS);
    eprintln!("(share, blocks, batch) {shapes:?} and a {CONTROL_WINDOW}% window: busy {busy:.1?}");
    let usable = usable(busy[shapes.len()]);
    for (&(cores, blocks, batch), b) in shapes.iter().zip(&busy) {
        let what = format!("{} ms kernels waited for every {batch}", blocks / 1_000);
        assert_window_kept(f64::from(cores), *b, usable, &what);
    }
}

#[test]
fn contexts_destroyed_while_their_paced_kernels_run_are_not_waited_on_by_the_library() {
    // The library waits on its events in a thread of its own; no context may go while the
    // driver waits on one of its events (the simulated driver stops a process that does).
    // Forty contexts, of their own and primary, each destroyed with 16 ms of kernels queued.
    let s = control();
    let churn = common::compile(&s.sim, "churn");
    let out = Command::new(&churn)
        .args(["40", "8", "2000"])
        .env("LD_LIBRARY_PATH", s.sim.fronted_lib_dir())
        .env("GPUSLICE_LIMITS", s.dir.path().join("limits"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("rounds=40"),
        "{:?}: {text} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn two_slices_on_one_gpu_each_keep_their_share() {
    // Two containers' slices, 30% and 70%, on the same GPU at once, in the windows the agent
    // gives them: 0–30% and 30–100% of each cycle.
    let sim = std::sync::Arc::new(SimNode::with_kernel_time(1, "T4", None, NS_PER_BLOCK));
    let small = setup_windowed(std::sync::Arc::clone(&sim), 30, 0);
    let large = setup_windowed(sim, 70, 30);
    let control = control();
    let busy = measured_together(&[&small, &large, &control], WARMUP_MS + MEASURED_MS);
    eprintln!("30% and 70% at once, in windows, and a {CONTROL_WINDOW}% window: busy {busy:.1?}");
    let usable = usable(busy[2]);
    for (share, b) in [30.0, 70.0].iter().zip(&busy) {
        assert_window_kept(*share, *b, usable, "beside another");
    }
}

#[test]
fn two_slices_on_one_gpu_share_it_without_either_starving() {
    // The 30% slice beside a 70% one once got 1% of the GPU on a real one: its samples were
    // judged against periods in which the driver named the other slice's process.
    let busy = thirty_beside_seventy();
    for (share, own) in [30.0, 70.0].iter().zip(&busy) {
        assert!(
            *own >= share / 4.0,
            "a {share}% share beside another kept the GPU only {own:.1}% busy (both: {busy:.1?})"
        );
    }
    // Each program measures from the end of its own warm-up (once what it queued has run),
    // so the two intervals differ by a few milliseconds: a point over all of the time.
    assert!(
        busy.iter().sum::<f64>() <= 101.0,
        "two slices kept the GPU busy more than all the time: {busy:.1?}"
    );
}

#[test]
fn two_programs_share_the_simulated_gpu_and_nvml_names_one_per_period_with_the_gpus_figure() {
    // Without the library: the GPU runs one kernel at a time whoever launched it, so two
    // programs each get about half; NVML's samples, as the real driver's, are one per period,
    // name one of them, and carry the whole GPU's figure.
    let a = setup(0);
    let b = setup_on(std::sync::Arc::clone(&a.sim), 0);
    let mut children: Vec<_> = [&a, &b]
        .iter()
        .map(|s| {
            s.command_for(false, "kernel", WARMUP_MS + 3_000)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let pids: Vec<u32> = children.iter().map(std::process::Child::id).collect();
    let nvml = nvml_wrapper::Nvml::builder()
        .lib_path(a.sim.lib_dir().join("libnvidia-ml.so.1").as_os_str())
        .init()
        .unwrap();
    let device = nvml.device_by_index(0).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(WARMUP_MS));
    let (mut samples, mut last) = (Vec::new(), 0);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(40));
        if let Ok(new) = device.process_utilization_stats(last) {
            last = new.iter().map(|s| s.timestamp).max().unwrap_or(last);
            samples.extend(new);
        }
    }
    let busy: Vec<f64> = children
        .iter_mut()
        .map(|c| {
            let mut text = String::new();
            std::io::Read::read_to_string(c.stdout.as_mut().unwrap(), &mut text).unwrap();
            assert!(c.wait().unwrap().success(), "{text}");
            warm_busy_percent(&text)
        })
        .collect();
    for (pid, own) in pids.iter().zip(&busy) {
        assert!(
            (35.0..=60.0).contains(own),
            "program {pid} kept the GPU {own:.1}% busy: {busy:.1?}"
        );
    }
    let period_us = a.sim.spec.gpus[0].utilization_period_us;
    assert!(
        samples.len() >= 8,
        "{} samples in 2 s: {samples:?}",
        samples.len()
    );
    for pair in samples.windows(2) {
        let gap = pair[1].timestamp - pair[0].timestamp;
        assert!(
            gap + 2 >= period_us,
            "two samples {gap} µs apart: {samples:?}"
        );
    }
    for s in &samples {
        assert!(
            pids.contains(&s.pid),
            "a sample names {}, not one of {pids:?}",
            s.pid
        );
        assert!(
            s.sm_util >= 90,
            "a sample of the busy GPU says {}%: {samples:?}",
            s.sm_util
        );
    }
}

#[test]
fn a_thirty_percent_share_keeps_the_gpu_about_thirty_percent_busy() {
    let s = setup(30);
    let paced = busy_percent(&s.command(true).output().unwrap());
    let free = busy_percent(&s.command(false).output().unwrap());
    eprintln!("paced: {paced:.1}% busy, without the library: {free:.1}%");
    assert!((25.0..=35.0).contains(&paced), "paced: {paced:.1}% busy");
    assert!(free > 90.0, "without the library: {free:.1}% busy");
}

#[test]
fn kernels_launched_on_another_gpus_stream_are_held_to_that_gpus_share() {
    // A slice of two GPUs: no share of GPU 0, 30% of GPU 1. A library's kernels launched on a
    // stream of GPU 1's context while GPU 0's is current run on GPU 1. Before the library
    // paced them by the current context's GPU (no share there), GPU 1 was kept fully busy.
    let sim = std::sync::Arc::new(SimNode::with_kernel_time(2, "T4", None, NS_PER_BLOCK));
    let s = setup_on(std::sync::Arc::clone(&sim), 30);
    let limits = Limits {
        container_id: "pacing-test".into(),
        gpus: [0, 30]
            .iter()
            .enumerate()
            .map(|(i, &cores)| GpuLimit {
                uuid: sim.spec.gpus[i].uuid.clone(),
                memory_bytes: 1 << 30,
                cores,
                context_bytes: 0,
                window: None,
            })
            .collect(),
    };
    common::write_slice(s.dir.path(), &limits);
    let on_gpu1 = |intercepted| {
        let mut c = s.command(intercepted);
        c.env("SPIN_OTHER_GPU", "1");
        busy_percent(&c.output().unwrap())
    };
    let paced = on_gpu1(true);
    let free = on_gpu1(false);
    assert!((25.0..=35.0).contains(&paced), "paced: {paced:.1}% busy");
    assert!(free > 90.0, "without the library: {free:.1}% busy");
}

#[test]
fn two_processes_share_one_thirty_percent_share() {
    let s = setup(30);
    // Both launch over the same interval, however long each takes to start (otherwise each
    // would rightly get the whole share while the other is not running yet).
    let each = measured_together(&[&s, &s], RUN_MS);
    let total: f64 = each.iter().sum();
    // Each process has its own queue on the simulated GPU, so unpaced they would add up to
    // about 200%.
    eprintln!("two processes together: {total:.1}% busy ({each:.1?})");
    assert!(
        (25.0..=35.0).contains(&total),
        "together: {total:.1}% busy ({each:.1?})"
    );
}

#[test]
fn a_slice_without_a_share_is_not_paced() {
    let s = setup(0);
    let busy = busy_percent(&s.command(true).output().unwrap());
    assert!(busy > 90.0, "{busy:.1}% busy");
}

/// Each launch call of `spin` named (its third argument), run in a 30% slice of its own:
/// each keeps the GPU within 5 points of 30% busy.
fn assert_each_paced_to_thirty_percent(calls: &[(&str, &str)]) {
    for &(how, call) in calls {
        let busy = busy_percent(&setup(30).command_via(true, how).output().unwrap());
        eprintln!("{call}: {busy:.1}% busy");
        assert!((25.0..=35.0).contains(&busy), "{call}: {busy:.1}% busy");
    }
}

#[test]
fn launches_through_the_deprecated_grid_and_multi_device_calls_are_paced_too() {
    // CUDA 2.0's cuLaunchGridAsync and a one-device cuLaunchCooperativeKernelMultiDevice,
    // still exported by the driver: a tenant launching through them is held to the share.
    assert_each_paced_to_thirty_percent(&[
        ("grid", "cuLaunchGridAsync"),
        (
            "multi",
            "cuLaunchCooperativeKernelMultiDevice of one device",
        ),
    ]);
    // A list of several devices is not paced per device: it is refused on a paced slice
    // (CUDA_ERROR_NOT_SUPPORTED), and runs where nothing intercepts it.
    let s = setup(30);
    let refused = s.command_via(true, "multi2").output().unwrap();
    let text = String::from_utf8_lossy(&refused.stdout);
    assert!(text.contains("error=launch 801"), "{text}");
    let bare = s.command_via(false, "multi2").output().unwrap();
    let text = String::from_utf8_lossy(&bare.stdout);
    assert!(bare.status.success() && text.contains("blocks="), "{text}");
}

#[test]
fn kernels_in_child_graphs_and_conditional_bodies_are_paced_and_graphs_whose_work_the_gpu_decides_are_refused()
 {
    // A graph's kernels may stand in a child graph or in the body of a conditional node:
    // each launch of the graph takes their blocks from the share.
    assert_each_paced_to_thirty_percent(&[
        ("child", "cuGraphLaunch of a child graph's kernels"),
        ("if", "cuGraphLaunch of a conditional if node's kernels"),
    ]);
    // A `while` node runs its body as often as the graph's own kernels decide, a graph
    // instantiated for launches from the GPU runs as often as kernels launch it, and a
    // device-updatable kernel node runs the grid a kernel gives it: no launch from the host
    // can know. On a paced slice such a graph is not instantiated (CUDA_ERROR_NOT_SUPPORTED);
    // it runs where nothing intercepts it.
    let s = setup(30);
    for how in ["while", "device", "updatable"] {
        let refused = s.command_via(true, how).output().unwrap();
        let text = String::from_utf8_lossy(&refused.stdout);
        assert!(text.contains("error=graph 801"), "{how}: {text}");
        let bare = s.command_via(false, how).output().unwrap();
        let text = String::from_utf8_lossy(&bare.stdout);
        assert!(
            bare.status.success() && text.contains("blocks="),
            "{how}: {text}"
        );
    }
}

#[test]
fn launches_through_cu_launch_kernel_ex_and_cooperative_launches_are_paced_too() {
    assert_each_paced_to_thirty_percent(&[
        ("ex", "cuLaunchKernelEx"),
        ("coop", "cuLaunchCooperativeKernel"),
    ]);
}

#[test]
fn a_tenant_that_only_sets_memory_is_held_to_its_share_from_samples_and_in_a_window() {
    // The driver sets memory with kernels of its own, on the SMs the share divides: memsets
    // pass the same gate as launches, through the asynchronous and the synchronous calls, and
    // a graph's memset nodes (captured or made) are paced with its launches.
    let node = || {
        std::sync::Arc::new(SimNode::with_kernel_and_memset_time(
            1,
            "T4",
            NS_PER_BLOCK,
            MEMSET_NS_PER_KIB,
        ))
    };
    let bare = busy_percent(
        &setup_on(node(), 30)
            .command_via(false, "memset")
            .output()
            .unwrap(),
    );
    eprintln!("cuMemsetD32Async without the library: {bare:.1}% busy");
    assert!(
        bare > 90.0,
        "cuMemsetD32Async without the library: {bare:.1}% busy"
    );
    for (how, call, window) in [
        ("memset", "cuMemsetD32Async", true),
        ("memset2d", "cuMemsetD2D8_v2", false),
        ("graph-memset", "cuGraphLaunch of a captured memset", true),
        ("memset-node", "cuGraphLaunch of a memset node", false),
    ] {
        let paced = busy_percent(
            &setup_on(node(), 30)
                .command_via(true, how)
                .output()
                .unwrap(),
        );
        eprintln!("{call}: {paced:.1}% busy in a 30% slice");
        assert!(
            (25.0..=35.0).contains(&paced),
            "{call}, 30%: {paced:.1}% busy"
        );
        if window {
            let windowed = setup_windowed(node(), 10, 0);
            let busy = busy_percent(&windowed.command_via(true, how).output().unwrap());
            eprintln!("{call}: {busy:.1}% busy in a 10% window");
            assert!(
                (5.0..=15.0).contains(&busy),
                "{call}, 10% window: {busy:.1}% busy"
            );
        }
    }
}

#[test]
fn graph_launches_in_a_window_are_paced_and_the_capture_before_them_is_left_alone() {
    // Launches captured into a graph run nothing: a window does not hold them, and the
    // wait at a window's end (a synchronization, which would invalidate a capture in the
    // global mode, as the driver does) does not reach them.
    let sim = std::sync::Arc::new(SimNode::with_kernel_time(1, "T4", None, NS_PER_BLOCK));
    let windowed = setup_windowed(sim, 10, 0);
    for _ in 0..3 {
        let busy = busy_percent(&windowed.command_via(true, "graph").output().unwrap());
        eprintln!("cuGraphLaunch in a 10% window: {busy:.1}% busy");
        assert!((5.0..=15.0).contains(&busy), "{busy:.1}% busy");
    }
}

#[test]
fn graph_launches_are_paced_like_the_kernels_they_hold() {
    let (paced, bare) = (setup(30), setup(30));
    let paced = busy_percent(&paced.command_via(true, "graph").output().unwrap());
    let bare = busy_percent(&bare.command_via(false, "graph").output().unwrap());
    eprintln!("cuGraphLaunch: {paced:.1}% busy in a 30% slice, {bare:.1}% without the library");
    assert!(bare > 90.0, "without the library: {bare:.1}% busy");
    assert!(
        (25.0..=35.0).contains(&paced),
        "cuGraphLaunch: {paced:.1}% busy"
    );
}

#[test]
fn a_capture_in_another_thread_outlives_the_windows_measurements() {
    // The library measures each window's work from a launching thread; a synchronization of
    // the context there (the driver refuses it and invalidates every capture open in the
    // global mode, as PyTorch's graphs are captured by default) would break a capture that
    // another thread of the program holds open meanwhile.
    let sim = std::sync::Arc::new(SimNode::with_kernel_time(1, "T4", None, NS_PER_BLOCK));
    let windowed = setup_windowed(sim, 30, 0);
    let out = windowed
        .command(true)
        .env("SPIN_CAPTURE_BESIDE", "1")
        .output()
        .unwrap();
    let busy = busy_percent(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |k: &str| -> i64 {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(k)?.parse().ok())
            .unwrap_or_else(|| panic!("no {k} in {text:?}"))
    };
    eprintln!("a 30% window beside captures: {busy:.1}% busy; {text}");
    assert!(field("captures=") >= 5, "{text}");
    assert_eq!(field("invalidated="), 0, "{text}");
    assert!((25.0..=35.0).contains(&busy), "{busy:.1}% busy");
}

#[test]
fn pytorch_captures_graphs_in_one_thread_while_another_launches_in_a_window() {
    // As the test above, with PyTorch (`tests/clients/capture_beside.py`): ten graphs captured
    // in the global mode and each held open 50 ms, while a second thread launches matrix
    // products in a 30% window. Each window's measurement and each look at the library's
    // events runs on that thread; a synchronization there, or an event queried in the
    // global mode, would end the capture invalidated and PyTorch raise at its end.
    let sim = std::sync::Arc::new(SimNode::with_kernel_time(1, "T4", None, NS_PER_BLOCK));
    let windowed = setup_windowed(sim, 30, 0);
    let unmodelled = windowed.dir.path().join("unmodelled.log");
    let out = Command::new(common::torch_python())
        .arg(common::client_script("capture_beside.py"))
        .args(["10", "50"])
        .env("LD_LIBRARY_PATH", windowed.sim.fronted_lib_dir())
        .env("GPUSLICE_LIMITS", windowed.dir.path().join("limits"))
        .env("GPUSLICE_LOG", "1")
        .env("GPUSLICE_SIM_UNMODELLED_LOG", &unmodelled)
        .output()
        .unwrap();
    common::print_unmodelled("capture_beside", &unmodelled);
    let text = String::from_utf8_lossy(&out.stdout);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}{log}");
    let f = common::Facts::parse(&text);
    let windows = log.matches("SM window: the work ran").count();
    eprintln!("{text} windows measured: {windows}");
    assert_eq!(f.get("failed"), "0", "{text}");
    assert_eq!(f.get("captured"), "10", "{text}");
    assert!(f.num("launches") > 0, "{text}");
    // The captures took over half a second: the serving thread's windows were measured
    // meanwhile.
    assert!(windows >= 5, "{windows} windows measured");
}
