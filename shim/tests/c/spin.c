/* Keeps a GPU busy: launches kernels of BLOCKS thread blocks back to back for MS
 * milliseconds, waits for them to finish, and prints how many blocks it launched and how
 * long it all took (the GPU time those blocks stand for is known to the caller).
 *
 *   spin BLOCKS MS [kernel|ex|coop|grid|multi|multi2|graph|device|updatable|child|if|while|memset|memset2d|graph-memset|memset-node [wait]]
 *
 * The third argument picks the launch call: cuLaunchKernel (the default), cuLaunchKernelEx,
 * cuLaunchCooperativeKernel, CUDA 2.0's cuLaunchGridAsync (the block shape set once by
 * cuFuncSetBlockShape), cuLaunchCooperativeKernelMultiDevice of one device (multi2: a list
 * of two, both on this device: the simulated driver launches each), or cuGraphLaunch
 * of a graph captured around two launches of BLOCKS / 2 blocks each ("graph"), of a graph
 * instantiated to be launched from the GPU too ("device": the simulated GPU runs no device
 * code, so only the host launches it; both through cuGraphInstantiateWithParams), of a graph of two such kernel nodes, the first made
 * device-updatable ("updatable": its grid may then change from the GPU), of a graph whose one node is a child graph of two such
 * kernel nodes ("child"), or of a graph whose one
 * node is a conditional `if` or `while` node (its value starts at 1 each launch) whose body
 * holds those two kernel nodes ("if", "while": the simulated GPU runs no device code, so no
 * kernel sets the value, and its `while` runs the body once; instantiating prints
 * "error=graph CODE" if refused), or, in place of kernels, memsets of BLOCKS × 256 bytes
 * ("memset": cuMemsetD32Async; "memset2d": cuMemsetD2D8_v2 of 256-byte rows; "graph-memset":
 * cuGraphLaunch of a graph captured around one cuMemsetD32Async; "memset-node": of a graph of
 * one node made by cuGraphAddMemsetNode; the simulated driver's memsets take GPU time by their
 * size, set by the caller to a block's per 256 bytes, so the count of blocks still stands for
 * the GPU time). With `wait`, it prints "ready" once set up and starts
 * launching when a line arrives on stdin, so that several programs run over the same
 * interval.
 * With SPIN_WARMUP_MS=W in the environment, after the first W milliseconds it waits for what
 * it queued (a real GPU queues about a thousand launches, which would otherwise run in the
 * part measured), then launches for the remaining MS - W milliseconds and also prints the
 * blocks launched in that part and how long it took until they had run (warm_blocks,
 * warm_elapsed_ns): the GPU time its kernels took of that interval.
 * With SPIN_THREADS=N, N threads launch at once, each on a stream of its own (a tenant
 * trying to queue more than its share by launching from many threads). With SPIN_BATCH=N,
 * each thread waits for the context's work after every N launches, as a framework's loop
 * that synchronizes after each step does. With SPIN_OTHER_GPU=1, the kernel is a library's
 * (cuLibraryLoadData, context-less) launched on a stream of GPU 1's context while GPU 0's
 * context is current: the driver runs it on GPU 1 (one thread, "kernel" launches only).
 * With SPIN_CAPTURE_BESIDE=1, one more thread captures a launch on a stream of its own in the
 * global mode, over and over through the part measured, each capture held open for 150 ms
 * (windows end meanwhile), and "captures=N invalidated=M" is printed too: a
 * synchronization made by the interception library while a capture is open would
 * invalidate it.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "driver.h"

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* What every launching thread shares. */
static const char *how;
static unsigned blocks;
static CUcontext ctx;
static CUfunction kernel;
static CUgraphExec exec;
static CUstream capture_stream;
static CUdeviceptr buffer;
static int threads = 1;
static unsigned long long batch;
static long long ms, warmup_ms, start, warm, end;
static pthread_barrier_t barrier;
/* SPIN_OTHER_GPU: the work goes to GPU 1 through a stream of its context. */
static int other;

CUresult cuLibraryLoadData(void **, const void *, void *, void **, unsigned, void *, void **,
                           unsigned);
CUresult cuLibraryGetKernel(CUfunction *, void *, const char *);
CUresult cuCtxPushCurrent_v2(CUcontext);
CUresult cuCtxPopCurrent_v2(CUcontext *);
CUresult cuStreamSynchronize(CUstream);

