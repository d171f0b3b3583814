/* Calls two entry points the simulated driver does not model, after modelled ones. */
#include <stdio.h>

int cuInit(unsigned);
int cuDeviceGetCount(int *);
int cuMemPoolExportToShareableHandle(void *, void *, int, unsigned long long);
int cuLinkCreate_v2(unsigned, void *, void **, void **);

int main(void) {
    int n = 0;
    if (cuInit(0) || cuDeviceGetCount(&n) || n != 1) { printf("error=init\n"); return 1; }
    int a = cuMemPoolExportToShareableHandle(0, 0, 1, 0);
    int b = cuMemPoolExportToShareableHandle(0, 0, 1, 0);
    void *state = 0;
    int c = cuLinkCreate_v2(0, 0, 0, &state);
    printf("export=%d,%d link=%d\n", a, b, c);
    return 0;
}
