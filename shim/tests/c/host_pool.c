/* A tenant taking stream-ordered memory from a pool in host memory (cuMemPoolCreate located
 * on host NUMA node 0, page-locked host memory the GPU can reach), then filling its GPU:
 *   host     CHUNK bytes from the host pool until one is refused or HOST_MAX are held, then
 *            1 MiB ones by cuMemAlloc until one is refused;
 *   reuse    a host pool made, allocated from, freed and destroyed, then a pool on the GPU
 *            made in its place (the driver may give it the same handle), and CHUNK bytes
 *            from that pool until one is refused, then 1 MiB ones by cuMemAlloc.
 * CUDA 13's pools by location, the host's (no NUMA node named):
 *   default13  the host's default pool (cuMemGetDefaultMemPool), then as "host";
 *   current13  the host's current pool (cuMemGetMemPool; none set: the default), the same;
 *   set13      a host pool of its own made the host's current one (cuMemSetMemPool), then
 *              asked for again (cuMemGetMemPool), the same;
 *   forged13   a pool on the GPU named the host's current pool (cuMemSetMemPool; "set=" the
 *              driver's answer), the host's current pool asked for, then CHUNK bytes from
 *              the GPU's pool until one is refused, then 1 MiB ones by cuMemAlloc.
 * Prints "host=N device=M [same=S]": allocations granted from the host pool and from the
 * GPU (chunks of the GPU's pool counted in MiB), and whether the GPU's pool had the host
 * pool's handle.
 *
 *   host_pool host|reuse|default13|current13|set13|forged13 CHUNK [HOST_MAX] */
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
int cuStreamSynchronize(CUstream);
int cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
int cuMemFreeAsync(CUdeviceptr, CUstream);
int cuMemAlloc_v2(CUdeviceptr *, size_t);
int cuMemPoolCreate(CUmemoryPool *, const CUmemPoolProps *);
int cuMemPoolDestroy(CUmemoryPool);
int cuMemGetDefaultMemPool(CUmemoryPool *, CUmemLocation *, int);
int cuMemGetMemPool(CUmemoryPool *, CUmemLocation *, int);
int cuMemSetMemPool(CUmemLocation *, int, CUmemoryPool);

enum { PINNED = 1, LOCATION_DEVICE = 1, LOCATION_HOST = 2, LOCATION_HOST_NUMA = 3 };

static int pool_at(CUmemoryPool *pool, int type) {
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = PINNED;
    props.location.type = type;
    props.location.id = 0;
    return cuMemPoolCreate(pool, &props);
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: host_pool host|reuse CHUNK [HOST_MAX]\n"); return 2; }
    const char *mode = argv[1];
    size_t chunk = strtoull(argv[2], 0, 10);
    long host_max = argc > 3 ? atol(argv[3]) : 1000000;
    CUcontext ctx;
    CUstream stream;
    CUmemoryPool host, device;
    CUdeviceptr p;
    int r;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx)
        || cuStreamCreate(&stream, 1)) {
        printf("error=init\n");
        return 1;
    }
    CUmemLocation the_host = {LOCATION_HOST, 0};
    if (strcmp(mode, "default13") == 0) r = cuMemGetDefaultMemPool(&host, &the_host, PINNED);
    else if (strcmp(mode, "current13") == 0) r = cuMemGetMemPool(&host, &the_host, PINNED);
    else if (strcmp(mode, "set13") == 0) {
        if (!(r = pool_at(&host, LOCATION_HOST)) && !(r = cuMemSetMemPool(&the_host, PINNED, host)))
            r = cuMemGetMemPool(&host, &the_host, PINNED);
    } else if (strcmp(mode, "forged13") == 0) {
        if (!(r = pool_at(&device, LOCATION_DEVICE))) {
            printf("set=%d ", cuMemSetMemPool(&the_host, PINNED, device));
            r = cuMemGetMemPool(&host, &the_host, PINNED);
        }
    } else r = pool_at(&host, LOCATION_HOST_NUMA);
    if (r) {
        printf("error=host-pool-%d\n", r);
        return 1;
    }
    long host_chunks = 0, device_mib = 0;
    int same = 0;
    if (strcmp(mode, "forged13") == 0) {
        while (cuMemAllocFromPoolAsync(&p, chunk, device, stream) == 0)
            device_mib += (long)(chunk >> 20);
    } else if (strcmp(mode, "reuse") != 0) {
        while (host_chunks < host_max && cuMemAllocFromPoolAsync(&p, chunk, host, stream) == 0)
            host_chunks++;
    } else {
        if (cuMemAllocFromPoolAsync(&p, chunk, host, stream) || cuMemFreeAsync(p, stream)
            || cuStreamSynchronize(stream) || cuMemPoolDestroy(host)
            || (r = pool_at(&device, LOCATION_DEVICE))) {
            printf("error=reuse\n");
            return 1;
        }
        same = device == host;
        while (cuMemAllocFromPoolAsync(&p, chunk, device, stream) == 0)
            device_mib += (long)(chunk >> 20);
    }
    while (cuMemAlloc_v2(&p, 1 << 20) == 0) device_mib++;
    printf("host=%ld device=%ld same=%d\n", host_chunks, device_mib, same);
    return 0;
}
