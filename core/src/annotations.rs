//! The request a container makes, read from its annotations.
//!
//! Keys live under `gpuslice.io/`. A key applies to every GPU container of a pod
//! (`gpuslice.io/memory`), or to one container (`gpuslice.io/<container>.memory`, where the
//! container name is a DNS label and so never holds a dot). When any per-container key is
//! present, only the containers it names get a GPU and the pod-level keys are their defaults.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::policy::Policy;
use crate::quantity::{self, MemoryQuantity};
use crate::selection::{self, ModelSelector};

/// Prefix of every gpuslice annotation.
pub const PREFIX: &str = "gpuslice.io/";
/// Number of GPUs (default 1, or the number of `devices`).
pub const GPUS: &str = "gpus";
/// Device memory per GPU: bytes, `Ki`/`Mi`/`Gi`/`Ti`, `k`/`M`/`G`/`T`, or `%` of the card.
pub const MEMORY: &str = "memory";
/// Share of the SMs per GPU, in percent (1..=100).
pub const CORES: &str = "cores";
/// Explicit GPUs: comma-separated indexes or `GPU-…` UUIDs to use, or, each with `!` before
/// it, to avoid.
pub const DEVICES: &str = "devices";
/// GPU models to use, or with `!` to avoid, comma-separated (see [`crate::selection`]).
pub const GPU_MODEL: &str = "gpu-model";
/// GPU-level placement policy on the node.
pub const GPU_POLICY: &str = "gpu-policy";
/// Node-level placement policy, read by the cluster scheduler.
pub const NODE_POLICY: &str = "node-policy";
/// The signed placement written by the cluster scheduler at bind time.
pub const ASSIGNMENT: &str = "assignment";
/// Every key gpuslice understands, without the prefix.
pub const KEYS: &[&str] = &[
    GPUS,
    MEMORY,
    CORES,
    DEVICES,
    GPU_MODEL,
    GPU_POLICY,
    NODE_POLICY,
    ASSIGNMENT,
];
/// Keys that ask for GPUs; the others only say how or where, and ask for nothing alone.
pub const REQUEST_KEYS: &[&str] = &[GPUS, MEMORY, CORES, DEVICES];
/// Keys that may be given per container.
pub const PER_CONTAINER_KEYS: &[&str] = &[GPUS, MEMORY, CORES, DEVICES, GPU_MODEL, GPU_POLICY];

/// The container name as containerd's CRI plugin writes it into the OCI spec.
pub const CRI_CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
/// The container type as containerd's CRI plugin writes it (`sandbox` or `container`).
pub const CRI_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
/// The container name as CRI-O writes it.
pub const CRIO_CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// The container type as CRI-O writes it.
pub const CRIO_CONTAINER_TYPE: &str = "io.kubernetes.cri-o.ContainerType";

/// Most GPUs one container may hold (the usage region has this many counters per process).
pub const MAX_GPUS_PER_CONTAINER: u32 = 16;

/// A bad annotation: which key, what value, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("annotation {key}={value:?}: {reason}")]
pub struct AnnotationError {
    pub key: String,
    pub value: String,
    pub reason: String,
}

impl AnnotationError {
    pub fn new(key: &str, value: &str, reason: impl Into<String>) -> Self {
        Self {
            key: key.to_string(),
            value: value.to_string(),
            reason: reason.into(),
        }
    }
}

/// A GPU named by the request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceSelector {
    Index(u32),
    Uuid(String),
}

impl std::fmt::Display for DeviceSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Index(i) => write!(f, "{i}"),
            Self::Uuid(u) => f.write_str(u),
        }
    }
}

