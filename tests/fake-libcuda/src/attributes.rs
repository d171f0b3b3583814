//! `cuDeviceGetAttribute`: what a simulated GPU reports, from its node description (SMs,
//! compute capability, PCI location) and the published limits of its architecture; clocks,
//! bus width and L2 size are those of the product the description names (a name the table
//! does not know takes the architecture's values). The CUDA runtime checks launches against
//! these (block and grid dimensions, shared memory), and frameworks read them to size work.

use std::ffi::c_int;

use gpuslice_simnode::SimGpu;

/// Limits that depend on the architecture (compute capability major.minor).
struct Architecture {
    max_threads_per_sm: c_int,
    max_blocks_per_sm: c_int,
    shared_memory_per_sm: c_int,
    shared_memory_per_block_optin: c_int,
    reserved_shared_memory_per_block: c_int,
    single_to_double_perf_ratio: c_int,
    cluster_launch: c_int,
    memory_sync_domains: c_int,
    tensor_map_access: c_int,
}

fn architecture(cc: (u32, u32)) -> Architecture {
    let base = Architecture {
        max_threads_per_sm: 1536,
        max_blocks_per_sm: 16,
        shared_memory_per_sm: 102_400,
        shared_memory_per_block_optin: 101_376,
        reserved_shared_memory_per_block: 1024,
        single_to_double_perf_ratio: 32,
        cluster_launch: 0,
        memory_sync_domains: 1,
        tensor_map_access: 0,
    };
    match cc {
        (7, 5) => Architecture {
            max_threads_per_sm: 1024,
            shared_memory_per_sm: 65_536,
            shared_memory_per_block_optin: 65_536,
            reserved_shared_memory_per_block: 0,
            ..base
        },
        (8, 0) => Architecture {
            max_threads_per_sm: 2048,
            max_blocks_per_sm: 32,
            shared_memory_per_sm: 167_936,
            shared_memory_per_block_optin: 166_912,
            single_to_double_perf_ratio: 2,
            ..base
        },
        (8, 9) => Architecture {
            max_blocks_per_sm: 24,
            single_to_double_perf_ratio: 64,
            ..base
        },
        (9, _) => Architecture {
            max_threads_per_sm: 2048,
            max_blocks_per_sm: 32,
            shared_memory_per_sm: 233_472,
            shared_memory_per_block_optin: 232_448,
            single_to_double_perf_ratio: 2,
            cluster_launch: 1,
            memory_sync_domains: 4,
            tensor_map_access: 1,
            ..base
        },
        _ => base,
    }
}

/// (clock kHz, memory clock kHz, memory bus bits, L2 bytes) of a product, by name.
fn product(name: &str) -> (c_int, c_int, c_int, c_int) {
    if name.contains("T4") {
        (1_590_000, 5_001_000, 256, 4 << 20)
    } else if name.contains("A100") {
        (1_410_000, 1_593_000, 5120, 40 << 20)
    } else if name.contains("H100") {
        (1_980_000, 2_619_000, 5120, 50 << 20)
    } else if name.contains("L40S") {
        (2_520_000, 9_001_000, 384, 96 << 20)
    } else {
        (1_695_000, 6_251_000, 384, 6 << 20)
    }
}

/// The value of `CUdevice_attribute` `attribute` for `gpu` on a driver of CUDA version
/// `driver_cuda`, or None for a number that driver does not define (an attribute newer than
/// it answers `CUDA_ERROR_INVALID_VALUE`, as on a real driver of that branch).
pub fn value_on(driver_cuda: i32, gpu: &SimGpu, attribute: c_int) -> Option<c_int> {
    (introduced(attribute) <= driver_cuda)
        .then(|| value(gpu, attribute))
        .flatten()
}

/// The first CUDA version whose `cuda.h` defines `attribute`, for those newer than the
/// reference driver's (535, CUDA 12.2: up to `HOST_NUMA_ID`, 134), from each release's
/// header.
fn introduced(attribute: c_int) -> i32 {
    match attribute {
        135 => 12050,
        136 | 137 | 139 | 140 | 143 => 12080,
        138 | 141 | 142 => 12090,
        144..=147 => 13000,
        _ => 0,
    }
}

