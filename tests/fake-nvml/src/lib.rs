//! A simulated `libnvidia-ml.so.1`. It exports the NVML functions gpuslice and nvml-wrapper
//! use, with the names, signatures and struct layouts of `nvml.h`, and answers from the
//! simulated node description and the per-process usage records of the fake libcuda.
#![allow(
    unsafe_code,
    non_snake_case,
    non_camel_case_types,
    clippy::missing_safety_doc
)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong, c_void};
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use gpuslice_simnode::{NodeSpec, procs};

pub type nvmlReturn_t = c_uint;
pub const NVML_SUCCESS: nvmlReturn_t = 0;
pub const NVML_ERROR_UNINITIALIZED: nvmlReturn_t = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
pub const NVML_ERROR_NOT_SUPPORTED: nvmlReturn_t = 3;
pub const NVML_ERROR_NOT_FOUND: nvmlReturn_t = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
pub const NVML_ERROR_DRIVER_NOT_LOADED: nvmlReturn_t = 9;
pub const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;

/// `nvmlDevice_t` points at one of these; they live as long as the library.
pub struct Device {
    index: usize,
}
pub type nvmlDevice_t = *mut Device;

#[repr(C)]
pub struct nvmlMemory_t {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

#[repr(C)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

#[repr(C)]
pub struct nvmlPciInfo_t {
    pub busIdLegacy: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pciDeviceId: c_uint,
    pub pciSubSystemId: c_uint,
    pub busId: [c_char; 32],
}

#[repr(C)]
pub struct nvmlUtilization_t {
    pub gpu: c_uint,
    pub memory: c_uint,
}

#[repr(C)]
pub struct nvmlProcessInfo_v1_t {
    pub pid: c_uint,
    pub usedGpuMemory: c_ulonglong,
}

#[repr(C)]
pub struct nvmlProcessUtilizationSample_t {
    pub pid: c_uint,
    /// CPU timestamp in microseconds.
    pub timeStamp: c_ulonglong,
    pub smUtil: c_uint,
    pub memUtil: c_uint,
    pub encUtil: c_uint,
    pub decUtil: c_uint,
}

#[repr(C)]
pub struct nvmlProcessInfo_t {
    pub pid: c_uint,
    pub usedGpuMemory: c_ulonglong,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}

struct Loaded {
    spec: NodeSpec,
    devices: &'static [Device],
}

static INIT_COUNT: AtomicU32 = AtomicU32::new(0);
static LOADED: Mutex<Option<&'static Loaded>> = Mutex::new(None);

fn guard(f: impl FnOnce() -> nvmlReturn_t) -> nvmlReturn_t {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(NVML_ERROR_UNKNOWN)
}

fn library_dir() -> Option<PathBuf> {
    gpuslice_simnode::library_dir_of(nvmlInit_v2 as *const c_void)
}

fn loaded() -> Option<&'static Loaded> {
    if INIT_COUNT.load(Ordering::Acquire) == 0 {
        return None;
    }
    *LOADED.lock().ok()?
}

fn init() -> nvmlReturn_t {
    let Ok(mut slot) = LOADED.lock() else {
        return NVML_ERROR_UNKNOWN;
    };
    if slot.is_none() {
        match NodeSpec::locate(library_dir().as_deref()) {
            Ok(spec) => {
                let devices: Vec<Device> =
                    (0..spec.gpus.len()).map(|index| Device { index }).collect();
                let devices = Box::leak(devices.into_boxed_slice());
                *slot = Some(Box::leak(Box::new(Loaded { spec, devices })));
            }
            Err(e) => {
                if std::env::var_os("GPUSLICE_SIM_DEBUG").is_some() {
                    eprintln!("fake libnvidia-ml: {e}");
                }
                return NVML_ERROR_DRIVER_NOT_LOADED;
            }
        }
    }
    INIT_COUNT.fetch_add(1, Ordering::AcqRel);
    NVML_SUCCESS
}

