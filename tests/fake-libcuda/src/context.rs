//! Contexts as the real driver keeps them: each thread has a stack of current contexts
//! (`cuCtxPushCurrent` / `cuCtxPopCurrent`; `cuCtxSetCurrent` replaces the top, or pops with
//! NULL), each device one reference-counted primary context with its flags, and a context
//! carries its flags, limits and cache preferences. Creating a context charges the device the
//! node's per-context reservation; destroying it (or releasing a primary one to zero) gives it
//! back. Raising a limit the driver backs with device memory takes that memory as the driver
//! does (see [`reserve_per_unit`]), lowering it gives it back. A destroyed context's handle
//! answers `CUDA_ERROR_INVALID_CONTEXT`, never a dangling read.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};

use crate::codes::*;
use crate::state::{self, Driver};
use crate::{CUcontext, CUdevice, CUresult, guard, out};

/// A context; `CUcontext` points at one.
pub struct Ctx {
    pub(crate) node_index: usize,
    pub(crate) ordinal: CUdevice,
    primary: bool,
    /// False for a primary context nobody retains (it keeps its handle, as in the driver).
    active: AtomicBool,
    id: u64,
    flags: AtomicU32,
    limits: Mutex<HashMap<c_int, usize>>,
    /// Device memory taken for limits raised above what the context was made with.
    limit_reserve: AtomicU64,
    cache_config: AtomicU32,
    shared_mem_config: AtomicU32,
}

thread_local! {
    /// This thread's context stack; the last entry is current.
    static STACK: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// Every live context, so that a handle can be checked before it is read.
static LIVE: LazyLock<Mutex<HashSet<usize>>> = LazyLock::new(|| Mutex::new(HashSet::new()));
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Each device's primary context flags (`cuDevicePrimaryCtxSetFlags`), by node index.
static PRIMARY_FLAGS: LazyLock<Mutex<HashMap<usize, c_uint>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

const CU_LIMIT_STACK_SIZE: c_int = 0;

/// `CU_LIMIT_*` and the driver's defaults for them.
const LIMIT_DEFAULTS: &[(c_int, usize)] = &[
    (CU_LIMIT_STACK_SIZE, 1024),
    (1, 1 << 20), // CU_LIMIT_PRINTF_FIFO_SIZE
    (2, 8 << 20), // CU_LIMIT_MALLOC_HEAP_SIZE
    (3, 2),       // CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH
    (4, 2048),    // CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT
    (5, 64),      // CU_LIMIT_MAX_L2_FETCH_GRANULARITY
    (6, 0),       // CU_LIMIT_PERSISTING_L2_CACHE_SIZE
    (CU_LIMIT_CIG_ENABLED, 0),
];

/// `CU_LIMIT_CIG_ENABLED` (CUDA 12.5): non-zero for a context made in CUDA-in-graphics mode,
/// which no simulated context is. Queried only; cuBLASLt asks it when it makes its context,
/// and left with `CUDA_ERROR_UNSUPPORTED_LIMIT` it went on without the device's SM count
/// (its GEMVs launched grids of no blocks, its matrix products found no algorithm).
const CU_LIMIT_CIG_ENABLED: c_int = 8;

/// Limits that can only be queried (`cuCtxSetLimit` refuses them).
const QUERY_ONLY_LIMITS: &[c_int] = &[CU_LIMIT_CIG_ENABLED];

/// The API version `cuCtxGetApiVersion` reports: contexts made through the `_v2` interface.
const CONTEXT_API_VERSION: c_uint = 3020;

fn live(ctx: CUcontext) -> Result<&'static Ctx, CUresult> {
    let live = LIVE.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
    if ctx.is_null() || !live.contains(&(ctx as usize)) {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    // SAFETY: the pointer is in LIVE: a Box leaked by ctx_new and not yet dropped.
    Ok(unsafe { &*ctx.cast::<Ctx>() })
}

/// `f` on this thread's context stack; `CUDA_ERROR_DEINITIALIZED` once the thread's storage
/// is gone (a call from a library's exit handler, after the thread's destructors ran), as the
/// driver answers calls made while the process tears it down.
fn with_stack<R>(f: impl FnOnce(&mut Vec<usize>) -> R) -> Result<R, CUresult> {
    STACK
        .try_with(|s| f(&mut s.borrow_mut()))
        .map_err(|_| CUDA_ERROR_DEINITIALIZED)
}

fn top() -> Result<CUcontext, CUresult> {
    with_stack(|s| s.last().copied().unwrap_or(0) as CUcontext)
}

/// The device ordinal of a live context.
pub(crate) fn ordinal_of(ctx: CUcontext) -> Option<CUdevice> {
    live(ctx).ok().map(|c| c.ordinal)
}

/// A live context that is not a primary one nobody retains.
pub(crate) fn active(ctx: CUcontext) -> Result<&'static Ctx, CUresult> {
    let c = live(ctx)?;
    if !c.active.load(Ordering::Acquire) {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    Ok(c)
}

/// The calling thread's current context handle (null for none).
pub(crate) fn current_handle() -> CUcontext {
    top().unwrap_or(std::ptr::null_mut())
}

/// The simulated GPU of the calling thread's current context.
pub(crate) fn current_gpu() -> Result<&'static gpuslice_simnode::SimGpu, CUresult> {
    let ctx = current_ctx()?;
    Ok(&state::get()?.spec.gpus[ctx.node_index])
}

