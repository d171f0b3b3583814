/* cuStreamGetCaptureInfo as a CUDA 12.3 runtime finds and calls it: through cuGetProcAddress
 * at version 12030, with the edges' data among its arguments. Prints key=value pairs. */
#include <stdio.h>

typedef void *CUcontext, *CUstream, *CUgraph;
typedef int (*info_v3)(CUstream, int *, unsigned long long *, CUgraph *, const void **, const void **,
                       size_t *);
int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(CUcontext *, int);
int cuCtxSetCurrent(CUcontext);
int cuStreamCreate(CUstream *, unsigned);
int cuStreamBeginCapture_v2(CUstream, int);
int cuStreamEndCapture(CUstream, CUgraph *);
int cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);

int main(void) {
    CUcontext ctx; CUstream s; CUgraph g = 0;
    void *fn = 0;
    int found = -1;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) || cuStreamCreate(&s, 1)) {
        printf("error=init\n");
        return 1;
    }
    int r = cuGetProcAddress_v2("cuStreamGetCaptureInfo", &fn, 12030, 0, &found);
    printf("lookup=%d found=%d ", r, found);
    cuStreamBeginCapture_v2(s, 2 /* relaxed */);
    int status = -1;
    unsigned long long id = 0;
    CUgraph graph = 0;
    const void *deps = (const void *)1, *edges = (const void *)1;
    size_t count = 12345;
    r = ((info_v3)fn)(s, &status, &id, &graph, &deps, &edges, &count);
    printf("info=%d status=%d has_graph=%d deps_null=%d edges_null=%d count=%zu\n", r, status, graph != 0,
           deps == 0, edges == 0, count);
    cuStreamEndCapture(s, &g);
    return 0;
}
