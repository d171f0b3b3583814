//! The agent's Prometheus endpoint: `/metrics` (OpenMetrics) and `/healthz`, over plain HTTP
//! or HTTPS ([`gpuslice_tls`]).
//!
//! `/metrics` names every container and pod with a slice on the node and what each holds of
//! its GPUs. In a DaemonSet that serves it on the pod's address, every pod of the cluster can
//! reach it; with a client CA (`--metrics-client-ca-file`), it answers only a client
//! certificate of that CA (Prometheus's, from its scrape configuration's `tls_config`; with
//! `--metrics-client-allowed-names`, only those common names), and anyone else gets HTTP 403
//! for nothing. `/healthz` answers everyone.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use gpuslice_tls::{Client, ClientCheck, Flags, Reloading, TlsFiles};

use crate::dbus::Shared;

/// The agent's flags for its metrics endpoint's files.
pub const FLAGS: Flags = Flags {
    cert: "--metrics-tls-cert-file",
    key: "--metrics-tls-private-key-file",
    client_ca: "--metrics-client-ca-file",
};

/// HTTPS for the metrics endpoint: its files and, with a client CA among them, the common
/// names a client certificate must have to read `/metrics` (empty: any of that CA).
#[derive(Debug, Clone)]
pub struct MetricsTls {
    pub files: TlsFiles,
    pub allowed_names: Vec<String>,
}

/// Listens on `addr` and serves the endpoint in a task of its own; an address that cannot be
/// listened on, or certificate files that make no configuration, are errors now.
pub async fn start(addr: SocketAddr, shared: Arc<Shared>, tls: Option<MetricsTls>) -> Result<()> {
    let tls = tls
        .map(|t| Reloading::new(t.files).map(|r| (Arc::new(r), t.allowed_names)))
        .transpose()
        .context("the metrics endpoint's TLS")?;
    if !addr.ip().is_loopback() && !tls.as_ref().is_some_and(|t| t.0.verifies_clients()) {
        tracing::warn!(
            address = %addr,
            "/metrics names the node's containers and pods, and anyone who reaches this \
             address reads it: give --metrics-client-ca-file (with --metrics-tls-cert-file and \
             --metrics-tls-private-key-file) so that only the scraper's certificate does"
        );
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("failed to listen on {addr} for metrics"))?;
    let app = axum::Router::new()
        .route("/metrics", axum::routing::get(metrics))
        .route("/healthz", axum::routing::get(|| async { "ok\n" }))
        .with_state(shared);
    let local = listener.local_addr()?;
    tokio::spawn(async move {
        let served = match tls {
            Some((tls, allowed_names)) => {
                tracing::info!(
                    address = %local,
                    clients_checked = tls.verifies_clients(),
                    "serving metrics over HTTPS"
                );
                let check = ClientCheck {
                    verifies: tls.verifies_clients(),
                    allowed_names,
                };
                gpuslice_tls::serve(listener, app, tls, check, |client| client).await
            }
            None => {
                tracing::info!(address = %local, "serving metrics");
                // Plain HTTP tells no one apart: everyone may read.
                let app = app.layer(Extension(Client::Unverified));
                axum::serve(listener, app).await
            }
        };
        if let Err(e) = served {
            tracing::error!("metrics server stopped: {e}");
        }
    });
    Ok(())
}

async fn metrics(
    State(shared): State<Arc<Shared>>,
    Extension(client): Extension<Client>,
) -> Response {
    let why = match client {
        Client::Allowed | Client::Unverified => None,
        Client::Anonymous => Some(
            "this connection presented no client certificate signed by the agent's \
             --metrics-client-ca-file",
        ),
        Client::Unlisted => Some(
            "the common name of this connection's client certificate is not among the agent's \
             --metrics-client-allowed-names",
        ),
    };
    if let Some(why) = why {
        shared.metrics.count_metrics_refused();
        return (
            StatusCode::FORBIDDEN,
            format!("gpuslice-agent: /metrics: {why}\n"),
        )
            .into_response();
    }
    let body = tokio::task::spawn_blocking(move || shared.metrics.render(&shared.snapshot()))
        .await
        .unwrap_or_default();
    ([(CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], body).into_response()
}
