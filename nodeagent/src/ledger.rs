//! The ledger: every claim on the node, admitted only when it fits.
//!
//! Order of a claim: decide the GPUs, write the container's directory, write the claim file
//! (the commit point), then answer. Order of a release: remove the claim file (the commit
//! point), then the directory. A crash between the two steps leaves a directory with no
//! claim, which [`Ledger::open`] removes; a crash after the commit point leaves a claim whose
//! answer may not have reached its client, which the client's retry gets again (claims are
//! idempotent per container id) or garbage collection releases.

use std::collections::{BTreeMap, HashMap};

use crate::placement;
use gpuslice_core::annotations::{self, SliceRequest};
use gpuslice_core::assignment::Assignment;
use gpuslice_core::claim::validate_container_id;
use gpuslice_core::claim::{GpuGrant, SmWindow};
use gpuslice_core::fit::{RefusalReason, Rules};
use gpuslice_core::inventory::{Inventory, NodeLoads};
use gpuslice_core::publication::assigned_container;
use gpuslice_core::{Claim, ClaimState, GpuLoad, Policy};

use crate::rundir::{RunDir, RunDirError};
use crate::store::{Store, StoreError};

/// A refused request: why (for metrics) and a message naming the input, value and reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    pub reason: RefusalReason,
    pub message: String,
}

