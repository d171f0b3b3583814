//! The node description file.

use std::path::{Path, PathBuf};

use gpuslice_core::topology::{LAYOUT_NVSWITCH_LINKS, LAYOUT_NVSWITCHES, Layout};
use serde::{Deserialize, Serialize};

/// Environment variable naming the node description file.
pub const NODE_ENV: &str = "GPUSLICE_SIM_NODE";
/// Where the node description sits relative to the fake libraries' directory.
pub const NODE_BESIDE_LIBRARY: &str = "gpuslice-sim/node.json";
/// The system-wide fallback.
pub const NODE_SYSTEM_PATH: &str = "/etc/gpuslice-sim/node.json";

/// One simulated GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimGpu {
    pub uuid: String,
    pub name: String,
    pub memory_bytes: u64,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Minor number of `/dev/nvidiaN`.
    pub minor: u32,
    /// `DDDDDDDD:BB:DD.F`.
    pub pci_bus_id: String,
    pub numa_node: Option<u32>,
    /// The PCIe switch the GPU sits behind: GPUs behind the same one are a single bridge
    /// apart (`PIX`). None: a switch of its own.
    #[serde(default)]
    pub pci_switch: Option<u32>,
    /// The GPU's NVLinks in link order, each named by the PCI bus id of the GPU at its other
    /// end (several links to one GPU are bonded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvlinks: Vec<String>,
    /// Compute capability, major and minor.
    pub compute_capability: (u32, u32),
    /// NVML's product brand (`nvmlBrandType_t`): `NVML_BRAND_NVIDIA` (14), as data-center GPUs
    /// report it on current drivers.
    #[serde(default = "default_brand")]
    pub brand: u32,
    /// The board's power limit in milliwatts (`nvmlDeviceGetEnforcedPowerLimit`); 0: NVML
    /// answers the power calls `NOT_SUPPORTED`.
    #[serde(default)]
    pub power_limit_mw: u32,
    /// The most the graphics (and SM) clock and the memory clock run at, in MHz
    /// (`nvmlDeviceGetMaxClockInfo`); 0: the clock calls answer `NOT_SUPPORTED`.
    #[serde(default)]
    pub max_graphics_clock_mhz: u32,
    #[serde(default)]
    pub max_memory_clock_mhz: u32,
    /// Device memory a context takes when it is created (the driver's own reservation).
    #[serde(default)]
    pub context_bytes: u64,
    /// Device memory the driver and firmware set aside for themselves: part of NVML's total,
    /// never given to a process (NVML's `reserved`, counted in v1's `used`).
    #[serde(default)]
    pub reserved_bytes: u64,
    /// Simulated execution time of one thread block of a kernel, in nanoseconds: a process's
    /// kernels run one after the other on the device, each `blocks × kernel_ns_per_block`
    /// long, launches block while [`LAUNCH_QUEUE_LAUNCHES`] are pending, and
    /// NVML reports each process's SM utilization from it. 0: kernels take no time.
    #[serde(default)]
    pub kernel_ns_per_block: u64,
    /// Simulated time a memset takes per KiB it sets, in nanoseconds: the driver runs memsets
    /// as kernels of its own, queued on the device and counted in NVML's SM utilization as
    /// kernels are. 0: memsets take no time.
    #[serde(default)]
    pub memset_ns_per_kib: u64,
    /// The driver's utilization sampling period, in microseconds: NVML reports each
    /// process's SM utilization once per period, over that period, when it has ended
    /// ("between 1 second and 1/6 second, depending on the product", NVML's reference).
    #[serde(default = "default_utilization_period_us")]
    pub utilization_period_us: u64,
}

/// `NVML_BRAND_NVIDIA`, the brand every simulated model reports (a T4 with driver 530 and an
/// H100 with 560 report it in `nvidia-smi -q`'s "Product Brand").
#[must_use]
pub fn default_brand() -> u32 {
    14
}

/// One sixth of a second, the sampling period of the data-center GPUs.
#[must_use]
pub fn default_utilization_period_us() -> u64 {
    166_667
}

/// Launches a process may have pending on a simulated device before its launches block, as
/// a real launch blocks once its stream's queue is full (about a thousand launches, seen on
/// real GPUs).
pub const LAUNCH_QUEUE_LAUNCHES: usize = 1024;

/// The PCI bus id of NVSwitch `k` of a simulated NVSwitch system.
#[must_use]
pub fn nvswitch_bus_id(k: usize) -> String {
    format!("00000000:{:02X}:00.0", 0xC0 + k)
}

