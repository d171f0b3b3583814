//! `gpuslice`: the operator's command line over the agent's D-Bus API.

use std::collections::HashMap;
use std::ffi::OsString;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use gpuslice_agent_api::{self as client, AgentProxy, Status};
use gpuslice_core::quantity::human_bytes;
use gpuslice_core::{Claim, ClaimState};

#[derive(Parser)]
#[command(
    name = "gpuslice",
    version,
    about = "Inspect and manage GPU slices on this node"
)]
struct Cli {
    /// D-Bus address of the agent's bus instead of the system bus.
    #[arg(long, global = true, env = "GPUSLICE_BUS_ADDRESS")]
    bus_address: Option<String>,
    /// The agent's private socket, tried before the bus (root only). Default:
    /// /run/gpuslice-agent/private when the agent is on the system bus.
    #[arg(long, global = true, env = "GPUSLICE_AGENT_SOCKET")]
    agent_socket: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the GPUs, their allocation and every slice.
    Status {
        #[arg(long)]
        json: bool,
        /// Show whole container ids (64-hex engine ids are shortened to 12, as `docker ps`
        /// and `podman ps` show them)
        #[arg(long)]
        no_trunc: bool,
    },
    /// Claim a slice for a container id from annotations (as the runtime does at create).
    Claim {
        container_id: String,
        /// An annotation KEY=VALUE, e.g. gpuslice.io/memory=2Gi (repeatable).
        #[arg(short = 'a', long = "annotation", value_name = "KEY=VALUE")]
        annotations: Vec<OsString>,
        #[arg(long)]
        json: bool,
        /// Also write the slice's CDI spec (device `gpuslice.io/slice=CONTAINER_ID`) for
        /// engines that read CDI (`podman run --device gpuslice.io/slice=…`); the agent
        /// removes it when the claim is released.
        #[arg(long)]
        cdi: bool,
        /// Where the CDI spec is written.
        #[arg(long, default_value = "/var/run/cdi", requires = "cdi")]
        cdi_dir: std::path::PathBuf,
    },
    /// CDI specs (Container Device Interface).
    Cdi {
        #[command(subcommand)]
        command: CdiCommand,
    },
    /// Record the pid of a claimed container (as the runtime wrapper and its createRuntime hook do).
    Activate { container_id: String, pid: u32 },
    /// Release a container's claim (as the poststop hook does).
    Release { container_id: String },
}

#[derive(Subcommand)]
enum CdiCommand {
    /// Write the CDI spec of this node's whole GPUs (kind gpuslice.io/gpu: devices by index,
    /// by UUID, and `all`). A container given one claims its GPU whole through the agent when
    /// it is created, and is refused where the GPU holds slices.
    Generate {
        /// The file to write (`-` for standard output), e.g. /etc/cdi/gpuslice.io-gpu.json.
        #[arg(long, short, default_value = "-")]
        output: std::path::PathBuf,
    },
}

/// Splits `KEY=VALUE` arguments, refusing ones that are not UTF-8 or have no `=`.
fn annotations(raw: &[OsString]) -> Result<HashMap<String, String>> {
    let mut out = HashMap::new();
    for a in raw {
        let bytes = a.as_encoded_bytes();
        let Some(eq) = bytes.iter().position(|b| *b == b'=') else {
            bail!("annotation {:?}: expected KEY=VALUE", a.to_string_lossy());
        };
        let key = String::from_utf8_lossy(&bytes[..eq]).into_owned();
        let Ok(value) = std::str::from_utf8(&bytes[eq + 1..]) else {
            bail!(
                "annotation {key}={:?}: value is not valid UTF-8",
                String::from_utf8_lossy(&bytes[eq + 1..])
            );
        };
        if std::str::from_utf8(&bytes[..eq]).is_err() {
            bail!("annotation {key:?}={value:?}: key is not valid UTF-8");
        }
        out.insert(key, value.to_string());
    }
    Ok(out)
}

fn describe(e: &zbus::Error) -> String {
    match e {
        zbus::Error::MethodError(name, Some(msg), _) => {
            let kind = name.as_str().rsplit('.').next().unwrap_or_default();
            format!("{msg} ({kind})")
        }
        other => other.to_string(),
    }
}

