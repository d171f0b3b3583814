//! The SM time each slice used, as the driver measures it: NVML's per-process utilization
//! samples (`nvmlDeviceGetProcessUtilization`), given to containers by their processes'
//! cgroups as the backstop gives memory, and summed as seconds of the GPU's time
//! (`gpuslice_slice_sm_seconds_total`). `rate()` of it is the share of the GPU a slice kept
//! busy, to set beside the share it was given (`gpuslice_slice_cores_ratio`).
//!
//! The driver measures utilization in periods of its own (a sixth of a second to a second, by
//! product) and reports each period once it has ended, stamped with its end; each sample's
//! figure is the SM utilization over one period. A sample stands for `figure × period` of SM
//! time. The period is not published: it is taken as the shortest gap between two samples of
//! the GPU (any process's), as the interception library takes it, and samples wait until
//! [`GAPS_BEFORE_CREDIT`] gaps have been seen, so that a first gap spanning idle periods is
//! not taken for the period. A real driver (seen on an H200, driver 580) names one process
//! per period with the whole GPU's figure, the one named varying with how much each ran: a
//! container's seconds are then right over many periods, not in each.
//!
//! The agent polls every `--sm-sample-interval` (100 ms, under the shortest period known):
//! where the driver keeps only its last period's samples, none is missed.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::backstop::{self, Procs, Sample};
use crate::metrics::SliceLabels;

/// Stamps closer than this are one period's (the driver may name several processes for one
/// period with stamps a little apart).
pub const SAME_PERIOD_US: u64 = 10_000;
/// Gaps between samples of a GPU seen before its samples are counted.
pub const GAPS_BEFORE_CREDIT: u32 = 3;
/// How long a pid's container is remembered after its process was last seen.
const RECENT: Duration = Duration::from_secs(60);
/// Samples of one GPU kept waiting for its period; the oldest go first.
const PENDING_MAX: usize = 64;

/// One utilization sample of a GPU, and whose it is where that is known (`owner`: the
/// container of the process it names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UtilSample<K> {
    pub owner: Option<K>,
    /// CPU time of the period's end, in microseconds.
    pub time_stamp_us: u64,
    /// SM utilization over the period, percent.
    pub sm_util: u32,
}

#[derive(Debug)]
struct GpuPeriods<K> {
    /// The latest stamp taken: the driver is asked for samples after it.
    last_seen: u64,
    period_us: Option<u64>,
    gaps: u32,
    pending: Vec<UtilSample<K>>,
}

impl<K> Default for GpuPeriods<K> {
    fn default() -> Self {
        Self {
            last_seen: 0,
            period_us: None,
            gaps: 0,
            pending: Vec::new(),
        }
    }
}

/// Turns each GPU's utilization samples into SM seconds by owner.
#[derive(Debug)]
pub struct Meter<K> {
    gpus: BTreeMap<String, GpuPeriods<K>>,
}

impl<K> Default for Meter<K> {
    fn default() -> Self {
        Self {
            gpus: BTreeMap::new(),
        }
    }
}

impl<K: Ord + Clone> Meter<K> {
    /// The stamp to ask GPU `uuid`'s driver for samples after.
    #[must_use]
    pub fn last_seen(&self, uuid: &str) -> u64 {
        self.gpus.get(uuid).map_or(0, |g| g.last_seen)
    }

    /// The sampling period found for GPU `uuid`, in microseconds, once it is believed.
    #[must_use]
    pub fn period_us(&self, uuid: &str) -> Option<u64> {
        let g = self.gpus.get(uuid)?;
        g.period_us.filter(|_| g.gaps >= GAPS_BEFORE_CREDIT)
    }