/// The calling thread's current context; `CUDA_ERROR_CONTEXT_IS_DESTROYED` for a primary
/// context nobody retains, as the driver answers the calls that need the context itself.
pub(crate) fn current_ctx() -> Result<&'static Ctx, CUresult> {
    let c = current_live()?;
    if !c.active.load(Ordering::Acquire) {
        return Err(CUDA_ERROR_CONTEXT_IS_DESTROYED);
    }
    Ok(c)
}

/// The calling thread's current context, also a primary one nobody retains yet: the CUDA 11
/// runtime's `cudaSetDevice` makes the device's primary context current before anything
/// retains it, and its `cudaGetDevice` then asks that context's device.
fn current_live() -> Result<&'static Ctx, CUresult> {
    let ctx = top()?;
    if ctx.is_null() {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    live(ctx)
}

/// `ctx` itself, or the current context when it is NULL (as the `cuCtx*` queries take it).
fn given_or_current(ctx: CUcontext) -> Result<&'static Ctx, CUresult> {
    if ctx.is_null() {
        current_ctx()
    } else {
        live(ctx)
    }
}

fn charge_context(d: &Driver, node_index: usize) -> Result<(), CUresult> {
    let bytes = d.spec.gpus[node_index].context_bytes;
    let mut inner = d.lock();
    d.charge(&mut inner, node_index, bytes)
}

/// Gives back what the context's raised limits took, and puts its limits back to the
/// defaults (a primary context released to zero is made anew by the next retain).
fn drop_limit_reserve(d: &Driver, c: &Ctx) {
    let bytes = c.limit_reserve.swap(0, Ordering::AcqRel);
    let mut inner = d.lock();
    d.uncharge(&mut inner, c.node_index, bytes);
    drop(inner);
    if let Ok(mut limits) = c.limits.lock() {
        *limits = LIMIT_DEFAULTS.iter().copied().collect();
    }
}

/// Device memory the driver backs each unit of a limit with: the per-thread stack for every
/// thread that can be resident on the device (threads per SM × SMs), the `malloc` heap and
/// the `printf` FIFO byte for byte. None for the limits that reserve nothing here (the device
/// runtime's, whose reservations the driver does not size publicly, and the cache hints).
fn reserve_per_unit(d: &Driver, node_index: usize, limit: c_int) -> Option<u64> {
    let gpu = &d.spec.gpus[node_index];
    let attribute =
        |a| crate::attributes::value(gpu, a).map_or(0, |v| u64::try_from(v).unwrap_or(0));
    match limit {
        0 => Some(attribute(16) * attribute(39)), // MULTIPROCESSOR_COUNT × MAX_THREADS_PER_MULTIPROCESSOR
        1 | 2 => Some(1),
        _ => None,
    }
}

fn uncharge_context(d: &Driver, node_index: usize) {
    let mut inner = d.lock();
    d.uncharge(
        &mut inner,
        node_index,
        d.spec.gpus[node_index].context_bytes,
    );
}

/// A new context object, registered live; charging for it is the caller's.
fn ctx_alloc(
    node_index: usize,
    ordinal: CUdevice,
    primary: bool,
    flags: c_uint,
) -> Result<CUcontext, CUresult> {
    let ctx = Box::into_raw(Box::new(Ctx {
        node_index,
        ordinal,
        primary,
        active: AtomicBool::new(!primary),
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        flags: AtomicU32::new(flags),
        limits: Mutex::new(LIMIT_DEFAULTS.iter().copied().collect()),
        limit_reserve: AtomicU64::new(0),
        cache_config: AtomicU32::new(0),
        shared_mem_config: AtomicU32::new(1),
    }));
    LIVE.lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .insert(ctx as usize);
    Ok(ctx.cast())
}

