//! Thread block clusters' occupancy (compute capability 9.0 on): how many clusters of a
//! launch can be resident at once (`cuOccupancyMaxActiveClusters`, which cuBLAS asks on
//! Hopper while it makes its handle) and the largest cluster a kernel can be launched with
//! (`cuOccupancyMaxPotentialClusterSize`).
//!
//! A cluster's blocks are resident together on the SMs of one GPC. NVIDIA does not publish
//! each board's GPC layout: the simulation takes GH100's full GPC of 18 SMs and spreads a
//! board's SMs as evenly as it can over the fewest GPCs that hold them (the H100 SXM's 132
//! SMs: four GPCs of 17 and four of 16). A device without clusters answers
//! `CUDA_ERROR_NOT_SUPPORTED` (the simulation's choice: the driver's answer there is not
//! documented). A launch with a cluster (`cuLaunchKernelEx`) is checked as the driver checks
//! it ([`check_launch`]).

use std::ffi::{c_int, c_uint};

use gpuslice_cuda_abi::cuda::{CUlaunchAttributeValue, CUlaunchConfig};

use crate::codes::{
    CUDA_ERROR_INVALID_CLUSTER_SIZE, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_NOT_SUPPORTED,
};
use crate::module::{
    FUNC_CLUSTER_SHAPE, FUNC_NON_PORTABLE_CLUSTER, blocks_per_sm, function_attribute,
};
use crate::paths::CUfunction;
use crate::{CUresult, guard, out};

/// `CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`.
const CLUSTER_DIMENSION: c_int = 4;
/// The largest cluster every GPU with clusters runs, and the largest a kernel allowing
/// non-portable sizes may ask for on compute capability 9.0.
const PORTABLE_CLUSTER: c_int = 8;
const NON_PORTABLE_CLUSTER: c_int = 16;
/// SMs of one full GH100 GPC.
const SMS_PER_FULL_GPC: u32 = 18;

/// `CUlaunchAttribute`: an id, then the value at offset 8.
#[repr(C)]
struct LaunchAttribute {
    id: c_int,
    _pad: [u8; 4],
    value: CUlaunchAttributeValue,
}

/// A kernel's own cluster settings: the shape it requires, if it has one, and the largest
/// cluster it may run in (8 blocks, 16 where it allows non-portable sizes).
struct KernelClusters {
    required: Option<[c_uint; 3]>,
    largest: c_int,
}

impl KernelClusters {
    fn of(f: CUfunction) -> Result<Self, CUresult> {
        let mut shape = [0; 3];
        for (d, a) in shape.iter_mut().zip(FUNC_CLUSTER_SHAPE) {
            *d = function_attribute(f, a)?;
        }
        // A width of 0 is no required shape; an unset height or depth is 1.
        let required =
            (shape[0] > 0).then(|| shape.map(|d| c_uint::try_from(d.max(1)).unwrap_or(1)));
        let largest = if function_attribute(f, FUNC_NON_PORTABLE_CLUSTER)? != 0 {
            NON_PORTABLE_CLUSTER
        } else {
            PORTABLE_CLUSTER
        };
        Ok(Self { required, largest })
    }

    /// Blocks in the required cluster, if there is one.
    fn required_size(&self) -> Option<c_int> {
        self.required.and_then(|r| size_of(r).ok())
    }
}

/// What a launch configuration and its kernel give the occupancy of clusters.
struct Launch<'a> {
    config: &'a CUlaunchConfig,
    blocks_per_sm: c_int,
    kernel: KernelClusters,
    gpcs: Vec<u32>,
}

