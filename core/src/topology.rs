//! How a node's GPUs are connected to each other, as `nvidia-smi topo -m` shows it: each
//! pair joined by NVLink (`NV<links>`) or by a PCIe path (`PIX`, `PXB`, `PHB`, `NODE`, `SYS`),
//! and each GPU's NUMA node. The agent reads it from NVML and publishes it with the node;
//! a request for several GPUs gets the closest set that fits, on the agent and in the
//! scheduler alike ([`closest_set`]).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The connection between two GPUs, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Link {
    /// The same GPU (`X`).
    Same,
    /// Bonded NVLinks, this many.
    NvLink(u8),
    /// At most one PCIe bridge between them (`PIX`).
    SingleBridge,
    /// Several PCIe bridges, no host bridge (`PXB`).
    MultipleBridges,
    /// Through a PCIe host bridge (`PHB`).
    HostBridge,
    /// Between host bridges within one NUMA node (`NODE`).
    NumaNode,
    /// Across NUMA nodes, through the processors' interconnect (`SYS`).
    System,
}

impl Link {
    /// How far apart the two GPUs are: 0 for the same GPU, then NVLink (more links closer),
    /// then each PCIe level in turn.
    #[must_use]
    pub fn distance(self) -> u32 {
        match self {
            Self::Same => 0,
            // 1 for 18 bonded links or more (NVSwitch systems), up to 18 for one.
            Self::NvLink(n) => 19 - u32::from(n.clamp(1, 18)),
            Self::SingleBridge => 20,
            Self::MultipleBridges => 21,
            Self::HostBridge => 22,
            Self::NumaNode => 23,
            Self::System => 24,
        }
    }
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Same => f.write_str("X"),
            Self::NvLink(n) => write!(f, "NV{n}"),
            Self::SingleBridge => f.write_str("PIX"),
            Self::MultipleBridges => f.write_str("PXB"),
            Self::HostBridge => f.write_str("PHB"),
            Self::NumaNode => f.write_str("NODE"),
            Self::System => f.write_str("SYS"),
        }
    }
}

/// A link code that is not one of `nvidia-smi topo -m`'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown GPU link {0:?} (expected X, NV<links>, PIX, PXB, PHB, NODE or SYS)")]
pub struct LinkError(String);

impl FromStr for Link {
    type Err = LinkError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "X" => Self::Same,
            "PIX" => Self::SingleBridge,
            "PXB" => Self::MultipleBridges,
            "PHB" => Self::HostBridge,
            "NODE" => Self::NumaNode,
            "SYS" => Self::System,
            _ => s
                .strip_prefix("NV")
                .and_then(|n| n.parse().ok())
                .filter(|n| *n > 0)
                .map(Self::NvLink)
                .ok_or_else(|| LinkError(s.to_string()))?,
        })
    }
}

impl TryFrom<String> for Link {
    type Error = LinkError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Link> for String {
    fn from(l: Link) -> Self {
        l.to_string()
    }
}

/// A node's GPU topology: each GPU's NUMA node and the link between every pair, in GPU
/// order (the order of the node's GPU list).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Topology {
    /// Each GPU's NUMA node, when the driver knows it.
    pub numa: Vec<Option<u32>>,
    /// `links[a][b]`: how GPU a reaches GPU b.
    pub links: Vec<Vec<Link>>,
}

impl Topology {
    /// How GPUs `a` and `b` are connected; as far apart as can be where the topology does
    /// not say (a publication whose matrix does not match its GPUs is not trusted).
    #[must_use]
    pub fn link(&self, a: usize, b: usize) -> Link {
        if a == b {
            return Link::Same;
        }
        self.links
            .get(a)
            .and_then(|row| row.get(b))
            .copied()
            .unwrap_or(Link::System)
    }

    /// How far apart the GPUs of `set` are: the farthest pair, then the sum over all pairs.
    #[must_use]
    pub fn spread_of(&self, set: &[usize]) -> (u32, u32) {
        let mut worst = 0;
        let mut sum = 0;
        for (k, &a) in set.iter().enumerate() {
            for &b in &set[k + 1..] {
                let d = self.link(a, b).distance();
                worst = worst.max(d);
                sum += d;
            }
        }
        (worst, sum)
    }

