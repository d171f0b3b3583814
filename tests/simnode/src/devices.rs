//! Which GPUs a process can use, as the real driver decides: those whose device node
//! (`/dev/nvidiaN`) it can open. A node that is missing (not mounted into the container) or
//! whose open is refused (EPERM from the device cgroup, EACCES) hides its GPU; ENXIO is what a
//! simulated node answers when it may be opened (it has no kernel driver behind it).
//!
//! The nodes are looked for in `$GPUSLICE_SIM_DEV_DIR`, else `/dev`. A host with no GPU
//! device node at all and no such variable is a bare simulated node (the fake libraries
//! loaded directly on a build machine): every GPU is shown there.

use std::path::{Path, PathBuf};

use crate::NodeSpec;

pub const DEV_DIR_ENV: &str = "GPUSLICE_SIM_DEV_DIR";

/// Node indexes of the GPUs this process can open, in the node's order.
#[must_use]
pub fn accessible(spec: &NodeSpec) -> Vec<usize> {
    let explicit = std::env::var_os(DEV_DIR_ENV).map(PathBuf::from);
    let dir = explicit.clone().unwrap_or_else(|| PathBuf::from("/dev"));
    let all: Vec<usize> = (0..spec.gpus.len()).collect();
    if explicit.is_none() && !any_gpu_node(&dir) {
        return all;
    }
    all.into_iter()
        .filter(|&i| openable(&dir.join(format!("nvidia{}", spec.gpus[i].minor))))
        .collect()
}

fn any_gpu_node(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.filter_map(Result::ok).any(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("nvidia"))
                .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()))
        })
    })
}

fn openable(node: &Path) -> bool {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(node)
    {
        Ok(_) => true,
        Err(e) => e.raw_os_error() == Some(libc::ENXIO),
    }
}
