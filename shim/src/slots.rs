//! The SM share in time slots: where the agent gave a slice a window of each cycle
//! ([`gpuslice_core::limits::SmWindow`]: the slices of one GPU get windows that do not
//! overlap), its kernels are launched only inside that window, so the shares of one GPU run
//! in turn and each gets its own part of the GPU's time, whoever else is busy. It needs no
//! measurement of utilization: the driver's samples name one process per period with the
//! whole GPU's figure, which cannot tell two busy slices apart.
//!
//! Work launched in the window keeps running after it ends (it is queued): once per cycle,
//! the first launch after the window waits for the context's work, then for the rest of what
//! the container launched in the window ([`crate::queued`] counts it), and measures how far
//! it ran past the window's end; launching stops that much (halfway corrected each cycle)
//! before the end from then on, so the work ends with the window rather than in the next
//! slice's. Every process of the container measures the same end, so they settle on the
//! same margin. Where the margin is as long as it may be (three quarters of the window) and
//! the work still runs past the end, the launches let through at the window's opening alone
//! outlast it (long kernels): the number the container may have unfinished is halved, down
//! to one, and grows back by one a cycle once the work ends in time.
//! Clocks are CLOCK_REALTIME, the same in every container (time namespaces offset only the
//! monotonic clocks).

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use gpuslice_core::limits::{SM_CYCLE_MS, SmWindow};

use crate::api::real;
use crate::pacing::realtime_us;
use crate::queued::DEPTH;

const CYCLE_US: u64 = SM_CYCLE_MS * 1000;

/// One GPU's window in this process.
pub struct Slot {
    start_us: u64,
    end_us: u64,
    /// How long before the window's end launching stops.
    margin_us: AtomicI64,
    /// The last cycle whose overrun was measured.
    measured_cycle: AtomicU64,
    /// How many launches the container may have unfinished ([`crate::queued`]), at most
    /// [`crate::queued::DEPTH`]: fewer where kernels are so long that that many run past the
    /// window's end whatever the margin.
    depth: AtomicUsize,
}

impl Slot {
    #[must_use]
    pub fn new(w: SmWindow) -> Self {
        let at = |percent: u32| u64::from(percent.min(100)) * CYCLE_US / 100;
        Self {
            start_us: at(w.start),
            end_us: at(w.start + w.len),
            margin_us: AtomicI64::new(0),
            measured_cycle: AtomicU64::new(u64::MAX),
            depth: AtomicUsize::new(DEPTH),
        }
    }

    /// How many launches the container may have unfinished on the GPU.
    pub fn depth(&self) -> usize {
        self.depth.load(Relaxed)
    }

    /// How long after the window's start launching stops (at least a microsecond).
    fn open_us(&self) -> u64 {
        let margin = u64::try_from(self.margin_us.load(Relaxed)).unwrap_or(0);
        (self.end_us - self.start_us).saturating_sub(margin).max(1)
    }

    /// Where now falls: the cycle (counted from the window's start) and whether launches may
    /// go in it now.
    fn now(&self) -> (u64, u64, bool) {
        // Time counted from the window's start, so that a window ending with the cycle is
        // measured like any other.
        let since = realtime_us().saturating_sub(self.start_us);
        let (cycle, t) = (since / CYCLE_US, since % CYCLE_US);
        (cycle, t, t < self.open_us())
    }

    /// Whether a launch may go to the GPU now.
    pub fn open(&self) -> bool {
        self.now().2
    }

    /// Returns once a launch may go to the GPU: inside this process's part of the window.
    /// Once a cycle, after the window, `drained` is called with the time the next window
    /// opens: it returns once the work the container launched in the window has run, or that
    /// time has come ([`Slot::measure_overrun`]).
    pub fn wait(&self, drained: impl Fn(u64)) {
        loop {
            let (cycle, t, open) = self.now();
            if open {
                return;
            }
            if self.measured_cycle.swap(cycle, Relaxed) != cycle {
                self.measure_overrun(cycle, &drained);
                continue;
            }
            std::thread::sleep(Duration::from_micros(CYCLE_US - t));
        }
    }

