//! The SM share in time slots: where the agent gave a slice a window of each cycle
//! ([`gpuslice_core::limits::SmWindow`]: the slices of one GPU get windows that do not
//! overlap), its kernels are launched only inside that window, so the shares of one GPU run
//! in turn and each gets its own part of the GPU's time, whoever else is busy. It needs no
//! measurement of utilization: the driver's samples name one process per period with the
//! whole GPU's figure, which cannot tell two busy slices apart.
//!
//! Work launched in the window keeps running after it ends (it is queued). Where how long a
//! launch keeps the GPU is known ([`crate::queued`] measures it), a launch goes only if the
//! container's queued work, it included, is predicted to end by the window's end; the first
//! launch that would not closes the window for the process until the next cycle, except alone
//! at the window's opening (its first eighth, at least 2 ms: a launch longer than the window
//! cannot end in it; it goes there rather than later). Until it is known, launching stops
//! a margin before the end. Once per cycle, the first launch after the window waits for what
//! the process launched in the window to end, then for the rest of the container's (at most
//! until the next window), through the library's events (a synchronization of the context
//! would invalidate a capture another thread holds open), and measures how far it ran past
//! the window's end. All of it goes into a balance: what ran past the end outside the
//! slice's own later windows (a kernel longer than the cycle runs through them) is owed
//! (later windows open that much late, a window owed in full is skipped; a window the work
//! still running ran into opens where it ended, and only the rest of it pays), what the
//! window left unused once it opened (not what the work before it ran through, nor the debt
//! it paid) is kept, at most a window, and lets a later launch end
//! that much past the end (at most one launch's time), so that launches that do not divide
//! the window are held to the share on average. A launch let through that waited for its
//! place (the container's work before it) into a later cycle goes back to wait there: the
//! window it was let through in is measured before the later one is placed or counted as
//! launched in. Where the prediction refuses a launch behind launches the program already
//! waited for, it is made again once the process has looked at its events (the thread that
//! watches them may not have seen them finish yet). The margin moves
//! by half of how far the work ran past its end, or past its predicted end where that was
//! later: it takes back what the prediction missed.
//! Every process of the container measures the same end, so they settle on the same margin.
//! Where the margin is as long as it may be (three quarters of the window) and the work still
//! runs past the end unpredicted, the launches let through at the window's opening alone
//! outlast it (long kernels): the number the container may have unfinished is halved, down
//! to one, and grows back by one a cycle once the work ends in time. A cycle with no launch
//! after its window to measure it is measured at the next window's first launch: the work
//! still running is waited for, work that ended meanwhile ended when its last launch did (a
//! launch let through on credit and waited for runs into the next cycle; uncounted, it was
//! never paid back).
//!
//! Clocks are CLOCK_REALTIME, the same in every container (time namespaces offset only the
//! monotonic clocks).

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use gpuslice_core::limits::{SM_CYCLE_MS, SmWindow};

use crate::pacing::realtime_us;
use crate::queued::DEPTH;

const CYCLE_US: u64 = SM_CYCLE_MS * 1000;

