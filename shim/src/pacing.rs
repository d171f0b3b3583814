//! The SM share: on a GPU where the slice has a share of the SMs (`cores`, 1 to 99), kernel
//! launches are paced so that the container's processes together keep their SM utilization
//! of that GPU near the share.
//!
//! Memsets pass the same gate (the driver runs them as kernels of its own; `hooks::memset`).
//!
//! Each process keeps, per paced GPU, a bucket of thread blocks. A launch takes its grid's
//! blocks from the bucket (a memset, blocks by its size), sleeping while the bucket is empty until the next refill wakes it (a
//! kernel is delayed, never cut or refused). A thread, started at the first paced launch,
//! refills the buckets every tick with the rate for the real time since the last refill,
//! keeps how many blocks this process launched in each tick, and asks NVML for the SM
//! utilization of the container's processes on each paced GPU
//! (`nvmlDeviceGetProcessUtilization`, summed over the pids of the usage region's slots).
//!
//! The driver measures utilization in periods of its own (a sixth of a second to a second,
//! by product) and reports each period once it has ended, stamped with its end. A real
//! driver (seen on an H200, driver 580) gives one sample per period, to one process, whose
//! figure is the whole GPU's busy share in it; when several processes share the GPU, which
//! one is named varies from period to period, as often as each is running. So the container's
//! utilization is taken over a window of the last periods, counting each period in which no
//! process of the container was named as 0: over the window that is its share of the busy
//! time, whether the driver names every process in each period or one. It is set against the
//! blocks this process launched in the same periods (the period found from the distance
//! between samples), never against a window of the thread's own: the refill becomes what was
//! launched per tick scaled by share / utilization, the rate that would have given the share
//! (halfway there, to damp the measurement's noise). Every process of the container does the
//! same against the container's total, so together they settle on it.
//!
//! Until the first measurement the bucket does not hold launches back. Without NVML, or
//! without per-process utilization from it, launches are not paced (logged once).
//!
//! Where the agent gave the share a window of each cycle (it does for every share it admits,
//! while a window is left on the GPU), none of this is used: launches are held to the window
//! ([`crate::slots`]), which holds two busy slices of one GPU to their shares where the
//! driver's samples cannot tell them apart.

use std::sync::atomic::{
    AtomicBool, AtomicI64, AtomicU64, AtomicUsize,
    Ordering::{Relaxed, SeqCst},
    fence,
};
use std::sync::{Condvar, Mutex, Once, OnceLock, PoisonError};
use std::time::Duration;

use crate::api::real;
use crate::ffi::*;
use crate::log::log;
use crate::slice::Slice;

/// How often buckets are refilled.
const TICK: Duration = Duration::from_millis(10);
/// Ticks between two requests for a new utilization sample.
const POLL_TICKS: u32 = 5;
/// Ticks of launch history kept: longer than the longest sampling period (1 s).
const HISTORY_TICKS: usize = 256;
/// A bucket holds at most this many ticks of refill (the burst a process may launch at once).
const BURST_TICKS: i64 = 2;
/// The refill before anything was measured: no pacing.
const UNMEASURED: i64 = i64::MAX / 4;
/// The longest a launch waiting for blocks sleeps before it looks at its bucket again, where
/// no refill woke it.
const WAKE_AT_LEAST: Duration = Duration::from_millis(20);

/// Whether `cores` (percent of the SMs) is a share to pace to: 0 reserves none and 100 is
/// the whole GPU, neither needs pacing.
#[must_use]
pub fn is_share(cores: u32) -> bool {
    (1..100).contains(&cores)
}

/// A paced GPU's bucket in this process.
struct Gate {
    share: u32,
    /// The window of each cycle the agent gave the share, where it gave one: launches are then
    /// held to it ([`crate::slots`]) and the bucket is not used.
    slot: Option<crate::slots::Slot>,
    /// Blocks that may still be launched; below zero after a kernel larger than what was left.
    tokens: AtomicI64,
    /// Blocks added per tick.
    refill: AtomicI64,
    /// Blocks launched in the current window.
    launched: AtomicU64,
    /// The container's launches there not yet finished, kept few.
    queue: crate::queued::Queue,
}

