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
//! reach `/healthz`, `/readyz` and `/metrics`.
//!
//! Each connection's handshake runs in a task of its own with a deadline: a client that opens
//! a connection and never finishes its handshake holds up no one else.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::net::TcpListener;

/// How long a client has to finish its TLS handshake.
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(10);
/// How long a connection may take to send a request's head (hyper's header read timeout).
pub const HEAD_DEADLINE: Duration = Duration::from_secs(60);

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

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{flag} {}", path.display())]
    Read {
        flag: &'static str,
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("{flag} {}: no certificate in it", path.display())]
    NoCertificate { flag: &'static str, path: PathBuf },
    #[error("--client-ca-file {}", path.display())]
    ClientCa {
        path: PathBuf,
        source: rustls::Error,
    },
    #[error("--client-ca-file {}", path.display())]
    Verifier {
        path: PathBuf,
        source: rustls::server::VerifierBuilderError,
    },
    #[error("--tls-cert-file {} with --tls-private-key-file {}", cert.display(), key.display())]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
}

/// The files of the extender's TLS: its certificate chain and key, and the CA that signs
/// kube-scheduler's client certificate.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

/// What tells one version of the files from another: each file's inode, size and time of
/// change (a Secret volume swaps in new files by renaming a link); None for a missing file.
type Stamp = Vec<Option<(u64, u64, i64, i64)>>;

impl TlsFiles {
    fn stamp(&self) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()]
            .into_iter()
            .flatten()
            .map(|p| {
                std::fs::metadata(p)
                    .ok()
                    .map(|m| (m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
            })
            .collect()
    }
}

/// How often the extender looks whether its certificate files changed.
pub const RELOAD_EVERY: Duration = Duration::from_secs(2);

/// The server's TLS configuration, read again from its files when they change: a renewed
/// certificate or client CA (cert-manager, a rotated Secret) is served from the next
/// connection on, without a restart. Files that do not make a configuration (half written, a
/// key that does not match) are reported and the configuration before them kept.
pub struct Reloading {
    files: TlsFiles,
    current: std::sync::RwLock<(Stamp, Arc<rustls::ServerConfig>)>,
}

impl Reloading {
    /// The configuration from `files`, which must make one now.
    pub fn new(files: TlsFiles) -> Result<Self, TlsError> {
        let stamp = files.stamp();
        let config = server_config(&files)?;
        Ok(Self {
            files,
            current: std::sync::RwLock::new((stamp, config)),
        })
    }

    /// The configuration a new connection is served with.
    #[must_use]
    pub fn config(&self) -> Arc<rustls::ServerConfig> {
        match self.current.read() {
            Ok(c) => c.1.clone(),
            Err(poisoned) => poisoned.into_inner().1.clone(),
        }
    }

