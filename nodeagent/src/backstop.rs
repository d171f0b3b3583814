//! The enforcement backstop: what the driver says each process holds, against each
//! container's slice, whatever the process did to avoid the interception library (a static
//! binary, raw ioctls, the real driver loaded by its own path). Every interval the agent asks
//! NVML for the processes on each GPU and the device memory each holds, finds each process's
//! container by its cgroups (the cgroups of the process the container was activated with),
//! and acts on a container whose processes together hold more than its slice plus a stated
//! tolerance: it logs and counts, with `kill` it SIGKILLs the newest of them, and with `stop`
//! it SIGKILLs the container's first process (its PID namespace's init), which ends the whole
//! container (of a slice several containers use, each of them holding memory on that GPU).

use std::collections::BTreeMap;
use std::path::PathBuf;

use gpuslice_core::{Claim, ClaimState, Reported};

/// What the agent does to a container over its slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Log it, count it and announce it.
    Log,
    /// Also SIGKILL the container's newest process holding memory on that GPU.
    Kill,
    /// Also SIGKILL the container's first process (of a claim several containers use, that
    /// of each one holding memory on that GPU): the kernel ends every process of its PID
    /// namespace with it, and the runtime reports the container stopped.
    Stop,
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Log => "log",
            Self::Kill => "kill",
            Self::Stop => "stop",
        })
    }
}

/// One process's device memory on one GPU, as the driver reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub gpu_uuid: String,
    pub pid: u32,
    pub used: u64,
    /// Listed among the graphics processes alone (OpenGL, Vulkan): a process that made no
    /// CUDA context, so no slot of the usage region counts its memory.
    pub graphics_only: bool,
}

/// A container over its slice on one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub container_id: String,
    pub gpu_uuid: String,
    pub used: u64,
    pub limit: u64,
    /// The container's processes on that GPU, newest last (by start time).
    pub pids: Vec<u32>,
}

/// A process's cgroup memberships, one `hierarchy-id:controllers:path` line each, as
/// `/proc/<pid>/cgroup` lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroups(Vec<(String, String)>);

impl Cgroups {
    /// Parses `/proc/<pid>/cgroup`.
    #[must_use]
    pub fn parse(text: &str) -> Self {
        Self(
            text.lines()
                .filter_map(|l| {
                    let (hierarchy, path) = l.rsplit_once(':')?;
                    Some((hierarchy.to_string(), path.to_string()))
                })
                .collect(),
        )
    }

    /// Whether every membership is the root cgroup: such a process is in no container, and
    /// every process of the host would look like one of its own.
    #[must_use]
    pub fn is_root(&self) -> bool {
        self.0.iter().all(|(_, p)| p == "/")
    }

    /// The cgroup in the unified (v2) hierarchy, where the process is in one.
    #[must_use]
    pub fn unified(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|(h, _)| h == "0:")
            .map(|(_, p)| p.as_str())
    }

    /// The cgroup in the v1 hierarchy that `controller` is attached to, where there is one.
    #[must_use]
    pub fn v1(&self, controller: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(h, _)| {
                h.split_once(':')
                    .is_some_and(|(_, names)| names.split(',').any(|n| n == controller))
            })
            .map(|(_, p)| p.as_str())
    }

    /// Whether a process with these cgroups is inside the container whose first process has
    /// `container`'s: in the same cgroup or below it in every hierarchy the container names.
    #[must_use]
    pub fn within(&self, container: &Cgroups) -> bool {
        container.0.iter().all(|(hierarchy, base)| {
            self.0.iter().any(|(h, p)| {
                h == hierarchy
                    && (p == base
                        || base == "/"
                        || p.strip_prefix(base.as_str())
                            .is_some_and(|rest| rest.starts_with('/')))
            })
        })
    }
}

/// How the backstop reads processes: from a `/proc`.
pub struct Procs {
    pub root: PathBuf,
}

