//! The container's usage region, mapped shared: this process's slot, the wall check, reaping.
//!
//! The wall without a lock: a process first adds an allocation to its own slot, then sums all
//! slots. Every add and every load is sequentially consistent, so of two processes that reserve
//! at the same time at least one sees the other's reservation; an allocation is kept only if
//! the sum it saw, its own reservation included, is within the limit. So the allocations kept
//! never exceed the limit together. A process that saw an overshoot takes its reservation back
//! and looks again: if the rest now leaves room (another reservation was withdrawn meanwhile),
//! it tries again, a few times, before it reports out of memory.
//!
//! Counters only ever change by the owner's own adds and subtracts (saturating), so usage never
//! underflows; a dead owner's slot is zeroed as a whole by a reaper.
//!
//! A slot belongs to whoever holds its lock ([`SlotLocks`]; in the library an
//! open-file-description lock on the usage file, which the kernel drops when the owner exits
//! or execs). Pids are recorded for reporting only: liveness never depends on a pid, so a
//! process in a nested PID namespace, a reused pid or a zombie cannot keep or lose a slot.

use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering::SeqCst};

use crate::driver_share::DriverShare;
use gpuslice_core::usage::{
    HEADER_HIGH_WATER, HEADER_SIZE, MAGIC, PID_REAPING, SLOT_PID, SLOT_QUEUED, SLOT_SIZE,
    SLOT_START_TIME, SLOT_USED, VERSION, pid_is_owner,
};

/// Attempts before an allocation that keeps meeting other processes' reservations gives up.
const ATTEMPTS: usize = 16;

/// The slots' locks, as this process holds them.
pub trait SlotLocks {
    /// Takes slot `i`'s lock without waiting; false if another live process holds it.
    fn try_lock(&self, i: usize) -> bool;
    /// Lets slot `i`'s lock go.
    fn unlock(&self, i: usize);
}

/// A region in memory shared with the container's other processes.
pub struct Region {
    base: *mut u8,
    len: usize,
    gpus: usize,
    slots: usize,
    /// What the driver holds beyond the counters, as the agent last sampled it.
    share: Option<DriverShare>,
}

// SAFETY: every access to the shared bytes goes through atomics; the pointer itself never
// changes after construction and the mapping lives as long as the Region.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

#[derive(Debug, PartialEq, Eq)]
pub enum RegionError {
    Layout(&'static str),
    NoFreeSlot,
}

impl Region {
    /// # Safety
    /// `base` must point at `len` bytes, aligned to 8, that stay mapped for the Region's life
    /// and are only accessed through this module's atomics (in this and other processes).
    pub unsafe fn new(base: *mut u8, len: usize) -> Result<Self, RegionError> {
        if len < HEADER_SIZE || !(base as usize).is_multiple_of(8) {
            return Err(RegionError::Layout("shorter than its header"));
        }
        // SAFETY: `base` points at at least HEADER_SIZE readable bytes (checked above).
        let header = unsafe { std::slice::from_raw_parts(base, HEADER_SIZE) };
        if &header[0..8] != MAGIC {
            return Err(RegionError::Layout("bad magic"));
        }
        let word = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().unwrap_or([0; 4]));
        if word(8) != VERSION {
            return Err(RegionError::Layout("unknown version"));
        }
        let gpus = word(12) as usize;
        let slots = word(16) as usize;
        if word(20) as usize != SLOT_SIZE || gpus > gpuslice_core::usage::MAX_GPUS {
            return Err(RegionError::Layout("inconsistent header"));
        }
        if len < HEADER_SIZE + slots * SLOT_SIZE {
            return Err(RegionError::Layout("shorter than its slots"));
        }
        Ok(Self {
            base,
            len,
            gpus,
            slots,
            share: None,
        })
    }

    /// Adds what the driver holds beyond the counters to every total.
    #[must_use]
    pub fn with_driver_share(mut self, share: Option<DriverShare>) -> Self {
        self.share = share;
        self
    }

    pub fn gpus(&self) -> usize {
        self.gpus
    }

    /// What the driver holds beyond the counters, where the agent publishes it.
    pub fn driver_share(&self) -> Option<&DriverShare> {
        self.share.as_ref()
    }

    pub fn slots(&self) -> usize {
        self.slots
    }

    fn u32_at(&self, at: usize) -> &AtomicU32 {
        debug_assert!(at + 4 <= self.len && at.is_multiple_of(4));
        // SAFETY: `at` is inside the mapping and 4-aligned (slot and field offsets are multiples
        // of 8 from an 8-aligned base); the bytes are only accessed atomically.
        unsafe { AtomicU32::from_ptr(self.base.add(at).cast()) }
    }

