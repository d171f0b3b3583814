//! Every declaration of this crate against NVIDIA's headers: for each size, field offset and
//! constant, a C program built with the real `cuda.h` and `nvml.h` prints the header's value
//! and the test compares it with the Rust one. Headers: CUDA 13.0 and 12.9 (NVIDIA's wheels)
//! and Debian's CUDA 11.8, from `scripts/reference-driver`'s cache.

use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;

use gpuslice_cuda_abi::cuda::*;
use gpuslice_cuda_abi::nvml::*;

/// A C expression, the value Rust has for it, and the first CUDA version whose headers have it.
struct Check {
    c: String,
    rust: i128,
    since: u32,
}

fn checks() -> Vec<Check> {
    let mut v = Vec::new();
    let mut add = |c: &str, rust: i128, since: u32| {
        v.push(Check {
            c: c.to_string(),
            rust,
            since,
        });
    };
    macro_rules! size {
        ($t:ident) => {
            add(
                concat!("sizeof(", stringify!($t), ")"),
                size_of::<$t>() as i128,
                11080,
            )
        };
        ($t:ident, $since:expr) => {
            add(
                concat!("sizeof(", stringify!($t), ")"),
                size_of::<$t>() as i128,
                $since,
            )
        };
    }
    macro_rules! field {
        ($t:ident, $rust:ident, $c:literal) => {
            add(
                concat!("offsetof(", stringify!($t), ", ", $c, ")"),
                offset_of!($t, $rust) as i128,
                11080,
            )
        };
        ($t:ident, $rust:ident, $c:literal, $since:expr) => {
            add(
                concat!("offsetof(", stringify!($t), ", ", $c, ")"),
                offset_of!($t, $rust) as i128,
                $since,
            )
        };
    }
    macro_rules! constant {
        ($name:ident) => {
            add(stringify!($name), $name as i128, 11080)
        };
        ($name:ident, $since:expr) => {
            add(stringify!($name), $name as i128, $since)
        };
    }
    // Handles and scalars.
    for (c, rust) in [
        ("sizeof(CUresult)", size_of::<CUresult>()),
        ("sizeof(CUdevice)", size_of::<CUdevice>()),
        ("sizeof(CUdeviceptr)", size_of::<CUdeviceptr>()),
        ("sizeof(CUcontext)", size_of::<CUcontext>()),
        ("sizeof(CUstream)", size_of::<CUstream>()),
        ("sizeof(CUevent)", size_of::<CUevent>()),
        ("sizeof(CUmemoryPool)", size_of::<CUmemoryPool>()),
        ("sizeof(CUarray)", size_of::<CUarray>()),
        ("sizeof(CUmipmappedArray)", size_of::<CUmipmappedArray>()),
        ("sizeof(CUmodule)", size_of::<CUmodule>()),
        ("sizeof(CUfunction)", size_of::<CUfunction>()),
        ("sizeof(CUgraph)", size_of::<CUgraph>()),
        ("sizeof(CUgraphExec)", size_of::<CUgraphExec>()),
        ("sizeof(CUgraphNode)", size_of::<CUgraphNode>()),
        (
            "sizeof(CUmemGenericAllocationHandle)",
            size_of::<CUmemGenericAllocationHandle>(),
        ),
        ("sizeof(nvmlReturn_t)", size_of::<nvmlReturn_t>()),
        ("sizeof(nvmlDevice_t)", size_of::<nvmlDevice_t>()),
    ] {
        add(c, rust as i128, 11080);
    }
    size!(CUuuid);
    field!(CUuuid, bytes, "bytes");
    size!(CUipcMemHandle);
    field!(CUipcMemHandle, reserved, "reserved");
    size!(CUipcEventHandle);
    field!(CUipcEventHandle, reserved, "reserved");
    size!(CUDA_ARRAY_DESCRIPTOR);
    field!(CUDA_ARRAY_DESCRIPTOR, width, "Width");
    field!(CUDA_ARRAY_DESCRIPTOR, height, "Height");
    field!(CUDA_ARRAY_DESCRIPTOR, format, "Format");
    field!(CUDA_ARRAY_DESCRIPTOR, num_channels, "NumChannels");
    size!(CUDA_ARRAY3D_DESCRIPTOR);
    field!(CUDA_ARRAY3D_DESCRIPTOR, width, "Width");
    field!(CUDA_ARRAY3D_DESCRIPTOR, height, "Height");
    field!(CUDA_ARRAY3D_DESCRIPTOR, depth, "Depth");
    field!(CUDA_ARRAY3D_DESCRIPTOR, format, "Format");
    field!(CUDA_ARRAY3D_DESCRIPTOR, num_channels, "NumChannels");
    field!(CUDA_ARRAY3D_DESCRIPTOR, flags, "Flags");
    size!(CUDA_ARRAY_MEMORY_REQUIREMENTS);
    field!(CUDA_ARRAY_MEMORY_REQUIREMENTS, size, "size");
    field!(CUDA_ARRAY_MEMORY_REQUIREMENTS, alignment, "alignment");
    field!(CUDA_ARRAY_MEMORY_REQUIREMENTS, reserved, "reserved");
    size!(CUmemLocation);
    field!(CUmemLocation, typ, "type");
    field!(CUmemLocation, id, "id");
    size!(CUmemAccessDesc);
    field!(CUmemAccessDesc, location, "location");
    field!(CUmemAccessDesc, flags, "flags");
    // The shared head of the two property structs.
    for (t, typ, handle_types) in [
        ("CUmemAllocationProp", "type", "requestedHandleTypes"),
        ("CUmemPoolProps", "allocType", "handleTypes"),
    ] {
        add(
            &format!("offsetof({t}, {typ})"),
            offset_of!(CUmemPropHead, typ) as i128,
            11080,
        );
        add(
            &format!("offsetof({t}, {handle_types})"),
            offset_of!(CUmemPropHead, handle_types) as i128,
            11080,
        );
        add(
            &format!("offsetof({t}, location)"),
            offset_of!(CUmemPropHead, location) as i128,
            11080,
        );
    }
    size!(CUmemAllocationProp);
    field!(CUmemAllocationProp, head, "type");
    field!(
        CUmemAllocationProp,
        win32_handle_meta_data,
        "win32HandleMetaData"
    );
    field!(CUmemAllocationProp, alloc_flags, "allocFlags");
    size!(CUmemPoolProps);
    field!(CUmemPoolProps, head, "allocType");
    field!(
        CUmemPoolProps,
        win32_security_attributes,
        "win32SecurityAttributes"
    );
    size!(CUDA_MEM_ALLOC_NODE_PARAMS);
    field!(CUDA_MEM_ALLOC_NODE_PARAMS, pool_props, "poolProps");
    field!(CUDA_MEM_ALLOC_NODE_PARAMS, access_descs, "accessDescs");
    field!(
        CUDA_MEM_ALLOC_NODE_PARAMS,
        access_desc_count,
        "accessDescCount"
    );
    field!(CUDA_MEM_ALLOC_NODE_PARAMS, bytesize, "bytesize");
    field!(CUDA_MEM_ALLOC_NODE_PARAMS, dptr, "dptr");
    size!(CUDA_KERNEL_NODE_PARAMS_v2, 12000);
    field!(CUDA_KERNEL_NODE_PARAMS_v2, func, "func", 12000);
    field!(CUDA_KERNEL_NODE_PARAMS_v2, grid_dim_x, "gridDimX", 12000);
    field!(CUDA_KERNEL_NODE_PARAMS_v2, grid_dim_y, "gridDimY", 12000);
    field!(CUDA_KERNEL_NODE_PARAMS_v2, grid_dim_z, "gridDimZ", 12000);
    field!(CUDA_KERNEL_NODE_PARAMS_v2, block_dim_x, "blockDimX", 12000);
    field!(CUDA_KERNEL_NODE_PARAMS_v2, block_dim_y, "blockDimY", 12000);
    field!(CUDA_KERNEL_NODE_PARAMS_v2, block_dim_z, "blockDimZ", 12000);
    field!(
        CUDA_KERNEL_NODE_PARAMS_v2,
        shared_mem_bytes,
        "sharedMemBytes",
        12000
    );
    field!(
        CUDA_KERNEL_NODE_PARAMS_v2,
        kernel_params,
        "kernelParams",
        12000
    );
    field!(CUDA_KERNEL_NODE_PARAMS_v2, extra, "extra", 12000);
    field!(CUDA_KERNEL_NODE_PARAMS_v2, kern, "kern", 12000);
    field!(CUDA_KERNEL_NODE_PARAMS_v2, ctx, "ctx", 12000);
    // The v1 structure (CUDA 11.8's only one) is the v2 one up to `extra`.
    add(
        "sizeof(CUDA_KERNEL_NODE_PARAMS_v1)",
        offset_of!(CUDA_KERNEL_NODE_PARAMS_v2, kern) as i128,
        12000,
    );
    add(
        "offsetof(CUDA_KERNEL_NODE_PARAMS, extra)",
        offset_of!(CUDA_KERNEL_NODE_PARAMS_v2, extra) as i128,
        11080,
    );
    size!(CUgraphExecUpdateResultInfo, 12000);
    field!(CUgraphExecUpdateResultInfo, result, "result", 12000);
    field!(CUgraphExecUpdateResultInfo, error_node, "errorNode", 12000);
    field!(
        CUgraphExecUpdateResultInfo,
        error_from_node,
        "errorFromNode",
        12000
    );
    size!(CUDA_GRAPH_INSTANTIATE_PARAMS, 12000);
    field!(CUDA_GRAPH_INSTANTIATE_PARAMS, flags, "flags", 12000);
    field!(
        CUDA_GRAPH_INSTANTIATE_PARAMS,
        upload_stream,
        "hUploadStream",
        12000
    );
    field!(
        CUDA_GRAPH_INSTANTIATE_PARAMS,
        error_node,
        "hErrNode_out",
        12000
    );
    field!(CUDA_GRAPH_INSTANTIATE_PARAMS, result, "result_out", 12000);
    add(
        "offsetof(CUgraphNodeParams, type)",
        offset_of!(CUgraphNodeParamsHead, typ) as i128,
        12020,
    );
    for (member, since) in [
        ("kernel", 12020),
        ("memset", 12020),
        ("graph", 12020),
        ("conditional", 12030),
    ] {
        add(
            &format!("offsetof(CUgraphNodeParams, {member})"),
            CU_GRAPH_NODE_PARAMS_UNION_OFFSET as i128,
            since,
        );
    }
    field!(CUDA_CHILD_GRAPH_NODE_PARAMS, graph, "graph", 12020);
    size!(CUDA_MEMSET_NODE_PARAMS);
    field!(CUDA_MEMSET_NODE_PARAMS, dst, "dst");
    field!(CUDA_MEMSET_NODE_PARAMS, pitch, "pitch");
    field!(CUDA_MEMSET_NODE_PARAMS, value, "value");
    field!(CUDA_MEMSET_NODE_PARAMS, element_size, "elementSize");
    field!(CUDA_MEMSET_NODE_PARAMS, width, "width");
    field!(CUDA_MEMSET_NODE_PARAMS, height, "height");
    for (c, rust) in [
        ("dst", offset_of!(CUDA_MEMSET_NODE_PARAMS, dst)),
        ("pitch", offset_of!(CUDA_MEMSET_NODE_PARAMS, pitch)),
        ("value", offset_of!(CUDA_MEMSET_NODE_PARAMS, value)),
        (
            "elementSize",
            offset_of!(CUDA_MEMSET_NODE_PARAMS, element_size),
        ),
        ("width", offset_of!(CUDA_MEMSET_NODE_PARAMS, width)),
        ("height", offset_of!(CUDA_MEMSET_NODE_PARAMS, height)),
    ] {
        // The v2 parameters, which CUgraphNodeParams holds, begin as v1 does.
        add(
            &format!("offsetof(CUDA_MEMSET_NODE_PARAMS_v2, {c})"),
            rust as i128,
            12020,
        );
    }
    add(
        "sizeof(CUgraphNodeParams)",
        CU_GRAPH_NODE_PARAMS_SIZE as i128,
        12020,
    );
    size!(CUDA_CONDITIONAL_NODE_PARAMS, 12030);
    field!(CUDA_CONDITIONAL_NODE_PARAMS, handle, "handle", 12030);
    field!(CUDA_CONDITIONAL_NODE_PARAMS, typ, "type", 12030);
    field!(CUDA_CONDITIONAL_NODE_PARAMS, size, "size", 12030);
    field!(CUDA_CONDITIONAL_NODE_PARAMS, graphs, "phGraph_out", 12030);
    field!(CUDA_CONDITIONAL_NODE_PARAMS, ctx, "ctx", 12030);
    add(
        "sizeof(CUgraphConditionalHandle)",
        size_of::<u64>() as i128,
        12030,
    );
    add(
        "sizeof(CUDA_KERNEL_NODE_PARAMS_v3)",
        size_of::<CUDA_KERNEL_NODE_PARAMS_v2>() as i128,
        12020,
    );
    constant!(CU_MEMORYTYPE_HOST);
    constant!(CU_MEMORYTYPE_DEVICE);
    constant!(CU_MEMORYTYPE_ARRAY);
    constant!(CU_MEMORYTYPE_UNIFIED);
    size!(CUDA_MEMCPY3D);
    field!(CUDA_MEMCPY3D, src_x_in_bytes, "srcXInBytes");
    field!(CUDA_MEMCPY3D, src_y, "srcY");
    field!(CUDA_MEMCPY3D, src_z, "srcZ");
    field!(CUDA_MEMCPY3D, src_lod, "srcLOD");
    field!(CUDA_MEMCPY3D, src_memory_type, "srcMemoryType");
    field!(CUDA_MEMCPY3D, src_host, "srcHost");
    field!(CUDA_MEMCPY3D, src_device, "srcDevice");
    field!(CUDA_MEMCPY3D, src_array, "srcArray");
    field!(CUDA_MEMCPY3D, reserved0, "reserved0");
    field!(CUDA_MEMCPY3D, src_pitch, "srcPitch");
    field!(CUDA_MEMCPY3D, src_height, "srcHeight");
    field!(CUDA_MEMCPY3D, dst_x_in_bytes, "dstXInBytes");
    field!(CUDA_MEMCPY3D, dst_y, "dstY");
    field!(CUDA_MEMCPY3D, dst_z, "dstZ");
    field!(CUDA_MEMCPY3D, dst_lod, "dstLOD");
    field!(CUDA_MEMCPY3D, dst_memory_type, "dstMemoryType");
    field!(CUDA_MEMCPY3D, dst_host, "dstHost");
    field!(CUDA_MEMCPY3D, dst_device, "dstDevice");
    field!(CUDA_MEMCPY3D, dst_array, "dstArray");
    field!(CUDA_MEMCPY3D, reserved1, "reserved1");
    field!(CUDA_MEMCPY3D, dst_pitch, "dstPitch");
    field!(CUDA_MEMCPY3D, dst_height, "dstHeight");
    field!(CUDA_MEMCPY3D, width_in_bytes, "WidthInBytes");
    field!(CUDA_MEMCPY3D, height, "Height");
    field!(CUDA_MEMCPY3D, depth, "Depth");
    size!(CUDA_MEMCPY2D);
    field!(CUDA_MEMCPY2D, src_x_in_bytes, "srcXInBytes");
    field!(CUDA_MEMCPY2D, src_y, "srcY");
    field!(CUDA_MEMCPY2D, src_memory_type, "srcMemoryType");
    field!(CUDA_MEMCPY2D, src_host, "srcHost");
    field!(CUDA_MEMCPY2D, src_device, "srcDevice");
    field!(CUDA_MEMCPY2D, src_array, "srcArray");
    field!(CUDA_MEMCPY2D, src_pitch, "srcPitch");
    field!(CUDA_MEMCPY2D, dst_x_in_bytes, "dstXInBytes");
    field!(CUDA_MEMCPY2D, dst_y, "dstY");
    field!(CUDA_MEMCPY2D, dst_memory_type, "dstMemoryType");
    field!(CUDA_MEMCPY2D, dst_host, "dstHost");
    field!(CUDA_MEMCPY2D, dst_device, "dstDevice");
    field!(CUDA_MEMCPY2D, dst_array, "dstArray");
    field!(CUDA_MEMCPY2D, dst_pitch, "dstPitch");
    field!(CUDA_MEMCPY2D, width_in_bytes, "WidthInBytes");
    field!(CUDA_MEMCPY2D, height, "Height");
    size!(CUlaunchConfig, 12000);
    field!(CUlaunchConfig, grid_dim_x, "gridDimX", 12000);
    field!(CUlaunchConfig, grid_dim_y, "gridDimY", 12000);
    field!(CUlaunchConfig, grid_dim_z, "gridDimZ", 12000);
    field!(CUlaunchConfig, block_dim_x, "blockDimX", 12000);
    field!(CUlaunchConfig, block_dim_y, "blockDimY", 12000);
    field!(CUlaunchConfig, block_dim_z, "blockDimZ", 12000);
    field!(CUlaunchConfig, shared_mem_bytes, "sharedMemBytes", 12000);
    field!(CUlaunchConfig, stream, "hStream", 12000);
    field!(CUlaunchConfig, attrs, "attrs", 12000);
    field!(CUlaunchConfig, num_attrs, "numAttrs", 12000);
    size!(CUDA_LAUNCH_PARAMS);
    field!(CUDA_LAUNCH_PARAMS, function, "function");
    field!(CUDA_LAUNCH_PARAMS, grid_dim_x, "gridDimX");
    field!(CUDA_LAUNCH_PARAMS, grid_dim_z, "gridDimZ");
    field!(CUDA_LAUNCH_PARAMS, block_dim_x, "blockDimX");
    field!(CUDA_LAUNCH_PARAMS, block_dim_z, "blockDimZ");
    field!(CUDA_LAUNCH_PARAMS, shared_mem_bytes, "sharedMemBytes");
    field!(CUDA_LAUNCH_PARAMS, stream, "hStream");
    field!(CUDA_LAUNCH_PARAMS, kernel_params, "kernelParams");
    constant!(CUDA_SUCCESS);
    constant!(CUDA_ERROR_INVALID_VALUE);
    constant!(CUDA_ERROR_OUT_OF_MEMORY);
    constant!(CUDA_ERROR_NOT_INITIALIZED);
    constant!(CUDA_ERROR_DEINITIALIZED);
    constant!(CUDA_ERROR_NO_DEVICE);
    constant!(CUDA_ERROR_INVALID_DEVICE);
    constant!(CUDA_ERROR_INVALID_IMAGE);
    constant!(CUDA_ERROR_INVALID_CONTEXT);
    constant!(CUDA_ERROR_UNSUPPORTED_LIMIT);
    constant!(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
    constant!(CUDA_ERROR_MAP_FAILED);
    constant!(CU_IPC_HANDLE_SIZE);
    constant!(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    constant!(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
    constant!(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    constant!(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    constant!(CU_MEMHOSTALLOC_PORTABLE);
    constant!(CU_MEMHOSTALLOC_DEVICEMAP);
    constant!(CU_MEMHOSTALLOC_WRITECOMBINED);
    constant!(CU_MEMHOSTREGISTER_PORTABLE);
    constant!(CU_MEMHOSTREGISTER_DEVICEMAP);
    constant!(CU_MEMHOSTREGISTER_IOMEMORY);
    constant!(CU_MEMHOSTREGISTER_READ_ONLY);
    constant!(CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK);
    constant!(CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED);
    constant!(CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED);
    constant!(CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED);
    constant!(CUDA_ERROR_INVALID_HANDLE);
    constant!(CUDA_ERROR_NOT_FOUND);
    constant!(CUDA_ERROR_NOT_READY);
    constant!(CUDA_ERROR_CONTEXT_IS_DESTROYED);
    constant!(CUDA_ERROR_NOT_SUPPORTED);
    constant!(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    constant!(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    constant!(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
    constant!(CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
    constant!(CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
    constant!(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE);
    constant!(CU_GRAPH_EXEC_UPDATE_SUCCESS);
    constant!(CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED);
    constant!(CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED);
    constant!(CUDA_ERROR_UNKNOWN);
    constant!(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
    constant!(CU_DEVICE_ATTRIBUTE_WARP_SIZE);
    constant!(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    constant!(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
    constant!(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID);
    constant!(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID);
    constant!(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    constant!(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    constant!(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED);
    constant!(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_HANDLE_SUPPORTED);
    constant!(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED);
    constant!(CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES);
    constant!(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED);
    constant!(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 12030);
    constant!(CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, 12010);
    constant!(CU_MEM_LOCATION_TYPE_DEVICE);
    constant!(CU_MEM_LOCATION_TYPE_HOST, 12020);
    constant!(CU_MEM_LOCATION_TYPE_HOST_NUMA, 12020);
    constant!(CU_GET_PROC_ADDRESS_LEGACY_STREAM);
    constant!(CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    constant!(CU_GET_PROC_ADDRESS_SUCCESS, 12000);
    constant!(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, 12000);
    constant!(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, 12000);
    constant!(CU_GRAPH_NODE_TYPE_KERNEL);
    constant!(CU_GRAPH_NODE_TYPE_MEMSET);
    constant!(CU_GRAPH_NODE_TYPE_HOST);
    constant!(CU_GRAPH_NODE_TYPE_GRAPH);
    constant!(CU_GRAPH_NODE_TYPE_EMPTY);
    constant!(CU_GRAPH_NODE_TYPE_MEM_ALLOC);
    constant!(CU_GRAPH_NODE_TYPE_MEM_FREE);
    constant!(CU_GRAPH_NODE_TYPE_CONDITIONAL, 12030);
    constant!(CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE, 12040);
    size!(CUlaunchAttributeValue, 12000);
    add(
        "offsetof(CUlaunchAttributeValue, deviceUpdatableKernelNode.deviceUpdatable)",
        0,
        12040,
    );
    constant!(CU_GRAPH_COND_TYPE_IF, 12030);
    constant!(CU_GRAPH_COND_TYPE_WHILE, 12030);
    constant!(CU_GRAPH_COND_TYPE_SWITCH, 12080);
    constant!(CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    constant!(CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD, 12000);
    constant!(CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH, 12000);
    constant!(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT);
    constant!(CU_GRAPH_MEM_ATTR_USED_MEM_HIGH);
    constant!(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT);
    constant!(CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH);
    constant!(CU_MEM_ALLOCATION_TYPE_PINNED);
    constant!(CU_MEM_ALLOCATION_TYPE_MANAGED, 13000);
    constant!(CU_STREAM_CAPTURE_STATUS_ACTIVE);
    constant!(CU_STREAM_CAPTURE_MODE_RELAXED);
    constant!(CU_EVENT_BLOCKING_SYNC);
    constant!(CU_EVENT_DISABLE_TIMING);
    constant!(CUDA_ERROR_FILE_NOT_FOUND);
    constant!(CUDA_ERROR_INVALID_RESOURCE_TYPE, 12040);
    constant!(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, 12040);
    constant!(CU_DEV_RESOURCE_TYPE_SM, 12040);
    constant!(CU_GREEN_CTX_DEFAULT_STREAM, 12040);
    size!(CUdevResource, 12040);
    field!(CUdevResource, type_, "type", 12040);
    field!(CUdevResource, sm_count, "sm.smCount", 12040);
    // NVML.
    constant!(NVML_SUCCESS);
    constant!(NVML_ERROR_UNINITIALIZED);
    constant!(NVML_ERROR_INVALID_ARGUMENT);
    constant!(NVML_ERROR_NOT_SUPPORTED);
    constant!(NVML_ERROR_NOT_FOUND);
    constant!(NVML_ERROR_INSUFFICIENT_SIZE);
    constant!(NVML_ERROR_DRIVER_NOT_LOADED);
    constant!(NVML_ERROR_UNKNOWN);
    constant!(NVML_TOPOLOGY_INTERNAL);
    constant!(NVML_TOPOLOGY_SINGLE);
    constant!(NVML_TOPOLOGY_MULTIPLE);
    constant!(NVML_TOPOLOGY_HOSTBRIDGE);
    constant!(NVML_TOPOLOGY_NODE);
    constant!(NVML_TOPOLOGY_SYSTEM);
    constant!(NVML_FEATURE_DISABLED);
    constant!(NVML_FEATURE_ENABLED);
    constant!(NVML_NVLINK_MAX_LINKS);
    size!(nvmlMemory_t);
    field!(nvmlMemory_t, total, "total");
    field!(nvmlMemory_t, free, "free");
    field!(nvmlMemory_t, used, "used");
    size!(nvmlMemory_v2_t);
    field!(nvmlMemory_v2_t, version, "version");
    field!(nvmlMemory_v2_t, total, "total");
    field!(nvmlMemory_v2_t, reserved, "reserved");
    field!(nvmlMemory_v2_t, free, "free");
    field!(nvmlMemory_v2_t, used, "used");
    size!(nvmlPciInfo_t);
    field!(nvmlPciInfo_t, bus_id_legacy, "busIdLegacy");
    field!(nvmlPciInfo_t, domain, "domain");
    field!(nvmlPciInfo_t, bus, "bus");
    field!(nvmlPciInfo_t, device, "device");
    field!(nvmlPciInfo_t, pci_device_id, "pciDeviceId");
    field!(nvmlPciInfo_t, pci_sub_system_id, "pciSubSystemId");
    field!(nvmlPciInfo_t, bus_id, "busId");
    size!(nvmlUtilization_t);
    field!(nvmlUtilization_t, gpu, "gpu");
    field!(nvmlUtilization_t, memory, "memory");
    size!(nvmlProcessInfo_v1_t);
    field!(nvmlProcessInfo_v1_t, pid, "pid");
    field!(nvmlProcessInfo_v1_t, used_gpu_memory, "usedGpuMemory");
    size!(nvmlProcessInfo_t);
    field!(nvmlProcessInfo_t, pid, "pid");
    field!(nvmlProcessInfo_t, used_gpu_memory, "usedGpuMemory");
    field!(nvmlProcessInfo_t, gpu_instance_id, "gpuInstanceId");
    field!(nvmlProcessInfo_t, compute_instance_id, "computeInstanceId");
    size!(nvmlProcessUtilizationSample_t);
    field!(nvmlProcessUtilizationSample_t, pid, "pid");
    field!(nvmlProcessUtilizationSample_t, time_stamp, "timeStamp");
    field!(nvmlProcessUtilizationSample_t, sm_util, "smUtil");
    field!(nvmlProcessUtilizationSample_t, mem_util, "memUtil");
    field!(nvmlProcessUtilizationSample_t, enc_util, "encUtil");
    field!(nvmlProcessUtilizationSample_t, dec_util, "decUtil");
    v
}

fn reference_dir() -> PathBuf {
    let dir = std::env::var_os("GPUSLICE_REFERENCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(&std::env::var_os("HOME").unwrap()).join(".cache/gpuslice/reference")
        });
    assert!(
        ["driver", "cuda12", "cuda13"]
            .iter()
            .all(|d| dir.join(d).join(".done").exists()),
        "{} lacks NVIDIA's headers: run scripts/reference-driver (scripts/test does)",
        dir.display()
    );
    dir
}

/// Builds and runs a program printing each check's C expression as the headers in
/// `include` evaluate it; returns (expression, value) pairs.
fn header_values(include: &[PathBuf], version: u32, work: &Path) -> Vec<(String, i128)> {
    let mut src = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <cuda.h>\n#include <nvml.h>\nint main(void) {\n",
    );
    for c in checks().iter().filter(|c| c.since <= version) {
        src.push_str(&format!(
            "    printf(\"%s=%lld\\n\", \"{0}\", (long long)({0}));\n",
            c.c
        ));
    }
    src.push_str("    return 0;\n}\n");
    let c_file = work.join(format!("layout{version}.c"));
    let exe = work.join(format!("layout{version}"));
    std::fs::write(&c_file, src).unwrap();
    let mut gcc = Command::new("gcc");
    for dir in include {
        gcc.arg("-I").arg(dir);
    }
    let out = gcc.arg("-o").arg(&exe).arg(&c_file).output().unwrap();
    assert!(
        out.status.success(),
        "the declarations do not compile against the CUDA {version} headers: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    String::from_utf8_lossy(&run.stdout)
        .lines()
        .filter_map(|l| l.rsplit_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
        .collect()
}

fn compare(include: &[PathBuf], version: u32) {
    let work = tempfile::tempdir().unwrap();
    let values = header_values(include, version, work.path());
    let checks: Vec<Check> = checks()
        .into_iter()
        .filter(|c| c.since <= version)
        .collect();
    assert_eq!(values.len(), checks.len());
    let wrong: Vec<String> = checks
        .iter()
        .zip(&values)
        .filter(|(c, (_, header))| c.rust != *header)
        .map(|(c, (_, header))| format!("{}: header {header}, ours {}", c.c, c.rust))
        .collect();
    assert!(
        wrong.is_empty(),
        "differences from the CUDA {version} headers:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_declaration_matches_the_cuda_12_headers() {
    let r = reference_dir().join("cuda12/nvidia");
    compare(
        &[r.join("cuda_runtime/include"), r.join("nvml_dev/include")],
        12090,
    );
}

#[test]
fn every_declaration_matches_the_cuda_11_8_headers() {
    compare(&[reference_dir().join("driver/usr/include")], 11080);
}

#[test]
fn every_declaration_matches_the_cuda_13_headers() {
    // NVIDIA's CUDA 13.0 wheel has no nvml.h: CUDA 12.9's stands beside its cuda.h.
    let r = reference_dir();
    compare(
        &[
            r.join("cuda13/nvidia/cu13/include"),
            r.join("cuda12/nvidia/nvml_dev/include"),
        ],
        13000,
    );
}