impl Procs {
    /// The cgroups of each container a claim in `state` was activated for, the last reported
    /// first, while its process runs (the same pid and start time): those recorded when it
    /// was reported, or for one recorded without them (by an older agent), its process's now.
    /// A process gone, or one in the root cgroups (in no container), gives none.
    #[must_use]
    pub fn container_cgroups(&self, state: &ClaimState) -> Vec<Cgroups> {
        self.containers(state)
            .into_iter()
            .map(|(_, cg)| cg)
            .collect()
    }

    /// As [`Self::container_cgroups`], each with the process the container was reported with.
    #[must_use]
    pub fn containers(&self, state: &ClaimState) -> Vec<(Reported, Cgroups)> {
        state
            .reported()
            .into_iter()
            .filter_map(|r| {
                if self.start_time(r.pid) != Some(r.start_time) {
                    return None;
                }
                let cg = match &r.cgroups {
                    Some(text) => Cgroups::parse(text),
                    None => self.cgroups(r.pid)?,
                };
                (!cg.is_root()).then_some((r, cg))
            })
            .collect()
    }

    /// The processes reported for the containers of a claim in `state` that hold any of
    /// `pids` (their processes on a GPU): the containers to stop for what those hold. Where
    /// none of them can be told (each process gone or moved out), the last reported that
    /// still runs.
    #[must_use]
    pub fn containers_holding(&self, state: &ClaimState, pids: &[u32]) -> Vec<Reported> {
        let containers = self.containers(state);
        let inside: Vec<Cgroups> = pids.iter().filter_map(|&p| self.cgroups(p)).collect();
        let holding: Vec<Reported> = containers
            .iter()
            .filter(|(_, cg)| inside.iter().any(|p| p.within(cg)))
            .map(|(r, _)| r.clone())
            .collect();
        if holding.is_empty() {
            containers.into_iter().map(|(r, _)| r).take(1).collect()
        } else {
            holding
        }
    }

    #[must_use]
    pub fn cgroups(&self, pid: u32) -> Option<Cgroups> {
        let text = std::fs::read_to_string(self.root.join(pid.to_string()).join("cgroup")).ok()?;
        Some(Cgroups::parse(&text))
    }

    #[must_use]
    pub fn start_time(&self, pid: u32) -> Option<u64> {
        crate::gc::process_start_time(&self.root, pid)
    }

    /// The process's memory mappings (`/proc/<pid>/maps`).
    #[must_use]
    pub fn maps(&self, pid: u32) -> Option<String> {
        std::fs::read_to_string(self.root.join(pid.to_string()).join("maps")).ok()
    }

    /// The process's pid in its innermost PID namespace (the last `NSpid` field), as the
    /// process itself sees it.
    #[must_use]
    pub fn ns_pid(&self, pid: u32) -> Option<u32> {
        let status =
            std::fs::read_to_string(self.root.join(pid.to_string()).join("status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|rest| rest.split_whitespace().last())
            .and_then(|p| p.parse().ok())
            .or(Some(pid))
    }
}

/// What the driver says each process holds on each of the GPUs `uuids`: every process it
/// lists, compute (with a CUDA context), graphics (OpenGL, Vulkan: memory no CUDA call shows)
/// and MPS clients alike. A process in several lists (a program using CUDA and Vulkan) is
/// listed with its one figure in each, and counted once, at the largest.
#[must_use]
pub fn sample(nvml: &nvml_wrapper::Nvml, uuids: &[String]) -> Vec<Sample> {
    let mut samples = Vec::new();
    for uuid in uuids {
        let Ok(device) = nvml.device_by_uuid(uuid.as_str()) else {
            continue;
        };
        // Per pid: the most any list gives it, and whether only the graphics list has it.
        let mut held: std::collections::BTreeMap<u32, (u64, bool)> =
            std::collections::BTreeMap::new();
        let listed = [
            (device.running_compute_processes(), false),
            (device.running_graphics_processes(), true),
            (device.mps_running_compute_processes(), false),
        ];
        for (list, graphics) in listed {
            for p in list.unwrap_or_default() {
                if let nvml_wrapper::enums::device::UsedGpuMemory::Used(used) = p.used_gpu_memory {
                    let (most, graphics_only) = held.entry(p.pid).or_insert((0, true));
                    *most = (*most).max(used);
                    *graphics_only &= graphics;
                }
            }
        }
        samples.extend(held.into_iter().map(|(pid, (used, graphics_only))| Sample {
            gpu_uuid: uuid.clone(),
            pid,
            used,
            graphics_only,
        }));
    }
    samples
}

/// What one container holds on one GPU, as the driver's samples say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    pub bytes: u64,
    /// Its processes there, as (start time, pid).
    pub pids: Vec<(u64, u32)>,
    /// Its wall there, where its processes were found by their cgroups: what all its claims
    /// give it on that GPU (two claims on one card add up). None: its claim's own.
    pub wall: Option<u64>,
}

/// One sample given to the container whose processes it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributed {
    pub container_id: String,
    pub sample: Sample,
    /// The process's start time (0 when it is gone).
    pub start_time: u64,
    /// What the process's container may hold on the sample's GPU, where it was found by its
    /// cgroups: the memory every claim of the container gives it there (two claims on one
    /// card add up), 0 where none has a slice there.
    pub wall: Option<u64>,
}

