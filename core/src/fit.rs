//! The one fit model: whether a request fits a GPU, and whether it fits a node. The node
//! agent admits claims with it, the cluster scheduler's filter, prioritize and bind place with
//! it, and the trace simulator replays with it, so that the scheduler never binds what the
//! agent would refuse. Everything it reads of a node (each GPU's room, its identity, the
//! node's rules) is what the agent publishes on its Node.
//!
//! Choosing among the GPUs that fit (binpack, spread, frag-aware) is not the fit model's:
//! the agent and the scheduler each rank the candidates it yields.

use serde::{Deserialize, Serialize};

use crate::annotations::{AnnotationError, CORES, DeviceSelector, MEMORY, SliceRequest};
use crate::quantity::{MemoryQuantity, format_bytes};
use crate::selection::ModelSelector;
use crate::topology::Topology;

/// What is free on one GPU: all the fit model needs to know of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GpuRoom {
    pub memory_total: u64,
    pub memory_free: u64,
    /// Percent of the SMs not reserved by slices.
    pub cores_free: u32,
    /// Slices on this GPU.
    pub sharers: u32,
    /// Held whole by one container.
    pub exclusive: bool,
}

impl GpuRoom {
    /// An unused GPU with `memory_total` bytes.
    #[must_use]
    pub fn idle(memory_total: u64) -> Self {
        Self {
            memory_total,
            memory_free: memory_total,
            cores_free: 100,
            sharers: 0,
            exclusive: false,
        }
    }

    /// Free capacity as a share of the GPU (0..=1): the scarcer of memory and SMs.
    #[must_use]
    pub fn free_share(&self) -> f64 {
        if self.exclusive || self.memory_total == 0 {
            return 0.0;
        }
        let mem = self.memory_free as f64 / self.memory_total as f64;
        mem.min(f64::from(self.cores_free) / 100.0)
    }

    /// Nobody holds any of it.
    #[must_use]
    pub fn untouched(&self) -> bool {
        self.sharers == 0 && !self.exclusive
    }

    /// Gives `take` of this GPU to one more slice (whole, when `exclusive`).
    pub fn take(&mut self, take: Take, exclusive: bool) {
        self.memory_free = self.memory_free.saturating_sub(take.memory_bytes);
        self.cores_free = self.cores_free.saturating_sub(take.cores);
        self.sharers += 1;
        self.exclusive = exclusive;
    }
}

/// What a request asks of each GPU it gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Whole GPUs, shared with nobody.
    pub exclusive: bool,
    /// Memory per GPU (unused for whole GPUs).
    pub memory: MemoryQuantity,
    /// Percent of the SMs per GPU; 0 for no reserved share.
    pub cores: u32,
}

impl Shape {
    /// The shape of `req`; a shared slice must name its memory.
    pub fn of(req: &SliceRequest) -> Result<Self, AnnotationError> {
        if req.is_exclusive() {
            return Ok(Self::whole());
        }
        let memory = req.memory.ok_or_else(|| {
            // Only cores can make a shared slice without memory: name what was written.
            let cores = req.written(CORES, || req.cores.map_or_else(String::new, |c| c.to_string()));
            AnnotationError::new(
                &req.key(CORES),
                &cores,
                format!(
                    "a share of the SMs needs a memory limit too ({}), or leave out {} for whole GPUs",
                    req.key(MEMORY),
                    req.key(CORES)
                ),
            )
        })?;
        Ok(Self {
            exclusive: false,
            memory,
            cores: req.cores.unwrap_or(0),
        })
    }

    /// A whole GPU.
    #[must_use]
    pub fn whole() -> Self {
        Self {
            exclusive: true,
            memory: MemoryQuantity::Bytes(0),
            cores: 0,
        }
    }

    /// What this shape takes on a GPU with `memory_total` bytes.
    #[must_use]
    pub fn take_on(&self, memory_total: u64) -> Take {
        if self.exclusive {
            Take {
                memory_bytes: memory_total,
                cores: 100,
            }
        } else {
            Take {
                memory_bytes: self.memory.bytes_of(memory_total),
                cores: self.cores,
            }
        }
    }
}

/// What a slice takes of one GPU: its memory wall and its SM share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Take {
    pub memory_bytes: u64,
    pub cores: u32,
}

