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
    /// The demands of its containers that ask for a slice, and the pod's node policy.
    Slices(PodDemands, Option<ClusterPolicy>),
    /// Annotations no node can satisfy because they are malformed.
    Invalid(RequestError),
}

/// The demands of a pod's containers, as Kubernetes runs them: the init containers one after
/// the other, each alone beside the sidecars started before it (init containers with
/// `restartPolicy: Always`, which keep running), then the app containers beside all the
/// sidecars. A node takes the pod when it takes every one of these steps: Kubernetes'
/// effective request (the larger of the biggest init container and the app containers
/// together), GPU by GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodDemands {
    /// Each init container's demand, in order, and whether it is a sidecar.
    pub init: Vec<(Demand, bool)>,
    pub apps: Vec<Demand>,
}

impl PodDemands {
    /// What runs once the pod has started: its sidecars, then its app containers. This is
    /// what the pod holds on its node for its life, what scores and the learned mix count.
    #[must_use]
    pub fn running(&self) -> Vec<Demand> {
        self.init
            .iter()
            .filter(|(_, sidecar)| *sidecar)
            .map(|(d, _)| d.clone())
            .chain(self.apps.iter().cloned())
            .collect()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.init.is_empty() && self.apps.is_empty()
    }
}

/// The request of a pod: each of its containers (init, sidecar, app) that asks for a slice
/// claims its own while it runs.
#[must_use]
pub fn pod_request(pod: &Value) -> PodRequest {
    match pod_slices(pod) {
        Err(e) => PodRequest::Invalid(e),
        Ok(p) if p.is_empty() => PodRequest::None,
        Ok(p) => PodRequest::Slices(p.demands(), p.policy),
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
    /// Init containers that ask for a slice, in order, each with whether it is a sidecar
    /// (`restartPolicy: Always`: it runs beside the app containers).
    pub init: Vec<(ContainerSlice, bool)>,
    /// App containers (`spec.containers`) that ask for a slice.
    pub containers: Vec<ContainerSlice>,
    pub policy: Option<ClusterPolicy>,
}

impl PodSlices {
    /// No container asks for a slice.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.init.is_empty() && self.containers.is_empty()
    }

    /// Every container that asks for a slice: init containers first.
    pub fn all(&self) -> impl Iterator<Item = &ContainerSlice> {
        self.init.iter().map(|(c, _)| c).chain(&self.containers)
    }

    /// The containers' demands.
    #[must_use]
    pub fn demands(&self) -> PodDemands {
        PodDemands {
            init: self
                .init
                .iter()
                .map(|(c, sidecar)| (c.demand.clone(), *sidecar))
                .collect(),
            apps: self.containers.iter().map(|c| c.demand.clone()).collect(),
        }
    }

    /// The annotations bind writes so that the node sees what the declared resources said:
    /// none when the annotations said it all, else every slice container's request in full
    /// (naming every container keeps the others' GPUs once per-container keys exist).
    #[must_use]
    pub fn annotations_to_write(&self) -> BTreeMap<String, String> {
        if !self.all().any(|c| c.resolved.completed) {
            return BTreeMap::new();
        }
        self.all()
            .flat_map(|c| c.resolved.annotations(&c.name))
            .collect()
    }
}

/// Each container that asks for a slice (init containers included: the node agent gives
/// them a slice as it does app containers), by its annotations or its declared extended
/// resources (`gpuslice.io/gpu-memory`, `gpuslice.io/gpu-cores`), and the pod's node policy.
pub fn pod_slices(pod: &Value) -> Result<PodSlices, RequestError> {
    let ann = wire::annotations(pod);
    let empty = Vec::new();
    let policy = pod_node_policy(&ann)?;
    check_containers_named(pod, &ann)?;
    let mut init = Vec::new();
    for c in pod["spec"]["initContainers"].as_array().unwrap_or(&empty) {
        if let Some(slice) = container_slice(c, &ann)? {
            init.push((slice, c["restartPolicy"].as_str() == Some("Always")));
        }
    }
    let mut containers = Vec::new();
    for c in pod["spec"]["containers"].as_array().unwrap_or(&empty) {
        containers.extend(container_slice(c, &ann)?);
    }
    Ok(PodSlices {
        init,
        containers,
        policy,
    })
}

/// The slice container `c` of a pod annotated `pod_annotations` asks for, if any.
fn container_slice(
    c: &Value,
    pod_annotations: &BTreeMap<String, String>,
) -> Result<Option<ContainerSlice>, RequestError> {
    let Some(name) = c["name"].as_str() else {
        return Ok(None);
    };
    let mut ann = pod_annotations.clone();
    ann.insert(
        annotations::CRI_CONTAINER_NAME.to_string(),
        name.to_string(),
    );
    let request = annotations::parse(&ann)?;
    let declared = Declared::of_container(c)?;
    let Some(resolved) = resources::resolve(name, request, declared)? else {
        return Ok(None);
    };
    let req = &resolved.request;
    Ok(Some(ContainerSlice {
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
    }))
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

/// The cluster policy a pod's node policy (or the extender's default) stands for: node
/// binpack or spread (GPUs binpacked within the node, unless a container's
/// `gpuslice.io/gpu-policy` says otherwise), or frag-aware.
#[must_use]
pub fn node_policy(p: Policy) -> ClusterPolicy {
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