/// A file as `/proc/<pid>/maps` names it: device (major, minor) and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    pub major: u32,
    pub minor: u32,
    pub inode: u64,
}

impl FileId {
    /// The identity of the file at `path` (not following a link).
    #[must_use]
    pub fn of(path: &std::path::Path) -> Option<Self> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::symlink_metadata(path).ok()?;
        m.is_file().then(|| Self {
            major: libc::major(m.dev()),
            minor: libc::minor(m.dev()),
            inode: m.ino(),
        })
    }

    /// Whether a `/proc/<pid>/maps` text maps this file.
    #[must_use]
    pub fn mapped_in(&self, maps: &str) -> bool {
        maps.lines().any(|l| {
            let mut f = l.split_whitespace();
            let (Some(dev), Some(inode)) = (f.nth(3), f.next()) else {
                return false;
            };
            let Some((major, minor)) = dev.split_once(':') else {
                return false;
            };
            u32::from_str_radix(major, 16).ok() == Some(self.major)
                && u32::from_str_radix(minor, 16).ok() == Some(self.minor)
                && inode.parse::<u64>().ok() == Some(self.inode)
        })
    }
}

/// Gives each sample to the active claim whose container holds the process (by cgroups; of
/// a container given several claims, the one with a slice on the sample's GPU), else to a
/// claim never activated (a DRA or CLI claim, whose containers the agent does not know)
/// whose usage region the process has mapped (`regions`: each such claim's region); other
/// samples are left out.
#[must_use]
pub fn attribute(
    claims: &[Claim],
    samples: &[Sample],
    procs: &Procs,
    regions: &[(String, FileId)],
) -> Vec<Attributed> {
    // The cgroups of each running container, recorded when it was activated (its process
    // still the same: same start time); a claim several containers use has several.
    let containers: Vec<(&Claim, Vec<Cgroups>)> = claims
        .iter()
        .map(|c| (c, procs.container_cgroups(&c.state)))
        .filter(|(_, cgroups)| !cgroups.is_empty())
        .collect();
    samples
        .iter()
        .filter_map(|s| {
            let cg = procs.cgroups(s.pid)?;
            let theirs: Vec<&Claim> = containers
                .iter()
                .filter(|(_, cgroups)| cgroups.iter().any(|c| cg.within(c)))
                .map(|(claim, _)| *claim)
                .collect();
            let on_gpu = |c: &&&Claim| c.gpus.iter().any(|g| g.uuid == s.gpu_uuid);
            // A container given several claims (ResourceClaims of slices on different GPUs):
            // the one whose slice is on the sample's GPU, the first by name where several are
            // (as the interception library charges it).
            let by_cgroup = theirs
                .first()
                .map(|first| theirs.iter().find(on_gpu).unwrap_or(first))
                .map(|claim| claim.container_id.clone());
            // Its wall there: what all of them give it on that GPU.
            let wall = by_cgroup.as_ref().map(|_| {
                theirs
                    .iter()
                    .flat_map(|c| c.gpus.iter())
                    .filter(|g| g.uuid == s.gpu_uuid)
                    .fold(0u64, |sum, g| sum.saturating_add(g.memory_bytes))
            });
            let id = by_cgroup.or_else(|| {
                if regions.is_empty() {
                    return None;
                }
                let maps = procs.maps(s.pid)?;
                regions
                    .iter()
                    .find(|(_, f)| f.mapped_in(&maps))
                    .map(|(id, _)| id.clone())
            })?;
            Some(Attributed {
                container_id: id,
                sample: s.clone(),
                start_time: procs.start_time(s.pid).unwrap_or(0),
                wall,
            })
        })
        .collect()
}