    /// Takes what one poll of GPU `uuid` gave (samples already taken are left out) and
    /// returns the SM seconds each owner used in the periods counted now: these samples' and
    /// those that waited for the period to be known.
    pub fn take(&mut self, uuid: &str, mut samples: Vec<UtilSample<K>>) -> BTreeMap<K, f64> {
        let g = self.gpus.entry(uuid.to_string()).or_default();
        samples.retain(|s| s.time_stamp_us > g.last_seen);
        samples.sort_by_key(|s| s.time_stamp_us);
        for s in samples {
            if g.last_seen > 0 {
                let gap = s.time_stamp_us - g.last_seen;
                if gap >= SAME_PERIOD_US {
                    g.period_us = Some(g.period_us.map_or(gap, |p| p.min(gap)));
                    g.gaps = g.gaps.saturating_add(1);
                }
            }
            g.last_seen = s.time_stamp_us;
            if s.owner.is_some() && s.sm_util > 0 {
                g.pending.push(s);
            }
        }
        let mut used = BTreeMap::new();
        match g.period_us {
            Some(period) if g.gaps >= GAPS_BEFORE_CREDIT => {
                let seconds = period as f64 / 1e6;
                for s in g.pending.drain(..) {
                    if let Some(owner) = s.owner {
                        *used.entry(owner).or_insert(0.0) +=
                            f64::from(s.sm_util.min(100)) / 100.0 * seconds;
                    }
                }
            }
            _ => {
                let excess = g.pending.len().saturating_sub(PENDING_MAX);
                g.pending.drain(..excess);
            }
        }
        used
    }

    /// Forgets the GPUs not in `uuids` (no claim holds them any more).
    pub fn keep_only(&mut self, uuids: &[String]) {
        self.gpus.retain(|u, _| uuids.contains(u));
    }
}

/// Gives the driver's per-process SM utilization samples of every claimed GPU to the claims'
/// containers every `every`, counted in `gpuslice_slice_sm_seconds_total`, until the agent
/// exits. A process gone before its sample is read is known from the samples before (pids
/// seen in the last minute, and only while no other process has the pid).
/// The SM share's backstop, `holds`, acts on each pass's count ([`crate::throttle`]).
pub(crate) fn run(
    s: &crate::dbus::Shared,
    library: &std::path::Path,
    every: Duration,
    holds: crate::throttle::ShareBackstop,
) {
    let nvml = match nvml_wrapper::Nvml::builder()
        .lib_path(library.as_os_str())
        .init()
    {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(
                "cannot load NVML to measure the SM time slices use ({e}): gpuslice_slice_sm_seconds_total stays 0"
            );
            return;
        }
    };
    let mut pass = Pass {
        procs: Procs {
            root: s.proc_root.clone(),
        },
        meter: Meter::default(),
        recent: BTreeMap::new(),
        unsupported: BTreeSet::new(),
        holds: crate::throttle::Holds::new(holds),
    };
    loop {
        std::thread::sleep(every);
        pass.once(s, &nvml);
    }
}

/// What one pass of [`run`] keeps for the next.
struct Pass {
    procs: Procs,
    meter: Meter<String>,
    /// Container of each pid attributed lately on each GPU (pid, GPU uuid), and when: a
    /// container given claims on two GPUs has its process's time on each counted to the
    /// claim there.
    recent: BTreeMap<(u32, String), (String, Instant)>,
    /// GPUs whose driver gives no per-process utilization (warned once).
    unsupported: BTreeSet<String>,
    /// The SM share's backstop.
    holds: crate::throttle::Holds,
}

