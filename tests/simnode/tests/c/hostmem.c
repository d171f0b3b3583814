/* Page-locked host memory, allocated by the driver and registered, as CUDA programs use it
 * for copies. Prints key=value pairs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
int cuInit(unsigned);
int cuCtxCreate_v2(CUcontext *, unsigned, int);
int cuMemHostAlloc(void **, size_t, unsigned);
int cuMemAllocHost_v2(void **, size_t);
int cuMemFreeHost(void *);
int cuMemHostRegister_v2(void *, size_t, unsigned);
int cuMemHostUnregister(void *);
int cuMemHostGetDevicePointer_v2(CUdeviceptr *, void *, unsigned);
int cuMemHostGetFlags(unsigned *, void *);
int cuPointerGetAttribute(void *, int, CUdeviceptr);
int cuMemAlloc_v2(CUdeviceptr *, size_t);
int cuMemcpyHtoDAsync_v2(CUdeviceptr, const void *, size_t, void *);
int cuMemcpyDtoHAsync_v2(void *, CUdeviceptr, size_t, void *);
int cuMemcpy(CUdeviceptr, CUdeviceptr, size_t);
int cuMemGetInfo_v2(size_t *, size_t *);

int main(void) {
    CUcontext ctx = 0;
    printf("no_context=%d ", cuMemAllocHost_v2(&(void *){0}, 64));
    if (cuInit(0) || cuCtxCreate_v2(&ctx, 0, 0)) { printf("error=init\n"); return 1; }
    size_t free_before = 0, free_after = 0, total = 0;
    cuMemGetInfo_v2(&free_before, &total);

    void *pinned = 0, *plain = 0;
    size_t n = 1 << 20;
    printf("alloc=%d ", cuMemHostAlloc(&pinned, n, 0x02 /* DEVICEMAP */));
    printf("alloc_bad_flags=%d ", cuMemHostAlloc(&plain, n, 0x80));
    cuMemGetInfo_v2(&free_after, &total);
    printf("device_memory_taken=%zu ", free_before - free_after);
    unsigned flags = 0;
    cuMemHostGetFlags(&flags, (char *)pinned + 100);
    printf("flags=%u ", flags);
    CUdeviceptr mapped = 0;
    int r = cuMemHostGetDevicePointer_v2(&mapped, pinned, 0);
    printf("device_pointer=%d same_address=%d ", r, mapped == (CUdeviceptr)pinned);
    unsigned type = 0; int ordinal = -1; CUcontext owner = 0; size_t size = 0;
    cuPointerGetAttribute(&type, 2, (CUdeviceptr)pinned + 8);
    cuPointerGetAttribute(&ordinal, 9, (CUdeviceptr)pinned);
    cuPointerGetAttribute(&owner, 1, (CUdeviceptr)pinned);
    cuPointerGetAttribute(&size, 12, (CUdeviceptr)pinned);
    printf("type=%u ordinal=%d owner=%d size=%zu ", type, ordinal, owner == ctx, size);

    /* Copies through the pinned buffer. */
    CUdeviceptr d = 0;
    cuMemAlloc_v2(&d, n);
    memset(pinned, 0x42, n);
    cuMemcpyHtoDAsync_v2(d, pinned, n, 0);
    memset(pinned, 0, n);
    cuMemcpyDtoHAsync_v2(pinned, d, n, 0);
    printf("round_trip=%d ", ((unsigned char *)pinned)[n - 1] == 0x42);
    printf("free_host=%d ", cuMemFreeHost(pinned));
    printf("free_again=%d ", cuMemFreeHost(pinned));
    printf("unknown_type=%d ", cuPointerGetAttribute(&type, 2, (CUdeviceptr)pinned));

    /* The program's own memory, registered. */
    plain = aligned_alloc(4096, n);
    printf("register=%d ", cuMemHostRegister_v2(plain, n, 0x01 /* PORTABLE */));
    printf("register_again=%d ", cuMemHostRegister_v2((char *)plain + 4096, 4096, 0));
    type = 0;
    cuPointerGetAttribute(&type, 2, (CUdeviceptr)plain + 4096);
    printf("registered_type=%u ", type);
    memset(plain, 0x17, n);
    printf("unified_copy=%d ", cuMemcpy(d, (CUdeviceptr)plain, n));
    printf("free_registered=%d ", cuMemFreeHost(plain));
    printf("unregister_inside=%d ", cuMemHostUnregister((char *)plain + 4096));
    printf("unregister=%d ", cuMemHostUnregister(plain));
    printf("unregister_again=%d\n", cuMemHostUnregister(plain));
    free(plain);
    return 0;
}
