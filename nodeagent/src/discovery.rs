//! GPU discovery through NVML.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use gpuslice_core::inventory::{GpuInfo, Inventory};
use gpuslice_core::layout::{LIBRARY_DIRS, NVML_SONAME};
use nvml_wrapper::Nvml;

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("failed to load NVML from {library}")]
    Init {
        library: String,
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    #[error("NVML failed to report {what}")]
    Query {
        what: String,
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
}

/// Which NVML library to load: an explicit file, the one in a driver root's library
/// directories, or the system's.
#[must_use]
pub fn nvml_library(explicit: Option<PathBuf>, driver_root: &Path) -> PathBuf {
    explicit
        .or_else(|| {
            LIBRARY_DIRS
                .iter()
                .map(|d| driver_root.join(d).join(NVML_SONAME))
                .find(|p| p.exists())
        })
        .unwrap_or_else(|| PathBuf::from(NVML_SONAME))
}

/// Reads the node's GPUs.
pub fn discover(library: &std::path::Path) -> Result<Inventory, DiscoveryError> {
    let nvml = Nvml::builder()
        .lib_path(OsStr::new(library))
        .init()
        .map_err(|source| DiscoveryError::Init {
            library: library.display().to_string(),
            source,
        })?;
    let q = |what: &str| {
        let what = what.to_string();
        move |source| DiscoveryError::Query { what, source }
    };
    let count = nvml.device_count().map_err(q("the device count"))?;
    let mut gpus = Vec::new();
    for index in 0..count {
        let d = nvml
            .device_by_index(index)
            .map_err(q(&format!("GPU {index}")))?;
        gpus.push(GpuInfo {
            index,
            uuid: d.uuid().map_err(q(&format!("the UUID of GPU {index}")))?,
            name: d.name().map_err(q(&format!("the name of GPU {index}")))?,
            memory_total_bytes: d
                .memory_info()
                .map_err(q(&format!("the memory of GPU {index}")))?
                .total,
            minor: d
                .minor_number()
                .map_err(q(&format!("the minor number of GPU {index}")))?,
            pci_bus_id: d
                .pci_info()
                .map_err(q(&format!("the PCI bus id of GPU {index}")))?
                .bus_id,
            numa_node: d.numa_node_id().ok(),
        });
    }
    Ok(Inventory {
        driver_version: nvml.sys_driver_version().map_err(q("the driver version"))?,
        cuda_driver_version: nvml.sys_cuda_driver_version().ok(),
        gpus,
    })
}