/// The container's launches on the window's GPU, as a window's measurement sees them.
pub trait Container {
    /// Returns once none of the container's launches there is unfinished, or at `until_us`
    /// (CLOCK_REALTIME).
    fn wait_until_drained(&self, until_us: u64);
    /// Returns once none of this process's launches there recorded before
    /// `recorded_before_us` (CLOCK_REALTIME) is unfinished, however long that takes (a
    /// kernel longer than the cycle is waited for to its end).
    fn wait_until_own_finished(&self, _recorded_before_us: u64) {}
    /// How many are unfinished or about to be launched.
    fn queued(&self) -> u64;
    /// Counts as finished those of this process's launches that have finished, where that
    /// is not yet counted.
    fn settle(&self) {}
    /// Whether any of them is unfinished.
    fn unfinished(&self) -> bool {
        self.queued() > 0
    }
    /// How long one keeps the GPU, in µs, as last measured (0: not measured).
    fn launch_us(&self) -> u64;
    /// When one of them last finished, as far as this process saw (CLOCK_REALTIME µs).
    fn finished_us(&self) -> Option<u64>;
}

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
    /// Window time owed (how far work ran past the windows' ends, not yet paid back), or,
    /// below zero, window time left unused that a launch predicted to end past the window's
    /// end may take (at most a window).
    balance_us: AtomicI64,
    /// The last cycle in which a launch was predicted to end past the window's end, so that
    /// the window closed early for this process.
    closed_cycle: AtomicU64,
    /// When the work let through is predicted to end (CLOCK_REALTIME µs, the latest
    /// predicted since the last measurement; 0: no prediction).
    planned_end_us: AtomicU64,
    /// How late the window of one cycle opens, paying debt: `cycle << LATE_BITS | late_us`.
    late: AtomicU64,
    /// The last cycle a launch went in (0: none yet; cycles count from 1970).
    launched_cycle: AtomicU64,
    /// When the work measured last ended (CLOCK_REALTIME µs; 0: none measured).
    ran_until_us: AtomicU64,
}

/// Bits of [`Slot::late`] that hold the delay (a window is at most a cycle, 100,000 µs).
const LATE_BITS: u32 = 20;
/// Whether `cycle` is still to be measured where `measured` is the last cycle measured
/// (`u64::MAX`: none yet).
fn measurable(measured: u64, cycle: u64) -> bool {
    measured == u64::MAX || measured < cycle
}

/// The delay [`Slot::late`] holds (`seen`) where it was decided for `cycle`.
fn late_decided(seen: u64, cycle: u64) -> Option<u64> {
    (seen != u64::MAX && seen >> LATE_BITS == cycle).then_some(seen & ((1u64 << LATE_BITS) - 1))
}