    /// How far the GPUs of `set` reach each other: by NVLink only, within one NUMA node, or
    /// across NUMA nodes (the farthest pair decides).
    #[must_use]
    pub fn reach(&self, set: &[usize]) -> Reach {
        let (worst, _) = self.spread_of(set);
        if worst < Link::SingleBridge.distance() {
            Reach::NvLink
        } else if worst < Link::System.distance() {
            Reach::OneNumaNode
        } else {
            Reach::AcrossNumaNodes
        }
    }

    /// Whether the topology covers `gpus` GPUs.
    #[must_use]
    pub fn covers(&self, gpus: usize) -> bool {
        self.links.len() == gpus && self.links.iter().all(|r| r.len() == gpus)
    }
}

/// How far a set of GPUs reaches, nearest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reach {
    /// Every pair joined by NVLink (or a single GPU).
    NvLink,
    /// Not all NVLink, but all on one NUMA node (PCIe switches, host bridges).
    OneNumaNode,
    /// Across NUMA nodes.
    AcrossNumaNodes,
}

/// A common way of connecting a node's GPUs, for simulated nodes and clusters: a PCIe switch
/// per pair of GPUs and a NUMA node per four, the pairs also bridged by NVLink or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// No NVLink: a pair behind one switch is `PIX`, GPUs on one NUMA node `NODE`, others
    /// `SYS`.
    Pcie,
    /// As `Pcie`, each pair (0–1, 2–3, …) also bridged by 4 NVLinks (`NV4`), as PCIe servers
    /// with NVLink bridges are.
    NvlinkPairs,
    /// As `Pcie`, every GPU's 18 NVLinks going to NVSwitches that join all of them (`NV18`
    /// between every pair), as HGX systems are.
    Nvswitch,
}

/// NVLinks of a GPU on an NVSwitch system of a [`Layout`] (an H100's), spread over
/// [`LAYOUT_NVSWITCHES`] switches.
pub const LAYOUT_NVSWITCH_LINKS: usize = 18;
/// NVSwitches of a [`Layout::Nvswitch`] node.
pub const LAYOUT_NVSWITCHES: usize = 4;

/// GPUs per NUMA node in a [`Layout`].
pub const LAYOUT_GPUS_PER_NUMA_NODE: usize = 4;

impl Layout {
    /// The NUMA node of GPU `g`.
    #[must_use]
    pub fn numa_node(g: usize) -> u32 {
        u32::try_from(g / LAYOUT_GPUS_PER_NUMA_NODE).unwrap_or(u32::MAX)
    }

    /// The PCIe switch GPU `g` sits behind.
    #[must_use]
    pub fn pci_switch(g: usize) -> u32 {
        u32::try_from(g / 2).unwrap_or(u32::MAX)
    }

    /// The GPU `g` is bridged to by NVLink, if any (a single peer; NVSwitch systems join
    /// every GPU through the switches instead).
    #[must_use]
    pub fn nvlink_peer(self, g: usize, gpus: usize) -> Option<usize> {
        match self {
            Self::Pcie | Self::Nvswitch => None,
            Self::NvlinkPairs => Some(g ^ 1).filter(|p| *p < gpus),
        }
    }

    /// The topology of a node of `gpus` GPUs laid out so.
    #[must_use]
    pub fn topology(self, gpus: usize) -> Topology {
        let links = (0..gpus)
            .map(|a| {
                (0..gpus)
                    .map(|b| match () {
                        () if a == b => Link::Same,
                        () if self == Self::Nvswitch => Link::NvLink(LAYOUT_NVSWITCH_LINKS as u8),
                        () if self.nvlink_peer(a, gpus) == Some(b) => Link::NvLink(4),
                        () if Self::pci_switch(a) == Self::pci_switch(b) => Link::SingleBridge,
                        () if Self::numa_node(a) == Self::numa_node(b) => Link::NumaNode,
                        () => Link::System,
                    })
                    .collect()
            })
            .collect();
        Topology {
            numa: (0..gpus).map(|g| Some(Self::numa_node(g))).collect(),
            links,
        }
    }
}

