//! What a node has: its GPUs as the driver reports them, and what is allocated on each.

use serde::{Deserialize, Serialize};

use crate::fit::{GpuRoom, NodeView, Rules};
use crate::topology::Topology;

/// One physical GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// Index in NVML order.
    pub index: u32,
    pub uuid: String,
    /// Product name, e.g. `NVIDIA A10`.
    pub name: String,
    /// Device memory as NVML reports it (`total`).
    pub memory_total_bytes: u64,
    /// Part of it the driver and firmware keep for themselves (NVML's `reserved`): no process
    /// can be given it, so no slice is.
    #[serde(default)]
    pub memory_reserved_bytes: u64,
    /// Minor number of `/dev/nvidiaN`.
    pub minor: u32,
    /// PCI bus id, `DDDDDDDD:BB:DD.F`.
    pub pci_bus_id: String,
    /// NUMA node the GPU is attached to, when the driver knows.
    pub numa_node: Option<u32>,
    /// CUDA compute capability, `major.minor` (`8.6`), when the driver tells.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_capability: Option<String>,
    /// The product brand NVML reports, as `NVIDIA_REQUIRE_*`'s `brand` names it (`nvidia`,
    /// `tesla`, `geforce`, ...: [`BRANDS`]), when the driver tells.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brand: Option<String>,
}

/// NVML's product brands (`nvmlBrandType_t`, by value) as the NVIDIA container toolkit's
/// `NVIDIA_REQUIRE_*` constraints name them (`brand=nvidia`), and as NVIDIA's DRA driver
/// publishes them (`Nvidia`). Data-center GPUs report `NVIDIA` on current drivers (a T4 with
/// driver 530 and an H100 with 560 both do, in `nvidia-smi -q`'s "Product Brand").
pub const BRANDS: [(u32, &str, &str); 17] = [
    (0, "unknown", "Unknown"),
    (1, "quadro", "Quadro"),
    (2, "tesla", "Tesla"),
    (3, "nvs", "NVS"),
    (4, "grid", "Grid"),
    (5, "geforce", "GeForce"),
    (6, "titan", "Titan"),
    (7, "nvidiavapps", "NvidiaVApps"),
    (8, "nvidiavpc", "NvidiaVPC"),
    (9, "nvidiavcs", "NvidiaVCS"),
    (10, "nvidiavws", "NvidiaVWS"),
    (11, "nvidiacloudgaming", "NvidiaCloudGaming"),
    (12, "quadrortx", "QuadroRTX"),
    (13, "nvidiartx", "NvidiaRTX"),
    (14, "nvidia", "Nvidia"),
    (15, "geforcertx", "GeForceRTX"),
    (16, "titanrtx", "TitanRTX"),
];

/// The `NVIDIA_REQUIRE_*` name of NVML brand `value`; None for a value this version does not
/// know.
#[must_use]
pub fn brand_name(value: u32) -> Option<&'static str> {
    BRANDS.iter().find(|b| b.0 == value).map(|b| b.1)
}

/// How NVIDIA's DRA driver writes the brand named `name` (`nvidia` → `Nvidia`).
#[must_use]
pub fn brand_display(name: &str) -> Option<&'static str> {
    BRANDS.iter().find(|b| b.1 == name).map(|b| b.2)
}

impl GpuInfo {
    /// What slices can be given of this GPU: its memory less the driver's reservation.
    #[must_use]
    pub fn memory_usable_bytes(&self) -> u64 {
        self.memory_total_bytes
            .saturating_sub(self.memory_reserved_bytes)
    }
}

/// The node's GPUs and driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    pub driver_version: String,
    /// CUDA driver API version, e.g. 12040.
    pub cuda_driver_version: Option<i32>,
    pub gpus: Vec<GpuInfo>,
    /// How the GPUs are connected, when NVML tells.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<Topology>,
}

/// What is already allocated on one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuLoad {
    pub index: u32,
    pub uuid: String,
    pub minor: u32,
    /// The GPU's model name (NVML's), which `gpuslice.io/gpu-model` is matched against.
    #[serde(default)]
    pub model: String,
    pub memory_total: u64,
    pub memory_allocated: u64,
    /// Percent of the SMs reserved by slices.
    pub cores_allocated: u32,
    /// Slices on this GPU.
    pub sharers: u32,
    /// Held whole by one container.
    pub exclusive: bool,
}

impl GpuLoad {
    /// What is free on this GPU, as the fit model reads it.
    #[must_use]
    pub fn room(&self) -> GpuRoom {
        GpuRoom {
            memory_total: self.memory_total,
            memory_free: self.memory_free(),
            cores_free: self.cores_free(),
            sharers: self.sharers,
            exclusive: self.exclusive,
        }
    }

    #[must_use]
    pub fn memory_free(&self) -> u64 {
        self.memory_total.saturating_sub(self.memory_allocated)
    }
    #[must_use]
    pub fn cores_free(&self) -> u32 {
        100u32.saturating_sub(self.cores_allocated)
    }
}

/// A node's GPUs with what is allocated on them and the node's rules: how the agent's ledger
/// reads to the fit model.
#[derive(Debug, Clone, Copy)]
pub struct NodeLoads<'a> {
    pub gpus: &'a [GpuLoad],
    pub rules: Rules,
    /// How the GPUs are connected, in the order of `gpus`.
    pub topology: Option<&'a Topology>,
}

impl NodeView for NodeLoads<'_> {
    fn gpu_count(&self) -> usize {
        self.gpus.len()
    }
    fn room(&self, pos: usize) -> GpuRoom {
        self.gpus[pos].room()
    }
    fn index(&self, pos: usize) -> u32 {
        self.gpus[pos].index
    }
    fn uuid(&self, pos: usize) -> &str {
        &self.gpus[pos].uuid
    }
    fn model(&self, pos: usize) -> &str {
        &self.gpus[pos].model
    }
    fn rules(&self) -> Rules {
        self.rules
    }
    fn topology(&self) -> Option<&Topology> {
        self.topology.filter(|t| t.covers(self.gpus.len()))
    }
}
