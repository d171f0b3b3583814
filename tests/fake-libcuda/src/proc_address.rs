//! `cuGetProcAddress`: the driver entry points by base name and the CUDA version that
//! introduced each versioned variant, as the CUDA runtime asks for them.

use std::ffi::c_void;

use crate::codes::{
    CU_GET_PROC_ADDRESS_SUCCESS, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
};

/// (base name, first CUDA version of this variant, entry point address).
type Entry = (&'static str, i32, usize);

/// Built once: lookups happen on every `cuGetProcAddress`.
static TABLE: std::sync::LazyLock<Vec<Entry>> = std::sync::LazyLock::new(build_table);

fn build_table() -> Vec<Entry> {
    macro_rules! e {
        ($base:literal, $ver:expr, $f:path) => {
            ($base, $ver, $f as *const () as usize)
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
        e!("cuCtxCreate", 11040, crate::cuCtxCreate_v3),
        e!("cuCtxCreate", 12050, crate::cuCtxCreate_v4),
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
        e!("cuMemAllocPitch", 3020, crate::paths::cuMemAllocPitch_v2),
        e!("cuMemAllocManaged", 6000, crate::paths::cuMemAllocManaged),
        e!(
            "cuDeviceGetDefaultMemPool",
            11020,
            crate::paths::cuDeviceGetDefaultMemPool
        ),
        e!("cuMemPoolCreate", 11020, crate::paths::cuMemPoolCreate),
        e!("cuMemPoolDestroy", 11020, crate::paths::cuMemPoolDestroy),
        e!("cuMemAllocAsync", 11020, crate::paths::cuMemAllocAsync),
        e!(
            "cuMemAllocAsync_ptsz",
            11020,
            crate::paths::cuMemAllocAsync_ptsz
        ),
        e!("cuMemFreeAsync", 11020, crate::paths::cuMemFreeAsync),
        e!(
            "cuMemFreeAsync_ptsz",
            11020,
            crate::paths::cuMemFreeAsync_ptsz
        ),
        e!(
            "cuMemAllocFromPoolAsync",
            11020,
            crate::paths::cuMemAllocFromPoolAsync
        ),
        e!(
            "cuMemAllocFromPoolAsync_ptsz",
            11020,
            crate::paths::cuMemAllocFromPoolAsync_ptsz
        ),
        e!(
            "cuArrayGetMemoryRequirements",
            11060,
            crate::paths::cuArrayGetMemoryRequirements
        ),
        e!(
            "cuMipmappedArrayGetMemoryRequirements",
            11060,
            crate::paths::cuMipmappedArrayGetMemoryRequirements
        ),
        e!("cuArrayCreate", 3020, crate::paths::cuArrayCreate_v2),
        e!("cuArray3DCreate", 3020, crate::paths::cuArray3DCreate_v2),
        e!("cuArrayDestroy", 2000, crate::paths::cuArrayDestroy),
        e!(
            "cuMipmappedArrayCreate",
            5000,
            crate::paths::cuMipmappedArrayCreate
        ),
        e!(
            "cuMipmappedArrayDestroy",
            5000,
            crate::paths::cuMipmappedArrayDestroy
        ),
        e!(
            "cuMemGetAllocationGranularity",
            10020,
            crate::paths::cuMemGetAllocationGranularity
        ),
        e!("cuMemCreate", 10020, crate::paths::cuMemCreate),
        e!("cuMemRelease", 10020, crate::paths::cuMemRelease),
        e!(
            "cuMemAddressReserve",
            10020,
            crate::paths::cuMemAddressReserve
        ),
        e!("cuMemAddressFree", 10020, crate::paths::cuMemAddressFree),
        e!("cuMemMap", 10020, crate::paths::cuMemMap),
        e!("cuMemUnmap", 10020, crate::paths::cuMemUnmap),
        e!("cuMemSetAccess", 10020, crate::paths::cuMemSetAccess),
        e!("cuStreamCreate", 2000, crate::paths::cuStreamCreate),
        e!("cuStreamDestroy", 4000, crate::paths::cuStreamDestroy_v2),
        e!(
            "cuStreamSynchronize",
            2000,
            crate::paths::cuStreamSynchronize
        ),
        e!("cuModuleLoadData", 2000, crate::paths::cuModuleLoadData),
        e!("cuModuleUnload", 2000, crate::paths::cuModuleUnload),
        e!(
            "cuModuleGetFunction",
            2000,
            crate::paths::cuModuleGetFunction
        ),
        e!("cuLaunchKernel", 4000, crate::paths::cuLaunchKernel),
        e!(
            "cuLaunchKernel_ptsz",
            7000,
            crate::paths::cuLaunchKernel_ptsz
        ),
        e!(
            "cuLaunchCooperativeKernel",
            9000,
            crate::paths::cuLaunchCooperativeKernel
        ),
        e!(
            "cuLaunchCooperativeKernel_ptsz",
            9000,
            crate::paths::cuLaunchCooperativeKernel_ptsz
        ),
        e!("cuLaunchKernelEx", 11060, crate::paths::cuLaunchKernelEx),
        e!(
            "cuLaunchKernelEx_ptsz",
            11060,
            crate::paths::cuLaunchKernelEx_ptsz
        ),
        e!("cuGetProcAddress", 11030, crate::cuGetProcAddress),
        e!("cuGetProcAddress", 12000, crate::cuGetProcAddress_v2),
    ]
}

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
pub const PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;

/// The newest variant of `name` no newer than `cuda_version`, and the
/// `CUdriverProcAddressQueryResult` to report. With the per-thread default-stream flag, the
/// `_ptsz`/`_ptds` variant is returned where the driver has one, as the real driver does.
pub fn lookup(name: &str, cuda_version: i32, flags: u64) -> (Option<*mut c_void>, i32) {
    let table: &[Entry] = &TABLE;
    if flags & PER_THREAD_DEFAULT_STREAM != 0 {
        for suffix in ["_ptsz", "_ptds"] {
            let variant = format!("{name}{suffix}");
            if let Some((_, _, f)) = table
                .iter()
                .filter(|(n, v, _)| *n == variant && *v <= cuda_version)
                .max_by_key(|(_, v, _)| *v)
            {
                return (Some(*f as *mut c_void), CU_GET_PROC_ADDRESS_SUCCESS);
            }
        }
    }
    let entries: Vec<&Entry> = table.iter().filter(|(n, _, _)| *n == name).collect();
    if entries.is_empty() {
        return (None, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    }
    match entries
        .iter()
        .filter(|(_, v, _)| *v <= cuda_version)
        .max_by_key(|(_, v, _)| *v)
    {
        Some((_, _, f)) => (Some(*f as *mut c_void), CU_GET_PROC_ADDRESS_SUCCESS),
        None => (None, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT),
    }
}
