/* Contexts that go while their kernels still run: ROUNDS times, makes a context, launches
 * LAUNCHES kernels of BLOCKS thread blocks on it and destroys it at once (odd rounds a
 * context of its own, cuCtxDestroy; even rounds the primary context, cuDevicePrimaryCtxReset),
 * then prints "rounds=ROUNDS".
 *
 *   churn ROUNDS LAUNCHES BLOCKS
 */
#include <stdio.h>
#include <stdlib.h>

#include "driver.h"

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: churn ROUNDS LAUNCHES BLOCKS\n");
        return 2;
    }
    int rounds = atoi(argv[1]), launches = atoi(argv[2]);
    unsigned blocks = (unsigned)atoi(argv[3]);
    static const char image[] = "spin";
    CUdevice dev;
    if (cuInit(0) || cuDeviceGet(&dev, 0)) {
        printf("error=init\n");
        return 1;
    }
    for (int round = 1; round <= rounds; round++) {
        int own = round % 2;
        CUcontext ctx;
        CUmodule module;
        CUfunction kernel;
        CUresult r = own ? cuCtxCreate_v2(&ctx, 0, dev)
                         : cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx);
        if (r || cuModuleLoadData(&module, image) || cuModuleGetFunction(&kernel, module, "spin")) {
            printf("error=context round=%d\n", round);
            return 1;
        }
        for (int i = 0; i < launches; i++) {
            r = cuLaunchKernel(kernel, blocks, 1, 1, 128, 1, 1, 0, 0, 0, 0);
            if (r) {
                printf("error=launch %d round=%d\n", r, round);
                return 1;
            }
        }
        r = own ? cuCtxDestroy_v2(ctx) : cuDevicePrimaryCtxReset_v2(dev);
        if (r) {
            printf("error=destroy %d round=%d\n", r, round);
            return 1;
        }
    }
    printf("rounds=%d\n", rounds);
    return 0;
}
