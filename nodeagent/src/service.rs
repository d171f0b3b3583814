//! The agent's main loop: discovery, ledger recovery, D-Bus, metrics, garbage collection and
//! the systemd protocol (readiness, watchdog, stopping).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use gpuslice_core::Policy;
use gpuslice_core::fit::Rules;
use sd_notify::NotifyState;

use crate::dbus::{AgentApi, Shared};
use crate::gc::Evidence;
use crate::ledger::Ledger;
use crate::metrics::{CauseLabels, Metrics};
use crate::rundir::RunDir;
use crate::store::Store;
use crate::{BUS_NAME, OBJECT_PATH, discovery};

/// Everything the agent is told on its command line.
#[derive(Debug, Clone)]
pub struct Config {
    pub driver_root: PathBuf,
    pub nvml_library: Option<PathBuf>,
    pub state_dir: PathBuf,
    pub run_dir: PathBuf,
    /// Where `gpuslice claim --cdi` writes a slice's CDI spec, removed with the claim;
    /// `None` when CDI specs are not looked after.
    pub cdi_dir: Option<PathBuf>,
    pub bus_address: Option<String>,
    /// Where to serve the interface to root peer to peer ([`crate::private`]); `None`: only
    /// on the bus.
    pub private_socket: Option<PathBuf>,
    pub metrics_address: Option<SocketAddr>,
    /// HTTPS for the metrics endpoint (`None`: plain HTTP).
    pub metrics_tls: Option<crate::metrics_http::MetricsTls>,
    pub rules: Rules,
    pub default_policy: Policy,
    pub gc_interval: Duration,
    pub evidence: Evidence,
    /// Device memory charged to a slice for each CUDA context (the limits' `context_bytes`):
    /// `None` to measure what one costs on each GPU at start ([`crate::context_cost`]).
    pub context_reservation: Option<u64>,
    /// Whose scheduler assignments to honour.
    pub trust: crate::ledger::Trust,
    /// The enforcement backstop: how often to compare what the driver says each container
    /// holds with its slice (`None`: never), what to do about a container over it, and by how
    /// much it may be over before that.
    pub backstop: Option<Backstop>,
    /// Publish the GPUs on this node's Kubernetes Node (`Some`), checking every interval.
    pub publish: Option<Duration>,
    /// Post Kubernetes Events on the pods of refused, tampered, over-limit and over-share slices.
    pub kube_events: bool,
    /// The API server URL for publishing and events; `None`: in-cluster or $KUBECONFIG.
    pub kube_api: Option<String>,
    /// How often to ask the driver for its per-process SM utilization samples
    /// ([`crate::sm_time`]); `None`: never.
    pub sm_sample_interval: Option<Duration>,
    /// What to do about a container that keeps a GPU busier than its SM share
    /// ([`crate::throttle`]; it acts on the SM time, so only with `sm_sample_interval`).
    pub share_backstop: crate::throttle::ShareBackstop,
}

