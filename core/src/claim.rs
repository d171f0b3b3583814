//! A container's admitted slice: which GPUs, how much of each, and the evidence that the
//! container still lives.

use serde::{Deserialize, Serialize};

use crate::annotations::SliceRequest;

/// One GPU of a claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuGrant {
    /// The GPU's index on the node (NVML order).
    pub index: u32,
    pub uuid: String,
    /// Minor number of `/dev/nvidiaN`.
    pub minor: u32,
    /// The memory wall on this GPU.
    pub memory_bytes: u64,
    /// Percent of the SMs reserved; 0 for none.
    pub cores: u32,
}

/// Where a claim is in the container's life.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ClaimState {
    /// Admitted at create; the container has not started yet.
    Pending,
    /// The container runs as `pid`, whose start time (clock ticks since boot, field 22 of
    /// `/proc/<pid>/stat`) tells it apart from a later process with the same pid.
    Active { pid: u32, start_time: u64 },
}

/// An admitted slice, as the ledger keeps it and as the D-Bus API returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub container_id: String,
    pub request: SliceRequest,
    pub exclusive: bool,
    pub gpus: Vec<GpuGrant>,
    #[serde(flatten)]
    pub state: ClaimState,
    /// When the claim was admitted, in milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// The scheduler assignment it honoured, as `<pod UID>/<container>`
    /// (`cluster::assigned_container`); none for a claim the agent placed itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assigned_as: Option<String>,
    /// Who created the container, as the runtime wrapper names it (`runtime-root:<dir>`: the
    /// runtime's state directory, one per runc root or containerd namespace); none for a claim
    /// made by the CLI or a hook. Only the same owner (or one that names none) can claim the
    /// id again or release it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The Kubernetes pod of the container, as its engine named it (`pod::pod_ref`); where
    /// the agent's Kubernetes Events about the slice go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<crate::pod::PodRef>,
}

/// The owner prefix of claims a DRA kubelet plugin made (`dra:<driver>`): they last until
/// the plugin releases them (the kubelet unprepares the ResourceClaim), whatever becomes of
/// the containers that used them.
pub const DRA_OWNER_PREFIX: &str = "dra:";

/// Why a container id cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("container id {id:?}: {reason}")]
pub struct ContainerIdError {
    pub id: String,
    pub reason: &'static str,
}

/// Container ids become directory names under /run/gpuslice, so they are held to what runc
/// accepts: letters, digits, `_`, `+`, `-`, `.`, at most 1024 bytes, and never `.` or `..`.
pub fn validate_container_id(id: &str) -> Result<(), ContainerIdError> {
    let err = |reason| {
        Err(ContainerIdError {
            id: id.to_string(),
            reason,
        })
    };
    if id.is_empty() {
        return err("is empty");
    }
    if id.len() > 1024 {
        return err("is longer than 1024 bytes");
    }
    if id == "." || id == ".." {
        return err("is not a name");
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '+' | '-' | '.'))
    {
        return err("may hold only letters, digits, '_', '+', '-' and '.'");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_ids_that_could_escape_the_run_directory_are_refused() {
        assert!(validate_container_id("abc-123_x.y").is_ok());
        for bad in ["", ".", "..", "a/b", "../x", "a b", "x\u{0}y", "é"] {
            assert!(validate_container_id(bad).is_err(), "{bad:?} accepted");
        }
    }
}
