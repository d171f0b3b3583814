/* A tenant racing the end of stream captures against stream-ordered allocations: one thread
 * begins and ends a capture on a stream over and over while another allocates BYTES at a
 * time on that stream for MS milliseconds, keeping whatever it gets. An allocation the
 * interception library judged captured (a graph's node, taking nothing) that the driver made
 * after the capture had ended would take memory nothing charged. With "launch", it launches
 * instead a kernel whose threads each need BYTES of local memory: launched outside a capture,
 * the driver grows the context's stack for every thread that can be resident. Prints
 * "attempts=N granted=G captures=C" once done, then holds what it got until stdin closes.
 * With "pools", the other thread instead makes one of 64 pools of its own the device's
 * current pool, over and over, while this one allocates from the current pool: an
 * allocation the library took to come from one pool that came from another would leave
 * that pool's reservation (a step of its own) uncharged. "captures" then counts the swaps.
 * "pools13" makes them current by CUDA 13's cuMemSetMemPool.
 *
 * With "limit", the other thread instead raises the context's stack to what the kernel
 * needs and lowers it again, over and over, while this one launches the kernel: a launch
 * that found the stack large enough and ran after it was lowered would grow it again,
 * uncharged. The other thread stops once it finds the stack grown after lowering it; this
 * is tried in 8 contexts of the program's own, one after the other, each keeping its stack;
 * then this one fills what is left of the slice with 8 MiB allocations.
 *
 * With "module", the other thread instead rewrites a PTX image in place, its global variable
 * declared 1 byte or BYTES long in turn, while this one loads the image again and again,
 * keeping every module: a load whose image the library read with one size and the driver
 * with the other would take memory nothing charged.
 *
 *   capture_race BYTES MS [launch|pools|pools13|limit|module] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void *CUcontext, *CUstream, *CUgraph, *CUmodule, *CUfunction;
typedef unsigned long long CUdeviceptr;
int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(CUcontext *, int);
int cuCtxSetCurrent(CUcontext);
int cuStreamCreate(CUstream *, unsigned);
int cuStreamBeginCapture_v2(CUstream, int);
int cuStreamEndCapture(CUstream, CUgraph *);
int cuGraphDestroy(CUgraph);
int cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
int cuModuleLoadData(CUmodule *, const void *);
int cuModuleGetFunction(CUfunction *, CUmodule, const char *);
int cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                   unsigned, CUstream, void **, void **);
typedef void *CUmemoryPool;
typedef struct {
    int allocType, handleTypes;
    struct { int type, id; } location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;
int cuMemPoolCreate(CUmemoryPool *, const CUmemPoolProps *);
int cuDeviceSetMemPool(int, CUmemoryPool);
int cuMemSetMemPool(void *, int, CUmemoryPool);
int cuCtxSetLimit(int, size_t);
int cuCtxCreate_v2(CUcontext *, unsigned, int);
int cuMemAlloc_v2(CUdeviceptr *, size_t);

#define POOLS 64
static CUmemoryPool pools[POOLS];

static CUcontext ctx;
static CUstream stream;
static volatile int done = 0;
static long captures = 0;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* CUDA 13's cuMemSetMemPool in place of cuDeviceSetMemPool ("pools13"). */
static int by_location = 0;

static void *pool_loop(void *arg) {
    (void)arg;
    cuCtxSetCurrent(ctx);
    struct { int type, id; } device0 = {1, 0};
    for (long i = 0; !done; i++) {
        CUmemoryPool p = pools[i % POOLS];
        if ((by_location ? cuMemSetMemPool(&device0, 1, p) : cuDeviceSetMemPool(0, p)) == 0)
            captures++;
    }
    return 0;
}

static size_t stack_bytes;

int cuCtxGetLimit(size_t *, int);

static void *limit_loop(void *arg) {
    (void)arg;
    cuCtxSetCurrent(ctx);
    while (!done) {
        /* CU_LIMIT_STACK_SIZE: up to what the kernel needs, and back to the default. */
        if (cuCtxSetLimit(0, stack_bytes) == 0 && cuCtxSetLimit(0, 1024) == 0) captures++;
        /* A launch that ran after the lowering grew the stack again: stop there, leaving it
         * grown (and done, so the launches stop too). */
        size_t now = 0;
        for (volatile int spin = 0; spin < 2000; spin++) {}
        if (cuCtxGetLimit(&now, 0) == 0 && now > 1024) done = 1;
    }
    return 0;
}

