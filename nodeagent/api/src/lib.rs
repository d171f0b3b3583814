//! The node agent's D-Bus interface, `io.gpuslice.Agent1` at `/io/gpuslice/Agent1`: the
//! proxy its clients call (the CLI, the runtime wrapper, the hook, the containerd
//! integration), the JSON documents it returns and the errors it answers with. The agent
//! implements it; its clients depend on this crate, never on the agent, so that the programs
//! that run at every container start carry nothing of the agent's.

use std::collections::HashMap;
use std::path::PathBuf;

use gpuslice_core::inventory::Inventory;
use gpuslice_core::{Claim, GpuLoad};
use serde::{Deserialize, Serialize};

/// A claim, the device memory its container holds now and the share of each GPU's time it
/// used lately, per GPU of the claim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SliceStatus {
    #[serde(flatten)]
    pub claim: Claim,
    pub used_bytes: Vec<u64>,
    /// Percent of the GPU's SM time the driver's per-process samples gave the container's
    /// processes over the last minute (since measuring began, if later); `null` where the
    /// agent does not measure it (`--sm-sample-interval 0`, a driver without per-process
    /// utilization) or has for under a second.
    #[serde(default)]
    pub sm_used_percent: Vec<Option<f64>>,
    /// Whether the agent holds the container frozen now, for keeping a GPU busier than its
    /// SM share, its tolerance and its burst.
    #[serde(default)]
    pub held: bool,
}

/// Everything `gpuslice status` shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub inventory: Inventory,
    pub gpus: Vec<GpuLoad>,
    pub slices: Vec<SliceStatus>,
}

/// Well-known D-Bus name of the agent.
pub const BUS_NAME: &str = "io.gpuslice.Agent1";
/// Object path of the agent.
pub const OBJECT_PATH: &str = "/io/gpuslice/Agent1";
/// Interface name of the agent.
pub const INTERFACE: &str = "io.gpuslice.Agent1";

/// Errors on the wire: `io.gpuslice.Agent1.Error.<Variant>` with a message.
#[derive(Debug, zbus::DBusError)]
#[zbus(prefix = "io.gpuslice.Agent1.Error")]
pub enum ApiError {
    #[zbus(error)]
    ZBus(zbus::Error),
    /// The request is malformed: names the input, the value and the reason.
    InvalidRequest(String),
    /// The request is well-formed but cannot be admitted now (capacity, conflicts).
    Refused(String),
    NotFound(String),
    AccessDenied(String),
    Failed(String),
}

#[zbus::proxy(
    interface = "io.gpuslice.Agent1",
    default_service = "io.gpuslice.Agent1",
    default_path = "/io/gpuslice/Agent1"
)]
pub trait Agent {
    /// Claims a slice for a container from its annotations; returns the claim as JSON.
    fn claim(&self, container_id: &str, annotations: HashMap<&str, &str>) -> zbus::Result<String>;
    /// Records the container's pid (host pid namespace); returns the claim as JSON.
    fn activate(&self, container_id: &str, pid: u32) -> zbus::Result<String>;
    /// Releases a container's claim; false when it held none.
    fn release(&self, container_id: &str) -> zbus::Result<bool>;
    /// As `Claim`, for a container created by `owner` (e.g. `runtime-root:/run/runc`): an id
    /// already claimed by another owner is refused.
    fn claim_as(
        &self,
        owner: &str,
        container_id: &str,
        annotations: HashMap<&str, &str>,
    ) -> zbus::Result<String>;
    /// As `Release`, by `owner`: a claim another owner made is refused, not released.
    fn release_as(&self, owner: &str, container_id: &str) -> zbus::Result<bool>;
    /// The node's GPUs as JSON.
    fn inventory(&self) -> zbus::Result<String>;
    /// Every claim and its usage as JSON.
    fn list_slices(&self) -> zbus::Result<String>;
    /// GPUs, their allocation and every slice as JSON.
    fn status(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn version(&self) -> zbus::Result<String>;
    /// The driver showed a container holding more than its slice on a GPU, and what the
    /// agent did about it.
    #[zbus(signal)]
    fn over_limit(
        &self,
        container_id: &str,
        gpu_uuid: &str,
        used: u64,
        limit: u64,
        action: &str,
    ) -> zbus::Result<()>;
    /// A container's usage region was found tampered with, and how.
    #[zbus(signal)]
    fn usage_tampered(&self, container_id: &str, reason: &str) -> zbus::Result<()>;
}

/// Connects to the bus at `address`, or to the system bus (which honours
/// `DBUS_SYSTEM_BUS_ADDRESS`).
pub async fn connect(address: Option<&str>) -> zbus::Result<zbus::Connection> {
    match address {
        Some(a) => zbus::connection::Builder::address(a)?.build().await,
        None => zbus::Connection::system().await,
    }
}

/// The agent's private socket, where it serves the same interface to root over peer-to-peer
/// D-Bus, without the bus daemon in between (as systemd serves `/run/systemd/private` to
/// `systemctl`): in the default state directory, which only root can enter.
pub const PRIVATE_SOCKET: &str = "/run/gpuslice-agent/private";

/// The private socket a client should try before the bus: `configured` when set, else the
/// default one when the agent is on the system bus (an agent on another bus is not the one
/// at the default path), else none.
#[must_use]
pub fn private_socket(bus_address: Option<&str>, configured: Option<&str>) -> Option<PathBuf> {
    match (configured.filter(|c| !c.is_empty()), bus_address) {
        (Some(c), _) => Some(PathBuf::from(c)),
        (None, None) => Some(PathBuf::from(PRIVATE_SOCKET)),
        (None, Some(_)) => None,
    }
}

/// Connects to the agent over its private socket when there is one to try (see
/// [`private_socket`]; `configured` names one) that answers and is served by root (the
/// kernel's credentials of the listening process), otherwise over the bus at `bus_address`
/// (see [`connect`]). The runtime wrapper, the hook and the CLI use it: a connection there
/// skips the bus daemon's handshake and name assignment, and each call takes one hop.
pub async fn connect_agent(
    bus_address: Option<&str>,
    configured: Option<&str>,
) -> zbus::Result<zbus::Connection> {
    if let Some(path) = private_socket(bus_address, configured)
        && let Ok(stream) = tokio::net::UnixStream::connect(path).await
        && stream.peer_cred().is_ok_and(|c| c.uid() == 0)
        && let Ok(conn) = zbus::connection::Builder::unix_stream(stream)
            .p2p()
            .build()
            .await
    {
        return Ok(conn);
    }
    connect(bus_address).await
}