fn ctx_new(d: &Driver, ordinal: CUdevice, flags: c_uint) -> Result<CUcontext, CUresult> {
    let node_index = d.node_index(ordinal)?;
    charge_context(d, node_index)?;
    ctx_alloc(node_index, ordinal, false, flags)
}

/// The device's primary context, made (inactive, uncharged) if it has none: its handle stays
/// the same for the life of the process, active or not.
pub(crate) fn primary_ctx(d: &Driver, dev: CUdevice) -> Result<(CUcontext, u32), CUresult> {
    let index = d.node_index(dev)?;
    if let Some((p, n)) = d.lock().primary.get(&index).copied() {
        return Ok((p as CUcontext, n));
    }
    let flags = PRIMARY_FLAGS
        .lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .get(&index)
        .copied()
        .unwrap_or(0);
    let c = ctx_alloc(index, dev, true, flags)?;
    d.lock().primary.insert(index, (c as usize, 0));
    Ok((c, 0))
}

fn ctx_drop(d: &Driver, ctx: CUcontext) -> Result<(), CUresult> {
    if !LIVE
        .lock()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?
        .remove(&(ctx as usize))
    {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    crate::export_table::context_destroyed(ctx);
    crate::stream::context_destroyed(ctx);
    crate::peer::context_destroyed(ctx);
    // SAFETY: the pointer was in LIVE, so it is a Box from ctx_alloc, dropped only here.
    let c = unsafe { Box::from_raw(ctx.cast::<Ctx>()) };
    uncharge_context(d, c.node_index);
    drop_limit_reserve(d, &c);
    d.free_context_allocations(ctx as usize);
    // A context destroyed while current on this thread leaves the stack.
    let _ = with_stack(|s| s.retain(|&p| p != ctx as usize));
    Ok(())
}

/// A context on `dev` that is not made current (a green context's: [`crate::green`]).
pub(crate) fn new_detached(d: &Driver, dev: CUdevice) -> Result<CUcontext, CUresult> {
    ctx_new(d, dev, 0)
}

/// Destroys a context made by [`new_detached`].
pub(crate) fn destroy_detached(d: &Driver, ctx: CUcontext) -> Result<(), CUresult> {
    ctx_drop(d, ctx)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = state::get()?;
        let (ctx, n) = primary_ctx(d, dev)?;
        let c = live(ctx)?;
        if n == 0 {
            charge_context(d, c.node_index)?;
            c.active.store(true, Ordering::Release);
        }
        d.lock().primary.insert(c.node_index, (ctx as usize, n + 1));
        out(pctx, ctx)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    guard(|| {
        let d = state::get()?;
        let (ctx, n) = primary_ctx(d, dev)?;
        let c = live(ctx)?;
        if n == 0 {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        if n == 1 {
            primary_destroyed(d, ctx, c);
        }
        d.lock().primary.insert(c.node_index, (ctx as usize, n - 1));
        Ok(())
    })
}

/// The primary context's last reference is gone: what it held is freed (its handle stays).
fn primary_destroyed(d: &Driver, ctx: CUcontext, c: &Ctx) {
    c.active.store(false, Ordering::Release);
    crate::export_table::context_destroyed(ctx);
    crate::stream::context_destroyed(ctx);
    crate::peer::context_destroyed(ctx);
    uncharge_context(d, c.node_index);
    drop_limit_reserve(d, c);
    d.free_context_allocations(ctx as usize);
    let _ = crate::pool_books::context_destroyed(c.node_index);
}

/// Destroys the primary context whatever its references: its allocations are freed, its
/// limits back to the defaults; the next retain makes it anew.
#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    guard(|| {
        let d = state::get()?;
        let (ctx, n) = primary_ctx(d, dev)?;
        let c = live(ctx)?;
        if n > 0 {
            primary_destroyed(d, ctx, c);
        }
        d.lock().primary.insert(c.node_index, (ctx as usize, 0));
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult {
    cuDevicePrimaryCtxReset_v2(dev)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    cuDevicePrimaryCtxRelease_v2(dev)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    guard(|| {
        let d = state::get()?;
        let index = d.node_index(dev)?;
        let is_active = d.lock().primary.get(&index).is_some_and(|&(_, n)| n > 0);
        let f = PRIMARY_FLAGS
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .get(&index)
            .copied()
            .unwrap_or(0);
        out(flags, f)?;
        out(active, c_int::from(is_active))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) -> CUresult {
    guard(|| {
        let d = state::get()?;
        let index = d.node_index(dev)?;
        PRIMARY_FLAGS
            .lock()
            .map_err(|_| CUDA_ERROR_UNKNOWN)?
            .insert(index, flags);
        if let Some((p, _)) = d.lock().primary.get(&index).copied() {
            live(p as CUcontext)?.flags.store(flags, Ordering::Relaxed);
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: c_uint) -> CUresult {
    cuDevicePrimaryCtxSetFlags_v2(dev, flags)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let c = ctx_new(state::get()?, dev, flags)?;
        with_stack(|s| s.push(c as usize))?;
        out(pctx, c)
    })
}

/// An OpenGL interop context (`cuGLCtxCreate`, deprecated since CUDA 5): the simulated node
/// has no OpenGL, and makes it a plain context, as the driver makes one beside the current
/// OpenGL context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGLCtxCreate_v2(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: same contract as cuCtxCreate_v2.
    unsafe { cuCtxCreate_v2(pctx, flags, dev) }
}

/// The CUDA 2.0 form, the same on 64-bit machines.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGLCtxCreate(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: same contract as cuCtxCreate_v2.
    unsafe { cuCtxCreate_v2(pctx, flags, dev) }
}

/// A VDPAU interop context: a plain context here (no VDPAU on the simulated node); the VDPAU
/// device and its `VdpGetProcAddress` must be given, as the driver needs them.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuVDPAUCtxCreate_v2(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
    _vdp_device: u32,
    get_proc_address: *mut c_void,
) -> CUresult {
    if get_proc_address.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: same contract as cuCtxCreate_v2.
    unsafe { cuCtxCreate_v2(pctx, flags, dev) }
}

/// The CUDA 3.1 form, the same on 64-bit machines.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuVDPAUCtxCreate(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
    vdp_device: u32,
    get_proc_address: *mut c_void,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuVDPAUCtxCreate_v2(pctx, flags, dev, vdp_device, get_proc_address) }
}

