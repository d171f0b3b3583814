/* A tenant trying to reach the driver's allocator without the interception library seeing it.
 * Usage: door ROUTE BYTES, ROUTE one of
 *   dlsym  glibc's own dlsym, taken by symbol version (what gets around an interposed dlsym),
 *          on the handle of libcuda.so.1;
 *   path   the real driver library loaded by the private path it is mounted at.
 * Allocates BYTES on GPU 0, prints "alloc=<CUresult>", and holds the memory until its stdin
 * closes. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef void *(*dlsym_fn)(void *, const char *);

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: door dlsym|path BYTES\n"); return 2; }
    size_t bytes = strtoull(argv[2], 0, 10);
    dlsym_fn find = (dlsym_fn)dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34");
    if (!find) find = (dlsym_fn)dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.2.5");
    void *h;
    if (strcmp(argv[1], "path") == 0)
        h = dlopen("/usr/lib/gpuslice/driver/libgpuslice-driver-cuda.so.1", RTLD_NOW);
    else
        h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!find || !h) { printf("alloc=no-driver\n"); return 1; }
    CUresult (*init)(unsigned) = (CUresult (*)(unsigned))find(h, "cuInit");
    CUresult (*get)(CUdevice *, int) = (CUresult (*)(CUdevice *, int))find(h, "cuDeviceGet");
    CUresult (*retain)(CUcontext *, CUdevice) =
        (CUresult (*)(CUcontext *, CUdevice))find(h, "cuDevicePrimaryCtxRetain");
    CUresult (*current)(CUcontext) = (CUresult (*)(CUcontext))find(h, "cuCtxSetCurrent");
    CUresult (*alloc)(CUdeviceptr *, size_t) =
        (CUresult (*)(CUdeviceptr *, size_t))find(h, "cuMemAlloc_v2");
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p;
    if (init(0) || get(&dev, 0) || retain(&ctx, dev) || current(ctx)) {
        printf("alloc=init-failed\n");
        return 1;
    }
    printf("alloc=%d\n", alloc(&p, bytes));
    fflush(stdout);
    char buf[16];
    while (fread(buf, 1, sizeof buf, stdin) > 0) {}
    return 0;
}
