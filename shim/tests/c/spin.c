/* Keeps a GPU busy: launches kernels of BLOCKS thread blocks back to back for MS
 * milliseconds, waits for them to finish, and prints how many blocks it launched and how
 * long it all took (the GPU time those blocks stand for is known to the caller).
 *
 *   spin BLOCKS MS [kernel|ex|coop|graph [wait]]
 *
 * The third argument picks the launch call: cuLaunchKernel (the default), cuLaunchKernelEx,
 * cuLaunchCooperativeKernel, or cuGraphLaunch of a graph captured around two launches of
 * BLOCKS / 2 blocks each. With `wait`, it prints "ready" once set up and starts launching
 * when a line arrives on stdin, so that several programs run over the same interval.
 * With SPIN_WARMUP_MS=W in the environment, after the first W milliseconds it waits for what
 * it queued (a real GPU queues about a thousand launches, which would otherwise run in the
 * part measured), then launches for the remaining MS - W milliseconds and also prints the
 * blocks launched in that part and how long it took until they had run (warm_blocks,
 * warm_elapsed_ns): the GPU time its kernels took of that interval.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUstream;

CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuMemAlloc_v2(unsigned long long *, size_t);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);
CUresult cuCtxSynchronize(void);
typedef void *CUgraph, *CUgraphExec;
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuStreamBeginCapture_v2(CUstream, int);
CUresult cuStreamEndCapture(CUstream, CUgraph *);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
CUresult cuGraphLaunch(CUgraphExec, CUstream);

typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ;
    unsigned blockDimX, blockDimY, blockDimZ;
    unsigned sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned numAttrs;
} CUlaunchConfig;
CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchCooperativeKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   unsigned, unsigned, CUstream, void **);

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 5) {
        fprintf(stderr, "usage: spin BLOCKS MS [kernel|ex|coop|graph [wait]]\n");
        return 2;
    }
    const char *how = argc >= 4 ? argv[3] : "kernel";
    int wait = argc == 5 && strcmp(argv[4], "wait") == 0;
    unsigned blocks = (unsigned)atoi(argv[1]);
    long long ms = atoll(argv[2]);
    CUdevice dev;
    CUcontext ctx;
    CUmodule module;
    CUfunction kernel;
    unsigned long long buffer;
    static const char image[] = "spin";
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev) ||
        cuMemAlloc_v2(&buffer, 1 << 20) || cuModuleLoadData(&module, image) ||
        cuModuleGetFunction(&kernel, module, "spin")) {
        printf("error=setup\n");
        return 1;
    }
    CUstream stream = 0;
    CUgraph graph;
    CUgraphExec exec = 0;
    if (strcmp(how, "graph") == 0) {
        if (cuStreamCreate(&stream, 0) || cuStreamBeginCapture_v2(stream, 0) ||
            cuLaunchKernel(kernel, blocks / 2, 1, 1, 128, 1, 1, 0, stream, 0, 0) ||
            cuLaunchKernel(kernel, blocks - blocks / 2, 1, 1, 128, 1, 1, 0, stream, 0, 0) ||
            cuStreamEndCapture(stream, &graph) || cuGraphInstantiateWithFlags(&exec, graph, 0)) {
            printf("error=graph\n");
            return 1;
        }
    }
    if (wait) {
        char line[16];
        printf("ready\n");
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin)) {
            printf("error=no-go\n");
            return 1;
        }
    }
    const char *warmup = getenv("SPIN_WARMUP_MS");
    long long start = now_ns(), end = start + ms * 1000000LL;
    long long warm = start + (warmup ? atoll(warmup) : 0) * 1000000LL;
    unsigned long long launched = 0, warm_launched = 0;
    int measuring = !warmup;
    long long t;
    while ((t = now_ns()) < end) {
        CUresult r;
        if (!measuring && t >= warm) {
            /* The end of the warm-up: what was queued runs, then the part measured starts
             * and keeps its length. */
            cuCtxSynchronize();
            t = now_ns();
            end += t - warm;
            warm = t;
            measuring = 1;
        }
        if (strcmp(how, "ex") == 0) {
            CUlaunchConfig config = {blocks, 1, 1, 128, 1, 1, 0, 0, 0, 0};
            r = cuLaunchKernelEx(&config, kernel, 0, 0);
        } else if (exec) {
            r = cuGraphLaunch(exec, stream);
        } else if (strcmp(how, "coop") == 0) {
            r = cuLaunchCooperativeKernel(kernel, blocks, 1, 1, 128, 1, 1, 0, 0, 0);
        } else {
            r = cuLaunchKernel(kernel, blocks, 1, 1, 128, 1, 1, 0, 0, 0, 0);
        }
        if (r) {
            printf("error=launch %d\n", r);
            return 1;
        }
        launched += blocks;
        if (measuring) warm_launched += blocks;
    }
    cuCtxSynchronize();
    long long done = now_ns();
    printf("blocks=%llu elapsed_ns=%lld warm_blocks=%llu warm_elapsed_ns=%lld\n", launched,
           done - start, warm_launched, done - warm);
    return 0;
}
