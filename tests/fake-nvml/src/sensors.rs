//! What a GPU's sensors read: its temperature, power draw and limits, clocks and performance
//! state, as monitoring software asks for them (`nvidia-smi`, PyTorch's
//! `torch.cuda.temperature`/`power_draw`/`clock_rate`, exporters). The simulated GPU has no
//! sensors: the figures follow its SM utilization over the last sampling period, from idle to
//! busy, between bounds a data-center board keeps (30 to 75 °C; a quarter of the power limit
//! idle, the limit when busy), and its clocks stay at their most (as under load; a real GPU
//! clocks down when idle). The limits and clocks are the model's (`gpuslice_simnode::node`);
//! a GPU whose description has none answers `NVML_ERROR_NOT_SUPPORTED`, as a board without
//! that sensor does.

use std::ffi::c_uint;

use gpuslice_cuda_abi::nvml::{
    NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_SUPPORTED, NVML_SUCCESS, nvmlDevice_t, nvmlReturn_t,
};

use crate::{Loaded, last_period, with_device};

/// `NVML_TEMPERATURE_GPU`, the one sensor (`NVML_TEMPERATURE_COUNT` is 1).
const TEMPERATURE_GPU: c_uint = 0;
/// `NVML_CLOCK_GRAPHICS`, `_SM`, `_MEM`, `_VIDEO`.
const CLOCK_GRAPHICS: c_uint = 0;
const CLOCK_SM: c_uint = 1;
const CLOCK_MEM: c_uint = 2;
const CLOCK_VIDEO: c_uint = 3;

const IDLE_CELSIUS: u64 = 30;
const BUSY_CELSIUS: u64 = 75;

/// Writes `value(l, i)` to `out` for a device handle, `NOT_SUPPORTED` where it is None.
///
/// # Safety
/// `out` is null or points at a value the caller owns.
unsafe fn answer(
    device: nvmlDevice_t,
    out: *mut c_uint,
    value: impl FnOnce(&Loaded, usize) -> Result<Option<c_uint>, nvmlReturn_t>,
) -> nvmlReturn_t {
    // SAFETY: the handle is checked by with_device; `out` is checked for null.
    unsafe {
        with_device(device, |l, i| {
            if out.is_null() {
                return NVML_ERROR_INVALID_ARGUMENT;
            }
            match value(l, i) {
                Ok(Some(v)) => {
                    *out = v;
                    NVML_SUCCESS
                }
                Ok(None) => NVML_ERROR_NOT_SUPPORTED,
                Err(e) => e,
            }
        })
    }
}

/// `low` at idle to `high` at full utilization, in proportion.
fn between(l: &Loaded, i: usize, low: u64, high: u64) -> c_uint {
    let util = last_period(l, i).util;
    c_uint::try_from(low + (high.saturating_sub(low)) * util / 100).unwrap_or(c_uint::MAX)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensor: c_uint,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller passes its own out pointer.
    unsafe {
        answer(device, temp, |l, i| {
            if sensor != TEMPERATURE_GPU {
                return Err(NVML_ERROR_INVALID_ARGUMENT);
            }
            Ok(Some(between(l, i, IDLE_CELSIUS, BUSY_CELSIUS)))
        })
    }
}

/// The board's draw in milliwatts.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: nvmlDevice_t,
    power: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller passes its own out pointer.
    unsafe {
        answer(device, power, |l, i| {
            let limit = u64::from(l.spec.gpus[i].power_limit_mw);
            Ok((limit > 0).then(|| between(l, i, limit / 4, limit)))
        })
    }
}

fn power_limit(l: &Loaded, i: usize) -> Result<Option<c_uint>, nvmlReturn_t> {
    let limit = l.spec.gpus[i].power_limit_mw;
    Ok((limit > 0).then_some(limit))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(
    device: nvmlDevice_t,
    limit: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller passes its own out pointer.
    unsafe { answer(device, limit, power_limit) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimit(
    device: nvmlDevice_t,
    limit: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller passes its own out pointer.
    unsafe { answer(device, limit, power_limit) }
}

/// The most clock `kind` runs at on the device, in MHz (the video clock taken as the
/// graphics clock).
fn max_clock(l: &Loaded, i: usize, kind: c_uint) -> Result<Option<c_uint>, nvmlReturn_t> {
    let g = &l.spec.gpus[i];
    let mhz = match kind {
        CLOCK_GRAPHICS | CLOCK_SM | CLOCK_VIDEO => g.max_graphics_clock_mhz,
        CLOCK_MEM => g.max_memory_clock_mhz,
        _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
    };
    Ok((mhz > 0).then_some(mhz))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    device: nvmlDevice_t,
    kind: c_uint,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller passes its own out pointer.
    unsafe { answer(device, clock, |l, i| max_clock(l, i, kind)) }
}

/// The clock now: at its most, as under load.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: nvmlDevice_t,
    kind: c_uint,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller passes its own out pointer.
    unsafe { answer(device, clock, |l, i| max_clock(l, i, kind)) }
}

/// `NVML_PSTATE_0`, the most performance, where the clocks above run.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPerformanceState(
    device: nvmlDevice_t,
    state: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller passes its own out pointer.
    unsafe { answer(device, state, |_, _| Ok(Some(0))) }
}
