//! The simulated GPU node: a description of its GPUs (`node.json`), the per-process usage
//! records that the fake `libcuda.so.1` writes and the fake `libnvidia-ml.so.1` reads, and the
//! builder of a fake driver root.
//!
//! The fake libraries find the description, in order, at `$GPUSLICE_SIM_NODE`, at
//! `gpuslice-sim/node.json` beside the library file itself, and at
//! `/etc/gpuslice-sim/node.json`.

pub mod driver_root;
pub mod node;
pub mod procs;

pub use node::{NodeSpec, SimGpu};
