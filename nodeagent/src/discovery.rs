//! GPU discovery through NVML.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use gpuslice_core::inventory::{GpuInfo, Inventory};
use gpuslice_core::layout::{LIBRARY_DIRS, NVML_SONAME};
use gpuslice_core::topology::{Link, Topology};
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::TopologyLevel;

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
        let memory = d
            .memory_info()
            .map_err(q(&format!("the memory of GPU {index}")))?;
        gpus.push(GpuInfo {
            index,
            uuid: d.uuid().map_err(q(&format!("the UUID of GPU {index}")))?,
            name: d.name().map_err(q(&format!("the name of GPU {index}")))?,
            memory_total_bytes: memory.total,
            memory_reserved_bytes: memory.reserved,
            minor: d
                .minor_number()
                .map_err(q(&format!("the minor number of GPU {index}")))?,
            pci_bus_id: d
                .pci_info()
                .map_err(q(&format!("the PCI bus id of GPU {index}")))?
                .bus_id,
            numa_node: d.numa_node_id().ok(),
            compute_capability: d
                .cuda_compute_capability()
                .ok()
                .map(|c| format!("{}.{}", c.major, c.minor)),
            brand: d.brand().ok().and_then(brand_name),
        });
    }
    Ok(Inventory {
        driver_version: nvml.sys_driver_version().map_err(q("the driver version"))?,
        cuda_driver_version: nvml.sys_cuda_driver_version().ok(),
        topology: topology(&nvml, &gpus),
        gpus,
    })
}

/// NVLinks a GPU may have (`NVML_NVLINK_MAX_LINKS`).
const NVLINK_MAX_LINKS: u32 = 18;

/// How the GPUs are connected, as `nvidia-smi topo -m` reads it from NVML: the active
/// NVLinks between each pair (each link's remote end by PCI bus id: another GPU, or an
/// NVSwitch that joins the GPUs reaching it), else their closest common PCIe ancestor. None where NVML cannot tell the PCIe path (then multi-GPU placement
/// is left to the policy alone).
fn topology(nvml: &Nvml, gpus: &[GpuInfo]) -> Option<Topology> {
    let devices: Vec<_> = gpus
        .iter()
        .map(|g| nvml.device_by_index(g.index).ok())
        .collect::<Option<_>>()?;
    let same_bus = |a: &str, b: &str| a.eq_ignore_ascii_case(b);
    // nvlinks[a][b]: active links from GPU a to GPU b; fabric[a]: the links from GPU a that
    // reach something else (an NVSwitch), by its PCI bus id.
    let mut nvlinks = vec![vec![0u8; gpus.len()]; gpus.len()];
    let mut fabric: Vec<Vec<(String, u8)>> = vec![Vec::new(); gpus.len()];
    for (a, d) in devices.iter().enumerate() {
        for link in 0..NVLINK_MAX_LINKS {
            let l = d.link_wrapper_for(link);
            if !l.is_active().unwrap_or(false) {
                continue;
            }
            let Ok(remote) = l.remote_pci_info() else {
                continue;
            };
            match gpus
                .iter()
                .position(|g| same_bus(&g.pci_bus_id, &remote.bus_id))
            {
                Some(b) => nvlinks[a][b] = nvlinks[a][b].saturating_add(1),
                None => match fabric[a]
                    .iter_mut()
                    .find(|(s, _)| same_bus(s, &remote.bus_id))
                {
                    Some((_, n)) => *n = n.saturating_add(1),
                    None => fabric[a].push((remote.bus_id, 1)),
                },
            }
        }
    }
    // GPUs on the same NVSwitches reach each other through them, as fast as the fewer of
    // their links allow (nvidia-smi shows NV18 between every pair of an H100 HGX system).
    let fabric_links: Vec<u8> = fabric
        .iter()
        .map(|f| f.iter().map(|(_, n)| *n).fold(0u8, u8::saturating_add))
        .collect();
    for a in 0..gpus.len() {
        for b in 0..gpus.len() {
            let shared = fabric[a]
                .iter()
                .any(|(s, _)| fabric[b].iter().any(|(t, _)| same_bus(s, t)));
            if a != b && shared {
                let through = fabric_links[a].min(fabric_links[b]);
                nvlinks[a][b] = nvlinks[a][b].max(through);
            }
        }
    }
    let mut links = vec![vec![Link::Same; gpus.len()]; gpus.len()];
    for a in 0..gpus.len() {
        for b in 0..gpus.len() {
            if a == b {
                continue;
            }
            links[a][b] = if nvlinks[a][b] > 0 {
                Link::NvLink(nvlinks[a][b])
            } else {
                let other = nvml.device_by_index(gpus[b].index).ok()?;
                let level = devices[a].topology_common_ancestor(other).ok()?;
                pcie_link(level)
            };
        }
    }
    Some(Topology {
        numa: gpus.iter().map(|g| g.numa_node).collect(),
        links,
    })
}

/// The link `nvidia-smi topo -m` prints for a common PCIe ancestor.
fn pcie_link(level: TopologyLevel) -> Link {
    match level {
        TopologyLevel::Internal | TopologyLevel::Single => Link::SingleBridge,
        TopologyLevel::Multiple => Link::MultipleBridges,
        TopologyLevel::HostBridge => Link::HostBridge,
        TopologyLevel::Node => Link::NumaNode,
        TopologyLevel::System => Link::System,
    }
}

/// The `NVIDIA_REQUIRE_*` name of an NVML brand ([`gpuslice_core::inventory::BRANDS`]).
fn brand_name(brand: nvml_wrapper::enum_wrappers::device::Brand) -> Option<String> {
    use nvml_wrapper::enum_wrappers::device::Brand;
    let value = match brand {
        Brand::Unknown => 0,
        Brand::Quadro => 1,
        Brand::Tesla => 2,
        Brand::NVS => 3,
        Brand::GRID => 4,
        Brand::GeForce => 5,
        Brand::Titan => 6,
        Brand::VApps => 7,
        Brand::VPC => 8,
        Brand::VCS => 9,
        Brand::VWS => 10,
        // The cloud gaming brand's older name, the same value.
        Brand::CloudGaming | Brand::VGaming => 11,
        Brand::QuadroRTX => 12,
        Brand::NvidiaRTX => 13,
        Brand::Nvidia => 14,
        Brand::GeForceRTX => 15,
        Brand::TitanRTX => 16,
    };
    gpuslice_core::inventory::brand_name(value).map(str::to_string)
}
