//! The SM share's backstop, outside the container: a container whose processes keep a GPU
//! busier than its slice's share, as the driver measures it ([`crate::sm_time`]), is held
//! (its cgroup frozen) until its average is back within the share, as the kernel's CPU
//! controller holds a cgroup that has used its quota. It holds whatever a process did to get
//! around the interception library's pacing: the driver loaded by its own path, kernels
//! launched from the GPU, its container's count of unfinished launches rewritten.
//!
//! Each slice with a share (`cores` 1–99) keeps a balance of GPU time: it earns its share,
//! plus a tolerance, of the real time, up to a burst, and spends the SM time the driver
//! counted its processes using. Below zero the container is frozen; it is thawed once the
//! balance is back to zero. While a container is frozen the work it already queued on the
//! GPU still runs (and is counted): a kernel is never cut.
//!
//! The driver's count is noisy where several processes are busy: it names one process per
//! period with the whole GPU's figure, the same one for runs of about ten periods. A slice
//! that keeps exactly to its share beside others is then counted its share on average, but
//! its balance wanders like a random walk of one run's length a step, and without a margin
//! would go below a burst of a few seconds within a minute. The tolerance (10 points) gives
//! the balance a drift back to its top, and the burst ([`DEFAULT_BURST`], at least
//! [`BURST_PERIODS`] periods) is deep enough that such a walk does not reach the bottom
//! (`tests.rs`: two slices sharing a busy GPU at their shares for hours, never held). A
//! container that goes around the library is held to its share plus the tolerance, after its
//! burst.
//!
//! The freezer is the cgroup's own: `cgroup.freeze` of the unified hierarchy (on a hybrid
//! host too, where `runc pause` uses the v1 freezer and the two do not undo each other), else
//! the v1 freezer's `freezer.state`. The file is written, never waited on: the kernel
//! freezes the tasks, and a task that holds off freezing cannot stall the agent. Each
//! container is recorded in the agent's state directory before it is frozen, so that an
//! agent that stops, or dies, thaws it (at its next start for one that died). A claim
//! several containers use is held whole: each container's cgroup, and that of one reported
//! while the claim is held, at the next pass.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpuslice_core::Claim;

use crate::backstop::{Cgroups, Procs};
use crate::metrics::SliceLabels;

/// A slice: (container id, GPU uuid).
pub type Slice = (String, String);

/// The burst where none is given: at least 30 seconds of the GPU's time...
pub const DEFAULT_BURST: Duration = Duration::from_secs(30);
/// ...and at least this many of the GPU's sampling periods (the driver names one process per
/// period, in runs of about ten when several are busy: the noise grows with the period).
pub const BURST_PERIODS: u32 = 180;
/// The tolerance where none is given: a slice earns its share and 10 points more.
pub const DEFAULT_TOLERANCE: f64 = 0.1;
/// How often a slice's going over its share is logged, at most.
const ANNOUNCE_EVERY: Duration = Duration::from_secs(60);

/// What the agent does to a container that keeps a GPU busier than its share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareAction {
    /// Log it (its SM time shows it: `gpuslice_slice_sm_seconds_total`).
    Log,
    /// Also freeze the container until its average is back within its share.
    Throttle,
}

impl std::fmt::Display for ShareAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Log => "log",
            Self::Throttle => "throttle",
        })
    }
}

