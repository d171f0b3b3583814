//! HTTPS for gpuslice's HTTP services (the scheduler extender, the node agent's metrics):
//! the server's certificate files read again when they change ([`Reloading`]), what a
//! connection's client certificate says of its caller ([`ClientCheck`]), each connection's
//! handshake in a task of its own with a deadline ([`serve`]), and a CA of a service's own
//! with its server and client certificates to start with ([`certs`]).
//!
//! rustls with ring as its cryptography, as the Kubernetes API client of both binaries uses.

pub mod certs;
mod clients;
mod files;
mod serve;

pub use clients::{Client, ClientCheck, common_names};
pub use files::{Flags, RELOAD_EVERY, Reloading, TlsError, TlsFiles, server_config};
pub use serve::{HANDSHAKE_DEADLINE, HEAD_DEADLINE, serve};