/// A layout name that is not one of [`Layout`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown GPU layout {0:?} (expected pcie, nvlink-pairs or nvswitch)")]
pub struct LayoutError(String);

impl FromStr for Layout {
    type Err = LayoutError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pcie" => Ok(Self::Pcie),
            "nvlink-pairs" => Ok(Self::NvlinkPairs),
            "nvswitch" => Ok(Self::Nvswitch),
            _ => Err(LayoutError(s.to_string())),
        }
    }
}

/// Sets of this many candidates or fewer are searched exhaustively; beyond, greedily.
const EXHAUSTIVE_SETS: u64 = 20_000;

/// The `k` GPUs of `preferred` (candidates in the placement policy's order of preference)
/// that are closest together under `topology`: the set whose farthest pair is nearest, then
/// whose pairs are nearest in sum, and among equally close sets the one the policy prefers
/// (the earliest in `preferred`'s order). Without a topology, or for one GPU, the policy's
/// first `k`. Returns fewer than `k` only when `preferred` has fewer.
#[must_use]
pub fn closest_set(topology: Option<&Topology>, preferred: &[usize], k: usize) -> Vec<usize> {
    let Some(t) = topology.filter(|_| k > 1 && preferred.len() > k) else {
        return preferred.iter().copied().take(k).collect();
    };
    if combinations(preferred.len(), k) > EXHAUSTIVE_SETS {
        return greedy(t, preferred, k);
    }
    // Positions into `preferred`, in lexicographic order: the first set is the policy's own.
    let mut pos: Vec<usize> = (0..k).collect();
    let mut best: Option<((u32, u32), Vec<usize>)> = None;
    loop {
        let set: Vec<usize> = pos.iter().map(|&p| preferred[p]).collect();
        let spread = t.spread_of(&set);
        if best.as_ref().is_none_or(|(b, _)| spread < *b) {
            best = Some((spread, set));
        }
        // The next combination.
        let n = preferred.len();
        let Some(i) = (0..k).rev().find(|&i| pos[i] < n - k + i) else {
            break;
        };
        pos[i] += 1;
        for j in i + 1..k {
            pos[j] = pos[j - 1] + 1;
        }
    }
    best.map(|(_, s)| s).unwrap_or_default()
}

/// Grows a set from each candidate in turn, adding the candidate nearest to the set (the
/// policy's earliest among equals); the closest of those sets.
fn greedy(t: &Topology, preferred: &[usize], k: usize) -> Vec<usize> {
    let mut best: Option<((u32, u32), Vec<usize>)> = None;
    for &seed in preferred {
        let mut set = vec![seed];
        while set.len() < k {
            let next = preferred
                .iter()
                .filter(|c| !set.contains(c))
                .min_by_key(|&&c| {
                    set.iter()
                        .map(|&s| t.link(s, c).distance())
                        .fold((0, 0), |(w, s), d| (w.max(d), s + d))
                });
            let Some(&next) = next else { break };
            set.push(next);
        }
        let spread = t.spread_of(&set);
        if best.as_ref().is_none_or(|(b, _)| spread < *b) {
            best = Some((spread, set));
        }
    }
    best.map(|(_, s)| s).unwrap_or_default()
}