    fn u16_at(&self, at: usize) -> &AtomicU16 {
        debug_assert!(at + 2 <= self.len && at.is_multiple_of(2));
        // SAFETY: as in u32_at, with 2-byte alignment.
        unsafe { AtomicU16::from_ptr(self.base.add(at).cast()) }
    }

    fn u64_at(&self, at: usize) -> &AtomicU64 {
        debug_assert!(at + 8 <= self.len && at.is_multiple_of(8));
        // SAFETY: as in u32_at, with 8-byte alignment.
        unsafe { AtomicU64::from_ptr(self.base.add(at).cast()) }
    }

    fn slot(&self, i: usize) -> usize {
        HEADER_SIZE + i * SLOT_SIZE
    }

    fn pid(&self, i: usize) -> &AtomicU32 {
        self.u32_at(self.slot(i) + SLOT_PID)
    }

    fn start(&self, i: usize) -> &AtomicU64 {
        self.u64_at(self.slot(i) + SLOT_START_TIME)
    }

    fn used(&self, i: usize, gpu: usize) -> &AtomicU64 {
        self.u64_at(self.slot(i) + SLOT_USED + 8 * gpu)
    }

    fn queued(&self, i: usize, gpu: usize) -> &AtomicU16 {
        self.u16_at(self.slot(i) + SLOT_QUEUED + 2 * gpu)
    }

    fn high_water(&self) -> usize {
        (self.u32_at(HEADER_HIGH_WATER).load(SeqCst) as usize).min(self.slots)
    }

    /// Takes a slot for `pid`: the first whose lock can be had, free or left by a dead owner
    /// (whose counters are wiped first).
    pub fn claim(
        &self,
        pid: u32,
        start_time: u64,
        locks: &impl SlotLocks,
    ) -> Result<usize, RegionError> {
        for i in 0..self.slots {
            if !locks.try_lock(i) {
                continue;
            }
            if self.pid(i).load(SeqCst) != 0 {
                self.wipe(i);
            }
            self.start(i).store(start_time, SeqCst);
            self.pid(i).store(pid.max(1) & !PID_REAPING, SeqCst);
            self.u32_at(HEADER_HIGH_WATER)
                .fetch_max(u32::try_from(i + 1).unwrap_or(u32::MAX), SeqCst);
            return Ok(i);
        }
        Err(RegionError::NoFreeSlot)
    }

    /// Whether slot `i` still shows this process's pid (nothing else can take it while its
    /// lock is held; a tenant rewriting the region can).
    pub fn owns(&self, i: usize, pid: u32) -> bool {
        self.pid(i).load(SeqCst) == pid.max(1) & !PID_REAPING
    }

    /// Bytes held on `gpu` by all live slots, with what the driver holds beyond their
    /// counters (each slot's extra while its owner is the one it was sampled for, and what
    /// processes without a slot hold).
    pub fn total(&self, gpu: usize) -> u64 {
        let share = self.share.as_ref();
        (0..self.high_water())
            .filter(|&i| pid_is_owner(self.pid(i).load(SeqCst)))
            .fold(share.map_or(0, |s| s.unattributed(gpu)), |acc, i| {
                let extra = share.map_or(0, |s| s.extra(i, self.start(i).load(SeqCst), gpu));
                acc.saturating_add(self.used(i, gpu).load(SeqCst))
                    .saturating_add(extra)
            })
    }

    /// Adds `bytes` on `gpu` to slot `mine` if the container stays within `limit`.
    pub fn charge(
        &self,
        mine: usize,
        gpu: usize,
        bytes: u64,
        limit: u64,
        locks: &impl SlotLocks,
    ) -> bool {
        if bytes == 0 {
            return true;
        }
        if bytes > limit || gpu >= self.gpus {
            return false;
        }
        let counter = self.used(mine, gpu);
        let mut reaped = false;
        for _ in 0..ATTEMPTS {
            counter.fetch_add(bytes, SeqCst);
            if self.total(gpu) <= limit {
                return true;
            }
            self.sub(mine, gpu, bytes);
            if self.total(gpu).saturating_add(bytes) > limit {
                if reaped {
                    return false;
                }
                reaped = true;
                if self.reap(Some(mine), locks) == 0 {
                    return false;
                }
            }
            std::thread::yield_now();
        }
        false
    }

