//! The create path: claim, then edit the bundle's spec; undo the claim if anything after it
//! fails.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::driver::DriverRoot;
use crate::edits::{Edits, HostPaths};
use anyhow::{Context, Result, anyhow, bail};
use gpuslice_agent_api::{self as client, AgentProxy};
use gpuslice_core::{Claim, annotations};

use crate::nvidia_env::{self, VisibleDevices};
use crate::spec;

use crate::args::Invocation;
use crate::config::Config;

async fn agent(cfg: &Config) -> Result<AgentProxy<'static>> {
    let conn = client::connect_agent(cfg.bus_address.as_deref(), cfg.agent_socket.as_deref())
        .await
        .context("failed to reach the gpuslice agent over D-Bus")?;
    AgentProxy::builder(&conn)
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await
        .context("failed to reach the gpuslice agent over D-Bus")
}

/// One connection to the agent for the whole process: the wrapper's `create` claims, then
/// reports the pid after the runtime's create, over the same connection.
struct Session {
    rt: tokio::runtime::Runtime,
    agent: AgentProxy<'static>,
}

fn session(cfg: &Config) -> Result<&'static Session> {
    static SESSION: std::sync::OnceLock<Session> = std::sync::OnceLock::new();
    if let Some(s) = SESSION.get() {
        return Ok(s);
    }
    let started = std::time::Instant::now();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let agent = rt.block_on(agent(cfg))?;
    if std::env::var_os("GPUSLICE_RUNTIME_DEBUG").is_some() {
        // A peer-to-peer connection has no name on a bus.
        let via = match agent.inner().connection().unique_name() {
            Some(_) => "the bus",
            None => "its private socket",
        };
        eprintln!(
            "gpuslice-runtime: reached the agent over {via} in {:?}",
            started.elapsed()
        );
    }
    Ok(SESSION.get_or_init(|| Session { rt, agent }))
}

/// Connects to the agent ahead of a call, so that the connection is set up while something
/// else runs; a failure shows again at the call.
pub fn connect(cfg: &Config) {
    let _ = session(cfg);
}

/// Runs `call` against the agent and waits for its answer.
fn with_agent<T, F>(cfg: &Config, call: impl FnOnce(&'static AgentProxy<'static>) -> F) -> Result<T>
where
    F: std::future::Future<Output = zbus::Result<T>>,
{
    let s = session(cfg)?;
    s.rt.block_on(call(&s.agent)).map_err(agent_error)
}

/// The message of an agent error: its own text for refusals, the transport error otherwise.
fn agent_error(e: zbus::Error) -> anyhow::Error {
    match e {
        zbus::Error::MethodError(name, Some(msg), _)
            if name.as_str().starts_with("io.gpuslice.") =>
        {
            anyhow!(msg)
        }
        other => anyhow!(other).context("the gpuslice agent did not answer"),
    }
}

/// Claims a slice for the container and edits its bundle's spec, when it asks for one;
/// `true` when it claimed one.
pub fn prepare(inv: &Invocation, cfg: &Config) -> Result<bool> {
    let bundle = inv.bundle.as_ref().context("no bundle directory")?;
    let config_path = bundle.join("config.json");
    let mut spec = spec::read(&config_path)?;
    let id = inv
        .container_id
        .as_deref()
        .context("no container id in the arguments")?;
    // `create` is followed by the runtime's `delete` through this wrapper, which releases;
    // `run` deletes the container inside the runtime, so hooks report.
    let release_by = if inv.command.as_deref() == Some("run") {
        Reporting::ByHooks
    } else {
        Reporting::ByWrapper {
            reports_pid: inv.pid_file.is_some(),
        }
    };
    let owner = inv.owner();
    let owner = Some(owner.as_str());
    let claimed = claim_and_edit(id, owner, &mut spec, Some(bundle), release_by, cfg)?;
    if claimed && let Err(e) = spec::write(&config_path, &spec) {
        let _ = release(id, owner, cfg);
        return Err(anyhow::Error::from(e).context(format!(
            "container {id}: the GPU slice could not be set up, so the container is not created"
        )));
    }
    Ok(claimed)
}

/// Who tells the agent that a container started (its pid) and that it was deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reporting {
    /// The wrapper: it releases after the runtime's `delete`, so no poststop hook is needed;
    /// with `reports_pid` (the engine asked the runtime for a pid file) it also reports the
    /// pid after the runtime's `create`, so no createRuntime hook is needed either. Each hook
    /// left out saves a process and a connection to the agent per container.
    ByWrapper { reports_pid: bool },
    /// Hooks (createRuntime, poststop): for `run`, which deletes inside the runtime, and for
    /// engines that create containers without the wrapper.
    ByHooks,
}