impl Gate {
    fn new(slice: &'static Slice, position: usize, gpu: &gpuslice_core::limits::GpuLimit) -> Self {
        let cores = gpu.cores;
        Self {
            share: cores,
            slot: gpu
                .window
                .filter(|_| is_share(cores))
                .map(crate::slots::Slot::new),
            tokens: AtomicI64::new(UNMEASURED),
            refill: AtomicI64::new(UNMEASURED),
            launched: AtomicU64::new(0),
            queue: crate::queued::Queue::new(slice, position),
        }
    }

    fn paced(&self) -> bool {
        is_share(self.share)
    }

    /// Paced from NVML's samples: a share without a window.
    fn sampled(&self) -> bool {
        self.paced() && self.slot.is_none()
    }
}

static GATES: OnceLock<Vec<Gate>> = OnceLock::new();
static WATCHER: Once = Once::new();
static UNPACED: AtomicBool = AtomicBool::new(false);

fn gates(slice: &'static Slice) -> &'static [Gate] {
    GATES.get_or_init(|| {
        slice
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| Gate::new(slice, i, g))
            .collect()
    })
}

/// A launch let through on a paced GPU, holding its place in the process's queue there, and
/// the context of its stream where that is not the current one.
#[must_use]
pub struct Paced(Option<crate::queued::Place>, Option<CUcontext>);

impl Paced {
    /// The driver answered `r` to the launch on `stream` (`ptsz`: the per-thread default
    /// stream's variant): one it took is recorded behind its process's queued work, and the
    /// place of one it refused is given up.
    pub fn launched(self, r: CUresult, stream: CUstream, ptsz: bool) {
        if let Some(place) = self.0
            && r == CUDA_SUCCESS
        {
            place.record(stream, ptsz, self.1);
        }
    }
}

/// Waits, if the GPU the work on `stream` runs on is paced (the stream's context's, the
/// calling thread's for the default streams; `ptsz`: the per-thread default stream's
/// variant), until its container has few enough launches unfinished there
/// ([`crate::queued`]) and `blocks` thread blocks may be launched, and counts them; then the
/// launch is [`Paced::launched`].
pub fn pace(slice: &'static Slice, blocks: u64, stream: CUstream, ptsz: bool) -> Option<Paced> {
    if !slice.paced || UNPACED.load(Relaxed) {
        return None;
    }
    let (other, dev) = crate::hooks::streams::stream_place(slice, stream, ptsz).ok()?;
    let gpu = slice.position(dev)?;
    let gate = &gates(slice)[gpu];
    if !gate.paced() {
        return None;
    }
    if let Some(slot) = &gate.slot {
        // A place is taken in the window, so that the container's places count only what
        // was launched there, and what is about to be.
        loop {
            slot.wait(&gate.queue);
            let place = gate.queue.take_place(slot.depth());
            if slot.launching(&gate.queue) {
                return Some(Paced(place, other));
            }
        }
    }
    let place = gate.queue.take_place(crate::queued::DEPTH);
    WATCHER.call_once(|| start_watcher(slice));
    gate.launched.fetch_add(blocks, Relaxed);
    if gate.tokens.load(Relaxed) <= 0 {
        wait_for_refill(gate);
    }
    gate.tokens
        .fetch_sub(i64::try_from(blocks).unwrap_or(i64::MAX), Relaxed);
    Some(Paced(place, other))
}

/// `ctx` is about to go: the events recorded in it go with it.
pub fn forget_context(ctx: CUcontext) {
    for g in GATES.get().into_iter().flatten() {
        g.queue.forget_context(ctx);
    }
}

/// Launches waiting for blocks sleep here until the pacing thread's next refill.
static PARKED: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());
/// How many launches sleep in [`PARKED`]: the pacing thread wakes them only when there are.
static WAITING: AtomicUsize = AtomicUsize::new(0);