/// Limits a node sets on every GPU beyond memory and cores. The agent enforces them and
/// publishes them with the node, so that the scheduler applies the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Rules {
    /// Most slices on one GPU.
    pub max_sharers: u32,
}

impl Default for Rules {
    fn default() -> Self {
        Self {
            max_sharers: DEFAULT_MAX_SHARERS,
        }
    }
}

/// The sharer limit of a node that does not say otherwise.
pub const DEFAULT_MAX_SHARERS: u32 = 16;

/// Why one GPU cannot take a slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Misfit {
    /// Held whole by another container.
    Exclusive,
    /// A whole GPU was asked and this many slices are on it.
    InUse(u32),
    /// It has the most slices the node allows.
    MaxSharers(u32),
    Memory {
        want: u64,
        free: u64,
        total: u64,
    },
    Cores {
        want: u32,
        free: u32,
    },
}

impl Misfit {
    #[must_use]
    pub fn reason(&self) -> RefusalReason {
        match self {
            Self::Exclusive | Self::InUse(_) => RefusalReason::GpuInUse,
            Self::MaxSharers(_) => RefusalReason::MaxSharers,
            Self::Memory { .. } => RefusalReason::InsufficientMemory,
            Self::Cores { .. } => RefusalReason::InsufficientCores,
        }
    }

    /// The misfit on GPU `index`, in words.
    #[must_use]
    pub fn describe(&self, index: u32) -> String {
        let i = index;
        match self {
            Self::Exclusive => format!("GPU {i} is held whole by another container"),
            Self::InUse(n) => {
                format!("GPU {i} is shared by {n} container(s), a whole GPU needs none")
            }
            Self::MaxSharers(n) => format!("GPU {i} already has {n} slices, the most allowed"),
            Self::Memory { want, total, .. } if want > total => format!(
                "GPU {i} has only {} in all, {} asked",
                format_bytes(*total),
                format_bytes(*want)
            ),
            Self::Memory { want, free, .. } => format!(
                "GPU {i} has {} free, {} asked",
                format_bytes(*free),
                format_bytes(*want)
            ),
            Self::Cores { want, free } => {
                format!("GPU {i} has {free}% of its SMs free, {want}% asked")
            }
        }
    }

    /// Whether the GPU could take the slice if it were empty: false when the slice is larger
    /// than the whole GPU.
    #[must_use]
    pub fn is_lasting(&self) -> bool {
        matches!(self, Self::Memory { want, total, .. } if want > total || *want == 0)
    }
}

/// Whether `shape` fits `gpu` under `rules`, and what it takes there.
pub fn fit_gpu(shape: &Shape, gpu: &GpuRoom, rules: &Rules) -> Result<Take, Misfit> {
    if gpu.exclusive {
        return Err(Misfit::Exclusive);
    }
    if shape.exclusive {
        if gpu.sharers > 0 {
            return Err(Misfit::InUse(gpu.sharers));
        }
        return Ok(shape.take_on(gpu.memory_total));
    }
    if gpu.sharers >= rules.max_sharers {
        return Err(Misfit::MaxSharers(gpu.sharers));
    }
    let take = shape.take_on(gpu.memory_total);
    if take.memory_bytes > gpu.memory_free || take.memory_bytes == 0 {
        return Err(Misfit::Memory {
            want: take.memory_bytes,
            free: gpu.memory_free,
            total: gpu.memory_total,
        });
    }
    if take.cores > gpu.cores_free {
        return Err(Misfit::Cores {
            want: take.cores,
            free: gpu.cores_free,
        });
    }
    Ok(take)
}

/// A request as the fit model reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask<'a> {
    pub shape: Shape,
    /// GPUs wanted.
    pub gpus: u32,
    /// The GPUs the request names (it then gets exactly these); empty for any.
    pub devices: &'a [DeviceSelector],
    /// The GPUs it avoids.
    pub avoid: &'a [DeviceSelector],
    /// The GPU models it accepts.
    pub models: &'a ModelSelector,
}

/// Accepts every model.
pub static ANY_MODEL: ModelSelector = ModelSelector {
    accept: Vec::new(),
    avoid: Vec::new(),
};

