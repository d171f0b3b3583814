//! The one table of intercepted functions. From it come the exported symbols (each calling its
//! hook inside a panic guard), typed pointers to the real functions, and the lookup that
//! `cuGetProcAddress` uses to hand out the exports instead of the real functions.
//! Helpers are real functions the hooks call but do not replace.

use std::ffi::{CStr, c_char, c_int, c_uchar, c_uint, c_ushort, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::ffi::*;

/// The library a function lives in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Library {
    Cuda,
    Nvml,
}

impl Library {
    /// The name programs load it by: the front (`gpuslice-front-*`), whose dependencies are
    /// this library and then the real driver library.
    fn soname(self) -> &'static CStr {
        match self {
            Self::Cuda => c"libcuda.so.1",
            Self::Nvml => c"libnvidia-ml.so.1",
        }
    }

    /// The name the front loads the real driver library by
    /// (`gpuslice_core::layout::REAL_CUDA` / `REAL_NVML`).
    fn real_name(self) -> &'static CStr {
        match self {
            Self::Cuda => c"libgpuslice-driver-cuda.so.1",
            Self::Nvml => c"libgpuslice-driver-nvml.so.1",
        }
    }
}

static HANDLES: [AtomicPtr<c_void>; 2] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 2];

/// The real driver library's handle. It is loaded as the front's dependency; when only the
/// other library's front is loaded, the front is loaded first (by its soname), so that the
/// dynamic linker keeps finding the front, never the real library, by that soname.
fn handle(lib: Library) -> *mut c_void {
    let slot = &HANDLES[lib as usize];
    let h = slot.load(Ordering::Acquire);
    if !h.is_null() {
        return h;
    }
    let open = |name: &CStr, flags: c_int| {
        // SAFETY: dlopen with a NUL-terminated name; RTLD_NOLOAD only finds a loaded object.
        unsafe { libc::dlopen(name.as_ptr(), flags) }
    };
    let mut h = open(lib.real_name(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
    if h.is_null() && !open(lib.soname(), libc::RTLD_NOW).is_null() {
        h = open(lib.real_name(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
    }
    if !h.is_null() {
        slot.store(h, Ordering::Release);
    }
    h
}

/// The real library's definition of `name`.
fn lookup(lib: Library, name: &CStr) -> *mut c_void {
    let h = handle(lib);
    if h.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: a handle from dlopen and a NUL-terminated name; a lookup in the real library's
    // handle searches it and its own dependencies, which this library is not one of.
    unsafe { libc::dlsym(h, name.as_ptr()) }
}

const fn c_name(s: &'static str) -> &'static CStr {
    match CStr::from_bytes_with_nul(s.as_bytes()) {
        Ok(c) => c,
        Err(_) => panic!("function name with a NUL byte"),
    }
}

macro_rules! table {
    (
        intercepted {
            $( $lib:ident fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty = $hook:path; )*
        }
        helpers {
            $( $hlib:ident fn $hname:ident ( $($harg:ident : $hty:ty),* $(,)? ) -> $hret:ty; )*
        }
    ) => {
        /// Every function of the table, intercepted ones first.
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, PartialEq, Eq, Debug)]
        pub enum Entry { $($name,)* $($hname,)* }

        /// (entry, library, name, intercepted).
        pub const ENTRIES: &[(Entry, Library, &CStr, bool)] = &[
            $( (Entry::$name, Library::$lib, c_name(concat!(stringify!($name), "\0")), true), )*
            $( (Entry::$hname, Library::$hlib, c_name(concat!(stringify!($hname), "\0")), false), )*
        ];

        static REAL: [AtomicPtr<c_void>; ENTRIES.len()] =
            [const { AtomicPtr::new(std::ptr::null_mut()) }; ENTRIES.len()];

        /// Typed pointers to the libraries' own functions; None where the library lacks one.
        #[allow(non_snake_case, dead_code)]
        pub mod real {
            use super::*;
            $(
                #[inline]
                pub fn $name() -> Option<unsafe extern "C" fn($($ty),*) -> $ret> {
                    let p = super::real_address(Entry::$name);
                    // SAFETY: p is the library's function of this name, and its C signature is
                    // the one declared in the table (from cuda.h / nvml.h).
                    (!p.is_null()).then(|| unsafe {
                        std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($ty),*) -> $ret>(p)
                    })
                }
            )*
            $(
                pub fn $hname() -> Option<unsafe extern "C" fn($($hty),*) -> $hret> {
                    let p = super::real_address(Entry::$hname);
                    // SAFETY: as above.
                    (!p.is_null()).then(|| unsafe {
                        std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($hty),*) -> $hret>(p)
                    })
                }
            )*
        }

        $(
            /// Exported in place of the driver's function of the same name.
            ///
            /// # Safety
            /// The contract of the driver's function.
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                // SAFETY: the caller keeps the driver function's contract, which the hook
                // relies on and passes on.
                crate::guard(|| unsafe { $hook($($arg),*) })
            }
        )*

        /// The exported replacement of an intercepted entry.
        pub fn export_of(e: Entry) -> Option<*mut c_void> {
            match e {
                $( Entry::$name => Some($name as *const () as *mut c_void), )*
                #[allow(unreachable_patterns)]
                _ => None,
            }
        }
    };
}