/// How the enforcement backstop runs (see [`crate::backstop`]).
#[derive(Debug, Clone, Copy)]
pub struct Backstop {
    pub interval: Duration,
    pub action: crate::backstop::Action,
    pub tolerance: u64,
}

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(cfg: Config) -> Result<()> {
    let shutdown = catch_shutdown_signals();
    let library = discovery::nvml_library(cfg.nvml_library.clone(), &cfg.driver_root);
    let inventory = discovery::discover(&library).context("GPU discovery failed")?;
    tracing::info!(
        gpus = inventory.gpus.len(),
        driver = %inventory.driver_version,
        library = %library.display(),
        "discovered GPUs"
    );
    let store = Store::open(&cfg.state_dir)?;
    let context_costs = match cfg.context_reservation {
        Some(bytes) => {
            tracing::info!(
                bytes,
                "each context is charged the --context-reservation given"
            );
            std::collections::BTreeMap::new()
        }
        None => measure_context_costs(&cfg.driver_root, &library),
    };
    let run = RunDir::new(&cfg.run_dir)?
        .with_context_bytes(context_costs, cfg.context_reservation.unwrap_or(0))
        .with_cdi_dir(cfg.cdi_dir.clone());
    let missing = run.missing_mount_options();
    if !missing.is_empty() {
        tracing::warn!(
            run_dir = %cfg.run_dir.display(),
            missing = %missing.join(","),
            "the run directory's filesystem is not mounted nosuid,nodev,noexec: a container's root could leave a setuid program or a device node in its usage region there (mount a tmpfs with those options, as packaging/systemd/run-gpuslice.mount does)"
        );
    }
    let (ledger, recovery) = Ledger::open(inventory, store, run, cfg.rules, cfg.default_policy)
        .context("failed to open the ledger")?;
    let ledger = ledger.with_trust(cfg.trust.clone());
    tracing::info!(claims = recovery.claims, orphans_removed = ?recovery.orphan_dirs_removed, "ledger loaded");
    for d in &recovery.damaged {
        tracing::error!("{d}; moved aside");
    }
    if !recovery.on_missing_gpus.is_empty() {
        tracing::warn!(containers = ?recovery.on_missing_gpus, "claims name GPUs this node no longer has; they are kept until released or collected");
    }
    if !recovery.over_capacity_gpus.is_empty() {
        tracing::warn!(gpus = ?recovery.over_capacity_gpus, "stored claims exceed these GPUs' capacity (did the hardware change?); no new claim fits there until some are released");
    }
    let (freezer, thawed) = crate::throttle::Freezer::open(cfg.state_dir.join("frozen"))
        .context("failed to open the records of containers held over their SM share")?;
    if !thawed.is_empty() {
        tracing::info!(containers = ?thawed, "thawed the containers a previous agent held over their SM share");
    }
    let shared = Arc::new(
        Shared::new(ledger, Metrics::new(), cfg.evidence.proc_root.clone()).with_freezer(freezer),
    );
    collect_garbage(&shared, &cfg.evidence);

    if cfg.publish.is_some() || cfg.kube_events {
        let client = match &cfg.kube_api {
            Some(url) => {
                let uri = url
                    .parse()
                    .with_context(|| format!("--kube-api {url:?}: not a URL"))?;
                kube::Client::try_from(kube::Config::new(uri))?
            }
            None => kube::Client::try_default().await.context(
                "--publish-node or --kube-events: no API access (in-cluster or $KUBECONFIG; or --kube-api)",
            )?,
        };
        if cfg.kube_events {
            tracing::info!(
                "posting Kubernetes Events on the pods of refused, tampered, over-limit and over-share slices"
            );
            shared.post_events_with(crate::events::EventSink::start(
                client.clone(),
                &cfg.trust.node,
            ));
        }
        if let Some(every) = cfg.publish {
            tracing::info!(node = %cfg.trust.node, "publishing the node's GPUs");
            tokio::spawn(crate::publish::run(
                Arc::clone(&shared),
                client,
                cfg.trust.node.clone(),
                every,
            ));
        }
    }

    if let Some(addr) = cfg.metrics_address {
        crate::metrics_http::start(addr, Arc::clone(&shared), cfg.metrics_tls.clone()).await?;
    }

    // Clients fall back to the bus without it: a socket that cannot be made is a warning.
    if let Some(path) = &cfg.private_socket {
        match crate::private::listen(path) {
            Ok(listener) => {
                tracing::info!(socket = %path.display(), "serving the D-Bus API to root on the private socket");
                tokio::spawn(crate::private::serve(listener, Arc::clone(&shared)));
            }
            Err(e) => tracing::warn!(
                "{:#}; clients reach the agent over the bus only",
                anyhow::Error::from(e)
            ),
        }
    }

    let builder = match &cfg.bus_address {
        Some(a) => zbus::connection::Builder::address(a.as_str())?,
        None => zbus::connection::Builder::system()?,
    };
    let conn = builder
        .serve_at(OBJECT_PATH, AgentApi::new(Arc::clone(&shared)))?
        .name(BUS_NAME)?
        .allow_name_replacements(false)
        .replace_existing_names(false)
        .build()
        .await
        .with_context(|| format!("failed to connect to D-Bus and own {BUS_NAME}"))?;
    tracing::info!(name = BUS_NAME, "serving D-Bus API");

    let gpus = shared.ledger().inventory().gpus.len();
    let _ = sd_notify::notify(&[
        NotifyState::Ready,
        NotifyState::Status(&format!("serving {gpus} GPU(s)")),
    ]);
    if let Some(period) = sd_notify::watchdog_enabled() {
        tokio::spawn(watchdog(Arc::clone(&shared), period / 2));
    }
    let gc_shared = Arc::clone(&shared);
    let evidence = cfg.evidence.clone();
    let interval = cfg.gc_interval;
    let gc_conn = conn.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let (s, e) = (Arc::clone(&gc_shared), evidence.clone());
            let _ = tokio::task::spawn_blocking(move || {
                collect_garbage(&s, &e);
                // Looks at every usage region, outside the ledger lock.
                drop(s.snapshot());
            })
            .await;
            announce_tampering(&gc_shared, &gc_conn).await;
        }
    });

    if let Some(b) = cfg.backstop {
        tokio::spawn(backstop(
            Arc::clone(&shared),
            conn.clone(),
            library.clone(),
            b,
        ));
    }

    if let Some(every) = cfg.sm_sample_interval {
        let (s, library) = (Arc::clone(&shared), library.clone());
        let holds = cfg.share_backstop.clone();
        tracing::info!(action = %holds.action, burst = ?holds.burst, "the SM share's backstop acts on each slice's SM time");
        std::thread::Builder::new()
            .name("sm-time".into())
            .spawn(move || crate::sm_time::run(&s, &library, every, holds))
            .context("failed to start the SM time thread")?;
    }

    let lost = tokio::select! {
        () = shutdown => None,
        e = bus_lost(&conn) => Some(e),
    };
    let _ = sd_notify::notify(&[NotifyState::Stopping]);
    shared.freezer().stop();
    drop(conn);
    match lost {
        None => {
            tracing::info!("stopping");
            Ok(())
        }
        // Exit non-zero so that the service manager starts a fresh agent, which connects
        // to the new bus and loads the same ledger.
        Some(e) => Err(anyhow::anyhow!("lost the D-Bus connection: {e}")),
    }
}