/// What one container asks for, normalised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SliceRequest {
    /// Number of GPUs.
    pub gpus: u32,
    /// Memory per GPU; `None` together with `cores == None` asks for whole GPUs.
    pub memory: Option<MemoryQuantity>,
    /// Percent of the SMs per GPU; `None` means no reserved share.
    pub cores: Option<u32>,
    /// GPUs the request names, in order: it gets exactly these.
    pub devices: Vec<DeviceSelector>,
    /// GPUs the request avoids.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub avoid_devices: Vec<DeviceSelector>,
    /// The GPU models it accepts.
    #[serde(default, skip_serializing_if = "ModelSelector::is_any")]
    pub models: ModelSelector,
    pub gpu_policy: Option<Policy>,
    pub node_policy: Option<Policy>,
    /// The scheduler's assignment, as written on the pod.
    pub assignment: Option<String>,
    /// The container this request was read for, when the annotations name one.
    pub container: Option<String>,
    /// The annotations the request was read from, as written (key with prefix → value), so
    /// that messages quote what the user wrote.
    #[serde(default)]
    pub source: BTreeMap<String, String>,
}

impl SliceRequest {
    /// Whole GPUs, shared with nobody: the request names neither memory nor cores.
    #[must_use]
    pub fn is_exclusive(&self) -> bool {
        self.memory.is_none() && self.cores.is_none()
    }

    /// The value of field `name` as the user wrote it, or `fallback` when it was not given.
    #[must_use]
    pub fn written(&self, name: &str, fallback: impl FnOnce() -> String) -> String {
        self.source
            .get(&self.key(name))
            .cloned()
            .unwrap_or_else(fallback)
    }

    /// The annotation key (with prefix) a field of this request came from, for messages.
    #[must_use]
    pub fn key(&self, name: &str) -> String {
        match &self.container {
            Some(c) if PER_CONTAINER_KEYS.contains(&name) => format!("{PREFIX}{c}.{name}"),
            _ => format!("{PREFIX}{name}"),
        }
    }
}

/// Reads the request of the container whose annotations these are. `Ok(None)`: no GPU (no
/// gpuslice annotations, or only policies or an assignment).
pub fn parse(
    annotations: &BTreeMap<String, String>,
) -> Result<Option<SliceRequest>, AnnotationError> {
    let mut pod: BTreeMap<&str, (&str, &str)> = BTreeMap::new();
    let mut per_container: BTreeMap<&str, BTreeMap<&str, (&str, &str)>> = BTreeMap::new();
    for (key, value) in annotations {
        let Some(name) = key.strip_prefix(PREFIX) else {
            continue;
        };
        if value.chars().any(char::is_control) {
            return Err(AnnotationError::new(
                key,
                value,
                "contains control characters",
            ));
        }
        match name.split_once('.') {
            None if KEYS.contains(&name) => {
                pod.insert(name, (key, value));
            }
            None => return Err(unknown_key(key, value)),
            Some((container, field)) => {
                if !is_dns_label(container) {
                    return Err(AnnotationError::new(
                        key,
                        value,
                        format!("{container:?} is not a container name (a DNS label)"),
                    ));
                }
                if !PER_CONTAINER_KEYS.contains(&field) {
                    return Err(if KEYS.contains(&field) {
                        AnnotationError::new(
                            key,
                            value,
                            format!("{PREFIX}{field} is set per pod, not per container"),
                        )
                    } else {
                        unknown_key(key, value)
                    });
                }
                per_container
                    .entry(container)
                    .or_default()
                    .insert(field, (key, value));
            }
        }
    }
    if pod.is_empty() && per_container.is_empty() {
        return Ok(None);
    }
    let kind = annotations
        .get(CRI_CONTAINER_TYPE)
        .or_else(|| annotations.get(CRIO_CONTAINER_TYPE));
    if kind.is_some_and(|k| k == "sandbox") {
        return Ok(None);
    }
    let name = annotations
        .get(CRI_CONTAINER_NAME)
        .or_else(|| annotations.get(CRIO_CONTAINER_NAME))
        .map(String::as_str);
    let mut fields = pod;
    let mut container = None;
    if !per_container.is_empty() {
        let own = name.and_then(|n| per_container.get(n));
        match own {
            Some(own) => {
                fields.extend(own.iter().map(|(k, v)| (*k, *v)));
                container = name.map(str::to_string);
            }
            None => return Ok(None),
        }
    }
    let request = build(&fields, container)?;
    if !fields.keys().any(|k| REQUEST_KEYS.contains(k)) {
        // Only policies (or an assignment): checked above, but no GPU is asked for.
        return Ok(None);
    }
    Ok(Some(request))
}

