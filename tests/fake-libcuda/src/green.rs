//! Green contexts (CUDA 12.4, drivers from 550 on; modelled beyond the reference driver 535 so
//! that what a newer driver lets a program do is tested): a context made with part of a
//! device's SMs. A program takes the device's SM resource (`cuDeviceGetDevResource`), splits
//! it into groups (`cuDevSmResourceSplitByCount`, each group a multiple of the architecture's
//! granularity), makes a descriptor of one (`cuDevResourceGenerateDesc`) and a green context
//! from that (`cuGreenCtxCreate`), which it uses through its `CUcontext`
//! (`cuCtxFromGreenCtx`). As in the driver, a green context retains the device's primary
//! context until it is destroyed, and it is a context of its own: it takes the node's
//! per-context reservation, and its allocations go with it.

use std::collections::HashSet;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::{LazyLock, Mutex};

use gpuslice_cuda_abi::cuda::{
    CU_DEV_RESOURCE_TYPE_SM, CU_GREEN_CTX_DEFAULT_STREAM, CUdevResource, CUdevResourceDesc,
    CUgreenCtx,
};

use crate::codes::*;
use crate::context::{self, cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRetain};
use crate::state::{self, Driver};
use crate::{CUcontext, CUdevice, CUresult, guard, out};

/// A descriptor: the device and how many of its SMs a green context made from it gets.
struct Desc {
    dev: CUdevice,
    sm_count: c_uint,
}

/// A green context: its context and the device whose primary context it retains.
struct Green {
    ctx: CUcontext,
    dev: CUdevice,
    sm_count: c_uint,
}

/// Live descriptors and green contexts, so that a handle is checked before it is read.
/// Descriptors live as long as the process (the API has no call that destroys one).
static DESCS: LazyLock<Mutex<HashSet<usize>>> = LazyLock::new(|| Mutex::new(HashSet::new()));
static GREENS: LazyLock<Mutex<HashSet<usize>>> = LazyLock::new(|| Mutex::new(HashSet::new()));

