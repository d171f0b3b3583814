//! GPU-level placement: which GPUs of a node a request gets, and why a request cannot be
//! admitted. The same code serves the node agent (the authority) and the cluster scheduler.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::annotations::{self, DeviceSelector, SliceRequest};
use crate::claim::GpuGrant;
use crate::quantity::format_bytes;

/// How to choose among GPUs (or nodes) that can all host a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Fill the fullest GPU that still fits, keeping whole GPUs free.
    Binpack,
    /// Use the emptiest GPU, lowering contention.
    Spread,
    /// Grow expected fragmentation least; decided by the cluster scheduler, which sees the
    /// workload's task classes.
    FragAware,
}

impl FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "binpack" => Ok(Self::Binpack),
            "spread" => Ok(Self::Spread),
            "frag-aware" => Ok(Self::FragAware),
            _ => Err("unknown policy (use binpack, spread or frag-aware)".to_string()),
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Binpack => "binpack",
            Self::Spread => "spread",
            Self::FragAware => "frag-aware",
        })
    }
}

/// What is already allocated on one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuLoad {
    pub index: u32,
    pub uuid: String,
    pub minor: u32,
    pub memory_total: u64,
    pub memory_allocated: u64,
    /// Percent of the SMs reserved by slices.
    pub cores_allocated: u32,
    /// Slices on this GPU.
    pub sharers: u32,
    /// Held whole by one container.
    pub exclusive: bool,
}

impl GpuLoad {
    #[must_use]
    pub fn memory_free(&self) -> u64 {
        self.memory_total.saturating_sub(self.memory_allocated)
    }
    #[must_use]
    pub fn cores_free(&self) -> u32 {
        100u32.saturating_sub(self.cores_allocated)
    }
}

/// Limits the node sets on every GPU beyond memory and cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// Most slices on one GPU.
    pub max_sharers: u32,
}

impl Default for Rules {
    fn default() -> Self {
        Self { max_sharers: 16 }
    }
}

/// Why a request was refused; the label of the refusal metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalReason {
    InvalidRequest,
    NoSuchDevice,
    InsufficientMemory,
    InsufficientCores,
    MaxSharers,
    GpuInUse,
    NotEnoughGpus,
    PolicyUnavailable,
    Conflict,
}

impl RefusalReason {
    pub const ALL: [Self; 9] = [
        Self::InvalidRequest,
        Self::NoSuchDevice,
        Self::InsufficientMemory,
        Self::InsufficientCores,
        Self::MaxSharers,
        Self::GpuInUse,
        Self::NotEnoughGpus,
        Self::PolicyUnavailable,
        Self::Conflict,
    ];

    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid_request",
            Self::NoSuchDevice => "no_such_device",
            Self::InsufficientMemory => "insufficient_memory",
            Self::InsufficientCores => "insufficient_cores",
            Self::MaxSharers => "max_sharers",
            Self::GpuInUse => "gpu_in_use",
            Self::NotEnoughGpus => "not_enough_gpus",
            Self::PolicyUnavailable => "policy_unavailable",
            Self::Conflict => "conflict",
        }
    }
}

/// A refused placement, with a message that names the annotation, its value and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct PlacementError {
    pub reason: RefusalReason,
    pub message: String,
}

impl PlacementError {
    fn new(reason: RefusalReason, key: &str, value: &str, why: &str) -> Self {
        Self {
            reason,
            message: format!("annotation {key}={value:?}: {why}"),
        }
    }
}

/// Why one GPU cannot host the request.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Misfit {
    Exclusive,
    InUse(u32),
    MaxSharers(u32),
    Memory { want: u64, free: u64, total: u64 },
    Cores { want: u32, free: u32 },
}

impl Misfit {
    fn reason(&self) -> RefusalReason {
        match self {
            Self::Exclusive | Self::InUse(_) => RefusalReason::GpuInUse,
            Self::MaxSharers(_) => RefusalReason::MaxSharers,
            Self::Memory { .. } => RefusalReason::InsufficientMemory,
            Self::Cores { .. } => RefusalReason::InsufficientCores,
        }
    }
    fn describe(&self, gpu: &GpuLoad) -> String {
        let i = gpu.index;
        match self {
            Self::Exclusive => format!("GPU {i} is held whole by another container"),
            Self::InUse(n) => {
                format!("GPU {i} is shared by {n} container(s), a whole GPU needs none")
            }
            Self::MaxSharers(n) => format!("GPU {i} already has {n} slices, the most allowed"),
            Self::Memory { want, free, total } if want > total => {
                format!(
                    "GPU {i} has only {} in all, {} asked",
                    format_bytes(*total),
                    format_bytes(*want)
                )
            }
            Self::Memory { want, free, .. } => {
                format!(
                    "GPU {i} has {} free, {} asked",
                    format_bytes(*free),
                    format_bytes(*want)
                )
            }
            Self::Cores { want, free } => {
                format!("GPU {i} has {free}% of its SMs free, {want}% asked")
            }
        }
    }
    /// The annotation that best explains the misfit.
    fn key(&self) -> &'static str {
        match self {
            Self::Memory { .. } => annotations::MEMORY,
            Self::Cores { .. } => annotations::CORES,
            _ => annotations::GPUS,
        }
    }
}

