//! `nvml.h`: NVML's types and constants.

use std::ffi::{c_char, c_uint, c_void};

pub type nvmlReturn_t = c_uint;
pub type nvmlDevice_t = *mut c_void;

pub const NVML_SUCCESS: nvmlReturn_t = 0;
pub const NVML_ERROR_UNINITIALIZED: nvmlReturn_t = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
pub const NVML_ERROR_NOT_SUPPORTED: nvmlReturn_t = 3;
pub const NVML_ERROR_NOT_FOUND: nvmlReturn_t = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
pub const NVML_ERROR_DRIVER_NOT_LOADED: nvmlReturn_t = 9;
pub const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;

/// The closest common PCIe ancestor of two GPUs (`nvmlDeviceGetTopologyCommonAncestor`).
pub type nvmlGpuTopologyLevel_t = c_uint;
pub const NVML_TOPOLOGY_INTERNAL: nvmlGpuTopologyLevel_t = 0;
pub const NVML_TOPOLOGY_SINGLE: nvmlGpuTopologyLevel_t = 10;
pub const NVML_TOPOLOGY_MULTIPLE: nvmlGpuTopologyLevel_t = 20;
pub const NVML_TOPOLOGY_HOSTBRIDGE: nvmlGpuTopologyLevel_t = 30;
pub const NVML_TOPOLOGY_NODE: nvmlGpuTopologyLevel_t = 40;
pub const NVML_TOPOLOGY_SYSTEM: nvmlGpuTopologyLevel_t = 50;

pub type nvmlEnableState_t = c_uint;
pub const NVML_FEATURE_DISABLED: nvmlEnableState_t = 0;
pub const NVML_FEATURE_ENABLED: nvmlEnableState_t = 1;
/// NVLinks one GPU may have.
pub const NVML_NVLINK_MAX_LINKS: c_uint = 18;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlMemory_t {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct nvmlPciInfo_t {
    pub bus_id_legacy: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pci_device_id: c_uint,
    pub pci_sub_system_id: c_uint,
    pub bus_id: [c_char; 32],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlUtilization_t {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// `nvmlProcessInfo_v1_t`: what the unversioned `nvmlDevice*RunningProcesses` fill.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlProcessInfo_v1_t {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
}

/// `nvmlProcessInfo_t` (`nvmlProcessInfo_v2_t`): what the `_v2` and `_v3` functions fill.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlProcessInfo_t {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlProcessUtilizationSample_t {
    pub pid: c_uint,
    /// CPU timestamp in microseconds.
    pub time_stamp: u64,
    pub sm_util: c_uint,
    pub mem_util: c_uint,
    pub enc_util: c_uint,
    pub dec_util: c_uint,
}