fn unknown_key(key: &str, value: &str) -> AnnotationError {
    AnnotationError::new(
        key,
        value,
        format!("unknown gpuslice annotation (known: {})", KEYS.join(", ")),
    )
}

fn build(
    fields: &BTreeMap<&str, (&str, &str)>,
    container: Option<String>,
) -> Result<SliceRequest, AnnotationError> {
    let get = |name: &str| fields.get(name).copied();
    let memory = get(MEMORY)
        .map(|(k, v)| {
            quantity::parse_memory(v).map_err(|e| AnnotationError::new(k, v, e.to_string()))
        })
        .transpose()?;
    let cores = get(CORES).map(|(k, v)| parse_cores(k, v)).transpose()?;
    let device_list = get(DEVICES)
        .map(|(k, v)| selection::parse_devices(k, v))
        .transpose()?
        .unwrap_or_default();
    let devices = device_list.named;
    let models = get(GPU_MODEL)
        .map(|(k, v)| ModelSelector::parse(k, v))
        .transpose()?
        .unwrap_or_default();
    let gpus = match get(GPUS) {
        Some((k, v)) => {
            let n = parse_count(k, v)?;
            if !devices.is_empty() && devices.len() != n as usize {
                let (dk, dv) = get(DEVICES).unwrap_or_default();
                return Err(AnnotationError::new(
                    dk,
                    dv,
                    format!("names {} GPUs but {k}={v}", devices.len()),
                ));
            }
            n
        }
        None if devices.is_empty() => 1,
        None => u32::try_from(devices.len()).unwrap_or(u32::MAX),
    };
    let policy = |name: &str| {
        get(name)
            .map(|(k, v)| {
                v.trim()
                    .parse::<Policy>()
                    .map_err(|e| AnnotationError::new(k, v, e))
            })
            .transpose()
    };
    let assignment = get(ASSIGNMENT).map(|(_, v)| v.to_string());
    let source = fields
        .values()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
    Ok(SliceRequest {
        gpus,
        memory,
        cores,
        devices,
        avoid_devices: device_list.avoided,
        models,
        gpu_policy: policy(GPU_POLICY)?,
        node_policy: policy(NODE_POLICY)?,
        assignment,
        container,
        source,
    })
}

fn parse_count(key: &str, value: &str) -> Result<u32, AnnotationError> {
    let v = value.trim();
    if v.starts_with('-') {
        return Err(AnnotationError::new(key, value, "must not be negative"));
    }
    let n: u32 = v
        .parse()
        .map_err(|_| AnnotationError::new(key, value, "not a whole number of GPUs"))?;
    if n == 0 {
        return Err(AnnotationError::new(
            key,
            value,
            "must be at least 1 (leave the annotations out for no GPU)",
        ));
    }
    if n > MAX_GPUS_PER_CONTAINER {
        return Err(AnnotationError::new(
            key,
            value,
            format!("at most {MAX_GPUS_PER_CONTAINER} GPUs per container"),
        ));
    }
    Ok(n)
}

fn parse_cores(key: &str, value: &str) -> Result<u32, AnnotationError> {
    let v = value.trim();
    let digits = v.strip_suffix('%').unwrap_or(v);
    if digits.starts_with('-') {
        return Err(AnnotationError::new(key, value, "must not be negative"));
    }
    let n: u32 = digits.parse().map_err(|_| {
        AnnotationError::new(key, value, "not a whole percentage of the SMs (1 to 100)")
    })?;
    match n {
        0 => Err(AnnotationError::new(
            key,
            value,
            "must be at least 1 (leave it out for no reserved share)",
        )),
        1..=100 => Ok(n),
        _ => Err(AnnotationError::new(
            key,
            value,
            "must be at most 100 (percent of the SMs)",
        )),
    }
}

/// `GPU-` followed by a UUID in 8-4-4-4-12 hex groups.
#[must_use]
pub fn is_gpu_uuid(s: &str) -> bool {
    let Some(rest) = s.strip_prefix("GPU-") else {
        return false;
    };
    let groups: Vec<&str> = rest.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.chars().all(|c| c.is_ascii_hexdigit()))
}

/// RFC 1123 label: what Kubernetes allows as a container name.
#[must_use]
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests;
