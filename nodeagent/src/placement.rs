//! Which GPUs of this node a claim gets, and why a claim cannot be admitted. Whether a
//! request fits is the shared fit model's ([`gpuslice_core::fit`]), the same the cluster
//! scheduler places with; choosing among the GPUs that fit (binpack or spread) and explaining
//! a refusal in the user's own terms are the agent's.

use gpuslice_core::annotations::{self, SliceRequest};
use gpuslice_core::assignment::AssignedGpu;
use gpuslice_core::claim::GpuGrant;
use gpuslice_core::fit::{
    self, Ask, ChosenMisfit, Misfit, NodeMisfit, NodeView, RefusalReason, Rules, Take,
};
use gpuslice_core::inventory::{GpuLoad, NodeLoads};
use gpuslice_core::policy::Policy;
use gpuslice_core::topology;

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

fn grant(gpu: &GpuLoad, take: Take) -> GpuGrant {
    GpuGrant {
        index: gpu.index,
        uuid: gpu.uuid.clone(),
        minor: gpu.minor,
        memory_bytes: take.memory_bytes,
        cores: take.cores,
        window: None,
    }
}

/// Chooses the GPUs for `req` among `gpus`, or says why none can be had.
pub fn place(
    req: &SliceRequest,
    gpus: &[GpuLoad],
    rules: Rules,
    default_policy: Policy,
) -> Result<Vec<GpuGrant>, PlacementError> {
    place_on(
        req,
        NodeLoads {
            gpus,
            rules,
            topology: None,
        },
        default_policy,
    )
}