/* Waits for the work queued: the context's, and, on GPU 1, the stream's. */
static void wait_for_work(CUstream stream) {
    cuCtxSynchronize();
    if (other) cuStreamSynchronize(stream);
}

typedef struct {
    unsigned long long launched, warm_launched;
    CUresult error;
} Tally;

static CUresult launch(CUstream stream) {
    if (strcmp(how, "ex") == 0) {
        CUlaunchConfig config = {blocks, 1, 1, 128, 1, 1, 0, stream, 0, 0};
        return cuLaunchKernelEx(&config, kernel, 0, 0);
    }
    if (exec) return cuGraphLaunch(exec, stream);
    if (strcmp(how, "memset") == 0) return cuMemsetD32Async(buffer, 0, blocks * 64u, stream);
    if (strcmp(how, "memset2d") == 0) return cuMemsetD2D8_v2(buffer, 256, 0, 256, blocks);
    if (strcmp(how, "coop") == 0)
        return cuLaunchCooperativeKernel(kernel, blocks, 1, 1, 128, 1, 1, 0, stream, 0);
    if (strcmp(how, "grid") == 0) return cuLaunchGridAsync(kernel, (int)blocks, 1, stream);
    if (strncmp(how, "multi", 5) == 0) {
        CUDA_LAUNCH_PARAMS each = {kernel, blocks, 1, 1, 128, 1, 1, 0, stream, 0};
        CUDA_LAUNCH_PARAMS list[2] = {each, each};
        return cuLaunchCooperativeKernelMultiDevice(list, strcmp(how, "multi2") == 0 ? 2 : 1, 0);
    }
    return cuLaunchKernel(kernel, blocks, 1, 1, 128, 1, 1, 0, stream, 0, 0);
}

/* Adds to `g` two kernel nodes of BLOCKS / 2 blocks and the rest; the first is `*first`. */
static CUresult add_kernels(CUgraph g, CUgraphNode *first) {
    CUgraphNode n;
    CUDA_KERNEL_NODE_PARAMS_v2 k = {kernel, blocks / 2, 1, 1, 128, 1, 1, 0, 0, 0, 0, 0};
    CUresult r = cuGraphAddKernelNode_v2(first, g, 0, 0, &k);
    k.gridDimX = blocks - blocks / 2;
    return r ? r : cuGraphAddKernelNode_v2(&n, g, 0, 0, &k);
}

/* A graph of those kernel nodes, the first device-updatable ("updatable"), or whose one
 * node runs them: a child graph node ("child") or a conditional node ("if", "while") whose
 * value starts at 1. */
static CUresult graph_with_body(CUgraph *graph) {
    CUgraph body;
    CUgraphNode n, first;
    CUresult r = cuGraphCreate(graph, 0);
    if (r) return r;
    if (strcmp(how, "updatable") == 0) {
        CUlaunchAttributeValue v = {{1, 0}};
        if ((r = add_kernels(*graph, &first))) return r;
        return cuGraphKernelNodeSetAttribute(first, CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE, &v);
    }
    if (strcmp(how, "child") == 0) {
        if ((r = cuGraphCreate(&body, 0)) || (r = add_kernels(body, &first))) return r;
        return cuGraphAddChildGraphNode(&n, *graph, 0, 0, body);
    }
    CUgraphNodeParams p = {0};
    p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
    p.conditional.type = strcmp(how, "if") == 0 ? CU_GRAPH_COND_TYPE_IF : CU_GRAPH_COND_TYPE_WHILE;
    p.conditional.size = 1;
    p.conditional.ctx = ctx;
    if ((r = cuGraphConditionalHandleCreate(&p.conditional.handle, *graph, ctx, 1, 1)) ||
        (r = cuGraphAddNode_v2(&n, *graph, 0, 0, 0, &p)))
        return r;
    return add_kernels(p.conditional.phGraph_out[0], &first);
}

/* Launches until `until` (read again after each launch: the warm-up's end moves it),
 * counting the blocks; 0 or the error a launch returned. */
static CUresult launch_until(CUstream stream, const long long *until,
                             unsigned long long *count) {
    unsigned long long n = 0;
    while (now_ns() < *until) {
        CUresult r = launch(stream);
        if (r) return r;
        *count += blocks;
        if (batch && ++n % batch == 0) wait_for_work(stream);
    }
    return 0;
}

