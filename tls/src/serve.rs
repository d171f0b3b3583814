//! Serving an axum router over HTTPS.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;

use crate::{Client, ClientCheck, RELOAD_EVERY, Reloading};

/// How long a client has to finish its TLS handshake.
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(10);
/// How long a connection may take to send a request's head (hyper's header read timeout).
pub const HEAD_DEADLINE: Duration = Duration::from_secs(60);

/// Serves `app` over HTTPS on `listener` with `tls`'s configuration as it is at each
/// connection (the files looked at again every [`RELOAD_EVERY`]). Each connection's caller,
/// as `check` tells it from its certificate, is made a request extension by `extension`
/// (the service's own word for it, which its handlers read).
///
/// Each connection's handshake runs in a task of its own with a deadline: a client that opens
/// connections and never finishes a handshake holds up no one else; nor one that trickles a
/// request's head in, past a minute.
pub async fn serve<E, F>(
    listener: TcpListener,
    app: Router,
    tls: Arc<Reloading>,
    check: ClientCheck,
    extension: F,
) -> std::io::Result<()>
where
    E: Clone + Send + Sync + 'static,
    F: Fn(Client) -> E + Send + Sync + 'static,
{
    let (check, extension) = (Arc::new(check), Arc::new(extension));
    let watched = tls.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(RELOAD_EVERY);
        loop {
            every.tick().await;
            watched.reload_if_changed();
        }
    });
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors and the like: the next accept may succeed.
                tracing::warn!("accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.config());
        let (app, check, extension) = (app.clone(), check.clone(), extension.clone());
        tokio::spawn(async move {
            if let Err(e) = connection(acceptor, tcp, app, &check, &*extension).await {
                tracing::debug!(%peer, "connection: {e}");
            }
        });
    }
}

async fn connection<E>(
    acceptor: tokio_rustls::TlsAcceptor,
    tcp: tokio::net::TcpStream,
    app: Router,
    check: &ClientCheck,
    extension: &(dyn Fn(Client) -> E + Send + Sync),
) -> Result<(), String>
where
    E: Clone + Send + Sync + 'static,
{
    let tls = tokio::time::timeout(HANDSHAKE_DEADLINE, acceptor.accept(tcp))
        .await
        .map_err(|_| format!("no TLS handshake within {HANDSHAKE_DEADLINE:?}"))?
        .map_err(|e| format!("TLS handshake: {e}"))?;
    let client = check.client(tls.get_ref().1.peer_certificates());
    let app = app.layer(axum::Extension(extension(client)));
    let service = hyper_util::service::TowerToHyperService::new(app);
    hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEAD_DEADLINE)
        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
        .await
        .map_err(|e| e.to_string())
}
