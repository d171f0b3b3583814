/* Managed memory's hints: prefetching, advice and what the range reports back. Prints
 * key=value pairs. */
#include <stdio.h>

typedef void *CUcontext, *CUstream;
typedef unsigned long long CUdeviceptr;
typedef struct { int type; int id; } CUmemLocation;
int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(CUcontext *, int);
int cuCtxSetCurrent(CUcontext);
int cuMemAllocManaged(CUdeviceptr *, size_t, unsigned);
int cuMemAlloc_v2(CUdeviceptr *, size_t);
int cuMemFree_v2(CUdeviceptr);
int cuPointerGetAttribute(void *, int, CUdeviceptr);
int cuMemPrefetchAsync(CUdeviceptr, size_t, int, CUstream);
int cuMemPrefetchAsync_v2(CUdeviceptr, size_t, CUmemLocation, unsigned, CUstream);
int cuMemAdvise(CUdeviceptr, size_t, int, int);
int cuMemAdvise_v2(CUdeviceptr, size_t, int, CUmemLocation);
int cuMemRangeGetAttribute(void *, size_t, int, CUdeviceptr, size_t);
int cuMemRangeGetAttributes(void **, size_t *, int *, size_t, CUdeviceptr, size_t);

static int range(CUdeviceptr p, int attribute) {
    int v = 99;
    int r = cuMemRangeGetAttribute(&v, sizeof v, attribute, p, 4096);
    return r ? -1000 - r : v;
}

int main(void) {
    CUcontext ctx;
    CUdeviceptr m = 0, plain = 0;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx)
        || cuMemAllocManaged(&m, 1 << 20, 1) || cuMemAlloc_v2(&plain, 1 << 20)) {
        printf("error=init\n");
        return 1;
    }
    int managed = -1, not_managed = -1;
    cuPointerGetAttribute(&managed, 8, m + 100);
    cuPointerGetAttribute(&not_managed, 8, plain);
    printf("is_managed=%d,%d ", managed, not_managed);
    /* Nothing said yet: -2 is no location. */
    int fresh[3] = {range(m, 1), range(m, 2), range(m, 4)};
    printf("fresh=%d,%d,%d ", fresh[0], fresh[1], fresh[2]);
    printf("prefetch=%d ", cuMemPrefetchAsync(m, 1 << 20, 1, 0));
    printf("last=%d ", range(m, 4));
    CUmemLocation host = {2, 0}, dev0 = {1, 0};
    printf("prefetch_host=%d ", cuMemPrefetchAsync_v2(m, 4096, host, 0, 0));
    int last = range(m, 4), type = range(m, 7);
    printf("last=%d,type=%d ", last, type);
    printf("read_mostly=%d ", cuMemAdvise(m, 1 << 20, 1, 0));
    printf("preferred=%d ", cuMemAdvise_v2(m, 4096, 3, dev0));
    int to_1 = cuMemAdvise(m, 4096, 5, 1);
    int to_cpu = cuMemAdvise(m, 4096, 5, -1);
    printf("accessed=%d,%d ", to_1, to_cpu);
    int by[4] = {7, 7, 7, 7};
    cuMemRangeGetAttribute(by, sizeof by, 3, m, 4096);
    int said[3] = {range(m, 1), range(m, 2), range(m, 6)};
    printf("said=%d,%d,%d by=%d,%d,%d,%d ", said[0], said[1], said[2], by[0], by[1], by[2], by[3]);
    int rm = 0, pl = 0;
    void *data[2] = {&rm, &pl};
    size_t sizes[2] = {4, 4};
    int attrs[2] = {1, 2};
    int several = cuMemRangeGetAttributes(data, sizes, attrs, 2, m, 4096);
    printf("several=%d,%d,%d ", several, rm, pl);
    printf("unset=%d ", cuMemAdvise(m, 4096, 4, 0));
    printf("preferred_now=%d\n", range(m, 2));
    /* Refused as by the driver: memory that is not managed, a range running past the
     * allocation, a device the process does not have, advice that does not exist. */
    printf("plain=%d ", cuMemPrefetchAsync(plain, 4096, 0, 0));
    printf("past_end=%d ", cuMemPrefetchAsync(m, 2 << 20, 0, 0));
    printf("bad_device=%d ", cuMemPrefetchAsync(m, 4096, 9, 0));
    printf("bad_advice=%d ", cuMemAdvise(m, 4096, 9, 0));
    printf("bad_size=%d ", cuMemRangeGetAttribute(&rm, 8, 1, m, 4096));
    cuMemFree_v2(m);
    printf("freed=%d\n", cuMemPrefetchAsync(m, 4096, 0, 0));
    return 0;
}
