//! The extender over HTTPS, and who may bind.
//!
//! The bind verb writes a signed assignment and creates the pod's Binding with the extender's
//! ServiceAccount: whoever can call it places any pending pod on any node with room, past every
//! check kube-scheduler makes itself (node selectors, affinity, taints). So bind answers only
//! a caller the extender knows is kube-scheduler: one whose TLS client certificate chains to
//! `--client-ca-file` (kube-scheduler's extender `tlsConfig` `certFile`/`keyFile`), or, without
//! a client CA, any caller of an extender listening on a loopback address (a sidecar of
//! kube-scheduler, reachable from its pod alone). With a client CA, filter and prioritize
//! answer that certificate only too (refused before their bodies are read: no one else can
//! make the extender read and decide on megabytes of nodes). A client certificate is asked for
//! but not required at the handshake, so that probes and Prometheus, which present none, still
//! reach `/healthz`, `/readyz` and `/metrics`. The HTTPS itself (certificates read again when
//! they change, handshakes with deadlines) is [`gpuslice_tls`]'s.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use gpuslice_tls::{Client, ClientCheck, Reloading};
use tokio::net::TcpListener;

pub use gpuslice_tls::{Flags, TlsError, TlsFiles};

/// The extender's flags for its files.
pub const FLAGS: Flags = Flags {
    cert: "--tls-cert-file",
    key: "--tls-private-key-file",
    client_ca: "--client-ca-file",
};

/// What the extender knows of the caller of a request, from its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// Its client certificate chained to `--client-ca-file`: kube-scheduler.
    KubeScheduler,
    /// A client CA is configured and the caller presented no certificate: a probe, Prometheus,
    /// or anyone else.
    Anonymous,
    /// Its certificate chained to the client CA, but its common name is not among
    /// `--client-allowed-names` (the CA signs others' certificates too).
    Unlisted,
    /// No client CA is configured, so callers cannot be told apart; on a loopback listener
    /// (`loopback`), only kube-scheduler's pod reaches the extender.
    Unknown { loopback: bool },
}

impl Caller {
    /// The caller a connection's client certificate shows, on a listener that is a loopback
    /// address or not.
    #[must_use]
    pub fn from_client(client: Client, loopback: bool) -> Self {
        match client {
            Client::Allowed => Self::KubeScheduler,
            Client::Anonymous => Self::Anonymous,
            Client::Unlisted => Self::Unlisted,
            Client::Unverified => Self::Unknown { loopback },
        }
    }

    /// Whether the caller may ask filter and prioritize.
    #[must_use]
    pub fn may_ask(self) -> bool {
        !matches!(self, Self::Anonymous | Self::Unlisted)
    }

    /// Whether the caller may bind.
    #[must_use]
    pub fn may_bind(self) -> bool {
        matches!(self, Self::KubeScheduler | Self::Unknown { loopback: true })
    }
}

/// Serves `app` over plain HTTP on `listener`, a loopback address or not.
pub async fn serve_plain(
    listener: TcpListener,
    app: Router,
    loopback: bool,
) -> std::io::Result<()> {
    axum::serve(
        listener,
        app.layer(axum::Extension(Caller::Unknown { loopback })),
    )
    .await
}

/// Serves `app` over HTTPS on `listener` with `tls`'s configuration as it is at each
/// connection; a verified client certificate is kube-scheduler's if its common name is among
/// `allowed_names` (any, where there are none).
pub async fn serve_tls(
    listener: TcpListener,
    app: Router,
    tls: Arc<Reloading>,
    allowed_names: Vec<String>,
    loopback: bool,
) -> std::io::Result<()> {
    let check = ClientCheck {
        verifies: tls.verifies_clients(),
        allowed_names,
    };
    gpuslice_tls::serve(listener, app, tls, check, move |client| {
        Caller::from_client(client, loopback)
    })
    .await
}

/// Whether bind can be served on `listen` as configured: refused when anyone who can reach a
/// non-loopback address could call it.
pub fn check_bind_reach(listen: SocketAddr, client_ca: bool) -> Result<(), String> {
    if client_ca || listen.ip().is_loopback() {
        return Ok(());
    }
    Err(format!(
        "--listen {listen} is reachable from other pods and hosts, and bind places any pod on \
         any node with the extender's own rights: give --client-ca-file (with \
         --tls-cert-file and --tls-private-key-file) so that bind answers kube-scheduler's \
         client certificate only, or listen on a loopback address (the extender beside \
         kube-scheduler in its pod)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kube_scheduler_or_a_loopback_callers_unknown_may_bind() {
        assert_eq!(
            Caller::from_client(Client::Allowed, false),
            Caller::KubeScheduler
        );
        assert_eq!(
            Caller::from_client(Client::Unlisted, true),
            Caller::Unlisted
        );
        for loopback in [false, true] {
            let unknown = Caller::from_client(Client::Unverified, loopback);
            assert_eq!(unknown, Caller::Unknown { loopback });
            assert_eq!(unknown.may_bind(), loopback);
            assert!(unknown.may_ask());
        }
        assert!(!Caller::Unlisted.may_ask() && !Caller::Unlisted.may_bind());
        assert!(!Caller::Anonymous.may_ask() && !Caller::Anonymous.may_bind());
        assert!(Caller::KubeScheduler.may_ask() && Caller::KubeScheduler.may_bind());
    }
}
