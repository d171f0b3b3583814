//! The OCI runtime wrapper's parts, shared with the hook binary: reading a runtime's argv,
//! the configuration, the NVIDIA toolkit's environment conventions, driver discovery (with
//! glibc's linker cache), what a GPU container gets (the edit plan) and how it
//! is applied to an OCI spec, the create path (claim and spec edit) and runc-style error logs.

pub mod args;
pub mod cdi;
pub mod compat;
pub mod config;
pub mod driver;
pub mod edits;
pub mod inject;
pub mod ldcache;
pub mod log;
pub mod nvidia_env;
pub mod require;
pub mod spec;
