/* Every allocation path of the simulated driver, called as cuda.h declares it: prints, per
 * path, the bytes the device lost (from cuMemGetInfo) and whether freeing gave them back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct { size_t Width, Height; int Format; unsigned NumChannels; } CUDA_ARRAY_DESCRIPTOR;
typedef struct { size_t Width, Height, Depth; int Format; unsigned NumChannels, Flags; } CUDA_ARRAY3D_DESCRIPTOR;
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
    int type; int requestedHandleTypes; CUmemLocation location; void *win32HandleMetaData;
    struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage; unsigned char reserved[4]; } allocFlags;
} CUmemAllocationProp;
typedef struct {
    int allocType; int handleTypes; CUmemLocation location; void *win32SecurityAttributes;
    size_t maxSize; unsigned short usage; unsigned char reserved[54];
} CUmemPoolProps;
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;

CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemPoolCreate(CUmemoryPool *, const CUmemPoolProps *);
CUresult cuMemPoolDestroy(CUmemoryPool);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuArrayCreate_v2(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
CUresult cuArray3DCreate_v2(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
CUresult cuArrayDestroy(CUarray);
CUresult cuMipmappedArrayCreate(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned);
CUresult cuMipmappedArrayDestroy(CUmipmappedArray);
CUresult cuMemGetAllocationGranularity(size_t *, const CUmemAllocationProp *, int);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuMemAddressReserve(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
CUresult cuMemAddressFree(CUdeviceptr, size_t);
CUresult cuMemMap(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
CUresult cuMemUnmap(CUdeviceptr, size_t);
CUresult cuMemSetAccess(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *, CUmemGenericAllocationHandle);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemsetD8_v2(CUdeviceptr, unsigned char, size_t);
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuStreamSynchronize(CUstream);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
CUresult cuCtxSetLimit(int, size_t);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuDevicePrimaryCtxReset_v2(CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxGetLimit(size_t *, int);
CUresult cuFuncGetAttribute(int *, int, CUfunction);

static size_t free_now(void) { size_t f = 0, t = 0; cuMemGetInfo_v2(&f, &t); return f; }

static void report(const char *path, CUresult rc, size_t before, size_t during, size_t after) {
    printf("path=%s rc=%d charged=%zu restored=%d\n", path, rc, before - during, after == before);
}

int main(void) {
    CUdevice dev; CUcontext ctx; CUstream stream;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev)) { puts("init failed"); return 1; }
    cuStreamCreate(&stream, 0);
    size_t b, d; CUdeviceptr p; CUresult rc;

    /* Limits backed by device memory: the stack for every resident thread (T4: 40 SMs x 1024),
     * the malloc heap and the printf FIFO byte for byte; put back, they give it back. */
    const int limits[] = { 0, 2, 1 };
    const char *limit_names[] = { "stack", "heap", "fifo" };
    for (int i = 0; i < 3; i++) {
        size_t was = 0;
        cuCtxGetLimit(&was, limits[i]);
        b = free_now(); rc = cuCtxSetLimit(limits[i], was + 1000); d = free_now(); cuCtxSetLimit(limits[i], was);
        report(limit_names[i], rc, b, d, free_now());
    }

    size_t pitch = 0;
    b = free_now(); rc = cuMemAllocPitch_v2(&p, &pitch, 1000, 3, 4); d = free_now(); cuMemFree_v2(p);
    report("pitch", rc, b, d, free_now()); printf("pitch=%zu\n", pitch);

    b = free_now(); rc = cuMemAllocManaged(&p, 12345, 1); d = free_now(); cuMemFree_v2(p);
    report("managed", rc, b, d, free_now());

    b = free_now(); rc = cuMemAllocAsync(&p, 4096, stream); d = free_now(); cuMemFreeAsync(p, stream); cuStreamSynchronize(stream);
    report("async", rc, b, d, free_now());

    CUmemPoolProps props; memset(&props, 0, sizeof props);
    props.allocType = 1; props.location.type = 1; props.location.id = 0;
    CUmemoryPool pool;
    cuMemPoolCreate(&pool, &props);
    b = free_now(); rc = cuMemAllocFromPoolAsync(&p, 8192, pool, stream); d = free_now(); cuMemFreeAsync(p, stream);
    report("pool", rc, b, d, free_now()); cuMemPoolDestroy(pool);

    CUDA_ARRAY_DESCRIPTOR a2 = { 100, 10, 0x20, 4 }; CUarray arr;
    b = free_now(); rc = cuArrayCreate_v2(&arr, &a2); d = free_now(); cuArrayDestroy(arr);
    report("array2d", rc, b, d, free_now());

    CUDA_ARRAY3D_DESCRIPTOR a3 = { 8, 8, 8, 0x10, 2, 0 };
    b = free_now(); rc = cuArray3DCreate_v2(&arr, &a3); d = free_now(); cuArrayDestroy(arr);
    report("array3d", rc, b, d, free_now());

    CUDA_ARRAY3D_DESCRIPTOR m = { 8, 4, 0, 0x01, 1, 0 }; CUmipmappedArray mip;
    b = free_now(); rc = cuMipmappedArrayCreate(&mip, &m, 4); d = free_now(); cuMipmappedArrayDestroy(mip);
    report("mipmapped", rc, b, d, free_now());

    CUmemAllocationProp prop; memset(&prop, 0, sizeof prop);
    prop.type = 1; prop.location.type = 1; prop.location.id = 0;
    size_t gran = 0; cuMemGetAllocationGranularity(&gran, &prop, 0);
    CUmemGenericAllocationHandle h; CUdeviceptr va;
    b = free_now(); rc = cuMemCreate(&h, 2 * gran, &prop, 0); d = free_now();
    cuMemAddressReserve(&va, 2 * gran, 0, 0, 0);
    int mapped = cuMemMap(va, 2 * gran, 0, h, 0);
    CUmemAccessDesc access = { { 1, 0 }, 3 };
    int accessible = cuMemSetAccess(va, 2 * gran, &access, 1);
    memset((void *)va, 7, 64);
    int readback = ((unsigned char *)va)[63] == 7;
    cuMemUnmap(va, 2 * gran); cuMemAddressFree(va, 2 * gran); cuMemRelease(h);
    report("vmm", rc, b, d, free_now());
    printf("granularity=%zu vmm_map=%d vmm_access=%d vmm_readback=%d\n", gran, mapped, accessible, readback);

    /* A range striped over two allocations, as the CUDA sample vectorAddMMAP lays one over
     * its GPUs: access is set on mapped ranges only, and copies and memsets cross from one
     * mapping to the next once both are accessible. */
    CUmemGenericAllocationHandle h1, h2; CUdeviceptr striped;
    cuMemCreate(&h1, gran, &prop, 0); cuMemCreate(&h2, gran, &prop, 0);
    cuMemAddressReserve(&striped, 2 * gran, 0, 0, 0);
    cuMemMap(striped, gran, 0, h1, 0);
    int unmapped_access = cuMemSetAccess(striped, 2 * gran, &access, 1);
    cuMemMap(striped + gran, gran, 0, h2, 0);
    cuMemSetAccess(striped + gran, gran, &access, 1);
    unsigned char *host = malloc(2 * gran);
    memset(host, 5, 2 * gran);
    int half_accessible = cuMemcpyHtoD_v2(striped, host, 2 * gran);
    cuMemSetAccess(striped, gran, &access, 1);
    int striped_copy = cuMemcpyHtoD_v2(striped, host, 2 * gran);
    int striped_set = cuMemsetD8_v2(striped + gran - 16, 9, 32);
    memset(host, 0, 2 * gran);
    int striped_back = cuMemcpyDtoH_v2(host, striped, 2 * gran);
    int striped_ok = host[0] == 5 && host[gran - 17] == 5 && host[gran - 16] == 9
        && host[gran + 15] == 9 && host[gran + 16] == 5 && host[2 * gran - 1] == 5;
    int beyond = cuMemcpyHtoD_v2(striped + gran, host, 2 * gran);
    cuMemUnmap(striped, 2 * gran); cuMemAddressFree(striped, 2 * gran);
    cuMemRelease(h1); cuMemRelease(h2); free(host);
    printf("striped_unmapped_access=%d striped_half_accessible=%d ", unmapped_access, half_accessible);
    printf("striped_copy=%d striped_set=%d striped_back=%d striped_ok=%d striped_beyond=%d\n",
           striped_copy, striped_set, striped_back, striped_ok, beyond);

    /* The properties an allocation was made with, compression only where the device has it
     * (the T4 has none), as the CUDA sample cudaCompressibleMemory checks. */
    CUmemAllocationProp asked = prop, got;
    asked.allocFlags.compressionType = 1; /* CU_MEM_ALLOCATION_COMP_GENERIC */
    CUmemGenericAllocationHandle hc;
    cuMemCreate(&hc, gran, &asked, 0);
    memset(&got, 0x55, sizeof got);
    rc = cuMemGetAllocationPropertiesFromHandle(&got, hc);
    printf("properties=%d,%d,%d,%d,%d ", rc, got.type, got.location.type, got.location.id,
           got.allocFlags.compressionType);
    cuMemRelease(hc);
    printf("released_properties=%d\n", cuMemGetAllocationPropertiesFromHandle(&got, hc));

    void *f = 0; int status = -1;
    cuGetProcAddress_v2("cuLaunchKernel", &f, 12000, 0, &status);
    int legacy = f == (void *)cuLaunchKernel;
    cuGetProcAddress_v2("cuLaunchKernel", &f, 12000, 2, &status);
    int per_thread = f == (void *)cuLaunchKernel_ptsz;
    CUmodule mod; CUfunction fn;
    cuModuleLoadData(&mod, "fake image");
    cuModuleGetFunction(&fn, mod, "kernel");
    int launch = cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, stream, 0, 0);
    int empty_grid = cuLaunchKernel(fn, 0, 1, 1, 32, 1, 1, 0, stream, 0, 0);
    printf("lookup_legacy=%d lookup_per_thread=%d launch=%d empty_grid=%d\n", legacy, per_thread, launch, empty_grid);

    /* A kernel whose threads need 3000 bytes of local memory: its launch grows the stack from
     * 1 KiB to that for every resident thread, and it stays grown until put back. One needing
     * 512 KiB a thread (20 GiB on the T4) is refused, the stack left as it was. */
    const char *deep_ptx =
        ".version 7.0\n.target sm_75\n.address_size 64\n"
        ".visible .entry deep()\n{\n\t.local .align 8 .b8 __local_depot0[3000];\n\tret;\n}\n"
        ".visible .entry huge()\n{\n\t.local .align 8 .b8 __local_depot1[524288];\n\tret;\n}\n";
    CUfunction deep, huge;
    cuModuleLoadData(&mod, deep_ptx);
    cuModuleGetFunction(&deep, mod, "deep");
    cuModuleGetFunction(&huge, mod, "huge");
    int local = 0;
    cuFuncGetAttribute(&local, 3, deep);
    size_t was = 0, grown = 0, after_huge = 0;
    cuCtxGetLimit(&was, 0);
    b = free_now(); rc = cuLaunchKernel(deep, 1, 1, 1, 1, 1, 1, 0, stream, 0, 0); d = free_now();
    cuCtxGetLimit(&grown, 0);
    int again = cuLaunchKernel(deep, 1, 1, 1, 1, 1, 1, 0, stream, 0, 0);
    size_t after_again = free_now();
    int refused = cuLaunchKernel(huge, 1, 1, 1, 1, 1, 1, 0, stream, 0, 0);
    cuCtxGetLimit(&after_huge, 0);
    cuCtxSetLimit(0, was);
    report("launch_local", rc, b, d, free_now());
    printf("local_size=%d stack_grown_to=%zu again=%d again_charged=%zu huge=%d stack_after_huge=%zu\n",
           local, grown, again, d - after_again, refused, after_huge);

    /* Resetting the primary context (cudaDeviceReset) frees what was allocated in it, its
     * pools' reservations and its raised limits; the other context's memory stays. */
    CUdeviceptr kept;
    cuMemAllocManaged(&kept, 4096, 1);
    CUcontext primary;
    b = free_now();
    cuDevicePrimaryCtxRetain(&primary, dev);
    cuCtxSetCurrent(primary);
    cuMemAllocManaged(&p, 1 << 20, 1);
    cuMemAllocAsync(&p, 4096, 0);
    cuCtxSetLimit(2, 16 << 20);
    d = free_now();
    rc = cuDevicePrimaryCtxReset_v2(dev);
    cuCtxSetCurrent(ctx);
    report("reset", rc, b, d, free_now());
    printf("kept_freed=%d\n", cuMemFree_v2(kept));
    return 0;
}