/* SPIN_CAPTURE_BESIDE: captures made, and how many of them ended invalidated. */
static int captures, invalidated;

/* Captures one launch at a time in the global mode, each open for 150 ms, from 100 ms
 * after the warm-up until 300 ms before the end (the program's own synchronizations, at
 * the warm-up's end and after the run, are left out). */
static void *capture_beside(void *arg) {
    (void)arg;
    CUstream s;
    if (cuCtxSetCurrent(ctx) || cuStreamCreate(&s, 1)) {
        invalidated = -1;
        return 0;
    }
    struct timespec pause = {0, 150000000};
    while (now_ns() < start + (warmup_ms + 100) * 1000000LL) nanosleep(&pause, 0);
    while (now_ns() < end - 300 * 1000000LL) {
        CUgraph g = 0;
        if (cuStreamBeginCapture_v2(s, 0 /* CU_STREAM_CAPTURE_MODE_GLOBAL */) ||
            cuLaunchKernel(kernel, 1, 1, 1, 128, 1, 1, 0, s, 0, 0)) {
            invalidated = -1;
            return 0;
        }
        nanosleep(&pause, 0);
        captures++;
        if (cuStreamEndCapture(s, &g)) invalidated++;
        if (g) cuGraphDestroy(g);
    }
    return 0;
}