/// A simulated node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSpec {
    pub driver_version: String,
    /// CUDA driver API version as `cuDriverGetVersion` reports it (12040 = 12.4).
    pub cuda_driver_version: i32,
    /// Directory where processes record the device memory they hold (shared by every
    /// process that loads the fake libcuda).
    pub state_dir: PathBuf,
    pub gpus: Vec<SimGpu>,
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(
        "no simulated node description: set {NODE_ENV}, or put one at {NODE_BESIDE_LIBRARY} beside the library or at {NODE_SYSTEM_PATH}"
    )]
    NotFound,
    #[error("failed to read node description {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("node description {path} is not valid")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("unknown GPU model {0:?} (known: {1})")]
    Model(String, String),
    #[error("unknown GPU layout {0:?} (known: pcie, nvlink-pairs, nvswitch)")]
    Layout(String),
    #[error("driver version {0:?}: not a driver branch the simulator knows (known: {1})")]
    Driver(String, String),
}

/// A GPU model the simulator knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Model {
    /// Short name, as tests and the command line give it.
    pub short: &'static str,
    /// Product name, as NVML and `cuDeviceGetName` report it.
    pub product: &'static str,
    pub memory_bytes: u64,
    pub sm_count: u32,
    pub compute_capability: (u32, u32),
    /// Most threads resident on one SM.
    pub threads_per_sm: u64,
    /// The board's power limit, in watts, and its most graphics and memory clocks, in MHz,
    /// as NVIDIA's product specifications and `nvidia-smi -q` give them.
    pub power_limit_w: u32,
    pub max_clocks_mhz: (u32, u32),
    /// The PCI device id and subsystem id, each with its vendor's id in the low 16 bits, as
    /// NVML's `pciDeviceId` and `pciSubSystemId` and the driver's `GPU_PCI_DEVICE_ID` and
    /// `GPU_PCI_SUBSYSTEM_ID` attributes combine them (the PCI ID Repository's entries for
    /// the product).
    pub pci_ids: (u32, u32),
}

/// Device memory a bare context took on an NVIDIA H100 80GB HBM3 with driver 580.159.04 and
/// CUDA 13.0, as `nvidia-smi --query-compute-apps` showed it for a process that only created
/// one (docs/benchmarks.md, the real-GPU runs).
pub const H100_CONTEXT_BYTES: u64 = 518 << 20;

impl Model {
    /// Device memory one context takes on this model. Measured on the H100 (see
    /// [`H100_CONTEXT_BYTES`]); for the others an estimate from what makes a context large:
    /// the driver reserves local memory for every thread that can be resident (the default
    /// stack, 1 KiB, for each of `threads_per_sm × sm_count` threads), and the rest (the
    /// driver's own code and buffers) is taken to be what it is on the H100.
    #[must_use]
    pub fn context_bytes(&self) -> u64 {
        let local = |m: &Model| m.threads_per_sm * u64::from(m.sm_count) * 1024;
        let h100 = MODELS
            .iter()
            .find(|m| m.short == "H100")
            .map_or(0, |m| H100_CONTEXT_BYTES - local(m));
        h100 + local(self)
    }
}

/// Models the simulator knows.
pub const MODELS: &[Model] = &[
    Model {
        short: "T4",
        product: "Tesla T4",
        memory_bytes: 15 << 30,
        sm_count: 40,
        compute_capability: (7, 5),
        threads_per_sm: 1024,
        power_limit_w: 70,
        max_clocks_mhz: (1590, 5001),
        pci_ids: (0x1eb8_10de, 0x12a2_10de),
    },
    Model {
        short: "A10",
        product: "NVIDIA A10",
        memory_bytes: 24 << 30,
        sm_count: 72,
        compute_capability: (8, 6),
        threads_per_sm: 1536,
        power_limit_w: 150,
        max_clocks_mhz: (1695, 6251),
        pci_ids: (0x2236_10de, 0x1482_10de),
    },
    Model {
        short: "L40S",
        product: "NVIDIA L40S",
        memory_bytes: 48 << 30,
        sm_count: 142,
        compute_capability: (8, 9),
        threads_per_sm: 1536,
        power_limit_w: 350,
        max_clocks_mhz: (2520, 9001),
        pci_ids: (0x26b9_10de, 0x1851_10de),
    },
    Model {
        short: "A100",
        product: "NVIDIA A100-SXM4-80GB",
        memory_bytes: 80 << 30,
        sm_count: 108,
        compute_capability: (8, 0),
        threads_per_sm: 2048,
        power_limit_w: 400,
        max_clocks_mhz: (1410, 1593),
        pci_ids: (0x20b2_10de, 0x1463_10de),
    },
    Model {
        short: "H100",
        product: "NVIDIA H100 80GB HBM3",
        // As NVML reported the real card's total (driver 580.159.04), not the 80 GiB of its
        // name.
        memory_bytes: 81_559 << 20,
        sm_count: 132,
        compute_capability: (9, 0),
        threads_per_sm: 2048,
        power_limit_w: 700,
        max_clocks_mhz: (1980, 2619),
        pci_ids: (0x2330_10de, 0x16c1_10de),
    },
];

