//! `gpuslice-agent`: the node's authority on who holds which GPU slice.
//!
//! It discovers the GPUs through NVML, keeps the ledger of claims on disk so that a crash at
//! any instant loses no acknowledged claim, admits or refuses every claim against the GPUs'
//! capacity, writes each container's limits directory, releases claims of containers that
//! are gone, and serves all of this over D-Bus and Prometheus metrics.

pub mod client;
pub mod dbus;
pub mod discovery;
pub mod duration;
pub mod gc;
pub mod ledger;
pub mod metrics;
pub mod publish;
pub mod rundir;
pub mod service;
pub mod store;

/// Well-known D-Bus name of the agent.
pub const BUS_NAME: &str = "io.gpuslice.Agent1";
/// Object path of the agent.
pub const OBJECT_PATH: &str = "/io/gpuslice/Agent1";
/// Interface name of the agent.
pub const INTERFACE: &str = "io.gpuslice.Agent1";