/// The attributed samples summed by (container id, GPU uuid).
#[must_use]
pub fn sum_holdings(attributed: &[Attributed]) -> BTreeMap<(String, String), Held> {
    let mut held: BTreeMap<(String, String), Held> = BTreeMap::new();
    for a in attributed {
        let e = held
            .entry((a.container_id.clone(), a.sample.gpu_uuid.clone()))
            .or_default();
        e.bytes = e.bytes.saturating_add(a.sample.used);
        e.pids.push((a.start_time, a.sample.pid));
        e.wall = e.wall.max(a.wall);
    }
    held
}

/// The containers over their slice, from the driver's `samples`: a claim's samples on one GPU
/// are summed against its wall there plus `tolerance`.
#[must_use]
pub fn violations(
    claims: &[Claim],
    samples: &[Sample],
    procs: &Procs,
    tolerance: u64,
) -> Vec<Violation> {
    over_slice(
        claims,
        &sum_holdings(&attribute(claims, samples, procs, &[])),
        tolerance,
    )
}

/// The holdings over their wall plus `tolerance`: the one they were found behind, else their
/// claim's.
#[must_use]
pub fn over_slice(
    claims: &[Claim],
    held: &BTreeMap<(String, String), Held>,
    tolerance: u64,
) -> Vec<Violation> {
    let mut out = Vec::new();
    for ((id, uuid), h) in held {
        let Some(claim) = claims.iter().find(|c| &c.container_id == id) else {
            continue;
        };
        // A GPU outside the claim has no room at all.
        let limit = h.wall.unwrap_or_else(|| {
            claim
                .gpus
                .iter()
                .find(|g| &g.uuid == uuid)
                .map_or(0, |g| g.memory_bytes)
        });
        if h.bytes > limit.saturating_add(tolerance) {
            let mut pids = h.pids.clone();
            pids.sort_unstable();
            out.push(Violation {
                container_id: id.clone(),
                gpu_uuid: uuid.clone(),
                used: h.bytes,
                limit,
                pids: pids.into_iter().map(|(_, p)| p).collect(),
            });
        }
    }
    out
}

/// The containers some of whose processes hold more than `tolerance` on some GPU without a
/// slot of their own in the usage region (the region rewritten, or a process that went
/// around the library), from the driver's share found for each (`shares`, by container id).
/// Processes that only draw (OpenGL, Vulkan: [`Sample::graphics_only`], in `attributed`)
/// never have a slot; their memory is charged all the same, and is no sign of tampering.
/// Returns (container id, what was found).
#[must_use]
pub fn understated(
    claims: &[Claim],
    shares: &BTreeMap<String, gpuslice_core::held::DriverShare>,
    attributed: &[Attributed],
    tolerance: u64,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for claim in claims {
        let Some(share) = shares.get(&claim.container_id) else {
            continue;
        };
        let drawing = |uuid: &str| -> u64 {
            attributed
                .iter()
                .filter(|a| a.container_id == claim.container_id)
                .filter(|a| a.sample.graphics_only && a.sample.gpu_uuid == uuid)
                .map(|a| a.sample.used)
                .sum()
        };
        let over = claim
            .gpus
            .iter()
            .zip(&share.unattributed)
            .map(|(g, u)| (g, u.saturating_sub(drawing(&g.uuid))))
            .find(|(_, u)| *u > tolerance);
        if let Some((g, unattributed)) = over {
            out.push((
                claim.container_id.clone(),
                format!(
                    "the driver shows the container's processes holding {unattributed} bytes on {} that no slot of its usage region accounts for (beyond what processes that only draw hold): its counters were rewritten, or a process went around the library",
                    g.uuid
                ),
            ));
        }
    }
    out
}