/// The driver branches the simulator can stand for, each with the CUDA version its
/// `cuDriverGetVersion` reports (1000 × major + 10 × minor) and the release it is named by
/// when only the branch is given; the CUDA version is the one NVIDIA's release notes pair the
/// branch with. What a driver offers beyond the reference driver (535) is modelled only on
/// nodes whose branch has it (device attributes, `cuGetProcAddress` variants).
pub const DRIVER_BRANCHES: &[(&str, i32, &str)] = &[
    ("535", 12020, "535.247.01"),
    ("545", 12030, "545.29.06"),
    ("550", 12040, "550.54.15"),
    ("555", 12050, "555.42.06"),
    ("560", 12060, "560.35.03"),
    ("565", 12070, "565.57.01"),
    ("570", 12080, "570.195.03"),
    ("575", 12090, "575.64.05"),
    ("580", 13000, "580.95.05"),
];

/// The CUDA version of driver `version` (`580.95.05`, or its branch `580`), from its branch,
/// and the full version (the branch's named release when only the branch is given).
pub fn driver_of_version(version: &str) -> Result<(i32, String), NodeError> {
    let branch = version.split('.').next().unwrap_or_default();
    let numeric = !version.is_empty()
        && version
            .split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    DRIVER_BRANCHES
        .iter()
        .find(|(b, _, _)| numeric && *b == branch)
        .map(|(b, cuda, release)| {
            let full = if version == *b { release } else { version };
            (*cuda, full.to_string())
        })
        .ok_or_else(|| {
            NodeError::Driver(
                version.to_string(),
                DRIVER_BRANCHES
                    .iter()
                    .map(|(b, _, _)| *b)
                    .collect::<Vec<_>>()
                    .join(", "),
            )
        })
}

/// The PCI ids (see [`Model::pci_ids`]) of the product named `name`; a name no model has
/// takes the A10's.
#[must_use]
pub fn pci_ids_of_product(name: &str) -> (u32, u32) {
    MODELS
        .iter()
        .find(|m| m.product == name)
        .or_else(|| MODELS.iter().find(|m| m.short == "A10"))
        .map_or((0, 0), |m| m.pci_ids)
}

impl NodeSpec {
    /// A node of `count` identical GPUs of `model` (see [`MODELS`]); `memory` overrides the
    /// model's memory. Each context takes what one takes on that model
    /// ([`Model::context_bytes`]).
    pub fn uniform(
        model: &str,
        count: u32,
        memory: Option<u64>,
        state_dir: PathBuf,
    ) -> Result<Self, NodeError> {
        let m = MODELS
            .iter()
            .find(|m| m.short.eq_ignore_ascii_case(model))
            .ok_or_else(|| {
                NodeError::Model(
                    model.to_string(),
                    MODELS
                        .iter()
                        .map(|m| m.short)
                        .collect::<Vec<_>>()
                        .join(", "),
                )
            })?;
        let gpus = (0..count)
            .map(|i| SimGpu {
                uuid: format!("GPU-5a1ce000-0000-4000-8000-{:012x}", 0x5100 + u64::from(i)),
                name: m.product.to_string(),
                memory_bytes: memory.unwrap_or(m.memory_bytes),
                sm_count: m.sm_count,
                minor: i,
                pci_bus_id: format!("00000000:{:02X}:00.0", 0x17 + i * 0x10),
                numa_node: Some(i / 4),
                pci_switch: None,
                nvlinks: Vec::new(),
                compute_capability: m.compute_capability,
                brand: default_brand(),
                power_limit_mw: m.power_limit_w * 1000,
                max_graphics_clock_mhz: m.max_clocks_mhz.0,
                max_memory_clock_mhz: m.max_clocks_mhz.1,
                context_bytes: m.context_bytes(),
                reserved_bytes: 0,
                kernel_ns_per_block: 0,
                memset_ns_per_kib: 0,
                utilization_period_us: default_utilization_period_us(),
            })
            .collect();
        Ok(Self {
            driver_version: "550.54.15".into(),
            cuda_driver_version: 12040,
            state_dir,
            gpus,
        })
    }

    /// Stands for driver `version` (`580.95.05`, or a branch, `580`, for its release the
    /// simulator names): the version NVML and `nvidia-smi` report and the CUDA version of its
    /// branch ([`DRIVER_BRANCHES`]).
    pub fn set_driver(&mut self, version: &str) -> Result<(), NodeError> {
        (self.cuda_driver_version, self.driver_version) = driver_of_version(version)?;
        Ok(())
    }