fn print_claim(c: &Claim) {
    for g in &c.gpus {
        let cores = if g.cores == 0 {
            "-".to_string()
        } else {
            format!("{}%", g.cores)
        };
        println!(
            "{}\tGPU {}\t{}\t{}\t{}",
            c.container_id,
            g.index,
            g.uuid,
            human_bytes(g.memory_bytes),
            cores
        );
    }
}

/// How the GPUs are connected, as `nvidia-smi topo -m` prints it (for two GPUs or more).
fn print_topology(inventory: &gpuslice_core::inventory::Inventory) {
    let Some(t) = inventory
        .topology
        .as_ref()
        .filter(|_| inventory.gpus.len() > 1)
    else {
        return;
    };
    print!("{:<6}", "");
    for g in &inventory.gpus {
        print!(" {:>5}", format!("GPU{}", g.index));
    }
    println!("  NUMA");
    for (a, g) in inventory.gpus.iter().enumerate() {
        print!("{:<6}", format!("GPU{}", g.index));
        for b in 0..inventory.gpus.len() {
            print!(" {:>5}", t.link(a, b).to_string());
        }
        let numa = t.numa.get(a).copied().flatten();
        println!(
            "  {}",
            numa.map_or_else(|| "N/A".to_string(), |n| n.to_string())
        );
    }
    println!();
}

/// A container id as engines list it: a 64-hex id (runc, containerd, podman) shortened to its
/// first 12 digits unless `whole`; any other id as it is.
fn shown_id(id: &str, whole: bool) -> &str {
    if !whole && id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        &id[..12]
    } else {
        id
    }
}

