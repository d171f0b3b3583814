/* The device-memory wall, path by path, reached three ways:
 *   link      calls the functions it was linked against (-lcuda),
 *   dlsym     dlopen("libcuda.so.1") and dlsym of the versioned names,
 *   procaddr  dlsym of cuGetProcAddress_v2 only, then every function by base name and CUDA
 *             version, as the CUDA 12 runtime does; procaddr_ptds adds the per-thread
 *             default-stream flag.
 * Built with -DWALL_NO_LINK, it needs no libcuda at link time and has no "link" mode.
 * Usage: wall MODE PATH REMAINING
 * With REMAINING bytes left in the slice, the path allocates exactly REMAINING ("fit", then
 * cuMemGetInfo's free), frees, then asks for the least that exceeds it ("over"). Prints
 * key=value pairs on one line. Paths that keep running: "hold" allocates REMAINING and waits
 * for stdin to close; "fill" allocates chunks of REMAINING bytes until refused, prints how many
 * it got, and waits; "idle" only has its context and waits; "churn" allocates and frees chunks
 * of REMAINING bytes until killed; "pool_keep" frees into a default pool that keeps it, and
 * allocates again ("again"), then trims. "stack" and "heap" raise a context limit the driver
 * backs with device memory (see there); "limit_gone" raises the heap of a context it then
 * destroys, and of the primary context, which it releases to zero and retains again, printing
 * what is free after each ("after_destroy", "after_release"); "reset" holds a quarter of
 * REMAINING each by cuMemAlloc, cuMemAllocAsync and a raised heap, resets the primary context
 * (as cudaDeviceReset does), retains it again and fits REMAINING; "green" makes green
 * contexts, "interop" OpenGL and VDPAU interop contexts, "ctx_gone" leaves memory in contexts it destroys and "heap_race" sets a limit from
 * eight threads at once, "module" loads modules with global variables, "module_image" the
 * module images of two files (see there), "local" launches
 * kernels with more local memory than the stack holds (see there), "local_race" does that
 * from eight threads at once. With WALL_CONTEXTS=N in the environment, N more contexts
 * are created first (and kept), and how many the driver gave is printed; with
 * WALL_MODULE_BYTES=N a module whose global variable takes N bytes is loaded then (memory the
 * driver takes that no allocation call shows, as a framework's start-up does); WALL_SETTLE_MS=M
 * then waits M milliseconds before the path runs; WALL_STACK=N first sets the per-thread stack
 * to N bytes (which the driver reserves for every thread that can be resident) and prints
 * what the driver answered. */
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver.h"

typedef void *CUmemoryPool, *CUarray, *CUmipmappedArray;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct { size_t Width, Height; int Format; unsigned NumChannels; } CUDA_ARRAY_DESCRIPTOR;
typedef struct { size_t Width, Height, Depth; int Format; unsigned NumChannels, Flags; } CUDA_ARRAY3D_DESCRIPTOR;
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
    int type; int requestedHandleTypes; CUmemLocation location; void *win32HandleMetaData;
    struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage; unsigned char reserved[4]; } allocFlags;
} CUmemAllocationProp;
typedef struct {
    int allocType; int handleTypes; CUmemLocation location; void *win32SecurityAttributes;
    size_t maxSize; unsigned short usage; unsigned char reserved[54];
} CUmemPoolProps;

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuDeviceTotalMem_v2(size_t *, CUdevice);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr, CUstream);
CUresult cuMemPoolCreate(CUmemoryPool *, const CUmemPoolProps *);
CUresult cuMemPoolDestroy(CUmemoryPool);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *, CUdevice);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuArrayCreate_v2(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
CUresult cuArray3DCreate_v2(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
CUresult cuArrayDestroy(CUarray);
CUresult cuMipmappedArrayCreate(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned);
CUresult cuMipmappedArrayDestroy(CUmipmappedArray);
CUresult cuMemGetAllocationGranularity(size_t *, const CUmemAllocationProp *, int);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
CUresult cuGetErrorName(CUresult, const char **);
CUresult cuModuleLoadDataEx(void **, const void *, unsigned, int *, void **);
CUresult cuModuleUnload(void *);
CUresult cuLibraryLoadData(void **, const void *, int *, void **, unsigned, int *, void **, unsigned);
CUresult cuLibraryUnload(void *);
CUresult cuMemPoolSetAttribute(CUmemoryPool, int, void *);
CUresult cuMemPoolTrimTo(CUmemoryPool, size_t);
CUresult cuCtxSetLimit(int, size_t);
CUresult cuCtxGetLimit(size_t *, int);
CUresult cuGLCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuVDPAUCtxCreate_v2(CUcontext *, unsigned, CUdevice, unsigned, void *);
CUresult cuDeviceGetAttribute(int *, int, CUdevice);
CUresult cuLaunchGrid(CUfunction, int, int);
/* Green contexts (CUDA 12.4): CUdevResource is a tagged union of 144 bytes, the SM count at
 * byte 96. */
typedef struct { int type; unsigned char pad[92]; unsigned smCount; unsigned char more[44]; } CUdevResource;
typedef void *CUdevResourceDesc, *CUgreenCtx;
CUresult cuDeviceGetDevResource(CUdevice, CUdevResource *, int);
CUresult cuDevSmResourceSplitByCount(CUdevResource *, unsigned *, const CUdevResource *, CUdevResource *, unsigned, unsigned);
CUresult cuDevResourceGenerateDesc(CUdevResourceDesc *, CUdevResource *, unsigned);
CUresult cuGreenCtxCreate(CUgreenCtx *, CUdevResourceDesc, CUdevice, unsigned);
CUresult cuGreenCtxDestroy(CUgreenCtx);
CUresult cuCtxFromGreenCtx(CUcontext *, CUgreenCtx);

#define API(X) \
    X(cuInit, cuInit) X(cuDeviceGet, cuDeviceGet) \
    X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain) \
    X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2) \
    X(cuCtxSetCurrent, cuCtxSetCurrent) X(cuCtxCreate, cuCtxCreate_v2) X(cuCtxDestroy, cuCtxDestroy_v2) \
    X(cuMemGetInfo, cuMemGetInfo_v2) X(cuDeviceTotalMem, cuDeviceTotalMem_v2) \
    X(cuMemAlloc, cuMemAlloc_v2) X(cuMemFree, cuMemFree_v2) X(cuMemAllocPitch, cuMemAllocPitch_v2) \
    X(cuMemAllocManaged, cuMemAllocManaged) X(cuMemAllocAsync, cuMemAllocAsync) \
    X(cuMemFreeAsync, cuMemFreeAsync) X(cuMemPoolCreate, cuMemPoolCreate) \
    X(cuMemPoolDestroy, cuMemPoolDestroy) X(cuDeviceGetDefaultMemPool, cuDeviceGetDefaultMemPool) \
    X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync) X(cuArrayCreate, cuArrayCreate_v2) \
    X(cuArray3DCreate, cuArray3DCreate_v2) X(cuArrayDestroy, cuArrayDestroy) \
    X(cuMipmappedArrayCreate, cuMipmappedArrayCreate) X(cuMipmappedArrayDestroy, cuMipmappedArrayDestroy) \
    X(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity) X(cuMemCreate, cuMemCreate) \
    X(cuMemRelease, cuMemRelease) X(cuGetErrorName, cuGetErrorName) \
    X(cuModuleLoadData, cuModuleLoadData) X(cuMemPoolSetAttribute, cuMemPoolSetAttribute) \
    X(cuMemPoolTrimTo, cuMemPoolTrimTo) X(cuCtxSetLimit, cuCtxSetLimit) \
    X(cuCtxGetLimit, cuCtxGetLimit) X(cuDeviceGetAttribute, cuDeviceGetAttribute) \
    X(cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset_v2) \
    X(cuDeviceGetDevResource, cuDeviceGetDevResource) \
    X(cuDevSmResourceSplitByCount, cuDevSmResourceSplitByCount) \
    X(cuDevResourceGenerateDesc, cuDevResourceGenerateDesc) X(cuGreenCtxCreate, cuGreenCtxCreate) \
    X(cuGreenCtxDestroy, cuGreenCtxDestroy) X(cuCtxFromGreenCtx, cuCtxFromGreenCtx) \
    X(cuModuleLoadDataEx, cuModuleLoadDataEx) X(cuModuleUnload, cuModuleUnload) \
    X(cuLibraryLoadData, cuLibraryLoadData) X(cuLibraryUnload, cuLibraryUnload) \
    X(cuModuleGetFunction, cuModuleGetFunction) X(cuLaunchKernel, cuLaunchKernel) \
    X(cuGraphCreate, cuGraphCreate) X(cuGraphAddKernelNode, cuGraphAddKernelNode_v2) \
    X(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags) X(cuGraphLaunch, cuGraphLaunch) \
    X(cuGraphExecDestroy, cuGraphExecDestroy) X(cuGraphDestroy, cuGraphDestroy) \
    X(cuGraphExecKernelNodeSetParams, cuGraphExecKernelNodeSetParams_v2) \
    X(cuFuncSetBlockShape, cuFuncSetBlockShape) X(cuLaunchGrid, cuLaunchGrid) \
    X(cuCtxSynchronize, cuCtxSynchronize) \
    X(cuGraphAddChildGraphNode, cuGraphAddChildGraphNode) X(cuGraphAddNode, cuGraphAddNode_v2) \
    X(cuGraphConditionalHandleCreate, cuGraphConditionalHandleCreate) \
    X(cuGraphExecChildGraphNodeSetParams, cuGraphExecChildGraphNodeSetParams) \
    X(cuGraphExecNodeSetParams, cuGraphExecNodeSetParams) \
    X(cuGLCtxCreate, cuGLCtxCreate_v2) X(cuVDPAUCtxCreate, cuVDPAUCtxCreate_v2)