    /// Takes `bytes` on `gpu` back from slot `mine`, never below zero.
    pub fn refund(&self, mine: usize, gpu: usize, bytes: u64) {
        if gpu < self.gpus {
            self.sub(mine, gpu, bytes);
        }
    }

    fn sub(&self, i: usize, gpu: usize, bytes: u64) {
        let _ = self
            .used(i, gpu)
            .fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(bytes)));
    }

    /// Launches on `gpu` let through and not seen finished, by all live slots.
    pub fn queued_total(&self, gpu: usize) -> u64 {
        (0..self.high_water())
            .filter(|&i| pid_is_owner(self.pid(i).load(SeqCst)))
            .map(|i| u64::from(self.queued(i, gpu).load(SeqCst)))
            .sum()
    }

    /// Counts one more launch queued on `gpu` in slot `mine` if the container's stay at most
    /// `most`; as with [`Region::charge`], of two processes adding at once at least one sees
    /// the other's, so the places kept never exceed `most` together.
    pub fn take_queued(&self, mine: usize, gpu: usize, most: u64) -> bool {
        if gpu >= self.gpus {
            return true;
        }
        let counter = self.queued(mine, gpu);
        if counter.fetch_add(1, SeqCst) == u16::MAX {
            // Wrapped (a tenant wrote its own slot): as full as it can be.
            counter.store(u16::MAX, SeqCst);
            return false;
        }
        if self.queued_total(gpu) <= most {
            return true;
        }
        self.give_queued(mine, gpu);
        false
    }

    /// One launch of slot `mine` on `gpu` finished (or never went), never below zero.
    pub fn give_queued(&self, mine: usize, gpu: usize) {
        if gpu < self.gpus {
            let _ = self
                .queued(mine, gpu)
                .fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(1)));
        }
    }

    /// Gives slot `mine` back (the process is exiting).
    pub fn release(&self, mine: usize, locks: &impl SlotLocks) {
        self.wipe(mine);
        locks.unlock(mine);
    }

    /// Zeroes a slot's counters before freeing it, so that it never counts twice.
    fn wipe(&self, i: usize) {
        for g in 0..self.gpus {
            self.used(i, g).store(0, SeqCst);
            self.queued(i, g).store(0, SeqCst);
        }
        self.start(i).store(0, SeqCst);
        self.pid(i).store(0, SeqCst);
    }

    /// The processes holding a slot (the container's processes that use the driver), as NVML
    /// names them: by the host pid the agent found for the slot's owner, else (no agent, or
    /// not sampled yet) by the pid the slot records.
    pub fn pids(&self) -> Vec<u32> {
        (0..self.high_water())
            .filter_map(|i| {
                let p = self.pid(i).load(SeqCst);
                if p == 0 || p & PID_REAPING != 0 {
                    return None;
                }
                let host = self
                    .share
                    .as_ref()
                    .and_then(|s| s.host_pid(i, self.start(i).load(SeqCst)));
                Some(host.unwrap_or(p))
            })
            .collect()
    }

    /// Frees the slots of dead processes (those whose lock can be had), other than `mine`.
    /// Returns how many slots were freed.
    pub fn reap(&self, mine: Option<usize>, locks: &impl SlotLocks) -> usize {
        let mut freed = 0;
        for i in 0..self.high_water() {
            if Some(i) == mine || self.pid(i).load(SeqCst) == 0 || !locks.try_lock(i) {
                continue;
            }
            // The owner is gone (or a reaper died half-way): this process holds the lock now.
            if self.pid(i).load(SeqCst) != 0 {
                self.wipe(i);
                freed += 1;
            }
            locks.unlock(i);
        }
        freed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    /// Slot locks shared by simulated processes: slot → owner.
    #[derive(Clone, Default)]
    struct Table(Arc<Mutex<HashMap<usize, u32>>>);

    /// One simulated process's view of the locks.
    struct Locks {
        table: Table,
        me: u32,
    }

    impl Table {
        fn process(&self, me: u32) -> Locks {
            Locks {
                table: self.clone(),
                me,
            }
        }
        /// The kernel dropping a process's locks when it exits.
        fn exit(&self, who: u32) {
            self.0.lock().unwrap().retain(|_, o| *o != who);
        }
    }

    impl SlotLocks for Locks {
        fn try_lock(&self, i: usize) -> bool {
            let mut t = self.table.0.lock().unwrap();
            match t.get(&i) {
                Some(o) if *o != self.me => false,
                _ => {
                    t.insert(i, self.me);
                    true
                }
            }
        }
        fn unlock(&self, i: usize) {
            let mut t = self.table.0.lock().unwrap();
            if t.get(&i) == Some(&self.me) {
                t.remove(&i);
            }
        }
    }

    fn region(gpus: usize, slots: usize) -> (Vec<u64>, Region) {
        let bytes = gpuslice_core::usage::new_region(gpus, slots);
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        // SAFETY: words has at least bytes.len() bytes; u64 storage is 8-aligned.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), words.as_mut_ptr().cast(), bytes.len())
        };
        // SAFETY: the Vec outlives the Region in each test (returned together, dropped after).
        let r = unsafe { Region::new(words.as_mut_ptr().cast(), bytes.len()) }.unwrap();
        (words, r)
    }

    #[test]
    fn charges_stop_at_the_exact_limit_across_slots() {
        let (_m, r) = region(1, 4);
        let t = Table::default();
        let (pa, pb) = (t.process(10), t.process(11));
        let a = r.claim(10, 1, &pa).unwrap();
        let b = r.claim(11, 2, &pb).unwrap();
        assert_ne!(a, b);
        assert!(r.charge(a, 0, 600, 1000, &pa));
        assert!(!r.charge(b, 0, 401, 1000, &pb));
        assert!(r.charge(b, 0, 400, 1000, &pb));
        assert_eq!(r.total(0), 1000);
        r.refund(a, 0, 600);
        assert_eq!(r.total(0), 400);
    }

    #[test]
    fn refunds_never_take_a_counter_below_zero() {
        let (_m, r) = region(1, 2);
        let t = Table::default();
        let p = t.process(10);
        let a = r.claim(10, 1, &p).unwrap();
        assert!(r.charge(a, 0, 5, 100, &p));
        r.refund(a, 0, 50);
        r.refund(a, 0, 50);
        assert_eq!(r.total(0), 0);
    }

    #[test]
    fn a_dead_process_slot_is_reaped_when_its_memory_is_needed() {
        let (_m, r) = region(1, 2);
        let t = Table::default();
        let (pa, pb) = (t.process(10), t.process(11));
        let a = r.claim(10, 1, &pa).unwrap();
        let b = r.claim(11, 2, &pb).unwrap();
        assert!(r.charge(a, 0, 900, 1000, &pa));
        assert!(
            !r.charge(b, 0, 1000, 1000, &pb),
            "a live owner keeps its memory"
        );
        t.exit(10);
        assert!(r.charge(b, 0, 1000, 1000, &pb));
        assert_eq!(r.total(0), 1000);
    }

    #[test]
    fn a_live_owner_keeps_its_slot_whatever_pid_the_others_see() {
        // Two processes of different PID namespaces with the same pid, and a reused pid: the
        // slot stays with the live owner and only a dead one's is freed.
        let (_m, r) = region(1, 4);
        let t = Table::default();
        let (first, second) = (t.process(100), t.process(200));
        let a = r.claim(1, 5, &first).unwrap();
        let b = r.claim(1, 9, &second).unwrap();
        assert_ne!(a, b);
        assert!(r.charge(a, 0, 300, 1000, &first));
        assert!(r.charge(b, 0, 300, 1000, &second));
        assert_eq!(r.reap(Some(b), &second), 0, "nothing is dead");
        assert_eq!(r.total(0), 600);
        t.exit(100);
        assert_eq!(r.reap(Some(b), &second), 1);
        assert_eq!(r.total(0), 300);
    }

    #[test]
    fn a_slot_left_by_a_dead_reaper_or_owner_is_wiped_before_reuse() {
        let (_m, r) = region(1, 2);
        let t = Table::default();
        let p = t.process(10);
        let a = r.claim(10, 1, &p).unwrap();
        r.used(a, 0).store(300, SeqCst);
        r.pid(a).store(PID_REAPING | 12, SeqCst);
        assert_eq!(r.total(0), 0, "a slot being reaped does not count");
        t.exit(10);
        let q = t.process(11);
        let b = r.claim(11, 2, &q).unwrap();
        assert_eq!(b, a, "the dead slot is taken again");
        assert_eq!(r.used(b, 0).load(SeqCst), 0);
        assert_eq!(r.pid(b).load(SeqCst), 11);
    }

    #[test]
    fn concurrent_chargers_never_exceed_the_limit_together() {
        let (_m, r) = region(1, 16);
        let t = Table::default();
        let limit = 1_000_003u64;
        let kept = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            for p in 1..=8u32 {
                let (r, t, kept) = (&r, &t, &kept);
                s.spawn(move || {
                    let locks = t.process(p);
                    let mine = r.claim(p, u64::from(p), &locks).unwrap();
                    for _ in 0..5000 {
                        // Counters may hold other threads' tentative reservations for a
                        // moment; what is kept never exceeds the limit.
                        if r.charge(mine, 0, 997, limit, &locks) {
                            assert!(kept.fetch_add(997, SeqCst) + 997 <= limit);
                        }
                    }
                });
            }
        });
        assert!(kept.load(SeqCst) <= limit);
        assert_eq!(kept.load(SeqCst), r.total(0));
        assert!(
            limit - kept.load(SeqCst) < 997,
            "the limit is filled, not left half empty"
        );
    }

    #[test]
    fn processes_taking_queue_places_at_once_never_hold_more_than_the_container_may() {
        let (_m, r) = region(2, 16);
        let t = Table::default();
        let held = std::sync::atomic::AtomicU64::new(0);
        let most_seen = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            for p in 1..=8u32 {
                let (r, t, held, most_seen) = (&r, &t, &held, &most_seen);
                s.spawn(move || {
                    let locks = t.process(p);
                    let mine = r.claim(p, u64::from(p), &locks).unwrap();
                    for _ in 0..20_000 {
                        if r.take_queued(mine, 1, 3) {
                            most_seen.fetch_max(held.fetch_add(1, SeqCst) + 1, SeqCst);
                            // Held a while, as a launch holds one until it has run.
                            for _ in 0..20 {
                                std::thread::yield_now();
                            }
                            held.fetch_sub(1, SeqCst);
                            r.give_queued(mine, 1);
                        }
                    }
                });
            }
        });
        let most = most_seen.load(SeqCst);
        assert!(most <= 3, "{most} places held at once");
        assert_eq!(r.queued_total(1), 0, "every place was given back");
        assert_eq!(r.queued_total(0), 0, "the other GPU's places are its own");
    }

    #[test]
    fn a_dead_process_queue_places_go_with_its_slot_and_a_count_never_goes_below_zero() {
        let (_m, r) = region(1, 2);
        let t = Table::default();
        let (pa, pb) = (t.process(10), t.process(11));
        let a = r.claim(10, 1, &pa).unwrap();
        let b = r.claim(11, 2, &pb).unwrap();
        for _ in 0..3 {
            assert!(r.take_queued(a, 0, 3));
        }
        assert!(
            !r.take_queued(b, 0, 3),
            "the container's places are all held"
        );
        r.give_queued(b, 0);
        assert_eq!(r.queued_total(0), 3, "a place not taken is not given back");
        t.exit(10);
        assert_eq!(r.reap(Some(b), &pb), 1);
        assert!(r.take_queued(b, 0, 3));
        assert_eq!(r.queued_total(0), 1);
    }

    #[test]
    fn a_queue_count_a_tenant_rewrote_to_its_highest_never_wraps_and_goes_with_its_slot() {
        let (_m, r) = region(1, 2);
        let t = Table::default();
        let (pa, pb) = (t.process(10), t.process(11));
        let a = r.claim(10, 1, &pa).unwrap();
        let b = r.claim(11, 2, &pb).unwrap();
        // A process of the container writes its own slot's count (the region is the
        // container's to write): its highest, then one below it.
        r.queued(a, 0).store(u16::MAX, SeqCst);
        assert!(!r.take_queued(a, 0, 8), "a full count takes no place");
        assert_eq!(
            r.queued(a, 0).load(SeqCst),
            u16::MAX,
            "and does not wrap to 0"
        );
        r.queued(a, 0).store(u16::MAX - 1, SeqCst);
        assert!(!r.take_queued(a, 0, 8));
        assert!(!r.take_queued(a, 0, 8));
        assert_eq!(
            r.queued(a, 0).load(SeqCst),
            u16::MAX - 1,
            "refused places are given back"
        );
        // The container's other processes wait (only the container that wrote it), until the
        // writer exits and its slot is reaped.
        assert!(!r.take_queued(b, 0, 8));
        assert_eq!(
            r.queued(b, 0).load(SeqCst),
            0,
            "a refused place is given back"
        );
        t.exit(10);
        assert_eq!(r.reap(Some(b), &pb), 1);
        assert!(r.take_queued(b, 0, 8));
        assert_eq!(r.queued_total(0), 1);
    }
}
