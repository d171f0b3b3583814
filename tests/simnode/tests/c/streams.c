/* Streams, events, copies, fills and pointer queries on the simulated driver, as a CUDA
 * program uses them. Prints key=value pairs on one line. */
#include <stdio.h>
#include <string.h>

typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUstream, *CUevent;
int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(CUcontext *, int);
int cuCtxSetCurrent(CUcontext);
int cuMemAlloc_v2(CUdeviceptr *, size_t);
int cuMemFree_v2(CUdeviceptr);
int cuStreamCreateWithPriority(CUstream *, unsigned, int);
int cuStreamGetPriority(CUstream, int *);
int cuStreamGetCtx(CUstream, CUcontext *);
int cuStreamQuery(CUstream);
int cuStreamDestroy_v2(CUstream);
int cuStreamSynchronize(CUstream);
int cuLaunchHostFunc(CUstream, void (*)(void *), void *);
int cuEventCreate(CUevent *, unsigned);
int cuEventRecord(CUevent, CUstream);
int cuEventQuery(CUevent);
int cuEventSynchronize(CUevent);
int cuEventElapsedTime(float *, CUevent, CUevent);
int cuEventDestroy_v2(CUevent);
int cuStreamWaitEvent(CUstream, CUevent, unsigned);
int cuMemcpyHtoDAsync_v2(CUdeviceptr, const void *, size_t, CUstream);
int cuMemcpyDtoD_v2(CUdeviceptr, CUdeviceptr, size_t);
int cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
int cuMemsetD32_v2(CUdeviceptr, unsigned, size_t);
int cuMemcpy(CUdeviceptr, CUdeviceptr, size_t);
int cuPointerGetAttribute(void *, int, CUdeviceptr);
int cuMemGetAddressRange_v2(CUdeviceptr *, size_t *, CUdeviceptr);

typedef struct {
    size_t srcXInBytes, srcY; unsigned srcMemoryType; const void *srcHost; CUdeviceptr srcDevice; void *srcArray;
    size_t srcPitch, dstXInBytes, dstY; unsigned dstMemoryType; void *dstHost; CUdeviceptr dstDevice; void *dstArray;
    size_t dstPitch, WidthInBytes, Height;
} CUDA_MEMCPY2D;
int cuMemcpy2D_v2(const CUDA_MEMCPY2D *);
int cuMemsetD2D8_v2(CUdeviceptr, size_t, unsigned char, size_t, size_t);

static void host_fn(void *p) { *(int *)p = 42; }

int main(void) {
    CUcontext ctx, sctx = 0;
    CUstream s;
    CUevent a, b;
    CUdeviceptr d1, d2;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx)) { printf("error=init\n"); return 1; }
    cuMemAlloc_v2(&d1, 4096);
    cuMemAlloc_v2(&d2, 4096);
    int prio = 1;
    int r = cuStreamCreateWithPriority(&s, 1, -9);
    cuStreamGetPriority(s, &prio);
    cuStreamGetCtx(s, &sctx);
    int q = cuStreamQuery(s);
    printf("create=%d priority=%d stream_ctx=%d query=%d ", r, prio, sctx == ctx, q);
    int flag = 0;
    r = cuLaunchHostFunc(s, host_fn, &flag);
    printf("host_fn=%d ran=%d ", r, flag == 42);
    cuEventCreate(&a, 0);
    cuEventCreate(&b, 0);
    int rec = cuEventRecord(a, s);
    char src[4096], back[4096];
    for (int i = 0; i < 4096; i++) src[i] = (char)i;
    int h2d = cuMemcpyHtoDAsync_v2(d1, src, 4096, s);
    int d2d = cuMemcpyDtoD_v2(d2, d1, 4096);
    int d2h = cuMemcpyDtoH_v2(back, d2, 4096);
    cuEventRecord(b, s);
    float ms = -1;
    int wait = cuStreamWaitEvent(s, b, 0);
    int query = cuEventQuery(b), sync = cuEventSynchronize(b);
    int elapsed = cuEventElapsedTime(&ms, a, b);
    printf("record=%d h2d=%d d2d=%d d2h=%d same=%d wait=%d query_event=%d sync_event=%d elapsed=%d ms_ok=%d ", rec, h2d, d2d,
           d2h, memcmp(src, back, 4096) == 0, wait, query, sync, elapsed, ms >= 0 && ms < 1000);
    int fill = cuMemsetD32_v2(d1, 0xdeadbeef, 1024);
    unsigned word = 0;
    cuMemcpy((CUdeviceptr)&word, d1 + 8, 4);
    printf("fill=%d word=%x ", fill, word);
    printf("outside=%d ", cuMemcpyDtoD_v2(d2, d1 + 4000, 4096));
    unsigned memtype = 0; int ordinal = -1; CUdeviceptr base = 0; size_t size = 0;
    cuPointerGetAttribute(&memtype, 2, d1 + 100);
    cuPointerGetAttribute(&ordinal, 9, d1 + 100);
    int range = cuMemGetAddressRange_v2(&base, &size, d1 + 100);
    unsigned host_type = 0;
    int host_attr = cuPointerGetAttribute(&host_type, 2, (CUdeviceptr)src);
    printf("memtype=%u ordinal=%d range=%d base_ok=%d size=%zu host_ptr_attr=%d ", memtype, ordinal, range, base == d1, size,
           host_attr);
    /* 2-D: 4 rows of 16 bytes from host (pitch 32) to device (pitch 64, 8 bytes in), back
     * to host (pitch 16); then a 2-D fill of 3 rows of 4 bytes. */
    unsigned char h2[128], back2[64];
    for (int i = 0; i < 128; i++) h2[i] = (unsigned char)i;
    memset(back2, 0, sizeof back2);
    CUDA_MEMCPY2D up = {0}, down = {0};
    up.srcMemoryType = 1; up.srcHost = h2; up.srcPitch = 32;
    up.dstMemoryType = 2; up.dstDevice = d2; up.dstXInBytes = 8; up.dstPitch = 64;
    up.WidthInBytes = 16; up.Height = 4;
    down.srcMemoryType = 2; down.srcDevice = d2; down.srcXInBytes = 8; down.srcPitch = 64;
    down.dstMemoryType = 1; down.dstHost = back2; down.dstPitch = 16;
    down.WidthInBytes = 16; down.Height = 4;
    int c2u = cuMemcpy2D_v2(&up), c2d = cuMemcpy2D_v2(&down);
    int rows_ok = 1;
    for (int r = 0; r < 4; r++) rows_ok &= memcmp(back2 + 16 * r, h2 + 32 * r, 16) == 0;
    int fill2 = cuMemsetD2D8_v2(d2, 64, 7, 4, 3);
    unsigned char row2[4] = {0};
    cuMemcpyDtoH_v2(row2, d2 + 128, 4);
    up.dstDevice = 0x1000; /* no allocation of this process */
    int past = cuMemcpy2D_v2(&up);
    printf("copy2d=%d,%d rows_ok=%d fill2d=%d row2=%d past=%d ", c2u, c2d, rows_ok, fill2, row2[3], past);
    cuEventDestroy_v2(a);
    printf("destroyed_event=%d ", cuEventQuery(a));
    cuStreamDestroy_v2(s);
    printf("destroyed_stream=%d\n", cuStreamQuery(s));
    cuMemFree_v2(d1);
    cuMemFree_v2(d2);
    return 0;
}