    /// Waits for the work launched in the window that opened in cycle `cycle` (counted from
    /// the window's start): this process's, then the container's (`drained`), and moves the
    /// margin by half of how far it ran past the window's end (or ended before it).
    fn measure_overrun(&self, cycle: u64, drained: &impl Fn(u64)) {
        let Some(sync) = real::cuCtxSynchronize() else {
            return;
        };
        // SAFETY: cuCtxSynchronize takes no arguments; it waits for the calling thread's
        // current context.
        unsafe { sync() };
        drained(self.start_us + (cycle + 1) * CYCLE_US);
        let done = i64::try_from(realtime_us()).unwrap_or(i64::MAX);
        let end = i64::try_from(cycle * CYCLE_US + self.end_us).unwrap_or(i64::MAX);
        self.follow_overrun(done - end);
    }

    /// Moves the margin by half of `overrun_us` (how far the work launched in a window ran
    /// past its end; below zero where it ended before). Where the margin is already as long
    /// as it may be and the work still ran past the end, the kernels launched at the
    /// window's opening alone outlast it: the depth is halved. It grows back by one a cycle
    /// while the margin is under half its longest and the work ends in time.
    fn follow_overrun(&self, overrun_us: i64) {
        let most = i64::try_from((self.end_us - self.start_us) * 3 / 4).unwrap_or(0);
        let before = self.margin_us.load(Relaxed);
        let margin = (before + overrun_us / 2).clamp(0, most);
        self.margin_us.store(margin, Relaxed);
        let depth = self.depth.load(Relaxed);
        let depth = if overrun_us > 0 && before >= most {
            (depth / 2).max(1)
        } else if overrun_us <= 0 && margin < most / 2 {
            (depth + 1).min(DEPTH)
        } else {
            depth
        };
        self.depth.store(depth, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_is_placed_in_the_cycle_by_its_percentages() {
        let s = Slot::new(SmWindow { start: 30, len: 70 });
        assert_eq!((s.start_us, s.end_us), (30_000, 100_000));
        assert_eq!(s.open_us(), 70_000);
        s.margin_us.store(5_000, Relaxed);
        assert_eq!(s.open_us(), 65_000);
        // A margin never closes the window entirely.
        s.margin_us.store(i64::MAX, Relaxed);
        assert_eq!(s.open_us(), 1);
    }

    #[test]
    fn an_overrun_the_margin_can_still_take_back_leaves_the_depth_alone() {
        let s = Slot::new(SmWindow { start: 0, len: 10 });
        s.follow_overrun(4_000);
        assert_eq!((s.margin_us.load(Relaxed), s.depth()), (2_000, DEPTH));
    }

    #[test]
    fn kernels_outlasting_the_window_whatever_the_margin_halve_the_depth_until_it_grows_back() {
        // A 10 ms window, whose margin is at most 7.5 ms: the work keeps ending 30 ms late.
        let s = Slot::new(SmWindow { start: 0, len: 10 });
        let depths: Vec<usize> = (0..8)
            .map(|_| {
                s.follow_overrun(30_000);
                s.depth()
            })
            .collect();
        assert_eq!(s.margin_us.load(Relaxed), 7_500);
        // The margin reaches its longest first (15 ms asked, 7.5 ms kept), then the depth
        // halves each cycle, never below one launch.
        assert_eq!(depths, [DEPTH, DEPTH / 2, DEPTH / 4, DEPTH / 8, 1, 1, 1, 1]);
        // The work ends 20 ms early: the margin goes, and the depth grows one a cycle.
        let depths: Vec<usize> = (0..DEPTH)
            .map(|_| {
                s.follow_overrun(-20_000);
                s.depth()
            })
            .collect();
        assert_eq!(s.margin_us.load(Relaxed), 0);
        assert_eq!(depths, (2..=DEPTH).chain([DEPTH]).collect::<Vec<_>>());
    }

    #[test]
    fn a_launch_waits_for_its_window_and_goes_at_once_inside_it() {
        let s = Slot::new(SmWindow { start: 0, len: 20 });
        for _ in 0..3 {
            s.wait(|_| {});
            let t = realtime_us() % CYCLE_US;
            assert!(t < 20_000 + 2_000, "launched at {t} µs into the cycle");
        }
    }
}
