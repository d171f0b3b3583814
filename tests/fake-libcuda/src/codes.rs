//! `CUresult` values from cuda.h, and their names and descriptions.
#![allow(dead_code)]

use crate::CUresult;

pub use gpuslice_cuda_abi::cuda::{
    CU_GET_PROC_ADDRESS_SUCCESS, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, CUDA_ERROR_CONTEXT_IS_DESTROYED,
    CUDA_ERROR_DEINITIALIZED, CUDA_ERROR_FILE_NOT_FOUND, CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
    CUDA_ERROR_ILLEGAL_STATE, CUDA_ERROR_INVALID_CLUSTER_SIZE, CUDA_ERROR_INVALID_CONTEXT,
    CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_IMAGE,
    CUDA_ERROR_INVALID_PTX, CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,
    CUDA_ERROR_INVALID_RESOURCE_TYPE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NO_DEVICE,
    CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_NOT_READY,
    CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_OPERATING_SYSTEM, CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, CUDA_ERROR_PEER_ACCESS_NOT_ENABLED,
    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
    CUDA_ERROR_STREAM_CAPTURE_ISOLATION, CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUDA_ERROR_UNKNOWN,
    CUDA_ERROR_UNSUPPORTED_LIMIT, CUDA_SUCCESS,
};

#[must_use]
pub fn name(r: CUresult) -> Option<(&'static std::ffi::CStr, &'static std::ffi::CStr)> {
    Some(match r {
        CUDA_SUCCESS => (c"CUDA_SUCCESS", c"no error"),
        CUDA_ERROR_INVALID_VALUE => (c"CUDA_ERROR_INVALID_VALUE", c"invalid argument"),
        CUDA_ERROR_OUT_OF_MEMORY => (c"CUDA_ERROR_OUT_OF_MEMORY", c"out of memory"),
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED => (
            c"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
            c"operation not permitted when stream is capturing",
        ),
        CUDA_ERROR_STREAM_CAPTURE_INVALIDATED => (
            c"CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
            c"operation failed due to a previous error during capture",
        ),
        CUDA_ERROR_STREAM_CAPTURE_UNMATCHED => (
            c"CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
            c"operation would result in a merge of separate capture sequences",
        ),
        CUDA_ERROR_STREAM_CAPTURE_UNJOINED => (
            c"CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
            c"capture sequence contains a fork that was not joined to the primary stream",
        ),
        CUDA_ERROR_STREAM_CAPTURE_ISOLATION => (
            c"CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
            c"operation would make the legacy stream depend on a capturing blocking stream",
        ),
        CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE => (
            c"CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE",
            c"the graph update was not performed because it included changes which violated constraints specific to instantiated graph update",
        ),
        CUDA_ERROR_NOT_INITIALIZED => (c"CUDA_ERROR_NOT_INITIALIZED", c"initialization error"),
        CUDA_ERROR_DEINITIALIZED => (c"CUDA_ERROR_DEINITIALIZED", c"driver shutting down"),
        CUDA_ERROR_NO_DEVICE => (
            c"CUDA_ERROR_NO_DEVICE",
            c"no CUDA-capable device is detected",
        ),
        CUDA_ERROR_INVALID_DEVICE => (c"CUDA_ERROR_INVALID_DEVICE", c"invalid device ordinal"),
        CUDA_ERROR_INVALID_IMAGE => (
            c"CUDA_ERROR_INVALID_IMAGE",
            c"device kernel image is invalid",
        ),
        CUDA_ERROR_INVALID_CONTEXT => (c"CUDA_ERROR_INVALID_CONTEXT", c"invalid device context"),
        CUDA_ERROR_CONTEXT_IS_DESTROYED => {
            (c"CUDA_ERROR_CONTEXT_IS_DESTROYED", c"context is destroyed")
        }
        CUDA_ERROR_INVALID_HANDLE => (c"CUDA_ERROR_INVALID_HANDLE", c"invalid resource handle"),
        CUDA_ERROR_OPERATING_SYSTEM => (
            c"CUDA_ERROR_OPERATING_SYSTEM",
            c"OS call failed or operation not supported on this OS",
        ),
        CUDA_ERROR_ILLEGAL_STATE => (
            c"CUDA_ERROR_ILLEGAL_STATE",
            c"the operation cannot be performed in the present state",
        ),
        CUDA_ERROR_INVALID_CLUSTER_SIZE => (
            c"CUDA_ERROR_INVALID_CLUSTER_SIZE",
            c"invalid cluster size",
        ),
        CUDA_ERROR_UNSUPPORTED_LIMIT => (
            c"CUDA_ERROR_UNSUPPORTED_LIMIT",
            c"limit is not supported on this architecture",
        ),
        CUDA_ERROR_INVALID_RESOURCE_TYPE => (
            c"CUDA_ERROR_INVALID_RESOURCE_TYPE",
            c"invalid resource type",
        ),
        CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION => (
            c"CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION",
            c"invalid resource configuration",
        ),
        CUDA_ERROR_FILE_NOT_FOUND => (c"CUDA_ERROR_FILE_NOT_FOUND", c"file not found"),
        CUDA_ERROR_INVALID_PTX => (
            c"CUDA_ERROR_INVALID_PTX",
            c"a PTX JIT compilation failed",
        ),
        CUDA_ERROR_NOT_FOUND => (c"CUDA_ERROR_NOT_FOUND", c"named symbol not found"),
        CUDA_ERROR_NOT_READY => (c"CUDA_ERROR_NOT_READY", c"device not ready"),
        CUDA_ERROR_NOT_SUPPORTED => (c"CUDA_ERROR_NOT_SUPPORTED", c"operation not supported"),
        CUDA_ERROR_PEER_ACCESS_UNSUPPORTED => (
            c"CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
            c"peer access is not supported between these two devices",
        ),
        CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => (
            c"CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
            c"peer access is already enabled",
        ),
        CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED => (
            c"CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
            c"part or all of the requested memory range is already mapped",
        ),
        CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED => (
            c"CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
            c"pointer does not correspond to a registered memory region",
        ),
        CUDA_ERROR_PEER_ACCESS_NOT_ENABLED => (
            c"CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
            c"peer access has not been enabled",
        ),
        CUDA_ERROR_UNKNOWN => (c"CUDA_ERROR_UNKNOWN", c"unknown error"),
        _ => return None,
    })
}
