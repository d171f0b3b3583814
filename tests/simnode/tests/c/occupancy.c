/* A kernel's attributes and occupancy on a simulated A10 (compute capability 8.6, 72 SMs). */
#include <stdio.h>

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

int main(void) {
    CUcontext ctx; CUmodule m; CUfunction f;
    static const char image[] = "//\n.version 7.0\n.target sm_86\n.entry k() { ret; }\n";
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
    return 0;
}
