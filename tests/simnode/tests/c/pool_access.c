/* Which devices reach a memory pool's allocations, as a multi-GPU program sets it
 * (cudaMemPoolSetAccess: PyTorch's stream-ordered allocator between peers, cuda.core's memory
 * resources). Prints key=value pairs. */
#include <stdio.h>

typedef void *CUcontext, *CUmemoryPool;
typedef struct { int type; int id; } CUmemLocation;
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;
typedef struct {
    int allocType, handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;
int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(CUcontext *, int);
int cuCtxSetCurrent(CUcontext);
int cuDeviceGetDefaultMemPool(CUmemoryPool *, int);
int cuMemPoolCreate(CUmemoryPool *, const CUmemPoolProps *);
int cuMemPoolDestroy(CUmemoryPool);
int cuMemPoolSetAccess(CUmemoryPool, const CUmemAccessDesc *, size_t);
int cuMemPoolGetAccess(int *, CUmemoryPool, CUmemLocation *);

static int get(CUmemoryPool pool, int dev) {
    CUmemLocation at = {1, dev};
    int flags = -1, rc = cuMemPoolGetAccess(&flags, pool, &at);
    return rc ? -rc : flags;
}

int main(void) {
    CUcontext c0 = 0;
    CUmemoryPool dflt = 0, mine = 0;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&c0, 0) || cuCtxSetCurrent(c0)
        || cuDeviceGetDefaultMemPool(&dflt, 0)) {
        printf("error=init\n");
        return 1;
    }
    CUmemPoolProps props = {0};
    props.allocType = 1;
    props.location.type = 1;
    props.location.id = 0;
    if (cuMemPoolCreate(&mine, &props)) { printf("error=pool\n"); return 1; }
    /* Its own device reads and writes (3), another nothing (0) until set. */
    printf("own=%d other=%d ", get(mine, 0), get(mine, 1));
    CUmemAccessDesc rw = {{1, 1}, 3}, ro = {{1, 1}, 1}, none = {{1, 1}, 0};
    printf("set_rw=%d ", cuMemPoolSetAccess(mine, &rw, 1));
    printf("other_rw=%d default_other=%d ", get(mine, 1), get(dflt, 1));
    printf("set_ro=%d ", cuMemPoolSetAccess(mine, &ro, 1));
    printf("other_ro=%d ", get(mine, 1));
    /* Descriptors are checked before any applies: a bad flag, location type or device. */
    CUmemAccessDesc bad_flags[2] = {none, {{1, 1}, 2}};
    CUmemAccessDesc bad_type[2] = {none, {{2, 1}, 3}};
    CUmemAccessDesc bad_dev[2] = {none, {{1, 9}, 3}};
    printf("bad_flags=%d ", cuMemPoolSetAccess(mine, bad_flags, 2));
    printf("bad_type=%d ", cuMemPoolSetAccess(mine, bad_type, 2));
    printf("bad_dev=%d ", cuMemPoolSetAccess(mine, bad_dev, 2));
    printf("still_ro=%d ", get(mine, 1));
    CUmemAccessDesc own_none = {{1, 0}, 0};
    printf("set_own=%d ", cuMemPoolSetAccess(mine, &own_none, 1));
    printf("own_after=%d ", get(mine, 0));
    printf("set_none=%d ", cuMemPoolSetAccess(mine, &none, 1));
    printf("other_none=%d ", get(mine, 1));
    printf("set_default=%d ", cuMemPoolSetAccess(dflt, &rw, 1));
    printf("default_rw=%d ", get(dflt, 1));
    printf("get_bad_dev=%d\n", get(mine, 9));
    cuMemPoolDestroy(mine);
    return 0;
}