/// How many passes back a finding of memory no slot accounts for is remembered.
pub const RECENT_PASSES: u32 = 8;

/// Of the containers `found` now (container id, what was found), those also found on another
/// of the last [`RECENT_PASSES`] passes (`recent`: each container's findings, bit 0 the pass
/// before, updated with this one). A process that is exiting has given up its slot a moment
/// before the driver frees its memory, and is gone by the next pass: found once, it is not
/// reported. A tenant who hides on every other pass is found again within the window.
pub fn found_again(
    recent: &mut std::collections::BTreeMap<String, u8>,
    found: Vec<(String, String)>,
) -> Vec<(String, String)> {
    let window = u8::try_from((1u32 << RECENT_PASSES) - 1).unwrap_or(u8::MAX);
    let now: std::collections::BTreeSet<String> = found.iter().map(|(id, _)| id.clone()).collect();
    let confirmed = found
        .into_iter()
        .filter(|(id, _)| recent.get(id).is_some_and(|&bits| bits != 0))
        .collect();
    for id in &now {
        recent.entry(id.clone()).or_insert(0);
    }
    recent.retain(|id, bits| {
        *bits = ((*bits << 1) | u8::from(now.contains(id))) & window;
        *bits != 0
    });
    confirmed
}

/// The container's processes the driver reports, as [`crate::held`] matches them to slots:
/// each GPU by its position in `claim`, each process by its pid in its own namespace.
#[must_use]
pub fn holders(
    claim: &Claim,
    attributed: &[Attributed],
    procs: &Procs,
) -> Vec<crate::held::Holder> {
    attributed
        .iter()
        .filter(|a| a.container_id == claim.container_id)
        .filter_map(|a| {
            let position = claim
                .gpus
                .iter()
                .position(|g| g.uuid == a.sample.gpu_uuid)?;
            Some(crate::held::Holder {
                position,
                ns_pid: procs.ns_pid(a.sample.pid)?,
                host_pid: a.sample.pid,
                start_time: a.start_time,
                used: a.sample.used,
            })
        })
        .collect()
}

