//! `gpuslice-simnode`: creates a simulated GPU node (a fake driver root) for the agent, the
//! runtime and CUDA test programs to run against.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use gpuslice_core::quantity::{MemoryQuantity, parse_memory};
use gpuslice_simnode::NodeSpec;
use gpuslice_simnode::driver_root::{self, Artefacts};

#[derive(Parser)]
#[command(version, about = "Create and inspect simulated GPU nodes")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a fake driver root: device nodes, fake libcuda and libnvidia-ml, nvidia-smi.
    Create {
        /// Directory to create the driver root in.
        #[arg(long)]
        root: PathBuf,
        /// Number of GPUs (ignored with --node).
        #[arg(long, default_value_t = 4)]
        gpus: u32,
        /// GPU model: T4, A10, L40S, A100, H100 (ignored with --node).
        #[arg(long, default_value = "A10")]
        model: String,
        /// Memory per GPU instead of the model's, e.g. 15Gi (ignored with --node).
        #[arg(long)]
        memory: Option<String>,
        /// How the GPUs are connected: pcie (a PCIe switch per pair of GPUs, a NUMA node per
        /// four), nvlink-pairs (each pair also bridged by NVLink), nvswitch (every GPU's
        /// NVLinks into NVSwitches, as HGX systems) (ignored with --node).
        #[arg(long, default_value = "pcie")]
        layout: String,
        /// The NVIDIA driver the node stands for: a version (580.95.05) or a branch (580) of
        /// 535, 545, 550, 555, 560, 565, 570, 575 or 580; its CUDA version follows from the
        /// branch (580: CUDA 13.0, which CUDA 13 runtimes require) [default: 550.54.15, CUDA
        /// 12.4; with --node, the description's].
        #[arg(long)]
        driver: Option<String>,
        /// Use this node description (JSON) instead of --gpus/--model.
        #[arg(long)]
        node: Option<PathBuf>,
        /// Directory holding libcuda.so, libnvidia_ml.so and nvidia-smi as built.
        #[arg(long)]
        artefacts: Option<PathBuf>,
        /// Do not create /dev nodes (they need root).
        #[arg(long)]
        no_devices: bool,
        /// Also write the gpuslice runtime configuration (runtime.json) that selects this
        /// node: its driver root and the files its fake driver needs in containers.
        #[arg(long)]
        runtime_config: Option<PathBuf>,
    },
    /// Print the node description a driver root holds.
    Show {
        #[arg(long)]
        root: PathBuf,
    },
    /// Stand in for an OpenGL or Vulkan program: hold device memory taken through the
    /// graphics driver (NVML lists this process among the graphics processes, not the compute
    /// ones) until stdin closes. Prints `held=BYTES` once it holds them.
    HoldGraphics {
        #[arg(long)]
        root: PathBuf,
        /// GPU index.
        #[arg(long, default_value_t = 0)]
        gpu: usize,
        /// How much, e.g. 512Mi.
        #[arg(long)]
        bytes: String,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Create {
            root,
            gpus,
            model,
            memory,
            layout,
            driver,
            node,
            artefacts,
            no_devices,
            runtime_config,
        } => {
            std::fs::create_dir_all(&root)
                .with_context(|| format!("failed to create {}", root.display()))?;
            let root = root.canonicalize()?;
            let state_dir = root.join("run/gpuslice-sim");
            let mut spec = match node {
                Some(p) => NodeSpec {
                    state_dir,
                    ..NodeSpec::load(&p)?
                },
                None => {
                    let memory = memory
                        .map(|m| match parse_memory(&m) {
                            Ok(MemoryQuantity::Bytes(b)) => Ok(b),
                            Ok(MemoryQuantity::PercentBasisPoints(_)) => {
                                anyhow::bail!("--memory {m:?}: give a size, not a percentage")
                            }
                            Err(e) => anyhow::bail!("--memory {m:?}: {e}"),
                        })
                        .transpose()?;
                    let mut spec = NodeSpec::uniform(&model, gpus, memory, state_dir)?;
                    spec.connect(&layout)?;
                    spec
                }
            };
            if let Some(version) = driver {
                spec.set_driver(&version)
                    .with_context(|| format!("--driver {version:?}"))?;
            }
            let dir = match artefacts {
                Some(d) => d,
                None => std::env::current_exe()?
                    .parent()
                    .context("executable has no directory")?
                    .to_path_buf(),
            };
            driver_root::create(&root, &spec, &Artefacts::in_dir(&dir), !no_devices)?;
            if let Some(path) = runtime_config {
                let text =
                    serde_json::to_string_pretty(&driver_root::runtime_config(&root, &spec))?;
                std::fs::write(&path, text + "\n")
                    .with_context(|| format!("failed to write {}", path.display()))?;
            }
            println!("{}", root.display());
        }
        Command::Show { root } => {
            let spec = NodeSpec::load(
                &root
                    .join(driver_root::LIB_DIR)
                    .join(gpuslice_simnode::node::NODE_BESIDE_LIBRARY),
            )?;
            println!("{}", serde_json::to_string_pretty(&spec)?);
        }
        Command::HoldGraphics { root, gpu, bytes } => hold_graphics(&root, gpu, &bytes)?,
    }
    Ok(())
}

fn hold_graphics(root: &std::path::Path, gpu: usize, bytes: &str) -> Result<()> {
    let spec = NodeSpec::load(
        &root
            .join(driver_root::LIB_DIR)
            .join(gpuslice_simnode::node::NODE_BESIDE_LIBRARY),
    )?;
    let quantity = parse_memory(bytes).with_context(|| format!("--bytes {bytes}"))?;
    let total = spec
        .gpus
        .get(gpu)
        .with_context(|| format!("--gpu {gpu}: the node has {} GPUs", spec.gpus.len()))?
        .memory_bytes;
    let bytes = quantity.bytes_of(total);
    let used = gpuslice_simnode::procs::used_on(&spec.state_dir, gpu);
    anyhow::ensure!(
        used.saturating_add(bytes) <= total,
        "--bytes {bytes}: GPU {gpu} has {} bytes free",
        total.saturating_sub(used)
    );
    let record = gpuslice_simnode::procs::write_graphics(&spec.state_dir, gpu, bytes)
        .with_context(|| format!("failed to write a record in {}", spec.state_dir.display()))?;
    println!("held={bytes}");
    std::io::Write::flush(&mut std::io::stdout())?;
    std::io::copy(&mut std::io::stdin(), &mut std::io::sink())?;
    std::fs::remove_file(&record)?;
    Ok(())
}