/// The real function of `e`, resolved on first use.
#[inline]
pub fn real_address(e: Entry) -> *mut c_void {
    let slot = &REAL[e as usize];
    let p = slot.load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    let (_, lib, name, _) = ENTRIES[e as usize];
    let p = lookup(lib, name);
    if !p.is_null() {
        slot.store(p, Ordering::Release);
    }
    p
}

/// The intercepted entry whose real function is at `p` (what `cuGetProcAddress` returned).
pub fn intercepted_by_real_address(p: *mut c_void) -> Option<Entry> {
    ENTRIES
        .iter()
        .filter(|(_, lib, _, intercepted)| *intercepted && *lib == Library::Cuda)
        .find(|(e, ..)| real_address(*e) == p)
        .map(|(e, ..)| *e)
}

use crate::hooks::{
    alloc, capture, context, graph, graph_bodies, graph_edits, graph_exec_params, info, limits,
    memset, module, pools, proc_address, refused, vmm,
};

table! {
    intercepted {
        Cuda fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult = alloc::mem_alloc;
        Cuda fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult = alloc::mem_free;
        Cuda fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, element: c_uint) -> CUresult = alloc::mem_alloc_pitch;
        Cuda fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint) -> CUresult = alloc::mem_alloc_managed;
        Cuda fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream) -> CUresult = alloc::mem_alloc_async;
        Cuda fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream) -> CUresult = alloc::mem_alloc_async_ptsz;
        Cuda fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytes: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult = alloc::mem_alloc_from_pool;
        Cuda fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult = alloc::mem_alloc_from_pool_ptsz;
        Cuda fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult = alloc::mem_free_async;
        Cuda fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult = alloc::mem_free_async_ptsz;
        Cuda fn cuStreamEndCapture(stream: CUstream, graph: *mut CUgraph) -> CUresult = capture::stream_end_capture;
        Cuda fn cuStreamEndCapture_ptsz(stream: CUstream, graph: *mut CUgraph) -> CUresult = capture::stream_end_capture_ptsz;
        Cuda fn cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool) -> CUresult = capture::device_set_mem_pool;
        Cuda fn cuMemSetMemPool(location: *mut CUmemLocation, kind: c_int, pool: CUmemoryPool) -> CUresult = capture::mem_set_mem_pool;
        Cuda fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPropHead) -> CUresult = pools::mem_pool_create;
        Cuda fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult = pools::mem_pool_destroy;
        Cuda fn cuDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult = pools::default_mem_pool;
        Cuda fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult = pools::device_mem_pool;
        Cuda fn cuMemGetDefaultMemPool(pool: *mut CUmemoryPool, location: *mut CUmemLocation, kind: c_int) -> CUresult = pools::mem_get_default_mem_pool;
        Cuda fn cuMemGetMemPool(pool: *mut CUmemoryPool, location: *mut CUmemLocation, kind: c_int) -> CUresult = pools::mem_get_mem_pool;
        Cuda fn cuMemPoolTrimTo(pool: CUmemoryPool, min_bytes_to_keep: usize) -> CUresult = pools::mem_pool_trim_to;
        Cuda fn cuArrayCreate_v2(array: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) -> CUresult = alloc::array_create;
        Cuda fn cuArray3DCreate_v2(array: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR) -> CUresult = alloc::array_3d_create;
        Cuda fn cuArrayDestroy(array: CUarray) -> CUresult = alloc::array_destroy;
        Cuda fn cuMipmappedArrayCreate(array: *mut CUmipmappedArray, desc: *const CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) -> CUresult = alloc::mipmapped_array_create;
        Cuda fn cuMipmappedArrayDestroy(array: CUmipmappedArray) -> CUresult = alloc::mipmapped_array_destroy;
        Cuda fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemPropHead, flags: u64) -> CUresult = alloc::mem_create;
        Cuda fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult = vmm::mem_release;
        Cuda fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) -> CUresult = vmm::mem_map;
        Cuda fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult = vmm::mem_unmap;
        Cuda fn cuCtxCreate_v2(ctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult = context::ctx_create_v2;
        Cuda fn cuCtxCreate_v3(ctx: *mut CUcontext, params: *mut c_void, count: c_int, flags: c_uint, dev: CUdevice) -> CUresult = context::ctx_create_v3;
        Cuda fn cuCtxCreate_v4(ctx: *mut CUcontext, params: *mut c_void, flags: c_uint, dev: CUdevice) -> CUresult = context::ctx_create_v4;
        Cuda fn cuGLCtxCreate_v2(ctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult = context::gl_ctx_create_v2;
        Cuda fn cuVDPAUCtxCreate_v2(ctx: *mut CUcontext, flags: c_uint, dev: CUdevice, vdp_device: u32, get_proc_address: *mut c_void) -> CUresult = context::vdpau_ctx_create_v2;
        Cuda fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult = context::ctx_destroy;
        Cuda fn cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, dev: CUdevice) -> CUresult = context::primary_retain;
        Cuda fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult = context::primary_release_v1;
        Cuda fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult = context::primary_release;
        Cuda fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult = context::primary_reset;
        Cuda fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult = context::primary_reset_v1;
        Cuda fn cuCtxDestroy(ctx: CUcontext) -> CUresult = context::ctx_destroy_v1;
        Cuda fn cuCtxSetLimit(limit: c_int, value: usize) -> CUresult = limits::ctx_set_limit;
        Cuda fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> CUresult = module::module_load_data;
        Cuda fn cuModuleLoadDataEx(module: *mut CUmodule, image: *const c_void, count: c_uint, options: *mut c_int, values: *mut *mut c_void) -> CUresult = module::module_load_data_ex;
        Cuda fn cuModuleLoadFatBinary(module: *mut CUmodule, image: *const c_void) -> CUresult = module::module_load_fat_binary;
        Cuda fn cuModuleLoad(module: *mut CUmodule, path: *const c_char) -> CUresult = module::module_load;
        Cuda fn cuModuleUnload(module: CUmodule) -> CUresult = module::module_unload;
        Cuda fn cuLibraryLoadData(library: *mut CUlibrary, image: *const c_void, jit_options: *mut c_int, jit_values: *mut *mut c_void, jit_count: c_uint, library_options: *mut c_int, library_values: *mut *mut c_void, library_count: c_uint) -> CUresult = module::library_load_data;
        Cuda fn cuLibraryLoadFromFile(library: *mut CUlibrary, path: *const c_char, jit_options: *mut c_int, jit_values: *mut *mut c_void, jit_count: c_uint, library_options: *mut c_int, library_values: *mut *mut c_void, library_count: c_uint) -> CUresult = module::library_load_from_file;
        Cuda fn cuLibraryUnload(library: CUlibrary) -> CUresult = module::library_unload;
        Cuda fn cuGreenCtxCreate(green: *mut CUgreenCtx, desc: CUdevResourceDesc, dev: CUdevice, flags: c_uint) -> CUresult = context::green_ctx_create;
        Cuda fn cuGreenCtxDestroy(green: CUgreenCtx) -> CUresult = context::green_ctx_destroy;
        Cuda fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult = info::mem_get_info;
        Cuda fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult = info::device_total_mem;
        Cuda fn cuDeviceGetAttribute(value: *mut c_int, attribute: c_int, dev: CUdevice) -> CUresult = info::device_get_attribute;
        Cuda fn cuLaunchKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult = crate::hooks::launch::launch_kernel;
        Cuda fn cuLaunchKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult = crate::hooks::launch::launch_kernel_ptsz;
        Cuda fn cuLaunchKernelEx(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult = crate::hooks::launch::launch_kernel_ex;
        Cuda fn cuLaunchKernelEx_ptsz(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult = crate::hooks::launch::launch_kernel_ex_ptsz;
        Cuda fn cuLaunchCooperativeKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void) -> CUresult = crate::hooks::launch::launch_cooperative_kernel;
        Cuda fn cuLaunchCooperativeKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void) -> CUresult = crate::hooks::launch::launch_cooperative_kernel_ptsz;
        Cuda fn cuLaunch(f: CUfunction) -> CUresult = crate::hooks::launch::launch_legacy;
        Cuda fn cuLaunchGrid(f: CUfunction, w: c_int, h: c_int) -> CUresult = crate::hooks::launch::launch_grid;
        Cuda fn cuLaunchGridAsync(f: CUfunction, w: c_int, h: c_int, stream: CUstream) -> CUresult = crate::hooks::launch::launch_grid_async;
        Cuda fn cuLaunchCooperativeKernelMultiDevice(list: *mut CUDA_LAUNCH_PARAMS, count: c_uint, flags: c_uint) -> CUresult = crate::hooks::launch::launch_cooperative_multi_device;
        Cuda fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) -> CUresult = proc_address::get_proc_address;
        Cuda fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) -> CUresult = proc_address::get_proc_address_v2;
        Cuda fn cuCtxCreate(ctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult = context::ctx_create_v2;
        Cuda fn cuGLCtxCreate(ctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult = context::gl_ctx_create;
        Cuda fn cuVDPAUCtxCreate(ctx: *mut CUcontext, flags: c_uint, dev: CUdevice, vdp_device: u32, get_proc_address: *mut c_void) -> CUresult = context::vdpau_ctx_create;
        Cuda fn cuMemAlloc(dptr: *mut c_uint, bytes: c_uint) -> CUresult = refused::legacy_mem_alloc;
        Cuda fn cuMemAllocPitch(dptr: *mut c_uint, pitch: *mut c_uint, width: c_uint, height: c_uint, element: c_uint) -> CUresult = refused::legacy_mem_alloc_pitch;
        Cuda fn cuArrayCreate(array: *mut CUarray, desc: *const c_void) -> CUresult = refused::legacy_array_create;
        Cuda fn cuArray3DCreate(array: *mut CUarray, desc: *const c_void) -> CUresult = refused::legacy_array_3d_create;
        Cuda fn cuMemFree(dptr: c_uint) -> CUresult = refused::legacy_mem_free;
        Cuda fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CUresult = refused::legacy_mem_get_info;
        Cuda fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) -> CUresult = refused::legacy_device_total_mem;
        Cuda fn cuGraphInstantiate(exec: *mut CUgraphExec, graph: CUgraph, error_node: *mut CUgraphNode, log: *mut c_char, log_size: usize) -> CUresult = graph::graph_instantiate_v1;
        Cuda fn cuGraphInstantiate_v2(exec: *mut CUgraphExec, graph: CUgraph, error_node: *mut CUgraphNode, log: *mut c_char, log_size: usize) -> CUresult = graph::graph_instantiate_v2;
        Cuda fn cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: u64) -> CUresult = graph::graph_instantiate_with_flags;
        Cuda fn cuGraphInstantiateWithParams(exec: *mut CUgraphExec, graph: CUgraph, params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS) -> CUresult = graph::graph_instantiate_with_params;
        Cuda fn cuGraphInstantiateWithParams_ptsz(exec: *mut CUgraphExec, graph: CUgraph, params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS) -> CUresult = graph::graph_instantiate_with_params_ptsz;
        Cuda fn cuGraphExecUpdate(exec: CUgraphExec, graph: CUgraph, error_node: *mut CUgraphNode, result: *mut c_int) -> CUresult = graph::graph_exec_update_v1;
        Cuda fn cuGraphExecUpdate_v2(exec: CUgraphExec, graph: CUgraph, info: *mut c_void) -> CUresult = graph::graph_exec_update_v2;
        Cuda fn cuMemRetainAllocationHandle(handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void) -> CUresult = vmm::mem_retain_allocation_handle;
        Cuda fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult = graph::graph_exec_destroy;
        Cuda fn cuGraphExecKernelNodeSetParams(exec: CUgraphExec, node: CUgraphNode, params: *const c_void) -> CUresult = graph_exec_params::graph_exec_kernel_node_set_params;
        Cuda fn cuGraphExecKernelNodeSetParams_v2(exec: CUgraphExec, node: CUgraphNode, params: *const CUDA_KERNEL_NODE_PARAMS_v2) -> CUresult = graph_exec_params::graph_exec_kernel_node_set_params_v2;
        Cuda fn cuGraphExecNodeSetParams(exec: CUgraphExec, node: CUgraphNode, params: *mut CUgraphNodeParamsHead) -> CUresult = graph_exec_params::graph_exec_node_set_params;
        Cuda fn cuGraphExecChildGraphNodeSetParams(exec: CUgraphExec, node: CUgraphNode, child: CUgraph) -> CUresult = graph_exec_params::graph_exec_child_graph_node_set_params;
        Cuda fn cuGraphExecMemsetNodeSetParams(exec: CUgraphExec, node: CUgraphNode, params: *const CUDA_MEMSET_NODE_PARAMS, ctx: CUcontext) -> CUresult = graph_exec_params::graph_exec_memset_node_set_params;
        Cuda fn cuGraphNodeSetParams(node: CUgraphNode, params: *mut CUgraphNodeParamsHead) -> CUresult = graph_bodies::graph_node_set_params;
        Cuda fn cuGraphAddKernelNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, count: usize, params: *const c_void) -> CUresult = graph_edits::graph_add_kernel_node;
        Cuda fn cuGraphAddKernelNode_v2(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, count: usize, params: *const CUDA_KERNEL_NODE_PARAMS_v2) -> CUresult = graph_edits::graph_add_kernel_node_v2;
        Cuda fn cuGraphAddMemAllocNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, count: usize, params: *mut CUDA_MEM_ALLOC_NODE_PARAMS) -> CUresult = graph_edits::graph_add_mem_alloc_node;
        Cuda fn cuGraphAddMemFreeNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, count: usize, dptr: CUdeviceptr) -> CUresult = graph_edits::graph_add_mem_free_node;
        Cuda fn cuGraphAddChildGraphNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, count: usize, child: CUgraph) -> CUresult = graph_edits::graph_add_child_graph_node;
        Cuda fn cuGraphAddMemsetNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, count: usize, params: *const CUDA_MEMSET_NODE_PARAMS, ctx: CUcontext) -> CUresult = graph_edits::graph_add_memset_node;
        Cuda fn cuGraphKernelNodeSetParams(node: CUgraphNode, params: *const c_void) -> CUresult = graph_edits::graph_kernel_node_set_params;
        Cuda fn cuGraphKernelNodeSetParams_v2(node: CUgraphNode, params: *const CUDA_KERNEL_NODE_PARAMS_v2) -> CUresult = graph_edits::graph_kernel_node_set_params_v2;
        Cuda fn cuGraphMemsetNodeSetParams(node: CUgraphNode, params: *const CUDA_MEMSET_NODE_PARAMS) -> CUresult = graph_edits::graph_memset_node_set_params;
        Cuda fn cuGraphKernelNodeSetAttribute(node: CUgraphNode, attr: c_int, value: *const CUlaunchAttributeValue) -> CUresult = graph_edits::graph_kernel_node_set_attribute;
        Cuda fn cuGraphKernelNodeCopyAttributes(dst: CUgraphNode, src: CUgraphNode) -> CUresult = graph_edits::graph_kernel_node_copy_attributes;
        Cuda fn cuGraphDestroyNode(node: CUgraphNode) -> CUresult = graph_edits::graph_destroy_node;
        Cuda fn cuGraphAddNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, count: usize, params: *mut CUgraphNodeParamsHead) -> CUresult = graph_bodies::graph_add_node;
        Cuda fn cuGraphAddNode_v2(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, edges: *const c_void, count: usize, params: *mut CUgraphNodeParamsHead) -> CUresult = graph_bodies::graph_add_node_v2;
        Cuda fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult = graph::graph_launch;
        Cuda fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult = graph::graph_launch_ptsz;
        Cuda fn cuGraphUpload(exec: CUgraphExec, stream: CUstream) -> CUresult = graph::graph_upload;
        Cuda fn cuGraphUpload_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult = graph::graph_upload_ptsz;
        Cuda fn cuDeviceGraphMemTrim(dev: CUdevice) -> CUresult = graph::device_graph_mem_trim;
        Cuda fn cuMemsetD8(dst: c_uint, value: c_uchar, n: c_uint) -> CUresult = memset::legacy_memset_d8;
        Cuda fn cuMemsetD16(dst: c_uint, value: c_ushort, n: c_uint) -> CUresult = memset::legacy_memset_d16;
        Cuda fn cuMemsetD32(dst: c_uint, value: c_uint, n: c_uint) -> CUresult = memset::legacy_memset_d32;
        Cuda fn cuMemsetD2D8(dst: c_uint, pitch: c_uint, value: c_uchar, width: c_uint, height: c_uint) -> CUresult = memset::legacy_memset_d2d8;
        Cuda fn cuMemsetD2D16(dst: c_uint, pitch: c_uint, value: c_ushort, width: c_uint, height: c_uint) -> CUresult = memset::legacy_memset_d2d16;
        Cuda fn cuMemsetD2D32(dst: c_uint, pitch: c_uint, value: c_uint, width: c_uint, height: c_uint) -> CUresult = memset::legacy_memset_d2d32;
        Cuda fn cuMemsetD8_v2(dst: CUdeviceptr, value: c_uchar, n: usize) -> CUresult = memset::memset_d8;
        Cuda fn cuMemsetD8_v2_ptds(dst: CUdeviceptr, value: c_uchar, n: usize) -> CUresult = memset::memset_d8_ptds;
        Cuda fn cuMemsetD8Async(dst: CUdeviceptr, value: c_uchar, n: usize, stream: CUstream) -> CUresult = memset::memset_d8_async;
        Cuda fn cuMemsetD8Async_ptsz(dst: CUdeviceptr, value: c_uchar, n: usize, stream: CUstream) -> CUresult = memset::memset_d8_async_ptsz;
        Cuda fn cuMemsetD16_v2(dst: CUdeviceptr, value: c_ushort, n: usize) -> CUresult = memset::memset_d16;
        Cuda fn cuMemsetD16_v2_ptds(dst: CUdeviceptr, value: c_ushort, n: usize) -> CUresult = memset::memset_d16_ptds;
        Cuda fn cuMemsetD16Async(dst: CUdeviceptr, value: c_ushort, n: usize, stream: CUstream) -> CUresult = memset::memset_d16_async;
        Cuda fn cuMemsetD16Async_ptsz(dst: CUdeviceptr, value: c_ushort, n: usize, stream: CUstream) -> CUresult = memset::memset_d16_async_ptsz;
        Cuda fn cuMemsetD32_v2(dst: CUdeviceptr, value: c_uint, n: usize) -> CUresult = memset::memset_d32;
        Cuda fn cuMemsetD32_v2_ptds(dst: CUdeviceptr, value: c_uint, n: usize) -> CUresult = memset::memset_d32_ptds;
        Cuda fn cuMemsetD32Async(dst: CUdeviceptr, value: c_uint, n: usize, stream: CUstream) -> CUresult = memset::memset_d32_async;
        Cuda fn cuMemsetD32Async_ptsz(dst: CUdeviceptr, value: c_uint, n: usize, stream: CUstream) -> CUresult = memset::memset_d32_async_ptsz;
        Cuda fn cuMemsetD2D8_v2(dst: CUdeviceptr, pitch: usize, value: c_uchar, width: usize, height: usize) -> CUresult = memset::memset_d2d8;
        Cuda fn cuMemsetD2D8_v2_ptds(dst: CUdeviceptr, pitch: usize, value: c_uchar, width: usize, height: usize) -> CUresult = memset::memset_d2d8_ptds;
        Cuda fn cuMemsetD2D8Async(dst: CUdeviceptr, pitch: usize, value: c_uchar, width: usize, height: usize, stream: CUstream) -> CUresult = memset::memset_d2d8_async;
        Cuda fn cuMemsetD2D8Async_ptsz(dst: CUdeviceptr, pitch: usize, value: c_uchar, width: usize, height: usize, stream: CUstream) -> CUresult = memset::memset_d2d8_async_ptsz;
        Cuda fn cuMemsetD2D16_v2(dst: CUdeviceptr, pitch: usize, value: c_ushort, width: usize, height: usize) -> CUresult = memset::memset_d2d16;
        Cuda fn cuMemsetD2D16_v2_ptds(dst: CUdeviceptr, pitch: usize, value: c_ushort, width: usize, height: usize) -> CUresult = memset::memset_d2d16_ptds;
        Cuda fn cuMemsetD2D16Async(dst: CUdeviceptr, pitch: usize, value: c_ushort, width: usize, height: usize, stream: CUstream) -> CUresult = memset::memset_d2d16_async;
        Cuda fn cuMemsetD2D16Async_ptsz(dst: CUdeviceptr, pitch: usize, value: c_ushort, width: usize, height: usize, stream: CUstream) -> CUresult = memset::memset_d2d16_async_ptsz;
        Cuda fn cuMemsetD2D32_v2(dst: CUdeviceptr, pitch: usize, value: c_uint, width: usize, height: usize) -> CUresult = memset::memset_d2d32;
        Cuda fn cuMemsetD2D32_v2_ptds(dst: CUdeviceptr, pitch: usize, value: c_uint, width: usize, height: usize) -> CUresult = memset::memset_d2d32_ptds;
        Cuda fn cuMemsetD2D32Async(dst: CUdeviceptr, pitch: usize, value: c_uint, width: usize, height: usize, stream: CUstream) -> CUresult = memset::memset_d2d32_async;
        Cuda fn cuMemsetD2D32Async_ptsz(dst: CUdeviceptr, pitch: usize, value: c_uint, width: usize, height: usize, stream: CUstream) -> CUresult = memset::memset_d2d32_async_ptsz;
        Cuda fn cuMemImportFromShareableHandle(handle: *mut CUmemGenericAllocationHandle, os_handle: *mut c_void, kind: c_int) -> CUresult = refused::mem_import_from_shareable_handle;
        Cuda fn cuMemPoolImportFromShareableHandle(pool: *mut CUmemoryPool, handle: *mut c_void, kind: c_int, flags: u64) -> CUresult = refused::mem_pool_import_from_shareable_handle;
        Cuda fn cuMemPoolImportPointer(dptr: *mut CUdeviceptr, pool: CUmemoryPool, data: *mut c_void) -> CUresult = refused::mem_pool_import_pointer;
        Cuda fn cuMemExportToShareableHandle(os_handle: *mut c_void, handle: CUmemGenericAllocationHandle, kind: c_int, flags: u64) -> CUresult = refused::mem_export_to_shareable_handle;
        Cuda fn cuMemPoolExportToShareableHandle(os_handle: *mut c_void, pool: CUmemoryPool, kind: c_int, flags: u64) -> CUresult = refused::mem_pool_export_to_shareable_handle;
        Cuda fn cuMemPoolExportPointer(data: *mut c_void, dptr: CUdeviceptr) -> CUresult = refused::mem_pool_export_pointer;
        Cuda fn cuMulticastCreate(handle: *mut CUmemGenericAllocationHandle, prop: *const c_void) -> CUresult = refused::multicast_create;
        Cuda fn cuMemGetHandleForAddressRange(handle: *mut c_void, dptr: CUdeviceptr, size: usize, kind: c_int, flags: u64) -> CUresult = refused::mem_get_handle_for_address_range;
        Nvml fn nvmlDeviceGetMemoryInfo(dev: nvmlDevice_t, memory: *mut nvmlMemory_t) -> nvmlReturn_t = info::nvml_memory_info;
        Nvml fn nvmlDeviceGetMemoryInfo_v2(dev: nvmlDevice_t, memory: *mut nvmlMemory_v2_t) -> nvmlReturn_t = info::nvml_memory_info_v2;
    }
    helpers {
        Cuda fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult;
        Cuda fn cuCtxGetCurrent(ctx: *mut CUcontext) -> CUresult;
        Cuda fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult;
        Cuda fn cuCtxGetLimit(value: *mut usize, limit: c_int) -> CUresult;
        Cuda fn cuCtxFromGreenCtx(ctx: *mut CUcontext, green: CUgreenCtx) -> CUresult;
        Cuda fn cuFuncGetAttribute(value: *mut c_int, attribute: c_int, f: CUfunction) -> CUresult;
        Cuda fn cuKernelGetAttribute(value: *mut c_int, attribute: c_int, kernel: CUfunction, dev: CUdevice) -> CUresult;
        Cuda fn cuStreamGetCtx(stream: CUstream, ctx: *mut CUcontext) -> CUresult;
        Cuda fn cuStreamGetCtx_ptsz(stream: CUstream, ctx: *mut CUcontext) -> CUresult;
        Cuda fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult;
        Cuda fn cuCtxPopCurrent_v2(ctx: *mut CUcontext) -> CUresult;
        Cuda fn cuMemPoolGetAttribute(pool: CUmemoryPool, attr: c_int, value: *mut c_void) -> CUresult;
        Cuda fn cuDeviceGetGraphMemAttribute(dev: CUdevice, attr: c_int, value: *mut c_void) -> CUresult;
        Cuda fn cuGraphGetNodes(graph: CUgraph, nodes: *mut CUgraphNode, count: *mut usize) -> CUresult;
        Cuda fn cuGraphNodeGetType(node: CUgraphNode, typ: *mut c_int) -> CUresult;
        Cuda fn cuGraphMemAllocNodeGetParams(node: CUgraphNode, params: *mut CUDA_MEM_ALLOC_NODE_PARAMS) -> CUresult;
        Cuda fn cuGraphMemFreeNodeGetParams(node: CUgraphNode, dptr: *mut CUdeviceptr) -> CUresult;
        Cuda fn cuGraphKernelNodeGetParams(node: CUgraphNode, params: *mut c_void) -> CUresult;
        Cuda fn cuGraphKernelNodeGetParams_v2(node: CUgraphNode, params: *mut CUDA_KERNEL_NODE_PARAMS_v2) -> CUresult;
        Cuda fn cuGraphChildGraphNodeGetGraph(node: CUgraphNode, graph: *mut CUgraph) -> CUresult;
        Cuda fn cuGraphMemsetNodeGetParams(node: CUgraphNode, params: *mut CUDA_MEMSET_NODE_PARAMS) -> CUresult;
        Cuda fn cuGraphKernelNodeGetAttribute(node: CUgraphNode, attr: c_int, value: *mut CUlaunchAttributeValue) -> CUresult;
        Cuda fn cuStreamIsCapturing(stream: CUstream, status: *mut c_int) -> CUresult;
        Cuda fn cuEventCreate(event: *mut CUevent, flags: c_uint) -> CUresult;
        Cuda fn cuEventRecord(event: CUevent, stream: CUstream) -> CUresult;
        Cuda fn cuEventRecord_ptsz(event: CUevent, stream: CUstream) -> CUresult;
        Cuda fn cuEventQuery(event: CUevent) -> CUresult;
        Cuda fn cuEventSynchronize(event: CUevent) -> CUresult;
        Cuda fn cuEventDestroy_v2(event: CUevent) -> CUresult;
        Cuda fn cuThreadExchangeStreamCaptureMode(mode: *mut c_int) -> CUresult;
        Cuda fn cuStreamIsCapturing_ptsz(stream: CUstream, status: *mut c_int) -> CUresult;
        Cuda fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult;
        Cuda fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult;
        Cuda fn cuArrayGetMemoryRequirements(req: *mut CUDA_ARRAY_MEMORY_REQUIREMENTS, array: CUarray, dev: CUdevice) -> CUresult;
        Cuda fn cuMipmappedArrayGetMemoryRequirements(req: *mut CUDA_ARRAY_MEMORY_REQUIREMENTS, array: CUmipmappedArray, dev: CUdevice) -> CUresult;
        Nvml fn nvmlDeviceGetUUID(dev: nvmlDevice_t, uuid: *mut c_char, len: c_uint) -> nvmlReturn_t;
        Nvml fn nvmlInit_v2() -> nvmlReturn_t;
        Nvml fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, dev: *mut nvmlDevice_t) -> nvmlReturn_t;
        Nvml fn nvmlDeviceGetProcessUtilization(dev: nvmlDevice_t, samples: *mut nvmlProcessUtilizationSample_t, count: *mut c_uint, last_seen: u64) -> nvmlReturn_t;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::{ENTRIES, Library};

    /// The driver's `cuGetProcAddress` table (`tests/reference/proc-address.tsv`, the newer
    /// entry points of `proc-address-newer.tsv`, and those of a CUDA 13.0 driver,
    /// `proc-address-13000.tsv`): base name → every symbol it answers with, whatever the CUDA
    /// version and stream flag asked for.
    fn variants() -> BTreeMap<String, BTreeSet<String>> {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/reference/");
        let table = [
            "proc-address.tsv",
            "proc-address-newer.tsv",
            "proc-address-13000.tsv",
        ]
        .map(|f| std::fs::read_to_string(format!("{dir}{f}")).unwrap())
        .concat();
        let mut by_name: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for row in table.lines() {
            if row.starts_with('#') || row.is_empty() {
                continue;
            }
            let cols: Vec<&str> = row.split('\t').collect();
            by_name
                .entry(cols[0].to_string())
                .or_default()
                .insert(cols[3].to_string());
        }
        by_name
    }

    #[test]
    fn every_variant_the_driver_hands_out_for_an_intercepted_name_is_intercepted() {
        let intercepted: BTreeSet<String> = ENTRIES
            .iter()
            .filter(|(_, lib, _, caught)| *caught && *lib == Library::Cuda)
            .map(|(_, _, name, _)| name.to_str().unwrap().to_string())
            .collect();
        let missed: Vec<String> = variants()
            .into_iter()
            .filter(|(_, symbols)| !symbols.is_disjoint(&intercepted))
            .flat_map(|(name, symbols)| {
                symbols
                    .into_iter()
                    .filter(|s| !intercepted.contains(s))
                    .map(move |s| format!("{name} -> {s}"))
            })
            .collect();
        // A program asking cuGetProcAddress for an old CUDA version gets the old variant (the
        // CUDA 12 runtime asks for cuDevicePrimaryCtxReset as of 7.0, the unversioned one).
        assert!(missed.is_empty(), "not intercepted: {missed:?}");
    }

    /// The driver's exports (`tests/reference/libcuda.symbols`, and the symbols a CUDA 13.0
    /// driver answers `cuGetProcAddress` with beyond them, `proc-address-13000.tsv`) that
    /// `matches` picks (at least `least` of them), and of those, the ones the library does not
    /// intercept.
    fn exports_not_intercepted(matches: impl Fn(&str) -> bool, least: usize) -> Vec<String> {
        let intercepted: BTreeSet<&str> = ENTRIES
            .iter()
            .filter(|(_, lib, _, caught)| *caught && *lib == Library::Cuda)
            .map(|(_, _, name, _)| name.to_str().unwrap())
            .collect();
        let reference = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/reference/");
        let exports = std::fs::read_to_string(format!("{reference}libcuda.symbols")).unwrap();
        let newer = std::fs::read_to_string(format!("{reference}proc-address-13000.tsv")).unwrap();
        let newer = newer
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split('\t').nth(3));
        let all: BTreeSet<&str> = exports.lines().chain(newer).collect();
        let picked: Vec<&str> = all.into_iter().filter(|s| matches(s)).collect();
        assert!(picked.len() >= least, "{picked:?}");
        picked
            .into_iter()
            .filter(|s| !intercepted.contains(s))
            .map(String::from)
            .collect()
    }

    #[test]
    fn every_memset_the_driver_exports_is_intercepted() {
        // The driver runs memsets as kernels of its own: one the library does not see keeps
        // the SMs busy unpaced.
        let missed = exports_not_intercepted(|s| s.starts_with("cuMemset"), 30);
        assert!(missed.is_empty(), "not intercepted: {missed:?}");
    }

    #[test]
    fn every_call_the_driver_exports_to_launch_a_kernel_is_intercepted() {
        // A launch the library does not see runs unpaced, and its kernel's stack uncharged.
        // Host functions run on the CPU.
        let missed = exports_not_intercepted(
            |s| {
                (s.starts_with("cuLaunch") && !s.starts_with("cuLaunchHostFunc"))
                    || s.starts_with("cuGraphLaunch")
            },
            10,
        );
        assert!(missed.is_empty(), "not intercepted: {missed:?}");
    }

    #[test]
    fn every_call_that_gives_an_executable_graph_its_kernels_is_intercepted() {
        // What an executable graph runs is read when it is made or changed: a call the
        // library does not see could hand it kernels (or memsets, the driver's kernels) that
        // run unpaced, their stack uncharged.
        let missed = exports_not_intercepted(
            |s| {
                [
                    "cuGraphInstantiate",
                    "cuGraphExecUpdate",
                    "cuGraphExecKernelNodeSetParams",
                    "cuGraphExecChildGraphNodeSetParams",
                    "cuGraphExecMemsetNodeSetParams",
                    "cuGraphExecNodeSetParams",
                    "cuGraphAddNode",
                ]
                .iter()
                .any(|p| s.starts_with(p))
            },
            10,
        );
        assert!(missed.is_empty(), "not intercepted: {missed:?}");
    }

    #[test]
    fn every_call_that_gives_out_a_memory_pool_or_makes_one_current_is_intercepted() {
        // A stream-ordered allocation from a pool the library does not know is charged to the
        // current context's device, whichever device the pool is on; making a pool current
        // while another thread allocates from the device's current pool lets it take from a
        // pool whose reservation was not read.
        let missed = exports_not_intercepted(
            |s| {
                [
                    "GetMemPool",
                    "GetDefaultMemPool",
                    "SetMemPool",
                    "cuMemPoolCreate",
                ]
                .iter()
                .any(|p| s.contains(p))
            },
            7,
        );
        assert!(missed.is_empty(), "not intercepted: {missed:?}");
    }

    #[test]
    fn every_call_the_driver_exports_to_create_a_context_is_intercepted() {
        // Each context takes device memory the driver reserves: one the library does not see
        // is not charged (the interop contexts of OpenGL and VDPAU included).
        let missed = exports_not_intercepted(|s| s.contains("CtxCreate"), 7);
        assert!(missed.is_empty(), "not intercepted: {missed:?}");
    }
}