/// How long after the window opens a launch still counts as at its opening, at least.
const OPENING_US: u64 = 2_000;
/// The most debt kept, in windows (three seconds of them): enough for a kernel of a third of
/// a second in a 10% window, of a second and more in 30%; a kernel of a minute does not shut
/// a slice out for hours (the agent's hold takes over there).
const DEBT_WINDOWS: u64 = 30;

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
            balance_us: AtomicI64::new(0),
            closed_cycle: AtomicU64::new(u64::MAX),
            planned_end_us: AtomicU64::new(0),
            late: AtomicU64::new(u64::MAX),
            launched_cycle: AtomicU64::new(0),
            ran_until_us: AtomicU64::new(0),
        }
    }

    fn len_us(&self) -> u64 {
        self.end_us - self.start_us
    }

    /// How late the window opens in `cycle`: where the work launched before ran into it, the
    /// part it ran through was the slice's own, used ([`Slot::ended`]), and the window opens
    /// after it at the earliest; then the debt, up to what is left of the window, is paid by
    /// that much of it going by idle. Decided once per cycle, by whoever asks first.
    fn late_in(&self, cycle: u64) -> u64 {
        let mask = (1u64 << LATE_BITS) - 1;
        let opened = self.start_us + cycle * CYCLE_US;
        loop {
            let seen = self.late.load(Relaxed);
            if let Some(late) = late_decided(seen, cycle) {
                return late;
            }
            let used = (self.ran_until_us.load(Relaxed).saturating_sub(opened)).min(self.len_us());
            let debt = u64::try_from(self.balance_us.load(Relaxed)).unwrap_or(0);
            let take = debt.min(self.len_us() - used);
            let late = (used + take).min(mask);
            if self
                .late
                .compare_exchange(seen, cycle << LATE_BITS | late, Relaxed, Relaxed)
                .is_ok()
            {
                let take_i = i64::try_from(take).unwrap_or(0);
                let _ = self
                    .balance_us
                    .fetch_update(Relaxed, Relaxed, |b| Some(b - take_i.min(b.max(0))));
                return late;
            }
        }
    }

    /// How late the window of `cycle` opened, where that was decided (0 where not, or where
    /// a later cycle's has been decided since).
    fn late_of(&self, cycle: u64) -> u64 {
        late_decided(self.late.load(Relaxed), cycle).unwrap_or(0)
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

    /// Where now falls: the cycle (counted from the window's start), the time into it, and
    /// how late the window opens in it.
    fn now(&self) -> (u64, u64, u64) {
        let (cycle, t) = self.cycle_now();
        (cycle, t, self.late_in(cycle))
    }

    /// The cycle now falls in (counted from the window's start) and the time into it.
    fn cycle_now(&self) -> (u64, u64) {
        // Time counted from the window's start, so that a window ending with the cycle is
        // measured like any other.
        let since = realtime_us().saturating_sub(self.start_us);
        (since / CYCLE_US, since % CYCLE_US)
    }

    /// Until how far into the cycle launches may go: the window's end where how long a
    /// launch keeps the GPU is known (each launch's predicted end decides,
    /// [`Slot::launching`]), else the margin before it.
    fn open_until(&self, launch_us: u64) -> u64 {
        if launch_us > 0 {
            self.len_us()
        } else {
            self.open_us()
        }
    }

    /// Whether a launch may go to the GPU now; if so, it counts as the cycle's (whose work
    /// a later launch measures). Where how long a launch keeps the GPU is known, the launch
    /// goes only if the container's queued work, it included, is predicted to end by the
    /// window's end (less the margin, plus what the window left unused before, at most one
    /// launch's time), or if it is the only one and the window has just opened (a launch
    /// longer than the window goes at its opening, not later); otherwise the window closes
    /// for this process until the next cycle.
    pub fn launching(&self, container: &impl Container) -> bool {
        let (cycle, _) = self.cycle_now();
        if self.unmeasured_before(cycle) {
            // The launch waited (for its place) into a later cycle: the earlier window's work
            // is measured first ([`Slot::wait`]), so that this window is placed after what it
            // ran and owes, and this cycle does not take that window's place.
            return false;
        }
        let (cycle, t, late) = self.now();
        let launch_us = container.launch_us();
        let open = late <= t
            && t < self.open_until(launch_us)
            && self.closed_cycle.load(Relaxed) != cycle
            && (launch_us == 0 || self.fits_settled(cycle, t, late, launch_us, container));
        if open {
            self.launched_cycle.fetch_max(cycle, Relaxed);
        }
        open
    }

    /// How long after the window opens a launch still counts as at its opening: an eighth
    /// of the window, at least 2 ms (a thread woken for the opening may run that late on a
    /// busy machine), at most the window.
    fn opening_us(&self) -> u64 {
        (self.len_us() / 8).max(OPENING_US).min(self.len_us())
    }

    /// Whether `queued` launches of `launch_us` each (more than 0), starting at `t` into
    /// `cycle`, end in time (see [`Slot::launching`]); if not, closes the window for this
    /// cycle.
    fn fits(&self, cycle: u64, t: u64, late: u64, launch_us: u64, queued: u64) -> bool {
        if let Some(ends) = self.predicted_end(t, late, launch_us, queued) {
            let at = self.start_us + cycle * CYCLE_US + ends;
            self.planned_end_us.fetch_max(at, Relaxed);
            return true;
        }
        self.closed_cycle.store(cycle, Relaxed);
        // The window was wanted: what it left unused is measured and kept.
        self.launched_cycle.fetch_max(cycle, Relaxed);
        false
    }

    /// When `queued` launches of `launch_us` each, starting at `t`, are predicted to end (µs
    /// into the cycle), where that is in time: by the window's end (less the margin, plus
    /// what earlier windows left unused, at most one launch's time), or a launch alone at the
    /// window's opening.
    fn predicted_end(&self, t: u64, late: u64, launch_us: u64, queued: u64) -> Option<u64> {
        let margin = u64::try_from(self.margin_us.load(Relaxed)).unwrap_or(0);
        let credit = u64::try_from(-self.balance_us.load(Relaxed))
            .unwrap_or(0)
            .min(launch_us);
        let ends = t.saturating_add(queued.saturating_mul(launch_us));
        let first_at_opening = queued == 1 && t < late + self.opening_us();
        (ends <= (self.len_us() + credit).saturating_sub(margin) || first_at_opening)
            .then_some(ends)
    }

    /// [`Slot::fits`] for the container's queued work; where that would not end in time,
    /// counted again once the container has looked at what finished (a program that waited
    /// for its work may launch again before the library has seen it finish).
    fn fits_settled(
        &self,
        cycle: u64,
        t: u64,
        late: u64,
        launch_us: u64,
        container: &impl Container,
    ) -> bool {
        let mut queued = container.queued().max(1);
        if queued > 1 && self.predicted_end(t, late, launch_us, queued).is_none() {
            container.settle();
            queued = container.queued().max(1);
        }
        self.fits(cycle, t, late, launch_us, queued)
    }

    /// Returns once a launch may go to the GPU: inside this process's part of the window
    /// (then [`Slot::launching`] tells whether it still is, once the launch has its place).
    /// Once a cycle, the first launch after the window measures how far the work launched in
    /// it ran past its end ([`Slot::measure_overrun`]); where none came, the next window's
    /// first launch measures it: waiting for the work where it still runs, else taking when
    /// the container's last launch finished.
    pub fn wait(&self, container: &impl Container) {
        loop {
            let (cycle, t) = self.cycle_now();
            let last = self.launched_cycle.load(Relaxed);
            if last != 0 && last < cycle && self.claim_measurement(last) {
                // A window no launch after it measured: its work still runs, or ended when
                // the container's last launch finished. Measured before this cycle's window
                // is placed, so that what it owes delays this window too.
                if container.unfinished() {
                    self.measure_overrun(last, container);
                } else if let Some(done) = container.finished_us()
                    && done >= self.start_us + last * CYCLE_US
                {
                    self.ended(last, done);
                }
                continue;
            }
            let late = self.late_in(cycle);
            if t < late {
                // Paying debt: the window opens late.
                std::thread::sleep(Duration::from_micros(late - t));
                continue;
            }
            let closed = self.closed_cycle.load(Relaxed) == cycle;
            if t < self.open_until(container.launch_us()) && !closed {
                return;
            }
            if last == cycle && self.claim_measurement(cycle) {
                self.measure_overrun(cycle, container);
                continue;
            }
            std::thread::sleep(Duration::from_micros(CYCLE_US - t));
        }
    }

    /// Whether a window before `cycle` was launched in and its work is not measured yet (nor
    /// being measured).
    fn unmeasured_before(&self, cycle: u64) -> bool {
        let last = self.launched_cycle.load(Relaxed);
        last != 0 && last < cycle && measurable(self.measured_cycle.load(Relaxed), last)
    }

    /// Whether the calling thread is the one to measure `cycle` (never one measured, nor
    /// one before a cycle measured).
    fn claim_measurement(&self, cycle: u64) -> bool {
        let m = self.measured_cycle.load(Relaxed);
        measurable(m, cycle)
            && self
                .measured_cycle
                .compare_exchange(m, cycle, Relaxed, Relaxed)
                .is_ok()
    }

    /// Waits for the work launched in the window that opened in cycle `cycle` (counted from
    /// the window's start): this process's launches to their end, then the container's
    /// (`drained`, at most until the next window), each followed by an event of the
    /// library's (not a synchronization of the context, which would invalidate a capture
    /// another thread of the program holds open), and takes how far it ran past the
    /// window's end (or ended before it) into the balance, and how far it ran past its
    /// predicted end, where it was predicted to end past the window's, into the margin.
    fn measure_overrun(&self, cycle: u64, container: &impl Container) {
        // The window's launches: those recorded by its end (a launch let through at the
        // very end is recorded just after it).
        let window_end = self.start_us + cycle * CYCLE_US + self.len_us();
        container.wait_until_own_finished(window_end + OPENING_US);
        container.wait_until_drained(self.start_us + (cycle + 1) * CYCLE_US);
        self.ended(cycle, realtime_us());
    }

    /// The work launched in the window that opened in `cycle` ended at `done` (CLOCK_REALTIME
    /// µs): how far past the window's end, and past its predicted end, is followed. Owed is
    /// what ran outside the slice's own windows: time in its later windows (the next, or
    /// several where the work ran longer than a cycle) is the slice's, used there.
    fn ended(&self, cycle: u64, done: u64) {
        let opened = self.start_us + cycle * CYCLE_US;
        let end = opened + self.len_us();
        let planned = self.planned_end_us.swap(0, Relaxed);
        let signed = |us: u64| i64::try_from(us).unwrap_or(i64::MAX);
        // Time in the slice's own later windows (the next cycles' until `done`) is its own.
        let ran = done.saturating_sub(opened);
        let (cycles, into_last) = (ran / CYCLE_US, ran % CYCLE_US);
        let own_later = match cycles {
            0 => 0,
            n => (n - 1) * self.len_us() + into_last.min(self.len_us()),
        };
        // Where the work ended before the window's end, what is kept is only what the window
        // left unused once it opened: not the part the work before it ran through or the
        // debt paid (its opening late).
        let from = done.max(opened + self.late_of(cycle));
        let overrun = if from < end {
            signed(from) - signed(end)
        } else {
            signed(done) - signed(end) - signed(own_later)
        };
        self.ran_until_us.fetch_max(done, Relaxed);
        self.follow_overrun(overrun, signed(done) - signed(end.max(planned)));
    }

    /// Takes `overrun_us` (how far the work launched in a window ran past its end; below
    /// zero where it ended before) into the balance: owed in full where positive (later
    /// windows open that much late), kept as credit, at most a window, where not. Moves
    /// the margin by half of `unplanned_us` (how far the work ran past the window's end, or
    /// past its predicted end where that was later). Where the margin is already as long as
    /// it may be and the work still ran past the end unplanned, the kernels launched at the
    /// window's opening alone outlast it: the depth is halved. It grows back by one a cycle
    /// while the margin is under half its longest and the work ends in time.
    fn follow_overrun(&self, overrun_us: i64, unplanned_us: i64) {
        let len = i64::try_from(self.len_us()).unwrap_or(i64::MAX);
        let most_debt = len.saturating_mul(i64::try_from(DEBT_WINDOWS).unwrap_or(1));
        let _ = self.balance_us.fetch_update(Relaxed, Relaxed, |b| {
            Some(b.saturating_add(overrun_us).clamp(-len, most_debt))
        });
        let most = len * 3 / 4;
        let before = self.margin_us.load(Relaxed);
        let margin = (before + unplanned_us / 2).clamp(0, most);
        self.margin_us.store(margin, Relaxed);
        let depth = self.depth.load(Relaxed);
        let depth = if unplanned_us > 0 && before >= most {
            (depth / 2).max(1)
        } else if unplanned_us <= 0 && margin < most / 2 {
            (depth + 1).min(DEPTH)
        } else {
            depth
        };
        self.depth.store(depth, Relaxed);
        crate::log::log!(
            "SM window: the work ran {overrun_us} µs past its end ({unplanned_us} µs past its \
             predicted end); margin {before} -> {margin} µs, {depth} launches unfinished at \
             most, balance {} µs",
            self.balance_us.load(Relaxed)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A container as a test sets it: how many of its launches are counted (and how many are
    /// left once it looks at its events), how long one keeps the GPU, and when its last one
    /// finished.
    struct Work {
        queued: AtomicU64,
        left_once_looked: u64,
        launch_us: u64,
        finished_us: Option<u64>,
    }

    impl Work {
        /// Nothing unfinished, nothing measured.
        fn idle() -> Self {
            Self::finished(None)
        }

        /// Its launches all finished at `us`.
        fn finished_at(us: u64) -> Self {
            Self::finished(Some(us))
        }

        fn finished(finished_us: Option<u64>) -> Self {
            Self {
                queued: AtomicU64::new(0),
                left_once_looked: 0,
                launch_us: 0,
                finished_us,
            }
        }

        /// 60 ms launches, two counted of which one has finished, until it looks.
        fn one_finished_unseen() -> Self {
            Self {
                queued: AtomicU64::new(2),
                left_once_looked: 1,
                launch_us: 60_000,
                finished_us: None,
            }
        }
    }

    impl Container for Work {
        fn wait_until_drained(&self, _until_us: u64) {}
        fn queued(&self) -> u64 {
            self.queued.load(Relaxed)
        }
        fn settle(&self) {
            self.queued.store(self.left_once_looked, Relaxed);
        }
        fn launch_us(&self) -> u64 {
            self.launch_us
        }
        fn finished_us(&self) -> Option<u64> {
            self.finished_us
        }
    }

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
        s.follow_overrun(4_000, 4_000);
        assert_eq!((s.margin_us.load(Relaxed), s.depth()), (2_000, DEPTH));
    }

    #[test]
    fn kernels_outlasting_the_window_whatever_the_margin_halve_the_depth_until_it_grows_back() {
        // A 10 ms window, whose margin is at most 7.5 ms: the work keeps ending 30 ms late.
        let s = Slot::new(SmWindow { start: 0, len: 10 });
        let depths: Vec<usize> = (0..8)
            .map(|_| {
                s.follow_overrun(30_000, 30_000);
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
                s.follow_overrun(-20_000, -20_000);
                s.depth()
            })
            .collect();
        assert_eq!(s.margin_us.load(Relaxed), 0);
        assert_eq!(depths, (2..=DEPTH).chain([DEPTH]).collect::<Vec<_>>());
    }

    #[test]
    fn work_run_past_the_window_is_paid_back_by_later_windows_opening_late() {
        // A 10 ms window whose work ran 25 ms past its end owes 25 ms: the next two windows
        // are lost whole and the third opens 5 ms late; each cycle's delay is taken once.
        let s = Slot::new(SmWindow { start: 0, len: 10 });
        s.follow_overrun(25_000, 25_000);
        let late: Vec<u64> = [7, 7, 8, 9, 10].iter().map(|&c| s.late_in(c)).collect();
        assert_eq!(late, [10_000, 10_000, 10_000, 5_000, 0]);
        // Ending early owes nothing and keeps at most a window; a debt never exceeds thirty
        // windows.
        s.follow_overrun(-8_000, -8_000);
        s.follow_overrun(-8_000, -8_000);
        assert_eq!((s.late_in(11), s.balance_us.load(Relaxed)), (0, -10_000));
        s.follow_overrun(10_000_000, 10_000_000);
        assert_eq!(s.balance_us.load(Relaxed), 30 * 10_000);
    }

    #[test]
    fn a_window_the_work_ran_through_pays_nothing_back_and_one_gone_by_idle_does() {
        // Work launched in cycle 2's 10 ms window ended 40 ms into cycle 3: 130 ms past the
        // window's end, 10 of them in cycle 3's window, its own; 120 ms owed. Cycle 3's
        // window, used whole, takes none of the debt; the next ones open late instead.
        let s = Slot::new(SmWindow { start: 0, len: 10 });
        s.ended(2, 3 * CYCLE_US + 40_000);
        assert_eq!(s.balance_us.load(Relaxed), 120_000);
        assert_eq!(s.late_in(3), 10_000);
        assert_eq!(s.balance_us.load(Relaxed), 120_000);
        assert_eq!(s.late_in(4), 10_000);
        // Cycle 5's window went by with nothing running: it paid, as a late one does.
        assert_eq!(s.late_in(5), 10_000);
        assert_eq!(s.balance_us.load(Relaxed), 100_000);
    }

    #[test]
    fn only_the_part_of_a_window_gone_by_idle_pays_debt() {
        // A 250 ms kernel from the opening of cycle 5's 70 ms window ran 60 ms of the others'
        // time (30 ms after each of its next windows) and ended 50 ms into cycle 7's window:
        // those 50 ms were its own, used, so the window opens after them, 10 ms later, and
        // the 20 ms left after that go by idle and pay 20 of the 60 owed.
        let s = Slot::new(SmWindow { start: 0, len: 70 });
        s.ended(5, 5 * CYCLE_US + 250_000);
        assert_eq!(s.balance_us.load(Relaxed), 60_000);
        assert_eq!(s.late_in(7), 70_000);
        assert_eq!(s.balance_us.load(Relaxed), 40_000);
        assert_eq!(s.late_in(8), 40_000);
        assert_eq!(s.balance_us.load(Relaxed), 0);
    }

    #[test]
    fn only_the_slices_own_later_windows_are_not_owed_by_work_longer_than_the_cycle() {
        // A 30 ms window whose kernel ran 200 ms from the window's opening: the windows of the
        // next cycle were its own (30 ms), the rest past its end is owed (140 ms).
        let s = Slot::new(SmWindow { start: 0, len: 30 });
        s.ended(5, 5 * CYCLE_US + 200_000);
        assert_eq!(s.balance_us.load(Relaxed), 140_000);
        // Ending 20 ms into the second window after: both later windows are counted as own
        // up to there.
        let s = Slot::new(SmWindow { start: 0, len: 30 });
        s.ended(5, 5 * CYCLE_US + 220_000);
        assert_eq!(s.balance_us.load(Relaxed), 220_000 - 30_000 - 50_000);
    }

    #[test]
    fn a_launch_predicted_to_end_past_the_window_closes_it_for_the_cycle() {
        // 16 ms launches in a 50 ms window: three fit, the fourth would end at 64 ms.
        let s = Slot::new(SmWindow { start: 0, len: 50 });
        assert!(s.fits(3, 0, 0, 16_000, 3));
        assert!(!s.fits(3, 0, 0, 16_000, 4));
        assert_eq!(s.closed_cycle.load(Relaxed), 3);
        assert_eq!(
            s.launched_cycle.load(Relaxed),
            3,
            "a window refused is measured, as one launched in"
        );
        assert_eq!(s.planned_end_us.load(Relaxed), 3 * CYCLE_US + 48_000);
        // The work ended 2 ms before the window's end, as planned: the margin stays at none,
        // and 2 ms are kept.
        s.follow_overrun(-2_000, -2_000);
        assert_eq!(
            (s.margin_us.load(Relaxed), s.balance_us.load(Relaxed)),
            (0, -2_000)
        );
        // Kept window time lets a launch end that much past the window's end, at most one
        // launch's time: after 14 ms of it, the fourth fits.
        s.follow_overrun(-12_000, -12_000);
        assert!(s.fits(4, 0, 0, 16_000, 4));
        // Its planned overrun, run as planned, moves no margin, and is paid from what was kept.
        s.follow_overrun(14_000, 0);
        assert_eq!(
            (s.margin_us.load(Relaxed), s.balance_us.load(Relaxed)),
            (0, 0)
        );
    }

    #[test]
    fn only_work_run_before_the_next_window_opens_is_owed() {
        // A 70 ms window whose work ended 20 ms into the next cycle: 30 ms of the other
        // slices' time are owed, the 20 ms in its own next window are its own.
        let s = Slot::new(SmWindow { start: 0, len: 70 });
        s.ended(5, 5 * CYCLE_US + 120_000);
        assert_eq!(s.balance_us.load(Relaxed), 30_000);
        // Work that ended in the window keeps what it left unused.
        s.ended(6, 6 * CYCLE_US + 20_000);
        assert_eq!(s.balance_us.load(Relaxed), -20_000);
    }

    #[test]
    fn what_a_window_left_unused_is_kept_only_from_where_it_opened() {
        // Cycle 3's 50 ms window paid 40 ms of debt, opening 40 ms late; the work before it
        // ended 5 ms in and nothing was launched in it after: 10 ms were left unused, not 45.
        let s = Slot::new(SmWindow { start: 0, len: 50 });
        s.follow_overrun(40_000, 0);
        assert_eq!(s.late_in(3), 40_000);
        s.ended(3, 3 * CYCLE_US + 5_000);
        assert_eq!(s.balance_us.load(Relaxed), -10_000);
    }

    #[test]
    fn a_launch_that_waited_into_a_later_cycle_lets_the_earlier_window_be_measured_first() {
        // A launch let through in the last cycle waited for its place (the work before it)
        // into this one: this cycle neither counts as launched in, nor has its window placed,
        // before the last window's work is measured.
        let s = Slot::new(SmWindow { start: 0, len: 100 });
        let last = realtime_us() / CYCLE_US - 1;
        s.launched_cycle.store(last, Relaxed);
        let work = Work::finished_at(last * CYCLE_US + 60_000);
        assert!(!s.launching(&work));
        assert_eq!(s.launched_cycle.load(Relaxed), last);
        assert_eq!(s.late.load(Relaxed), u64::MAX, "no window placed yet");
        // Waiting measures it (its work ended 60 ms into its window: 40 ms left unused);
        // then the launch goes.
        s.wait(&work);
        assert_eq!(s.measured_cycle.load(Relaxed), last);
        assert_eq!(s.balance_us.load(Relaxed), -40_000);
        assert!(s.launching(&work));
        assert!(s.launched_cycle.load(Relaxed) > last);
    }

    #[test]
    fn a_launch_behind_work_already_finished_is_predicted_once_the_events_are_looked_at() {
        // 60 ms kernels in a 70 ms window, 55 ms of it kept from earlier windows: the one
        // launched 60 ms in fits on them, unless it is counted behind the one the program
        // has just waited for.
        let s = Slot::new(SmWindow { start: 0, len: 70 });
        s.follow_overrun(-55_000, -55_000);
        let work = Work::one_finished_unseen();
        assert!(s.fits_settled(3, 60_000, 0, 60_000, &work));
        assert_eq!(work.queued.load(Relaxed), 1);
        // Behind one still running, it does not.
        let running = Work::one_finished_unseen();
        assert!(!s.fits(4, 60_000, 0, 60_000, running.queued()));
    }

    #[test]
    fn a_launch_longer_than_the_window_goes_alone_at_its_opening_only() {
        let s = Slot::new(SmWindow { start: 0, len: 10 });
        assert!(s.fits(1, 500, 0, 16_000, 1), "at the opening, alone");
        assert!(!s.fits(2, 500, 0, 16_000, 2), "behind another");
        assert!(
            !s.fits(3, 6_000, 0, 16_000, 1),
            "halfway through the window"
        );
        // A window opening late, paying debt, opens later for it too.
        assert!(s.fits(4, 6_500, 6_000, 16_000, 1));
    }

    #[test]
    fn a_cycle_counts_as_launched_in_only_once_a_launch_goes() {
        // A window as long as the cycle is always open.
        let s = Slot::new(SmWindow { start: 0, len: 100 });
        s.wait(&Work::idle());
        assert_eq!(
            s.launched_cycle.load(Relaxed),
            0,
            "waiting launched nothing"
        );
        assert!(s.launching(&Work::idle()));
        let cycle = realtime_us() / CYCLE_US;
        assert!((cycle - 1..=cycle).contains(&s.launched_cycle.load(Relaxed)));
    }

    #[test]
    fn a_launch_waits_for_its_window_and_goes_at_once_inside_it() {
        let s = Slot::new(SmWindow { start: 0, len: 20 });
        for _ in 0..3 {
            s.wait(&Work::idle());
            let t = realtime_us() % CYCLE_US;
            assert!(t < 20_000 + 2_000, "launched at {t} µs into the cycle");
        }
    }
}
