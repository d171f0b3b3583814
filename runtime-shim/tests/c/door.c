/* A tenant going around the interception library: it takes glibc's own dlsym by version
 * (dlvsym is not interposed) and resolves the driver's allocator in the driver's handle, so
 * that its allocation is seen by the driver only. Usage: door BYTES; allocates BYTES on GPU 0,
 * prints "alloc=<CUresult>", and holds the memory until its stdin closes. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef void *(*dlsym_fn)(void *, const char *);

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: door BYTES\n"); return 2; }
    size_t bytes = strtoull(argv[1], 0, 10);
    dlsym_fn real_dlsym = (dlsym_fn)dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34");
    if (!real_dlsym) real_dlsym = (dlsym_fn)dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.2.5");
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!real_dlsym || !h) { printf("alloc=no-driver\n"); return 1; }
    CUresult (*init)(unsigned) = (CUresult (*)(unsigned))real_dlsym(h, "cuInit");
    CUresult (*get)(CUdevice *, int) = (CUresult (*)(CUdevice *, int))real_dlsym(h, "cuDeviceGet");
    CUresult (*retain)(CUcontext *, CUdevice) =
        (CUresult (*)(CUcontext *, CUdevice))real_dlsym(h, "cuDevicePrimaryCtxRetain");
    CUresult (*current)(CUcontext) = (CUresult (*)(CUcontext))real_dlsym(h, "cuCtxSetCurrent");
    CUresult (*alloc)(CUdeviceptr *, size_t) =
        (CUresult (*)(CUdeviceptr *, size_t))real_dlsym(h, "cuMemAlloc_v2");
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
