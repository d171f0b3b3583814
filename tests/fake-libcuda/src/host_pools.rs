//! Pools of host memory by location: which host locations the node has, the default pool of
//! each (`cuMemGetDefaultMemPool` of a host location, CUDA 13) and the pool made current there
//! (`cuMemSetMemPool`). A host pool gives out page-locked host memory ([`crate::host`]).

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use gpuslice_cuda_abi::cuda::{
    CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_HOST, CU_MEM_LOCATION_TYPE_HOST_NUMA,
    CUmemLocation,
};

use crate::CUresult;
use crate::codes::*;
use crate::paths::{HostPlace, Pool};
use crate::state::Driver;

/// Each host location's default pool, made when first asked for, never destroyed.
static DEFAULTS: LazyLock<Mutex<HashMap<HostPlace, usize>>> = LazyLock::new(Mutex::default);
/// Each host location's current pool, where one was set.
static CURRENT: LazyLock<Mutex<HashMap<HostPlace, usize>>> = LazyLock::new(Mutex::default);

/// The host memory location `l` names, where the node has it: a NUMA node of the host
/// (CUDA 12.2; the nodes the GPUs are on, at least node 0), or the host, no node named (13.0).
/// None for a device location; `CUDA_ERROR_INVALID_VALUE` for any other, as cuda.h describes
/// them (`HOST_NUMA_CURRENT` names no pool's place).
pub(crate) fn place_of(d: &Driver, l: CUmemLocation) -> Result<Option<HostPlace>, CUresult> {
    let host_nodes = d
        .spec
        .gpus
        .iter()
        .filter_map(|g| g.numa_node)
        .max()
        .unwrap_or(0);
    match l.typ {
        CU_MEM_LOCATION_TYPE_DEVICE => Ok(None),
        CU_MEM_LOCATION_TYPE_HOST_NUMA if u32::try_from(l.id).is_ok_and(|n| n <= host_nodes) => {
            Ok(Some(HostPlace {
                typ: l.typ,
                id: l.id,
            }))
        }
        CU_MEM_LOCATION_TYPE_HOST if d.spec.cuda_driver_version >= 13000 => {
            Ok(Some(HostPlace { typ: l.typ, id: 0 }))
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

fn lock(
    m: &'static LazyLock<Mutex<HashMap<HostPlace, usize>>>,
) -> Result<std::sync::MutexGuard<'static, HashMap<HostPlace, usize>>, CUresult> {
    m.lock().map_err(|_| CUDA_ERROR_UNKNOWN)
}

/// The default pool of `place`.
pub(crate) fn default_pool(place: HostPlace) -> Result<usize, CUresult> {
    Ok(*lock(&DEFAULTS)?
        .entry(place)
        .or_insert_with(|| Pool::new_host(place)))
}

/// The current pool of `place`: the one set, else its default.
pub(crate) fn current_pool(place: HostPlace) -> Result<usize, CUresult> {
    match lock(&CURRENT)?.get(&place) {
        Some(p) => Ok(*p),
        None => default_pool(place),
    }
}

/// Makes `pool` (a host pool of `place`) current there.
pub(crate) fn set_current(place: HostPlace, pool: usize) -> Result<(), CUresult> {
    lock(&CURRENT)?.insert(place, pool);
    Ok(())
}

/// Whether `pool` is a host location's default pool (which cannot be destroyed).
pub(crate) fn is_default(pool: usize) -> Result<bool, CUresult> {
    Ok(lock(&DEFAULTS)?.values().any(|p| *p == pool))
}

/// `pool` was destroyed: where it was current, the location's default is again.
pub(crate) fn destroyed(pool: usize) -> Result<(), CUresult> {
    lock(&CURRENT)?.retain(|_, p| *p != pool);
    Ok(())
}
