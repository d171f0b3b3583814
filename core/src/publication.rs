//! What a node agent publishes on its Kubernetes Node for the cluster scheduler: every GPU
//! with what is allocated on it, and the rules the agent admits claims by. The scheduler
//! places with the same fit model ([`crate::fit`]) over exactly this.

use serde::{Deserialize, Serialize};

use crate::fit::{DEFAULT_MAX_SHARERS, GpuRoom, NodeView, Rules};
use crate::topology::Topology;

/// The Node annotation on which a node agent publishes its GPUs for the cluster scheduler.
pub const NODE_STATE_ANNOTATION: &str = "gpuslice.io/node-state";

/// What a node agent publishes on its Node: each GPU and what is allocated on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodePublication {
    pub version: u32,
    pub gpus: Vec<PublishedGpu>,
    /// The most slices the agent admits on one GPU (`--max-sharers`); agents that do not
    /// publish it admit the default.
    #[serde(default = "default_max_sharers")]
    pub max_sharers: u32,
    /// The containers holding a claim made by a scheduler assignment, as
    /// [`assigned_container`] keys, sorted: once a container shows here, its slice is in
    /// `gpus` and the scheduler stops counting its own placement of it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claimed: Vec<String>,
    /// How the GPUs are connected (NVLink, PCIe, NUMA), in the order of `gpus`; agents that
    /// do not publish it leave multi-GPU placement to the policy alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<Topology>,
}

fn default_max_sharers() -> u32 {
    DEFAULT_MAX_SHARERS
}

/// How a publication names a container placed by the scheduler: `<pod UID>/<container>`.
#[must_use]
pub fn assigned_container(pod_uid: &str, container: &str) -> String {
    format!("{pod_uid}/{container}")
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedGpu {
    /// The GPU's index on the node (NVML order), which `gpuslice.io/devices` may name;
    /// agents that do not publish it list their GPUs in index order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    pub uuid: String,
    #[serde(default)]
    pub model: String,
    pub memory_total: u64,
    pub memory_allocated: u64,
    pub cores_allocated: u32,
    pub sharers: u32,
    pub exclusive: bool,
}

impl PublishedGpu {
    /// What is free on this GPU.
    #[must_use]
    pub fn room(&self) -> GpuRoom {
        GpuRoom {
            memory_total: self.memory_total,
            memory_free: self.memory_total.saturating_sub(self.memory_allocated),
            cores_free: 100u32.saturating_sub(self.cores_allocated),
            sharers: self.sharers,
            exclusive: self.exclusive,
        }
    }
}

impl NodePublication {
    /// The rules the agent admits by.
    #[must_use]
    pub fn rules(&self) -> Rules {
        Rules {
            max_sharers: self.max_sharers,
        }
    }
}

impl NodeView for NodePublication {
    fn gpu_count(&self) -> usize {
        self.gpus.len()
    }
    fn room(&self, pos: usize) -> GpuRoom {
        self.gpus[pos].room()
    }
    fn index(&self, pos: usize) -> u32 {
        self.gpus[pos]
            .index
            .unwrap_or_else(|| u32::try_from(pos).unwrap_or(u32::MAX))
    }
    fn uuid(&self, pos: usize) -> &str {
        &self.gpus[pos].uuid
    }
    fn model(&self, pos: usize) -> &str {
        &self.gpus[pos].model
    }
    fn rules(&self) -> Rules {
        NodePublication::rules(self)
    }
    fn topology(&self) -> Option<&Topology> {
        self.topology.as_ref().filter(|t| t.covers(self.gpus.len()))
    }
}
