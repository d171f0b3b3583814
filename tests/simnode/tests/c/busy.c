/* Keeps GPU 0 busy: launches kernels of BLOCKS thread blocks back to back for MS
 * milliseconds (the simulated driver gives each block its node's kernel time). Prints
 * "launching=1" once it starts, "launched=N" when done.
 *
 *   busy BLOCKS MS */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef void *CUcontext, *CUmodule, *CUfunction;
int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(CUcontext *, int);
int cuCtxSetCurrent(CUcontext);
int cuCtxSynchronize(void);
int cuModuleLoadData(CUmodule *, const void *);
int cuModuleGetFunction(CUfunction *, CUmodule, const char *);
int cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                   unsigned, void *, void **, void **);

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    static const char image[] = ".version 7.8\n.target sm_86\n.address_size 64\n"
                                ".visible .entry k() { ret; }\n";
    if (argc != 3) { fprintf(stderr, "usage: busy BLOCKS MS\n"); return 2; }
    unsigned blocks = (unsigned)atoi(argv[1]);
    double until = now_ms() + atof(argv[2]);
    CUcontext ctx; CUmodule m; CUfunction k;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx)
        || cuModuleLoadData(&m, image) || cuModuleGetFunction(&k, m, "k")) {
        printf("error=init\n");
        return 1;
    }
    printf("launching=1\n");
    fflush(stdout);
    long launched = 0;
    while (now_ms() < until) {
        /* Launches block once the device's queue is full, as on a real GPU. */
        if (cuLaunchKernel(k, blocks, 1, 1, 32, 1, 1, 0, 0, 0, 0)) { printf("error=launch\n"); return 1; }
        launched++;
    }
    cuCtxSynchronize();
    printf("launched=%ld\n", launched);
    return 0;
}
