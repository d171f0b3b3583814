/* A tenant with a slice of two GPUs launching a library's kernel (context-less, CUDA 12's
 * cuLibraryLoadData) whose threads each need LOCAL bytes of local memory: first on a stream
 * of GPU 0's context, which makes the driver grow that context's stack, then, GPU 0's
 * context still current, on a stream of GPU 1's context: the driver runs it in the stream's
 * context and grows GPU 1's stack. Then it fills GPU 1 with 1 MiB allocations in its context
 * until one is refused. A launch charged to the current context's GPU lets GPU 1 hold its
 * stack uncharged, above its slice. Prints "on0=R on1=R plain=N", then holds everything
 * until stdin closes.
 *
 *   launch_device LOCAL */
#include <stdio.h>
#include <stdlib.h>

typedef void *CUcontext, *CUstream, *CUlibrary, *CUkernel;
typedef unsigned long long CUdeviceptr;

int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(CUcontext *, int);
int cuCtxSetCurrent(CUcontext);
int cuStreamCreate(CUstream *, unsigned);
int cuMemAlloc_v2(CUdeviceptr *, size_t);
int cuLibraryLoadData(CUlibrary *, const void *, void *, void **, unsigned, void *, void **,
                      unsigned);
int cuLibraryGetKernel(CUkernel *, CUlibrary, const char *);
int cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                   unsigned, CUstream, void **, void **);

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: launch_device LOCAL\n"); return 2; }
    size_t local = strtoull(argv[1], 0, 10);
    CUcontext ctx0, ctx1;
    CUstream on0, on1;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx0, 0) || cuDevicePrimaryCtxRetain(&ctx1, 1)
        || cuCtxSetCurrent(ctx1) || cuStreamCreate(&on1, 1) || cuCtxSetCurrent(ctx0)
        || cuStreamCreate(&on0, 1)) {
        printf("error=init\n");
        return 1;
    }
    static char image[512];
    snprintf(image, sizeof image,
             ".version 7.0\n.target sm_75\n.address_size 64\n"
             ".visible .entry deep() {\n .local .align 4 .b8 scratch[%zu];\n ret;\n}\n", local);
    CUlibrary library;
    CUkernel deep;
    if (cuLibraryLoadData(&library, image, 0, 0, 0, 0, 0, 0)
        || cuLibraryGetKernel(&deep, library, "deep")) {
        printf("error=library\n");
        return 1;
    }
    int r0 = cuLaunchKernel(deep, 1, 1, 1, 32, 1, 1, 0, on0, 0, 0);
    int r1 = cuLaunchKernel(deep, 1, 1, 1, 32, 1, 1, 0, on1, 0, 0);
    if (cuCtxSetCurrent(ctx1)) { printf("error=switch\n"); return 1; }
    long plain = 0;
    for (;;) {
        CUdeviceptr p;
        if (cuMemAlloc_v2(&p, 1 << 20)) break;
        plain++;
    }
    printf("on0=%d on1=%d plain=%ld\n", r0, r1, plain);
    fflush(stdout);
    char c;
    while (fread(&c, 1, 1, stdin) == 1) {}
    return 0;
}
