//! A container's admitted slice: which GPUs, how much of each, and the evidence that the
//! container still lives.

use serde::{Deserialize, Serialize};

use crate::annotations::SliceRequest;

/// One GPU of a claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuGrant {
    /// The GPU's index on the node (NVML order).
    pub index: u32,
    pub uuid: String,
    /// Minor number of `/dev/nvidiaN`.
    pub minor: u32,
    /// The memory wall on this GPU.
    pub memory_bytes: u64,
    /// Percent of the SMs reserved; 0 for none.
    pub cores: u32,
    /// Where in each cycle the slice's kernels run, for a share of the SMs (1–99%): the agent
    /// gives the slices of one GPU windows that do not overlap. None for no share, or where no
    /// free window was left (the share is then paced from NVML's utilization samples).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<SmWindow>,
}

/// The length of the cycle [`SmWindow`]s divide, in milliseconds.
pub const SM_CYCLE_MS: u64 = 100;

/// A part of every cycle of [`SM_CYCLE_MS`]: from `start` percent of the cycle, for `len`
/// percent (`start + len` ≤ 100).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmWindow {
    pub start: u32,
    pub len: u32,
}

impl SmWindow {
    /// The first window of `len` percent that overlaps none of `taken`, if one is left.
    #[must_use]
    pub fn first_free(taken: &[SmWindow], len: u32) -> Option<SmWindow> {
        if len == 0 || len > 100 {
            return None;
        }
        let mut taken = taken.to_vec();
        taken.sort_by_key(|w| w.start);
        let mut start = 0;
        for w in &taken {
            if w.start >= start + len {
                break;
            }
            start = start.max(w.start + w.len);
        }
        (start + len <= 100).then_some(SmWindow { start, len })
    }
}

/// Where a claim is in the container's life.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ClaimState {
    /// Admitted at create; the container has not started yet.
    Pending,
    /// The container runs as `pid`, whose start time (clock ticks since boot, field 22 of
    /// `/proc/<pid>/stat`) tells it apart from a later process with the same pid. `cgroups`
    /// is its `/proc/<pid>/cgroup` when it was activated, as the agent read it: the
    /// container's cgroups from then on, wherever the process moves itself later (root in a
    /// container whose cgroup file system is writable can move its first process into a
    /// cgroup of its own and leave the others outside it).
    /// `earlier`: the other containers reported for the claim before this one and still
    /// running (a ResourceClaim or a CDI slice device several containers use at once), each
    /// as recorded.
    Active {
        pid: u32,
        start_time: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cgroups: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        earlier: Vec<Reported>,
    },
}

/// A container's process reported for a claim: its pid, start time and cgroups when it was
/// reported (see [`ClaimState::Active`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reported {
    pub pid: u32,
    pub start_time: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroups: Option<String>,
}

/// The most containers a claim keeps reported besides the last one (the oldest go first).
pub const MAX_EARLIER: usize = 64;

impl ClaimState {
    /// The state once `process` is reported for the claim: it is the last reported, and the
    /// others are kept in `earlier`. A process reported again keeps the cgroups read the
    /// first time, before the container's program could move it.
    #[must_use]
    pub fn with_reported(&self, process: Reported) -> Self {
        let mut all = self.reported();
        let again = all
            .iter()
            .position(|r| (r.pid, r.start_time) == (process.pid, process.start_time))
            .map(|i| all.remove(i));
        let last = match again {
            Some(r) if r.cgroups.is_some() => r,
            _ => process,
        };
        let mut earlier: Vec<Reported> = all.into_iter().rev().collect();
        earlier.drain(..earlier.len().saturating_sub(MAX_EARLIER));
        Self::Active {
            pid: last.pid,
            start_time: last.start_time,
            cgroups: last.cgroups,
            earlier,
        }
    }

    /// The state without the reported processes `alive` says are gone; the last reported of
    /// those left is the claim's process. Unchanged where none is left: the claim's process
    /// is then the evidence that its containers are gone.
    #[must_use]
    pub fn without_gone(&self, alive: impl Fn(&Reported) -> bool) -> Self {
        let left: Vec<Reported> = self.reported().into_iter().filter(|r| alive(r)).collect();
        let Some((last, others)) = left.split_first() else {
            return self.clone();
        };
        Self::Active {
            pid: last.pid,
            start_time: last.start_time,
            cgroups: last.cgroups.clone(),
            earlier: others.iter().rev().cloned().collect(),
        }
    }

    /// Every container's process reported for the claim, the last reported first.
    #[must_use]
    pub fn reported(&self) -> Vec<Reported> {
        match self {
            Self::Pending => Vec::new(),
            Self::Active {
                pid,
                start_time,
                cgroups,
                earlier,
            } => std::iter::once(Reported {
                pid: *pid,
                start_time: *start_time,
                cgroups: cgroups.clone(),
            })
            .chain(earlier.iter().rev().cloned())
            .collect(),
        }
    }
}