fn launch<'a>(f: CUfunction, config: *const CUlaunchConfig) -> Result<Launch<'a>, CUresult> {
    if f.is_null() {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    if config.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null; the caller's launch configuration.
    let c = unsafe { &*config };
    let gpu = crate::context::current_gpu()?;
    if gpu.compute_capability.0 < 9 {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    let threads = u64::from(c.block_dim_x) * u64::from(c.block_dim_y) * u64::from(c.block_dim_z);
    let threads = c_int::try_from(threads).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    let n = gpu.sm_count.div_ceil(SMS_PER_FULL_GPC).max(1);
    let gpcs = (0..n)
        .map(|i| gpu.sm_count / n + u32::from(i < gpu.sm_count % n))
        .collect();
    Ok(Launch {
        config: c,
        blocks_per_sm: blocks_per_sm(f, threads, c.shared_mem_bytes as usize)?,
        kernel: KernelClusters::of(f)?,
        gpcs,
    })
}

/// The configuration's `CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`, if set (the last one given).
fn configured_dims(c: &CUlaunchConfig) -> Result<Option<[c_uint; 3]>, CUresult> {
    if c.num_attrs == 0 {
        return Ok(None);
    }
    if c.attrs.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's array of `num_attrs` launch attributes (non-null).
    let attrs = unsafe {
        std::slice::from_raw_parts(c.attrs.cast::<LaunchAttribute>(), c.num_attrs as usize)
    };
    let Some(a) = attrs.iter().rev().find(|a| a.id == CLUSTER_DIMENSION) else {
        return Ok(None);
    };
    let dim = |i: usize| {
        let b = &a.value.bytes[i * 4..i * 4 + 4];
        c_uint::from_ne_bytes([b[0], b[1], b[2], b[3]])
    };
    Ok(Some([dim(0), dim(1), dim(2)]))
}

/// Blocks in a cluster of `dims`; an empty dimension is a misconfigured cluster.
fn size_of(dims: [c_uint; 3]) -> Result<c_int, CUresult> {
    let size: u64 = dims.iter().map(|d| u64::from(*d)).product();
    c_int::try_from(size)
        .ok()
        .filter(|s| *s > 0)
        .ok_or(CUDA_ERROR_INVALID_CLUSTER_SIZE)
}

/// The cluster size of the configuration's `CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`, if set.
fn configured_cluster(c: &CUlaunchConfig) -> Result<Option<c_int>, CUresult> {
    configured_dims(c)?.map(size_of).transpose()
}

/// Checks the thread block clusters of `f`'s launch by `config` as the driver does before it
/// runs it: none on a device without clusters (`CUDA_ERROR_NOT_SUPPORTED`, the simulation's
/// choice); the configuration's cluster the kernel's required shape if it has one, no larger
/// than 8 blocks (16 where the kernel allows non-portable sizes), and each grid dimension a
/// multiple of the cluster's (`CUDA_ERROR_INVALID_CLUSTER_SIZE` otherwise, "cluster
/// misconfiguration").
pub(crate) fn check_launch(f: CUfunction, c: &CUlaunchConfig) -> Result<(), CUresult> {
    let Some(dims) = configured_dims(c)? else {
        return Ok(());
    };
    let size = size_of(dims)?;
    if f.is_null() {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let gpu = crate::context::current_gpu()?;
    if gpu.compute_capability.0 < 9 {
        return if size == 1 {
            Ok(())
        } else {
            Err(CUDA_ERROR_NOT_SUPPORTED)
        };
    }
    let kernel = KernelClusters::of(f)?;
    let grid = [c.grid_dim_x, c.grid_dim_y, c.grid_dim_z];
    let misconfigured = size > kernel.largest
        || kernel.required.is_some_and(|r| r != dims)
        || grid.iter().zip(dims).any(|(g, d)| g % d != 0);
    if misconfigured {
        return Err(CUDA_ERROR_INVALID_CLUSTER_SIZE);
    }
    Ok(())
}

impl Launch<'_> {
    /// Blocks that fit at once on the GPC of `sms` SMs.
    fn blocks_on(&self, sms: u32) -> c_int {
        c_int::try_from(sms)
            .unwrap_or(c_int::MAX)
            .saturating_mul(self.blocks_per_sm)
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxActiveClusters(
    clusters: *mut c_int,
    f: CUfunction,
    config: *const CUlaunchConfig,
) -> CUresult {
    guard(|| {
        let l = launch(f, config)?;
        // The configuration's cluster, which must be the kernel's own if it has one.
        let size = match (configured_cluster(l.config)?, l.kernel.required_size()) {
            (Some(c), Some(r)) if c != r => return Err(CUDA_ERROR_INVALID_CLUSTER_SIZE),
            (c, r) => c.or(r).ok_or(CUDA_ERROR_INVALID_CLUSTER_SIZE)?,
        };
        if size > l.kernel.largest {
            return Err(CUDA_ERROR_INVALID_CLUSTER_SIZE);
        }
        let n = l.gpcs.iter().map(|sms| l.blocks_on(*sms) / size).sum();
        out(clusters, n)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxPotentialClusterSize(
    size: *mut c_int,
    f: CUfunction,
    config: *const CUlaunchConfig,
) -> CUresult {
    guard(|| {
        // The configuration's cluster dimensions are not read, as documented.
        let l = launch(f, config)?;
        if let Some(r) = l.kernel.required_size() {
            return out(size, r);
        }
        let smallest = l.gpcs.iter().copied().min().unwrap_or(0);
        out(size, l.kernel.largest.min(l.blocks_on(smallest)))
    })
}