/// The value of `CUdevice_attribute` `attribute` for `gpu`, or None for a number no driver
/// the simulator stands for defines.
pub fn value(gpu: &SimGpu, attribute: c_int) -> Option<c_int> {
    let arch = architecture(gpu.compute_capability);
    let (clock, memory_clock, bus_width, l2) = product(&gpu.name);
    let (domain, bus, device) = crate::pci_location(&gpu.pci_bus_id);
    let int = |v: u32| c_int::try_from(v).unwrap_or(c_int::MAX);
    let hopper = gpu.compute_capability.0 >= 9;
    let ampere_or_later = gpu.compute_capability.0 >= 8;
    let pci_ids = || gpuslice_simnode::node::pci_ids_of_product(&gpu.name);
    let bits = |v: u32| c_int::from_ne_bytes(v.to_ne_bytes());
    Some(match attribute {
        1 => 1024,                                                      // MAX_THREADS_PER_BLOCK
        2 | 3 => 1024,                                                  // MAX_BLOCK_DIM_X, _Y
        4 => 64,                                                        // MAX_BLOCK_DIM_Z
        5 => c_int::MAX,                                                // MAX_GRID_DIM_X
        6 | 7 => 65_535,                                                // MAX_GRID_DIM_Y, _Z
        8 => 49_152,                              // MAX_SHARED_MEMORY_PER_BLOCK
        9 => 65_536,                              // TOTAL_CONSTANT_MEMORY
        10 => 32,                                 // WARP_SIZE
        11 => c_int::MAX,                         // MAX_PITCH
        12 => 65_536,                             // MAX_REGISTERS_PER_BLOCK
        13 => clock,                              // CLOCK_RATE
        14 => 512,                                // TEXTURE_ALIGNMENT
        15 => 1,                                  // GPU_OVERLAP
        16 => int(gpu.sm_count),                  // MULTIPROCESSOR_COUNT
        17 | 18 => 0,                             // KERNEL_EXEC_TIMEOUT, INTEGRATED
        19 => 1,                                  // CAN_MAP_HOST_MEMORY
        20 => 0,                                  // COMPUTE_MODE (default)
        21 | 22 => 131_072,                       // MAXIMUM_TEXTURE1D_WIDTH, 2D_WIDTH
        23 => 65_536,                             // MAXIMUM_TEXTURE2D_HEIGHT
        24..=26 => 16_384,                        // MAXIMUM_TEXTURE3D_*
        27 | 28 => 32_768,                        // MAXIMUM_TEXTURE2D_LAYERED_WIDTH, _HEIGHT
        29 => 2048,                               // MAXIMUM_TEXTURE2D_LAYERED_LAYERS
        30 => 512,                                // SURFACE_ALIGNMENT
        31 | 32 => 1,                             // CONCURRENT_KERNELS, ECC_ENABLED
        33 => bus,                                // PCI_BUS_ID
        34 => device,                             // PCI_DEVICE_ID
        35 => 0,                                  // TCC_DRIVER
        36 => memory_clock,                       // MEMORY_CLOCK_RATE
        37 => bus_width,                          // GLOBAL_MEMORY_BUS_WIDTH
        38 => l2,                                 // L2_CACHE_SIZE
        39 => arch.max_threads_per_sm,            // MAX_THREADS_PER_MULTIPROCESSOR
        40 => 2,                                  // ASYNC_ENGINE_COUNT
        41 => 1,                                  // UNIFIED_ADDRESSING
        42 => 32_768,                             // MAXIMUM_TEXTURE1D_LAYERED_WIDTH
        43 => 2048,                               // MAXIMUM_TEXTURE1D_LAYERED_LAYERS
        44 => 1,                                  // CAN_TEX2D_GATHER
        45 | 46 => 32_768,                        // MAXIMUM_TEXTURE2D_GATHER_*
        47 | 48 => 8192,                          // MAXIMUM_TEXTURE3D_*_ALTERNATE
        49 => 32_768,                             // MAXIMUM_TEXTURE3D_DEPTH_ALTERNATE
        50 => domain,                             // PCI_DOMAIN_ID
        51 => 32,                                 // TEXTURE_PITCH_ALIGNMENT
        52 | 53 => 32_768,                        // TEXTURECUBEMAP_WIDTH, _LAYERED_WIDTH
        54 => 2046,                               // TEXTURECUBEMAP_LAYERED_LAYERS
        55 => 32_768,                             // SURFACE1D_WIDTH
        56 => 131_072,                            // SURFACE2D_WIDTH
        57 => 65_536,                             // SURFACE2D_HEIGHT
        58..=60 => 16_384,                        // SURFACE3D_*
        61 => 32_768,                             // SURFACE1D_LAYERED_WIDTH
        62 => 2048,                               // SURFACE1D_LAYERED_LAYERS
        63 | 64 => 32_768,                        // SURFACE2D_LAYERED_WIDTH, _HEIGHT
        65 => 2048,                               // SURFACE2D_LAYERED_LAYERS
        66 | 67 => 32_768,                        // SURFACECUBEMAP_WIDTH, _LAYERED_WIDTH
        68 => 2046,                               // SURFACECUBEMAP_LAYERED_LAYERS
        69 => 268_435_456,                        // TEXTURE1D_LINEAR_WIDTH (deprecated)
        70 => 131_072,                            // TEXTURE2D_LINEAR_WIDTH
        71 => 65_000,                             // TEXTURE2D_LINEAR_HEIGHT
        72 => 2_097_120,                          // TEXTURE2D_LINEAR_PITCH
        73 | 74 => 32_768,                        // TEXTURE2D_MIPMAPPED_*
        75 => int(gpu.compute_capability.0),      // COMPUTE_CAPABILITY_MAJOR
        76 => int(gpu.compute_capability.1),      // COMPUTE_CAPABILITY_MINOR
        77 => 32_768,                             // TEXTURE1D_MIPMAPPED_WIDTH
        78..=80 => 1,                             // STREAM_PRIORITIES, GLOBAL_L1, LOCAL_L1
        81 => arch.shared_memory_per_sm,          // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
        82 => 65_536,                             // MAX_REGISTERS_PER_MULTIPROCESSOR
        83 => 1,                                  // MANAGED_MEMORY
        84..=86 => 0,                             // MULTI_GPU_BOARD(_GROUP_ID), HOST_NATIVE_ATOMIC
        87 => arch.single_to_double_perf_ratio,   // SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO
        88 => 0,                                  // PAGEABLE_MEMORY_ACCESS
        89..=91 => 1, // CONCURRENT_MANAGED_ACCESS, PREEMPTION, HOST_POINTER
        92..=94 => 0, // the _V1 stream memory operations
        95 | 96 => 1, // COOPERATIVE_(MULTI_DEVICE_)LAUNCH
        97 => arch.shared_memory_per_block_optin, // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        98 => 0,      // CAN_FLUSH_REMOTE_WRITES
        99 => 1,      // HOST_REGISTER_SUPPORTED
        100 | 101 => 0, // PAGEABLE_..._HOST_PAGE_TABLES, DIRECT_MANAGED
        102 | 103 => 1, // VIRTUAL_MEMORY_MANAGEMENT, POSIX_FD handles
        104 | 105 => 0, // WIN32 handles
        106 => arch.max_blocks_per_sm, // MAX_BLOCKS_PER_MULTIPROCESSOR
        107 => c_int::from(gpu.compute_capability == (8, 0) || hopper), // GENERIC_COMPRESSION
        108 => {
            // MAX_PERSISTING_L2_CACHE_SIZE: three quarters of L2 from Ampere on.
            if ampere_or_later { l2 / 4 * 3 } else { 0 }
        }
        109 => {
            // MAX_ACCESS_POLICY_WINDOW_SIZE
            if ampere_or_later { 134_213_632 } else { 0 }
        }
        110 => 1,                                     // GPU_DIRECT_RDMA_WITH_CUDA_VMM
        111 => arch.reserved_shared_memory_per_block, // RESERVED_SHARED_MEMORY_PER_BLOCK
        112..=116 => 1, // SPARSE_CUDA_ARRAY, READ_ONLY_HOST_REGISTER, TIMELINE_SEMAPHORE, MEMORY_POOLS, GPU_DIRECT_RDMA
        117 => 1,       // GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS
        118 => 0,       // GPU_DIRECT_RDMA_WRITES_ORDERING
        119 => 1,       // MEMPOOL_SUPPORTED_HANDLE_TYPES (POSIX fd)
        120 => arch.cluster_launch, // CLUSTER_LAUNCH
        121..=125 => 1, // DEFERRED_MAPPING, 64-bit and NOR stream memory operations, DMA_BUF, IPC_EVENT
        126 => arch.memory_sync_domains, // MEM_SYNC_DOMAIN_COUNT
        127 => arch.tensor_map_access, // TENSOR_MAP_ACCESS_SUPPORTED
        128 => 0,       // HANDLE_TYPE_FABRIC_SUPPORTED
        129 => 1,       // UNIFIED_FUNCTION_POINTERS
        130 => 0,       // NUMA_CONFIG (none)
        131 => -1,      // NUMA_ID
        132 | 133 => 0, // MULTICAST_SUPPORTED, MPS_ENABLED
        134 => int(gpu.numa_node.unwrap_or(0)), // HOST_NUMA_ID: the host's node nearest the GPU
        135 => 0,       // D3D12_CIG_SUPPORTED
        136 | 137 => 0, // MEM_DECOMPRESS_ALGORITHM_MASK, _MAXIMUM_LENGTH: no decompression engine
        138 => 0,       // VULKAN_CIG_SUPPORTED
        139 => bits(pci_ids().0), // GPU_PCI_DEVICE_ID
        140 => bits(pci_ids().1), // GPU_PCI_SUBSYSTEM_ID
        // HOST_NUMA and (CUDA 13) HOST locations for pools (simulated: host memory, not
        // charged); for virtual memory, multi-node IPC, dma_buf of host allocations: not
        // simulated, so not offered.
        142 | 144 => 1,
        141 | 143 | 145 | 146 => 0,
        147 => 0, // ONLY_PARTIAL_HOST_NATIVE_ATOMIC_SUPPORTED (PCIe: none at all, HOST_NATIVE_ATOMIC 0)
        _ => return None,
    })
}
