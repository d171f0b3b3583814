//! The agent's D-Bus API as seen by clients (the CLI, the runtime wrapper, tests), and the
//! JSON documents it returns.

use std::collections::HashMap;

use gpuslice_core::inventory::Inventory;
use gpuslice_core::{Claim, GpuLoad};
use serde::{Deserialize, Serialize};

/// A claim and the device memory its container holds now, per GPU of the claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SliceStatus {
    #[serde(flatten)]
    pub claim: Claim,
    pub used_bytes: Vec<u64>,
}

/// Everything `gpuslice status` shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub inventory: Inventory,
    pub gpus: Vec<GpuLoad>,
    pub slices: Vec<SliceStatus>,
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
    /// The node's GPUs as JSON.
    fn inventory(&self) -> zbus::Result<String>;
    /// Every claim and its usage as JSON.
    fn list_slices(&self) -> zbus::Result<String>;
    /// GPUs, their allocation and every slice as JSON.
    fn status(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn version(&self) -> zbus::Result<String>;
}

/// Connects to the bus at `address`, or to the system bus (which honours
/// `DBUS_SYSTEM_BUS_ADDRESS`).
pub async fn connect(address: Option<&str>) -> zbus::Result<zbus::Connection> {
    match address {
        Some(a) => zbus::connection::Builder::address(a)?.build().await,
        None => zbus::Connection::system().await,
    }
}