/// How the SM share's backstop runs.
#[derive(Debug, Clone)]
pub struct ShareBackstop {
    pub action: ShareAction,
    /// GPU time a slice may use beyond its share before it is held; `None`: the larger of
    /// [`DEFAULT_BURST`] and [`BURST_PERIODS`] of the GPU's sampling periods.
    pub burst: Option<Duration>,
    /// The share of the GPU's time (0 to 1) a slice may use beyond its own, on average,
    /// before it is held: the driver's count is right over many periods, not in each.
    pub tolerance: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum ThrottleError {
    #[error("failed to {action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a cgroup freezer file")]
    NotAFreezer { path: PathBuf },
}

fn io<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> ThrottleError + 'a {
    move |source| ThrottleError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// Each slice's balance of GPU time, in seconds.
#[derive(Debug, Default)]
pub struct Balances {
    slices: BTreeMap<Slice, (f64, Instant)>,
}

impl Balances {
    /// One pass at `now`. Each slice of `shares` (the share of the GPU it earns, 0 to 1, and
    /// its burst in seconds; slices left out are forgotten) earns that share of the time since
    /// its last pass, up to its burst (a slice starts with its burst), and spends what `used`
    /// says it used now; a debt is kept down to the burst. Returns the slices in debt, with
    /// their balances.
    pub fn pass(
        &mut self,
        shares: &BTreeMap<Slice, (f64, f64)>,
        used: &[(Slice, f64)],
        now: Instant,
    ) -> BTreeMap<Slice, f64> {
        self.slices.retain(|k, _| shares.contains_key(k));
        for (k, &(share, burst)) in shares {
            let (balance, last) = self.slices.entry(k.clone()).or_insert((burst, now));
            let earned = share * now.duration_since(*last).as_secs_f64();
            *balance = (*balance + earned).min(burst);
            *last = now;
        }
        for (k, seconds) in used {
            if let (Some((balance, _)), Some(&(_, burst))) = (self.slices.get_mut(k), shares.get(k))
            {
                *balance = (*balance - seconds).max(-burst);
            }
        }
        self.slices
            .iter()
            .filter(|(_, (b, _))| *b < 0.0)
            .map(|(k, (b, _))| (k.clone(), *b))
            .collect()
    }
}

/// The file that freezes one cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreezeFile(PathBuf);

impl FreezeFile {
    /// What freezes and what thaws, by the file's name.
    fn words(path: &Path) -> Option<(&'static str, &'static str)> {
        match path.file_name()?.to_str()? {
            "cgroup.freeze" => Some(("1", "0")),
            "freezer.state" => Some(("FROZEN", "THAWED")),
            _ => None,
        }
    }

    /// `path`, if it names a freezer file.
    pub fn new(path: PathBuf) -> Result<Self, ThrottleError> {
        if path.is_absolute() && Self::words(&path).is_some() {
            Ok(Self(path))
        } else {
            Err(ThrottleError::NotAFreezer { path })
        }
    }

    #[must_use]
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Whether the cgroup is frozen, or freezing.
    fn is_frozen(&self) -> Result<bool, ThrottleError> {
        let text = std::fs::read_to_string(&self.0).map_err(io("read", &self.0))?;
        Ok(matches!(text.trim(), "1" | "FROZEN" | "FREEZING"))
    }

    fn set(&self, frozen: bool) -> Result<(), ThrottleError> {
        let (freeze, thaw) = Self::words(&self.0).unwrap_or(("1", "0"));
        let word = if frozen { freeze } else { thaw };
        std::fs::OpenOptions::new()
            .write(true)
            .open(&self.0)
            .and_then(|mut f| f.write_all(word.as_bytes()))
            .map_err(io(if frozen { "freeze" } else { "thaw" }, &self.0))
    }

    /// Thaws the cgroup; one that is gone is thawed.
    fn thaw(&self) -> Result<(), ThrottleError> {
        match self.set(false) {
            Err(ThrottleError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                Ok(())
            }
            other => other,
        }
    }
}

/// Where a cgroup hierarchy is mounted: the mount point and the cgroup at its root.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mount {
    point: PathBuf,
    root: String,
}

impl Mount {
    /// Where cgroup `path` of the hierarchy is, under this mount.
    fn dir_of(&self, path: &str) -> Option<PathBuf> {
        let rest = if self.root == "/" {
            path
        } else {
            path.strip_prefix(self.root.as_str())
                .filter(|r| r.is_empty() || r.starts_with('/'))?
        };
        let rest = rest.trim_start_matches('/');
        if rest.split('/').any(|part| part == "..") {
            return None;
        }
        Some(self.point.join(rest))
    }
}

/// Where the hierarchies that can freeze are mounted (each may be mounted several times:
/// a container's own view of its cgroup, the host's under a host-root mount).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hierarchies {
    unified: Vec<Mount>,
    freezer: Vec<Mount>,
}

impl Hierarchies {
    /// Parses a `/proc/<pid>/mountinfo`.
    #[must_use]
    pub fn parse(mountinfo: &str) -> Self {
        let mut found = Self::default();
        for line in mountinfo.lines() {
            let Ok(m) = procfs_core::process::MountInfo::from_line(line) else {
                continue;
            };
            let mount = Mount {
                point: m.mount_point.clone(),
                root: m.root.clone(),
            };
            if m.fs_type == "cgroup2" {
                found.unified.push(mount);
            } else if m.fs_type == "cgroup" && m.super_options.contains_key("freezer") {
                found.freezer.push(mount);
            }
        }
        found
    }

