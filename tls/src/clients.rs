//! What a connection's client certificate says of its caller.

use rustls::pki_types::CertificateDer;

/// A connection's caller, as its client certificate shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Client {
    /// Its certificate chained to the client CA and, where names are listed, has one of them.
    Allowed,
    /// A client CA is configured and the caller presented no certificate.
    Anonymous,
    /// Its certificate chained to the client CA, but its common name is not among the names
    /// listed (the CA signs others' certificates too).
    Unlisted,
    /// No client CA is configured: callers cannot be told apart.
    Unverified,
}

/// How callers are told apart.
#[derive(Clone, Debug)]
pub struct ClientCheck {
    /// The server configuration verifies client certificates (it has a client CA).
    pub verifies: bool,
    /// Common names a verified certificate must have; empty: any certificate of the client CA
    /// (as kube-apiserver's `--requestheader-allowed-names`).
    pub allowed_names: Vec<String>,
}

impl ClientCheck {
    /// The caller of a connection that presented `certificates` (as the TLS server verified
    /// them: with a client CA, a certificate is there only if it chained to it).
    #[must_use]
    pub fn client(&self, certificates: Option<&[CertificateDer<'_>]>) -> Client {
        match (self.verifies, certificates.and_then(<[_]>::first)) {
            (false, _) => Client::Unverified,
            (true, None) => Client::Anonymous,
            (true, Some(_)) if self.allowed_names.is_empty() => Client::Allowed,
            (true, Some(cert)) => {
                let named = common_names(cert)
                    .iter()
                    .any(|n| self.allowed_names.iter().any(|a| a == n));
                if named {
                    Client::Allowed
                } else {
                    Client::Unlisted
                }
            }
        }
    }
}

/// The common names of a certificate's subject (none where it does not parse).
#[must_use]
pub fn common_names(cert: &CertificateDer<'_>) -> Vec<String> {
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return Vec::new();
    };
    parsed
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok().map(str::to_owned))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs::Authority;
    use rustls::pki_types::pem::PemObject;

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    #[test]
    fn a_client_is_allowed_only_by_a_verified_certificate_of_a_listed_name() {
        let ca = Authority::new(1).unwrap();
        let scheduler = [der(&ca.client("system:kube-scheduler").unwrap().cert)];
        let kubelet = [der(&ca.client("system:node:gpu-node-1").unwrap().cert)];
        let named = ClientCheck {
            verifies: true,
            allowed_names: vec!["kube-scheduler".into(), "system:kube-scheduler".into()],
        };
        assert_eq!(named.client(Some(&scheduler)), Client::Allowed);
        assert_eq!(named.client(Some(&kubelet)), Client::Unlisted);
        assert_eq!(named.client(None), Client::Anonymous);
        let any = ClientCheck {
            allowed_names: Vec::new(),
            ..named.clone()
        };
        assert_eq!(any.client(Some(&kubelet)), Client::Allowed);
        let unverified = ClientCheck {
            verifies: false,
            allowed_names: Vec::new(),
        };
        assert_eq!(unverified.client(None), Client::Unverified);
    }
}
