//! gpuslice cluster placement outside the node: the kube-scheduler extender and the
//! trace-replay simulator, over the cluster placement code of [`cluster`], which decides fit with the
//! node agents' own fit model (`gpuslice_core::fit`).

pub mod certs;
pub mod cluster;
pub mod extender;
pub mod plot;
pub mod published;
pub mod report;
pub mod simulate;
pub mod trace;
