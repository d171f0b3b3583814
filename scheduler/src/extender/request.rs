//! What a pod asks of the cluster: each container's slice, read from the pod's annotations
//! and the containers' declared extended resources with the same parser the node agent uses,
//! and the pod's node policy.

use std::collections::BTreeMap;

use gpuslice_core::annotations;
use gpuslice_core::fit::Shape;
use gpuslice_core::policy::Policy;
use gpuslice_core::resources::{self, Declared, Resolved};
use serde_json::Value;

use super::wire;
use crate::cluster::{Axis, ClusterPolicy, Demand};

/// Why a pod's request cannot be read; every message names the annotation or resource, its
/// value and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error(transparent)]
    Annotation(#[from] annotations::AnnotationError),
    #[error(transparent)]
    Resources(#[from] resources::ResourceError),
    #[error("annotation {key}={value:?}: the pod has no container {container:?} (it has: {known})")]
    UnknownContainer {
        key: String,
        value: String,
        container: String,
        known: String,
    },
    #[error("annotation {key}={value:?}: {reason}")]
    NodePolicy {
        key: String,
        value: String,
        reason: String,
    },
}

/// What a pod asks of the cluster.
#[derive(Debug, Clone, PartialEq)]
pub enum PodRequest {
    /// No gpuslice annotations: not this extender's business.
    None,
    /// One demand per container that asks for a slice, and the pod's node policy.
    Slices(Vec<Demand>, Option<ClusterPolicy>),
    /// Annotations no node can satisfy because they are malformed.
    Invalid(RequestError),
}

/// The request of a pod: each container of `spec.containers` claims its own slice.
#[must_use]
pub fn pod_request(pod: &Value) -> PodRequest {
    match pod_slices(pod) {
        Err(e) => PodRequest::Invalid(e),
        Ok(p) if p.containers.is_empty() => PodRequest::None,
        Ok(p) => PodRequest::Slices(
            p.containers.into_iter().map(|c| c.demand).collect(),
            p.policy,
        ),
    }
}

/// A container that asks for a slice.
pub struct ContainerSlice {
    pub name: String,
    pub demand: Demand,
    /// Its annotations and declared resources put together.
    pub resolved: Resolved,
}

/// What a pod's containers ask for, and the pod's node policy.
pub struct PodSlices {
    pub containers: Vec<ContainerSlice>,
    pub policy: Option<ClusterPolicy>,
}

impl PodSlices {
    /// The annotations bind writes so that the node sees what the declared resources said:
    /// none when the annotations said it all, else every slice container's request in full
    /// (naming every container keeps the others' GPUs once per-container keys exist).
    #[must_use]
    pub fn annotations_to_write(&self) -> BTreeMap<String, String> {
        if !self.containers.iter().any(|c| c.resolved.completed) {
            return BTreeMap::new();
        }
        self.containers
            .iter()
            .flat_map(|c| c.resolved.annotations(&c.name))
            .collect()
    }
}

/// Each container that asks for a slice, by its annotations or its declared extended
/// resources (`gpuslice.io/gpu-memory`, `gpuslice.io/gpu-cores`), and the pod's node policy.
pub fn pod_slices(pod: &Value) -> Result<PodSlices, RequestError> {
    let mut ann = wire::annotations(pod);
    let empty = Vec::new();
    let containers = pod["spec"]["containers"].as_array().unwrap_or(&empty);
    let mut slices = Vec::new();
    let policy = pod_node_policy(&ann)?;
    check_containers_named(pod, &ann)?;
    for c in containers {
        let Some(name) = c["name"].as_str() else {
            continue;
        };
        ann.insert(
            annotations::CRI_CONTAINER_NAME.to_string(),
            name.to_string(),
        );
        let request = annotations::parse(&ann)?;
        let declared = Declared::of_container(c)?;
        let Some(resolved) = resources::resolve(name, request, declared)? else {
            continue;
        };
        let req = &resolved.request;
        slices.push(ContainerSlice {
            name: name.to_string(),
            demand: Demand {
                cpu: 0,
                mem: 0,
                gpus: req.gpus,
                shape: Shape::of(req)?,
                devices: req.devices.clone(),
                avoid: req.avoid_devices.clone(),
                gpu_models: req.models.clone(),
                models: None,
            },
            resolved,
        });
    }
    Ok(PodSlices {
        containers: slices,
        policy,
    })
}

/// Every per-container key (`gpuslice.io/<container>.<field>`) names a container of the pod:
/// one naming no container would leave the container meant without a GPU, silently.
fn check_containers_named(pod: &Value, ann: &BTreeMap<String, String>) -> Result<(), RequestError> {
    let spec = &pod["spec"];
    let names: Vec<&str> = ["containers", "initContainers"]
        .iter()
        .filter_map(|k| spec[*k].as_array())
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    for (key, value) in ann {
        let Some((container, _)) = key
            .strip_prefix(annotations::PREFIX)
            .and_then(|k| k.split_once('.'))
        else {
            continue;
        };
        if !names.contains(&container) {
            return Err(RequestError::UnknownContainer {
                key: key.clone(),
                value: value.clone(),
                container: container.to_string(),
                known: names.join(", "),
            });
        }
    }
    Ok(())
}

/// The pod's `gpuslice.io/node-policy`, however its containers ask for their slices.
fn pod_node_policy(ann: &BTreeMap<String, String>) -> Result<Option<ClusterPolicy>, RequestError> {
    let key = format!("{}{}", annotations::PREFIX, annotations::NODE_POLICY);
    ann.get(&key)
        .map(|v| {
            v.trim()
                .parse::<Policy>()
                .map(node_policy)
                .map_err(|reason| RequestError::NodePolicy {
                    key: key.clone(),
                    value: v.clone(),
                    reason,
                })
        })
        .transpose()
}

/// The cluster policy a pod's node policy stands for: node binpack or spread (GPUs binpacked
/// within the node), or frag-aware.
fn node_policy(p: Policy) -> ClusterPolicy {
    match p {
        Policy::Binpack => ClusterPolicy::Axes {
            node: Axis::Binpack,
            gpu: Axis::Binpack,
        },
        Policy::Spread => ClusterPolicy::Axes {
            node: Axis::Spread,
            gpu: Axis::Binpack,
        },
        Policy::FragAware => ClusterPolicy::FragAware,
    }
}