/// What one context costs on each GPU, measured by a child process on the node's driver; an
/// empty map (contexts charged nothing up front, the driver's share corrects it at the first
/// sample) when it cannot be measured.
fn measure_context_costs(
    driver_root: &std::path::Path,
    nvml: &std::path::Path,
) -> std::collections::BTreeMap<String, u64> {
    let cuda = crate::context_cost::cuda_library(driver_root);
    let measured = std::env::current_exe()
        .map_err(|e| crate::context_cost::ProbeError::Child(e.to_string()))
        .and_then(|exe| crate::context_cost::measure(&exe, &cuda, nvml, Duration::from_secs(120)));
    match measured {
        Ok(costs) => {
            for (gpu, bytes) in &costs {
                tracing::info!(%gpu, bytes, "measured what one CUDA context costs");
            }
            costs
        }
        Err(e) => {
            tracing::warn!(
                cuda = %cuda.display(),
                "cannot measure what a CUDA context costs ({e}): contexts are charged when the driver is next sampled (--enforce-interval), or give --context-reservation"
            );
            std::collections::BTreeMap::new()
        }
    }
}

/// What one sample of the driver found for some claims.
struct Sampled {
    attributed: Vec<crate::backstop::Attributed>,
    /// The container's slots' shares, where its region is believed.
    shares: std::collections::BTreeMap<String, gpuslice_core::held::DriverShare>,
}

