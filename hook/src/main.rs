//! `gpuslice-hook`: one subcommand per OCI lifecycle point, the container's state on stdin.
//!
//! - `precreate` (podman hooks.d): the OCI spec on stdin; claims a slice for a container with
//!   gpuslice annotations and writes the edited spec to stdout (the same edit as
//!   `gpuslice-runtime`); any other spec is written back byte for byte;
//! - `prestart` / `createRuntime`: for engines that can only run hooks, claims the slice,
//!   injects it imperatively and reports the container's pid (see [`prestart`]);
//! - `activate` (createRuntime; `poststart` in earlier versions' specs): tells the agent the
//!   container's pid (`Activate`) before the container's program runs, so that the agent
//!   reads the container's cgroups before anything in it can move; the pid is also the
//!   evidence that lets the agent collect the claim when the container is gone;
//! - `poststop`: releases the claim (`Release`; idempotent);
//! - `claim-gpu UUID…` (createRuntime) and `release-gpu UUID…` (poststop): the hooks of the
//!   whole-GPU CDI devices (`gpuslice cdi generate`): the container claims its GPUs whole
//!   through the agent (refused where they hold slices: the container is not created), and
//!   gives them back;
//! - `update-ldcache` (createContainer): refreshes the container's dynamic-linker cache so that
//!   the mounted driver libraries are found (best effort: they sit in the standard directory);
//! - `install-hooks`: writes the hooks.d files for this binary ([`hooks_d`]).
//!
//! An unknown subcommand is warned about and ignored (exit 0), so that a newer runtime spec
//! does not break containers.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, anyhow};
use gpuslice_agent_api::{self as client, AgentProxy};

mod beneath;
pub mod hooks_d;
pub mod prestart;

/// The fields of the OCI state this hook reads.
struct State {
    id: String,
    pid: Option<u32>,
    bundle: PathBuf,
}

fn read_state() -> Result<State> {
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("failed to read the container state from stdin")?;
    let v: serde_json::Value =
        serde_json::from_str(&text).context("the container state on stdin is not JSON")?;
    Ok(State {
        id: v["id"]
            .as_str()
            .context("the container state has no id")?
            .to_string(),
        pid: v["pid"].as_u64().and_then(|p| u32::try_from(p).ok()),
        bundle: v["bundle"].as_str().map(PathBuf::from).unwrap_or_default(),
    })
}

async fn agent() -> Result<AgentProxy<'static>> {
    let address = std::env::var("GPUSLICE_BUS_ADDRESS")
        .ok()
        .filter(|a| !a.is_empty());
    let configured = std::env::var("GPUSLICE_AGENT_SOCKET").ok();
    let conn = client::connect_agent(address.as_deref(), configured.as_deref())
        .await
        .context("failed to reach the gpuslice agent over D-Bus")?;
    Ok(AgentProxy::builder(&conn)
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await?)
}

fn agent_error(e: zbus::Error) -> anyhow::Error {
    match e {
        zbus::Error::MethodError(_, Some(msg), _) => anyhow!(msg),
        other => anyhow!(other),
    }
}

/// `--claim NAME` among a hook's arguments.
fn claim_argument(args: &[String]) -> Result<Option<String>> {
    match args {
        [] => Ok(None),
        [flag, name] if flag == "--claim" => {
            gpuslice_core::claim::validate_container_id(name)?;
            Ok(Some(name.clone()))
        }
        other => Err(anyhow!(
            "unexpected arguments {other:?} (only --claim NAME)"
        )),
    }
}

/// Fails where the container given the slice device of `claim` is privileged: with
/// `CAP_SYS_ADMIN` it could mount over the slice's directory, and with every device allowed
/// open every GPU (`allow_privileged` in the runtime configuration lets it through).
fn refuse_privileged_device(id: &str, claim: &str, bundle: &Path) -> Result<()> {
    let spec = read_spec(bundle).with_context(|| format!("container {id}"))?;
    let what = format!("is given the slice {claim} by its CDI device");
    gpuslice_runtime_shim::inject::refuse_privileged(id, &what, &spec, &config()?)
}

/// The container's OCI spec, `config.json` in its bundle.
pub(crate) fn read_spec(bundle: &Path) -> Result<serde_json::Value> {
    let path = bundle.join("config.json");
    let bytes = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_slice(&bytes).with_context(|| format!("{} is not JSON", path.display()))
}

/// The claim a container holds on whole GPUs given by CDI: its id and the first GPU's UUID,
/// so that each `gpuslice.io/gpu` device a container gets is its own claim.
fn whole_gpu_claim(container: &str, uuids: &[String]) -> String {
    format!("{container}+{}", uuids.first().map_or("", String::as_str))
}

