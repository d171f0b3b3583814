/* Calls of one thread that the interception library once answered with a synchronization,
 * made while another thread of the program holds a stream capture open in the global mode
 * (the default, PyTorch's): the program synchronizes nothing, so its capture must end intact.
 *
 * With "trim", cuDeviceGraphMemTrim, after a graph that allocates BYTES, runs a kernel of
 * 200,000 thread blocks and frees them was launched (the slice charges the graph pool until a
 * trim; a trim gives back nothing the graph still uses while its kernel runs), then, once the
 * capture has ended and the graph's stream is done, another trim ("free_end": the MiB free
 * after it). With "pool", a stream-ordered allocation of BYTES on a stream of the thread's
 * own, whose pool's new step may not fit the slice (refused so, the library waits for the
 * stream before it trims the pool). Prints the call's CUresult, the MiB the slice has free
 * before and after it, and how the capture ended (0: a graph; 901: invalidated).
 *
 *   capture_beside trim|pool BYTES */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

int cuMemGetInfo_v2(size_t *, size_t *);
int cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
int cuMemFree_v2(CUdeviceptr);
int cuMemFreeAsync(CUdeviceptr, CUstream);
int cuStreamSynchronize(CUstream);
int cuDeviceGraphMemTrim(CUdevice);

static CUcontext ctx;
static const char *what;
static size_t bytes;
static int result = -1;
static size_t free_before, free_after;

static size_t free_mib(void) {
    size_t f = 0, t = 0;
    cuMemGetInfo_v2(&f, &t);
    return f >> 20;
}

static void *beside(void *unused) {
    (void)unused;
    cuCtxSetCurrent(ctx);
    free_before = free_mib();
    if (!strcmp(what, "trim")) {
        result = cuDeviceGraphMemTrim(0);
    } else {
        CUstream own;
        CUdeviceptr p = 0;
        cuStreamCreate(&own, 1);
        result = cuMemAllocAsync(&p, bytes, own);
    }
    free_after = free_mib();
    return NULL;
}

/* A graph that allocates `n` bytes, runs a long kernel and frees them, launched on `s`: its
 * pool keeps the allocation once the graph has run. */
static int launch_a_graph_allocation(CUstream s, size_t n) {
    static const char image[] = "spin";
    CUmodule module;
    CUfunction kernel;
    CUgraph g;
    CUgraphExec e;
    CUdeviceptr p = 0;
    int r = cuModuleLoadData(&module, image);
    if (!r) r = cuModuleGetFunction(&kernel, module, "spin");
    if (!r) r = cuStreamBeginCapture_v2(s, 2);
    if (!r) r = cuMemAllocAsync(&p, n, s);
    if (!r) r = cuLaunchKernel(kernel, 200000, 1, 1, 128, 1, 1, 0, s, 0, 0);
    if (!r) r = cuMemFreeAsync(p, s);
    int end = cuStreamEndCapture(s, &g);
    if (!r) r = end;
    if (!r) r = cuGraphInstantiateWithFlags(&e, g, 0);
    if (!r) r = cuGraphLaunch(e, s);
    return r;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: capture_beside trim|pool BYTES\n");
        return 2;
    }
    what = argv[1];
    bytes = strtoull(argv[2], NULL, 10);
    CUstream s, captured;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) ||
        cuStreamCreate(&s, 1) || cuStreamCreate(&captured, 1)) {
        printf("error=init\n");
        return 1;
    }
    int trim = !strcmp(what, "trim");
    if (trim && launch_a_graph_allocation(s, bytes)) {
        printf("error=graph\n");
        return 1;
    }
    /* Captured: a memset node, then the other thread's call, then the end. */
    CUdeviceptr buf;
    CUgraph g;
    if (cuMemAlloc_v2(&buf, 1 << 20) || cuStreamBeginCapture_v2(captured, 0) ||
        cuMemsetD32Async(buf, 7, 1 << 18, captured)) {
        printf("error=capture\n");
        return 1;
    }
    pthread_t t;
    pthread_create(&t, NULL, beside, NULL);
    pthread_join(t, NULL);
    int end = cuStreamEndCapture(captured, &g);
    printf("call=%d free_before=%zu free_after=%zu end=%d", result, free_before, free_after, end);
    if (trim) {
        int done = cuStreamSynchronize(s);
        int again = cuDeviceGraphMemTrim(0);
        printf(" done=%d again=%d free_end=%zu", done, again, free_mib());
    }
    printf("\n");
    return 0;
}
