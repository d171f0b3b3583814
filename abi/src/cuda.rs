//! `cuda.h`: the driver API's types and constants.

use std::ffi::{c_char, c_int, c_uint, c_void};

pub type CUresult = c_uint;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUarray = *mut c_void;
pub type CUmipmappedArray = *mut c_void;
pub type CUmodule = *mut c_void;
/// A library (CUDA 12.0): a module loaded into every context.
pub type CUlibrary = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUmemGenericAllocationHandle = u64;
pub type CUgraph = *mut c_void;
pub type CUgraphExec = *mut c_void;
pub type CUgraphNode = *mut c_void;
/// A green context (CUDA 12.4): a context given part of a device's SMs.
pub type CUgreenCtx = *mut c_void;
/// A descriptor of the resources a green context is made with.
pub type CUdevResourceDesc = *mut c_void;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_DEINITIALIZED: CUresult = 4;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_INVALID_IMAGE: CUresult = 200;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_MAP_FAILED: CUresult = 205;
pub const CUDA_ERROR_FILE_NOT_FOUND: CUresult = 301;
pub const CUDA_ERROR_UNSUPPORTED_LIMIT: CUresult = 215;
/// PTX the driver's JIT (its compiler or its linker) could not read.
pub const CUDA_ERROR_INVALID_PTX: CUresult = 218;
/// A launch's thread block cluster is not one the device and the kernel allow.
pub const CUDA_ERROR_INVALID_CLUSTER_SIZE: CUresult = 912;
pub const CUDA_ERROR_PEER_ACCESS_UNSUPPORTED: CUresult = 217;
pub const CUDA_ERROR_INVALID_RESOURCE_TYPE: CUresult = 914;
pub const CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION: CUresult = 915;
pub const CUDA_ERROR_OPERATING_SYSTEM: CUresult = 304;
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub const CUDA_ERROR_ILLEGAL_STATE: CUresult = 401;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
pub const CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: CUresult = 704;
pub const CUDA_ERROR_PEER_ACCESS_NOT_ENABLED: CUresult = 705;
pub const CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: CUresult = 712;
pub const CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: CUresult = 713;
pub const CUDA_ERROR_CONTEXT_IS_DESTROYED: CUresult = 709;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
pub const CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;
pub const CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: CUresult = 901;
/// A capture's end asked of a stream that did not begin it.
pub const CUDA_ERROR_STREAM_CAPTURE_UNMATCHED: CUresult = 903;
/// A capture's end while a stream it forked has work not joined back into it.
pub const CUDA_ERROR_STREAM_CAPTURE_UNJOINED: CUresult = 904;
/// Work of one capture waited on from a stream capturing another.
pub const CUDA_ERROR_STREAM_CAPTURE_ISOLATION: CUresult = 905;
pub const CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE: CUresult = 910;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// `cuMemHostAlloc` flags.
pub const CU_MEMHOSTALLOC_PORTABLE: c_uint = 0x01;
pub const CU_MEMHOSTALLOC_DEVICEMAP: c_uint = 0x02;
pub const CU_MEMHOSTALLOC_WRITECOMBINED: c_uint = 0x04;
/// `cuMemHostRegister` flags.
pub const CU_MEMHOSTREGISTER_PORTABLE: c_uint = 0x01;
pub const CU_MEMHOSTREGISTER_DEVICEMAP: c_uint = 0x02;
pub const CU_MEMHOSTREGISTER_IOMEMORY: c_uint = 0x04;
pub const CU_MEMHOSTREGISTER_READ_ONLY: c_uint = 0x08;

/// `CUdevice_P2PAttribute` values.
pub const CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK: c_int = 1;
pub const CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED: c_int = 2;
pub const CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED: c_int = 3;
pub const CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED: c_int = 4;

