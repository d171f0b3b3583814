/* Graphs that may run at once: N executable graphs, each allocating BYTES, running a kernel of
 * 100,000 thread blocks and freeing them, launched one after the other each on a stream of
 * its own while the earlier ones run (the driver gives each memory of its own), then, once
 * all have run, again one after the other on one stream (each may take what the one before
 * it freed). Prints, per launch, its CUresult, the MiB the slice has free after it and the
 * MiB the driver's graph pool reserves: "apart<i>=r,free,pool" and "inline<i>=r,free,pool".
 *
 * With "threads", each graph is instead launched by a thread of its own on that thread's
 * per-thread default stream (CU_STREAM_PER_THREAD: one handle, a stream per thread), the
 * threads one after the other; prints "threads<i>=r,pool" and then "end".
 *
 *   graph_streams N BYTES [threads] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

int cuMemGetInfo_v2(size_t *, size_t *);
int cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
int cuMemFreeAsync(CUdeviceptr, CUstream);
int cuDeviceGetGraphMemAttribute(CUdevice, int, void *);

enum { MOST = 16 };

static size_t free_mib(void) {
    size_t f = 0, t = 0;
    cuMemGetInfo_v2(&f, &t);
    return f >> 20;
}

static unsigned long long pool_mib(void) {
    unsigned long long v = 0;
    cuDeviceGetGraphMemAttribute(0, 2 /* RESERVED_MEM_CURRENT */, &v);
    return v >> 20;
}

/* A graph that allocates `n` bytes, runs `kernel` and frees them, captured on `s`. */
static int instantiate(CUgraphExec *e, CUstream s, CUfunction kernel, size_t n) {
    CUgraph g;
    CUdeviceptr p = 0;
    int r = cuStreamBeginCapture_v2(s, 2);
    if (!r) r = cuMemAllocAsync(&p, n, s);
    if (!r) r = cuLaunchKernel(kernel, 100000, 1, 1, 128, 1, 1, 0, s, 0, 0);
    if (!r) r = cuMemFreeAsync(p, s);
    int end = cuStreamEndCapture(s, &g);
    if (!r) r = end;
    if (!r) r = cuGraphInstantiateWithFlags(e, g, 0);
    return r;
}

static CUcontext ctx;

struct per_thread {
    CUgraphExec exec;
    int result;
};

static void *launch_per_thread(void *arg) {
    struct per_thread *t = arg;
    cuCtxSetCurrent(ctx);
    t->result = cuGraphLaunch(t->exec, (CUstream)2 /* CU_STREAM_PER_THREAD */);
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc == 4 && !strcmp(argv[3], "threads");
    if ((argc != 3 && !threads) || atoi(argv[1]) < 1 || atoi(argv[1]) > MOST) {
        fprintf(stderr, "usage: graph_streams N(1-%d) BYTES [threads]\n", MOST);
        return 2;
    }
    int n = atoi(argv[1]);
    size_t bytes = strtoull(argv[2], NULL, 10);
    static const char image[] = "spin";
    CUmodule module;
    CUfunction kernel;
    CUstream streams[MOST];
    CUgraphExec execs[MOST];
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) ||
        cuModuleLoadData(&module, image) || cuModuleGetFunction(&kernel, module, "spin")) {
        printf("error=init\n");
        return 1;
    }
    for (int i = 0; i < n; i++) {
        if (cuStreamCreate(&streams[i], 1) || instantiate(&execs[i], streams[i], kernel, bytes)) {
            printf("error=graph\n");
            return 1;
        }
    }
    if (threads) {
        for (int i = 0; i < n; i++) {
            struct per_thread t = {execs[i], -1};
            pthread_t thread;
            pthread_create(&thread, NULL, launch_per_thread, &t);
            pthread_join(thread, NULL);
            printf("threads%d=%d,%llu ", i, t.result, pool_mib());
        }
        cuCtxSynchronize();
        printf("end=%zu\n", free_mib());
        return 0;
    }
    for (int i = 0; i < n; i++) {
        int r = cuGraphLaunch(execs[i], streams[i]);
        printf("apart%d=%d,%zu,%llu ", i, r, free_mib(), pool_mib());
    }
    if (cuCtxSynchronize()) {
        printf("error=sync\n");
        return 1;
    }
    for (int i = 0; i < n; i++) {
        int r = cuGraphLaunch(execs[i], streams[0]);
        printf("inline%d=%d,%zu,%llu ", i, r, free_mib(), pool_mib());
    }
    cuCtxSynchronize();
    printf("end=%zu\n", free_mib());
    return 0;
}
