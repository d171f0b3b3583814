/* Calls two entry points the simulated driver does not model, after modelled ones. */
#include <stdio.h>

int cuInit(unsigned);
int cuDeviceGetCount(int *);
int cuProfilerStart(void);
int cuLinkCreate_v2(unsigned, void *, void **, void **);

int main(void) {
    int n = 0;
    if (cuInit(0) || cuDeviceGetCount(&n) || n != 1) { printf("error=init\n"); return 1; }
    int a = cuProfilerStart(), b = cuProfilerStart();
    void *state = 0;
    int c = cuLinkCreate_v2(0, 0, 0, &state);
    printf("profiler=%d,%d link=%d\n", a, b, c);
    return 0;
}
