/* Calls two entry points the simulated driver does not model, after modelled ones. */
#include <stdio.h>

int cuInit(unsigned);
int cuDeviceGetCount(int *);
int cuMemPoolExportToShareableHandle(void *, void *, int, unsigned long long);
int cuGraphicsUnregisterResource(void *);

int main(void) {
    int n = 0;
    if (cuInit(0) || cuDeviceGetCount(&n) || n != 1) { printf("error=init\n"); return 1; }
    int a = cuMemPoolExportToShareableHandle(0, 0, 1, 0);
    int b = cuMemPoolExportToShareableHandle(0, 0, 1, 0);
    int c = cuGraphicsUnregisterResource(0);
    printf("export=%d,%d graphics=%d\n", a, b, c);
    return 0;
}
