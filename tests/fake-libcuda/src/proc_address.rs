//! `cuGetProcAddress`: the driver entry points by base name and the CUDA version that
//! introduced each versioned variant, as the CUDA runtime asks for them.

use std::ffi::c_void;

use crate::codes::{
    CU_GET_PROC_ADDRESS_SUCCESS, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
};

/// (base name, first CUDA version of this variant, entry point).
fn table() -> Vec<(&'static str, i32, *mut c_void)> {
    macro_rules! e {
        ($base:literal, $ver:expr, $f:path) => {
            ($base, $ver, $f as *mut c_void)
        };
    }
    vec![
        e!("cuInit", 2000, crate::cuInit),
        e!("cuDriverGetVersion", 2020, crate::cuDriverGetVersion),
        e!("cuDeviceGetCount", 2000, crate::cuDeviceGetCount),
        e!("cuDeviceGet", 2000, crate::cuDeviceGet),
        e!("cuDeviceGetName", 2000, crate::cuDeviceGetName),
        e!("cuDeviceGetUuid", 9020, crate::cuDeviceGetUuid),
        e!("cuDeviceGetUuid", 11040, crate::cuDeviceGetUuid_v2),
        e!("cuDeviceTotalMem", 3020, crate::cuDeviceTotalMem_v2),
        e!("cuDeviceGetAttribute", 2000, crate::cuDeviceGetAttribute),
        e!("cuDeviceGetPCIBusId", 4010, crate::cuDeviceGetPCIBusId),
        e!(
            "cuDevicePrimaryCtxRetain",
            7000,
            crate::cuDevicePrimaryCtxRetain
        ),
        e!(
            "cuDevicePrimaryCtxRelease",
            7000,
            crate::cuDevicePrimaryCtxRelease
        ),
        e!(
            "cuDevicePrimaryCtxRelease",
            11000,
            crate::cuDevicePrimaryCtxRelease_v2
        ),
        e!("cuCtxCreate", 3020, crate::cuCtxCreate_v2),
        e!("cuCtxDestroy", 4000, crate::cuCtxDestroy_v2),
        e!("cuCtxSetCurrent", 4000, crate::cuCtxSetCurrent),
        e!("cuCtxGetCurrent", 4000, crate::cuCtxGetCurrent),
        e!("cuCtxGetDevice", 2000, crate::cuCtxGetDevice),
        e!("cuCtxSynchronize", 2000, crate::cuCtxSynchronize),
        e!("cuMemAlloc", 3020, crate::cuMemAlloc_v2),
        e!("cuMemFree", 3020, crate::cuMemFree_v2),
        e!("cuMemGetInfo", 3020, crate::cuMemGetInfo_v2),
        e!("cuMemcpyHtoD", 3020, crate::cuMemcpyHtoD_v2),
        e!("cuMemcpyDtoH", 3020, crate::cuMemcpyDtoH_v2),
        e!("cuMemsetD8", 3020, crate::cuMemsetD8_v2),
        e!("cuGetErrorName", 6000, crate::cuGetErrorName),
        e!("cuGetErrorString", 6000, crate::cuGetErrorString),
        e!("cuGetProcAddress", 11030, crate::cuGetProcAddress),
        e!("cuGetProcAddress", 12000, crate::cuGetProcAddress_v2),
    ]
}

/// The newest variant of `name` no newer than `cuda_version`, and the
/// `CUdriverProcAddressQueryResult` to report. The per-thread default-stream flag selects
/// the same entry points here: none of the simulated functions take a stream.
pub fn lookup(name: &str, cuda_version: i32, _flags: u64) -> (Option<*mut c_void>, i32) {
    let entries: Vec<_> = table().into_iter().filter(|(n, _, _)| *n == name).collect();
    if entries.is_empty() {
        return (None, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    }
    match entries
        .iter()
        .filter(|(_, v, _)| *v <= cuda_version)
        .max_by_key(|(_, v, _)| *v)
    {
        Some((_, _, f)) => (Some(*f), CU_GET_PROC_ADDRESS_SUCCESS),
        None => (None, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT),
    }
}