/// `CUdevice_attribute` values.
pub const CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: c_int = 1;
pub const CU_DEVICE_ATTRIBUTE_WARP_SIZE: c_int = 10;
pub const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 16;
pub const CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: c_int = 33;
pub const CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: c_int = 34;
pub const CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: c_int = 50;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: c_int = 76;
pub const CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: c_int = 103;
pub const CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_HANDLE_SUPPORTED: c_int = 104;
pub const CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED: c_int = 105;
pub const CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES: c_int = 119;
pub const CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: c_int = 124;
/// CUDA 12.3.
pub const CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED: c_int = 128;
/// CUDA 12.1.
pub const CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED: c_int = 132;

/// `CU_MEM_LOCATION_TYPE_DEVICE` of `CUmemLocationType`.
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
/// `CU_MEM_LOCATION_TYPE_HOST`: host memory, no NUMA node named (pools: CUDA 13).
pub const CU_MEM_LOCATION_TYPE_HOST: c_int = 2;
/// `CU_MEM_LOCATION_TYPE_HOST_NUMA`: host memory of the NUMA node the id names.
pub const CU_MEM_LOCATION_TYPE_HOST_NUMA: c_int = 3;

/// `cuGetProcAddress` flags.
pub const CU_GET_PROC_ADDRESS_LEGACY_STREAM: u64 = 1 << 0;
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;
/// `CUdriverProcAddressQueryResult` values.
pub const CU_GET_PROC_ADDRESS_SUCCESS: c_int = 0;
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: c_int = 1;
pub const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: c_int = 2;

/// `CUgraphNodeType` values.
pub const CU_GRAPH_NODE_TYPE_KERNEL: c_int = 0;
pub const CU_GRAPH_NODE_TYPE_MEMCPY: c_int = 1;
pub const CU_GRAPH_NODE_TYPE_MEMSET: c_int = 2;
pub const CU_GRAPH_NODE_TYPE_HOST: c_int = 3;
pub const CU_GRAPH_NODE_TYPE_GRAPH: c_int = 4;
pub const CU_GRAPH_NODE_TYPE_EMPTY: c_int = 5;
pub const CU_GRAPH_NODE_TYPE_MEM_ALLOC: c_int = 10;
pub const CU_GRAPH_NODE_TYPE_MEM_FREE: c_int = 11;
/// CUDA 12.3: a node that runs one of its body graphs, or one repeatedly, as a value the
/// graph's kernels may set decides.
pub const CU_GRAPH_NODE_TYPE_CONDITIONAL: c_int = 13;
/// `CUgraphConditionalNodeType` values: run the body once if the value is non-zero (or a
/// second body if it is zero), as long as it is non-zero, or the body it numbers.
pub const CU_GRAPH_COND_TYPE_IF: c_int = 0;
pub const CU_GRAPH_COND_TYPE_WHILE: c_int = 1;
pub const CU_GRAPH_COND_TYPE_SWITCH: c_int = 2;
/// `CUgraphInstantiate_flags`.
pub const CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH: u64 = 1;
pub const CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD: u64 = 2;
pub const CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH: u64 = 4;
/// `CUgraphExecUpdateResult` values.
pub const CU_GRAPH_EXEC_UPDATE_SUCCESS: c_int = 0;
pub const CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED: c_int = 2;
pub const CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED: c_int = 3;
/// `CUgraphMem_attribute` values.
pub const CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: c_int = 0;
pub const CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: c_int = 1;
pub const CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: c_int = 2;
pub const CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: c_int = 3;
/// `CU_MEM_ALLOCATION_TYPE_PINNED` of `CUmemAllocationType`.
pub const CU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
/// `CU_MEM_ALLOCATION_TYPE_MANAGED` (CUDA 13): a managed memory pool.
pub const CU_MEM_ALLOCATION_TYPE_MANAGED: c_int = 2;
/// `CUstreamCaptureStatus` of a stream being captured.
pub const CU_STREAM_CAPTURE_STATUS_ACTIVE: c_int = 1;
/// `CUstreamCaptureMode`: a thread in this mode may make calls that are unsafe during a
/// capture without invalidating any.
pub const CU_STREAM_CAPTURE_MODE_RELAXED: c_int = 2;
/// `CUevent_flags`: a thread waiting for the event sleeps rather than spins.
pub const CU_EVENT_BLOCKING_SYNC: std::ffi::c_uint = 0x1;
/// `CUevent_flags`: the event records no time.
pub const CU_EVENT_DISABLE_TIMING: std::ffi::c_uint = 0x2;