    /// The hierarchies mounted where the agent runs, as the calling thread sees them (the
    /// cgroups of mounts are shown relative to its cgroup namespace).
    #[must_use]
    pub fn of_this_thread() -> Self {
        Self::parse(&std::fs::read_to_string("/proc/thread-self/mountinfo").unwrap_or_default())
    }

    /// The first of `file` in the directory of cgroup `path` under one of `mounts`.
    fn find(mounts: &[Mount], path: &str, file: &str) -> Option<FreezeFile> {
        mounts
            .iter()
            .filter_map(|m| Some(m.dir_of(path)?.join(file)))
            .find(|f| f.exists())
            .map(FreezeFile)
    }

    /// The file that freezes the cgroup of a process with `cgroups`: its unified one's,
    /// where it is in one other than the root and the file is there, else its v1 freezer
    /// cgroup's. None where neither is known, or where the cgroup holds `own` (the agent's:
    /// the agent never freezes itself).
    #[must_use]
    pub fn freeze_file(&self, cgroups: &Cgroups, own: &Cgroups) -> Option<FreezeFile> {
        let below = |path: &str, of: Option<&str>| {
            of.is_some_and(|o| {
                path == "/" || o == path || o.strip_prefix(path).is_some_and(|r| r.starts_with('/'))
            })
        };
        let unified = cgroups
            .unified()
            .filter(|p| !below(p, own.unified()))
            .and_then(|p| Self::find(&self.unified, p, "cgroup.freeze"));
        unified.or_else(|| {
            cgroups
                .v1("freezer")
                .filter(|p| !below(p, own.v1("freezer")))
                .and_then(|p| Self::find(&self.freezer, p, "freezer.state"))
        })
    }
}

/// The containers the agent holds frozen, recorded so that they are thawed whatever
/// becomes of the agent. A claim several containers use is held as one: each of its
/// containers' cgroups is frozen under the claim's id.
#[derive(Debug, Default)]
pub struct Freezer {
    /// Where each claim held is recorded (`<id>` holding its freezer files' paths, a line
    /// each).
    records: Option<PathBuf>,
    frozen: BTreeMap<String, Vec<FreezeFile>>,
    /// Set once the agent stops: nothing is frozen any more.
    stopped: bool,
}

impl Freezer {
    /// Keeps its records in `dir`, first thawing every container a previous agent left
    /// recorded there; returns the ids thawed.
    pub fn open(dir: PathBuf) -> Result<(Self, Vec<String>), ThrottleError> {
        std::fs::create_dir_all(&dir).map_err(io("create", &dir))?;
        let mut thawed = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(io("read", &dir))? {
            let entry = entry.map_err(io("read", &dir))?;
            let record = entry.path();
            let paths = std::fs::read_to_string(&record).map_err(io("read", &record))?;
            let mut all = true;
            for path in paths.lines().map(str::trim).filter(|p| !p.is_empty()) {
                if let Err(e) = FreezeFile::new(PathBuf::from(path)).and_then(|f| f.thaw()) {
                    tracing::warn!("{e}: a container the agent froze may still be");
                    all = false;
                }
            }
            if all {
                thawed.push(entry.file_name().to_string_lossy().into_owned());
            }
            std::fs::remove_file(&record).map_err(io("remove", &record))?;
        }
        Ok((
            Self {
                records: Some(dir),
                ..Self::default()
            },
            thawed,
        ))
    }

    #[must_use]
    pub fn is_held(&self, id: &str) -> bool {
        self.frozen.contains_key(id)
    }

    /// The claims held now.
    pub fn held(&self) -> impl Iterator<Item = &String> {
        self.frozen.keys()
    }