static struct {
#define FIELD(base, versioned) __typeof__(versioned) *base;
    API(FIELD)
} A;

static const char *mode;

static void load(void) {
#ifndef WALL_NO_LINK
    if (!strcmp(mode, "link")) {
#define LINKED(base, versioned) A.base = versioned;
        API(LINKED)
        return;
    }
#endif
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { printf("error=dlopen\n"); exit(1); }
    if (!strcmp(mode, "dlsym")) {
#define LOOKED_UP(base, versioned) A.base = dlsym(h, #versioned);
        API(LOOKED_UP)
        if (!strcmp(getenv("WALL_ASYNC_PTSZ") ? getenv("WALL_ASYNC_PTSZ") : "", "1")) {
            A.cuMemAllocAsync = dlsym(h, "cuMemAllocAsync_ptsz");
            A.cuMemFreeAsync = dlsym(h, "cuMemFreeAsync_ptsz");
        }
        return;
    }
    __typeof__(cuGetProcAddress_v2) *gpa = dlsym(h, "cuGetProcAddress_v2");
    unsigned long long flags = !strcmp(mode, "procaddr_ptds") ? 2 : 0;
    int status = 0;
    /* CUDA 12.4's variants, but cuCtxCreate as of 3.2: this program calls it with
     * cuCtxCreate_v2's parameters, and 12.4 would give cuCtxCreate_v3 (execution affinity). */
#define BY_PROC_ADDRESS(base, versioned) \
    if (gpa(#base, (void **)&A.base, strcmp(#base, "cuCtxCreate") ? 12040 : 3020, flags, &status) || !A.base) { \
        printf("error=%s\n", #base); exit(1); }
    API(BY_PROC_ADDRESS)
    /* Asking for cuGetProcAddress itself must give a function that keeps catching. */
    __typeof__(cuGetProcAddress_v2) *again = 0;
    gpa("cuGetProcAddress", (void **)&again, 12040, 0, &status);
    if (!again || again("cuMemAlloc", (void **)&A.cuMemAlloc, 12040, flags, &status)) {
        printf("error=cuGetProcAddress-again\n"); exit(1);
    }
}

static const char *name(CUresult r) {
    const char *n = "?";
    A.cuGetErrorName(r, &n);
    return n;
}

static size_t free_now(void) { size_t f = 0, t = 0; A.cuMemGetInfo(&f, &t); return f; }

/* PTX text declaring one global variable of `bytes` bytes. */
static const char *ptx_with_global(size_t bytes) {
    static char ptx[256];
    snprintf(ptx, sizeof ptx,
             ".version 7.0\n.target sm_75\n.address_size 64\n"
             ".visible .global .align 8 .b8 wall_blob[%zu];\n", bytes);
    return ptx;
}

/* The whole file at `path` (NULL where it cannot be read). */
static void *read_file(const char *path) {
    FILE *f = path ? fopen(path, "rb") : 0;
    if (!f) return 0;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *data = malloc((size_t)n + 1);
    if (data && fread(data, 1, (size_t)n, f) != (size_t)n) { free(data); data = 0; }
    fclose(f);
    return data;
}

/* PTX text with two kernels whose threads need `fits` and `over` bytes of local memory. */
static const char *ptx_with_locals(size_t fits, size_t over) {
    static char ptx[512];
    snprintf(ptx, sizeof ptx,
             ".version 7.0\n.target sm_75\n.address_size 64\n"
             ".visible .entry fits()\n{\n\t.local .align 16 .b8 __local_depot0[%zu];\n\tret;\n}\n"
             ".visible .entry over()\n{\n\t.local .align 16 .b8 __local_depot1[%zu];\n\tret;\n}\n",
             fits, over);
    return ptx;
}

/* PTX text with kernels k0..k7 whose threads need `base` + (i + 1) x `step` bytes of local
 * memory, and "over", whose threads need `over`. */
static const char *ptx_with_local_ladder(size_t base, size_t step, size_t over) {
    static char ptx[2048];
    int n = snprintf(ptx, sizeof ptx, ".version 7.0\n.target sm_75\n.address_size 64\n");
    for (int i = 0; i < 8; i++)
        n += snprintf(ptx + n, sizeof ptx - n,
                      ".visible .entry k%d()\n{\n\t.local .align 16 .b8 __local_depot%d[%zu];\n"
                      "\tret;\n}\n", i, i, base + (size_t)(i + 1) * step);
    snprintf(ptx + n, sizeof ptx - n,
             ".visible .entry over()\n{\n\t.local .align 16 .b8 __local_depot8[%zu];\n\tret;\n}\n",
             over);
    return ptx;
}

/* A graph of one kernel node launching `f` on one thread, instantiated. */
static CUgraphExec graph_of(CUfunction f) {
    CUgraph g = 0;
    CUgraphNode n = 0;
    CUgraphExec e = 0;
    CUDA_KERNEL_NODE_PARAMS_v2 k = {f, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0};
    if (A.cuGraphCreate(&g, 0) || A.cuGraphAddKernelNode(&n, g, 0, 0, &k) ||
        A.cuGraphInstantiateWithFlags(&e, g, 0)) return 0;
    A.cuGraphDestroy(g);
    return e;
}

/* "vmm_race": properties whose location a thread flips between the device (1) and the host
 * (2) while cuMemCreate reads them. */
static CUmemAllocationProp racing_prop;
static volatile int racing_stop;
static void *flip_location(void *arg) {
    (void)arg;
    while (!racing_stop) ((volatile CUmemAllocationProp *)&racing_prop)->location.type ^= 3;
    return 0;
}

/* A graph of one kernel node of `f` (one block of one thread). */
static CUgraph one_kernel(CUfunction f) {
    CUgraph g = 0;
    CUgraphNode n = 0;
    CUDA_KERNEL_NODE_PARAMS_v2 k = {f, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0};
    if (A.cuGraphCreate(&g, 0) || A.cuGraphAddKernelNode(&n, g, 0, 0, &k)) return 0;
    return g;
}

/* Instantiates `g` and launches it, its node `node` first given new work by `change` (if
 * any) in the executable graph alone; prints "KEY=result" of the launch and, with a change,
 * "KEY_change=result" of that. Destroys both graphs. */
static void launch_changed(const char *key, CUgraph g, CUgraphNode node,
                           CUresult (*change)(CUgraphExec, CUgraphNode)) {
    CUgraphExec e = 0;
    CUresult r = A.cuGraphInstantiateWithFlags(&e, g, 0);
    if (r) {
        printf("%s=instantiate:%s ", key, name(r));
    } else {
        if (change) printf("%s_change=%s ", key, name(change(e, node)));
        printf("%s=%s ", key, name(A.cuGraphLaunch(e, 0)));
        A.cuCtxSynchronize();
        A.cuGraphExecDestroy(e);
    }
    A.cuGraphDestroy(g);
}

/* The kernel that does not fit, and the graph of it, for the changes below. */
static CUfunction over_kernel;
static CUgraph over_graph;
static CUresult child_to_over(CUgraphExec e, CUgraphNode n) {
    return A.cuGraphExecChildGraphNodeSetParams(e, n, over_graph);
}
static CUresult generic_child_to_over(CUgraphExec e, CUgraphNode n) {
    CUgraphNodeParams p = {0};
    p.type = CU_GRAPH_NODE_TYPE_GRAPH;
    p.graph.graph = over_graph;
    return A.cuGraphExecNodeSetParams(e, n, &p);
}
static CUresult generic_kernel_to_over(CUgraphExec e, CUgraphNode n) {
    CUgraphNodeParams p = {0};
    p.type = CU_GRAPH_NODE_TYPE_KERNEL;
    CUDA_KERNEL_NODE_PARAMS_v2 k = {over_kernel, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0};
    p.kernel = k;
    return A.cuGraphExecNodeSetParams(e, n, &p);
}

/* "local"'s graphs whose kernels stand in other graphs: `fits` and `over` in a child graph
 * ("child_fit", "child_over"), `over` in the body of a conditional `if` node whose value
 * starts at 1 ("if_over"), and a graph instantiated with `fits` whose node is given `over`
 * in the executable graph alone: a child graph node by cuGraphExecChildGraphNodeSetParams
 * ("child_swapped") and by cuGraphExecNodeSetParams ("child_swapped_generic"), a kernel
 * node by cuGraphExecNodeSetParams ("kernel_swapped_generic"). */
static void graphs_in_graphs(CUcontext ctx, CUfunction fits, CUfunction over) {
    over_kernel = over;
    over_graph = one_kernel(over);
    CUgraph fit_graph = one_kernel(fits), g = 0;
    CUgraphNode n = 0;
    for (int i = 0; i < 2; i++) {
        if (A.cuGraphCreate(&g, 0) || A.cuGraphAddChildGraphNode(&n, g, 0, 0, i ? over_graph : fit_graph)) {
            printf("error=child\n"); exit(1);
        }
        launch_changed(i ? "child_over" : "child_fit", g, n, 0);
    }
    CUgraphNodeParams p = {0};
    p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
    p.conditional.type = CU_GRAPH_COND_TYPE_IF;
    p.conditional.size = 1;
    p.conditional.ctx = ctx;
    CUDA_KERNEL_NODE_PARAMS_v2 k = {over, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0};
    CUgraphNode in_body = 0;
    if (A.cuGraphCreate(&g, 0) || A.cuGraphConditionalHandleCreate(&p.conditional.handle, g, ctx, 1, 1) ||
        A.cuGraphAddNode(&n, g, 0, 0, 0, &p) ||
        A.cuGraphAddKernelNode(&in_body, p.conditional.phGraph_out[0], 0, 0, &k)) {
        printf("error=conditional\n"); exit(1);
    }
    launch_changed("if_over", g, n, 0);
    for (int i = 0; i < 2; i++) {
        if (A.cuGraphCreate(&g, 0) || A.cuGraphAddChildGraphNode(&n, g, 0, 0, fit_graph)) {
            printf("error=child\n"); exit(1);
        }
        launch_changed(i ? "child_swapped_generic" : "child_swapped", g, n,
                       i ? generic_child_to_over : child_to_over);
    }
    k.func = fits;
    if (A.cuGraphCreate(&g, 0) || A.cuGraphAddKernelNode(&n, g, 0, 0, &k)) {
        printf("error=kernel\n"); exit(1);
    }
    launch_changed("kernel_swapped_generic", g, n, generic_kernel_to_over);
    A.cuGraphDestroy(fit_graph);
    A.cuGraphDestroy(over_graph);
}

/* "heap_race": threads of one context setting its malloc heap at once. */
struct racer { CUcontext ctx; size_t base, most; unsigned seed; int refused; };

static void *race_heap(void *arg) {
    struct racer *w = arg;
    A.cuCtxSetCurrent(w->ctx);
    for (int i = 0; i < 300; i++) {
        w->seed = w->seed * 1103515245u + 12345u;
        size_t to = w->base + (size_t)((w->seed >> 8) % 40) * (w->most / 32);
        w->refused += A.cuCtxSetLimit(2, to) != 0;
    }
    return 0;
}

/* "local_race": threads of one context launching kernels that grow its stack at once. */
struct launcher { CUcontext ctx; CUfunction k[9]; unsigned seed; int tried_over, refused, failed; };

static void *race_local(void *arg) {
    struct launcher *w = arg;
    A.cuCtxSetCurrent(w->ctx);
    for (int i = 0; i < 200; i++) {
        w->seed = w->seed * 1103515245u + 12345u;
        int k = (int)((w->seed >> 8) % 9);
        CUresult r = A.cuLaunchKernel(w->k[k], 1, 1, 1, 1, 1, 1, 0, 0, 0, 0);
        if (k == 8) { w->tried_over++; w->refused += r == 2; } /* CUDA_ERROR_OUT_OF_MEMORY */
        else w->failed += r != 0;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: wall MODE PATH REMAINING [hold]\n"); return 2; }
    mode = argv[1];
    const char *path = argv[2];
    size_t r = strtoull(argv[3], 0, 10);
    load();
    CUdevice dev; CUcontext ctx;
    if (A.cuInit(0) || A.cuDeviceGet(&dev, 0) || A.cuDevicePrimaryCtxRetain(&ctx, dev) || A.cuCtxSetCurrent(ctx)) {
        printf("error=init\n"); return 1;
    }
    const char *extra = getenv("WALL_CONTEXTS");
    if (extra) {
        int made = 0;
        for (int i = 0; i < atoi(extra); i++) {
            CUcontext c = 0;
            if (!A.cuCtxCreate(&c, 0, dev)) made++;
        }
        A.cuCtxSetCurrent(ctx);
        printf("contexts=%d ", made);
    }
    const char *module_bytes = getenv("WALL_MODULE_BYTES");
    if (module_bytes) {
        void *module = 0;
        printf("module=%s ", name(A.cuModuleLoadData(&module, ptx_with_global(strtoull(module_bytes, 0, 10)))));
    }
    const char *stack = getenv("WALL_STACK");
    if (stack) printf("stack=%s ", name(A.cuCtxSetLimit(0, strtoull(stack, 0, 10))));
    const char *settle = getenv("WALL_SETTLE_MS");
    if (settle) usleep((useconds_t)atoi(settle) * 1000);
    size_t f = 0, t = 0, dt = 0;
    A.cuMemGetInfo(&f, &t);
    A.cuDeviceTotalMem(&dt, dev);
    printf("start_free=%zu total=%zu device_total=%zu ", f, t, dt);
    CUresult fit = -1, over = -1;
    size_t free_at_fit = 0;
    CUdeviceptr p = 0;
    const size_t MiB = 1 << 20;

    if (!strcmp(path, "hold") || !strcmp(path, "fill") || !strcmp(path, "idle")) {
        unsigned long chunks = 0;
        if (!strcmp(path, "hold")) {
            fit = A.cuMemAlloc(&p, r);
        } else if (!strcmp(path, "idle")) {
            fit = 0;
        } else {
            while (!(fit = A.cuMemAlloc(&p, r))) chunks++;
        }
        printf("fit=%s chunks=%lu free_at_fit=%zu\n", name(fit), chunks, free_now());
        fflush(stdout);
        char buf[16];
        while (fread(buf, 1, sizeof buf, stdin) > 0) {}
        return 0;
    } else if (!strcmp(path, "churn")) {
        printf("churning\n");
        fflush(stdout);
        for (;;) {
            if (!A.cuMemAlloc(&p, r)) A.cuMemFree(p);
        }
    } else if (!strcmp(path, "alloc") || !strcmp(path, "managed")) {
        int managed = !strcmp(path, "managed");
        fit = managed ? A.cuMemAllocManaged(&p, r, 1) : A.cuMemAlloc(&p, r);
        free_at_fit = free_now();
        if (!fit) A.cuMemFree(p);
        over = managed ? A.cuMemAllocManaged(&p, r + 1, 1) : A.cuMemAlloc(&p, r + 1);
        if (!over) A.cuMemFree(p);
    } else if (!strcmp(path, "async") || !strcmp(path, "pool") || !strcmp(path, "default_pool")) {
        CUmemoryPool pool = 0;
        if (!strcmp(path, "pool")) {
            CUmemPoolProps props; memset(&props, 0, sizeof props);
            props.allocType = 1; props.location.type = 1; props.location.id = dev;
            if (A.cuMemPoolCreate(&pool, &props)) { printf("error=pool\n"); return 1; }
        } else if (!strcmp(path, "default_pool")) {
            if (A.cuDeviceGetDefaultMemPool(&pool, dev)) { printf("error=pool\n"); return 1; }
        }
#define ALLOC_ASYNC(bytes) (pool ? A.cuMemAllocFromPoolAsync(&p, bytes, pool, 0) : A.cuMemAllocAsync(&p, bytes, 0))
        fit = ALLOC_ASYNC(r);
        free_at_fit = free_now();
        if (!fit) A.cuMemFreeAsync(p, 0);
        over = ALLOC_ASYNC(r + 1);
        if (!over) A.cuMemFreeAsync(p, 0);
        if (!strcmp(path, "pool")) A.cuMemPoolDestroy(pool);
    } else if (!strcmp(path, "pool_keep")) {
        /* The default pool told to keep what is freed: the freed step stays the pool's (and
         * charged), an allocation of the same size reuses it ("again"), and a trim gives it
         * back. */
        CUmemoryPool pool = 0;
        if (A.cuDeviceGetDefaultMemPool(&pool, dev)) { printf("error=pool\n"); return 1; }
        unsigned long long keep = ~0ULL;
        A.cuMemPoolSetAttribute(pool, 4 /* RELEASE_THRESHOLD */, &keep);
        fit = A.cuMemAllocAsync(&p, r, 0);
        if (!fit) A.cuMemFreeAsync(p, 0);
        free_at_fit = free_now();
        CUresult again = A.cuMemAllocAsync(&p, r, 0);
        printf("again=%s ", name(again));
        if (!again) A.cuMemFreeAsync(p, 0);
        over = A.cuMemAllocAsync(&p, r + 1, 0);
        if (!over) A.cuMemFreeAsync(p, 0);
        printf("kept_free=%zu ", free_now());
        keep = 0;
        A.cuMemPoolSetAttribute(pool, 4, &keep);
        A.cuMemPoolTrimTo(pool, 0);
    } else if (!strcmp(path, "pitch")) {
        /* Rows of 1 MiB - 1 bytes get a pitch of 1 MiB: the padding is charged too. */
        size_t pitch = 0;
        fit = A.cuMemAllocPitch(&p, &pitch, MiB - 1, r / MiB, 4);
        free_at_fit = free_now();
        printf("pitch=%zu ", pitch);
        if (!fit) A.cuMemFree(p);
        over = A.cuMemAllocPitch(&p, &pitch, r + 1, 1, 4);
        if (!over) A.cuMemFree(p);
    } else if (!strcmp(path, "array") || !strcmp(path, "array3d")) {
        CUarray a = 0;
        if (!strcmp(path, "array")) {
            CUDA_ARRAY_DESCRIPTOR d = { MiB, r / MiB, 0x01, 1 };
            fit = A.cuArrayCreate(&a, &d);
        } else {
            CUDA_ARRAY3D_DESCRIPTOR d = { MiB / 8, r / MiB / 2, 2, 0x20, 2, 0 };  /* float2: 8 bytes */
            fit = A.cuArray3DCreate(&a, &d);
        }
        free_at_fit = free_now();
        if (!fit) A.cuArrayDestroy(a);
        CUDA_ARRAY_DESCRIPTOR o = { r + 1, 0, 0x01, 1 };
        over = A.cuArrayCreate(&a, &o);
        if (!over) A.cuArrayDestroy(a);
    } else if (!strcmp(path, "mipmap")) {
        /* One-dimensional, levels halving: r = 62 MiB is 32 + 16 + 8 + 4 + 2 MiB. */
        CUmipmappedArray m = 0;
        CUDA_ARRAY3D_DESCRIPTOR d = { r / 62 * 32, 0, 0, 0x01, 1, 0 };
        fit = A.cuMipmappedArrayCreate(&m, &d, 5);
        free_at_fit = free_now();
        if (!fit) A.cuMipmappedArrayDestroy(m);
        CUDA_ARRAY3D_DESCRIPTOR o = { r + 1, 0, 0, 0x01, 1, 0 };
        over = A.cuMipmappedArrayCreate(&m, &o, 1);
        if (!over) A.cuMipmappedArrayDestroy(m);
    } else if (!strcmp(path, "vmm")) {
        CUmemAllocationProp prop; memset(&prop, 0, sizeof prop);
        prop.type = 1; prop.location.type = 1; prop.location.id = dev;
        size_t g = 0;
        A.cuMemGetAllocationGranularity(&g, &prop, 0);
        CUmemGenericAllocationHandle h = 0;
        fit = A.cuMemCreate(&h, r, &prop, 0);
        free_at_fit = free_now();
        if (!fit) A.cuMemRelease(h);
        over = A.cuMemCreate(&h, r + g, &prop, 0);
        if (!over) A.cuMemRelease(h);
        printf("granularity=%zu ", g);
    } else if (!strcmp(path, "vmm_race")) {
        /* cuMemCreate of one granule 4000 times while a thread flips the properties' location
         * between the device and the host: every allocation the driver makes is on the device
         * (the simulated driver refuses the host), so "made" never exceeds the granules
         * REMAINING holds ("room"), whichever location each read saw. All released after. */
        static CUmemGenericAllocationHandle held[4000];
        memset(&racing_prop, 0, sizeof racing_prop);
        racing_prop.type = 1; racing_prop.location.type = 1; racing_prop.location.id = dev;
        size_t g = 0;
        A.cuMemGetAllocationGranularity(&g, &racing_prop, 0);
        pthread_t flipper;
        pthread_create(&flipper, 0, flip_location, 0);
        int made = 0;
        /* On a loaded machine the flipper may sit descheduled with the host's location for
         * the whole loop: until one allocation is made, a refused call yields to it. */
        for (int i = 0; i < 4000 || (!made && i < 1000000); i++) {
            if (made < 4000 && !A.cuMemCreate(&held[made], g, &racing_prop, 0)) made++;
            else if (!made) sched_yield();
        }
        racing_stop = 1;
        pthread_join(flipper, 0);
        printf("made=%d room=%zu ", made, r / g);
        free_at_fit = free_now();
        for (int i = 0; i < made; i++) A.cuMemRelease(held[i]);
        fit = 0;
    } else if (!strcmp(path, "context")) {
        /* REMAINING is one context's reservation: a second context fits, then nothing does. */
        CUcontext second = 0;
        fit = A.cuCtxCreate(&second, 0, dev);
        free_at_fit = free_now();
        over = A.cuMemAlloc(&p, 1);
        if (!over) A.cuMemFree(p);
        if (!fit) A.cuCtxDestroy(second);
        A.cuCtxSetCurrent(ctx);
    } else if (!strcmp(path, "stack") || !strcmp(path, "heap")) {
        /* The stack is reserved for every thread that can be resident (threads per SM x SMs):
         * raised by the most bytes a thread that fit REMAINING, then by one more. The malloc
         * heap takes its size: raised by REMAINING, then by one byte more. Both are put back
         * after. */
        int limit = !strcmp(path, "stack") ? 0 : 2;
        size_t unit = 1;
        if (limit == 0) {
            int sms = 0, per_sm = 0;
            A.cuDeviceGetAttribute(&sms, 16, dev);
            A.cuDeviceGetAttribute(&per_sm, 39, dev);
            unit = (size_t)sms * (size_t)per_sm;
        }
        size_t before = 0, after_over = 0;
        A.cuCtxGetLimit(&before, limit);
        fit = A.cuCtxSetLimit(limit, before + r / unit);
        free_at_fit = free_now();
        over = A.cuCtxSetLimit(limit, before + r / unit + 1);
        A.cuCtxGetLimit(&after_over, limit);
        printf("unit=%zu raised_by=%zu kept_after_over=%d lowered=%s ", unit, r / unit,
               after_over == before + r / unit, name(A.cuCtxSetLimit(limit, before)));
    } else if (!strcmp(path, "limit_gone")) {
        CUcontext own = 0;
        fit = A.cuCtxCreate(&own, 0, dev);
        over = A.cuCtxSetLimit(2, 8 * MiB + r);
        printf("own_raised=%s ", name(over));
        A.cuCtxDestroy(own);
        A.cuCtxSetCurrent(ctx);
        printf("after_destroy=%zu ", free_now());
        printf("primary_raised=%s ", name(A.cuCtxSetLimit(2, 8 * MiB + r)));
        free_at_fit = free_now();
        A.cuCtxSetCurrent(0);
        A.cuDevicePrimaryCtxRelease(dev);
        A.cuDevicePrimaryCtxRetain(&ctx, dev);
        A.cuCtxSetCurrent(ctx);
        printf("after_release=%zu ", free_now());
    } else if (!strcmp(path, "reset")) {
        CUdeviceptr q = 0;
        size_t heap = 0;
        A.cuCtxGetLimit(&heap, 2);
        printf("held=%s,%s,%s ", name(A.cuMemAlloc(&p, r / 4)), name(A.cuMemAllocAsync(&q, r / 4, 0)),
               name(A.cuCtxSetLimit(2, heap + r / 4)));
        printf("before_reset=%zu ", free_now());
        printf("reset=%s ", name(A.cuDevicePrimaryCtxReset(dev)));
        A.cuDevicePrimaryCtxRetain(&ctx, dev);
        A.cuCtxSetCurrent(ctx);
        fit = A.cuMemAlloc(&p, r);
        free_at_fit = free_now();
        if (!fit) A.cuMemFree(p);
        over = A.cuMemAlloc(&p, r + 1);
        if (!over) A.cuMemFree(p);
    } else if (!strcmp(path, "module")) {
        /* Modules whose one global variable takes REMAINING ("fit", then unloaded:
         * "after_unload") and a byte more ("over"); half of REMAINING by cuModuleLoadDataEx
         * and by cuLibraryLoadData ("ex_free", "library_free", each unloaded after); and half
         * loaded into a context of its own that is then destroyed ("after_ctx"). */
        void *m = 0, *l = 0;
        fit = A.cuModuleLoadData(&m, ptx_with_global(r));
        free_at_fit = free_now();
        if (!fit) A.cuModuleUnload(m);
        printf("after_unload=%zu ", free_now());
        over = A.cuModuleLoadData(&m, ptx_with_global(r + 1));
        if (!over) A.cuModuleUnload(m);
        printf("ex=%s ", name(A.cuModuleLoadDataEx(&m, ptx_with_global(r / 2), 0, 0, 0)));
        printf("ex_free=%zu ", free_now());
        A.cuModuleUnload(m);
        printf("library=%s ", name(A.cuLibraryLoadData(&l, ptx_with_global(r / 2), 0, 0, 0, 0, 0, 0)));
        printf("library_free=%zu ", free_now());
        A.cuLibraryUnload(l);
        CUcontext own = 0;
        A.cuCtxCreate(&own, 0, dev);
        printf("in_ctx=%s ", name(A.cuModuleLoadData(&m, ptx_with_global(r / 4))));
        A.cuCtxDestroy(own);
        A.cuCtxSetCurrent(ctx);
        printf("after_ctx=%zu ", free_now());
    } else if (!strcmp(path, "module_image")) {
        /* The module images in the files WALL_MODULE_IMAGE ("fit", then unloaded:
         * "after_unload") and WALL_MODULE_IMAGE_OVER ("over"), by cuModuleLoadData. */
        void *m = 0;
        void *fits = read_file(getenv("WALL_MODULE_IMAGE"));
        void *too_big = read_file(getenv("WALL_MODULE_IMAGE_OVER"));
        if (!fits || !too_big) { printf("error=module_image\n"); return 1; }
        fit = A.cuModuleLoadData(&m, fits);
        free_at_fit = free_now();
        if (!fit) A.cuModuleUnload(m);
        printf("after_unload=%zu ", free_now());
        over = A.cuModuleLoadData(&m, too_big);
        if (!over) A.cuModuleUnload(m);
    } else if (!strcmp(path, "heap_race")) {
        /* Eight threads set the malloc heap of one context at once, 300 times each, to sizes
         * up to a quarter past REMAINING (some refused). After: what the slice shows free is
         * what the heap's final size leaves ("free_at_fit" against "final"), and putting the
         * heap back gives it all back ("end_free"). */
        size_t base = 0, final = 0;
        A.cuCtxGetLimit(&base, 2);
        pthread_t t[8];
        struct racer w[8];
        for (int i = 0; i < 8; i++) {
            w[i] = (struct racer){ctx, base, r, 7919u * (unsigned)(i + 1), 0};
            pthread_create(&t[i], 0, race_heap, &w[i]);
        }
        int refused = 0;
        for (int i = 0; i < 8; i++) { pthread_join(t[i], 0); refused += w[i].refused; }
        A.cuCtxGetLimit(&final, 2);
        free_at_fit = free_now();
        printf("refused=%d raised_by=%zu ", refused, final - base);
        fit = A.cuCtxSetLimit(2, base);
        over = A.cuCtxSetLimit(2, base + r + 1);
    } else if (!strcmp(path, "ctx_gone")) {
        /* Memory left allocated in a context that is destroyed: the driver frees it with the
         * context. A context of its own, holding a quarter of REMAINING by cuMemAlloc and a
         * quarter by cuMemAllocManaged, destroyed ("after_destroy"); then the primary context,
         * holding a quarter, released to zero while a context of its own is kept
         * ("after_release", seen from that context). */
        CUcontext own = 0;
        CUdeviceptr q = 0;
        A.cuCtxCreate(&own, 0, dev);
        printf("own_held=%s,%s ", name(A.cuMemAlloc(&p, r / 4)), name(A.cuMemAllocManaged(&q, r / 4, 1)));
        printf("own_destroyed=%s ", name(A.cuCtxDestroy(own)));
        A.cuCtxSetCurrent(ctx);
        printf("after_destroy=%zu ", free_now());
        A.cuCtxCreate(&own, 0, dev);
        A.cuCtxSetCurrent(ctx);
        printf("primary_held=%s ", name(A.cuMemAlloc(&p, r / 4)));
        A.cuCtxSetCurrent(own);
        A.cuDevicePrimaryCtxRelease(dev);
        printf("after_release=%zu ", free_now());
        A.cuCtxDestroy(own);
        A.cuDevicePrimaryCtxRetain(&ctx, dev);
        A.cuCtxSetCurrent(ctx);
        fit = A.cuMemAlloc(&p, r);
        free_at_fit = free_now();
        if (!fit) A.cuMemFree(p);
        over = A.cuMemAlloc(&p, r + 1);
        if (!over) A.cuMemFree(p);
    } else if (!strcmp(path, "green")) {
        /* Green contexts on a group of the device's SMs, made until refused ("made"; "over"
         * the refusal), one used for an allocation; all destroyed ("after_destroy"). Then
         * with the primary context released, one green context, which retains it again
         * ("alone", and what is free then); destroyed, and the primary retained again, a MiB
         * allocated in it ("left", see there). */
        CUdevResource all, group, rest;
        CUdevResourceDesc desc = 0;
        unsigned groups = 1;
        if (A.cuDeviceGetDevResource(dev, &all, 1) ||
            A.cuDevSmResourceSplitByCount(&group, &groups, &all, &rest, 0, 8) ||
            A.cuDevResourceGenerateDesc(&desc, &group, 1)) {
            printf("error=resources\n");
            return 1;
        }
        printf("sms=%u group=%u ", all.smCount, group.smCount);
        CUgreenCtx green[64];
        int made = 0;
        while (made < 64 && !(over = A.cuGreenCtxCreate(&green[made], desc, dev, 1))) made++;
        free_at_fit = free_now();
        fit = made ? 0 : over;
        CUcontext inside = 0;
        if (made && !A.cuCtxFromGreenCtx(&inside, green[0]) && !A.cuCtxSetCurrent(inside)) {
            printf("alloc_in_green=%s ", name(A.cuMemAlloc(&p, MiB)));
            A.cuMemFree(p);
            A.cuCtxSetCurrent(ctx);
        }
        int destroyed = 0;
        for (int i = 0; i < made; i++) destroyed += !A.cuGreenCtxDestroy(green[i]);
        printf("made=%d destroyed=%d after_destroy=%zu ", made, destroyed, free_now());
        A.cuCtxSetCurrent(0);
        A.cuDevicePrimaryCtxRelease(dev);
        CUgreenCtx alone = 0;
        printf("alone=%s ", name(A.cuGreenCtxCreate(&alone, desc, dev, 1)));
        if (alone && !A.cuCtxFromGreenCtx(&inside, alone) && !A.cuCtxSetCurrent(inside)) {
            printf("alone_free=%zu ", free_now());
            A.cuCtxSetCurrent(0);
            A.cuGreenCtxDestroy(alone);
        }
        /* A MiB left allocated in the primary context, which is then released while a green
         * context holds it: destroying the green context destroys the primary one, and the
         * driver frees the MiB with it. */
        A.cuDevicePrimaryCtxRetain(&ctx, dev);
        A.cuCtxSetCurrent(ctx);
        CUgreenCtx last = 0;
        printf("left=%s,%s ", name(A.cuMemAlloc(&p, MiB)), name(A.cuGreenCtxCreate(&last, desc, dev, 1)));
        A.cuCtxSetCurrent(0);
        A.cuDevicePrimaryCtxRelease(dev);
        A.cuGreenCtxDestroy(last);
        A.cuDevicePrimaryCtxRetain(&ctx, dev);
        A.cuCtxSetCurrent(ctx);
    } else if (!strcmp(path, "local")) {
        /* Kernels whose threads need more local memory than the stack holds: at their launch
         * the driver grows the stack to it for every thread that can be resident (threads per
         * SM x SMs), and keeps it. "fits" needs the most bytes a thread that fit REMAINING
         * past the stack, "over" one more; launched directly ("fit", "over"), then, with the
         * stack put back ("lowered_free"), as a graph's one kernel node ("graph_fit",
         * "graph_free", "graph_over", and "graph_swapped" below), and in graphs that run
         * other graphs (graphs_in_graphs). The stack is put back at the end. */
        int sms = 0, per_sm = 0;
        A.cuDeviceGetAttribute(&sms, 16, dev);
        A.cuDeviceGetAttribute(&per_sm, 39, dev);
        size_t unit = (size_t)sms * (size_t)per_sm, before = 0, at_fit = 0, after_over = 0;
        A.cuCtxGetLimit(&before, 0);
        void *m = 0;
        CUfunction fits = 0, too_big = 0;
        if (A.cuModuleLoadData(&m, ptx_with_locals(before + r / unit, before + r / unit + 1)) ||
            A.cuModuleGetFunction(&fits, m, "fits") || A.cuModuleGetFunction(&too_big, m, "over")) {
            printf("error=module\n"); return 1;
        }
        fit = A.cuLaunchKernel(fits, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0);
        free_at_fit = free_now();
        A.cuCtxGetLimit(&at_fit, 0);
        over = A.cuLaunchKernel(too_big, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0);
        /* The same kernel through CUDA 2.0's launch call ("grid_over"). */
        A.cuFuncSetBlockShape(too_big, 1, 1, 1);
        printf("grid_over=%s ", name(A.cuLaunchGrid(too_big, 1, 1)));
        A.cuCtxGetLimit(&after_over, 0);
        printf("unit=%zu grown_by=%zu stack_at_fit=%zu kept_after_over=%d ", unit, at_fit - before,
               at_fit, after_over == at_fit);
        printf("lowered=%s ", name(A.cuCtxSetLimit(0, before)));
        printf("lowered_free=%zu ", free_now());
        CUgraphExec graph_fits = graph_of(fits), graph_over = graph_of(too_big);
        printf("graph_fit=%s ", name(A.cuGraphLaunch(graph_fits, 0)));
        printf("graph_free=%zu ", free_now());
        printf("graph_over=%s ", name(A.cuGraphLaunch(graph_over, 0)));
        /* A graph instantiated with "fits" whose node is then given "over" in the executable
         * graph alone: its launch makes the driver grow the stack as a launch of "over"
         * would ("graph_swapped"). */
        CUgraph g = 0;
        CUgraphNode n = 0;
        CUgraphExec swapped = 0;
        CUDA_KERNEL_NODE_PARAMS_v2 k = {fits, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0};
        if (A.cuGraphCreate(&g, 0) || A.cuGraphAddKernelNode(&n, g, 0, 0, &k) ||
            A.cuGraphInstantiateWithFlags(&swapped, g, 0)) {
            printf("error=graph\n"); return 1;
        }
        k.func = too_big;
        printf("swap=%s ", name(A.cuGraphExecKernelNodeSetParams(swapped, n, &k)));
        printf("graph_swapped=%s ", name(A.cuGraphLaunch(swapped, 0)));
        A.cuCtxSynchronize();
        A.cuGraphExecDestroy(swapped);
        A.cuGraphDestroy(g);
        graphs_in_graphs(ctx, fits, too_big);
        A.cuCtxSynchronize();
        A.cuGraphExecDestroy(graph_fits);
        A.cuGraphExecDestroy(graph_over);
        A.cuCtxSetLimit(0, before);
        A.cuModuleUnload(m);
    } else if (!strcmp(path, "local_race")) {
        /* Eight threads launch, 200 times each in a random order, kernels of eight sizes of
         * local memory up to the most that fits REMAINING past the stack, and one a byte a
         * thread over ("over", refused each time). After: the stack the driver grew
         * ("raised_by" threads' bytes) is what the slice shows taken ("free_at_fit"), however
         * the launches interleaved; putting the stack back gives it all back. */
        int sms = 0, per_sm = 0;
        A.cuDeviceGetAttribute(&sms, 16, dev);
        A.cuDeviceGetAttribute(&per_sm, 39, dev);
        size_t unit = (size_t)sms * (size_t)per_sm, before = 0, final = 0;
        A.cuCtxGetLimit(&before, 0);
        size_t most = r / unit, step = most / 8;
        void *m = 0;
        struct launcher w[8];
        w[0].ctx = ctx;
        if (A.cuModuleLoadData(&m, ptx_with_local_ladder(before + most - 8 * step, step, before + most + 1))) {
            printf("error=module\n"); return 1;
        }
        for (int k = 0; k < 9; k++) {
            char kname[8];
            snprintf(kname, sizeof kname, k < 8 ? "k%d" : "over", k);
            if (A.cuModuleGetFunction(&w[0].k[k], m, kname)) { printf("error=function\n"); return 1; }
        }
        pthread_t t[8];
        for (int i = 0; i < 8; i++) {
            w[i] = w[0];
            w[i].seed = 104729u * (unsigned)(i + 1);
            w[i].tried_over = w[i].refused = w[i].failed = 0;
            pthread_create(&t[i], 0, race_local, &w[i]);
        }
        int tried_over = 0, refused = 0, failed = 0;
        for (int i = 0; i < 8; i++) {
            pthread_join(t[i], 0);
            tried_over += w[i].tried_over; refused += w[i].refused; failed += w[i].failed;
        }
        A.cuCtxSynchronize();
        A.cuCtxGetLimit(&final, 0);
        free_at_fit = free_now();
        printf("unit=%zu tried_over=%d refused=%d failed=%d raised_by=%zu ", unit, tried_over,
               refused, failed, (final - before) * unit);
        fit = A.cuCtxSetLimit(0, before);
        A.cuModuleUnload(m);
    } else if (!strcmp(path, "interop")) {
        /* Contexts for OpenGL and for VDPAU interop (cuGLCtxCreate, cuVDPAUCtxCreate) made
         * until refused ("gl_made", "vdpau_made", the refusals "gl_over", "vdpau_over"),
         * what is free then ("gl_free", "vdpau_free"), then destroyed. */
        CUcontext made[64];
        static int vdp_get_proc_address; /* stands for VDPAU's function */
        int n = 0;
        CUresult refused = 0;
        while (n < 64 && !(refused = A.cuGLCtxCreate(&made[n], 0, dev))) n++;
        printf("gl_made=%d gl_over=%s gl_free=%zu ", n, name(refused), free_now());
        while (n > 0) A.cuCtxDestroy(made[--n]);
        while (n < 64 && !(refused = A.cuVDPAUCtxCreate(&made[n], 0, dev, 1, &vdp_get_proc_address))) n++;
        printf("vdpau_made=%d vdpau_over=%s vdpau_free=%zu ", n, name(refused), free_now());
        while (n > 0) A.cuCtxDestroy(made[--n]);
        fit = A.cuCtxSetCurrent(ctx);
    } else if (!strcmp(path, "double_free")) {
        /* Freeing twice, or freeing what was never allocated, gives nothing back twice. */
        fit = A.cuMemAlloc(&p, r);
        A.cuMemFree(p);
        A.cuMemFree(p);
        A.cuMemFree(0x1234);
        free_at_fit = free_now();
        over = A.cuMemAlloc(&p, r + 1);
    } else {
        printf("error=unknown-path\n");
        return 2;
    }
    printf("fit=%s free_at_fit=%zu over=%s end_free=%zu\n", name(fit), free_at_fit, name(over), free_now());
    A.cuDevicePrimaryCtxRelease(dev);
    return 0;
}
