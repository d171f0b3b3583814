//! The SM share: on a GPU where the slice has a share of the SMs (`cores`, 1 to 99), kernel
//! launches are paced so that the container's processes together keep their SM utilization
//! of that GPU near the share.
//!
//! Each process keeps, per paced GPU, a bucket of thread blocks. A launch takes its grid's
//! blocks from the bucket, waiting while the bucket is empty (a kernel is delayed, never cut
//! or refused). A thread, started at the first paced launch, refills the buckets every tick
//! and, every window, reads the SM utilization of the container's processes on each paced
//! GPU from NVML (`nvmlDeviceGetProcessUtilization`, summed over the pids of the usage
//! region's slots). Utilization follows the blocks launched, so the refill becomes what this
//! process launched in the window scaled by share / utilization, the rate that would have
//! given the share (halfway there, to damp the measurement's noise). Every process of the
//! container does the same against the container's total, so together they settle on it.
//!
//! Until the first measurement the bucket does not hold launches back. Without NVML, or
//! without per-process utilization from it, launches are not paced (logged once).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Once, OnceLock};
use std::time::Duration;

use crate::api::real;
use crate::ffi::*;
use crate::log::log;
use crate::slice::Slice;

/// How often buckets are refilled.
const TICK: Duration = Duration::from_millis(10);
/// Ticks per utilization measurement.
const WINDOW_TICKS: u32 = 10;
/// Ticks before the first measurement (until then launches are not held back).
const FIRST_WINDOW_TICKS: u32 = 3;
/// A bucket holds at most this many ticks of refill (the burst a process may launch at once).
const BURST_TICKS: i64 = 2;
/// The refill before anything was measured: no pacing.
const UNMEASURED: i64 = i64::MAX / 4;
/// How long a launch waiting for blocks sleeps between looks at its bucket.
const WAIT_STEP: Duration = Duration::from_micros(500);

/// Whether `cores` (percent of the SMs) is a share to pace to: 0 reserves none and 100 is
/// the whole GPU, neither needs pacing.
#[must_use]
pub fn is_share(cores: u32) -> bool {
    (1..100).contains(&cores)
}

/// A paced GPU's bucket in this process.
struct Gate {
    share: u32,
    /// Blocks that may still be launched; below zero after a kernel larger than what was left.
    tokens: AtomicI64,
    /// Blocks added per tick.
    refill: AtomicI64,
    /// Blocks launched in the current window.
    launched: AtomicU64,
}

impl Gate {
    fn new(cores: u32) -> Self {
        Self {
            share: cores,
            tokens: AtomicI64::new(UNMEASURED),
            refill: AtomicI64::new(UNMEASURED),
            launched: AtomicU64::new(0),
        }
    }

    fn paced(&self) -> bool {
        is_share(self.share)
    }
}

static GATES: OnceLock<Vec<Gate>> = OnceLock::new();
static WATCHER: Once = Once::new();
static UNPACED: AtomicBool = AtomicBool::new(false);

fn gates(slice: &Slice) -> &'static [Gate] {
    GATES.get_or_init(|| slice.gpus.iter().map(|g| Gate::new(g.cores)).collect())
}

/// Waits, if the GPU of the calling thread's context is paced, until `blocks` thread blocks
/// may be launched there, and counts them.
pub fn pace(slice: &'static Slice, blocks: u64) {
    if !slice.paced || UNPACED.load(Relaxed) {
        return;
    }
    let Some(gpu) = slice.current_device().ok().and_then(|d| slice.position(d)) else {
        return;
    };
    let gate = &gates(slice)[gpu];
    if !gate.paced() {
        return;
    }
    WATCHER.call_once(|| start_watcher(slice));
    gate.launched.fetch_add(blocks, Relaxed);
    while gate.tokens.load(Relaxed) <= 0 && !UNPACED.load(Relaxed) {
        std::thread::sleep(WAIT_STEP);
    }
    gate.tokens
        .fetch_sub(i64::try_from(blocks).unwrap_or(i64::MAX), Relaxed);
}

fn give_up(why: &str) {
    log!("the SM share is not paced: {why}");
    UNPACED.store(true, Relaxed);
}