    /// Holds claim `id`: freezes each cgroup of `files` it does not hold yet (a container
    /// that joined the claim since), recorded first. A cgroup frozen already by someone else
    /// (`runc pause`) is left to them. Returns whether the agent holds any of the claim's
    /// cgroups now; an error only where it holds none and one could not be frozen.
    pub fn hold(&mut self, id: &str, files: &[FreezeFile]) -> Result<bool, ThrottleError> {
        if self.stopped {
            return Ok(false);
        }
        let mut held = self.frozen.get(id).cloned().unwrap_or_default();
        let mut new = Vec::new();
        let mut failed = None;
        for f in files {
            if held.contains(f) || new.contains(f) {
                continue;
            }
            // Frozen by the agent for another claim of the same container (two
            // ResourceClaims): held for both, thawed once neither holds it.
            if self.frozen.values().any(|v| v.contains(f)) {
                held.push(f.clone());
                continue;
            }
            match f.is_frozen() {
                Ok(true) => {}
                Ok(false) => new.push(f.clone()),
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        if self.frozen.get(id).map_or(0, Vec::len) < held.len() || !new.is_empty() {
            let all: Vec<FreezeFile> = held.iter().chain(&new).cloned().collect();
            self.record(id, &all)?;
            for f in new {
                match f.set(true) {
                    Ok(()) => held.push(f),
                    Err(e) => failed = failed.or(Some(e)),
                }
            }
            // The record written above names these and more: a failure here leaves a next
            // agent thawing a cgroup that was never frozen, nothing held unrecorded.
            if let Err(e) = self.record(id, &held) {
                tracing::warn!(claim = %id, "{e}");
            }
        }
        if held.is_empty() {
            self.frozen.remove(id);
            return failed.map_or(Ok(false), Err);
        }
        if let Some(e) = failed {
            tracing::warn!(claim = %id, "{e}: a container of the claim is not held");
        }
        self.frozen.insert(id.to_string(), held);
        Ok(true)
    }

    /// Thaws claim `id` if it is held, then forgets it (a cgroup that cannot be thawed stays
    /// held, to be tried again; one another claim holds stays frozen for it).
    pub fn release(&mut self, id: &str) -> Result<(), ThrottleError> {
        let Some(files) = self.frozen.remove(id) else {
            return Ok(());
        };
        let mut failed = None;
        let mut left = Vec::new();
        for f in files {
            if self.frozen.values().any(|v| v.contains(&f)) {
                continue;
            }
            if let Err(e) = f.thaw() {
                failed = failed.or(Some(e));
                left.push(f);
            }
        }
        let recorded = self.record(id, &left);
        if !left.is_empty() {
            self.frozen.insert(id.to_string(), left);
        }
        failed.map_or(recorded, Err)
    }

    /// Records `files` as claim `id`'s frozen cgroups; none: forgets it.
    fn record(&self, id: &str, files: &[FreezeFile]) -> Result<(), ThrottleError> {
        let Some(dir) = &self.records else {
            return Ok(());
        };
        let record = dir.join(id);
        if files.is_empty() {
            let _ = std::fs::remove_file(&record);
            return Ok(());
        }
        let paths: Vec<&[u8]> = files
            .iter()
            .map(|f| f.path().as_os_str().as_encoded_bytes())
            .collect();
        std::fs::write(&record, paths.join(&b"\n"[..])).map_err(io("record", &record))
    }

    /// Thaws every claim held, and holds none from now on.
    pub fn stop(&mut self) {
        self.stopped = true;
        let ids: Vec<String> = self.frozen.keys().cloned().collect();
        for id in ids {
            if let Err(e) = self.release(&id) {
                tracing::error!(container = %id, "{e}");
            }
        }
    }
}

/// What the SM share's backstop keeps from one pass to the next.
#[derive(Debug)]
pub struct Holds {
    cfg: ShareBackstop,
    balances: Balances,
    hierarchies: Hierarchies,
    own: Cgroups,
    /// The slices in debt at the last pass, and when it was.
    in_debt: BTreeSet<Slice>,
    last: Option<Instant>,
    /// When each slice's going over, or the failure to hold its container, was last logged.
    announced: BTreeMap<Slice, Instant>,
}

/// Makes the calling thread, and the threads it starts from then on, see cgroups as the host
/// does: it joins the cgroup namespace `host` (the host's first process's) where its own is
/// another (an agent in a pod has a cgroup namespace of its own, in which other pods'
/// cgroups are not below its root and show as `/../..`, and cannot be found to be frozen).
/// The agent calls it before it starts any thread, so that every cgroup it reads and
/// records is read in the same namespace. Returns whether it joined.
pub fn see_host_cgroups(host: &Path) -> Result<bool, ThrottleError> {
    use std::os::unix::fs::MetadataExt;
    let own = Path::new("/proc/thread-self/ns/cgroup");
    let (h, o) = (
        std::fs::metadata(host).map_err(io("read", host))?,
        std::fs::metadata(own).map_err(io("read", own))?,
    );
    if (h.dev(), h.ino()) == (o.dev(), o.ino()) {
        return Ok(false);
    }
    let ns = std::fs::File::open(host).map_err(io("open", host))?;
    nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWCGROUP)
        .map_err(|e| io("join the cgroup namespace", host)(e.into()))?;
    Ok(true)
}

impl Holds {
    /// What the calling thread needs to hold containers: call it on the thread that will
    /// (which sees cgroups as the host does: [`see_host_cgroups`]).
    #[must_use]
    pub fn new(cfg: ShareBackstop) -> Self {
        Self {
            cfg,
            balances: Balances::default(),
            hierarchies: Hierarchies::of_this_thread(),
            own: Cgroups::parse(
                &std::fs::read_to_string("/proc/thread-self/cgroup").unwrap_or_default(),
            ),
            in_debt: BTreeSet::new(),
            last: None,
            announced: BTreeMap::new(),
        }
    }

