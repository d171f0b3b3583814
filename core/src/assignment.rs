//! The scheduler's decision for a pod, as it travels on the pod in `gpuslice.io/assignment`:
//! the node and, per container, the GPUs with the memory and SM share on each, signed with a
//! key the scheduler and the node agents share, so that an agent can tell the scheduler's
//! decision from an annotation anyone with pod-write access could have written.
//!
//! Encoding: `v1.<payload>.<mac>`, where payload is the assignment as JSON in unpadded
//! base64url and mac is HMAC-SHA256 over `v1.<payload>` with the shared key, unpadded
//! base64url.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

const PREFIX: &str = "v1";

/// One GPU of a container's assignment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssignedGpu {
    pub uuid: String,
    pub memory_bytes: u64,
    pub cores: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    pub node: String,
    pub pod_uid: String,
    /// Container name → its GPUs.
    pub containers: BTreeMap<String, Vec<AssignedGpu>>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssignmentError {
    #[error("not a gpuslice assignment (expected v1.<payload>.<signature>)")]
    Format,
    #[error("the signature does not check with this node's key")]
    Signature,
    #[error("the signed payload is not an assignment: {0}")]
    Payload(String),
    #[error("the signing key is empty")]
    EmptyKey,
}

fn mac(key: &[u8], signed: &str) -> Result<Hmac<Sha256>, AssignmentError> {
    if key.is_empty() {
        return Err(AssignmentError::EmptyKey);
    }
    let mut m = Hmac::<Sha256>::new_from_slice(key).map_err(|_| AssignmentError::EmptyKey)?;
    m.update(signed.as_bytes());
    Ok(m)
}

/// The shortest key taken: as long as the HMAC-SHA256 output (RFC 2104 advises no less).
pub const MIN_KEY_BYTES: usize = 32;

/// The shared key in the contents of a key file (a mounted Secret) that `source` names in
/// messages: its bytes without a trailing newline, at least [`MIN_KEY_BYTES`] of them (so that
/// a placeholder left in a manifest is refused).
pub fn key_from_file(mut key: Vec<u8>, source: &str) -> Result<Vec<u8>, String> {
    while key.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        key.pop();
    }
    if key.len() < MIN_KEY_BYTES {
        return Err(format!(
            "{source}: the key is {} bytes, at least {MIN_KEY_BYTES} are needed (make one with: head -c 32 /dev/urandom | base64)",
            key.len()
        ));
    }
    Ok(key)
}

impl Assignment {
    /// The annotation value, signed with `key`.
    pub fn sign(&self, key: &[u8]) -> Result<String, AssignmentError> {
        let json = serde_json::to_vec(self).map_err(|e| AssignmentError::Payload(e.to_string()))?;
        let signed = format!("{PREFIX}.{}", URL_SAFE_NO_PAD.encode(json));
        let tag = mac(key, &signed)?.finalize().into_bytes();
        Ok(format!("{signed}.{}", URL_SAFE_NO_PAD.encode(tag)))
    }

    /// Reads an annotation value, checking its signature with `key` (in constant time).
    pub fn verify(value: &str, key: &[u8]) -> Result<Self, AssignmentError> {
        let (signed, tag) = value
            .trim()
            .rsplit_once('.')
            .ok_or(AssignmentError::Format)?;
        let (prefix, payload) = signed.split_once('.').ok_or(AssignmentError::Format)?;
        if prefix != PREFIX {
            return Err(AssignmentError::Format);
        }
        let tag = URL_SAFE_NO_PAD
            .decode(tag)
            .map_err(|_| AssignmentError::Format)?;
        mac(key, signed)?
            .verify_slice(&tag)
            .map_err(|_| AssignmentError::Signature)?;
        let json = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| AssignmentError::Format)?;
        serde_json::from_slice(&json).map_err(|e| AssignmentError::Payload(e.to_string()))
    }

    /// The GPUs of `container`; a pod-level assignment of a single container serves any
    /// container name.
    #[must_use]
    pub fn for_container(&self, container: Option<&str>) -> Option<&[AssignedGpu]> {
        match container {
            Some(c) => self.containers.get(c).map(Vec::as_slice),
            None if self.containers.len() == 1 => {
                self.containers.values().next().map(Vec::as_slice)
            }
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Assignment {
        Assignment {
            node: "gpu-7".into(),
            pod_uid: "uid-1".into(),
            containers: BTreeMap::from([(
                "app".into(),
                vec![AssignedGpu {
                    uuid: "GPU-1".into(),
                    memory_bytes: 2 << 30,
                    cores: 30,
                }],
            )]),
        }
    }

    #[test]
    fn a_signed_assignment_verifies_with_the_same_key_only() {
        let v = sample().sign(b"secret").unwrap();
        assert!(v.starts_with("v1."));
        assert_eq!(Assignment::verify(&v, b"secret"), Ok(sample()));
        assert_eq!(
            Assignment::verify(&v, b"other"),
            Err(AssignmentError::Signature)
        );
    }

    #[test]
    fn a_key_file_shorter_than_the_mac_is_refused_and_a_newline_is_not_part_of_the_key() {
        let e = key_from_file(b"REPLACE-ME\n".to_vec(), "/etc/key").unwrap_err();
        assert_eq!(
            e,
            "/etc/key: the key is 10 bytes, at least 32 are needed (make one with: head -c 32 /dev/urandom | base64)"
        );
        let good = "k".repeat(44);
        assert_eq!(
            key_from_file(format!("{good}\n").into_bytes(), "/etc/key").unwrap(),
            good.as_bytes()
        );
    }

    #[test]
    fn a_tampered_payload_or_a_bare_one_is_refused() {
        let v = sample().sign(b"secret").unwrap();
        let (_, rest) = v.split_once('.').unwrap();
        let (payload, tag) = rest.split_once('.').unwrap();
        let mut forged = sample();
        forged.containers.get_mut("app").unwrap()[0].memory_bytes = 8 << 30;
        let forged_payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&forged).unwrap());
        assert_ne!(payload, forged_payload);
        assert_eq!(
            Assignment::verify(&format!("v1.{forged_payload}.{tag}"), b"secret"),
            Err(AssignmentError::Signature)
        );
        assert_eq!(
            Assignment::verify(&format!("v1.{payload}"), b"secret"),
            Err(AssignmentError::Format),
            "an unsigned payload"
        );
        assert_eq!(
            Assignment::verify("{\"node\":\"gpu-7\"}", b"secret"),
            Err(AssignmentError::Format)
        );
        assert_eq!(sample().sign(b""), Err(AssignmentError::EmptyKey));
    }
}
