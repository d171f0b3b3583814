//! Peer access between the node's GPUs, as the driver gives it where every GPU of a node can
//! reach every other (GPUs on one NVLink fabric or PCIe switch): any two different devices can
//! access each other (`cuDeviceCanAccessPeer`, `cuDeviceGetP2PAttribute`), and a context maps
//! a peer context's memory once it enables access to it (`cuCtxEnablePeerAccess`), until it
//! disables it or either context is destroyed. Enabling takes no device memory here: what the
//! real driver takes for the mappings, if anything, is not published. Copies between devices
//! (`cuMemcpyPeer`) need no access enabled, as on the real driver.

use std::collections::HashSet;
use std::ffi::{c_int, c_uint};
use std::sync::{LazyLock, Mutex};

use gpuslice_cuda_abi::cuda::{
    CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED,
    CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED, CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK,
};

use crate::codes::*;
use crate::{CUcontext, CUdevice, CUresult, guard, out, state};

/// (context, peer context) pairs with access enabled, by handle: the first maps the second's
/// memory.
static ENABLED: LazyLock<Mutex<HashSet<(usize, usize)>>> =
    LazyLock::new(|| Mutex::new(HashSet::new()));

fn enabled() -> Result<std::sync::MutexGuard<'static, HashSet<(usize, usize)>>, CUresult> {
    ENABLED.lock().map_err(|_| CUDA_ERROR_UNKNOWN)
}

/// The node indices of two devices that may access each other: both exist and differ.
fn peers(dev: CUdevice, peer: CUdevice) -> Result<bool, CUresult> {
    let d = state::get()?;
    Ok(d.node_index(dev)? != d.node_index(peer)?)
}

/// A destroyed context (or a primary one released to zero) maps no peer, and no peer maps it.
pub(crate) fn context_destroyed(ctx: CUcontext) {
    if let Ok(mut e) = ENABLED.lock() {
        e.retain(|&(c, p)| c != ctx as usize && p != ctx as usize);
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(
    can_access: *mut c_int,
    dev: CUdevice,
    peer: CUdevice,
) -> CUresult {
    guard(|| out(can_access, c_int::from(peers(dev, peer)?)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetP2PAttribute(
    value: *mut c_int,
    attribute: c_int,
    src: CUdevice,
    dst: CUdevice,
) -> CUresult {
    guard(|| {
        if !peers(src, dst)? {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        let v = match attribute {
            // One link between every pair: all equally close.
            CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK => 0,
            CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED
            | CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED
            | CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED => 1,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        out(value, v)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint) -> CUresult {
    guard(|| {
        let own = crate::context::current_ctx()?;
        let other = crate::context::active(peer)?;
        let pair = (crate::context::current_handle() as usize, peer as usize);
        if pair.0 == pair.1 {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // What cuDeviceCanAccessPeer says of a device and itself.
        if own.node_index == other.node_index {
            return Err(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
        }
        if !enabled()?.insert(pair) {
            return Err(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDisablePeerAccess(peer: CUcontext) -> CUresult {
    guard(|| {
        crate::context::current_ctx()?;
        crate::context::active(peer)?;
        let pair = (crate::context::current_handle() as usize, peer as usize);
        if !enabled()?.remove(&pair) {
            return Err(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
        }
        Ok(())
    })
}
