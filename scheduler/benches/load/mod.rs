//! The node state the benches load: 8 A10 GPUs per node, each with 0, 6, 12, 18 or 24 GiB of
//! its 24 taken (half on average), the SM share and the sharers in proportion.

use gpuslice_core::publication::{NodePublication, PublishedGpu};

pub const GPUS: usize = 8;
pub const GIB: u64 = 1 << 30;

/// A node's publication: GPU `g` is `uuid(g)` with `sixths(g)` (0 to 4) times 6 GiB taken;
/// `indexed`: the agent publishes NVML indexes.
pub fn publication(
    uuid: impl Fn(usize) -> String,
    sixths: impl FnMut(usize) -> u64,
    indexed: bool,
) -> NodePublication {
    let mut sixths = sixths;
    let gpus = (0..GPUS)
        .map(|g| {
            let used = 6 * sixths(g).min(4);
            PublishedGpu {
                index: indexed.then(|| u32::try_from(g).unwrap_or(u32::MAX)),
                uuid: uuid(g),
                model: "NVIDIA A10".into(),
                memory_total: 24 * GIB,
                memory_allocated: used * GIB,
                cores_allocated: u32::try_from(used * 4).unwrap_or(100),
                sharers: u32::try_from(used / 6).unwrap_or(0),
                exclusive: false,
            }
        })
        .collect();
    NodePublication {
        topology: None,
        max_sharers: 16,
        version: 1,
        gpus,
        claimed: Vec::new(),
    }
}
