//! `gpuslice-agent`: the node's authority on who holds which GPU slice.
//!
//! It discovers the GPUs through NVML, keeps the ledger of claims on disk so that a crash at
//! any instant loses no acknowledged claim, admits or refuses every claim against the GPUs'
//! capacity, writes each container's limits directory, releases claims of containers that
//! are gone, and serves all of this over D-Bus and Prometheus metrics.

pub mod backstop;
// Loads and calls the CUDA driver (FFI).
#[allow(unsafe_code)]
pub mod context_cost;
pub mod dbus;
pub mod discovery;
pub mod duration;
pub mod events;
pub mod gc;
// Maps the driver's-share files shared with the containers (mmap, atomics).
#[allow(unsafe_code)]
pub mod held;
pub mod ledger;
pub mod metrics;
pub mod metrics_http;
pub mod placement;
pub mod private;
pub mod publish;
pub mod rundir;
pub mod sample_requests;
pub mod service;
pub mod sm_time;
pub mod store;
pub mod throttle;
pub mod usage;

pub use gpuslice_agent_api::{BUS_NAME, INTERFACE, OBJECT_PATH};