    /// Connects the GPUs as `layout` says (`pcie`, `nvlink-pairs` or `nvswitch`: see
    /// [`gpuslice_core::topology::Layout`]): the PCIe switch and NUMA node of each GPU, and its
    /// NVLinks.
    pub fn connect(&mut self, layout: &str) -> Result<(), NodeError> {
        let layout: Layout = layout
            .parse()
            .map_err(|_| NodeError::Layout(layout.to_string()))?;
        let count = self.gpus.len();
        let bus: Vec<String> = self.gpus.iter().map(|g| g.pci_bus_id.clone()).collect();
        for (i, g) in self.gpus.iter_mut().enumerate() {
            g.pci_switch = Some(Layout::pci_switch(i));
            g.numa_node = Some(Layout::numa_node(i));
            g.nvlinks = match layout {
                // Each link reaches one of the NVSwitches, named by their own PCI bus ids.
                Layout::Nvswitch => (0..LAYOUT_NVSWITCH_LINKS)
                    .map(|l| nvswitch_bus_id(l % LAYOUT_NVSWITCHES))
                    .collect(),
                _ => layout
                    .nvlink_peer(i, count)
                    .map(|p| vec![bus[p].clone(); 4])
                    .unwrap_or_default(),
            };
        }
        Ok(())
    }

    pub fn load(path: &Path) -> Result<Self, NodeError> {
        let text = std::fs::read_to_string(path).map_err(|source| NodeError::Read {
            path: path.into(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|source| NodeError::Parse {
            path: path.into(),
            source,
        })
    }

    /// Finds and loads the node description as the fake libraries do; `library_dir` is the
    /// directory of the library asking.
    pub fn locate(library_dir: Option<&Path>) -> Result<Self, NodeError> {
        if let Some(p) = std::env::var_os(NODE_ENV).filter(|p| !p.is_empty()) {
            return Self::load(Path::new(&p));
        }
        if let Some(dir) = library_dir {
            let p = dir.join(NODE_BESIDE_LIBRARY);
            if p.exists() {
                return Self::load(&p);
            }
        }
        let p = Path::new(NODE_SYSTEM_PATH);
        if p.exists() {
            return Self::load(p);
        }
        Err(NodeError::NotFound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_takes_the_measured_figure_on_an_h100_and_less_on_smaller_cards() {
        let by = |s: &str| {
            MODELS
                .iter()
                .find(|m| m.short == s)
                .unwrap()
                .context_bytes()
        };
        assert_eq!(by("H100"), 518 << 20);
        assert_eq!(by("T4"), 294 << 20);
        assert_eq!(by("A10"), 362 << 20);
        assert_eq!(by("A100"), 470 << 20);
        assert!(by("L40S") < by("H100") && by("L40S") > by("A10"));
    }

    #[test]
    fn a_driver_is_known_by_its_branch_and_anything_else_is_refused_naming_the_branches() {
        assert_eq!(
            driver_of_version("580.82.07").unwrap(),
            (13000, "580.82.07".into())
        );
        assert_eq!(
            driver_of_version("550.54.15").unwrap(),
            (12040, "550.54.15".into())
        );
        assert_eq!(
            driver_of_version("575").unwrap(),
            (12090, "575.64.05".into())
        );
        for bad in ["", "470.82.01", "580.x", "58O.1", ".580", "580..1"] {
            let e = driver_of_version(bad).unwrap_err().to_string();
            assert!(
                e.contains(&format!("{bad:?}")) && e.contains("535, 545, 550"),
                "{bad:?}: {e}"
            );
        }
        let mut spec = NodeSpec::uniform("H100", 1, None, PathBuf::from("/tmp/x")).unwrap();
        spec.set_driver("580.95.05").unwrap();
        assert_eq!(
            (spec.driver_version.as_str(), spec.cuda_driver_version),
            ("580.95.05", 13000)
        );
        assert!(spec.set_driver("470.82.01").is_err());
        assert_eq!(
            spec.driver_version, "580.95.05",
            "a refused version changes nothing"
        );
    }

    #[test]
    fn each_model_has_its_own_pci_ids_and_an_unknown_product_takes_the_a10s() {
        let ids: std::collections::HashSet<_> = MODELS.iter().map(|m| m.pci_ids).collect();
        assert_eq!(ids.len(), MODELS.len());
        assert!(
            MODELS
                .iter()
                .all(|m| m.pci_ids.0 & 0xffff == 0x10de && m.pci_ids.1 & 0xffff == 0x10de)
        );
        assert_eq!(pci_ids_of_product("NVIDIA H100 80GB HBM3").0, 0x2330_10de);
        assert_eq!(
            pci_ids_of_product("Some GPU"),
            pci_ids_of_product("NVIDIA A10")
        );
    }
}
