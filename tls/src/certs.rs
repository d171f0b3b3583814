//! Certificates for a service's mutual TLS (`gpuslice-scheduler tls-certs`): a CA of its own,
//! the service's server certificate (for the names its callers dial) and its caller's client
//! certificate, each signed by that CA: the extender's and kube-scheduler's, or the node
//! agent's metrics endpoint's and Prometheus's. The service trusts the CA for client
//! certificates (its client CA flag) and the caller trusts it for the server (kube-scheduler's
//! `tlsConfig.caFile`, a ServiceMonitor's `tlsConfig.ca`); a cluster with its own CA
//! (cert-manager, kubeadm's) can issue the same two certificates instead.

use std::path::Path;
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error("making the {what}")]
    Make {
        what: &'static str,
        source: rcgen::Error,
    },
    #[error("--days {0}: the certificates must be valid for at least one day")]
    Days(u32),
    #[error("{} is already there: not replacing it, nor writing the others", path.display())]
    Exists { path: std::path::PathBuf },
    #[error("writing {}", path.display())]
    Write {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// The files written, PEM each, in the directory given.
pub const FILES: [&str; 6] = [
    "ca.crt",
    "ca.key",
    "tls.crt",
    "tls.key",
    "client.crt",
    "client.key",
];

/// A certificate and its key, PEM.
pub struct Pem {
    pub cert: String,
    pub key: String,
}

pub struct Certs {
    pub ca: Pem,
    /// The service's.
    pub server: Pem,
    /// Its caller's.
    pub client: Pem,
}

fn params(
    common_name: &str,
    names: Vec<String>,
    days: u32,
    what: &'static str,
) -> Result<CertificateParams, CertsError> {
    let mut p =
        CertificateParams::new(names).map_err(|source| CertsError::Make { what, source })?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    p.distinguished_name = dn;
    let now = SystemTime::now();
    p.not_before = now.into();
    p.not_after = (now + Duration::from_secs(u64::from(days) * 86_400)).into();
    Ok(p)
}

/// A certificate authority of a service's own, issuing certificates valid as long as it.
pub struct Authority {
    pub pem: Pem,
    issuer: Issuer<'static, KeyPair>,
    days: u32,
}

fn make_error(what: &'static str) -> impl Fn(rcgen::Error) -> CertsError {
    move |source| CertsError::Make { what, source }
}

impl Authority {
    /// A new CA valid for `days`.
    pub fn new(days: u32) -> Result<Self, CertsError> {
        if days == 0 {
            return Err(CertsError::Days(days));
        }
        let key = KeyPair::generate().map_err(make_error("CA's key"))?;
        let mut params = params("gpuslice CA", Vec::new(), days, "CA")?;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).map_err(make_error("CA"))?;
        let pem = Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        };
        Ok(Self {
            pem,
            issuer: Issuer::new(params, key),
            days,
        })
    }

    fn issue(
        &self,
        name: &str,
        names: Vec<String>,
        usage: ExtendedKeyUsagePurpose,
        what: &'static str,
    ) -> Result<Pem, CertsError> {
        let key = KeyPair::generate().map_err(make_error(what))?;
        let mut p = params(name, names, self.days, what)?;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![usage];
        let cert = p.signed_by(&key, &self.issuer).map_err(make_error(what))?;
        Ok(Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }

    /// A server certificate for `names` (DNS names or IP addresses), the first its common
    /// name.
    pub fn server(&self, names: &[String]) -> Result<Pem, CertsError> {
        let first = names.first().cloned().unwrap_or_default();
        let usage = ExtendedKeyUsagePurpose::ServerAuth;
        self.issue(&first, names.to_vec(), usage, "server certificate")
    }

    /// A client certificate whose common name is `name`.
    pub fn client(&self, name: &str) -> Result<Pem, CertsError> {
        let usage = ExtendedKeyUsagePurpose::ClientAuth;
        self.issue(name, Vec::new(), usage, "client certificate")
    }
}

/// A CA valid for `days` and, signed by it, the service's certificate for `server_names` and
/// its caller's (named `client_name`), valid as long.
pub fn make(server_names: &[String], client_name: &str, days: u32) -> Result<Certs, CertsError> {
    let ca = Authority::new(days)?;
    let server = ca.server(server_names)?;
    let client = ca.client(client_name)?;
    Ok(Certs {
        ca: ca.pem,
        server,
        client,
    })
}

/// Writes `certs` into `dir` as [`FILES`] (keys readable by the owner only); refused, writing
/// none, if any of them is already there.
pub fn write(certs: &Certs, dir: &Path) -> Result<(), CertsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let contents = [
        &certs.ca.cert,
        &certs.ca.key,
        &certs.server.cert,
        &certs.server.key,
        &certs.client.cert,
        &certs.client.key,
    ];
    // None is written while one is there: no half of a new set beside half of an old one.
    if let Some(path) = FILES
        .iter()
        .map(|f| dir.join(f))
        .find(|p| p.symlink_metadata().is_ok())
    {
        return Err(CertsError::Exists { path });
    }
    for (name, text) in FILES.iter().zip(contents) {
        let path = dir.join(name);
        let mode = if name.ends_with(".key") { 0o600 } else { 0o644 };
        let err = |source| CertsError::Write {
            path: path.clone(),
            source,
        };
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_keys_are_the_owners_alone_and_no_file_already_there_is_replaced_or_joined() {
        let dir = tempfile::tempdir().unwrap();
        let certs = make(&["localhost".into()], "kube-scheduler", 1).unwrap();
        write(&certs, dir.path()).unwrap();
        for f in FILES {
            let mode = std::fs::metadata(dir.path().join(f))
                .unwrap()
                .permissions()
                .mode();
            if f.ends_with(".key") {
                assert_eq!(mode & 0o077, 0, "{f}: {mode:o}");
            }
        }
        let first = std::fs::read_to_string(dir.path().join("ca.crt")).unwrap();
        let again = make(&["localhost".into()], "kube-scheduler", 1).unwrap();
        assert!(matches!(
            write(&again, dir.path()),
            Err(CertsError::Exists { .. })
        ));
        assert_eq!(
            std::fs::read_to_string(dir.path().join("ca.crt")).unwrap(),
            first
        );
        // One file of another set there: none of this one is written beside it.
        let other = tempfile::tempdir().unwrap();
        std::fs::write(other.path().join("tls.key"), "kept").unwrap();
        assert!(matches!(
            write(&again, other.path()),
            Err(CertsError::Exists { .. })
        ));
        assert!(!other.path().join("ca.crt").exists());
        assert!(matches!(
            make(&[], "kube-scheduler", 0),
            Err(CertsError::Days(0))
        ));
    }
}
