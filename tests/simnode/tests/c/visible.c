/* The GPUs this process sees through CUDA and NVML: "cuda=<bus ids> nvml=<minor numbers>". */
#include <stdio.h>

typedef void *nvmlDevice_t;
int cuInit(unsigned);
int cuDeviceGetCount(int *);
int cuDeviceGet(int *, int);
int cuDeviceGetPCIBusId(char *, int, int);
int nvmlInit_v2(void);
int nvmlDeviceGetCount_v2(unsigned *);
int nvmlDeviceGetHandleByIndex_v2(unsigned, nvmlDevice_t *);
int nvmlDeviceGetMinorNumber(nvmlDevice_t, unsigned *);
int nvmlDeviceGetIndex(nvmlDevice_t, unsigned *);

int main(void) {
    int n = 0;
    printf("cuda=");
    if (cuInit(0) == 0 && cuDeviceGetCount(&n) == 0) {
        for (int i = 0; i < n; i++) {
            int dev; char bus[32] = "";
            cuDeviceGet(&dev, i);
            cuDeviceGetPCIBusId(bus, sizeof bus, dev);
            printf("%s%s", i ? "," : "", bus);
        }
    }
    unsigned m = 0;
    printf(" nvml=");
    if (nvmlInit_v2() == 0 && nvmlDeviceGetCount_v2(&m) == 0) {
        for (unsigned i = 0; i < m; i++) {
            nvmlDevice_t d; unsigned minor = 99, index = 99;
            nvmlDeviceGetHandleByIndex_v2(i, &d);
            nvmlDeviceGetMinorNumber(d, &minor);
            nvmlDeviceGetIndex(d, &index);
            printf("%s%u@%u", i ? "," : "", minor, index);
        }
    }
    printf("\n");
    return 0;
}