/// Claims a slice for container `id` and edits `spec` in memory; `false` when the container
/// asks for no GPU (the spec is untouched). On failure after the claim, the claim is released.
pub fn claim_and_edit(
    id: &str,
    owner: Option<&str>,
    spec: &mut serde_json::Value,
    bundle: Option<&Path>,
    release_by: Reporting,
    cfg: &Config,
) -> Result<bool> {
    let Some(edits) = claim_and_plan(id, owner, spec, bundle, release_by, cfg)? else {
        return Ok(false);
    };
    if let Err(e) = spec::apply(spec, &edits) {
        let _ = release(id, owner, cfg);
        return Err(anyhow::Error::from(e).context(format!(
            "container {id}: the GPU slice could not be set up, so the container is not created"
        )));
    }
    Ok(true)
}

/// Fails where the container `id` of `spec` is privileged (it could step out of any slice)
/// and the configuration does not give privileged containers a slice anyway; `what` says
/// what it asks for, in the message.
pub fn refuse_privileged(
    id: &str,
    what: &str,
    spec: &serde_json::Value,
    cfg: &Config,
) -> Result<()> {
    match spec::privileged(spec) {
        Some(why) if !cfg.allow_privileged => bail!(
            "container {id} {what} but is privileged ({why}): it could step out of any slice, so it gets none (set \"allow_privileged\": true in {} to give privileged containers a slice anyway)",
            cfg.source.as_ref().map_or_else(
                || crate::config::DEFAULT_CONFIG.to_string(),
                |p| p.display().to_string()
            )
        ),
        _ => Ok(()),
    }
}

/// Claims a slice for container `id` (created by `owner`, when the caller knows it: see
/// [`Invocation::owner`]) from the annotations of `spec` and returns what the container must
/// get; `None` when it asks for no GPU. On failure after the claim, the claim is released.
pub fn claim_and_plan(
    id: &str,
    owner: Option<&str>,
    spec: &serde_json::Value,
    bundle: Option<&Path>,
    release_by: Reporting,
    cfg: &Config,
) -> Result<Option<Edits>> {
    let mut ann = spec::annotations(spec);
    let env = spec::env(spec);
    // A container given slice devices by CDI has its GPUs: the device's NVIDIA_VISIBLE_DEVICES
    // names them for tools, and asks for nothing more.
    let given = spec::slices_given(spec);
    let from_env = if given.is_empty() {
        request_from_env(id, &mut ann, &env, cfg)?
    } else {
        None
    };
    // Checked here first so that a malformed request fails without a round trip; the agent
    // checks again and is the authority.
    if annotations::parse(&ann)?.is_none() {
        return Ok(None);
    }
    if let Some(name) = given.first() {
        bail!(
            "container {id}: already given the slice {name} by its CDI device ({}={name}), and its annotations ask for another: ask for its GPUs one way",
            crate::cdi::SLICE_KIND
        );
    }
    let capabilities =
        nvidia_env::capabilities(&env).map_err(|e| anyhow!("container {id}: {e}"))?;
    // An image with a newer driver's compat libraries runs with them (docs/runtime.md).
    let host_version = DriverRoot::new(&cfg.driver_root)
        .driver_version()
        .unwrap_or_default();
    let compat = crate::compat::find(&rootfs(spec, bundle), &host_version);
    // The image's CUDA against the driver's, before anything is claimed; its GPUs' arch and
    // brand once they are known.
    let mut required_gpu = None;
    if crate::require::any(&env) {
        let text = with_agent(cfg, |agent| agent.inventory())?;
        let inventory: gpuslice_core::inventory::Inventory =
            serde_json::from_str(&text).context("the agent's inventory is not JSON")?;
        // With compat libraries the image's own CUDA (CUDA_VERSION, as CUDA images set it)
        // is what its programs get.
        let image_cuda = compat
            .as_ref()
            .and_then(|_| nvidia_env::lookup(&env, "CUDA_VERSION"))
            .and_then(cuda_version);
        let driver = crate::require::Driver {
            version: inventory.driver_version.clone(),
            cuda: image_cuda.or(inventory.cuda_driver_version),
            arch: None,
            brand: None,
        };
        crate::require::check(&env, &driver).map_err(|e| anyhow!("container {id}: {e}"))?;
        if crate::require::names_gpu(&env) {
            required_gpu = Some((driver, inventory));
        }
    }
    refuse_privileged(id, "asks for a GPU slice", spec, cfg)?;
    let borrowed: HashMap<&str, &str> = ann.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let started = std::time::Instant::now();
    let json = with_agent(cfg, |agent| async move {
        match owner {
            Some(o) => agent.claim_as(o, id, borrowed).await,
            None => agent.claim(id, borrowed).await,
        }
    })
    .map_err(|e| match &from_env {
        Some(v) => e.context(format!(
            "container {id}: {}={v:?} asks for these GPUs whole (see docs/runtime.md; NVIDIA_VISIBLE_DEVICES=void asks for none)",
            nvidia_env::VISIBLE_DEVICES
        )),
        None => e,
    })?;
    let claimed = started.elapsed();
    let claim: Claim = serde_json::from_str(&json).context("the agent's answer is not a claim")?;
    if let Some((mut driver, inventory)) = required_gpu {
        let given: Vec<_> = claim
            .gpus
            .iter()
            .filter_map(|g| inventory.gpus.iter().find(|i| i.index == g.index))
            .collect();
        driver.arch = Some(
            given
                .iter()
                .filter_map(|i| i.compute_capability.clone())
                .collect(),
        );
        driver.brand = Some(given.iter().filter_map(|i| i.brand.clone()).collect());
        if let Err(e) = crate::require::check(&env, &driver) {
            let _ = release(id, owner, cfg);
            bail!("container {id}: {e}");
        }
    }
    let edits = match plan(
        &claim,
        capabilities,
        compat.as_ref(),
        spec,
        bundle,
        release_by,
        cfg,
    ) {
        Ok(e) => e,
        Err(e) => {
            let _ = release(id, owner, cfg);
            return Err(e.context(format!(
                "container {id}: the GPU slice could not be set up, so the container is not created"
            )));
        }
    };
    if std::env::var_os("GPUSLICE_RUNTIME_DEBUG").is_some() {
        eprintln!(
            "gpuslice-runtime: container {id}: claim {claimed:?}, plan {:?}",
            started.elapsed() - claimed
        );
    }
    Ok(Some(edits))
}