/// Samples the driver for `claims` and publishes what it holds for each one's processes
/// beyond their counters ([`crate::held`]): each claim's sample is counted as begun before
/// its region is read, and the region is read on both sides of the driver's answer, so that
/// a counter that moved meanwhile is seen to have.
fn sample_and_publish(
    s: &Shared,
    nvml: &nvml_wrapper::Nvml,
    claims: &[gpuslice_core::Claim],
    uuids: &[String],
) -> Sampled {
    use crate::backstop;
    let procs = backstop::Procs {
        root: s.proc_root.clone(),
    };
    let run = s.ledger().run_dir().clone();
    let begun: std::collections::BTreeMap<&str, crate::held::Sample> = claims
        .iter()
        .filter_map(|c| {
            let sample = run.begin_held(&c.container_id, c.gpus.len()).ok()?;
            Some((c.container_id.as_str(), sample))
        })
        .collect();
    let regions = |claims: &[gpuslice_core::Claim]| {
        claims
            .iter()
            .map(|c| {
                let slots = run.live_slots(&c.container_id, c.gpus.len()).ok();
                (c.container_id.clone(), slots)
            })
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let before = regions(claims);
    let samples = backstop::sample(nvml, uuids);
    let after = regions(claims);
    let attributed = backstop::attribute(claims, &samples, &procs, &unactivated(&run, claims));
    let mut shares = std::collections::BTreeMap::new();
    let attributed_to =
        |c: &gpuslice_core::Claim| attributed.iter().any(|a| a.container_id == c.container_id);
    for c in claims
        .iter()
        .filter(|c| matches!(c.state, gpuslice_core::ClaimState::Active { .. }) || attributed_to(c))
    {
        let holders = backstop::holders(c, &attributed, &procs);
        // A region that cannot be believed (reported as tampering elsewhere) counts as one
        // without slots: everything the driver holds is the container's as a whole.
        let believed = before
            .get(&c.container_id)
            .and_then(Option::as_ref)
            .zip(after.get(&c.container_id).and_then(Option::as_ref));
        let none = gpuslice_core::usage::UsageSnapshot {
            gpu_count: c.gpus.len(),
            slots: Vec::new(),
        };
        let (first, second) = believed.unwrap_or((&none, &none));
        let share = crate::held::driver_share(c.gpus.len(), first, second, &holders);
        match begun.get(c.container_id.as_str()) {
            Some(sample) => sample.publish(&share),
            None => {
                tracing::debug!(container = %c.container_id, "the driver's share is not published: its file could not be mapped")
            }
        }
        if believed.is_some() {
            shares.insert(c.container_id.clone(), share);
        }
    }
    Sampled { attributed, shares }
}

/// The usage regions of the claims never activated (DRA, CLI): their processes are known by
/// mapping them ([`crate::backstop::attribute`]).
pub(crate) fn unactivated(
    run: &RunDir,
    claims: &[gpuslice_core::Claim],
) -> Vec<(String, crate::backstop::FileId)> {
    claims
        .iter()
        .filter(|c| matches!(c.state, gpuslice_core::ClaimState::Pending))
        .filter_map(|c| {
            let region = run
                .path(&c.container_id)
                .join(gpuslice_core::usage::FILE_NAME);
            Some((
                c.container_id.clone(),
                crate::backstop::FileId::of(&region)?,
            ))
        })
        .collect()
}

/// The claims and the node's GPU uuids, copied out of the ledger.
pub(crate) fn claims_and_gpus(s: &Shared) -> (Vec<gpuslice_core::Claim>, Vec<String>) {
    let ledger = s.ledger();
    let uuids = ledger
        .inventory()
        .gpus
        .iter()
        .map(|g| g.uuid.clone())
        .collect();
    (ledger.claims().cloned().collect(), uuids)
}

/// Compares, every interval, what the driver says each container holds with its slice, and
/// acts on the containers over it; publishes what the driver holds for each container's
/// processes beyond their counters ([`crate::held`]), every interval and, between them, for
/// the containers that ask ([`crate::sample_requests`]). NVML is loaded once, in its own
/// handle.
async fn backstop(shared: Arc<Shared>, conn: zbus::Connection, library: PathBuf, b: Backstop) {
    use crate::backstop::{self, Action, Procs};
    let nvml = match nvml_wrapper::Nvml::builder()
        .lib_path(library.as_os_str())
        .init()
    {
        Ok(n) => Arc::new(n),
        Err(e) => {
            tracing::error!("the enforcement backstop cannot load NVML ({e}): it does not run");
            return;
        }
    };
    let requests = Arc::new(crate::sample_requests::Requests::default());
    let mut last_requested = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(b.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The containers found holding memory no slot accounts for in recent passes.
    let unaccounted_before = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::<
        String,
        u8,
    >::new()));
    loop {
        let gpus: std::collections::BTreeMap<String, usize> = shared
            .ledger()
            .claims()
            .map(|c| (c.container_id.clone(), c.gpus.len()))
            .collect();
        let ids: Vec<String> = gpus.keys().cloned().collect();
        let run = shared.ledger().run_dir().clone();
        requests.listen_for(
            &ids,
            |id| run.path(id),
            |id| gpus.get(id).copied().unwrap_or(0),
        );
        tokio::select! {
            _ = tick.tick() => {}
            () = shared.claims_changed.notified() => continue,
            () = requests.asked() => {
                tokio::time::sleep_until(last_requested + crate::sample_requests::MIN_GAP).await;
                last_requested = tokio::time::Instant::now();
                let asking = requests.take();
                let (s, nvml) = (Arc::clone(&shared), Arc::clone(&nvml));
                let _ = tokio::task::spawn_blocking(move || {
                    let (claims, _) = claims_and_gpus(&s);
                    let claims: Vec<_> = claims
                        .into_iter()
                        .filter(|c| asking.contains(&c.container_id))
                        .collect();
                    let uuids: Vec<String> = claims
                        .iter()
                        .flat_map(|c| c.gpus.iter().map(|g| g.uuid.clone()))
                        .collect::<std::collections::BTreeSet<_>>()
                        .into_iter()
                        .collect();
                    sample_and_publish(&s, &nvml, &claims, &uuids);
                })
                .await;
                continue;
            }
        }
        let (s, nvml) = (Arc::clone(&shared), Arc::clone(&nvml));
        let unaccounted_before = Arc::clone(&unaccounted_before);
        let found = tokio::task::spawn_blocking(move || {
            let procs = Procs {
                root: s.proc_root.clone(),
            };
            let (claims, uuids) = claims_and_gpus(&s);
            let Sampled { attributed, shares } = sample_and_publish(&s, &nvml, &claims, &uuids);
            let held = backstop::sum_holdings(&attributed);
            // Every running container's GPUs, 0 where the driver shows nothing held.
            let mut driver_held: std::collections::BTreeMap<(String, String), u64> = claims
                .iter()
                .filter(|c| matches!(c.state, gpuslice_core::ClaimState::Active { .. }))
                .flat_map(|c| {
                    c.gpus
                        .iter()
                        .map(|g| ((c.container_id.clone(), g.uuid.clone()), 0))
                })
                .collect();
            for (k, h) in &held {
                driver_held.insert(k.clone(), h.bytes);
            }
            s.note_driver_held(driver_held);
            // Memory held by processes without a slot of their own is reported as tampering
            // (log, metric, UsageTampered), whether or not the container is over.
            let found = backstop::understated(&claims, &shares, &attributed, b.tolerance);
            // A process that is exiting has given up its slot a moment before the driver
            // frees its memory: what no slot accounts for is reported once it is found on a
            // second of the recent passes (it is charged to the container from the first).
            let found = backstop::found_again(
                &mut unaccounted_before
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
                found,
            );
            let checked: Vec<String> = claims.iter().map(|c| c.container_id.clone()).collect();
            s.note_understated(&checked, found);
            let mut acted_on = Vec::new();
            for v in backstop::over_slice(&claims, &held, b.tolerance) {
                let mut acted = Action::Log;
                match b.action {
                    Action::Kill => {
                        if let Some(&newest) = v.pids.last()
                            && let Some(start) = procs.start_time(newest)
                            && backstop::kill(&procs, newest, start)
                        {
                            acted = Action::Kill;
                        }
                    }
                    Action::Stop => {
                        // Of a claim several containers use, each container holding memory
                        // there (the last reported may hold none of it).
                        let firsts = claims
                            .iter()
                            .find(|c| c.container_id == v.container_id)
                            .map(|c| procs.containers_holding(&c.state, &v.pids))
                            .unwrap_or_default();
                        for r in firsts {
                            if backstop::kill(&procs, r.pid, r.start_time) {
                                acted = Action::Stop;
                            }
                        }
                    }
                    Action::Log => {}
                }
                tracing::warn!(
                    container = %v.container_id,
                    gpu = %v.gpu_uuid,
                    used = v.used,
                    limit = v.limit,
                    pids = ?v.pids,
                    action = %acted,
                    "the driver shows the container over its slice"
                );
                s.metrics
                    .over_limit
                    .get_or_create(&crate::metrics::OverLimitLabels {
                        container: v.container_id.clone(),
                        action: acted.to_string(),
                    })
                    .inc();
                acted_on.push((v, acted));
            }
            acted_on
        })
        .await
        .unwrap_or_default();
        announce_tampering(&shared, &conn).await;
        if found.is_empty() {
            continue;
        }
        let Ok(iface) = conn
            .object_server()
            .interface::<_, AgentApi>(OBJECT_PATH)
            .await
        else {
            continue;
        };
        for (v, action) in found {
            let pod = shared.pod_of(&v.container_id);
            shared.post_event(
                pod.as_ref(),
                crate::events::Happening::OverLimit {
                    container: crate::events::container_name(pod.as_ref(), &v.container_id),
                    gpu: v.gpu_uuid.clone(),
                    used: v.used,
                    limit: v.limit,
                    action: action.to_string(),
                },
            );
            let _ = AgentApi::over_limit(
                iface.signal_emitter(),
                &v.container_id,
                &v.gpu_uuid,
                v.used,
                v.limit,
                &action.to_string(),
            )
            .await;
        }
    }
}