fn run(verb: &str, args: &[String]) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match verb {
        "precreate" => precreate()?,
        "prestart" | "createRuntime" => {
            let state = read_state()?;
            let pid = state
                .pid
                .with_context(|| format!("container {}: the state has no pid", state.id))?;
            prestart::prestart(&state.id, pid, &state.bundle)?;
        }
        // `poststart`: the name the hook had in specs and hooks files of earlier versions.
        "activate" | "poststart" => {
            let state = read_state()?;
            let pid = state
                .pid
                .with_context(|| format!("container {}: the state has no pid", state.id))?;
            // A CDI slice device names its claim, which is not the container's id. Nothing
            // looked at the container before (annotations are checked when they are claimed).
            let device_claim = claim_argument(args)?;
            if let Some(claim) = &device_claim {
                refuse_privileged_device(&state.id, claim, &state.bundle)?;
            }
            let claim = device_claim.unwrap_or(state.id.clone());
            rt.block_on(async {
                agent()
                    .await?
                    .activate(&claim, pid)
                    .await
                    .map_err(agent_error)
            })
            .with_context(|| {
                format!(
                    "container {}: failed to report pid {pid} for claim {claim}",
                    state.id
                )
            })?;
        }
        "claim-gpu" => {
            let state = read_state()?;
            let pid = state
                .pid
                .with_context(|| format!("container {}: the state has no pid", state.id))?;
            anyhow::ensure!(!args.is_empty(), "claim-gpu needs the UUIDs of the GPUs");
            let id = whole_gpu_claim(&state.id, args);
            let devices = args.join(",");
            let annotations: std::collections::HashMap<&str, &str> =
                [("gpuslice.io/devices", devices.as_str())].into();
            rt.block_on(async {
                let agent = agent().await?;
                agent.claim(&id, annotations).await.map_err(agent_error)?;
                if let Err(e) = agent.activate(&id, pid).await {
                    let _ = agent.release(&id).await;
                    return Err(agent_error(e));
                }
                Ok(())
            })
            .with_context(|| {
                format!(
                    "container {}: GPUs {} cannot be given whole",
                    state.id,
                    args.join(",")
                )
            })?;
        }
        "release-gpu" => {
            let state = read_state()?;
            let id = whole_gpu_claim(&state.id, args);
            rt.block_on(async { agent().await?.release(&id).await.map_err(agent_error) })
                .with_context(|| {
                    format!(
                        "container {}: failed to give back GPUs {}",
                        state.id,
                        args.join(",")
                    )
                })?;
        }
        "poststop" => {
            let state = read_state()?;
            rt.block_on(async { agent().await?.release(&state.id).await.map_err(agent_error) })
                .with_context(|| {
                    format!("container {}: failed to release its GPU slice", state.id)
                })?;
        }
        "update-ldcache" => {
            let state = read_state()?;
            if let Err(e) = update_ldcache(&state.bundle) {
                eprintln!(
                    "gpuslice-hook: container {}: {e:#} (libraries are still found in their standard directory)",
                    state.id
                );
            }
        }
        other => eprintln!("gpuslice-hook: unknown subcommand {other:?}; ignored"),
    }
    Ok(())
}

/// The container id in a spec: podman and CRI-O end `linux.cgroupsPath` with it
/// (`machine.slice:libpod:<id>`, `/libpod_parent/libpod-<id>`, `…:crio:<id>`).
fn container_id(spec: &serde_json::Value) -> Result<String> {
    let path = spec["linux"]["cgroupsPath"]
        .as_str()
        .context("the spec has no linux.cgroupsPath to tell the container id from")?;
    let last = path.rsplit([':', '/']).next().unwrap_or_default();
    let id = last
        .trim_end_matches(".scope")
        .trim_start_matches("libpod-")
        .trim_start_matches("crio-");
    gpuslice_core::claim::validate_container_id(id)
        .with_context(|| format!("linux.cgroupsPath {path:?} holds no container id"))?;
    Ok(id.to_string())
}