static void *run(void *arg) {
    Tally *t = arg;
    CUstream stream = capture_stream;
    if (threads > 1 && (cuCtxSetCurrent(ctx) || cuStreamCreate(&stream, 1 /* non-blocking */)))
        t->error = -1;
    if (!t->error) t->error = launch_until(stream, &warm, &t->launched);
    /* The end of the warm-up: what was queued runs, then the part measured starts and
     * keeps its length. */
    if (pthread_barrier_wait(&barrier) == PTHREAD_BARRIER_SERIAL_THREAD) {
        wait_for_work(stream);
        warm = now_ns();
        end = warm + (ms - warmup_ms) * 1000000LL;
    }
    pthread_barrier_wait(&barrier);
    if (!t->error) t->error = launch_until(stream, &end, &t->warm_launched);
    t->launched += t->warm_launched;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 5) {
        fprintf(stderr, "usage: spin BLOCKS MS "
                        "[kernel|ex|coop|grid|multi|multi2|graph|device|updatable|child|if|while|"
                        "memset|memset2d|graph-memset|memset-node [wait]]\n");
        return 2;
    }
    how = argc >= 4 ? argv[3] : "kernel";
    int wait = argc == 5 && strcmp(argv[4], "wait") == 0;
    blocks = (unsigned)atoi(argv[1]);
    ms = atoll(argv[2]);
    const char *warmup = getenv("SPIN_WARMUP_MS");
    const char *nthreads = getenv("SPIN_THREADS");
    warmup_ms = warmup ? atoll(warmup) : 0;
    if (nthreads) threads = atoi(nthreads);
    const char *nbatch = getenv("SPIN_BATCH");
    if (nbatch) batch = strtoull(nbatch, 0, 10);
    if (threads < 1 || threads > 1024) {
        fprintf(stderr, "spin: SPIN_THREADS=%s is not 1 to 1024\n", nthreads);
        return 2;
    }
    CUdevice dev;
    CUmodule module;
    static const char image[] = "spin";
    size_t set = (size_t)blocks * 256;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev) ||
        cuMemAlloc_v2(&buffer, set > (1 << 20) ? set : (1 << 20)) || cuModuleLoadData(&module, image) ||
        cuModuleGetFunction(&kernel, module, "spin")) {
        printf("error=setup\n");
        return 1;
    }
    other = getenv("SPIN_OTHER_GPU") != 0;
    if (other) {
        CUcontext gpu1, popped;
        void *library;
        if (threads != 1 || strcmp(how, "kernel") != 0 || cuDevicePrimaryCtxRetain(&gpu1, 1) ||
            cuCtxPushCurrent_v2(gpu1) || cuStreamCreate(&capture_stream, 1) ||
            cuCtxPopCurrent_v2(&popped) || cuLibraryLoadData(&library, image, 0, 0, 0, 0, 0, 0) ||
            cuLibraryGetKernel(&kernel, library, "spin")) {
            printf("error=other-gpu\n");
            return 1;
        }
    }
    if (strcmp(how, "grid") == 0 && cuFuncSetBlockShape(kernel, 128, 1, 1)) {
        printf("error=shape\n");
        return 1;
    }
    CUgraph graph;
    if (strcmp(how, "graph") == 0 || strcmp(how, "device") == 0) {
        CUstream s;
        if (cuStreamCreate(&s, 0) || cuStreamBeginCapture_v2(s, 0) ||
            cuLaunchKernel(kernel, blocks / 2, 1, 1, 128, 1, 1, 0, s, 0, 0) ||
            cuLaunchKernel(kernel, blocks - blocks / 2, 1, 1, 128, 1, 1, 0, s, 0, 0) ||
            cuStreamEndCapture(s, &graph)) {
            printf("error=graph\n");
            return 1;
        }
        /* Instantiated through cuGraphInstantiateWithParams, whose result the driver writes
         * back (a value other than success left there is an error too). */
        CUDA_GRAPH_INSTANTIATE_PARAMS with = {strcmp(how, "device") == 0 ? 4 : 0, 0, 0, 99};
        CUresult r = cuGraphInstantiateWithParams(&exec, graph, &with);
        if (r) {
            printf("error=graph %d\n", r);
            return 1;
        }
        if (with.result_out != 0) {
            printf("error=instantiate-result %d\n", with.result_out);
            return 1;
        }
        capture_stream = s;
    } else if (strcmp(how, "graph-memset") == 0 || strcmp(how, "memset-node") == 0) {
        CUstream s;
        CUgraphNode n;
        CUDA_MEMSET_NODE_PARAMS p = {buffer, 0, 0, 4, blocks * 64u, 1};
        CUresult r = strcmp(how, "memset-node") == 0
                         ? cuGraphCreate(&graph, 0) ||
                               cuGraphAddMemsetNode(&n, graph, 0, 0, &p, ctx)
                         : cuStreamCreate(&s, 0) || cuStreamBeginCapture_v2(s, 0) ||
                               cuMemsetD32Async(buffer, 0, blocks * 64u, s) ||
                               cuStreamEndCapture(s, &graph);
        if (r || (r = cuGraphInstantiateWithFlags(&exec, graph, 0))) {
            printf("error=graph %d\n", r);
            return 1;
        }
    } else if (strcmp(how, "child") == 0 || strcmp(how, "if") == 0 || strcmp(how, "while") == 0 ||
               strcmp(how, "updatable") == 0) {
        CUresult r = graph_with_body(&graph);
        if (!r) r = cuGraphInstantiateWithFlags(&exec, graph, 0);
        if (r) {
            printf("error=graph %d\n", r);
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
    start = now_ns();
    warm = start + warmup_ms * 1000000LL;
    end = start + ms * 1000000LL;
    pthread_barrier_init(&barrier, 0, (unsigned)threads);
    Tally *tallies = calloc((size_t)threads, sizeof *tallies);
    pthread_t *ids = calloc((size_t)threads, sizeof *ids);
    for (int i = 1; i < threads; i++) pthread_create(&ids[i], 0, run, &tallies[i]);
    const char *beside = getenv("SPIN_CAPTURE_BESIDE");
    pthread_t capturer;
    int capturing = beside && strcmp(beside, "1") == 0 &&
                    pthread_create(&capturer, 0, capture_beside, 0) == 0;
    run(&tallies[0]);
    if (capturing) pthread_join(capturer, 0);
    unsigned long long launched = 0, warm_launched = 0;
    for (int i = 0; i < threads; i++) {
        if (i > 0) pthread_join(ids[i], 0);
        if (tallies[i].error) {
            printf("error=launch %d\n", tallies[i].error);
            return 1;
        }
        launched += tallies[i].launched;
        warm_launched += tallies[i].warm_launched;
    }
    wait_for_work(capture_stream);
    long long done = now_ns();
    printf("blocks=%llu elapsed_ns=%lld warm_blocks=%llu warm_elapsed_ns=%lld\n", launched,
           done - start, warm_launched, done - warm);
    if (capturing) printf("captures=%d invalidated=%d\n", captures, invalidated);
    return 0;
}
