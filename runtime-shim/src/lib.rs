//! The OCI runtime wrapper's parts, shared with the hook binary: reading a runtime's argv,
//! the configuration, the create path (claim and spec edit) and runc-style error logs.

pub mod args;
pub mod config;
pub mod inject;
pub mod log;