/* The image the "module" mode loads and rewrites: the declared size has 12 digits. */
static char ptx[256];
static char small_size[16], large_size[16];
static char *size_at;

static void *rewrite_loop(void *arg) {
    (void)arg;
    for (long i = 0; !done; i++) {
        memcpy(size_at, (i & 1) ? large_size : small_size, 12);
        captures++;
    }
    return 0;
}

static void *capture_loop(void *arg) {
    (void)arg;
    cuCtxSetCurrent(ctx);
    while (!done) {
        /* CU_STREAM_CAPTURE_MODE_RELAXED: the other thread may work meanwhile. */
        if (cuStreamBeginCapture_v2(stream, 2) == 0) {
            CUgraph g = 0;
            if (cuStreamEndCapture(stream, &g) == 0 && g) cuGraphDestroy(g);
            captures++;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: capture_race BYTES MS [launch]\n"); return 2; }
    size_t bytes = strtoull(argv[1], 0, 10);
    double ms = atof(argv[2]);
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) || cuStreamCreate(&stream, 1)) {
        printf("error=init\n");
        return 1;
    }
    CUfunction deep = 0;
    int swap_pools = argc > 3 && argv[3][0] == 'p';
    by_location = swap_pools && !strcmp(argv[3], "pools13");
    int toggle_limit = argc > 3 && argv[3][1] == 'i';
    int rewrite = argc > 3 && argv[3][0] == 'm';
    if (rewrite) {
        snprintf(small_size, sizeof small_size, "%012d", 1);
        snprintf(large_size, sizeof large_size, "%012zu", bytes);
        snprintf(ptx, sizeof ptx,
                 ".version 7.0\n.target sm_75\n.address_size 64\n"
                 ".visible .global .align 8 .b8 blob[%s];\n", small_size);
        size_at = strstr(ptx, small_size);
    }
    stack_bytes = bytes;
    if (swap_pools) {
        CUmemPoolProps props = {0};
        props.allocType = 1; /* pinned device memory */
        props.location.type = 1;
        for (int i = 0; i < POOLS; i++) {
            if (cuMemPoolCreate(&pools[i], &props)) { printf("error=pool\n"); return 1; }
        }
    }
    long attempts = 0, granted = 0;
    for (int trial = 0; trial < (toggle_limit ? 8 : 1); trial++) {
        if (toggle_limit && (cuCtxCreate_v2(&ctx, 0, 0) || cuStreamCreate(&stream, 1))) {
            printf("error=context\n");
            return 1;
        }
        if (argc > 3 && !swap_pools && !rewrite) {
            /* A kernel whose threads each declare BYTES of local memory. */
            static char image[512];
            snprintf(image, sizeof image,
                     ".version 7.0\n.target sm_75\n.address_size 64\n"
                     ".visible .entry deep() {\n .local .align 4 .b8 scratch[%zu];\n ret;\n}\n", bytes);
            CUmodule m;
            if (cuModuleLoadData(&m, image) || cuModuleGetFunction(&deep, m, "deep")) {
                printf("error=module\n");
                return 1;
            }
        }
        done = 0;
        double until = now_ms() + ms / (toggle_limit ? 8 : 1);
        pthread_t t;
        pthread_create(&t, 0,
                       swap_pools ? pool_loop : toggle_limit ? limit_loop : rewrite ? rewrite_loop : capture_loop,
                       0);
        while (now_ms() < until && !(toggle_limit && done)) {
            CUdeviceptr p = 0;
            attempts++;
            /* Granted whether captured (a node of a graph the other thread then drops) or not. */
            CUmodule m;
            int r = rewrite ? cuModuleLoadData(&m, ptx)
                    : deep  ? cuLaunchKernel(deep, 1, 1, 1, 32, 1, 1, 0, stream, 0, 0)
                            : cuMemAllocAsync(&p, bytes, stream);
            if (r == 0) granted++;
        }
        done = 1;
        pthread_join(t, 0);
    }
    if (toggle_limit) {
        /* The rest of the slice, as the library counts it. */
        CUdeviceptr p;
        while (cuMemAlloc_v2(&p, 8 << 20) == 0) {}
    }
    printf("attempts=%ld granted=%ld captures=%ld\n", attempts, granted, captures);
    fflush(stdout);
    getchar();
    return 0;
}