/// An admitted slice, as the ledger keeps it and as the D-Bus API returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub container_id: String,
    pub request: SliceRequest,
    pub exclusive: bool,
    pub gpus: Vec<GpuGrant>,
    #[serde(flatten)]
    pub state: ClaimState,
    /// When the claim was admitted, in milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// The scheduler assignment it honoured, as `<pod UID>/<container>`
    /// (`cluster::assigned_container`); none for a claim the agent placed itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assigned_as: Option<String>,
    /// Who created the container, as the runtime wrapper names it (`runtime-root:<dir>`: the
    /// runtime's state directory, one per runc root or containerd namespace); none for a claim
    /// made by the CLI or a hook. Only the same owner (or one that names none) can claim the
    /// id again or release it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The Kubernetes pod of the container, as its engine named it (`pod::pod_ref`); where
    /// the agent's Kubernetes Events about the slice go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<crate::pod::PodRef>,
}

/// The owner prefix of claims a DRA kubelet plugin made (`dra:<driver>`): they last until
/// the plugin releases them (the kubelet unprepares the ResourceClaim), whatever becomes of
/// the containers that used them.
pub const DRA_OWNER_PREFIX: &str = "dra:";

/// Why a container id cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("container id {id:?}: {reason}")]
pub struct ContainerIdError {
    pub id: String,
    pub reason: &'static str,
}

/// Container ids become directory names under /run/gpuslice, so they are held to what runc
/// accepts: letters, digits, `_`, `+`, `-`, `.`, at most 1024 bytes, and never `.` or `..`.
pub fn validate_container_id(id: &str) -> Result<(), ContainerIdError> {
    let err = |reason| {
        Err(ContainerIdError {
            id: id.to_string(),
            reason,
        })
    };
    if id.is_empty() {
        return err("is empty");
    }
    if id.len() > 1024 {
        return err("is longer than 1024 bytes");
    }
    if id == "." || id == ".." {
        return err("is not a name");
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '+' | '-' | '.'))
    {
        return err("may hold only letters, digits, '_', '+', '-' and '.'");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(pid: u32) -> Reported {
        Reported {
            pid,
            start_time: u64::from(pid) * 10,
            cgroups: Some(format!("0::/c{pid}\n")),
        }
    }

    /// The state of a claim for which the processes `pids` were reported in turn.
    fn reported_in_turn(pids: impl IntoIterator<Item = u32>) -> ClaimState {
        pids.into_iter().fold(ClaimState::Pending, |state, pid| {
            state.with_reported(process(pid))
        })
    }

    #[test]
    fn each_container_reported_for_a_claim_is_kept_the_last_first_and_none_twice() {
        let state = reported_in_turn(1..=3);
        assert_eq!(state.reported(), [process(3), process(2), process(1)]);
        // Reported again after moving: the reading of the first report stands, and it is the
        // last reported.
        let moved = Reported {
            cgroups: Some("0::/c1/escape\n".into()),
            ..process(1)
        };
        assert_eq!(
            state.with_reported(moved).reported(),
            [process(1), process(3), process(2)]
        );
        let many = reported_in_turn(0..=u32::try_from(MAX_EARLIER).unwrap() + 5);
        assert_eq!(many.reported().len(), MAX_EARLIER + 1);
        assert_eq!(
            many.reported().last().unwrap().pid,
            5,
            "the oldest went first"
        );
    }

    #[test]
    fn containers_gone_are_forgotten_and_the_last_left_is_the_claims_process() {
        let state = reported_in_turn(1..=3);
        let left = state.without_gone(|r| r.pid != 3);
        assert_eq!(left.reported(), [process(2), process(1)]);
        assert!(matches!(left, ClaimState::Active { pid: 2, .. }));
        assert_eq!(state.without_gone(|_| false), state, "none left: unchanged");
        assert_eq!(state.without_gone(|_| true), state);
    }

    #[test]
    fn a_claim_recorded_before_several_containers_reads_as_one() {
        let old = r#"{"state":"active","pid":7,"start_time":70}"#;
        let state: ClaimState = serde_json::from_str(old).unwrap();
        assert_eq!(
            state.reported(),
            [Reported {
                pid: 7,
                start_time: 70,
                cgroups: None
            }]
        );
        assert_eq!(serde_json::to_string(&state).unwrap(), old);
    }

    #[test]
    fn container_ids_that_could_escape_the_run_directory_are_refused() {
        assert!(validate_container_id("abc-123_x.y").is_ok());
        for bad in ["", ".", "..", "a/b", "../x", "a b", "x\u{0}y", "é"] {
            assert!(validate_container_id(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn windows_are_given_first_fit_without_overlap_and_none_when_no_gap_is_long_enough() {
        let w = |start, len| SmWindow { start, len };
        assert_eq!(SmWindow::first_free(&[], 30), Some(w(0, 30)));
        assert_eq!(SmWindow::first_free(&[w(0, 30)], 70), Some(w(30, 70)));
        // A gap left by a slice that went: the first one long enough.
        let taken = [w(0, 10), w(30, 20), w(60, 10)];
        assert_eq!(SmWindow::first_free(&taken, 20), Some(w(10, 20)));
        assert_eq!(SmWindow::first_free(&taken, 25), Some(w(70, 25)));
        assert_eq!(SmWindow::first_free(&taken, 31), None);
        assert_eq!(SmWindow::first_free(&[w(0, 100)], 1), None);
        assert_eq!(SmWindow::first_free(&[], 0), None);
    }
}