/// The rule for `NVIDIA_VISIBLE_DEVICES` (docs/runtime.md). Under Kubernetes GPUs are asked
/// for through the pod, so the variable asks for nothing (as with the toolkit's
/// `accept-nvidia-visible-devices-envvar-when-unprivileged = false`). Elsewhere (podman, runc,
/// nerdctl) it is a request as users of the toolkit make it: without gpuslice annotations, for
/// the GPUs it names (`all`: every GPU of the node) whole, through the agent like any other
/// request; with annotations that name no GPUs, for the slice to go on the GPUs it names.
/// Adds the request to `ann` and returns the variable's value when it did.
fn request_from_env(
    id: &str,
    ann: &mut std::collections::BTreeMap<String, String>,
    env: &[String],
    cfg: &Config,
) -> Result<Option<String>> {
    let visible = nvidia_env::visible_devices(env);
    if !visible.asks_for_gpus() {
        return Ok(None);
    }
    let value = nvidia_env::lookup(env, nvidia_env::VISIBLE_DEVICES)
        .unwrap_or_default()
        .to_string();
    let requested = annotations::parse(ann)?;
    if spec::created_by_kubernetes(ann) {
        if requested.is_none() {
            eprintln!(
                "gpuslice-runtime: container {id}: {}={value:?} asks for nothing under Kubernetes: GPUs are asked for through the pod's gpuslice.io resources or annotations",
                nvidia_env::VISIBLE_DEVICES
            );
        }
        return Ok(None);
    }
    let names_devices = ann.keys().any(|k| {
        k.strip_prefix(annotations::PREFIX)
            .is_some_and(|k| k.rsplit('.').next() == Some(annotations::DEVICES))
    });
    let key = |name: &str| format!("{}{name}", annotations::PREFIX);
    match (requested, visible) {
        (Some(_), VisibleDevices::List(list)) if !names_devices => {
            ann.insert(key(annotations::DEVICES), list.join(","));
        }
        (Some(_), _) => return Ok(None),
        (None, VisibleDevices::List(list)) => {
            ann.insert(key(annotations::DEVICES), list.join(","));
        }
        (None, _) => {
            let gpus = gpu_device_count(&cfg.driver_root);
            if gpus == 0 {
                bail!(
                    "container {id}: {}={value:?} asks for every GPU, and driver root {} has no /dev/nvidia<N>",
                    nvidia_env::VISIBLE_DEVICES,
                    cfg.driver_root.display()
                );
            }
            ann.insert(key(annotations::GPUS), gpus.to_string());
        }
    }
    Ok(Some(value))
}

