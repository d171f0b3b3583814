//! Kubernetes extended resources for GPU slices, so that kubelet, kube-scheduler and the
//! cluster autoscaler account for them at the node level:
//!
//! - `gpuslice.io/gpu-memory`: device memory in bytes, over all of a container's GPUs;
//! - `gpuslice.io/gpu-cores`: percent points of SMs, over all of a container's GPUs (a whole
//!   GPU is 100).
//!
//! A node agent advertises the node's totals in `status.capacity` (kubelet copies them into
//! `allocatable`). A container declares its totals in `resources.limits`. Node-level sums are
//! a necessary condition only: which GPU, and whether it still fits there, is the extender's
//! and the agent's to decide.
//!
//! The annotations remain the exact request; the declared resources fill in what they leave
//! out, and where both say something they must agree.

use std::collections::BTreeMap;

use crate::annotations::{self, SliceRequest};
use crate::publication::NodePublication;
use crate::quantity::{self, MemoryQuantity};

pub const GPU_MEMORY: &str = "gpuslice.io/gpu-memory";
pub const GPU_CORES: &str = "gpuslice.io/gpu-cores";

/// Why a container's declared resources cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("container {container}: {reason}")]
pub struct ResourceError {
    pub container: String,
    pub reason: String,
}

/// What a container declares in `resources` (its limits; its requests where the limits name
/// nothing, as the API server defaults one from the other).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Declared {
    pub memory: Option<u64>,
    pub cores: Option<u64>,
}

impl Declared {
    /// Reads a container of a v1.Pod's `spec.containers`, as JSON.
    pub fn of_container(container: &serde_json::Value) -> Result<Self, ResourceError> {
        let name = container["name"].as_str().unwrap_or_default();
        let fail = |reason: String| ResourceError {
            container: name.to_string(),
            reason,
        };
        let resources = &container["resources"];
        let value = |key: &str| -> Option<String> {
            let v = resources["limits"]
                .get(key)
                .or_else(|| resources["requests"].get(key))?;
            Some(match v {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            })
        };
        let memory = value(GPU_MEMORY)
            .map(|v| match quantity::parse_memory(&v) {
                Ok(MemoryQuantity::Bytes(b)) => Ok(b),
                Ok(MemoryQuantity::PercentBasisPoints(_)) => Err(fail(format!(
                    "resource {GPU_MEMORY}={v:?}: a resource is an amount, not a share of the card"
                ))),
                Err(e) => Err(fail(format!("resource {GPU_MEMORY}={v:?}: {e}"))),
            })
            .transpose()?;
        let cores = value(GPU_CORES)
            .map(|v| {
                v.trim().parse::<u64>().map_err(|_| {
                    fail(format!(
                        "resource {GPU_CORES}={v:?}: not a whole number of percent points of SMs"
                    ))
                })
            })
            .transpose()?;
        Ok(Self { memory, cores })
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.memory.is_none() && self.cores.is_none()
    }
}

/// A container's request once annotations and declared resources are put together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub request: SliceRequest,
    /// The resources said something the annotations did not: the annotations that say it
    /// (see [`Resolved::annotations`]) must be written on the pod for the node to see it.
    pub completed: bool,
}

impl Resolved {
    /// Per-container annotations that state this request in full (`gpuslice.io/<c>.gpus`,
    /// `.memory`, `.cores`), for the node agent, which sees annotations but not resources.
    #[must_use]
    pub fn annotations(&self, container: &str) -> BTreeMap<String, String> {
        let key = |field: &str| format!("{}{container}.{field}", annotations::PREFIX);
        let mut out = BTreeMap::new();
        out.insert(key(annotations::GPUS), self.request.gpus.to_string());
        if let Some(m) = self.request.memory {
            let value = match m {
                MemoryQuantity::Bytes(b) => b.to_string(),
                percent => percent.to_string(),
            };
            out.insert(key(annotations::MEMORY), value);
        }
        if let Some(c) = self.request.cores {
            out.insert(key(annotations::CORES), c.to_string());
        }
        out
    }
}

