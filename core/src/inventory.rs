//! What a node has: its GPUs as the driver reports them.

use serde::{Deserialize, Serialize};

/// One physical GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// Index in NVML order.
    pub index: u32,
    pub uuid: String,
    /// Product name, e.g. `NVIDIA A10`.
    pub name: String,
    pub memory_total_bytes: u64,
    /// Minor number of `/dev/nvidiaN`.
    pub minor: u32,
    /// PCI bus id, `DDDDDDDD:BB:DD.F`.
    pub pci_bus_id: String,
    /// NUMA node the GPU is attached to, when the driver knows.
    pub numa_node: Option<u32>,
}

/// The node's GPUs and driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    pub driver_version: String,
    /// CUDA driver API version, e.g. 12040.
    pub cuda_driver_version: Option<i32>,
    pub gpus: Vec<GpuInfo>,
}