impl Pass {
    fn once(&mut self, s: &crate::dbus::Shared, nvml: &nvml_wrapper::Nvml) {
        let (claims, _) = crate::service::claims_and_gpus(s);
        let gpus: BTreeMap<String, u32> = claims
            .iter()
            .flat_map(|c| c.gpus.iter().map(|g| (g.uuid.clone(), g.index)))
            .collect();
        let uuids: Vec<String> = gpus.keys().cloned().collect();
        self.meter.keep_only(&uuids);
        let mut polled = Vec::new();
        for uuid in &uuids {
            let Ok(device) = nvml.device_by_uuid(uuid.as_str()) else {
                continue;
            };
            match device.process_utilization_stats(self.meter.last_seen(uuid)) {
                Ok(samples) => polled.push((uuid, samples)),
                // No sample since the last: measured, and idle.
                Err(nvml_wrapper::error::NvmlError::NotFound) => polled.push((uuid, Vec::new())),
                Err(e) => {
                    if self.unsupported.insert(uuid.clone()) {
                        tracing::warn!(gpu = %uuid, "the driver gives no per-process SM utilization ({e}): the SM time of this GPU's slices is not measured");
                    }
                }
            }
        }
        let named: Vec<Sample> = polled
            .iter()
            .flat_map(|(uuid, samples)| {
                samples.iter().map(|u| Sample {
                    gpu_uuid: (*uuid).clone(),
                    pid: u.pid,
                    used: 0,
                    graphics_only: false,
                })
            })
            .collect();
        let attributed = if named.is_empty() {
            Vec::new()
        } else {
            let run = s.ledger().run_dir().clone();
            let regions = crate::service::unactivated(&run, &claims);
            backstop::attribute(&claims, &named, &self.procs, &regions)
        };
        let live: Vec<u32> = named
            .iter()
            .map(|n| n.pid)
            .filter(|&pid| self.procs.start_time(pid).is_some())
            .collect();
        remember(
            &mut self.recent,
            &live,
            attributed
                .into_iter()
                .map(|a| ((a.sample.pid, a.sample.gpu_uuid), a.container_id)),
            Instant::now(),
        );
        let measured: BTreeSet<(String, String)> = claims
            .iter()
            .flat_map(|c| {
                c.gpus
                    .iter()
                    .filter(|g| polled.iter().any(|(u, _)| *u == &g.uuid))
                    .map(|g| (c.container_id.clone(), g.uuid.clone()))
            })
            .collect();
        let mut counted = Vec::new();
        for (uuid, samples) in polled {
            let owned = samples
                .iter()
                .map(|u| UtilSample {
                    owner: self
                        .recent
                        .get(&(u.pid, uuid.clone()))
                        .map(|(id, _)| id.clone()),
                    time_stamp_us: u.timestamp,
                    sm_util: u.sm_util,
                })
                .collect();
            for (container, seconds) in self.meter.take(uuid, owned) {
                if measured.contains(&(container.clone(), uuid.clone())) {
                    counted.push(((container.clone(), uuid.clone()), seconds));
                    s.metrics.add_sm_seconds(
                        SliceLabels {
                            container,
                            gpu: gpus[uuid].to_string(),
                            uuid: uuid.clone(),
                        },
                        seconds,
                    );
                }
            }
        }
        let meter = &self.meter;
        self.holds
            .pass(s, &claims, &self.procs, &measured, &counted, |uuid| {
                meter.period_us(uuid)
            });
        s.note_sm_use(&measured, counted);
    }
}

/// How far back `gpuslice status` looks for each slice's share of the GPU's time.
pub const STATUS_WINDOW: Duration = Duration::from_secs(60);

/// The SM time each slice (container, GPU uuid) used over the last [`STATUS_WINDOW`], for
/// `gpuslice status`.
#[derive(Debug, Default)]
pub struct RecentUse {
    slices: BTreeMap<(String, String), Measured>,
}

#[derive(Debug)]
struct Measured {
    /// When the slice's GPU was first measured for it.
    since: Instant,
    /// Seconds counted, and when.
    counted: std::collections::VecDeque<(Instant, f64)>,
}

impl RecentUse {
    /// Records a pass at `now` that measured the GPUs of `measured` (container, GPU uuid; the
    /// slices of claims gone are forgotten) and counted `used` seconds for some of them.
    pub fn note(
        &mut self,
        measured: &BTreeSet<(String, String)>,
        used: impl IntoIterator<Item = ((String, String), f64)>,
        now: Instant,
    ) {
        self.slices.retain(|k, _| measured.contains(k));
        for k in measured {
            self.slices.entry(k.clone()).or_insert_with(|| Measured {
                since: now,
                counted: std::collections::VecDeque::new(),
            });
        }
        for (k, seconds) in used {
            if let Some(m) = self.slices.get_mut(&k) {
                m.counted.push_back((now, seconds));
            }
        }
        for m in self.slices.values_mut() {
            while m
                .counted
                .front()
                .is_some_and(|(t, _)| now.duration_since(*t) > STATUS_WINDOW)
            {
                m.counted.pop_front();
            }
        }
    }