    /// Reads the files again if they changed since they were last read.
    pub fn reload_if_changed(&self) {
        let stamp = self.files.stamp();
        let Ok(mut current) = self.current.write() else {
            return;
        };
        if current.0 == stamp {
            return;
        }
        current.0 = stamp;
        match server_config(&self.files) {
            Ok(config) => {
                current.1 = config;
                tracing::info!("the TLS certificate files changed: serving the new ones");
            }
            // The error's sources as tracing records an error value: its `sources` field.
            Err(e) => tracing::warn!(
                error = &e as &(dyn std::error::Error + 'static),
                "the TLS certificate files changed but make no configuration, the one before \
                 is kept"
            ),
        }
    }
}

fn certificates(flag: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let read = |source| TlsError::Read {
        flag,
        path: path.to_path_buf(),
        source,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(read)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            flag,
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// The server's TLS configuration from `files`, with ring as its cryptography (the one the
/// API client uses too).
pub fn server_config(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates("--tls-cert-file", &files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|source| TlsError::Read {
        flag: "--tls-private-key-file",
        path: files.key.to_path_buf(),
        source,
    })?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Pair {
            cert: files.cert.to_path_buf(),
            key: files.key.to_path_buf(),
            source,
        })?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates("--client-ca-file", ca)? {
                roots.add(cert).map_err(|source| TlsError::ClientCa {
                    path: ca.to_path_buf(),
                    source,
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|source| TlsError::Verifier {
                    path: ca.to_path_buf(),
                    source,
                })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|source| TlsError::Pair {
            cert: files.cert.to_path_buf(),
            key: files.key.to_path_buf(),
            source,
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
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

/// Who a connection's caller is taken to be.
#[derive(Clone, Debug)]
pub struct Callers {
    /// The server configuration verifies client certificates (it has a client CA).
    pub verifies: bool,
    /// Common names a verified certificate must have to be kube-scheduler's; empty: any
    /// certificate of the client CA (as kube-apiserver's `--requestheader-allowed-names`).
    pub allowed_names: Vec<String>,
    /// The extender listens on a loopback address.
    pub loopback: bool,
}

impl Callers {
    /// The caller of a connection that presented `certificates` (as the TLS server verified
    /// them: none without a client CA).
    #[must_use]
    pub fn caller(&self, certificates: Option<&[CertificateDer<'_>]>) -> Caller {
        match (self.verifies, certificates.and_then(<[_]>::first)) {
            (false, _) => Caller::Unknown {
                loopback: self.loopback,
            },
            (true, None) => Caller::Anonymous,
            (true, Some(_)) if self.allowed_names.is_empty() => Caller::KubeScheduler,
            (true, Some(cert)) => {
                let named = common_names(cert)
                    .iter()
                    .any(|n| self.allowed_names.iter().any(|a| a == n));
                if named {
                    Caller::KubeScheduler
                } else {
                    Caller::Unlisted
                }
            }
        }
    }
}

/// The common names of a certificate's subject (none where it does not parse).
fn common_names(cert: &CertificateDer<'_>) -> Vec<String> {
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return Vec::new();
    };
    parsed
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok().map(str::to_owned))
        .collect()
}

/// Serves `app` over HTTPS on `listener` with `tls`'s configuration as it is at each
/// connection, telling its callers apart by `callers`.
pub async fn serve_tls(
    listener: TcpListener,
    app: Router,
    tls: Arc<Reloading>,
    callers: Callers,
) -> std::io::Result<()> {
    let callers = Arc::new(callers);
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
        let (app, callers) = (app.clone(), callers.clone());
        tokio::spawn(async move {
            if let Err(e) = connection(acceptor, tcp, app, &callers).await {
                tracing::debug!(%peer, "connection: {e}");
            }
        });
    }
}

async fn connection(
    acceptor: tokio_rustls::TlsAcceptor,
    tcp: tokio::net::TcpStream,
    app: Router,
    callers: &Callers,
) -> Result<(), String> {
    let tls = tokio::time::timeout(HANDSHAKE_DEADLINE, acceptor.accept(tcp))
        .await
        .map_err(|_| format!("no TLS handshake within {HANDSHAKE_DEADLINE:?}"))?
        .map_err(|e| format!("TLS handshake: {e}"))?;
    // With a client verifier, a certificate is there only if it chained to the client CA.
    let caller = callers.caller(tls.get_ref().1.peer_certificates());
    let app = app.layer(axum::Extension(caller));
    let service = hyper_util::service::TowerToHyperService::new(app);
    // A caller trickling a request's head in holds its connection a minute at the most.
    hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEAD_DEADLINE)
        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
        .await
        .map_err(|e| e.to_string())
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
    use crate::certs::Authority;

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    #[test]
    fn a_caller_is_kube_scheduler_only_by_a_verified_certificate_of_an_allowed_name() {
        let ca = Authority::new(1).unwrap();
        let scheduler = [der(&ca.client("system:kube-scheduler").unwrap().cert)];
        let kubelet = [der(&ca.client("system:node:gpu-node-1").unwrap().cert)];
        let named = Callers {
            verifies: true,
            allowed_names: vec!["kube-scheduler".into(), "system:kube-scheduler".into()],
            loopback: false,
        };
        assert_eq!(named.caller(Some(&scheduler)), Caller::KubeScheduler);
        assert_eq!(named.caller(Some(&kubelet)), Caller::Unlisted);
        assert_eq!(named.caller(None), Caller::Anonymous);
        let any = Callers {
            allowed_names: Vec::new(),
            ..named.clone()
        };
        assert_eq!(any.caller(Some(&kubelet)), Caller::KubeScheduler);
        for loopback in [false, true] {
            let unverified = Callers {
                verifies: false,
                allowed_names: Vec::new(),
                loopback,
            };
            assert_eq!(unverified.caller(None), Caller::Unknown { loopback });
            assert_eq!(unverified.caller(None).may_bind(), loopback);
            assert!(unverified.caller(None).may_ask());
        }
        assert!(!Caller::Unlisted.may_ask() && !Caller::Unlisted.may_bind());
        assert!(!Caller::Anonymous.may_ask() && !Caller::Anonymous.may_bind());
        assert!(Caller::KubeScheduler.may_ask() && Caller::KubeScheduler.may_bind());
    }
}
