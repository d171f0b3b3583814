/* A kernel's attributes and occupancy on a simulated A10 (compute capability 8.6, 72 SMs);
 * on a simulated H100, thread block clusters too. */
#include <stdio.h>
#include <string.h>

typedef void *CUcontext, *CUmodule, *CUfunction;
int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(CUcontext *, int);
int cuCtxSetCurrent(CUcontext);
int cuModuleLoadData(CUmodule *, const void *);
int cuModuleGetFunction(CUfunction *, CUmodule, const char *);
int cuFuncGetAttribute(int *, int, CUfunction);
int cuFuncSetAttribute(CUfunction, int, int);
int cuOccupancyMaxActiveBlocksPerMultiprocessor(int *, CUfunction, int, size_t);
int cuOccupancyMaxPotentialBlockSize(int *, int *, CUfunction, size_t (*)(int), size_t, int);
int cuOccupancyAvailableDynamicSMemPerBlock(size_t *, CUfunction, int, int);

/* CUlaunchConfig and CUlaunchAttribute as cuda.h lays them out. */
typedef struct { unsigned id; char pad[4]; union { unsigned dim[3]; char bytes[64]; } value; } CUlaunchAttribute;
typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void *hStream; CUlaunchAttribute *attrs; unsigned numAttrs;
} CUlaunchConfig;
int cuOccupancyMaxActiveClusters(int *, CUfunction, const CUlaunchConfig *);
int cuOccupancyMaxPotentialClusterSize(int *, CUfunction, const CUlaunchConfig *);
int cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **);

/* Launches `f` on a grid of gx x 2 blocks of 256 threads in clusters of cx x cy. */
static int launch_cluster(CUfunction f, unsigned gx, unsigned cx, unsigned cy) {
    CUlaunchAttribute a; memset(&a, 0, sizeof a);
    a.id = 4; /* CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION */
    a.value.dim[0] = cx; a.value.dim[1] = cy; a.value.dim[2] = 1;
    CUlaunchConfig c; memset(&c, 0, sizeof c);
    c.gridDimX = gx; c.gridDimY = 2; c.gridDimZ = 1; c.blockDimX = 256; c.blockDimY = c.blockDimZ = 1;
    c.attrs = &a; c.numAttrs = 1;
    return cuLaunchKernelEx(&c, f, 0, 0);
}

/* Clusters of `size` blocks (1 x size x 1; 0: no cluster attribute) of 256 threads that can
 * be resident at once, or -(the error). */
static int clusters(CUfunction f, unsigned size) {
    CUlaunchAttribute a; memset(&a, 0, sizeof a);
    a.id = 4; /* CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION */
    a.value.dim[0] = 1; a.value.dim[1] = size; a.value.dim[2] = 1;
    CUlaunchConfig c; memset(&c, 0, sizeof c);
    c.gridDimX = 64; c.gridDimY = c.gridDimZ = 1; c.blockDimX = 256; c.blockDimY = c.blockDimZ = 1;
    c.attrs = &a; c.numAttrs = size ? 1 : 0;
    int n = -1, rc = cuOccupancyMaxActiveClusters(&n, f, &c);
    return rc ? -rc : n;
}

static int potential(CUfunction f) {
    CUlaunchConfig c; memset(&c, 0, sizeof c);
    c.gridDimX = 64; c.gridDimY = c.gridDimZ = 1; c.blockDimX = 256; c.blockDimY = c.blockDimZ = 1;
    int n = -1, rc = cuOccupancyMaxPotentialClusterSize(&n, f, &c);
    return rc ? -rc : n;
}

int main(void) {
    CUcontext ctx; CUmodule m; CUfunction f;
    static const char image[] = "//\n.version 7.0\n.target sm_86\n.entry k() { ret; }\n.entry g() { ret; }\n";
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) || cuModuleLoadData(&m, image)
        || cuModuleGetFunction(&f, m, "k")) { printf("error=init\n"); return 1; }
    int threads = 0, regs = 0, ptx = 0, dyn = 0, blocks = 0, grid = 0, block = 0;
    cuFuncGetAttribute(&threads, 0, f);
    cuFuncGetAttribute(&regs, 4, f);
    cuFuncGetAttribute(&ptx, 5, f);
    int set = cuFuncSetAttribute(f, 8, 65536), too_much = cuFuncSetAttribute(f, 8, 1 << 20);
    cuFuncGetAttribute(&dyn, 8, f);
    cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, 256, 0);
    cuOccupancyMaxPotentialBlockSize(&grid, &block, f, 0, 0, 0);
    printf("threads=%d regs=%d ptx=%d set=%d too_much=%d dynamic=%d blocks256=%d block=%d grid=%d\n", threads, regs, ptx, set,
           too_much, dyn, blocks, block, grid);
    /* The dynamic shared memory a block can have with 1, 2 and 7 blocks of 256 threads
     * resident on an SM; then the cluster attributes (GPUs from compute capability 9.0). */
    size_t one = 0, two = 0, seven = 0;
    cuOccupancyAvailableDynamicSMemPerBlock(&one, f, 1, 256);
    cuOccupancyAvailableDynamicSMemPerBlock(&two, f, 2, 256);
    cuOccupancyAvailableDynamicSMemPerBlock(&seven, f, 7, 256);
    int non_portable = cuFuncSetAttribute(f, 14, 1), width = cuFuncSetAttribute(f, 11, 2), got = -1;
    cuFuncGetAttribute(&got, 14, f);
    printf("smem1=%zu smem2=%zu smem7=%zu non_portable=%d width=%d non_portable_now=%d\n", one, two, seven,
           non_portable, width, got);
    /* Clusters: `g` has no cluster attributes; `k` now requires a width of 2 where the device
     * took it, and allows non-portable sizes. */
    CUfunction g;
    if (cuModuleGetFunction(&g, m, "g")) { printf("error=g\n"); return 1; }
    int c2 = clusters(g, 2), c8 = clusters(g, 8), c16 = clusters(g, 16), unset = clusters(g, 0), pot = potential(g);
    cuFuncSetAttribute(g, 14, 1);
    printf("clusters2=%d clusters8=%d clusters16=%d unset=%d potential=%d non_portable16=%d non_portable_potential=%d "
           "required_as_set=%d required_other=%d required_potential=%d\n",
           c2, c8, c16, unset, pot, clusters(g, 16), potential(g), clusters(f, 0), clusters(f, 4), potential(f));
    /* Launches in clusters: `g` now allows non-portable sizes; `k` requires a width of 2. */
    int l1 = launch_cluster(g, 64, 1, 1), l2 = launch_cluster(g, 64, 2, 1), ragged = launch_cluster(g, 63, 2, 1);
    int tall = launch_cluster(g, 64, 1, 2), l16 = launch_cluster(g, 64, 16, 1), l32 = launch_cluster(g, 64, 16, 2);
    int req = launch_cluster(f, 64, 2, 1), req_other = launch_cluster(f, 64, 1, 2);
    printf("launch1=%d launch2=%d ragged=%d tall=%d launch16=%d launch32=%d required=%d required_other=%d\n", l1, l2,
           ragged, tall, l16, l32, req, req_other);
    return 0;
}
