//! gpuslice cluster placement outside the node: the kube-scheduler extender and the
//! trace-replay simulator, over the placement code of `gpuslice_core::cluster`.

pub mod extender;
pub mod plot;
pub mod simulate;
pub mod trace;