/// Puts a container's annotation request (`request`, `None` when its annotations ask for no
/// GPU) together with what it declares in resources.
pub fn resolve(
    container: &str,
    request: Option<SliceRequest>,
    declared: Declared,
) -> Result<Option<Resolved>, ResourceError> {
    let fail = |reason: String| ResourceError {
        container: container.to_string(),
        reason,
    };
    let mut completed = false;
    let mut req = match request {
        Some(r) => r,
        None if declared.is_empty() => return Ok(None),
        None if declared.memory.is_none() => {
            return Err(fail(format!(
                "resource {GPU_CORES} without {GPU_MEMORY}: a slice always has a memory wall \
                 (for whole GPUs, annotate {}{})",
                annotations::PREFIX,
                annotations::GPUS
            )));
        }
        None => {
            completed = true;
            SliceRequest {
                gpus: 1,
                memory: None,
                cores: None,
                devices: Vec::new(),
                avoid_devices: Vec::new(),
                models: Default::default(),
                gpu_policy: None,
                node_policy: None,
                assignment: None,
                container: Some(container.to_string()),
                source: BTreeMap::new(),
            }
        }
    };
    let gpus = u64::from(req.gpus);
    let per_gpu = |total: u64, resource: &str, unit: &str| -> Result<u64, ResourceError> {
        if total == 0 || !total.is_multiple_of(gpus) {
            return Err(fail(format!(
                "resource {resource}={total} does not split into {gpus} equal, non-zero {unit} \
                 (one per GPU)"
            )));
        }
        Ok(total / gpus)
    };
    let whole_gpus = req.is_exclusive() && declared.memory.is_none();
    match (req.memory, declared.memory) {
        (_, None) => {}
        (None, Some(total)) => {
            req.memory = Some(MemoryQuantity::Bytes(per_gpu(total, GPU_MEMORY, "sizes")?));
            completed = true;
        }
        (Some(MemoryQuantity::Bytes(b)), Some(total)) => {
            if b.checked_mul(gpus) != Some(total) {
                return Err(fail(format!(
                    "resource {GPU_MEMORY}={total} disagrees with annotation {}={:?} × {gpus} \
                     GPU(s) = {}",
                    req.key(annotations::MEMORY),
                    req.written(annotations::MEMORY, || b.to_string()),
                    b.saturating_mul(gpus)
                )));
            }
        }
        (Some(share), Some(total)) => {
            return Err(fail(format!(
                "resource {GPU_MEMORY}={total} cannot agree with annotation {}={share} on every \
                 GPU model: give the annotation in bytes, or leave the resource out",
                req.key(annotations::MEMORY)
            )));
        }
    }
    match (req.cores, declared.cores) {
        (_, None) => {}
        (None, Some(total)) if whole_gpus => {
            if total != 100 * gpus {
                return Err(fail(format!(
                    "resource {GPU_CORES}={total}: {gpus} whole GPU(s) take {} (100 each)",
                    100 * gpus
                )));
            }
        }
        (None, Some(total)) => {
            let c = per_gpu(total, GPU_CORES, "shares")?;
            if c > 100 {
                return Err(fail(format!(
                    "resource {GPU_CORES}={total}: {c} per GPU, more than 100"
                )));
            }
            req.cores = Some(u32::try_from(c).unwrap_or(100));
            completed = true;
        }
        (Some(c), Some(total)) => {
            if u64::from(c) * gpus != total {
                return Err(fail(format!(
                    "resource {GPU_CORES}={total} disagrees with annotation {}={c} × {gpus} \
                     GPU(s) = {}",
                    req.key(annotations::CORES),
                    u64::from(c) * gpus
                )));
            }
        }
    }
    Ok(Some(Resolved {
        request: req,
        completed,
    }))
}

/// The node totals an agent advertises in `status.capacity`: every GPU's memory, and 100
/// cores per GPU.
#[must_use]
pub fn node_capacity(publication: &NodePublication) -> BTreeMap<String, String> {
    let memory: u64 = publication.gpus.iter().map(|g| g.memory_total).sum();
    let cores = 100 * publication.gpus.len() as u64;
    BTreeMap::from([
        (GPU_MEMORY.to_string(), memory.to_string()),
        (GPU_CORES.to_string(), cores.to_string()),
    ])
}

#[cfg(test)]
mod tests;
