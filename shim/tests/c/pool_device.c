/* A tenant with a slice of two GPUs making stream-ordered allocations on GPU 1 while GPU 0's
 * context is current, by each way the driver offers, then filling GPU 1 as its own context
 * sees it:
 *   stream   cuMemAllocAsync on a stream of GPU 1's context (the allocation comes from the
 *            pool current to the stream's device);
 *   pool     cuMemAllocFromPoolAsync from GPU 1's current pool, as cuDeviceGetMemPool gives it;
 *   pool13   the same, the pool from CUDA 13's cuMemGetMemPool;
 *   default13  the same, the pool from CUDA 13's cuMemGetDefaultMemPool;
 *   set13    a pool of its own made GPU 1's current one by CUDA 13's cuMemSetMemPool, then
 *            cuMemAllocAsync on a stream of GPU 1.
 * Allocations of CHUNK bytes until one is refused, then 1 MiB ones by cuMemAlloc in GPU 1's
 * context until one is refused. An allocation charged to the wrong GPU lets GPU 1 hold more
 * than its slice. Prints "async=N plain=M" (allocations granted), then holds everything until
 * stdin closes.
 *
 *   pool_device stream|pool|pool13|default13|set13 CHUNK */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void *CUcontext, *CUstream, *CUmemoryPool;
typedef unsigned long long CUdeviceptr;
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
    int allocType;
    int handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(CUcontext *, int);
int cuCtxSetCurrent(CUcontext);
int cuStreamCreate(CUstream *, unsigned);
int cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
int cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
int cuMemAlloc_v2(CUdeviceptr *, size_t);
int cuDeviceGetMemPool(CUmemoryPool *, int);
int cuMemPoolCreate(CUmemoryPool *, const CUmemPoolProps *);
int cuMemGetMemPool(CUmemoryPool *, CUmemLocation *, int);
int cuMemGetDefaultMemPool(CUmemoryPool *, CUmemLocation *, int);
int cuMemSetMemPool(CUmemLocation *, int, CUmemoryPool);

enum { LOCATION_DEVICE = 1, PINNED = 1 };

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: pool_device MODE CHUNK\n"); return 2; }
    const char *mode = argv[1];
    size_t chunk = strtoull(argv[2], 0, 10);
    CUcontext ctx0, ctx1;
    CUstream on1, on0;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx0, 0) || cuDevicePrimaryCtxRetain(&ctx1, 1)
        || cuCtxSetCurrent(ctx1) || cuStreamCreate(&on1, 1) || cuCtxSetCurrent(ctx0)
        || cuStreamCreate(&on0, 1)) {
        printf("error=init\n");
        return 1;
    }
    CUmemLocation gpu1 = {LOCATION_DEVICE, 1};
    CUmemoryPool pool = 0;
    int r = 0;
    if (!strcmp(mode, "pool")) {
        r = cuDeviceGetMemPool(&pool, 1);
    } else if (!strcmp(mode, "pool13")) {
        r = cuMemGetMemPool(&pool, &gpu1, PINNED);
    } else if (!strcmp(mode, "default13")) {
        r = cuMemGetDefaultMemPool(&pool, &gpu1, PINNED);
    } else if (!strcmp(mode, "set13")) {
        CUmemoryPool own;
        CUmemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = PINNED;
        props.location = gpu1;
        r = cuMemPoolCreate(&own, &props);
        if (!r) r = cuMemSetMemPool(&gpu1, PINNED, own);
    } else if (strcmp(mode, "stream")) {
        fprintf(stderr, "pool_device: unknown mode %s\n", mode);
        return 2;
    }
    if (r) { printf("error=pool code=%d\n", r); return 1; }
    long async = 0, plain = 0;
    for (;;) {
        CUdeviceptr p;
        r = pool ? cuMemAllocFromPoolAsync(&p, chunk, pool, on0) : cuMemAllocAsync(&p, chunk, on1);
        if (r) break;
        async++;
    }
    if (cuCtxSetCurrent(ctx1)) { printf("error=switch\n"); return 1; }
    for (;;) {
        CUdeviceptr p;
        if (cuMemAlloc_v2(&p, 1 << 20)) break;
        plain++;
    }
    printf("async=%ld plain=%ld last=%d\n", async, plain, r);
    fflush(stdout);
    char c;
    while (fread(&c, 1, 1, stdin) == 1) {}
    return 0;
}