/// The precreate stage. When the container cannot have its slice, the hook still answers
/// with a spec, one whose process is the refusal itself: podman (4.x) discards a failing
/// hook's stderr and shows only "exit status 1", but it shows the runtime's error in full, so
/// `exec: "/proc/self/gpuslice refused this container: annotation …": no such file or
/// directory` is how the reason reaches the user. The path lies in the container's procfs,
/// which the runtime mounts over the image's `/proc`, so no image can ship a program there
/// (a relative name could be shipped and would run). The container never runs: the runtime
/// fails before any process of the image starts, and no claim is held.
fn precreate() -> Result<()> {
    use std::io::Write;
    let mut input = Vec::new();
    std::io::stdin()
        .read_to_end(&mut input)
        .context("failed to read the spec from stdin")?;
    let mut spec: serde_json::Value =
        serde_json::from_slice(&input).context("the spec on stdin is not JSON")?;
    let out = match edit_for_precreate(&mut spec) {
        Ok(false) => input,
        Ok(true) => serde_json::to_vec(&spec)?,
        Err(e) => {
            let msg = format!("{e:#}");
            eprintln!("gpuslice-hook precreate: {msg}");
            spec["process"]["args"] = serde_json::json!([format!("{REFUSAL_PREFIX}{msg}")]);
            serde_json::to_vec(&spec)?
        }
    };
    std::io::stdout().write_all(&out)?;
    Ok(())
}

/// The configuration the wrapper reads, its warnings on stderr (where the engines log a
/// hook's output).
pub(crate) fn config() -> Result<gpuslice_runtime_shim::config::Config> {
    let cfg = gpuslice_runtime_shim::config::Config::load()?;
    for w in cfg.warnings() {
        eprintln!("gpuslice-hook: warning: {w}");
    }
    Ok(cfg)
}

/// The start of the process path of a refused container: under the container's own procfs,
/// where nothing of the image can be.
const REFUSAL_PREFIX: &str = "/proc/self/gpuslice refused this container: ";

fn edit_for_precreate(spec: &mut serde_json::Value) -> Result<bool> {
    let annotations = gpuslice_runtime_shim::spec::annotations(spec);
    if gpuslice_core::annotations::parse(&annotations)?.is_none() {
        return Ok(false);
    }
    let id = container_id(spec)?;
    let cfg = config()?;
    gpuslice_runtime_shim::inject::claim_and_edit(
        &id,
        None,
        spec,
        None,
        gpuslice_runtime_shim::inject::Reporting::ByHooks,
        &cfg,
    )
}

/// Runs the host's ldconfig on the container's root filesystem when it has a linker cache (createContainer hooks run in
/// the container's mount namespace, with its mounts in place, before it pivots into it).
fn update_ldcache(bundle: &Path) -> Result<()> {
    let spec = read_spec(bundle)?;
    let root = spec["root"]["path"]
        .as_str()
        .context("config.json has no root.path")?;
    let rootfs = if Path::new(root).is_absolute() {
        PathBuf::from(root)
    } else {
        bundle.join(root)
    };
    // An image without a linker cache finds libraries in the standard directories, where the
    // driver's are mounted; only a cache, which the loader reads first, needs refreshing.
    if !rootfs.join("etc/ld.so.cache").exists() {
        return Ok(());
    }
    let ldconfig = ["/sbin/ldconfig", "/usr/sbin/ldconfig"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .context("no ldconfig on the host")?;
    let status = Command::new(ldconfig).arg("-r").arg(&rootfs).status()?;
    anyhow::ensure!(
        status.success(),
        "ldconfig -r {} exited with {status}",
        rootfs.display()
    );
    Ok(())
}

const USAGE: &str = "usage: gpuslice-hook precreate|prestart|createRuntime|activate [--claim NAME]|poststop|update-ldcache < state.json\n       gpuslice-hook claim-gpu|release-gpu UUID... < state.json\n       gpuslice-hook install-hooks --dir DIR [--engine podman|cri-o] [--binary PATH] [--env KEY=VALUE]...";

fn main() -> ExitCode {
    let Some(verb) = std::env::args().nth(1) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    // Before anything else: joining a mount namespace needs a single-threaded process.
    if verb == "enter-mount-namespace" {
        let pid = std::env::args().nth(2).unwrap_or_default();
        return match prestart::enter_mount_namespace(&pid) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("gpuslice-hook: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    if verb == "install-hooks" {
        let args: Vec<String> = std::env::args().skip(2).collect();
        if args.iter().any(|a| a == "--help" || a == "-h") {
            println!("{}", hooks_d::USAGE);
            return ExitCode::SUCCESS;
        }
        return match hooks_d::parse(&args).and_then(|r| hooks_d::install(&r)) {
            Ok(written) => {
                for p in written {
                    println!("{}", p.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("gpuslice-hook install-hooks: {e:#}");
                ExitCode::from(2)
            }
        };
    }
    if verb == "--help" || verb == "-h" {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let args: Vec<String> = std::env::args().skip(2).collect();
    match run(&verb, &args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuslice-hook {verb}: {e:#}");
            ExitCode::FAILURE
        }
    }
}
