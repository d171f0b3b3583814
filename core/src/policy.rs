//! The placement policies a request may name (`gpuslice.io/gpu-policy`,
//! `gpuslice.io/node-policy`).

use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// How to choose among GPUs (or nodes) that can all host a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Fill the fullest GPU that still fits, keeping whole GPUs free.
    Binpack,
    /// Use the emptiest GPU, lowering contention.
    Spread,
    /// Grow expected fragmentation least; decided by the cluster scheduler, which sees the
    /// workload's task classes.
    FragAware,
}

impl FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "binpack" => Ok(Self::Binpack),
            "spread" => Ok(Self::Spread),
            "frag-aware" => Ok(Self::FragAware),
            _ => Err("unknown policy (use binpack, spread or frag-aware)".to_string()),
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Binpack => "binpack",
            Self::Spread => "spread",
            Self::FragAware => "frag-aware",
        })
    }
}