/// How many GPU device nodes (`/dev/nvidia<N>`) the driver root has.
fn gpu_device_count(driver_root: &Path) -> usize {
    std::fs::read_dir(driver_root.join("dev")).map_or(0, |d| {
        d.flatten()
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_prefix("nvidia"))
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            })
            .count()
    })
}

/// A CUDA version as CUDA_VERSION writes it (`12.6.1`), as the driver API numbers it (12060).
fn cuda_version(v: &str) -> Option<i32> {
    let mut parts = v.trim().split('.').map(|p| p.parse::<i32>().ok());
    let major = parts.next()??;
    let minor = parts.next().flatten().unwrap_or(0);
    Some(major * 1000 + minor * 10)
}

/// The container's root filesystem on the host.
#[must_use]
pub fn rootfs(spec: &serde_json::Value, bundle: Option<&Path>) -> PathBuf {
    let root = spec["root"]["path"].as_str().unwrap_or("rootfs");
    match bundle {
        Some(b) if !Path::new(root).is_absolute() => b.join(root),
        _ => PathBuf::from(root),
    }
}

/// What a container with `claim` gets, before the hooks are chosen for how it is created:
/// checks that the interception library and its fronts are in place (without them the
/// limits cannot be enforced), finds the driver's files for `capabilities`, and adds the
/// configuration's extra mounts.
pub fn edits_for(
    claim: &Claim,
    capabilities: nvidia_env::Capabilities,
    cfg: &Config,
) -> Result<Edits> {
    if !cfg.interception_library.exists() {
        bail!(
            "interception library {} is missing: without it the memory limit cannot be enforced",
            cfg.interception_library.display()
        );
    }
    let driver = cfg.driver_files(capabilities)?;
    let host = HostPaths {
        container_dir: cfg.run_dir.join(&claim.container_id),
        interception_library: cfg.interception_library.clone(),
        hook: cfg.hook.clone(),
        hook_env: cfg.hook_env(),
    };
    for f in gpuslice_core::layout::FRONTS {
        let front = crate::edits::front_path(&host, f);
        if !front.exists() {
            bail!(
                "{} (the {} a container loads) is missing beside the interception library: without it the memory limit cannot be enforced",
                front.display(),
                f.soname
            );
        }
    }
    Ok(Edits::for_claim(claim, &driver, &host)?)
}

fn plan(
    claim: &Claim,
    capabilities: nvidia_env::Capabilities,
    compat: Option<&crate::compat::Compat>,
    spec: &serde_json::Value,
    bundle: Option<&Path>,
    release_by: Reporting,
    cfg: &Config,
) -> Result<Edits> {
    let mut edits = edits_for(claim, capabilities, cfg)?;
    if let Some(c) = compat {
        crate::compat::apply(&mut edits, c);
    }
    // Only an image with a linker cache needs it refreshed (see gpuslice-hook update-ldcache);
    // leaving the hook out otherwise saves a process per container start.
    if !rootfs(spec, bundle).join("etc/ld.so.cache").exists() {
        edits
            .hooks
            .retain(|h| h.point != crate::edits::HookPoint::CreateContainer);
    }
    if let Reporting::ByWrapper { reports_pid } = release_by {
        edits.hooks.retain(|h| {
            h.point != crate::edits::HookPoint::Poststop
                && !(reports_pid && h.point == crate::edits::HookPoint::CreateRuntime)
        });
    }
    Ok(edits)
}

/// Releases the claim of `id`, as `owner` when the caller knows it (the agent refuses to
/// release another owner's claim).
pub fn release(id: &str, owner: Option<&str>, cfg: &Config) -> Result<bool> {
    with_agent(cfg, |agent| async move {
        match owner {
            Some(o) => agent.release_as(o, id).await,
            None => agent.release(id).await,
        }
    })
}

/// Reports that container `id` runs as `pid` (what the createRuntime hook does otherwise).
pub fn activate(id: &str, pid: u32, cfg: &Config) -> Result<()> {
    with_agent(cfg, |agent| async move { agent.activate(id, pid).await }).map(|_| ())
}

/// Releases the claim of `id` if the container has a gpuslice directory (so that deleting a
/// container without a GPU costs no round trip to the agent).
pub fn release_if_claimed(id: &str, owner: Option<&str>, cfg: &Config) -> Result<()> {
    if cfg.run_dir.join(id).exists() {
        release(id, owner, cfg)?;
    }
    Ok(())
}
