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
//! same margin.
//! Clocks are CLOCK_REALTIME, the same in every container (time namespaces offset only the
//! monotonic clocks).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use gpuslice_core::limits::{SM_CYCLE_MS, SmWindow};

use crate::api::real;
use crate::pacing::realtime_us;

const CYCLE_US: u64 = SM_CYCLE_MS * 1000;

/// One GPU's window in this process.
pub struct Slot {
    start_us: u64,
    end_us: u64,
    /// How long before the window's end launching stops.
    margin_us: AtomicI64,
    /// The last cycle whose overrun was measured.
    measured_cycle: AtomicU64,
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
        }
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
        let most = i64::try_from((self.end_us - self.start_us) * 3 / 4).unwrap_or(0);
        let _ = self.margin_us.fetch_update(Relaxed, Relaxed, |m| {
            Some((m + (done - end) / 2).clamp(0, most))
        });
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
    fn a_launch_waits_for_its_window_and_goes_at_once_inside_it() {
        let s = Slot::new(SmWindow { start: 0, len: 20 });
        for _ in 0..3 {
            s.wait(|_| {});
            let t = realtime_us() % CYCLE_US;
            assert!(t < 20_000 + 2_000, "launched at {t} µs into the cycle");
        }
    }
}