fn fit(req: &SliceRequest, gpu: &GpuLoad, rules: Rules) -> Result<GpuGrant, Misfit> {
    if gpu.exclusive {
        return Err(Misfit::Exclusive);
    }
    if req.is_exclusive() {
        if gpu.sharers > 0 {
            return Err(Misfit::InUse(gpu.sharers));
        }
        return Ok(grant(gpu, gpu.memory_total, 100));
    }
    if gpu.sharers >= rules.max_sharers {
        return Err(Misfit::MaxSharers(gpu.sharers));
    }
    let want = req.memory.map_or(0, |m| m.bytes_of(gpu.memory_total));
    if want > gpu.memory_free() || want == 0 {
        return Err(Misfit::Memory {
            want,
            free: gpu.memory_free(),
            total: gpu.memory_total,
        });
    }
    let cores = req.cores.unwrap_or(0);
    if cores > gpu.cores_free() {
        return Err(Misfit::Cores {
            want: cores,
            free: gpu.cores_free(),
        });
    }
    Ok(grant(gpu, want, cores))
}

fn grant(gpu: &GpuLoad, memory_bytes: u64, cores: u32) -> GpuGrant {
    GpuGrant {
        index: gpu.index,
        uuid: gpu.uuid.clone(),
        minor: gpu.minor,
        memory_bytes,
        cores,
    }
}

/// Chooses the GPUs for `req` among `gpus`, or says why none can be had.
pub fn place(
    req: &SliceRequest,
    gpus: &[GpuLoad],
    rules: Rules,
    default_policy: Policy,
) -> Result<Vec<GpuGrant>, PlacementError> {
    if !req.is_exclusive() && req.memory.is_none() {
        return Err(PlacementError::new(
            RefusalReason::InvalidRequest,
            &req.key(annotations::MEMORY),
            "",
            "a shared slice needs a memory limit (leave out cores too for whole GPUs)",
        ));
    }
    if !req.devices.is_empty() {
        return place_named(req, gpus, rules);
    }
    let gpus_key = req.key(annotations::GPUS);
    if req.gpus as usize > gpus.len() {
        return Err(PlacementError::new(
            RefusalReason::NotEnoughGpus,
            &gpus_key,
            &req.written(annotations::GPUS, || req.gpus.to_string()),
            &format!("this node has {} GPU(s)", gpus.len()),
        ));
    }
    let policy = req.gpu_policy.unwrap_or(default_policy);
    let mut fitting = Vec::new();
    let mut misfits = Vec::new();
    for gpu in gpus {
        match fit(req, gpu, rules) {
            Ok(g) => fitting.push((gpu, g)),
            Err(m) => misfits.push((gpu, m)),
        }
    }
    if fitting.len() < req.gpus as usize {
        return Err(explain_shortfall(req, fitting.len(), &misfits));
    }
    let after = |(gpu, g): &(&GpuLoad, GpuGrant)| gpu.memory_free() - g.memory_bytes;
    match policy {
        Policy::Binpack => {
            fitting.sort_by_key(|c| (after(c), c.0.cores_free() - c.1.cores, c.0.index))
        }
        Policy::Spread => fitting.sort_by_key(|c| {
            (
                std::cmp::Reverse(after(c)),
                c.0.sharers,
                std::cmp::Reverse(c.0.cores_free()),
                c.0.index,
            )
        }),
        Policy::FragAware => {
            return Err(PlacementError::new(
                RefusalReason::PolicyUnavailable,
                &req.key(annotations::GPU_POLICY),
                &req.written(annotations::GPU_POLICY, || "frag-aware".to_string()),
                "frag-aware placement is decided by gpuslice-scheduler; a node agent places with binpack or spread",
            ));
        }
    }
    let mut chosen: Vec<GpuGrant> = fitting
        .into_iter()
        .take(req.gpus as usize)
        .map(|(_, g)| g)
        .collect();
    chosen.sort_by_key(|g| g.index);
    Ok(chosen)
}