impl<'a> Ask<'a> {
    /// The fit model's reading of `req`.
    pub fn of(req: &'a SliceRequest) -> Result<Self, AnnotationError> {
        Ok(Self {
            shape: Shape::of(req)?,
            gpus: req.gpus,
            devices: &req.devices,
            avoid: &req.avoid_devices,
            models: &req.models,
        })
    }

    /// Whether the request may use some GPUs and not others (named, avoided, by model).
    #[must_use]
    pub fn selects(&self) -> bool {
        !self.devices.is_empty() || !self.avoid.is_empty() || !self.models.is_any()
    }
}

/// A node's GPUs as the fit model reads them: each GPU's room and identity, and the node's
/// rules. The agent reads its ledger this way, the scheduler a Node's publication.
pub trait NodeView {
    /// GPUs on the node.
    fn gpu_count(&self) -> usize;
    /// What is free on the GPU at `pos` (0..gpu_count).
    fn room(&self, pos: usize) -> GpuRoom;
    /// The GPU's index on the node (NVML order).
    fn index(&self, pos: usize) -> u32;
    fn uuid(&self, pos: usize) -> &str;
    /// The GPU's model name as NVML reports it (`NVIDIA A100-SXM4-80GB`); empty if unknown.
    fn model(&self, pos: usize) -> &str;
    fn rules(&self) -> Rules;
    /// How the GPUs are connected, when known (positions as in `room`).
    fn topology(&self) -> Option<&Topology> {
        None
    }
}

/// Whether `sel` names the GPU at `pos` of `node`.
fn names<N: NodeView + ?Sized>(sel: &DeviceSelector, node: &N, pos: usize) -> bool {
    match sel {
        DeviceSelector::Index(i) => node.index(pos) == *i,
        DeviceSelector::Uuid(u) => node.uuid(pos).eq_ignore_ascii_case(u),
    }
}

/// Where on `node` the GPU `sel` names is, if it has it.
pub fn find_named<N: NodeView + ?Sized>(node: &N, sel: &DeviceSelector) -> Option<usize> {
    (0..node.gpu_count()).find(|&p| names(sel, node, p))
}

/// Whether the request may use the GPU at `pos`: only the GPUs it names when it names some,
/// none it avoids, and only of the models it accepts.
pub fn eligible<N: NodeView + ?Sized>(ask: &Ask<'_>, node: &N, pos: usize) -> bool {
    (ask.devices.is_empty() || ask.devices.iter().any(|s| names(s, node, pos)))
        && !ask.avoid.iter().any(|s| names(s, node, pos))
        && (ask.models.is_any() || ask.models.accepts(node.model(pos)))
}

/// Why a node cannot take a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeMisfit {
    /// The node has no GPU that `devices[named]` names.
    NoSuchDevice { named: usize },
    /// The GPU at `pos` is named twice.
    NamedTwice { pos: usize },
    /// A GPU the request names cannot take the slice.
    Named { pos: usize, misfit: Misfit },
    /// A GPU the request names is of a model it does not accept.
    NamedModel { pos: usize },
    /// Fewer GPUs than asked can take the slice (`fitting` of them can).
    TooFew { fitting: u32 },
}

impl NodeMisfit {
    /// Whether the node could never take the request, even with every GPU free.
    #[must_use]
    pub fn is_lasting<N: NodeView + ?Sized>(&self, ask: &Ask<'_>, node: &N) -> bool {
        match self {
            Self::NoSuchDevice { .. } | Self::NamedTwice { .. } | Self::NamedModel { .. } => true,
            Self::Named { misfit, .. } => misfit.is_lasting(),
            Self::TooFew { .. } => {
                let idle = (0..node.gpu_count())
                    .filter(|&p| {
                        eligible(ask, node, p)
                            && fit_gpu(
                                &ask.shape,
                                &GpuRoom::idle(node.room(p).memory_total),
                                &node.rules(),
                            )
                            .is_ok()
                    })
                    .count();
                idle < ask.gpus as usize
            }
        }
    }
}