/// `CU_DEV_RESOURCE_TYPE_SM` of `CUdevResourceType`, the only resource type there is.
pub const CU_DEV_RESOURCE_TYPE_SM: c_int = 1;
/// `CU_GREEN_CTX_DEFAULT_STREAM`, the flag `cuGreenCtxCreate` requires.
pub const CU_GREEN_CTX_DEFAULT_STREAM: c_uint = 1;

/// `CUdevResource` (`CUdevResource_v1`): a tagged union of 144 bytes whose SM member holds the
/// resource's SM count in its first four bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUdevResource {
    pub type_: c_int,
    pub internal_padding: [u8; 92],
    /// `sm.smCount`.
    pub sm_count: c_uint,
    pub oversize: [u8; 44],
}

impl CUdevResource {
    /// A resource of no type (`CU_DEV_RESOURCE_TYPE_INVALID`).
    #[must_use]
    pub const fn invalid() -> Self {
        Self {
            type_: 0,
            internal_padding: [0; 92],
            sm_count: 0,
            oversize: [0; 44],
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUuuid {
    pub bytes: [c_char; 16],
}

pub const CU_IPC_HANDLE_SIZE: usize = 64;

/// An interprocess memory handle: opaque bytes the exporting driver fills in.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUipcMemHandle {
    pub reserved: [c_char; CU_IPC_HANDLE_SIZE],
}

/// An interprocess event handle: opaque bytes the exporting driver fills in.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUipcEventHandle {
    pub reserved: [c_char; CU_IPC_HANDLE_SIZE],
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY_DESCRIPTOR {
    pub width: usize,
    pub height: usize,
    pub format: c_int,
    pub num_channels: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY3D_DESCRIPTOR {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_int,
    pub num_channels: c_uint,
    pub flags: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY_MEMORY_REQUIREMENTS {
    pub size: usize,
    pub alignment: usize,
    pub reserved: [c_uint; 4],
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemLocation {
    pub typ: c_int,
    pub id: c_int,
}

/// The head of `CUmemAllocationProp` and of `CUmemPoolProps`: both start with two enums
/// (`type` / `allocType`, `requestedHandleTypes` / `handleTypes`) and the location.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemPropHead {
    pub typ: c_int,
    pub handle_types: c_int,
    pub location: CUmemLocation,
}

/// `CUmemAllocationProp`: the head, then fields this crate does not read (32 bytes); whole,
/// so that the library can hand the driver a copy of a caller's.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAllocationProp {
    pub head: CUmemPropHead,
    pub win32_handle_meta_data: *mut c_void,
    pub alloc_flags: [u8; 8],
}

/// `CUmemPoolProps`: the head, then fields this crate does not read (88 bytes in every
/// version: CUDA 12 took `maxSize` and `usage` out of the reserved bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemPoolProps {
    pub head: CUmemPropHead,
    pub win32_security_attributes: *mut c_void,
    pub rest: [u8; 64],
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (`_v1` since CUDA 12.2): the driver writes `dptr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_MEM_ALLOC_NODE_PARAMS {
    pub pool_props: CUmemPoolProps,
    pub access_descs: *const CUmemAccessDesc,
    pub access_desc_count: usize,
    pub bytesize: usize,
    pub dptr: CUdeviceptr,
}

/// `CUDA_KERNEL_NODE_PARAMS_v2` (CUDA 12.0); `CUDA_KERNEL_NODE_PARAMS` (v1) is the same up to
/// `extra`, so a v1 call may write into this.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_KERNEL_NODE_PARAMS_v2 {
    pub func: CUfunction,
    pub grid_dim_x: c_uint,
    pub grid_dim_y: c_uint,
    pub grid_dim_z: c_uint,
    pub block_dim_x: c_uint,
    pub block_dim_y: c_uint,
    pub block_dim_z: c_uint,
    pub shared_mem_bytes: c_uint,
    pub kernel_params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
    pub kern: *mut c_void,
    pub ctx: CUcontext,
}

/// `CUgraphExecUpdateResultInfo` (CUDA 12.0): what `cuGraphExecUpdate_v2` reports.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUgraphExecUpdateResultInfo {
    pub result: c_int,
    pub error_node: CUgraphNode,
    pub error_from_node: CUgraphNode,
}

/// `CUDA_GRAPH_INSTANTIATE_PARAMS` (CUDA 12.0): the driver writes the last two.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_GRAPH_INSTANTIATE_PARAMS {
    pub flags: u64,
    pub upload_stream: CUstream,
    pub error_node: CUgraphNode,
    pub result: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUlaunchConfig {
    pub grid_dim_x: c_uint,
    pub grid_dim_y: c_uint,
    pub grid_dim_z: c_uint,
    pub block_dim_x: c_uint,
    pub block_dim_y: c_uint,
    pub block_dim_z: c_uint,
    pub shared_mem_bytes: c_uint,
    pub stream: CUstream,
    pub attrs: *mut c_void,
    pub num_attrs: c_uint,
}

/// `CUlaunchAttributeValue` (also `CUkernelNodeAttrValue`): a union of 64 bytes whose member
/// the attribute's id picks; this crate reads `deviceUpdatableKernelNode.deviceUpdatable`, an
/// `int` at its start.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug)]
pub struct CUlaunchAttributeValue {
    pub bytes: [u8; 64],
}

impl Default for CUlaunchAttributeValue {
    fn default() -> Self {
        Self { bytes: [0; 64] }
    }
}

impl CUlaunchAttributeValue {
    /// The `int` the value starts with.
    #[must_use]
    pub fn first_int(&self) -> c_int {
        c_int::from_ne_bytes([self.bytes[0], self.bytes[1], self.bytes[2], self.bytes[3]])
    }
}

/// CUDA 12.4: a graph kernel node whose kernel parameters and grid kernels may change from
/// the GPU (`cudaGraphKernelNodeUpdatesApply`), without the host seeing it.
pub const CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE: c_int = 13;

/// One device's launch of `cuLaunchCooperativeKernelMultiDevice` (`CUDA_LAUNCH_PARAMS`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_LAUNCH_PARAMS {
    pub function: CUfunction,
    pub grid_dim_x: c_uint,
    pub grid_dim_y: c_uint,
    pub grid_dim_z: c_uint,
    pub block_dim_x: c_uint,
    pub block_dim_y: c_uint,
    pub block_dim_z: c_uint,
    pub shared_mem_bytes: c_uint,
    pub stream: CUstream,
    pub kernel_params: *mut *mut c_void,
}

/// The head of `CUgraphNodeParams` (CUDA 12.2): the node's type; the rest is a union of each
/// type's parameters, at [`CU_GRAPH_NODE_PARAMS_UNION_OFFSET`], of which this crate reads a
/// kernel node's (`CUDA_KERNEL_NODE_PARAMS_v3`, laid out as v2), a memset node's
/// (`CUDA_MEMSET_NODE_PARAMS_v2`, whose head is [`CUDA_MEMSET_NODE_PARAMS`]), a child graph
/// node's ([`CUDA_CHILD_GRAPH_NODE_PARAMS`]) and a conditional node's
/// ([`CUDA_CONDITIONAL_NODE_PARAMS`]).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUgraphNodeParamsHead {
    pub typ: c_int,
}

/// Where a node's own parameters stand in `CUgraphNodeParams`.
pub const CU_GRAPH_NODE_PARAMS_UNION_OFFSET: usize = 16;
/// The size of `CUgraphNodeParams` (type, reserved words, the union of 232 bytes, a reserved
/// word).
pub const CU_GRAPH_NODE_PARAMS_SIZE: usize = 256;

/// `CUDA_MEMSET_NODE_PARAMS` (v1): a memset node's destination, the pitch of its rows, the
/// value, the element size (1, 2 or 4 bytes), and elements per row and rows.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUDA_MEMSET_NODE_PARAMS {
    pub dst: CUdeviceptr,
    pub pitch: usize,
    pub value: c_uint,
    pub element_size: c_uint,
    pub width: usize,
    pub height: usize,
}

/// `CUDA_CHILD_GRAPH_NODE_PARAMS`: the graph a child graph node runs (CUDA 12.9 adds the
/// ownership after it, not read here).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_CHILD_GRAPH_NODE_PARAMS {
    pub graph: CUgraph,
}

/// `CUDA_CONDITIONAL_NODE_PARAMS` (CUDA 12.3): the handle whose value decides, the kind
/// (`CU_GRAPH_COND_TYPE_*`), how many body graphs, and the driver's array of them, written
/// when the node is made and valid while it lives.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_CONDITIONAL_NODE_PARAMS {
    pub handle: u64,
    pub typ: c_int,
    pub size: c_uint,
    pub graphs: *mut CUgraph,
    pub ctx: CUcontext,
}

/// `CUmemorytype` values.
pub const CU_MEMORYTYPE_HOST: c_uint = 1;
pub const CU_MEMORYTYPE_DEVICE: c_uint = 2;
pub const CU_MEMORYTYPE_ARRAY: c_uint = 3;
pub const CU_MEMORYTYPE_UNIFIED: c_uint = 4;

/// `CUDA_MEMCPY2D`: a copy of `height` rows of `width_in_bytes`, each end a host, device,
/// array or unified address with its own offset and pitch.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_MEMCPY2D {
    pub src_x_in_bytes: usize,
    pub src_y: usize,
    pub src_memory_type: c_uint,
    pub src_host: *const c_void,
    pub src_device: CUdeviceptr,
    pub src_array: CUarray,
    pub src_pitch: usize,
    pub dst_x_in_bytes: usize,
    pub dst_y: usize,
    pub dst_memory_type: c_uint,
    pub dst_host: *mut c_void,
    pub dst_device: CUdeviceptr,
    pub dst_array: CUarray,
    pub dst_pitch: usize,
    pub width_in_bytes: usize,
    pub height: usize,
}

/// `CUDA_MEMCPY3D`: a copy of `depth` slices of `height` rows between two ends, each a host,
/// device, array or unified address with its own offset, pitch and slice height.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_MEMCPY3D {
    pub src_x_in_bytes: usize,
    pub src_y: usize,
    pub src_z: usize,
    pub src_lod: usize,
    pub src_memory_type: c_uint,
    pub src_host: *const c_void,
    pub src_device: CUdeviceptr,
    pub src_array: CUarray,
    pub reserved0: *mut c_void,
    pub src_pitch: usize,
    pub src_height: usize,
    pub dst_x_in_bytes: usize,
    pub dst_y: usize,
    pub dst_z: usize,
    pub dst_lod: usize,
    pub dst_memory_type: c_uint,
    pub dst_host: *mut c_void,
    pub dst_device: CUdeviceptr,
    pub dst_array: CUarray,
    pub reserved1: *mut c_void,
    pub dst_pitch: usize,
    pub dst_height: usize,
    pub width_in_bytes: usize,
    pub height: usize,
    pub depth: usize,
}