/// Sends `UsageTampered` for every tampering found since the last call.
async fn announce_tampering(shared: &Shared, conn: &zbus::Connection) {
    let events = shared.take_tamper_events();
    if events.is_empty() {
        return;
    }
    for (id, why) in &events {
        let pod = shared.pod_of(id);
        shared.post_event(
            pod.as_ref(),
            crate::events::Happening::Tampered {
                container: crate::events::container_name(pod.as_ref(), id),
                why: why.clone(),
            },
        );
    }
    let Ok(iface) = conn
        .object_server()
        .interface::<_, AgentApi>(OBJECT_PATH)
        .await
    else {
        return;
    };
    for (id, why) in events {
        if let Err(e) = AgentApi::usage_tampered(iface.signal_emitter(), &id, &why).await {
            tracing::warn!(container = %id, "failed to announce the tampering: {e}");
        }
    }
}

/// Resolves when the bus stops answering (dbus-daemon restarted or gone): an agent that can
/// no longer be reached must not keep running as if it could.
async fn bus_lost(conn: &zbus::Connection) -> zbus::Error {
    let mut tick = tokio::time::interval(BUS_CHECK_INTERVAL);
    loop {
        tick.tick().await;
        let ping = conn.call_method(
            Some("org.freedesktop.DBus"),
            "/org/freedesktop/DBus",
            // The bus interface itself: the system bus policy allows it to everyone.
            Some("org.freedesktop.DBus"),
            "GetId",
            &(),
        );
        match tokio::time::timeout(BUS_CHECK_INTERVAL * 5, ping).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return e,
            Err(_) => return zbus::Error::Failure("the bus did not answer".into()),
        }
    }
}