/// Sleeps until `gate` has blocks to take (or pacing was given up). The bucket only grows at
/// a refill, so a launch sleeps until the pacing thread wakes it after one, rather than
/// looking again and again meanwhile.
fn wait_for_refill(gate: &Gate) {
    WAITING.fetch_add(1, SeqCst);
    fence(SeqCst);
    let mut parked = PARKED.0.lock().unwrap_or_else(PoisonError::into_inner);
    while gate.tokens.load(Relaxed) <= 0 && !UNPACED.load(Relaxed) {
        // The timeout only bounds a wait whose wake-up was missed; refills wake it.
        parked = PARKED
            .1
            .wait_timeout(parked, WAKE_AT_LEAST)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
    drop(parked);
    WAITING.fetch_sub(1, SeqCst);
}

/// Wakes the launches waiting for blocks, after a refill.
fn wake_waiting_launches() {
    fence(SeqCst);
    if WAITING.load(SeqCst) > 0 {
        let _parked = PARKED.0.lock().unwrap_or_else(PoisonError::into_inner);
        PARKED.1.notify_all();
    }
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

/// Microseconds of CLOCK_REALTIME, the clock NVML stamps its samples with and the one every
/// container shares.
pub(crate) fn realtime_us() -> u64 {
    crate::process::clock_us(libc::CLOCK_REALTIME)
}

/// Periods of utilization the container's share is judged over.
const WINDOW_PERIODS: u64 = 12;

/// One paced GPU's measurements in the pacing thread.
#[derive(Default)]
struct Books {
    /// (end of the tick in CPU µs, blocks launched in the tick), oldest first.
    launched: std::collections::VecDeque<(u64, u64)>,
    /// The stamp of the last sample used.
    last_stamp: u64,
    /// The driver's sampling period: the shortest distance seen between two samples.
    period_us: Option<u64>,
    /// The container's utilization summed over each span of new samples, and the periods
    /// the span covered, newest last, over at most [`WINDOW_PERIODS`].
    window: std::collections::VecDeque<(u64, u64)>,
    /// The part of a block the last refill owed and did not add.
    owed: f64,
}

impl Books {
    /// The blocks to add for `ticks` (fractional: the real time since the last refill, in
    /// ticks) at `refill` blocks a tick, carrying the fraction of a block to the next refill.
    fn refill_for(&mut self, refill: i64, ticks: f64) -> i64 {
        if refill >= UNMEASURED {
            return refill;
        }
        let due = refill as f64 * ticks + self.owed;
        let whole = due.floor();
        self.owed = due - whole;
        whole as i64
    }

    /// Blocks launched in the `period_us` ending at `end_us`.
    fn launched_in(&self, end_us: u64, period_us: u64) -> u64 {
        let start = end_us.saturating_sub(period_us);
        self.launched
            .iter()
            .filter(|(t, _)| *t > start && *t <= end_us)
            .map(|(_, b)| b)
            .sum()
    }

    /// Takes the samples newer than the last used: `stamp` the newest of them (whichever
    /// process it names), `util` the container's processes' figures summed over their samples
    /// among them. Returns the next refill per tick after `current`, and the container's
    /// utilization over the window, if they can be told.
    ///
    /// Utilization follows the blocks launched, so the refill is set to the rate launched over
    /// the window scaled by share / utilization, the rate that would have given the share,
    /// halfway there from `current` (at once the first time).
    fn next_refill(
        &mut self,
        stamp: u64,
        util: u32,
        share: u32,
        current: i64,
    ) -> Option<(f64, f64)> {
        if stamp <= self.last_stamp {
            return None;
        }
        let previous = std::mem::replace(&mut self.last_stamp, stamp);
        if previous == 0 {
            // The first sample: the span it covers is not known.
            return None;
        }
        let gap = stamp - previous;
        let period = self.period_us.map_or(gap, |p| p.min(gap));
        self.period_us = Some(period);
        let periods = ((gap + period / 2) / period).max(1);
        self.window.push_back((u64::from(util), periods));
        while self.window.iter().map(|w| w.1).sum::<u64>() > WINDOW_PERIODS && self.window.len() > 1
        {
            self.window.pop_front();
        }
        let (util_sum, periods): (u64, u64) = self
            .window
            .iter()
            .fold((0, 0), |(u, n), w| (u + w.0, n + w.1));
        let span = periods * period;
        let launched = self.launched_in(stamp, span);
        if launched == 0 {
            return None;
        }
        // Named in none of the window's periods while launching: its share of the busy time
        // is under one period's worth; half of one is the estimate.
        let utilization = (util_sum as f64 / periods as f64).max(50.0 / periods as f64);
        let share = f64::from(share);
        let rate = launched as f64 / (span as f64 / TICK.as_micros() as f64);
        let target = rate * share / utilization;
        let next = if current >= UNMEASURED {
            target
        } else {
            (current as f64 + target) / 2.0
        };
        Some((next, utilization))
    }
}

/// Refills the buckets every tick and sets the refill from each new utilization sample, for
/// the life of the process.
fn watch(slice: &'static Slice, handles: &[Option<usize>]) {
    let gates = gates(slice);
    let mut books: Vec<Books> = gates.iter().map(|_| Books::default()).collect();
    let mut tick = 0u32;
    let mut last_tick = std::time::Instant::now();
    loop {
        std::thread::sleep(TICK);
        tick += 1;
        let now = realtime_us();
        // A tick lasts longer than asked (the sleep's overrun, more on a busy CPU): the refill
        // is a rate per TICK of real time, so what is added follows the time that passed.
        let this_tick = std::time::Instant::now();
        let ticks = (this_tick - last_tick).as_secs_f64() / TICK.as_secs_f64();
        last_tick = this_tick;
        for (g, b) in gates
            .iter()
            .zip(books.iter_mut())
            .filter(|(g, _)| g.sampled())
        {
            b.launched.push_back((now, g.launched.swap(0, Relaxed)));
            if b.launched.len() > HISTORY_TICKS {
                b.launched.pop_front();
            }
            let refill = g.refill.load(Relaxed);
            let added = b.refill_for(refill, ticks);
            let cap = refill.saturating_mul(BURST_TICKS);
            let _ = g.tokens.fetch_update(Relaxed, Relaxed, |t| {
                Some(if t >= cap {
                    t
                } else {
                    t.saturating_add(added).min(cap)
                })
            });
        }
        wake_waiting_launches();
        if !tick.is_multiple_of(POLL_TICKS) {
            continue;
        }
        let pids = slice.pids();
        for (i, g) in gates.iter().enumerate().filter(|(_, g)| g.sampled()) {
            let Some(dev) = handles.get(i).copied().flatten() else {
                continue;
            };
            let b = &mut books[i];
            let Some((stamp, util)) =
                container_utilization(dev as nvmlDevice_t, &pids, b.last_stamp)
            else {
                continue;
            };
            let current = g.refill.load(Relaxed);
            let Some((next, utilization)) = b.next_refill(stamp, util, g.share, current) else {
                continue;
            };
            let next = (next.round() as i64).max(1);
            log!(
                "SM share of GPU {i}: container at {utilization:.1}% of {}% over the periods to {stamp}, refill {current} -> {next} blocks per tick",
                g.share
            );
            g.refill.store(next, Relaxed);
            let _ = g.tokens.fetch_update(Relaxed, Relaxed, |t| {
                Some(t.min(next.saturating_mul(BURST_TICKS)))
            });
        }
    }
}

/// The SM utilization samples on `dev` after `last_seen`: the newest stamp among them (of
/// any process), and the utilization (percent) of the processes `pids` summed over their
/// samples. None when NVML has no newer sample.
fn container_utilization(dev: nvmlDevice_t, pids: &[u32], last_seen: u64) -> Option<(u64, u32)> {
    let f = real::nvmlDeviceGetProcessUtilization()?;
    let mut samples = vec![nvmlProcessUtilizationSample_t::default(); 64];
    loop {
        let mut count = u32::try_from(samples.len()).unwrap_or(u32::MAX);
        // SAFETY: a buffer of `count` samples for NVML to fill, and the count it updates.
        let r = unsafe { f(dev, samples.as_mut_ptr(), &raw mut count, last_seen) };
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
    let stamp = samples.iter().map(|s| s.time_stamp).max()?;
    let total = samples
        .iter()
        .filter(|s| pids.contains(&s.pid))
        .map(|s| s.sm_util)
        .sum();
    Some((stamp, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refill_follows_the_time_that_passed_not_the_ticks_counted() {
        // Ticks a tenth longer than asked (a busy CPU): a hundred of them add what 110 ticks
        // of the rate stand for, not what 100 do.
        let mut books = Books::default();
        let added: i64 = (0..100).map(|_| books.refill_for(1_000, 1.1)).sum();
        assert_eq!(added, 110_000);
    }

    #[test]
    fn a_fraction_of_a_block_is_carried_to_the_next_refill() {
        let mut books = Books::default();
        let added: Vec<i64> = (0..4).map(|_| books.refill_for(1, 0.5)).collect();
        assert_eq!(added, [0, 1, 0, 1]);
    }

    #[test]
    fn nothing_measured_yet_holds_nothing_back() {
        let mut books = Books::default();
        assert_eq!(books.refill_for(UNMEASURED, 0.9), UNMEASURED);
    }
}