/// CUDA 11.4's variant with execution-affinity parameters (ignored here).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    _params: *mut c_void,
    _num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: same contract as cuCtxCreate_v2.
    unsafe { cuCtxCreate_v2(pctx, flags, dev) }
}

/// CUDA 12.5's variant with `CUctxCreateParams` (ignored here).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    _params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: same contract as cuCtxCreate_v2.
    unsafe { cuCtxCreate_v2(pctx, flags, dev) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    guard(|| {
        let d = state::get()?;
        if live(ctx)?.primary {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        ctx_drop(d, ctx)
    })
}

/// The CUDA 2.0 name, which `cuGetProcAddress` still gives for versions before 4.0.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDestroy(ctx: CUcontext) -> CUresult {
    cuCtxDestroy_v2(ctx)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    guard(|| {
        state::get()?;
        if !ctx.is_null() {
            live(ctx)?;
        }
        with_stack(|s| {
            s.pop();
            if !ctx.is_null() {
                s.push(ctx as usize);
            }
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    guard(|| {
        state::get()?;
        out(pctx, top()?)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult {
    guard(|| {
        state::get()?;
        if ctx.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        live(ctx)?;
        with_stack(|s| s.push(ctx as usize))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> CUresult {
    guard(|| {
        state::get()?;
        let popped = with_stack(Vec::pop)?.ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        if !pctx.is_null() {
            out(pctx, popped as CUcontext)?;
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult {
    guard(|| out(dev, current_live()?.ordinal))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    guard(|| synchronize(current_ctx()?))
}

/// Waits for the work queued on `ctx`'s device (refused during a global-mode capture, which
/// it would invalidate).
pub(crate) fn synchronize(ctx: &Ctx) -> Result<(), CUresult> {
    crate::stream::refuse_during_global_capture()?;
    // Every kernel of this process runs in order on the device: wait for the last.
    std::thread::sleep(state::get()?.until_idle(ctx.node_index));
    Ok(())
}

/// Profiling the current context (`cudaProfilerStart`, `torch.cuda.profiler.start`, numba's
/// `cuda.profile_start`): with no profiler attached, as here, the driver does nothing and
/// succeeds; it needs a current context.
#[unsafe(no_mangle)]
pub extern "C" fn cuProfilerStart() -> CUresult {
    guard(|| current_ctx().map(|_| ()))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuProfilerStop() -> CUresult {
    guard(|| current_ctx().map(|_| ()))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetFlags(flags: *mut c_uint) -> CUresult {
    guard(|| out(flags, current_ctx()?.flags.load(Ordering::Relaxed)))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetFlags(flags: c_uint) -> CUresult {
    guard(|| {
        current_ctx()?.flags.store(flags, Ordering::Relaxed);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetId(ctx: CUcontext, id: *mut u64) -> CUresult {
    guard(|| out(id, given_or_current(ctx)?.id))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetApiVersion(ctx: CUcontext, version: *mut c_uint) -> CUresult {
    guard(|| {
        given_or_current(ctx)?;
        out(version, CONTEXT_API_VERSION)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetLimit(value: *mut usize, limit: c_int) -> CUresult {
    guard(|| {
        let ctx = current_ctx()?;
        let limits = ctx.limits.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
        let v = *limits.get(&limit).ok_or(CUDA_ERROR_UNSUPPORTED_LIMIT)?;
        out(value, v)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetLimit(limit: c_int, value: usize) -> CUresult {
    guard(|| {
        if QUERY_ONLY_LIMITS.contains(&limit) {
            return Err(CUDA_ERROR_UNSUPPORTED_LIMIT);
        }
        set_limit(current_ctx()?, limit, value, |_| true)
    })
}

/// Sets `ctx`'s `limit` to `value` where `wanted(now)` says so, taking or giving back the
/// device memory the change reserves; a growth the card has no room for fails with
/// `CUDA_ERROR_OUT_OF_MEMORY`, the limit left as it was.
fn set_limit(
    ctx: &Ctx,
    limit: c_int,
    value: usize,
    wanted: impl FnOnce(usize) -> bool,
) -> Result<(), CUresult> {
    let mut limits = ctx.limits.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
    let slot = limits.get_mut(&limit).ok_or(CUDA_ERROR_UNSUPPORTED_LIMIT)?;
    if !wanted(*slot) {
        return Ok(());
    }
    if let Some(unit) = reserve_per_unit(state::get()?, ctx.node_index, limit) {
        let d = state::get()?;
        let (now, then) = (*slot as u64, value as u64);
        let mut inner = d.lock();
        if then > now {
            let more = (then - now).saturating_mul(unit);
            d.charge(&mut inner, ctx.node_index, more)?;
            ctx.limit_reserve.fetch_add(more, Ordering::AcqRel);
        } else {
            let held = ctx.limit_reserve.load(Ordering::Acquire);
            let less = (now - then).saturating_mul(unit).min(held);
            d.uncharge(&mut inner, ctx.node_index, less);
            ctx.limit_reserve.fetch_sub(less, Ordering::AcqRel);
        }
    }
    *slot = value;
    Ok(())
}

/// Before a kernel whose threads need `local` bytes of local memory runs in context `ctx`
/// (its stream's): where that is more than the context's per-thread stack, the stack grows to
/// it for every thread that can be resident, and stays grown, as the driver does at such a
/// launch; where the card has no room, the launch fails with `CUDA_ERROR_OUT_OF_MEMORY`.
pub(crate) fn grow_stack_for_launch_in(ctx: &Ctx, local: u64) -> Result<(), CUresult> {
    if local == 0 {
        return Ok(());
    }
    let value = usize::try_from(local).map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
    set_limit(ctx, CU_LIMIT_STACK_SIZE, value, |now| value > now)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCacheConfig(config: *mut c_uint) -> CUresult {
    guard(|| out(config, current_ctx()?.cache_config.load(Ordering::Relaxed)))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCacheConfig(config: c_uint) -> CUresult {
    guard(|| {
        if config > 3 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        current_ctx()?.cache_config.store(config, Ordering::Relaxed);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetSharedMemConfig(config: *mut c_uint) -> CUresult {
    guard(|| {
        out(
            config,
            current_ctx()?.shared_mem_config.load(Ordering::Relaxed),
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetSharedMemConfig(config: c_uint) -> CUresult {
    guard(|| {
        if config > 2 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        current_ctx()?
            .shared_mem_config
            .store(config, Ordering::Relaxed);
        Ok(())
    })
}

/// Lower numbers are higher priorities: 0 is the least, -5 the greatest, as on Ampere and
/// later GPUs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    least: *mut c_int,
    greatest: *mut c_int,
) -> CUresult {
    guard(|| {
        current_ctx()?;
        if !least.is_null() {
            out(least, 0)?;
        }
        if !greatest.is_null() {
            out(greatest, -5)?;
        }
        Ok(())
    })
}