impl Refusal {
    fn invalid(message: impl Into<String>) -> Self {
        Self {
            reason: RefusalReason::InvalidRequest,
            message: message.into(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("no claim for container {0:?}")]
    NotFound(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    RunDir(#[from] RunDirError),
}

/// Whether a claim was admitted now or had been admitted before (a retry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    New(Claim),
    Existing(Claim),
}

impl Admission {
    #[must_use]
    pub fn claim(&self) -> &Claim {
        match self {
            Self::New(c) | Self::Existing(c) => c,
        }
    }
}

pub struct Ledger {
    inventory: Inventory,
    claims: BTreeMap<String, Claim>,
    store: Store,
    run: RunDir,
    rules: Rules,
    default_policy: Policy,
    trust: Trust,
}

/// Whose assignments this agent honours: those signed with `key` for `node`.
#[derive(Debug, Clone, Default)]
pub struct Trust {
    /// The key shared with the cluster scheduler; without one, assignments are refused.
    pub key: Option<Vec<u8>>,
    /// This node's name, as the scheduler writes it.
    pub node: String,
}

/// The CRI annotation with the pod's UID (containerd; CRI-O writes the same key).
const CRI_SANDBOX_UID: &str = "io.kubernetes.cri.sandbox-uid";

/// What [`Ledger::open`] found and mended.
#[derive(Debug, Default)]
pub struct Recovery {
    pub claims: usize,
    pub orphan_dirs_removed: Vec<String>,
    pub damaged: Vec<String>,
    pub over_capacity_gpus: Vec<u32>,
    /// Containers whose claims name GPUs this node no longer has.
    pub on_missing_gpus: Vec<String>,
}

impl Ledger {
    /// Loads the ledger, recreates missing container directories of stored claims, and
    /// removes directories that belong to no claim.
    pub fn open(
        inventory: Inventory,
        store: Store,
        run: RunDir,
        rules: Rules,
        default_policy: Policy,
    ) -> Result<(Self, Recovery), LedgerError> {
        let (claims, damaged) = store.load()?;
        let mut recovery = Recovery {
            damaged: damaged.iter().map(ToString::to_string).collect(),
            ..Recovery::default()
        };
        let claims: BTreeMap<String, Claim> = claims
            .into_iter()
            .map(|c| (c.container_id.clone(), c))
            .collect();
        for claim in claims.values() {
            if !run
                .path(&claim.container_id)
                .join(gpuslice_core::limits::FILE_NAME)
                .exists()
            {
                run.create(claim)?;
            }
        }
        for id in run.list() {
            if !claims.contains_key(&id) {
                run.remove(&id)?;
                recovery.orphan_dirs_removed.push(id);
            }
        }
        recovery.claims = claims.len();
        recovery.on_missing_gpus = claims
            .values()
            .filter(|c| {
                c.gpus
                    .iter()
                    .any(|g| !inventory.gpus.iter().any(|i| i.uuid == g.uuid))
            })
            .map(|c| c.container_id.clone())
            .collect();
        let ledger = Self {
            inventory,
            claims,
            store,
            run,
            rules,
            default_policy,
            trust: Trust::default(),
        };
        recovery.over_capacity_gpus = ledger
            .loads()
            .iter()
            .filter(|l| l.memory_allocated > l.memory_total || l.cores_allocated > 100)
            .map(|l| l.index)
            .collect();
        Ok((ledger, recovery))
    }

    /// Honour scheduler assignments signed for this node with this key.
    #[must_use]
    pub fn with_trust(mut self, trust: Trust) -> Self {
        self.trust = trust;
        self
    }

    #[must_use]
    pub fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    pub fn claims(&self) -> impl Iterator<Item = &Claim> {
        self.claims.values()
    }

    #[must_use]
    pub fn get(&self, id: &str) -> Option<&Claim> {
        self.claims.get(id)
    }

    #[must_use]
    pub fn run_dir(&self) -> &RunDir {
        &self.run
    }

    /// The rules every claim is admitted by.
    #[must_use]
    pub fn rules(&self) -> Rules {
        self.rules
    }

    /// Allocation on each GPU, from the claims.
    #[must_use]
    /// `gpus` with a window of each cycle for every share of the SMs (1–99%), the first one
    /// free on that GPU: the shares of one GPU then run in turn, never at once. A share left
    /// without a window (no gap long enough) is paced from NVML's samples instead.
    fn with_windows(&self, mut gpus: Vec<GpuGrant>) -> Vec<GpuGrant> {
        for g in gpus.iter_mut().filter(|g| (1..100).contains(&g.cores)) {
            let taken: Vec<SmWindow> = self
                .claims
                .values()
                .flat_map(|c| &c.gpus)
                .filter(|o| o.uuid == g.uuid)
                .filter_map(|o| o.window)
                .collect();
            g.window = SmWindow::first_free(&taken, g.cores);
            if g.window.is_none() {
                tracing::warn!(gpu = %g.uuid, cores = g.cores, "no window of the cycle left for this share of the SMs: it is paced from NVML's samples");
            }
        }
        gpus
    }

    pub fn loads(&self) -> Vec<GpuLoad> {
        let mut by_uuid: HashMap<&str, GpuLoad> = self
            .inventory
            .gpus
            .iter()
            .map(|g| {
                let load = GpuLoad {
                    index: g.index,
                    uuid: g.uuid.clone(),
                    minor: g.minor,
                    model: g.name.clone(),
                    memory_total: g.memory_usable_bytes(),
                    memory_allocated: 0,
                    cores_allocated: 0,
                    sharers: 0,
                    exclusive: false,
                };
                (g.uuid.as_str(), load)
            })
            .collect();
        for claim in self.claims.values() {
            for grant in &claim.gpus {
                if let Some(l) = by_uuid.get_mut(grant.uuid.as_str()) {
                    l.memory_allocated += grant.memory_bytes;
                    l.cores_allocated += grant.cores;
                    l.sharers += 1;
                    l.exclusive |= claim.exclusive;
                }
            }
        }
        let mut loads: Vec<GpuLoad> = by_uuid.into_values().collect();
        loads.sort_by_key(|l| l.index);
        loads
    }

    /// Admits the request in `annotations` for `container_id`, or says why not. A second
    /// claim for the same id with the same request returns the first answer.
    pub fn claim(
        &mut self,
        container_id: &str,
        annotations: &BTreeMap<String, String>,
        now_ms: u64,
    ) -> Result<Admission, LedgerError> {
        self.claim_as(None, container_id, annotations, now_ms)
    }

    /// As [`Ledger::claim`], for a container created by `owner`: an id that another owner
    /// holds is refused (two runtime roots, or containerd namespaces, with one container id
    /// would otherwise share one slice, and deleting either would release it under the other).
    pub fn claim_as(
        &mut self,
        owner: Option<&str>,
        container_id: &str,
        annotations: &BTreeMap<String, String>,
        now_ms: u64,
    ) -> Result<Admission, LedgerError> {
        validate_container_id(container_id).map_err(|e| Refusal::invalid(e.to_string()))?;
        let request = annotations::parse(annotations)
            .map_err(|e| Refusal::invalid(e.to_string()))?
            .ok_or_else(|| {
                Refusal::invalid(format!(
                    "container {container_id:?} has no gpuslice.io annotations: nothing to claim"
                ))
            })?;
        if let Some(existing) = self.claims.get(container_id) {
            if let (Some(theirs), Some(ours)) = (existing.owner.as_deref(), owner)
                && theirs != ours
            {
                return Err(Refusal {
                    reason: RefusalReason::Conflict,
                    message: format!("container id {container_id:?} already holds a slice for a container of {theirs}; this one comes from {ours} (a container id must be unique on the node)"),
                }
                .into());
            }
            if existing.request == request {
                return Ok(Admission::Existing(existing.clone()));
            }
            return Err(Refusal {
                reason: RefusalReason::Conflict,
                message: format!("container {container_id:?} already holds a claim made with other annotations; release it first"),
            }
            .into());
        }
        let (gpus, assigned_as) = match &request.assignment {
            Some(value) => {
                let (gpus, key) = self.assigned_gpus(&request, value, annotations)?;
                (gpus, Some(key))
            }
            None => (
                placement::place_on(
                    &request,
                    NodeLoads {
                        gpus: &self.loads(),
                        rules: self.rules,
                        topology: self.inventory.topology.as_ref(),
                    },
                    self.default_policy,
                )
                .map_err(|e| Refusal {
                    reason: e.reason,
                    message: e.message,
                })?,
                None,
            ),
        };
        let gpus = self.with_windows(gpus);
        let claim = Claim {
            container_id: container_id.to_string(),
            exclusive: request.is_exclusive(),
            request,
            gpus,
            state: ClaimState::Pending,
            created_unix_ms: now_ms,
            assigned_as,
            owner: owner.map(str::to_string),
            pod: gpuslice_core::pod::pod_ref(annotations),
        };
        self.run.create(&claim)?;
        if let Err(e) = self.store.put(&claim) {
            let _ = self.run.remove(container_id);
            return Err(e.into());
        }
        self.claims.insert(container_id.to_string(), claim.clone());
        Ok(Admission::New(claim))
    }

    /// The GPUs a scheduler assignment gives, once its signature, node, pod and fit check,
    /// and the container as the publication names it.
    fn assigned_gpus(
        &self,
        request: &SliceRequest,
        value: &str,
        annotations: &BTreeMap<String, String>,
    ) -> Result<(Vec<GpuGrant>, String), Refusal> {
        let key = request.key(annotations::ASSIGNMENT);
        let shown: String = if value.chars().count() > 24 {
            format!("{}…", value.chars().take(24).collect::<String>())
        } else {
            value.to_string()
        };
        let refuse = |reason, why: String| Refusal {
            reason,
            message: format!("annotation {key}={shown:?}: {why}"),
        };
        let Some(secret) = &self.trust.key else {
            return Err(refuse(
                RefusalReason::PolicyUnavailable,
                "this agent has no assignment key (--assignment-key), so it honours no scheduler assignment".into(),
            ));
        };
        let a = Assignment::verify(value, secret)
            .map_err(|e| refuse(RefusalReason::InvalidRequest, e.to_string()))?;
        if a.node != self.trust.node {
            return Err(refuse(
                RefusalReason::InvalidRequest,
                format!(
                    "assigned to node {:?}, this is node {:?}",
                    a.node, self.trust.node
                ),
            ));
        }
        if let Some(uid) = annotations.get(CRI_SANDBOX_UID)
            && *uid != a.pod_uid
        {
            return Err(refuse(
                RefusalReason::InvalidRequest,
                format!(
                    "made for pod {:?}, this container's pod is {uid:?}",
                    a.pod_uid
                ),
            ));
        }
        // The container's name: from its own annotations when it has per-container keys, else
        // as the container runtime names it.
        let container = request.container.as_deref().or_else(|| {
            annotations
                .get(annotations::CRI_CONTAINER_NAME)
                .or_else(|| annotations.get(annotations::CRIO_CONTAINER_NAME))
                .map(String::as_str)
        });
        let assigned = a.for_container(container).ok_or_else(|| {
            refuse(
                RefusalReason::InvalidRequest,
                format!(
                    "assigns no GPUs to container {}",
                    container.unwrap_or("(unnamed)")
                ),
            )
        })?;
        let gpus = placement::place_assigned(request, &self.loads(), self.rules, assigned, &shown)
            .map_err(|e| Refusal {
                reason: e.reason,
                message: e.message,
            })?;
        let name = container.map_or_else(
            || a.containers.keys().next().cloned().unwrap_or_default(),
            str::to_string,
        );
        Ok((gpus, assigned_container(&a.pod_uid, &name)))
    }

    /// Records that the container runs as `pid`, started at `start_time`.
    pub fn activate(
        &mut self,
        container_id: &str,
        pid: u32,
        start_time: u64,
        cgroups: Option<String>,
    ) -> Result<Claim, LedgerError> {
        let claim = self
            .claims
            .get(container_id)
            .ok_or_else(|| LedgerError::NotFound(container_id.to_string()))?;
        let mut updated = claim.clone();
        updated.state = claim.state.with_reported(gpuslice_core::Reported {
            pid,
            start_time,
            cgroups,
        });
        if updated != *claim {
            self.store.put(&updated)?;
            self.claims
                .insert(container_id.to_string(), updated.clone());
        }
        Ok(updated)
    }

    /// Forgets the processes reported for each claim that `alive` says are gone (a claim
    /// several containers use keeps those still running; see [`ClaimState::without_gone`]).
    pub fn forget_gone(
        &mut self,
        alive: impl Fn(&gpuslice_core::Reported) -> bool,
    ) -> Result<(), LedgerError> {
        let changed: Vec<Claim> = self
            .claims
            .values()
            .filter_map(|c| {
                let state = c.state.without_gone(&alive);
                (state != c.state).then(|| Claim { state, ..c.clone() })
            })
            .collect();
        for c in changed {
            self.store.put(&c)?;
            self.claims.insert(c.container_id.clone(), c);
        }
        Ok(())
    }

    /// Releases the claim of `container_id`; `None` when it held none.
    pub fn release(&mut self, container_id: &str) -> Result<Option<Claim>, LedgerError> {
        self.release_as(None, container_id)
    }

    /// As [`Ledger::release`], by `owner`: a claim another owner made is refused, not released.
    pub fn release_as(
        &mut self,
        owner: Option<&str>,
        container_id: &str,
    ) -> Result<Option<Claim>, LedgerError> {
        let Some(existing) = self.claims.get(container_id) else {
            return Ok(None);
        };
        if let (Some(theirs), Some(ours)) = (existing.owner.as_deref(), owner)
            && theirs != ours
        {
            return Err(Refusal {
                reason: RefusalReason::Conflict,
                message: format!("container id {container_id:?} holds a slice for a container of {theirs}, not of {ours}: it is not released"),
            }
            .into());
        }
        self.store.remove(container_id)?;
        let claim = self.claims.remove(container_id);
        self.run.remove(container_id)?;
        Ok(claim)
    }
}

#[cfg(test)]
mod tests;