    /// The share of the GPU's time (0 to 1) slice (container, GPU uuid) used over the last
    /// [`STATUS_WINDOW`] to `now`, or since it was first measured if that is later; `None`
    /// where it is not measured, or for under a second yet.
    #[must_use]
    pub fn share(&self, container: &str, uuid: &str, now: Instant) -> Option<f64> {
        let m = self
            .slices
            .get(&(container.to_string(), uuid.to_string()))?;
        let span = now.duration_since(m.since).min(STATUS_WINDOW);
        if span < Duration::from_secs(1) {
            return None;
        }
        let used: f64 = m
            .counted
            .iter()
            .filter(|(t, _)| now.duration_since(*t) <= STATUS_WINDOW)
            // (A sum of no floats is -0.0, which would be shown as "-0%".)
            .fold(0.0, |total, (_, s)| total + s);
        Some((used / span.as_secs_f64()).min(1.0))
    }
}

/// Updates which container each pid named lately on each GPU belongs to: `attributed` as
/// found now, by (pid, GPU uuid); a pid of a `live` process found in no container is
/// nobody's, whoever had it before; a pid whose process is gone keeps its container for
/// [`RECENT`] (its last samples come after it).
fn remember(
    recent: &mut BTreeMap<(u32, String), (String, Instant)>,
    live: &[u32],
    attributed: impl IntoIterator<Item = ((u32, String), String)>,
    now: Instant,
) {
    recent.retain(|(pid, _), (_, seen)| now.duration_since(*seen) < RECENT && !live.contains(pid));
    for (key, id) in attributed {
        recent.insert(key, (id, now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(owner: Option<&'static str>, stamp: u64, util: u32) -> UtilSample<&'static str> {
        UtilSample {
            owner,
            time_stamp_us: stamp,
            sm_util: util,
        }
    }

    const P: u64 = 200_000;

    #[test]
    fn each_sample_counts_its_figure_of_one_period_once_the_period_is_known() {
        let mut m = Meter::default();
        // Four periods in a row, the first after an idle stretch: its gap is not the period.
        assert!(m.take("g", vec![sample(Some("a"), 10 * P, 50)]).is_empty());
        assert!(m.take("g", vec![sample(Some("a"), 15 * P, 50)]).is_empty());
        assert!(m.take("g", vec![sample(Some("b"), 16 * P, 100)]).is_empty());
        let used = m.take("g", vec![sample(Some("a"), 17 * P, 30)]);
        assert_eq!(m.period_us("g"), Some(P));
        assert!(
            (used["a"] - (0.5 + 0.5 + 0.3) * 0.2).abs() < 1e-9,
            "{used:?}"
        );
        assert!((used["b"] - 0.2).abs() < 1e-9, "{used:?}");
        let used = m.take("g", vec![sample(Some("b"), 18 * P, 100)]);
        assert!((used["b"] - 0.2).abs() < 1e-9, "{used:?}");
        assert!(!used.contains_key("a"));
    }

    #[test]
    fn a_sample_given_twice_and_samples_of_one_period_count_once_each() {
        let mut m = Meter::default();
        for k in 1..=4 {
            m.take("g", vec![sample(None, k * P, 100)]);
        }
        // Two processes named for one period, stamps 3 µs apart: no gap of 3 µs is a period.
        let used = m.take(
            "g",
            vec![
                sample(Some("a"), 5 * P, 40),
                sample(Some("b"), 5 * P + 3, 60),
            ],
        );
        assert_eq!(m.period_us("g"), Some(P));
        assert!((used["a"] - 0.08).abs() < 1e-9 && (used["b"] - 0.12).abs() < 1e-9);
        // The same sample again (a driver that answers with what it gave before).
        assert!(m.take("g", vec![sample(Some("a"), 5 * P, 40)]).is_empty());
    }

    #[test]
    fn samples_of_processes_in_no_container_set_the_period_and_count_for_nobody() {
        let mut m = Meter::default();
        let used = m.take(
            "g",
            (1..=5)
                .map(|k| sample(None, k * P, 100))
                .collect::<Vec<_>>(),
        );
        assert!(used.is_empty());
        assert_eq!(m.period_us("g"), Some(P));
        let used = m.take("g", vec![sample(Some("a"), 6 * P, 250)]);
        // A figure above 100% is taken as 100%.
        assert!((used["a"] - 0.2).abs() < 1e-9, "{used:?}");
    }

    #[test]
    fn gpus_are_apart_and_a_gpu_given_up_is_forgotten() {
        let mut m = Meter::default();
        for k in 1..=4 {
            m.take("g", vec![sample(Some("a"), k * P, 10)]);
        }
        assert_eq!(m.period_us("g"), Some(P));
        assert_eq!(m.period_us("h"), None);
        assert_eq!(m.last_seen("h"), 0);
        m.keep_only(&["h".to_string()]);
        assert_eq!(m.last_seen("g"), 0);
    }

    #[test]
    fn a_gone_process_keeps_its_container_for_a_while_and_a_reused_pid_does_not() {
        let t0 = Instant::now();
        let mut recent = BTreeMap::new();
        let on = |pid: u32, gpu: &str| (pid, gpu.to_string());
        remember(
            &mut recent,
            &[10, 11],
            [
                (on(10, "g"), "a".into()),
                (on(10, "h"), "a-h".into()),
                (on(11, "g"), "b".into()),
            ],
            t0,
        );
        // 10 exited; 11 is now a process of the host (in no container).
        remember(&mut recent, &[11], [], t0 + Duration::from_secs(1));
        assert_eq!(
            recent.get(&on(10, "g")).map(|(id, _)| id.as_str()),
            Some("a")
        );
        assert_eq!(
            recent.get(&on(10, "h")).map(|(id, _)| id.as_str()),
            Some("a-h")
        );
        assert!(!recent.contains_key(&on(11, "g")));
        remember(&mut recent, &[], [], t0 + RECENT);
        assert!(recent.is_empty());
    }

    fn slice(id: &str) -> (String, String) {
        (id.to_string(), "g".to_string())
    }

    #[test]
    fn the_share_shown_is_over_the_last_minute_or_since_measuring_began() {
        let t0 = Instant::now();
        let measured: BTreeSet<_> = [slice("a"), slice("b")].into();
        let mut recent = RecentUse::default();
        recent.note(&measured, [], t0);
        assert_eq!(recent.share("a", "g", t0), None, "under a second measured");
        // 3 s in: a used 1.5 s of the GPU's time, b none.
        recent.note(&measured, [(slice("a"), 1.5)], t0 + Duration::from_secs(3));
        let now = t0 + Duration::from_secs(3);
        assert!((recent.share("a", "g", now).unwrap() - 0.5).abs() < 1e-9);
        assert_eq!(recent.share("b", "g", now), Some(0.0));
        assert_eq!(recent.share("c", "g", now), None);
        // Two minutes on, a used 6 s in the last minute; the 1.5 s have left the window.
        recent.note(
            &measured,
            [(slice("a"), 6.0)],
            t0 + Duration::from_secs(120),
        );
        let now = t0 + Duration::from_secs(120);
        assert!((recent.share("a", "g", now).unwrap() - 0.1).abs() < 1e-9);
        // A slice no longer measured (its claim gone) is forgotten.
        recent.note(&[slice("a")].into(), [], now);
        assert_eq!(recent.share("b", "g", now), None);
    }

    #[test]
    fn samples_waiting_for_the_period_are_bounded() {
        let mut m = Meter::default();
        // One sample per poll, all in one period's stamps: no gap, so no period, ever.
        for k in 0..1000 {
            m.take("g", vec![sample(Some("a"), 1_000_000 + k, 100)]);
        }
        assert!(m.gpus["g"].pending.len() <= PENDING_MAX);
    }
}
