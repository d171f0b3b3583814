//! gpuslice cluster placement outside the node: the kube-scheduler extender and the
//! trace-replay simulator, over the cluster placement code of [`cluster`], which decides fit with the
//! node agents' own fit model (`gpuslice_core::fit`).

/// The certificates of `tls-certs`, made by [`gpuslice_tls::certs`].
pub use gpuslice_tls::certs;
pub mod cluster;
pub mod extender;
pub mod plot;
pub mod published;
pub mod report;
pub mod simulate;
pub mod trace;