    /// One pass, after the SM time pass counted `used` for the slices `measured`
    /// (`period_us`: each GPU's sampling period, where known): holds the containers whose
    /// slices are in debt, releases the others, and counts the time held.
    pub fn pass(
        &mut self,
        s: &crate::dbus::Shared,
        claims: &[Claim],
        procs: &Procs,
        measured: &BTreeSet<Slice>,
        used: &[(Slice, f64)],
        period_us: impl Fn(&str) -> Option<u64>,
    ) {
        let now = Instant::now();
        let since_last = self.last.map_or(Duration::ZERO, |t| now.duration_since(t));
        self.last = Some(now);
        let shares = self.shares(claims, measured, period_us);
        let debts = self.balances.pass(&shares, used, now);
        self.announced
            .retain(|(c, _), _| claims.iter().any(|claim| &claim.container_id == c));
        let mut freezer = s.freezer();
        self.count_time_held(s, &freezer, claims, since_last);
        self.announce_debts(s, claims, &shares, &debts, now);
        self.in_debt = debts.keys().cloned().collect();
        let over: BTreeSet<&String> = match self.cfg.action {
            ShareAction::Log => BTreeSet::new(),
            ShareAction::Throttle => debts.keys().map(|(c, _)| c).collect(),
        };
        let held: Vec<String> = freezer.held().cloned().collect();
        for id in held.iter().filter(|id| !over.contains(id)) {
            if let Err(e) = freezer.release(id) {
                tracing::error!(container = %id, "{e}");
            }
        }
        // Every pass: a container that joined a claim held since is held with it.
        for id in over {
            self.hold(&mut freezer, claims, procs, id, now);
        }
    }

    /// What each measured slice with a share earns (its share and the tolerance) and its
    /// burst, in seconds.
    fn shares(
        &self,
        claims: &[Claim],
        measured: &BTreeSet<Slice>,
        period_us: impl Fn(&str) -> Option<u64>,
    ) -> BTreeMap<Slice, (f64, f64)> {
        let mut shares = BTreeMap::new();
        for c in claims {
            for g in c.gpus.iter().filter(|g| (1..100).contains(&g.cores)) {
                let k = (c.container_id.clone(), g.uuid.clone());
                if !measured.contains(&k) {
                    continue;
                }
                let burst = self.cfg.burst.map_or_else(
                    || {
                        let periods = period_us(&g.uuid).map_or(0.0, |p| {
                            f64::from(BURST_PERIODS) * Duration::from_micros(p).as_secs_f64()
                        });
                        DEFAULT_BURST.as_secs_f64().max(periods)
                    },
                    |b| b.as_secs_f64(),
                );
                let earns = (f64::from(g.cores) / 100.0 + self.cfg.tolerance).min(1.0);
                shares.insert(k, (earns, burst));
            }
        }
        shares
    }