/// Whether `ask` fits `node`: calls `each(pos, take)` for every GPU that can take the slice
/// (with named devices, for each named GPU in the order named), or says why the node cannot
/// take it. When it returns `Ok`, at least `ask.gpus` GPUs were passed to `each`.
pub fn fit_node<N: NodeView + ?Sized>(
    ask: &Ask<'_>,
    node: &N,
    mut each: impl FnMut(usize, Take),
) -> Result<(), NodeMisfit> {
    let rules = node.rules();
    if !ask.devices.is_empty() {
        // Named GPUs are rare and few (at most one per GPU of a container).
        let mut named: Vec<usize> = Vec::with_capacity(ask.devices.len());
        for (k, sel) in ask.devices.iter().enumerate() {
            let pos = find_named(node, sel).ok_or(NodeMisfit::NoSuchDevice { named: k })?;
            if named.contains(&pos) {
                return Err(NodeMisfit::NamedTwice { pos });
            }
            if !eligible(ask, node, pos) {
                return Err(NodeMisfit::NamedModel { pos });
            }
            fit_gpu(&ask.shape, &node.room(pos), &rules)
                .map_err(|misfit| NodeMisfit::Named { pos, misfit })?;
            named.push(pos);
        }
        if (named.len() as u32) < ask.gpus {
            return Err(NodeMisfit::TooFew {
                fitting: named.len() as u32,
            });
        }
        for pos in named {
            each(pos, ask.shape.take_on(node.room(pos).memory_total));
        }
        return Ok(());
    }
    let selects = ask.selects();
    let mut fitting = 0u32;
    for pos in 0..node.gpu_count() {
        if selects && !eligible(ask, node, pos) {
            continue;
        }
        if let Ok(take) = fit_gpu(&ask.shape, &node.room(pos), &rules) {
            fitting += 1;
            each(pos, take);
        }
    }
    if fitting < ask.gpus {
        return Err(NodeMisfit::TooFew { fitting });
    }
    Ok(())
}

/// Whether `ask` fits `node`, as [`fit_node`] decides, without saying where: it stops at the
/// first `ask.gpus` GPUs that can take the slice.
pub fn fits_node<N: NodeView + ?Sized>(ask: &Ask<'_>, node: &N) -> bool {
    if ask.selects() {
        return fit_node(ask, node, |_, _| ()).is_ok();
    }
    let rules = node.rules();
    let mut fitting = 0u32;
    for pos in 0..node.gpu_count() {
        if fitting >= ask.gpus {
            break;
        }
        if fit_gpu(&ask.shape, &node.room(pos), &rules).is_ok() {
            fitting += 1;
        }
    }
    fitting >= ask.gpus
}

/// Whether the GPUs at `chosen` may be given to `ask` on `node` together: each is eligible
/// (named, when the request names GPUs), none twice, each fits, and they are as many as asked.
/// This is how an assignment made elsewhere (the scheduler's) is checked against the node.
pub fn fit_chosen<N: NodeView + ?Sized>(
    ask: &Ask<'_>,
    node: &N,
    chosen: &[usize],
) -> Result<Vec<Take>, ChosenMisfit> {
    if chosen.len() != ask.gpus as usize {
        return Err(ChosenMisfit::Count {
            chosen: chosen.len(),
        });
    }
    let rules = node.rules();
    let mut takes = Vec::with_capacity(chosen.len());
    for (k, &pos) in chosen.iter().enumerate() {
        if chosen[..k].contains(&pos) {
            return Err(ChosenMisfit::Twice { pos });
        }
        if !eligible(ask, node, pos) {
            return Err(ChosenMisfit::NotNamed { pos });
        }
        takes.push(
            fit_gpu(&ask.shape, &node.room(pos), &rules)
                .map_err(|misfit| ChosenMisfit::Misfit { pos, misfit })?,
        );
    }
    Ok(takes)
}

/// Why GPUs chosen elsewhere cannot be given to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChosenMisfit {
    /// As many GPUs as asked must be chosen.
    Count {
        chosen: usize,
    },
    Twice {
        pos: usize,
    },
    /// The request may not use this GPU (not one it names, one it avoids, or of a model it
    /// does not accept).
    NotNamed {
        pos: usize,
    },
    Misfit {
        pos: usize,
        misfit: Misfit,
    },
}

/// Why a request was refused; the label of the agent's refusal metric.
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

#[cfg(test)]
mod tests;
