//! The shared model of gpuslice: what a container asks for (annotations), what a node has
//! (inventory), how a GPU is chosen (placement), and the two files that carry a decision to
//! the container (the limits file and the usage region).
//!
//! This crate does no I/O beyond what its callers hand it, so the runtime wrapper and the hook
//! can link it and still start fast.

pub mod annotations;
pub mod assignment;
pub mod claim;
pub mod cluster;
pub mod driver;
pub mod edits;
pub mod host;
pub mod inventory;
pub mod limits;
pub mod placement;
pub mod quantity;
pub mod resources;
pub mod spec;
pub mod usage;

pub use annotations::{AnnotationError, SliceRequest};
pub use claim::{Claim, ClaimState, GpuGrant};
pub use inventory::GpuInfo;
pub use placement::{GpuLoad, PlacementError, Policy};