/// SIGKILLs `pid` if it is still the process that started at `start_time` (a pid reused in
/// between is left alone).
pub fn kill(procs: &Procs, pid: u32, start_time: u64) -> bool {
    if procs.start_time(pid) != Some(start_time) {
        return false;
    }
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(ids: &[&str]) -> Vec<(String, String)> {
        ids.iter()
            .map(|id| ((*id).to_string(), "held".to_string()))
            .collect()
    }

    #[test]
    fn memory_no_slot_accounts_for_is_reported_once_found_on_a_second_pass() {
        let mut recent = std::collections::BTreeMap::new();
        // A process exiting: found on one pass, gone on the next.
        assert!(found_again(&mut recent, found(&["a", "b"])).is_empty());
        let reported = found_again(&mut recent, found(&["b"]));
        assert_eq!(reported, found(&["b"]));
        assert_eq!(found_again(&mut recent, found(&["a"])), found(&["a"]));
    }

    #[test]
    fn a_tenant_hiding_on_every_other_pass_is_still_reported() {
        let mut recent = std::collections::BTreeMap::new();
        let mut reported = 0;
        for pass in 0..8 {
            let now = if pass % 2 == 0 { found(&["t"]) } else { vec![] };
            reported += found_again(&mut recent, now).len();
        }
        assert_eq!(reported, 3, "reported on each finding after the first");
    }

    #[test]
    fn a_finding_older_than_the_window_is_forgotten() {
        let mut recent = std::collections::BTreeMap::new();
        assert!(found_again(&mut recent, found(&["x"])).is_empty());
        for _ in 0..RECENT_PASSES {
            assert!(found_again(&mut recent, vec![]).is_empty());
        }
        assert!(recent.is_empty());
        assert!(found_again(&mut recent, found(&["x"])).is_empty());
    }

    #[test]
    fn a_file_is_found_in_a_processs_maps_by_device_and_inode() {
        let maps = "7f00-7f10 rw-s 00000000 00:1a 4242 /run/gpuslice/usage\n\
                    7f20-7f30 r-xp 00001000 fd:01 77 /usr/lib/libc.so.6\n";
        let usage = FileId {
            major: 0,
            minor: 0x1a,
            inode: 4242,
        };
        assert!(usage.mapped_in(maps));
        assert!(
            !FileId {
                inode: 4243,
                ..usage
            }
            .mapped_in(maps)
        );
        assert!(
            !FileId {
                minor: 0x1b,
                ..usage
            }
            .mapped_in(maps)
        );
        assert!(
            FileId {
                major: 0xfd,
                minor: 1,
                inode: 77
            }
            .mapped_in(maps)
        );
    }

    #[test]
    fn a_containers_cgroups_are_those_recorded_at_activation_while_its_process_lives() {
        let procs = Procs {
            root: PathBuf::from("/proc"),
        };
        let me = std::process::id();
        let start = procs.start_time(me).unwrap();
        let active = |start_time, cgroups: Option<&str>| ClaimState::Active {
            pid: me,
            start_time,
            cgroups: cgroups.map(str::to_string),
            earlier: vec![],
        };
        let parsed = |text: &str| vec![Cgroups::parse(text)];
        assert_eq!(
            procs.container_cgroups(&active(start, Some("4:memory:/c1\n0::/c1\n"))),
            parsed("4:memory:/c1\n0::/c1\n"),
            "not this process's cgroups now"
        );
        assert_eq!(
            procs.container_cgroups(&active(start, None)),
            procs
                .cgroups(me)
                .into_iter()
                .filter(|c| !c.is_root())
                .collect::<Vec<_>>(),
            "recorded by an older agent: read now"
        );
        assert!(
            procs
                .container_cgroups(&active(start + 1, Some("4:memory:/c1\n")))
                .is_empty()
        );
        assert!(
            procs
                .container_cgroups(&active(start, Some("4:memory:/\n0::/\n")))
                .is_empty()
        );
        assert!(procs.container_cgroups(&ClaimState::Pending).is_empty());
        // The same process reported again keeps what was read first.
        let two = active(start, Some("4:memory:/c2\n")).with_reported(gpuslice_core::Reported {
            pid: me,
            start_time: start,
            cgroups: None,
        });
        assert_eq!(procs.container_cgroups(&two), parsed("4:memory:/c2\n"));
        // Containers reported for one claim: those running counted, the last first.
        let shared = ClaimState::Active {
            pid: me,
            start_time: start,
            cgroups: Some("4:memory:/c2\n".into()),
            earlier: vec![
                gpuslice_core::Reported {
                    pid: me,
                    start_time: start + 1,
                    cgroups: Some("4:memory:/gone\n".into()),
                },
                gpuslice_core::Reported {
                    pid: me,
                    start_time: start,
                    cgroups: Some("4:memory:/c1\n".into()),
                },
            ],
        };
        assert_eq!(
            procs.container_cgroups(&shared),
            [parsed("4:memory:/c2\n"), parsed("4:memory:/c1\n")].concat()
        );
    }

    /// A proc file system of processes `(pid, cgroup)`, each started at tick 5000.
    fn fake_procs(processes: &[(u32, &str)]) -> (tempfile::TempDir, Procs) {
        let root = tempfile::tempdir().unwrap();
        for (pid, cgroup) in processes {
            let dir = root.path().join(pid.to_string());
            std::fs::create_dir(&dir).unwrap();
            let stat = format!("{pid} (p) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5000 0 0\n");
            std::fs::write(dir.join("stat"), stat).unwrap();
            std::fs::write(dir.join("cgroup"), cgroup).unwrap();
        }
        let procs = Procs {
            root: root.path().to_path_buf(),
        };
        (root, procs)
    }

    /// A claim of `memory` bytes on GPU `uuid` for the container whose first process is `pid`
    /// in `cgroup`.
    fn claim_on(id: &str, uuid: &str, memory: u64, pid: u32, cgroup: &str) -> Claim {
        Claim {
            container_id: id.into(),
            request: gpuslice_core::annotations::parse(
                &[("gpuslice.io/memory".to_string(), memory.to_string())].into(),
            )
            .unwrap()
            .unwrap(),
            exclusive: false,
            gpus: vec![gpuslice_core::claim::GpuGrant {
                index: 0,
                uuid: uuid.into(),
                minor: 0,
                memory_bytes: memory,
                cores: 0,
                window: None,
            }],
            state: ClaimState::Active {
                pid,
                start_time: 5000,
                cgroups: Some(cgroup.into()),
                earlier: vec![],
            },
            created_unix_ms: 0,
            assigned_as: None,
            owner: None,
            pod: None,
        }
    }

    #[test]
    fn a_container_given_two_claims_on_one_gpu_is_held_to_what_they_give_it_together() {
        const MIB: u64 = 1 << 20;
        // Container c1 (first process 10, and 11 below it) has claims a (512 MiB) and b
        // (256 MiB) on GPU-x; container c2 (12) has claim c (256 MiB) there.
        let (_root, procs) =
            fake_procs(&[(10, "0::/c1\n"), (11, "0::/c1/app\n"), (12, "0::/c2\n")]);
        let claims = [
            claim_on("a", "GPU-x", 512 * MIB, 10, "0::/c1\n"),
            claim_on("b", "GPU-x", 256 * MIB, 10, "0::/c1\n"),
            claim_on("c", "GPU-x", 256 * MIB, 12, "0::/c2\n"),
        ];
        let sample = |pid, used| Sample {
            gpu_uuid: "GPU-x".into(),
            pid,
            used,
            graphics_only: false,
        };
        // c1 holds 700 MiB there: within 768, charged to a (the first by name, where the
        // interception library charges it). c2 holds 300 MiB: over its 256.
        let samples = [
            sample(10, 100 * MIB),
            sample(11, 600 * MIB),
            sample(12, 300 * MIB),
        ];
        let attributed = attribute(&claims, &samples, &procs, &[]);
        let ids: Vec<&str> = attributed.iter().map(|a| a.container_id.as_str()).collect();
        assert_eq!(ids, ["a", "a", "c"]);
        let over = violations(&claims, &samples, &procs, 0);
        assert_eq!(over.len(), 1, "{over:?}");
        assert_eq!(
            (over[0].container_id.as_str(), over[0].limit),
            ("c", 256 * MIB)
        );
        // Past the sum, c1 is over it.
        let samples = [sample(10, 100 * MIB), sample(11, 700 * MIB)];
        let over = violations(&claims, &samples, &procs, 0);
        assert_eq!(over.len(), 1, "{over:?}");
        assert_eq!(
            (over[0].container_id.as_str(), over[0].used, over[0].limit),
            ("a", 800 * MIB, 768 * MIB)
        );
    }

    #[test]
    fn a_process_belongs_to_a_container_in_its_cgroup_or_below_it() {
        let container = Cgroups::parse("12:devices:/c1\n0::/system.slice/runc-c1.scope\n");
        let same = Cgroups::parse("12:devices:/c1\n0::/system.slice/runc-c1.scope\n");
        let below = Cgroups::parse("12:devices:/c1/x\n0::/system.slice/runc-c1.scope/sub\n");
        let sibling = Cgroups::parse("12:devices:/c10\n0::/system.slice/runc-c10.scope\n");
        let host = Cgroups::parse("12:devices:/\n0::/user.slice\n");
        assert!(same.within(&container) && below.within(&container));
        assert!(
            !sibling.within(&container),
            "a prefix of the name is not a parent"
        );
        assert!(!host.within(&container));
        assert!(!host.is_root() && Cgroups::parse("1:cpu:/\n0::/\n").is_root());
    }
}