/// n choose k, saturating.
fn combinations(n: usize, k: usize) -> u64 {
    let k = k.min(n - k.min(n));
    (0..k).fold(1u64, |acc, i| {
        acc.saturating_mul((n - i) as u64) / (i as u64 + 1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Eight GPUs as on many PCIe servers with NVLink bridges: pairs (0,1), (2,3), (4,5),
    /// (6,7) bridged by NVLink; 0–3 on NUMA node 0, 4–7 on node 1.
    fn bridged_pairs() -> Topology {
        Layout::NvlinkPairs.topology(8)
    }

    #[test]
    fn links_read_and_print_as_nvidia_smi_shows_them() {
        for code in ["X", "NV1", "NV12", "PIX", "PXB", "PHB", "NODE", "SYS"] {
            assert_eq!(code.parse::<Link>().unwrap().to_string(), code);
        }
        assert!("NV0".parse::<Link>().is_err());
        let err = "QPI".parse::<Link>().unwrap_err().to_string();
        assert!(err.contains("\"QPI\""), "{err}");
        assert!(Link::NvLink(12).distance() < Link::NvLink(2).distance());
        assert!(Link::NvLink(1).distance() < Link::SingleBridge.distance());
        assert!(Link::NumaNode.distance() < Link::System.distance());
        let t = bridged_pairs();
        let json = serde_json::to_string(&t).unwrap();
        assert!(json.contains("[\"X\",\"NV4\",\"NODE\""), "{json}");
        assert_eq!(serde_json::from_str::<Topology>(&json).unwrap(), t);
    }

    #[test]
    fn a_layout_connects_pairs_behind_a_switch_and_four_gpus_to_a_numa_node() {
        let t = "nvlink-pairs".parse::<Layout>().unwrap().topology(8);
        let row: Vec<String> = t.links[0].iter().map(ToString::to_string).collect();
        assert_eq!(
            row,
            ["X", "NV4", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS"]
        );
        let t = Layout::Pcie.topology(3);
        assert_eq!(t.link(2, 1), Link::NumaNode);
        assert_eq!(t.link(0, 1), Link::SingleBridge);
        let t = Layout::Nvswitch.topology(8);
        assert!((0..8).all(|a| (0..8).all(|b| a == b || t.link(a, b) == Link::NvLink(18))));
        assert!("nvlink".parse::<Layout>().is_err());
    }

    #[test]
    fn two_gpus_go_to_an_nvlink_pair_even_when_the_policy_prefers_others() {
        let t = bridged_pairs();
        // The policy's order puts 1 and 2 first (say, the fullest GPUs under binpack).
        let preferred = [1, 2, 5, 0, 3, 4, 6, 7];
        assert_eq!(closest_set(Some(&t), &preferred, 2), vec![1, 0]);
        // Only one GPU of each pair is free: the set stays on one NUMA node.
        assert_eq!(closest_set(Some(&t), &[0, 4, 2, 6], 2), vec![0, 2]);
        // Four GPUs: two pairs on one NUMA node, the pair the policy likes first included.
        let mut four = closest_set(Some(&t), &[5, 0, 1, 2, 3, 4, 6, 7], 4);
        four.sort_unstable();
        assert_eq!(four, vec![4, 5, 6, 7]);
        // Without a topology, or for one GPU, the policy decides alone.
        assert_eq!(closest_set(None, &preferred, 2), vec![1, 2]);
        assert_eq!(closest_set(Some(&t), &preferred, 1), vec![1]);
    }

    #[test]
    fn a_large_node_is_searched_greedily_and_still_finds_a_close_set() {
        // 32 GPUs in NVLink groups of 4; candidates in an order that interleaves the groups.
        let n = 32;
        let links = (0..n)
            .map(|a: usize| {
                (0..n)
                    .map(|b: usize| match () {
                        () if a == b => Link::Same,
                        () if a / 4 == b / 4 => Link::NvLink(2),
                        () => Link::System,
                    })
                    .collect()
            })
            .collect();
        let t = Topology {
            numa: vec![None; n],
            links,
        };
        let preferred: Vec<usize> = (0..n).map(|i| (i % 8) * 4 + i / 8).collect();
        assert!(combinations(n, 4) > EXHAUSTIVE_SETS);
        let set = closest_set(Some(&t), &preferred, 4);
        assert_eq!(set.len(), 4);
        assert!(set.iter().all(|g| g / 4 == set[0] / 4), "{set:?}");
        assert_eq!(combinations(8, 4), 70);
    }
}
