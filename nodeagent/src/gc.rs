//! Garbage collection: releasing the claims of containers that are gone.
//!
//! Evidence, per claim state:
//! - **Active** (the container's pid was reported: by the runtime wrapper after create, or
//!   by its createRuntime hook): the claim is released when `/proc/<pid>` is gone, or when
//!   the process there started at another time than the one recorded (the pid was reused);
//!   the agent first forgets the other containers reported for the claim that are gone and
//!   makes the last one still running the claim's process, so this is every container gone.
//! - **Pending** (admitted at create, not yet started): the claim is released once it is older
//!   than the pending timeout *and* no OCI runtime knows the container: no
//!   `<root>/<id>/state.json` (runc, crun) or `<root>/<namespace>/<id>/state.json`
//!   (containerd's runc shim) under any configured runtime state root. A container that was
//!   created and waits to be started keeps its claim however long it waits.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gpuslice_core::{Claim, ClaimState};

#[derive(Debug, Clone)]
pub struct Evidence {
    pub proc_root: PathBuf,
    pub runtime_roots: Vec<PathBuf>,
    pub pending_timeout: Duration,
}

impl Evidence {
    /// Why `claim`'s container is gone, or `None` while it may still live.
    #[must_use]
    pub fn gone(&self, claim: &Claim, now_ms: u64) -> Option<String> {
        // A DRA plugin's claim lives until the kubelet unprepares it: its pod's containers
        // come and go (restarts) on the same claim.
        if claim
            .owner
            .as_deref()
            .is_some_and(|o| o.starts_with(gpuslice_core::claim::DRA_OWNER_PREFIX))
        {
            return None;
        }
        match claim.state {
            ClaimState::Active {
                pid, start_time, ..
            } => match process_start_time(&self.proc_root, pid) {
                None => Some(format!("process {pid} has exited")),
                Some(t) if t != start_time => {
                    Some(format!("pid {pid} now belongs to another process"))
                }
                Some(_) => None,
            },
            ClaimState::Pending => {
                let age = Duration::from_millis(now_ms.saturating_sub(claim.created_unix_ms));
                if age < self.pending_timeout || self.runtime_knows(&claim.container_id) {
                    None
                } else {
                    Some(format!(
                        "never started within {}s and no runtime knows it",
                        self.pending_timeout.as_secs()
                    ))
                }
            }
        }
    }

    fn runtime_knows(&self, id: &str) -> bool {
        self.runtime_roots.iter().any(|root| {
            root.join(id).join("state.json").exists()
                || std::fs::read_dir(root)
                    .map(|entries| {
                        entries
                            .flatten()
                            .any(|ns| ns.path().join(id).join("state.json").exists())
                    })
                    .unwrap_or(false)
        })
    }
}

/// Default runtime state roots: runc, crun, and containerd's runc shim.
#[must_use]
pub fn default_runtime_roots() -> Vec<PathBuf> {
    ["/run/runc", "/run/crun", "/run/containerd/runc"]
        .iter()
        .map(PathBuf::from)
        .collect()
}

/// The start time of `pid` in clock ticks since boot, read from `<proc_root>/<pid>/stat`, or
/// `None` when no such process exists.
#[must_use]
pub fn process_start_time(proc_root: &Path, pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    gpuslice_core::process::parse_start_time(&stat)
}

/// The proc filesystem of the host.
#[must_use]
pub fn default_proc_root() -> &'static Path {
    Path::new("/proc")
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_core::SliceRequest;

    fn claim(state: ClaimState, created_unix_ms: u64) -> Claim {
        Claim {
            container_id: "c1".into(),
            request: SliceRequest {
                gpus: 1,
                memory: None,
                cores: None,
                devices: vec![],
                avoid_devices: Vec::new(),
                models: Default::default(),
                gpu_policy: None,
                node_policy: None,
                assignment: None,
                container: None,
                source: std::collections::BTreeMap::new(),
            },
            exclusive: true,
            gpus: vec![],
            state,
            created_unix_ms,
            assigned_as: None,
            owner: None,
            pod: None,
        }
    }

    fn evidence(roots: Vec<PathBuf>) -> Evidence {
        Evidence {
            proc_root: "/proc".into(),
            runtime_roots: roots,
            pending_timeout: Duration::from_secs(10),
        }
    }

    #[test]
    fn a_dra_plugins_claim_is_never_collected_whatever_its_process() {
        let e = evidence(vec![]);
        let gone = ClaimState::Active {
            pid: u32::MAX - 1,
            start_time: 1,
            cgroups: None,
            earlier: vec![],
        };
        let mut c = claim(gone, 0);
        assert!(e.gone(&c, 0).is_some(), "without an owner it is collected");
        c.owner = Some("dra:gpuslice.io".into());
        assert_eq!(e.gone(&c, 0), None);
        let mut pending = claim(ClaimState::Pending, 0);
        pending.owner = Some("dra:gpuslice.io".into());
        assert_eq!(
            e.gone(&pending, 3_600_000),
            None,
            "nor while waiting for its pod"
        );
        pending.owner = Some("runtime-root:/run/runc".into());
        assert!(e.gone(&pending, 3_600_000).is_some());
    }

    #[test]
    fn an_active_claim_lives_while_its_process_does() {
        let me = std::process::id();
        let start = process_start_time(Path::new("/proc"), me).unwrap();
        let e = evidence(vec![]);
        assert_eq!(
            e.gone(
                &claim(
                    ClaimState::Active {
                        pid: me,
                        start_time: start,
                        cgroups: None,
                        earlier: vec![],
                    },
                    0
                ),
                0
            ),
            None
        );
        assert!(
            e.gone(
                &claim(
                    ClaimState::Active {
                        pid: me,
                        start_time: start + 1,
                        cgroups: None,
                        earlier: vec![],
                    },
                    0
                ),
                0
            )
            .is_some()
        );
        assert!(
            e.gone(
                &claim(
                    ClaimState::Active {
                        pid: u32::MAX - 1,
                        start_time: 1,
                        cgroups: None,
                        earlier: vec![],
                    },
                    0
                ),
                0
            )
            .is_some()
        );
    }

    #[test]
    fn a_pending_claim_lives_until_the_timeout_or_while_a_runtime_knows_it() {
        let dir = tempfile::tempdir().unwrap();
        let e = evidence(vec![dir.path().to_path_buf()]);
        let c = claim(ClaimState::Pending, 1_000);
        assert_eq!(e.gone(&c, 5_000), None);
        assert!(e.gone(&c, 20_000).is_some());
        std::fs::create_dir_all(dir.path().join("k8s.io/c1")).unwrap();
        std::fs::write(dir.path().join("k8s.io/c1/state.json"), "{}").unwrap();
        assert_eq!(e.gone(&c, 20_000), None);
    }
}