fn place_named(
    req: &SliceRequest,
    gpus: &[GpuLoad],
    rules: Rules,
) -> Result<Vec<GpuGrant>, PlacementError> {
    let key = req.key(annotations::DEVICES);
    let value = req
        .devices
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let mut chosen = Vec::new();
    for sel in &req.devices {
        let gpu = gpus.iter().find(|g| match sel {
            DeviceSelector::Index(i) => g.index == *i,
            DeviceSelector::Uuid(u) => g.uuid.eq_ignore_ascii_case(u),
        });
        let Some(gpu) = gpu else {
            return Err(PlacementError::new(
                RefusalReason::NoSuchDevice,
                &key,
                &value,
                &format!("this node has no GPU {sel} (it has {} GPU(s))", gpus.len()),
            ));
        };
        match fit(req, gpu, rules) {
            Ok(g) => chosen.push(g),
            Err(m) => {
                let detail = describe_request(req);
                return Err(PlacementError::new(
                    m.reason(),
                    &key,
                    &value,
                    &format!("{}; {detail}", m.describe(gpu)),
                ));
            }
        }
    }
    Ok(chosen)
}

fn describe_request(req: &SliceRequest) -> String {
    if req.is_exclusive() {
        return format!("asked for {} whole GPU(s)", req.gpus);
    }
    let mem = req.memory.map_or_else(String::new, |m| m.to_string());
    match req.cores {
        Some(c) => format!("asked for {mem} and {c}% of the SMs per GPU"),
        None => format!("asked for {mem} per GPU"),
    }
}

fn explain_shortfall(
    req: &SliceRequest,
    fitting: usize,
    misfits: &[(&GpuLoad, Misfit)],
) -> PlacementError {
    let first = misfits.first().map(|(_, m)| m);
    let (reason, field) = match first {
        Some(m) if fitting > 0 => (RefusalReason::NotEnoughGpus, m.key()),
        Some(m) => (m.reason(), m.key()),
        None => (RefusalReason::NotEnoughGpus, annotations::GPUS),
    };
    let value = match field {
        annotations::MEMORY => req.written(field, || {
            req.memory.map_or_else(String::new, |m| m.to_string())
        }),
        annotations::CORES => req.written(field, || {
            req.cores.map_or_else(String::new, |c| c.to_string())
        }),
        _ => req.written(field, || req.gpus.to_string()),
    };
    let details: Vec<String> = misfits.iter().map(|(g, m)| m.describe(g)).collect();
    let why = format!(
        "{} GPU(s) needed, {fitting} can take it ({}): {}",
        req.gpus,
        describe_request(req),
        details.join("; ")
    );
    PlacementError::new(reason, &req.key(field), &value, &why)
}

#[cfg(test)]
mod tests;

/// The GPUs a verified scheduler assignment gives `req` on this node, if they still fit here
/// and give what the request asks. `shown` is how the annotation is quoted in messages.
pub fn place_assigned(
    req: &SliceRequest,
    gpus: &[GpuLoad],
    rules: Rules,
    assigned: &[crate::assignment::AssignedGpu],
    shown: &str,
) -> Result<Vec<GpuGrant>, PlacementError> {
    let key = req.key(annotations::ASSIGNMENT);
    let refuse = |reason, why: String| PlacementError::new(reason, &key, shown, &why);
    if assigned.len() != req.gpus as usize {
        return Err(refuse(
            RefusalReason::InvalidRequest,
            format!(
                "assigns {} GPU(s), the request asks for {}",
                assigned.len(),
                req.gpus
            ),
        ));
    }
    let mut chosen: Vec<GpuGrant> = Vec::new();
    for a in assigned {
        let Some(gpu) = gpus.iter().find(|g| g.uuid.eq_ignore_ascii_case(&a.uuid)) else {
            return Err(refuse(
                RefusalReason::NoSuchDevice,
                format!("assigns GPU {}, which this node does not have", a.uuid),
            ));
        };
        if chosen.iter().any(|c| c.index == gpu.index) {
            return Err(refuse(
                RefusalReason::InvalidRequest,
                format!("assigns GPU {} twice", a.uuid),
            ));
        }
        let grant = fit(req, gpu, rules).map_err(|m| {
            refuse(
                m.reason(),
                format!("the assigned GPU no longer fits: {}", m.describe(gpu)),
            )
        })?;
        if grant.memory_bytes != a.memory_bytes || grant.cores != a.cores {
            return Err(refuse(
                RefusalReason::Conflict,
                format!(
                    "assigns {} bytes and {}% on GPU {}, the request asks for {} bytes and {}%",
                    a.memory_bytes, a.cores, a.uuid, grant.memory_bytes, grant.cores
                ),
            ));
        }
        chosen.push(grant);
    }
    chosen.sort_by_key(|g| g.index);
    Ok(chosen)
}