fn attribute(d: &Driver, dev: CUdevice, attribute: c_int) -> Result<c_uint, CUresult> {
    let gpu = &d.spec.gpus[d.node_index(dev)?];
    crate::attributes::value(gpu, attribute)
        .and_then(|v| c_uint::try_from(v).ok())
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// The smallest group of SMs a split makes on the device, and the multiple every group is
/// rounded to, by compute capability (as `cuda.h` lists them).
fn granularity(d: &Driver, dev: CUdevice) -> Result<(c_uint, c_uint), CUresult> {
    Ok(match attribute(d, dev, 75)? {
        // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
        0..=6 => (1, 1),
        7 => (2, 2),
        8 => (4, 2),
        _ => (8, 8),
    })
}

/// An SM resource of `sm_count` SMs of device `dev`, which it keeps in its internal part (as
/// the driver keeps what it needs there: the split takes no device).
fn sm_resource(dev: CUdevice, sm_count: c_uint) -> CUdevResource {
    let mut r = CUdevResource {
        type_: CU_DEV_RESOURCE_TYPE_SM,
        sm_count,
        ..CUdevResource::invalid()
    };
    r.internal_padding[..4].copy_from_slice(&dev.to_le_bytes());
    r
}

/// The device and SM count of an SM resource.
fn read_sm(resource: *const CUdevResource) -> Result<(CUdevice, c_uint), CUresult> {
    if resource.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and per the API a CUdevResource the caller got from the driver.
    let r = unsafe { resource.read() };
    if r.type_ != CU_DEV_RESOURCE_TYPE_SM {
        return Err(CUDA_ERROR_INVALID_RESOURCE_TYPE);
    }
    let mut dev = [0; 4];
    dev.copy_from_slice(&r.internal_padding[..4]);
    Ok((CUdevice::from_le_bytes(dev), r.sm_count))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetDevResource(
    dev: CUdevice,
    result: *mut CUdevResource,
    kind: c_int,
) -> CUresult {
    guard(|| {
        let d = state::get()?;
        if kind != CU_DEV_RESOURCE_TYPE_SM {
            return Err(CUDA_ERROR_INVALID_RESOURCE_TYPE);
        }
        let sms = attribute(d, dev, 16)?; // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
        out(result, sm_resource(dev, sms))
    })
}

/// Splits `input` into groups of at least `min_count` SMs (rounded up to the device's
/// granularity): as many as `*groups` asks for and fit, all that fit where `result` is NULL
/// (a query). The SMs left over go to `remaining`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevSmResourceSplitByCount(
    result: *mut CUdevResource,
    groups: *mut c_uint,
    input: *const CUdevResource,
    remaining: *mut CUdevResource,
    _flags: c_uint,
    min_count: c_uint,
) -> CUresult {
    guard(|| {
        let d = state::get()?;
        let (dev, sms) = read_sm(input)?;
        if groups.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (least, multiple) = granularity(d, dev)?;
        let size = min_count.max(least).div_ceil(multiple) * multiple;
        let fit = sms / size;
        // SAFETY: non-null; the caller's count of result entries.
        let asked = unsafe { groups.read() };
        let made = if result.is_null() {
            fit
        } else {
            fit.min(asked)
        };
        if made == 0 {
            return Err(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
        }
        if !result.is_null() {
            for i in 0..made as usize {
                // SAFETY: the caller gave room for `asked` ≥ `made` resources.
                unsafe { result.add(i).write(sm_resource(dev, size)) };
            }
        }
        if !remaining.is_null() {
            // SAFETY: non-null: the caller's resource to fill.
            unsafe { remaining.write(sm_resource(dev, sms - made * size)) };
        }
        // SAFETY: non-null, checked above.
        unsafe { groups.write(made) };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevResourceGenerateDesc(
    desc: *mut CUdevResourceDesc,
    resources: *mut CUdevResource,
    count: c_uint,
) -> CUresult {
    guard(|| {
        state::get()?;
        if count != 1 {
            // One resource of each type, and SMs are the only type.
            return Err(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
        }
        let (dev, sm_count) = read_sm(resources)?;
        let handle = Box::into_raw(Box::new(Desc { dev, sm_count })).cast::<c_void>();
        DESCS
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .insert(handle as usize);
        out(desc, handle)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGreenCtxCreate(
    green: *mut CUgreenCtx,
    desc: CUdevResourceDesc,
    dev: CUdevice,
    flags: c_uint,
) -> CUresult {
    guard(|| {
        let d = state::get()?;
        if green.is_null() || flags & CU_GREEN_CTX_DEFAULT_STREAM == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if !DESCS
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .contains(&(desc as usize))
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a live descriptor: a Box leaked by cuDevResourceGenerateDesc, never freed.
        let desc = unsafe { &*desc.cast::<Desc>() };
        d.node_index(dev)?;
        if desc.dev != dev {
            // Resources of one device make no green context on another.
            return Err(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
        }
        let sm_count = desc.sm_count;
        let mut primary: CUcontext = std::ptr::null_mut();
        // SAFETY: a handle to write; the call binds inside this library, as the driver's own.
        let r = unsafe { cuDevicePrimaryCtxRetain(&raw mut primary, dev) };
        if r != CUDA_SUCCESS {
            return Err(r);
        }
        let ctx = match context::new_detached(d, dev) {
            Ok(c) => c,
            Err(e) => {
                cuDevicePrimaryCtxRelease_v2(dev);
                return Err(e);
            }
        };
        let handle = Box::into_raw(Box::new(Green { ctx, dev, sm_count })).cast::<c_void>();
        GREENS
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .insert(handle as usize);
        out(green, handle)
    })
}

fn live(green: CUgreenCtx) -> Result<&'static Green, CUresult> {
    if !GREENS
        .lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .contains(&(green as usize))
    {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    // SAFETY: in GREENS: a Box leaked by cuGreenCtxCreate and not yet dropped.
    Ok(unsafe { &*green.cast::<Green>() })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxFromGreenCtx(ctx: *mut CUcontext, green: CUgreenCtx) -> CUresult {
    guard(|| out(ctx, live(green)?.ctx))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGreenCtxGetDevResource(
    green: CUgreenCtx,
    result: *mut CUdevResource,
    kind: c_int,
) -> CUresult {
    guard(|| {
        if kind != CU_DEV_RESOURCE_TYPE_SM {
            return Err(CUDA_ERROR_INVALID_RESOURCE_TYPE);
        }
        let g = live(green)?;
        out(result, sm_resource(g.dev, g.sm_count))
    })
}

/// Destroys the green context with its context (and what was allocated in it), and releases
/// the primary context it retained.
#[unsafe(no_mangle)]
pub extern "C" fn cuGreenCtxDestroy(green: CUgreenCtx) -> CUresult {
    guard(|| {
        let d = state::get()?;
        if !GREENS
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .remove(&(green as usize))
        {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        // SAFETY: it was in GREENS, so it is a Box from cuGreenCtxCreate, dropped only here.
        let g = unsafe { Box::from_raw(green.cast::<Green>()) };
        context::destroy_detached(d, g.ctx)?;
        crate::ok(cuDevicePrimaryCtxRelease_v2(g.dev))
    })
}