/// How often the agent checks that its bus is still there.
const BUS_CHECK_INTERVAL: Duration = Duration::from_secs(2);

/// Releases the claims whose containers are gone (see [`crate::gc`]).
pub fn collect_garbage(shared: &Shared, evidence: &Evidence) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let mut ledger = shared.ledger();
    // A claim several containers use keeps those still running.
    if let Err(e) = ledger.forget_gone(|r| {
        crate::gc::process_start_time(&evidence.proc_root, r.pid) == Some(r.start_time)
    }) {
        tracing::error!("failed to forget the containers gone from claims: {e}");
    }
    let gone: Vec<(String, String)> = ledger
        .claims()
        .filter_map(|c| {
            evidence
                .gone(c, now)
                .map(|why| (c.container_id.clone(), why))
        })
        .collect();
    for (id, why) in gone {
        match ledger.release(&id) {
            Ok(_) => {
                shared
                    .metrics
                    .released
                    .get_or_create(&CauseLabels::GC)
                    .inc();
                tracing::info!(container = %id, "released claim of a container that is gone: {why}");
            }
            Err(e) => tracing::error!(container = %id, "failed to release claim: {e}"),
        }
    }
}

/// Pings the systemd watchdog while the ledger can still be locked; a deadlocked agent stops
/// pinging and is restarted.
async fn watchdog(shared: Arc<Shared>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let s = Arc::clone(&shared);
        if tokio::task::spawn_blocking(move || drop(s.ledger()))
            .await
            .is_ok()
        {
            let _ = sd_notify::notify(&[NotifyState::Watchdog]);
        }
    }
}

/// SIGTERM and SIGINT, caught from the moment this is called: before the agent says it is
/// ready, so that a stop request right after readiness is never lost to the default action.
fn catch_shutdown_signals() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate()).ok();
    let int = signal(SignalKind::interrupt()).ok();
    shutdown_signal(term, int)
}

async fn shutdown_signal(
    mut term: Option<tokio::signal::unix::Signal>,
    mut int: Option<tokio::signal::unix::Signal>,
) {
    tokio::select! {
        _ = async { match term.as_mut() { Some(s) => { s.recv().await; } None => std::future::pending().await } } => {}
        _ = async { match int.as_mut() { Some(s) => { s.recv().await; } None => std::future::pending().await } } => {}
    }
}
