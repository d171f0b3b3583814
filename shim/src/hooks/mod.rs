//! What the intercepted functions do. Each hook calls the driver's own function; allocation
//! hooks charge the slice first and give the charge back if the driver fails, so that a
//! concurrent allocation never sees room that is not there.

pub mod alloc;
pub mod capture;
pub mod context;
pub(crate) mod gate;
pub mod graph;
pub mod graph_bodies;
pub mod graph_edits;
pub mod graph_exec_params;
pub mod graph_running;
pub mod info;
pub mod launch;
pub mod limits;
pub mod memset;
pub mod module;
pub mod pool_reserve;
pub mod pools;
pub mod proc_address;
pub mod refused;
pub mod stack;
pub(crate) mod streams;
pub mod vmm;

use crate::ffi::*;
use crate::log::log;
use crate::slice::{Kind, Slice};

/// The driver's function, or `CUDA_ERROR_NOT_FOUND` from the hook where it has none.
macro_rules! real_or_return {
    ($name:ident) => {
        match crate::api::real::$name() {
            Some(f) => f,
            None => return crate::ffi::CUDA_ERROR_NOT_FOUND,
        }
    };
}
pub(crate) use real_or_return;

/// Charges `bytes` on device `dev`, makes the driver call, and keeps the charge under the key
/// the call produced if it succeeded.
pub fn charged(
    s: &Slice,
    kind: Kind,
    dev: CUdevice,
    bytes: u64,
    call: impl FnOnce() -> CUresult,
    key: impl FnOnce() -> u64,
) -> CUresult {
    charged_in(s, kind, dev, bytes, 0, call, key)
}

/// As [`charged`], for what the driver frees with context `ctx` (0: none) if it is not freed
/// first.
pub fn charged_in(
    s: &Slice,
    kind: Kind,
    dev: CUdevice,
    bytes: u64,
    ctx: usize,
    call: impl FnOnce() -> CUresult,
    key: impl FnOnce() -> u64,
) -> CUresult {
    let Some(gpu) = s.position(dev) else {
        log!("device {dev} is not part of this container's slice");
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    if !s.charge(gpu, bytes) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let r = call();
    if r == CUDA_SUCCESS {
        s.record_in(kind, key(), gpu, bytes, ctx);
    } else {
        s.refund(gpu, bytes);
    }
    r
}

/// Makes a driver call that frees what `key` holds, and gives its charge back if it succeeded.
/// The charge leaves the books before the call, so that an allocation reusing the address
/// right after the free cannot have its own charge removed instead.
pub fn uncharged(s: &Slice, kind: Kind, key: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    let charge = s.take(kind, key);
    let r = call();
    match charge {
        Some(c) if r == CUDA_SUCCESS => s.settle(c),
        Some(c) => s.put_back(kind, key, c),
        None => {}
    }
    r
}