fn print_status(s: &Status, whole_ids: bool) {
    println!(
        "Driver {}  ({} GPUs)",
        s.inventory.driver_version,
        s.gpus.len()
    );
    println!(
        "{:<4} {:<42} {:<24} {:>21} {:>6} {:>7}",
        "GPU", "UUID", "MODEL", "MEMORY ALLOC/TOTAL", "CORES", "SLICES"
    );
    for g in &s.gpus {
        let model = s
            .inventory
            .gpus
            .iter()
            .find(|i| i.uuid == g.uuid)
            .map_or("", |i| i.name.as_str());
        let mem = format!(
            "{} / {}",
            human_bytes(g.memory_allocated),
            human_bytes(g.memory_total)
        );
        let slices = if g.exclusive {
            "whole".to_string()
        } else {
            g.sharers.to_string()
        };
        println!(
            "{:<4} {:<42} {:<24} {:>21} {:>5}% {:>7}",
            g.index, g.uuid, model, mem, g.cores_allocated, slices
        );
    }
    for i in s
        .inventory
        .gpus
        .iter()
        .filter(|i| i.memory_reserved_bytes > 0)
    {
        println!(
            "GPU {}: {} of its {} kept by the driver (NVML reserved), not sliced",
            i.index,
            human_bytes(i.memory_reserved_bytes),
            human_bytes(i.memory_total_bytes)
        );
    }
    println!();
    print_topology(&s.inventory);
    if s.slices.is_empty() {
        println!("No slices.");
        return;
    }
    let width = s
        .slices
        .iter()
        .map(|sl| shown_id(&sl.claim.container_id, whole_ids).chars().count())
        .max()
        .unwrap_or(0)
        .max("CONTAINER".len());
    println!(
        "{:<width$} {:<4} {:>10} {:>10} {:>6} {:>7}  STATE",
        "CONTAINER", "GPU", "LIMIT", "USED", "CORES", "SM USED"
    );
    for sl in &s.slices {
        let mut state = match sl.claim.state {
            ClaimState::Pending => "pending".to_string(),
            ClaimState::Active { pid, .. } => format!("running (pid {pid})"),
        };
        if sl.held {
            state.push_str(", held over its SM share");
        }
        for (pos, g) in sl.claim.gpus.iter().enumerate() {
            let used = sl.used_bytes.get(pos).copied().unwrap_or(0);
            let cores = if g.cores == 0 {
                "-".to_string()
            } else {
                format!("{}%", g.cores)
            };
            // Over the last minute, as the driver's samples show it; `-` where not measured.
            let sm_used = match sl.sm_used_percent.get(pos).copied().flatten() {
                Some(percent) => format!("{percent:.0}%"),
                None => "-".to_string(),
            };
            println!(
                "{:<width$} {:<4} {:>10} {:>10} {:>6} {:>7}  {}",
                shown_id(&sl.claim.container_id, whole_ids),
                g.index,
                human_bytes(g.memory_bytes),
                human_bytes(used),
                cores,
                sm_used,
                state
            );
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode> {
    let conn = client::connect_agent(cli.bus_address.as_deref(), cli.agent_socket.as_deref())
        .await
        .context("failed to connect to D-Bus")?;
    let agent = AgentProxy::builder(&conn)
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await?;
    let fail = |e: zbus::Error| anyhow::anyhow!(describe(&e));
    match cli.command {
        Command::Status { json, no_trunc } => {
            let text = agent.status().await.map_err(fail)?;
            if json {
                println!("{text}");
            } else {
                print_status(&serde_json::from_str(&text)?, no_trunc);
            }
        }
        Command::Claim {
            container_id,
            annotations: raw,
            json,
            cdi,
            cdi_dir,
        } => {
            let ann = annotations(&raw)?;
            let borrowed: HashMap<&str, &str> =
                ann.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let text = agent.claim(&container_id, borrowed).await.map_err(fail)?;
            if cdi {
                let written = serde_json::from_str(&text)
                    .map_err(anyhow::Error::from)
                    .and_then(|claim| write_slice_spec(&claim, &cdi_dir));
                match written {
                    Ok(path) => eprintln!(
                        "gpuslice: wrote {} (device {}={container_id})",
                        path.display(),
                        gpuslice_runtime_shim::cdi::SLICE_KIND
                    ),
                    Err(e) => {
                        // Fail closed: no spec, no claim.
                        let _ = agent.release(&container_id).await;
                        return Err(e.context(format!(
                            "container {container_id}: the slice's CDI spec could not be written, so the claim is released"
                        )));
                    }
                }
            }
            if json {
                println!("{text}");
            } else {
                print_claim(&serde_json::from_str(&text)?);
            }
        }
        Command::Cdi {
            command: CdiCommand::Generate { output },
        } => {
            let inventory: gpuslice_core::inventory::Inventory =
                serde_json::from_str(&agent.inventory().await.map_err(fail)?)?;
            let spec = whole_gpu_spec(&inventory)?;
            if output.as_os_str() == "-" {
                println!("{}", serde_json::to_string_pretty(&spec)?);
            } else {
                let dir = output.parent().unwrap_or(std::path::Path::new("."));
                let file = output
                    .file_name()
                    .and_then(|f| f.to_str())
                    .context("--output names no file")?;
                gpuslice_runtime_shim::cdi::write(dir, file, &spec)?;
            }
        }
        Command::Activate { container_id, pid } => {
            agent.activate(&container_id, pid).await.map_err(fail)?;
        }
        Command::Release { container_id } => {
            if !agent.release(&container_id).await.map_err(fail)? {
                eprintln!("gpuslice: container {container_id:?} held no claim");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes the CDI spec of `claim`'s slice into `dir`: what the runtime wrapper would give a
/// container holding it (the runtime configuration, `/etc/gpuslice/runtime.json`, says where
/// the driver, the interception library and the hook are).
fn write_slice_spec(claim: &Claim, dir: &std::path::Path) -> Result<std::path::PathBuf> {
    use gpuslice_runtime_shim::{cdi, config::Config, inject, nvidia_env::Capabilities};
    let cfg = Config::load()?;
    let edits = inject::edits_for(claim, Capabilities::DEFAULT, &cfg)?;
    let spec = cdi::slice(&claim.container_id, &edits, &cfg.driver_root);
    let file = cdi::file_name(cdi::SLICE_KIND, &claim.container_id);
    Ok(cdi::write(dir, &file, &spec)?)
}

/// The CDI spec of the node's whole GPUs, from the agent's inventory and the runtime
/// configuration.
fn whole_gpu_spec(inventory: &gpuslice_core::inventory::Inventory) -> Result<serde_json::Value> {
    use gpuslice_runtime_shim::{cdi, config::Config, nvidia_env::Capabilities};
    let cfg = Config::load()?;
    let driver = cfg.driver_files(Capabilities::all())?;
    let gpus: Vec<(u32, String, u32)> = inventory
        .gpus
        .iter()
        .map(|g| (g.index, g.uuid.clone(), g.minor))
        .collect();
    Ok(cdi::whole_gpus(&driver, &gpus, &cfg.hook, &cfg.hook_env())?)
}

fn main() -> ExitCode {
    gpuslice_manpage::exit_if_asked::<Cli>("1");
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gpuslice: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gpuslice: {e:#}");
            ExitCode::FAILURE
        }
    }
}
