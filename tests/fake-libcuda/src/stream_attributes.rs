//! A stream's launch attributes (`cuStreamSetAttribute`, `cuStreamGetAttribute`,
//! `cuStreamCopyAttributes`): those the CUDA headers call valid for streams, checked as the
//! driver documents them and kept for the stream, so that work issued there could use them.
//! Nothing on the simulated device uses them (no L2 cache to keep lines in, no memory
//! synchronization domains); `cudaStreamSetAttribute` with an access policy window is how
//! the CUDA samples and inference servers pin a hot buffer in L2.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::{LazyLock, Mutex};

use gpuslice_cuda_abi::cuda::CUlaunchAttributeValue;

use crate::codes::*;
use crate::paths::CUstream;
use crate::{CUresult, guard};

const ACCESS_POLICY_WINDOW: c_int = 1;
const SYNCHRONIZATION_POLICY: c_int = 3;
const PRIORITY: c_int = 8;
const MEM_SYNC_DOMAIN_MAP: c_int = 9;
const MEM_SYNC_DOMAIN: c_int = 10;

/// `CU_SYNC_POLICY_AUTO` .. `CU_SYNC_POLICY_BLOCKING_SYNC`.
const SYNC_POLICIES: std::ops::RangeInclusive<c_int> = 1..=4;
/// `CU_ACCESS_PROPERTY_NORMAL`, `_STREAMING`, `_PERSISTING`.
const ACCESS_PERSISTING: c_int = 2;
/// `CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE`.
const MAX_ACCESS_POLICY_WINDOW_SIZE: c_int = 109;

/// The attributes set on each stream, by stream handle (the default streams by handle and
/// context).
type Key = (usize, usize);
static SET: LazyLock<Mutex<HashMap<Key, HashMap<c_int, CUlaunchAttributeValue>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn key(s: CUstream) -> Result<Key, CUresult> {
    crate::stream::priority_of(s)?;
    let ctx = if crate::stream::is_default(s) {
        crate::context::current_handle() as usize
    } else {
        0
    };
    Ok((s as usize, ctx))
}

/// Forgets what was set on `s` (being destroyed).
pub(crate) fn forget(s: CUstream) {
    if let Ok(mut set) = SET.lock() {
        set.retain(|(handle, _), _| *handle != s as usize);
    }
}

/// The priority set on `s` through its attributes, if one was.
pub(crate) fn priority(s: CUstream) -> Option<c_int> {
    let key = key(s).ok()?;
    let set = SET.lock().ok()?;
    set.get(&key)?
        .get(&PRIORITY)
        .map(CUlaunchAttributeValue::first_int)
}

fn int_at(v: &CUlaunchAttributeValue, at: usize) -> c_int {
    let mut b = [0; 4];
    b.copy_from_slice(&v.bytes[at..at + 4]);
    c_int::from_ne_bytes(b)
}

fn with_int(v: c_int) -> CUlaunchAttributeValue {
    let mut value = CUlaunchAttributeValue::default();
    value.bytes[..4].copy_from_slice(&v.to_ne_bytes());
    value
}

/// `v` checked for `attr` on a stream, as it is kept (a priority clamped into the range).
fn checked(attr: c_int, v: &CUlaunchAttributeValue) -> Result<CUlaunchAttributeValue, CUresult> {
    match attr {
        ACCESS_POLICY_WINDOW => {
            // CUaccessPolicyWindow: base_ptr, num_bytes, hitRatio, hitProp, missProp.
            let mut n = [0; 8];
            n.copy_from_slice(&v.bytes[8..16]);
            let num_bytes = u64::from_ne_bytes(n);
            let mut r = [0; 4];
            r.copy_from_slice(&v.bytes[16..20]);
            let hit_ratio = f32::from_ne_bytes(r);
            let (hit, miss) = (int_at(v, 20), int_at(v, 24));
            let gpu = crate::context::current_gpu()?;
            let largest = crate::attributes::value(gpu, MAX_ACCESS_POLICY_WINDOW_SIZE)
                .map_or(0, |v| u64::try_from(v).unwrap_or(0));
            let valid = num_bytes <= largest
                && (0.0..=1.0).contains(&hit_ratio)
                && (0..=ACCESS_PERSISTING).contains(&hit)
                && (0..ACCESS_PERSISTING).contains(&miss);
            valid.then_some(*v).ok_or(CUDA_ERROR_INVALID_VALUE)
        }
        SYNCHRONIZATION_POLICY if SYNC_POLICIES.contains(&v.first_int()) => Ok(*v),
        PRIORITY => Ok(with_int(v.first_int().clamp(-5, 0))),
        MEM_SYNC_DOMAIN_MAP => Ok(*v),
        MEM_SYNC_DOMAIN if (0..=1).contains(&v.first_int()) => Ok(*v),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// What `s` answers for `attr` where nothing was set: the stream's own priority, the
/// automatic synchronization policy (the simulation's choice: the driver's default is not
/// documented), the default domain map (the default domain to 0, the remote one to 1), zeros
/// for the rest.
fn default_of(s: CUstream, attr: c_int) -> Result<CUlaunchAttributeValue, CUresult> {
    Ok(match attr {
        ACCESS_POLICY_WINDOW | MEM_SYNC_DOMAIN => CUlaunchAttributeValue::default(),
        SYNCHRONIZATION_POLICY => with_int(*SYNC_POLICIES.start()),
        PRIORITY => with_int(crate::stream::priority_of(s)?),
        MEM_SYNC_DOMAIN_MAP => {
            let mut v = CUlaunchAttributeValue::default();
            v.bytes[1] = 1;
            v
        }
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamSetAttribute(
    s: CUstream,
    attr: c_int,
    value: *const CUlaunchAttributeValue,
) -> CUresult {
    guard(|| {
        crate::current_ctx()?;
        let key = key(s)?;
        // SAFETY: the caller's attribute value (null refused).
        let v = unsafe { value.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let kept = checked(attr, v)?;
        SET.lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .entry(key)
            .or_default()
            .insert(attr, kept);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetAttribute(
    s: CUstream,
    attr: c_int,
    value: *mut CUlaunchAttributeValue,
) -> CUresult {
    guard(|| {
        crate::current_ctx()?;
        let key = key(s)?;
        let set = SET
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .get(&key)
            .and_then(|a| a.get(&attr).copied());
        let v = match set {
            Some(v) => v,
            None => default_of(s, attr)?,
        };
        crate::out(value, v)
    })
}

/// Gives `dst` the attributes set on `src`.
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamCopyAttributes(dst: CUstream, src: CUstream) -> CUresult {
    guard(|| {
        crate::current_ctx()?;
        let (to, from) = (key(dst)?, key(src)?);
        let mut set = SET.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
        let copied = set.get(&from).cloned().unwrap_or_default();
        set.insert(to, copied);
        Ok(())
    })
}

/// Demotes the lines kept in L2 as persisting to normal ones: the simulated device has no
/// L2 to keep them in, so there is nothing to do but check the context.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxResetPersistingL2Cache() -> CUresult {
    guard(|| crate::current_ctx().map(|_| ()))
}