/// Copies `s` with its NUL into a caller buffer of `len` bytes.
unsafe fn write_str(s: &str, buf: *mut c_char, len: c_uint) -> nvmlReturn_t {
    if buf.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if s.len() + 1 > len as usize {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller promises `buf` holds `len` bytes, and s.len() + 1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), buf, s.len());
        *buf.add(s.len()) = 0;
    }
    NVML_SUCCESS
}

/// Runs `f` with the node and the device behind `device`.
unsafe fn with_device(
    device: nvmlDevice_t,
    f: impl FnOnce(&Loaded, usize) -> nvmlReturn_t,
) -> nvmlReturn_t {
    guard(|| {
        let Some(l) = loaded() else {
            return NVML_ERROR_UNINITIALIZED;
        };
        let range = l.devices.as_ptr_range();
        let p = device.cast_const();
        if device.is_null() || p < range.start || p >= range.end {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: `p` lies inside the leaked device slice, so it points at a live Device.
        let index = unsafe { (*p).index };
        f(l, index)
    })
}

/// Total and used bytes of GPU `index`, used from every live process's record.
fn memory_of(l: &Loaded, index: usize) -> (u64, u64) {
    let total = l.spec.gpus[index].memory_bytes;
    (total, procs::used_on(&l.spec.state_dir, index).min(total))
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    guard(init)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit() -> nvmlReturn_t {
    guard(init)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    guard(init)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    guard(|| {
        let r = INIT_COUNT.fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(1));
        if r.is_ok() {
            NVML_SUCCESS
        } else {
            NVML_ERROR_UNINITIALIZED
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let s: &'static CStr = match result {
        NVML_SUCCESS => c"Success",
        NVML_ERROR_UNINITIALIZED => c"Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED => c"Not Supported",
        NVML_ERROR_NOT_FOUND => c"Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        NVML_ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard(|| match loaded() {
        // SAFETY: the caller passes a buffer of `length` bytes.
        Some(l) => unsafe { write_str(&l.spec.driver_version, version, length) },
        None => NVML_ERROR_UNINITIALIZED,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard(|| match loaded() {
        // SAFETY: the caller passes a buffer of `length` bytes.
        Some(l) => unsafe { write_str(&format!("12.{}", l.spec.driver_version), version, length) },
        None => NVML_ERROR_UNINITIALIZED,
    })
}

unsafe fn cuda_version(out: *mut c_int) -> nvmlReturn_t {
    guard(|| {
        let Some(l) = loaded() else {
            return NVML_ERROR_UNINITIALIZED;
        };
        if out.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: `out` is non-null and points at a c_int the caller owns.
        unsafe { *out = l.spec.cuda_driver_version };
        NVML_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> nvmlReturn_t {
    // SAFETY: forwarded caller pointer.
    unsafe { cuda_version(v) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> nvmlReturn_t {
    // SAFETY: forwarded caller pointer.
    unsafe { cuda_version(v) }
}

unsafe fn device_count(count: *mut c_uint) -> nvmlReturn_t {
    guard(|| {
        let Some(l) = loaded() else {
            return NVML_ERROR_UNINITIALIZED;
        };
        if count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: `count` is non-null and points at a c_uint the caller owns.
        unsafe { *count = c_uint::try_from(l.devices.len()).unwrap_or(0) };
        NVML_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: forwarded caller pointer.
    unsafe { device_count(count) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: forwarded caller pointer.
    unsafe { device_count(count) }
}

unsafe fn handle_where(
    out: *mut nvmlDevice_t,
    pick: impl Fn(&NodeSpec) -> Option<usize>,
) -> nvmlReturn_t {
    guard(|| {
        let Some(l) = loaded() else {
            return NVML_ERROR_UNINITIALIZED;
        };
        if out.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        match pick(&l.spec) {
            Some(i) if i < l.devices.len() => {
                // SAFETY: `out` is non-null; the handle points into the leaked device slice.
                unsafe { *out = std::ptr::from_ref(&l.devices[i]).cast_mut() };
                NVML_SUCCESS
            }
            Some(_) => NVML_ERROR_INVALID_ARGUMENT,
            None => NVML_ERROR_NOT_FOUND,
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: forwarded caller pointer.
    unsafe { handle_where(device, |_| Some(index as usize)) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: forwarded caller pointer.
    unsafe { handle_where(device, |_| Some(index as usize)) }
}

unsafe fn c_str_arg<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: the caller passes a NUL-terminated UUID.
    let Some(uuid) = (unsafe { c_str_arg(uuid) }) else {
        return NVML_ERROR_INVALID_ARGUMENT;
    };
    // SAFETY: forwarded caller pointer.
    unsafe { handle_where(device, |s| s.gpus.iter().position(|g| g.uuid == uuid)) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: the caller passes a NUL-terminated bus id.
    let Some(bus) = (unsafe { c_str_arg(bus) }) else {
        return NVML_ERROR_INVALID_ARGUMENT;
    };
    // SAFETY: forwarded caller pointer.
    unsafe {
        handle_where(device, |s| {
            s.gpus
                .iter()
                .position(|g| g.pci_bus_id.eq_ignore_ascii_case(bus))
        })
    }
}

macro_rules! scalar_getter {
    ($name:ident, $ty:ty, |$l:ident, $i:ident| $value:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(device: nvmlDevice_t, out: *mut $ty) -> nvmlReturn_t {
            // SAFETY: the device handle is checked by with_device.
            unsafe {
                with_device(device, |$l, $i| {
                    if out.is_null() {
                        return NVML_ERROR_INVALID_ARGUMENT;
                    }
                    let v: Option<$ty> = $value;
                    match v {
                        // SAFETY: `out` is non-null and points at a value the caller owns.
                        Some(v) => {
                            *out = v;
                            NVML_SUCCESS
                        }
                        None => NVML_ERROR_NOT_SUPPORTED,
                    }
                })
            }
        }
    };
}

scalar_getter!(nvmlDeviceGetIndex, c_uint, |_l, i| c_uint::try_from(i).ok());
scalar_getter!(nvmlDeviceGetMinorNumber, c_uint, |l, i| Some(
    l.spec.gpus[i].minor
));
scalar_getter!(nvmlDeviceGetNumaNodeId, c_uint, |l, i| l.spec.gpus[i]
    .numa_node);
scalar_getter!(nvmlDeviceGetNumGpuCores, c_uint, |l, i| Some(
    l.spec.gpus[i].sm_count * 128
));

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: the handle is checked; the caller passes a buffer of `length` bytes.
    unsafe { with_device(device, |l, i| write_str(&l.spec.gpus[i].name, name, length)) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: the handle is checked; the caller passes a buffer of `length` bytes.
    unsafe { with_device(device, |l, i| write_str(&l.spec.gpus[i].uuid, uuid, length)) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    // SAFETY: the handle is checked; the out pointers are checked for null.
    unsafe {
        with_device(device, |l, i| {
            if major.is_null() || minor.is_null() {
                return NVML_ERROR_INVALID_ARGUMENT;
            }
            let (a, b) = l.spec.gpus[i].compute_capability;
            *major = c_int::try_from(a).unwrap_or(0);
            *minor = c_int::try_from(b).unwrap_or(0);
            NVML_SUCCESS
        })
    }
}

fn fill_chars(dst: &mut [c_char], s: &str) {
    let room = dst.len().saturating_sub(1);
    for (d, b) in dst.iter_mut().zip(s.bytes().take(room)) {
        *d = b as c_char;
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    // SAFETY: the handle is checked; `pci` is checked for null and owned by the caller.
    unsafe {
        with_device(device, |l, i| {
            if pci.is_null() {
                return NVML_ERROR_INVALID_ARGUMENT;
            }
            let bus_id = &l.spec.gpus[i].pci_bus_id;
            let parts: Vec<&str> = bus_id.split([':', '.']).collect();
            let hex = |k: usize| {
                parts
                    .get(k)
                    .and_then(|p| u32::from_str_radix(p, 16).ok())
                    .unwrap_or(0)
            };
            let mut info: nvmlPciInfo_t = std::mem::zeroed();
            info.domain = hex(0);
            info.bus = hex(1);
            info.device = hex(2);
            info.pciDeviceId = 0x2236_10de;
            info.pciSubSystemId = 0x1482_10de;
            fill_chars(&mut info.busId, bus_id);
            let legacy = bus_id.get(4..).unwrap_or(bus_id);
            fill_chars(&mut info.busIdLegacy, legacy);
            *pci = info;
            NVML_SUCCESS
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    // SAFETY: the handle is checked; `memory` is checked for null and owned by the caller.
    unsafe {
        with_device(device, |l, i| {
            if memory.is_null() {
                return NVML_ERROR_INVALID_ARGUMENT;
            }
            let (total, used) = memory_of(l, i);
            *memory = nvmlMemory_t {
                total,
                free: total - used,
                used,
            };
            NVML_SUCCESS
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    // SAFETY: the handle is checked; `memory` is checked for null and owned by the caller.
    unsafe {
        with_device(device, |l, i| {
            if memory.is_null() {
                return NVML_ERROR_INVALID_ARGUMENT;
            }
            let (total, used) = memory_of(l, i);
            let version = (*memory).version;
            *memory = nvmlMemory_v2_t {
                version,
                total,
                reserved: 0,
                free: total - used,
                used,
            };
            NVML_SUCCESS
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    u: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    // SAFETY: the handle is checked; `u` is checked for null and owned by the caller.
    unsafe {
        with_device(device, |l, i| {
            if u.is_null() {
                return NVML_ERROR_INVALID_ARGUMENT;
            }
            let (total, used) = memory_of(l, i);
            let mem_pct = u32::try_from(used.saturating_mul(100) / total.max(1)).unwrap_or(100);
            *u = nvmlUtilization_t {
                gpu: 0,
                memory: mem_pct,
            };
            NVML_SUCCESS
        })
    }
}

/// Fills `infos` with the processes holding memory on the device, as NVML does: when the
/// buffer is too small, `*count` becomes the number needed and the call returns
/// `NVML_ERROR_INSUFFICIENT_SIZE`.
unsafe fn processes<T>(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut T,
    make: impl Fn(u32, u64) -> T,
) -> nvmlReturn_t {
    // SAFETY: the handle is checked; `count` and `infos` are checked before use.
    unsafe {
        with_device(device, |l, i| {
            if count.is_null() {
                return NVML_ERROR_INVALID_ARGUMENT;
            }
            let live: Vec<(u32, u64)> = procs::live(&l.spec.state_dir)
                .into_iter()
                .filter_map(|p| {
                    p.used
                        .get(i)
                        .copied()
                        .filter(|u| *u > 0)
                        .map(|u| (p.pid, u))
                })
                .collect();
            let capacity = *count as usize;
            *count = c_uint::try_from(live.len()).unwrap_or(c_uint::MAX);
            if live.len() > capacity || (infos.is_null() && !live.is_empty()) {
                return NVML_ERROR_INSUFFICIENT_SIZE;
            }
            for (k, (pid, used)) in live.into_iter().enumerate() {
                infos.add(k).write(make(pid, used));
            }
            NVML_SUCCESS
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    d: nvmlDevice_t,
    c: *mut c_uint,
    p: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    // SAFETY: forwarded caller pointers.
    unsafe {
        processes(d, c, p, |pid, used| nvmlProcessInfo_v1_t {
            pid,
            usedGpuMemory: used,
        })
    }
}

fn v2_info(pid: u32, used: u64) -> nvmlProcessInfo_t {
    nvmlProcessInfo_t {
        pid,
        usedGpuMemory: used,
        gpuInstanceId: u32::MAX,
        computeInstanceId: u32::MAX,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    d: nvmlDevice_t,
    c: *mut c_uint,
    p: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    // SAFETY: forwarded caller pointers.
    unsafe { processes(d, c, p, v2_info) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    d: nvmlDevice_t,
    c: *mut c_uint,
    p: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    // SAFETY: forwarded caller pointers.
    unsafe { processes(d, c, p, v2_info) }
}

/// What this process saw of another's kernel time, per (pid, start time, GPU index): at each
/// query, (CPU timestamp µs, monotonic ns, kernel time done by then). Utilization "since
/// lastSeenTimeStamp" is measured from the observation made at that timestamp.
type Seen =
    std::collections::HashMap<(u32, u64, usize), std::collections::VecDeque<(u64, u64, u64)>>;
static SEEN: Mutex<Option<Seen>> = Mutex::new(None);
const SEEN_KEPT: usize = 64;

fn realtime_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Recent SM utilization per process, from the kernel time the fake libcuda records (see
/// `procs`): one sample per process whose kernels kept the SMs busy since
/// `lastSeenTimeStamp` (or since this process first asked), `NVML_ERROR_NOT_FOUND` when
/// none did. Memory, encoder and decoder utilization are 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: nvmlDevice_t,
    utilization: *mut nvmlProcessUtilizationSample_t,
    count: *mut c_uint,
    last_seen: c_ulonglong,
) -> nvmlReturn_t {
    // SAFETY: the handle is checked; `count` and `utilization` are checked before use.
    unsafe {
        with_device(device, |l, i| {
            if count.is_null() {
                return NVML_ERROR_INVALID_ARGUMENT;
            }
            let running: Vec<procs::ProcUsage> = procs::live(&l.spec.state_dir)
                .into_iter()
                .filter(|p| p.busy.get(i).is_some_and(|b| b.launched_ns > 0))
                .collect();
            if utilization.is_null() || (*count as usize) < running.len() {
                *count = c_uint::try_from(running.len()).unwrap_or(c_uint::MAX);
                return NVML_ERROR_INSUFFICIENT_SIZE;
            }
            let (now_us, now_ns) = (realtime_us(), procs::monotonic_ns());
            let mut seen = SEEN
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let seen = seen.get_or_insert_with(Seen::new);
            let mut written = 0;
            for p in running {
                let done = p.busy[i].done_by(now_ns);
                let history = seen.entry((p.pid, p.start_time, i)).or_default();
                let since = history
                    .iter()
                    .rev()
                    .find(|(us, _, _)| *us <= last_seen)
                    .or_else(|| history.front())
                    .copied();
                history.push_back((now_us, now_ns, done));
                if history.len() > SEEN_KEPT {
                    history.pop_front();
                }
                let Some((_, then_ns, then_done)) = since else {
                    continue;
                };
                let elapsed = now_ns.saturating_sub(then_ns);
                let util = (done.saturating_sub(then_done).saturating_mul(100))
                    .checked_div(elapsed)
                    .unwrap_or(0)
                    .min(100);
                if util == 0 {
                    continue;
                }
                utilization
                    .add(written)
                    .write(nvmlProcessUtilizationSample_t {
                        pid: p.pid,
                        timeStamp: now_us,
                        smUtil: c_uint::try_from(util).unwrap_or(100),
                        memUtil: 0,
                        encUtil: 0,
                        decUtil: 0,
                    });
                written += 1;
            }
            *count = c_uint::try_from(written).unwrap_or(c_uint::MAX);
            if written == 0 {
                NVML_ERROR_NOT_FOUND
            } else {
                NVML_SUCCESS
            }
        })
    }
}
