//! The shared vocabulary of gpuslice: what every side must agree on and nothing else. What
//! a container asks for (annotations, quantities, policies, declared resources), what a node
//! has (inventory) and publishes (its GPUs and rules), the one fit model that decides whether
//! a request fits a GPU and a node, claims and grants, the signed scheduler assignment, and
//! the two files that carry a decision to the container (the limits file and the usage
//! region).
//!
//! This crate does no I/O beyond what its callers hand it, so the runtime wrapper and the hook
//! can link it and still start fast. Cluster algorithms live in the scheduler, the agent's own
//! GPU choice in the agent, OCI edits and driver discovery on the runtime side.

pub mod annotations;
pub mod assignment;
pub mod claim;
pub mod fit;
pub mod held;
pub mod inventory;
pub mod layout;
pub mod limits;
pub mod pod;
pub mod policy;
pub mod process;
pub mod publication;
pub mod quantity;
pub mod resources;
pub mod selection;
pub mod topology;
pub mod usage;

pub use annotations::{AnnotationError, SliceRequest};
pub use claim::{Claim, ClaimState, GpuGrant, Reported};
pub use inventory::{GpuInfo, GpuLoad};
pub use policy::Policy;
