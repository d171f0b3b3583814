//! The Alibaba openb traces (cluster-trace-gpu-v2023, as used by the FGD paper): node and pod
//! lists, turned into the cluster model's nodes and demands.
//!
//! `gpu_milli` (the share of one GPU, 1000 = whole) maps to a slice of that share of the GPU's
//! memory (`PercentBasisPoints`) and of its SMs, so both axes move together as in the paper.
//! Per-model memory: A10 24 GiB, T4 16 GiB, P100 16 GiB, V100M16 16 GiB, V100M32 32 GiB; the
//! undisclosed G1, G2 and G3 are given 16, 32 and 48 GiB. Since every request is a share, these
//! figures change nothing in the replay; they make the slices real byte counts.

use std::path::Path;

use anyhow::{Context, Result, bail};
use std::sync::Arc;

use gpuslice_core::fit::{GpuRoom, Rules, Shape};

use crate::cluster::{Demand, NodeState};
use gpuslice_core::quantity::MemoryQuantity;
use gpuslice_core::selection::ModelSelector;
use serde::Deserialize;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// GPU memory per model, by name.
#[must_use]
pub fn model_memory(model: &str) -> u64 {
    GIB * match model {
        "A10" => 24,
        "V100M32" | "G2" => 32,
        "G3" => 48,
        _ => 16,
    }
}

#[derive(Debug, Deserialize)]
struct NodeRow {
    sn: String,
    cpu_milli: u64,
    memory_mib: u64,
    gpu: usize,
    model: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct PodRow {
    pub name: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub num_gpu: u32,
    pub gpu_milli: u32,
    #[serde(default)]
    pub gpu_spec: String,
}

/// GPU model names and their bit in a demand's model set.
#[derive(Debug, Default, Clone)]
pub struct Models(Vec<String>);

impl Models {
    pub fn index(&mut self, name: &str) -> u32 {
        if let Some(i) = self.0.iter().position(|m| m == name) {
            return i as u32;
        }
        self.0.push(name.to_string());
        (self.0.len() - 1) as u32
    }
}

/// Reads a node list (`sn,cpu_milli,memory_mib,gpu,model`).
pub fn read_nodes(path: &Path, models: &mut Models) -> Result<Vec<NodeState>> {
    let mut r = csv::Reader::from_path(path).with_context(|| format!("{}", path.display()))?;
    let mut nodes = Vec::new();
    for (i, row) in r.deserialize::<NodeRow>().enumerate() {
        let row = row.with_context(|| format!("{}: row {}", path.display(), i + 2))?;
        if models.0.len() >= 63 && !models.0.contains(&row.model) {
            bail!("{}: more than 63 GPU models", path.display());
        }
        nodes.push(NodeState {
            name: row.sn,
            model: models.index(&row.model),
            cpu_total: row.cpu_milli,
            cpu_free: row.cpu_milli,
            mem_total: row.memory_mib * MIB,
            mem_free: row.memory_mib * MIB,
            gpus: vec![GpuRoom::idle(model_memory(&row.model)); row.gpu],
            ids: Arc::from([]),
            // The traced clusters had no sharer limit; the paper's protocol replays them so.
            rules: Rules {
                max_sharers: u32::MAX,
            },
            topology: None,
            kinds: 0,
        });
    }
    if nodes.is_empty() {
        bail!("{}: no nodes", path.display());
    }
    Ok(nodes)
}

/// Reads a pod list (`name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,…]`).
pub fn read_pods(path: &Path) -> Result<Vec<PodRow>> {
    let mut r = csv::ReaderBuilder::new()
        .flexible(true)
        .from_path(path)
        .with_context(|| format!("{}", path.display()))?;
    let mut pods = Vec::new();
    for (i, row) in r.deserialize::<PodRow>().enumerate() {
        let row = row.with_context(|| format!("{}: row {}", path.display(), i + 2))?;
        if row.num_gpu > 0 && !(1..=1000).contains(&row.gpu_milli) {
            bail!(
                "{}: row {}: gpu_milli={} (a share of one GPU: 1..1000)",
                path.display(),
                i + 2,
                row.gpu_milli
            );
        }
        pods.push(row);
    }
    if pods.is_empty() {
        bail!("{}: no pods", path.display());
    }
    Ok(pods)
}

/// The demand of a trace pod.
pub fn demand(pod: &PodRow, models: &mut Models) -> Demand {
    let set = (!pod.gpu_spec.trim().is_empty()).then(|| {
        pod.gpu_spec
            .split('|')
            .map(|m| models.index(m.trim()))
            .filter(|&i| i < 64)
            .fold(0u64, |acc, i| acc | (1 << i))
    });
    let whole = pod.gpu_milli >= 1000;
    Demand {
        cpu: pod.cpu_milli,
        mem: pod.memory_mib * MIB,
        gpus: pod.num_gpu,
        shape: Shape {
            exclusive: pod.num_gpu > 0 && whole,
            memory: if pod.num_gpu == 0 || whole {
                MemoryQuantity::Bytes(0)
            } else {
                MemoryQuantity::PercentBasisPoints(pod.gpu_milli * 10)
            },
            cores: if whole { 0 } else { pod.gpu_milli / 10 },
        },
        devices: Vec::new(),
        avoid: Vec::new(),
        gpu_models: ModelSelector::default(),
        models: set,
    }
}

/// GPU milli a pod asks for in all.
#[must_use]
pub fn gpu_milli(pod: &PodRow) -> u64 {
    u64::from(pod.num_gpu) * u64::from(pod.gpu_milli)
}