fn start_watcher(slice: &'static Slice) {
    let (Some(init), Some(by_uuid), Some(_)) = (
        real::nvmlInit_v2(),
        real::nvmlDeviceGetHandleByUUID(),
        real::nvmlDeviceGetProcessUtilization(),
    ) else {
        return give_up("NVML (libnvidia-ml.so.1) or its per-process utilization is missing");
    };
    // SAFETY: nvmlInit_v2 takes no arguments; NVML counts initialisations.
    if unsafe { init() } != NVML_SUCCESS {
        return give_up("nvmlInit failed");
    }
    let handles: Vec<Option<usize>> = slice
        .gpus
        .iter()
        .map(|g| {
            let uuid = std::ffi::CString::new(g.uuid.as_str()).ok()?;
            let mut dev: nvmlDevice_t = std::ptr::null_mut();
            // SAFETY: a NUL-terminated UUID and one handle to write.
            let r = unsafe { by_uuid(uuid.as_ptr(), &raw mut dev) };
            (r == NVML_SUCCESS).then_some(dev as usize)
        })
        .collect();
    let spawned = std::thread::Builder::new()
        .name("gpuslice-pace".into())
        .spawn(move || watch(slice, &handles));
    if let Err(e) = spawned {
        give_up(&format!("no pacing thread: {e}"));
    }
}

/// Refills the buckets every tick and sets the refill from the measured utilization every
/// window, for the life of the process.
fn watch(slice: &'static Slice, handles: &[Option<usize>]) {
    let gates = gates(slice);
    let mut last_seen = vec![0u64; gates.len()];
    // NVML measures from a previous reading: take one now, so the first window counts.
    let pids = slice.pids();
    for (i, dev) in handles.iter().enumerate() {
        if let Some(dev) = dev {
            let _ = container_utilization(*dev as nvmlDevice_t, &pids, &mut last_seen[i]);
        }
    }
    let mut window = FIRST_WINDOW_TICKS;
    let mut tick = 0u32;
    loop {
        std::thread::sleep(TICK);
        tick += 1;
        for g in gates.iter().filter(|g| g.paced()) {
            let refill = g.refill.load(Relaxed);
            let cap = refill.saturating_mul(BURST_TICKS);
            let _ = g.tokens.fetch_update(Relaxed, Relaxed, |t| {
                Some(if t >= cap {
                    t
                } else {
                    t.saturating_add(refill).min(cap)
                })
            });
        }
        if tick < window {
            continue;
        }
        let pids = slice.pids();
        for (i, g) in gates.iter().enumerate().filter(|(_, g)| g.paced()) {
            let launched = g.launched.swap(0, Relaxed);
            let Some(dev) = handles.get(i).copied().flatten() else {
                continue;
            };
            let util = container_utilization(dev as nvmlDevice_t, &pids, &mut last_seen[i]);
            log!(
                "SM share of GPU {i}: {launched} blocks launched, container at {util:?}% of {}%, refill {} blocks per tick",
                g.share,
                g.refill.load(Relaxed)
            );
            let Some(util) = util else {
                continue;
            };
            if launched == 0 || util == 0 {
                continue;
            }
            let per_tick = launched as f64 / f64::from(window);
            let target = per_tick * f64::from(g.share) / f64::from(util);
            let current = g.refill.load(Relaxed);
            let next = if current >= UNMEASURED {
                target
            } else {
                (current as f64 + target) / 2.0
            };
            let next = (next.round() as i64).max(1);
            g.refill.store(next, Relaxed);
            let _ = g.tokens.fetch_update(Relaxed, Relaxed, |t| {
                Some(t.min(next.saturating_mul(BURST_TICKS)))
            });
        }
        tick = 0;
        window = WINDOW_TICKS;
    }
}

/// SM utilization (percent) of the processes `pids` on `dev` since the last call, summed over
/// the processes (each process's samples averaged); None when NVML has no new sample.
fn container_utilization(dev: nvmlDevice_t, pids: &[u32], last_seen: &mut u64) -> Option<u32> {
    let f = real::nvmlDeviceGetProcessUtilization()?;
    let mut samples = vec![nvmlProcessUtilizationSample_t::default(); 64];
    loop {
        let mut count = u32::try_from(samples.len()).unwrap_or(u32::MAX);
        // SAFETY: a buffer of `count` samples for NVML to fill, and the count it updates.
        let r = unsafe { f(dev, samples.as_mut_ptr(), &raw mut count, *last_seen) };
        match r {
            NVML_SUCCESS => {
                samples.truncate(count as usize);
                break;
            }
            NVML_ERROR_INSUFFICIENT_SIZE if (count as usize) > samples.len() => {
                samples.resize(count as usize, nvmlProcessUtilizationSample_t::default());
            }
            _ => return None,
        }
    }
    *last_seen = samples
        .iter()
        .map(|s| s.time_stamp)
        .max()
        .unwrap_or(*last_seen);
    let mut total = 0u32;
    for &pid in pids {
        let mine: Vec<u32> = samples
            .iter()
            .filter(|s| s.pid == pid)
            .map(|s| s.sm_util)
            .collect();
        if !mine.is_empty() {
            total += mine.iter().sum::<u32>() / u32::try_from(mine.len()).unwrap_or(1);
        }
    }
    Some(total)
}