/// [`place`] on `node`, whose topology (when known) decides which GPUs a request for several
/// gets: the closest set that fits, the policy choosing among sets equally close.
pub fn place_on(
    req: &SliceRequest,
    node: NodeLoads<'_>,
    default_policy: Policy,
) -> Result<Vec<GpuGrant>, PlacementError> {
    let gpus = node.gpus;
    let ask = Ask::of(req).map_err(|e| PlacementError {
        reason: RefusalReason::InvalidRequest,
        message: e.to_string(),
    })?;
    let mut fitting: Vec<(usize, Take)> = Vec::new();
    fit::fit_node(&ask, &node, |pos, take| fitting.push((pos, take)))
        .map_err(|m| explain(req, &ask, &node, m))?;
    if !req.devices.is_empty() {
        // Named GPUs are given as named.
        return Ok(fitting.iter().map(|&(p, t)| grant(&gpus[p], t)).collect());
    }
    let after = |&(p, t): &(usize, Take)| gpus[p].memory_free() - t.memory_bytes;
    match req.gpu_policy.unwrap_or(default_policy) {
        Policy::Binpack => fitting.sort_by_key(|c| {
            let g = &gpus[c.0];
            (after(c), g.cores_free() - c.1.cores, g.index)
        }),
        Policy::Spread => fitting.sort_by_key(|c| {
            let g = &gpus[c.0];
            (
                std::cmp::Reverse(after(c)),
                g.sharers,
                std::cmp::Reverse(g.cores_free()),
                g.index,
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
    let preferred: Vec<usize> = fitting.iter().map(|c| c.0).collect();
    let set = topology::closest_set(node.topology(), &preferred, req.gpus as usize);
    let mut chosen: Vec<GpuGrant> = fitting
        .iter()
        .filter(|c| set.contains(&c.0))
        .map(|&(p, t)| grant(&gpus[p], t))
        .collect();
    chosen.sort_by_key(|g| g.index);
    Ok(chosen)
}

/// The refusal of `req` on `node` for `misfit`, in the user's terms.
fn explain(
    req: &SliceRequest,
    ask: &Ask<'_>,
    node: &NodeLoads<'_>,
    misfit: NodeMisfit,
) -> PlacementError {
    let devices = || {
        let value = req
            .devices
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",");
        (req.key(annotations::DEVICES), value)
    };
    match misfit {
        NodeMisfit::NoSuchDevice { named } => {
            let (key, value) = devices();
            PlacementError::new(
                RefusalReason::NoSuchDevice,
                &key,
                &value,
                &format!(
                    "this node has no GPU {} (it has {} GPU(s))",
                    req.devices[named],
                    node.gpu_count()
                ),
            )
        }
        NodeMisfit::NamedTwice { pos } => {
            let (key, value) = devices();
            PlacementError::new(
                RefusalReason::InvalidRequest,
                &key,
                &value,
                &format!("names GPU {} twice", node.index(pos)),
            )
        }
        NodeMisfit::Named { pos, misfit } => {
            let (key, value) = devices();
            PlacementError::new(
                misfit.reason(),
                &key,
                &value,
                &format!(
                    "{}; {}",
                    misfit.describe(node.index(pos)),
                    describe_request(req)
                ),
            )
        }
        NodeMisfit::NamedModel { pos } => PlacementError::new(
            RefusalReason::NoSuchDevice,
            &req.key(annotations::GPU_MODEL),
            &req.written(annotations::GPU_MODEL, String::new),
            &format!(
                "GPU {} named by {} is a {}, a model this request does not accept",
                node.index(pos),
                req.key(annotations::DEVICES),
                node.model(pos)
            ),
        ),
        NodeMisfit::TooFew { fitting } => shortfall(req, ask, node, fitting),
    }
}

/// The refusal of a request that may use fewer GPUs of this node than it asks for, naming
/// the annotation that rules the others out; None when the selection leaves enough.
fn unselected(req: &SliceRequest, ask: &Ask<'_>, node: &NodeLoads<'_>) -> Option<PlacementError> {
    if !ask.selects() {
        return None;
    }
    let usable = (0..node.gpu_count())
        .filter(|&p| fit::eligible(ask, node, p))
        .count();
    if usable >= req.gpus as usize {
        return None;
    }
    let field = if ask.models.is_any() {
        annotations::DEVICES
    } else {
        annotations::GPU_MODEL
    };
    let mut models_here: Vec<&str> = node.gpus.iter().map(|g| g.model.as_str()).collect();
    models_here.sort_unstable();
    models_here.dedup();
    Some(PlacementError::new(
        RefusalReason::NoSuchDevice,
        &req.key(field),
        &req.written(field, String::new),
        &format!(
            "{} GPU(s) needed, this node has {usable} the request may use (its GPUs: {})",
            req.gpus,
            models_here.join(", ")
        ),
    ))
}

/// The annotation that best explains a misfit.
fn misfit_key(m: &Misfit) -> &'static str {
    match m {
        Misfit::Memory { .. } => annotations::MEMORY,
        Misfit::Cores { .. } => annotations::CORES,
        _ => annotations::GPUS,
    }
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

fn shortfall(
    req: &SliceRequest,
    ask: &Ask<'_>,
    node: &NodeLoads<'_>,
    fitting: u32,
) -> PlacementError {
    if let Some(e) = unselected(req, ask, node) {
        return e;
    }
    let rules = node.rules;
    let misfits: Vec<(u32, Misfit)> = node
        .gpus
        .iter()
        .enumerate()
        .filter(|&(p, _)| fit::eligible(ask, node, p))
        .filter_map(|(_, g)| {
            fit::fit_gpu(&ask.shape, &g.room(), &rules)
                .err()
                .map(|m| (g.index, m))
        })
        .collect();
    if misfits.is_empty() {
        // Every GPU fits: there are too few of them.
        return PlacementError::new(
            RefusalReason::NotEnoughGpus,
            &req.key(annotations::GPUS),
            &req.written(annotations::GPUS, || req.gpus.to_string()),
            &format!("this node has {} GPU(s)", node.gpus.len()),
        );
    }
    let first = &misfits[0].1;
    let field = misfit_key(first);
    let reason = if fitting > 0 {
        RefusalReason::NotEnoughGpus
    } else {
        first.reason()
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
    let details: Vec<String> = misfits.iter().map(|(i, m)| m.describe(*i)).collect();
    let why = format!(
        "{} GPU(s) needed, {fitting} can take it ({}): {}",
        req.gpus,
        describe_request(req),
        details.join("; ")
    );
    PlacementError::new(reason, &req.key(field), &value, &why)
}

/// The GPUs a verified scheduler assignment gives `req` on this node, if they still fit here
/// and give what the request asks. `shown` is how the annotation is quoted in messages.
pub fn place_assigned(
    req: &SliceRequest,
    gpus: &[GpuLoad],
    rules: Rules,
    assigned: &[AssignedGpu],
    shown: &str,
) -> Result<Vec<GpuGrant>, PlacementError> {
    let key = req.key(annotations::ASSIGNMENT);
    let refuse = |reason, why: String| PlacementError::new(reason, &key, shown, &why);
    let ask = Ask::of(req).map_err(|e| PlacementError {
        reason: RefusalReason::InvalidRequest,
        message: e.to_string(),
    })?;
    let node = NodeLoads {
        gpus,
        rules,
        topology: None,
    };
    let mut chosen = Vec::with_capacity(assigned.len());
    for a in assigned {
        let pos = gpus
            .iter()
            .position(|g| g.uuid.eq_ignore_ascii_case(&a.uuid))
            .ok_or_else(|| {
                refuse(
                    RefusalReason::NoSuchDevice,
                    format!("assigns GPU {}, which this node does not have", a.uuid),
                )
            })?;
        chosen.push(pos);
    }
    let takes = fit::fit_chosen(&ask, &node, &chosen).map_err(|m| match m {
        ChosenMisfit::Count { chosen } => refuse(
            RefusalReason::InvalidRequest,
            format!("assigns {chosen} GPU(s), the request asks for {}", req.gpus),
        ),
        ChosenMisfit::Twice { pos } => refuse(
            RefusalReason::InvalidRequest,
            format!("assigns GPU {} twice", gpus[pos].uuid),
        ),
        ChosenMisfit::NotNamed { pos } => refuse(
            RefusalReason::Conflict,
            format!(
                "assigns GPU {} ({}), which the request may not use ({} or {})",
                gpus[pos].uuid,
                gpus[pos].model,
                req.key(annotations::DEVICES),
                req.key(annotations::GPU_MODEL)
            ),
        ),
        ChosenMisfit::Misfit { pos, misfit } => refuse(
            misfit.reason(),
            format!(
                "the assigned GPU no longer fits: {}",
                misfit.describe(gpus[pos].index)
            ),
        ),
    })?;
    let mut grants = Vec::with_capacity(takes.len());
    for ((a, &pos), take) in assigned.iter().zip(&chosen).zip(takes) {
        if take.memory_bytes != a.memory_bytes || take.cores != a.cores {
            return Err(refuse(
                RefusalReason::Conflict,
                format!(
                    "assigns {} bytes and {}% on GPU {}, the request asks for {} bytes and {}%",
                    a.memory_bytes, a.cores, a.uuid, take.memory_bytes, take.cores
                ),
            ));
        }
        grants.push(grant(&gpus[pos], take));
    }
    grants.sort_by_key(|g| g.index);
    Ok(grants)
}

#[cfg(test)]
mod tests;
