//! The agent's D-Bus interface, `io.gpuslice.Agent1` at `/io/gpuslice/Agent1`.
//!
//! Claim, Activate and Release change the ledger and are allowed to uid 0 only (checked here
//! from the bus's own record of the caller, in addition to the system bus policy); Inventory,
//! ListSlices and Status are open to everyone.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::gc::process_start_time;
use zbus::message::Header;
use zbus::{Connection, interface};

use crate::ledger::{Admission, Ledger, LedgerError};
use crate::metrics::{CauseLabels, Metrics};
use crate::usage::Tamper;
use gpuslice_agent_api::{SliceStatus, Status};

pub use gpuslice_agent_api::ApiError;

impl From<LedgerError> for ApiError {
    fn from(e: LedgerError) -> Self {
        use gpuslice_core::fit::RefusalReason;
        match e {
            LedgerError::Refused(r) if r.reason == RefusalReason::InvalidRequest => {
                Self::InvalidRequest(r.message)
            }
            LedgerError::Refused(r) => Self::Refused(r.message),
            LedgerError::NotFound(id) => Self::NotFound(format!("no claim for container {id:?}")),
            other => Self::Failed(error_chain(&other)),
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// State shared by the D-Bus interface, the metrics endpoint and the collector.
pub struct Shared {
    pub ledger: Mutex<Ledger>,
    pub metrics: Metrics,
    pub proc_root: PathBuf,
    uid_cache: Mutex<HashMap<String, u32>>,
    /// Containers whose usage region was found tampered with, and how.
    tampered: Mutex<BTreeMap<String, String>>,
    /// Containers whose usage region shows less than the driver says they hold (found by the
    /// enforcement backstop), and what was found.
    understated: Mutex<BTreeMap<String, String>>,
    /// Tamperings found and not yet announced on the bus.
    tamper_events: Mutex<Vec<(String, String)>>,
    /// What the driver showed each container's processes holding, by (container, GPU uuid),
    /// at the backstop's last pass.
    driver_held: Mutex<BTreeMap<(String, String), u64>>,
    /// The SM time each slice used lately ([`crate::sm_time`]), for `status`.
    sm_use: Mutex<crate::sm_time::RecentUse>,
    /// The containers held over their SM share ([`crate::throttle`]).
    freezer: Mutex<crate::throttle::Freezer>,
    /// Where Kubernetes Events go (nowhere until [`Shared::post_events_with`]).
    events: std::sync::OnceLock<crate::events::EventSink>,
    /// Woken when a claim is admitted, so that the backstop listens for its sample requests
    /// before its processes start.
    pub claims_changed: tokio::sync::Notify,
}

/// The ledger's claims and GPUs copied at one instant, so that what containers can write is
/// read after the ledger lock is released.
pub struct Snapshot {
    pub inventory: gpuslice_core::inventory::Inventory,
    pub loads: Vec<gpuslice_core::GpuLoad>,
    pub claims: Vec<gpuslice_core::Claim>,
    /// Each claim's device memory in use per GPU, or why its region is not believed.
    pub usage: Vec<Result<Vec<u64>, Tamper>>,
    /// Containers whose region understates what the driver shows them holding.
    pub understated: Vec<String>,
    /// What the driver showed each container's processes holding, by (container, GPU uuid),
    /// at the backstop's last pass (empty without the backstop).
    pub driver_held: BTreeMap<(String, String), u64>,
}

impl Shared {
    #[must_use]
    pub fn new(ledger: Ledger, metrics: Metrics, proc_root: PathBuf) -> Self {
        Self {
            ledger: Mutex::new(ledger),
            metrics,
            proc_root,
            uid_cache: Mutex::new(HashMap::new()),
            tampered: Mutex::new(BTreeMap::new()),
            understated: Mutex::new(BTreeMap::new()),
            tamper_events: Mutex::new(Vec::new()),
            driver_held: Mutex::new(BTreeMap::new()),
            sm_use: Mutex::default(),
            freezer: Mutex::default(),
            events: std::sync::OnceLock::new(),
            claims_changed: tokio::sync::Notify::new(),
        }
    }

    /// Holds containers over their SM share with `freezer` (its records) from now on.
    #[must_use]
    pub fn with_freezer(self, freezer: crate::throttle::Freezer) -> Self {
        Self {
            freezer: Mutex::new(freezer),
            ..self
        }
    }

    /// The containers held over their SM share.
    pub fn freezer(&self) -> std::sync::MutexGuard<'_, crate::throttle::Freezer> {
        self.freezer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Posts Kubernetes Events through `sink` from now on (set once).
    pub fn post_events_with(&self, sink: crate::events::EventSink) {
        let _ = self.events.set(sink);
    }

    /// Queues a Kubernetes Event on `pod`, when events are posted; never waits.
    pub fn post_event(
        &self,
        pod: Option<&gpuslice_core::pod::PodRef>,
        happening: crate::events::Happening,
    ) {
        if let Some(sink) = self.events.get() {
            sink.post(pod, happening);
        }
    }

    /// The pod of container `id`'s claim, if it has one.
    pub fn pod_of(&self, id: &str) -> Option<gpuslice_core::pod::PodRef> {
        self.ledger()
            .claims()
            .find(|c| c.container_id == id)
            .and_then(|c| c.pod.clone())
    }

    /// Takes the tamperings found since the last call, to announce them.
    pub fn take_tamper_events(&self) -> Vec<(String, String)> {
        std::mem::take(
            &mut *self
                .tamper_events
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// The claims and GPUs, and each claim's usage read without holding the ledger lock.
    /// A region found tampered with is logged once per container and kind of tampering, and
    /// listed in [`Shared::tampered`] until it reads well again or the claim goes.
    pub fn snapshot(&self) -> Snapshot {
        let (inventory, loads, claims, run) = {
            let ledger = self.ledger();
            (
                ledger.inventory().clone(),
                ledger.loads(),
                ledger.claims().cloned().collect::<Vec<_>>(),
                ledger.run_dir().clone(),
            )
        };
        let usage: Vec<Result<Vec<u64>, Tamper>> = claims
            .iter()
            .map(|c| run.usage(&c.container_id, c.gpus.len()))
            .collect();
        let mut tampered = self
            .tampered
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        tampered.retain(|id, _| claims.iter().any(|c| &c.container_id == id));
        for (c, u) in claims.iter().zip(&usage) {
            match u {
                Ok(_) => {
                    tampered.remove(&c.container_id);
                }
                Err(t)
                    if t.is_missing() && matches!(c.state, gpuslice_core::ClaimState::Pending) => {}
                Err(t) => {
                    let why = t.to_string();
                    if tampered.get(&c.container_id) != Some(&why) {
                        tracing::warn!(container = %c.container_id, "usage region tampered with: {why}");
                        tampered.insert(c.container_id.clone(), why.clone());
                        self.tamper_events
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .push((c.container_id.clone(), why));
                    }
                }
            }
        }
        let understated = {
            let mut map = self
                .understated
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            map.retain(|id, _| claims.iter().any(|c| &c.container_id == id));
            map.keys().cloned().collect()
        };
        let driver_held = self
            .driver_held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        Snapshot {
            inventory,
            loads,
            claims,
            usage,
            understated,
            driver_held,
        }
    }

    /// Records what the driver showed each container's processes holding at a backstop pass.
    pub fn note_driver_held(&self, held: BTreeMap<(String, String), u64>) {
        *self
            .driver_held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = held;
    }

    /// Records a pass of the SM time measurement: the slices (container, GPU uuid) whose GPU
    /// it measured, and the seconds it counted for some of them.
    pub fn note_sm_use(
        &self,
        measured: &std::collections::BTreeSet<(String, String)>,
        used: Vec<((String, String), f64)>,
    ) {
        self.sm_use
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .note(measured, used, std::time::Instant::now());
    }

    /// Records what the backstop found of the containers it `checked`: those in `found` have
    /// a region understating what the driver shows (logged and announced once per finding),
    /// the others do not (any earlier finding is forgotten).
    pub fn note_understated(&self, checked: &[String], found: Vec<(String, String)>) {
        let mut map = self
            .understated
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for id in checked {
            if !found.iter().any(|(f, _)| f == id) {
                map.remove(id);
            }
        }
        for (id, why) in found {
            let known = map.get(&id).is_some();
            map.insert(id.clone(), why.clone());
            if !known {
                tracing::warn!(container = %id, "usage region tampered with: {why}");
                self.tamper_events
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push((id, why));
            }
        }
    }

    /// Containers whose usage region is not believed now, and why.
    #[must_use]
    pub fn tampered(&self) -> BTreeMap<String, String> {
        self.tampered
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The ledger, even if a thread panicked while holding it (every change is committed on
    /// disk before memory, so the in-memory map is never half-updated).
    pub fn ledger(&self) -> MutexGuard<'_, Ledger> {
        self.ledger
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    #[must_use]
    pub fn status(&self) -> Status {
        let s = self.snapshot();
        let now = std::time::Instant::now();
        let held: std::collections::BTreeSet<String> = self.freezer().held().cloned().collect();
        let sm_use = self
            .sm_use
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let slices = s
            .claims
            .into_iter()
            .zip(s.usage)
            .map(|(claim, usage)| {
                let sm_used_percent = claim
                    .gpus
                    .iter()
                    .map(|g| {
                        sm_use
                            .share(&claim.container_id, &g.uuid, now)
                            .map(|share| (share * 1000.0).round() / 10.0)
                    })
                    .collect();
                SliceStatus {
                    used_bytes: usage.unwrap_or_else(|_| vec![0; claim.gpus.len()]),
                    sm_used_percent,
                    held: held.contains(&claim.container_id),
                    claim,
                }
            })
            .collect();
        Status {
            inventory: s.inventory,
            gpus: s.loads,
            slices,
        }
    }
}

pub struct AgentApi {
    shared: Arc<Shared>,
}

impl AgentApi {
    #[must_use]
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// Refuses callers other than root. On the bus the uid comes from the bus daemon, which
    /// took it from the caller's socket credentials; it is cached per unique name, which the
    /// bus never reuses. Peer to peer (the private socket, [`crate::private`]) a message has
    /// no sender and the uid is the kernel's for the socket.
    async fn require_root(&self, header: &Header<'_>, conn: &Connection) -> Result<(), ApiError> {
        let uid = match header.sender() {
            Some(sender) => self.bus_caller_uid(sender.to_string(), conn).await?,
            None => conn
                .peer_creds()
                .await
                .ok()
                .and_then(|c| c.unix_user_id())
                .ok_or_else(|| {
                    ApiError::AccessDenied(
                        "caller has no bus name and its socket gives no uid".into(),
                    )
                })?,
        };
        if uid == 0 {
            Ok(())
        } else {
            Err(ApiError::AccessDenied(format!(
                "uid {uid} may not change the ledger; only root may"
            )))
        }
    }

    /// The uid of the bus caller `sender`, asked of the bus daemon once per unique name.
    async fn bus_caller_uid(&self, sender: String, conn: &Connection) -> Result<u32, ApiError> {
        let cached = self
            .shared
            .uid_cache
            .lock()
            .ok()
            .and_then(|c| c.get(&sender).copied());
        if let Some(uid) = cached {
            return Ok(uid);
        }
        let dbus = zbus::fdo::DBusProxy::new(conn).await?;
        let name = zbus::names::BusName::try_from(sender.as_str()).map_err(zbus::Error::from)?;
        let uid = dbus
            .get_connection_unix_user(name)
            .await
            .map_err(zbus::Error::from)?;
        if let Ok(mut c) = self.shared.uid_cache.lock() {
            if c.len() > 4096 {
                c.clear();
            }
            c.insert(sender, uid);
        }
        Ok(uid)
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Shared) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let shared = Arc::clone(&self.shared);
        tokio::task::spawn_blocking(move || f(&shared))
            .await
            .map_err(|e| ApiError::Failed(format!("agent task failed: {e}")))?
    }
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<String, ApiError> {
    serde_json::to_string(v).map_err(|e| ApiError::Failed(e.to_string()))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl AgentApi {
    /// `Claim` and `ClaimAs`.
    async fn admit(
        &self,
        owner: Option<String>,
        container_id: String,
        annotations: HashMap<String, String>,
    ) -> Result<String, ApiError> {
        let annotations: BTreeMap<String, String> = annotations.into_iter().collect();
        self.blocking(move |s| {
            let result =
                s.ledger()
                    .claim_as(owner.as_deref(), &container_id, &annotations, now_ms());
            match result {
                Ok(Admission::New(c)) => {
                    s.metrics.admitted.inc();
                    s.claims_changed.notify_one();
                    tracing::info!(container = %c.container_id, gpus = ?c.gpus.iter().map(|g| g.index).collect::<Vec<_>>(), "claim admitted");
                    to_json(&c)
                }
                Ok(Admission::Existing(c)) => to_json(&c),
                Err(LedgerError::Refused(r)) => {
                    s.metrics.count_refusal(r.reason);
                    tracing::info!(container = %container_id, reason = r.reason.as_str(), "claim refused: {}", r.message);
                    let pod = gpuslice_core::pod::pod_ref(&annotations);
                    s.post_event(
                        pod.as_ref(),
                        crate::events::Happening::Refused {
                            container: crate::events::container_name(pod.as_ref(), &container_id),
                            why: r.message.clone(),
                        },
                    );
                    Err(LedgerError::Refused(r).into())
                }
                Err(e) => {
                    tracing::error!(container = %container_id, "claim failed: {}", error_chain(&e));
                    Err(e.into())
                }
            }
        })
        .await
    }

    /// `Release` and `ReleaseAs`.
    async fn give_back(
        &self,
        owner: Option<String>,
        container_id: String,
    ) -> Result<bool, ApiError> {
        self.blocking(move |s| {
            let released = s.ledger().release_as(owner.as_deref(), &container_id);
            let released = match released {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(container = %container_id, "release refused: {}", error_chain(&e));
                    return Err(e.into());
                }
            };
            if released.is_some() {
                s.metrics
                    .released
                    .get_or_create(&CauseLabels::REQUEST)
                    .inc();
                tracing::info!(container = %container_id, "claim released");
            }
            Ok(released.is_some())
        })
        .await
    }
}

#[interface(name = "io.gpuslice.Agent1")]
impl AgentApi {
    async fn claim(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        container_id: String,
        annotations: HashMap<String, String>,
    ) -> Result<String, ApiError> {
        self.require_root(&header, conn).await?;
        self.admit(None, container_id, annotations).await
    }

    async fn claim_as(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        owner: String,
        container_id: String,
        annotations: HashMap<String, String>,
    ) -> Result<String, ApiError> {
        self.require_root(&header, conn).await?;
        self.admit(Some(owner), container_id, annotations).await
    }

    async fn activate(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        container_id: String,
        pid: u32,
    ) -> Result<String, ApiError> {
        self.require_root(&header, conn).await?;
        self.blocking(move |s| {
            let start = process_start_time(&s.proc_root, pid)
                .ok_or_else(|| ApiError::InvalidRequest(format!("pid {pid}: no such process")))?;
            // The container's cgroups are those its process is in now: the runtime wrapper and
            // the hooks report it before the container's own program runs, so nothing it
            // does later (moving its first process elsewhere) changes which processes count
            // as the container's.
            let cgroups =
                std::fs::read_to_string(s.proc_root.join(pid.to_string()).join("cgroup")).ok();
            let claim = s.ledger().activate(&container_id, pid, start, cgroups)?;
            to_json(&claim)
        })
        .await
    }

    async fn release(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        container_id: String,
    ) -> Result<bool, ApiError> {
        self.require_root(&header, conn).await?;
        self.give_back(None, container_id).await
    }

    async fn release_as(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        owner: String,
        container_id: String,
    ) -> Result<bool, ApiError> {
        self.require_root(&header, conn).await?;
        self.give_back(Some(owner), container_id).await
    }

    async fn inventory(&self) -> Result<String, ApiError> {
        self.blocking(|s| to_json(s.ledger().inventory())).await
    }

    async fn list_slices(&self) -> Result<String, ApiError> {
        self.blocking(|s| to_json(&s.status().slices)).await
    }

    async fn status(&self) -> Result<String, ApiError> {
        self.blocking(|s| to_json(&s.status())).await
    }

    #[zbus(property)]
    fn version(&self) -> String {
        env!("CARGO_PKG_VERSION").to_string()
    }

    /// The driver showed container `container_id` holding `used` bytes on GPU `gpu_uuid`,
    /// more than its `limit` (plus the backstop's tolerance); `action` is what the agent did
    /// (`log`, `kill`).
    #[zbus(signal)]
    pub async fn over_limit(
        emitter: &zbus::object_server::SignalEmitter<'_>,
        container_id: &str,
        gpu_uuid: &str,
        used: u64,
        limit: u64,
        action: &str,
    ) -> zbus::Result<()>;

    /// A container's usage region was found tampered with (`reason` says how); sent once per
    /// container and kind of tampering.
    #[zbus(signal)]
    pub async fn usage_tampered(
        emitter: &zbus::object_server::SignalEmitter<'_>,
        container_id: &str,
        reason: &str,
    ) -> zbus::Result<()>;
}