    /// Counts `since_last` as time held to each slice that was in debt at the last pass and
    /// whose container has been held since.
    fn count_time_held(
        &self,
        s: &crate::dbus::Shared,
        freezer: &Freezer,
        claims: &[Claim],
        since_last: Duration,
    ) {
        for (container, uuid) in &self.in_debt {
            if !freezer.is_held(container) {
                continue;
            }
            let gpu = claims
                .iter()
                .find(|c| &c.container_id == container)
                .and_then(|c| c.gpus.iter().find(|g| &g.uuid == uuid))
                .map(|g| g.index.to_string());
            if let Some(gpu) = gpu {
                s.metrics.add_sm_throttled_seconds(
                    SliceLabels {
                        container: container.clone(),
                        gpu,
                        uuid: uuid.clone(),
                    },
                    since_last.as_secs_f64(),
                );
            }
        }
    }

    /// Logs each slice newly in debt, and posts an Event on its pod (at most once per
    /// [`ANNOUNCE_EVERY`]).
    fn announce_debts(
        &mut self,
        s: &crate::dbus::Shared,
        claims: &[Claim],
        shares: &BTreeMap<Slice, (f64, f64)>,
        debts: &BTreeMap<Slice, f64>,
        now: Instant,
    ) {
        for (slice, balance) in debts {
            if self.in_debt.contains(slice) || !self.announce(slice, now) {
                continue;
            }
            let (container, uuid) = slice;
            let (earns, burst) = shares[slice];
            let pod = claims
                .iter()
                .find(|c| &c.container_id == container)
                .and_then(|c| c.pod.as_ref());
            s.post_event(
                pod,
                crate::events::Happening::OverShare {
                    container: crate::events::container_name(pod, container),
                    gpu: uuid.clone(),
                    share: earns,
                    over: -balance,
                    action: self.cfg.action.to_string(),
                },
            );
            tracing::warn!(
                container = %container,
                gpu = %uuid,
                share_and_tolerance = earns,
                "the container used {:.2} s of the GPU's time beyond its share, its tolerance and its burst ({burst:.1} s); {}",
                -balance,
                match self.cfg.action {
                    ShareAction::Log => "logged only (--over-share-action log)",
                    ShareAction::Throttle => "holding it until its average is back within its share",
                }
            );
        }
    }

    /// Freezes the containers of claim `id`, or says why it cannot (at most once per
    /// [`ANNOUNCE_EVERY`]).
    fn hold(
        &mut self,
        freezer: &mut Freezer,
        claims: &[Claim],
        procs: &Procs,
        id: &str,
        now: Instant,
    ) {
        let files = claims
            .iter()
            .find(|c| c.container_id == id)
            .map(|c| self.freeze_files(c, procs))
            .unwrap_or_default();
        let was_held = freezer.is_held(id);
        if files.is_empty() && !was_held {
            self.cannot_hold(id, "its cgroup is not known (a claim never activated with the container's process, or a process in no cgroup of its own)", now);
            return;
        }
        match freezer.hold(id, &files) {
            Ok(true) if !was_held => tracing::debug!(container = %id, "held: over its SM share"),
            Ok(_) => {}
            Err(e) => self.cannot_hold(id, &e.to_string(), now),
        }
    }

    /// Logs why claim `id` cannot be held (at most once per [`ANNOUNCE_EVERY`]).
    fn cannot_hold(&mut self, id: &str, why: &str, now: Instant) {
        if self.announce(&(id.to_string(), "cannot hold".to_string()), now) {
            tracing::warn!(container = %id, "cannot hold the container over its SM share: {why}");
        }
    }

    /// The freezers of claim `c`'s containers: of the cgroups recorded when each was
    /// activated (a claim several containers use has one for each that still runs).
    fn freeze_files(&self, c: &Claim, procs: &Procs) -> Vec<FreezeFile> {
        procs
            .container_cgroups(&c.state)
            .iter()
            .filter_map(|cg| self.hierarchies.freeze_file(cg, &self.own))
            .collect()
    }

    /// Whether to log about `key` now (at most once per [`ANNOUNCE_EVERY`]).
    fn announce(&mut self, key: &Slice, now: Instant) -> bool {
        let due = self
            .announced
            .get(key)
            .is_none_or(|t| now.duration_since(*t) >= ANNOUNCE_EVERY);
        if due {
            self.announced.insert(key.clone(), now);
        }
        due
    }
}

#[cfg(test)]
mod tests;
