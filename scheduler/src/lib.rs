//! gpuslice cluster placement outside the node: the trace-replay simulator over the placement
//! code of `gpuslice_core::cluster`.

pub mod plot;
pub mod simulate;
pub mod trace;
