//! The server's TLS configuration from its files, read again when they change.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

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
    #[error("{flag} {}", path.display())]
    ClientCa {
        flag: &'static str,
        path: PathBuf,
        source: rustls::Error,
    },
    #[error("{flag} {}", path.display())]
    Verifier {
        flag: &'static str,
        path: PathBuf,
        source: rustls::server::VerifierBuilderError,
    },
    #[error("{} {} with {} {}", flags.cert, cert.display(), flags.key, key.display())]
    Pair {
        flags: &'static Flags,
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
}

/// The command-line flags that name a service's files, so that an error names the flag the
/// operator gave.
#[derive(Clone, Copy, Debug)]
pub struct Flags {
    pub cert: &'static str,
    pub key: &'static str,
    pub client_ca: &'static str,
}

/// The files of a server's TLS: its certificate chain and key, and the CA that signs the
/// client certificates it knows its callers by.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
    pub flags: &'static Flags,
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

/// How often a server looks whether its certificate files changed.
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

    /// Whether the configuration asks callers for certificates of a client CA.
    #[must_use]
    pub fn verifies_clients(&self) -> bool {
        self.files.client_ca.is_some()
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

/// The server's TLS configuration from `files`. With a client CA, a client certificate is
/// asked for but not required at the handshake (probes and Prometheus present none); what
/// the caller may do is the service's to decide ([`crate::ClientCheck`]).
pub fn server_config(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let flags = files.flags;
    let pair = |source| TlsError::Pair {
        flags,
        cert: files.cert.clone(),
        key: files.key.clone(),
        source,
    };
    let chain = certificates(flags.cert, &files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|source| TlsError::Read {
        flag: flags.key,
        path: files.key.clone(),
        source,
    })?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(pair)?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates(flags.client_ca, ca)? {
                roots.add(cert).map_err(|source| TlsError::ClientCa {
                    flag: flags.client_ca,
                    path: ca.clone(),
                    source,
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|source| TlsError::Verifier {
                    flag: flags.client_ca,
                    path: ca.clone(),
                    source,
                })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).map_err(pair)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
