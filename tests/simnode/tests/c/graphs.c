/* Stream capture and graph replay on the simulated driver. Prints key=value pairs. */
#include <stdio.h>

typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUgraph, *CUgraphExec, *CUgraphNode;
int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(CUcontext *, int);
int cuCtxSetCurrent(CUcontext);
int cuModuleLoadData(CUmodule *, const void *);
int cuModuleGetFunction(CUfunction *, CUmodule, const char *);
int cuStreamCreate(CUstream *, unsigned);
int cuStreamBeginCapture_v2(CUstream, int);
int cuStreamEndCapture(CUstream, CUgraph *);
int cuStreamGetCaptureInfo_v2(CUstream, int *, unsigned long long *, CUgraph *, const CUgraphNode **, size_t *);
int cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
int cuLaunchHostFunc(CUstream, void (*)(void *), void *);
int cuGraphGetNodes(CUgraph, CUgraphNode *, size_t *);
int cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
int cuGraphLaunch(CUgraphExec, CUstream);
int cuGraphExecDestroy(CUgraphExec);
int cuGraphDestroy(CUgraph);
int cuGraphCreate(CUgraph *, unsigned);
int cuGraphAddHostNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, const void *);
int cuCtxSynchronize(void);

static void count(void *p) { ++*(int *)p; }

int main(void) {
    CUcontext ctx; CUmodule m; CUfunction f; CUstream s; CUgraph g, g2; CUgraphExec e, e2;
    static const char image[] = "//\n.version 7.0\n.target sm_86\n.entry k() { ret; }\n";
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) || cuModuleLoadData(&m, image)
        || cuModuleGetFunction(&f, m, "k") || cuStreamCreate(&s, 0)) { printf("error=init\n"); return 1; }
    int counter = 0, status = -1;
    unsigned long long id = 0;
    CUgraph seen = 0;
    int begin = cuStreamBeginCapture_v2(s, 0);
    cuStreamGetCaptureInfo_v2(s, &status, &id, &seen, 0, 0);
    int launch = cuLaunchKernel(f, 8, 1, 1, 128, 1, 1, 0, s, 0, 0);
    int host = cuLaunchHostFunc(s, count, &counter);
    int during = counter;
    int end = cuStreamEndCapture(s, &g);
    size_t nodes = 0;
    cuGraphGetNodes(g, 0, &nodes);
    printf("begin=%d status=%d id_set=%d graph_seen=%d launch=%d host=%d ran_during_capture=%d end=%d nodes=%zu ", begin, status,
           id != 0, seen == g, launch, host, during, end, nodes);
    int inst = cuGraphInstantiateWithFlags(&e, g, 0);
    int l1 = cuGraphLaunch(e, s), l2 = cuGraphLaunch(e, s), l3 = cuGraphLaunch(e, 0);
    cuCtxSynchronize();
    printf("instantiate=%d launches=%d,%d,%d counter=%d ", inst, l1, l2, l3, counter);
    struct { void (*fn)(void *); void *data; } params = { count, &counter };
    CUgraphNode n;
    cuGraphCreate(&g2, 0);
    int add = cuGraphAddHostNode(&n, g2, 0, 0, &params);
    cuGraphInstantiateWithFlags(&e2, g2, 0);
    cuGraphLaunch(e2, s);
    printf("explicit_add=%d counter_after=%d ", add, counter);
    int d1 = cuGraphExecDestroy(e), d2 = cuGraphDestroy(g);
    printf("destroy=%d,%d relaunch_destroyed=%d\n", d1, d2, cuGraphLaunch(e, s));
    return 0;
}
