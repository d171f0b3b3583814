/* Graph memory nodes on the simulated driver: memory taken from the device's graph pool at
 * launch, returned to the pool by a free node or cuMemFree and to the device by
 * cuDeviceGraphMemTrim; a graph relaunched while holding its allocation refused unless it
 * frees on launch; a captured free of stream-ordered memory frees it when the graph runs.
 * Prints the device's free memory (MiB) at each step as key=value pairs. */
#include <stdio.h>
#include <string.h>

typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUstream, *CUgraph, *CUgraphExec, *CUgraphNode;
int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(CUcontext *, int);
int cuCtxSetCurrent(CUcontext);
int cuMemGetInfo_v2(size_t *, size_t *);
int cuStreamCreate(CUstream *, unsigned);
int cuStreamBeginCapture_v2(CUstream, int);
int cuStreamEndCapture(CUstream, CUgraph *);
int cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
int cuMemFreeAsync(CUdeviceptr, CUstream);
int cuMemFree_v2(CUdeviceptr);
int cuGraphCreate(CUgraph *, unsigned);
int cuGraphAddMemAllocNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, void *);
int cuGraphAddMemFreeNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUdeviceptr);
int cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
int cuGraphLaunch(CUgraphExec, CUstream);
int cuDeviceGraphMemTrim(int);
int cuDeviceGetGraphMemAttribute(int, int, void *);
int cuGraphGetNodes(CUgraph, CUgraphNode *, size_t *);
int cuGraphNodeGetType(CUgraphNode, int *);
int cuGraphMemAllocNodeGetParams(CUgraphNode, void *);
int cuGraphMemFreeNodeGetParams(CUgraphNode, CUdeviceptr *);

static unsigned long long attr(int a) { unsigned long long v = 0; cuDeviceGetGraphMemAttribute(0, a, &v); return v >> 20; }

static size_t free_mib(void) { size_t f = 0, t = 0; cuMemGetInfo_v2(&f, &t); return f >> 20; }

int main(void) {
    CUcontext ctx; CUstream s; CUgraph g, g2; CUgraphExec e, e2; CUgraphNode n, n2;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) || cuStreamCreate(&s, 0)) {
        printf("error=init\n"); return 1;
    }
    printf("start=%zu ", free_mib());
    /* Captured: a stream-ordered allocation becomes a memory node. */
    CUdeviceptr p = 0;
    cuStreamBeginCapture_v2(s, 0);
    int a = cuMemAllocAsync(&p, 256u << 20, s);
    cuStreamEndCapture(s, &g);
    printf("captured=%d addr=%d after_capture=%zu ", a, p != 0, free_mib());
    cuGraphInstantiateWithFlags(&e, g, 0);
    int l1 = cuGraphLaunch(e, s);
    printf("launch=%d after_launch=%zu ", l1, free_mib());
    int l2 = cuGraphLaunch(e, s);
    printf("relaunch_held=%d ", l2);
    int f = cuMemFree_v2(p);
    size_t after_free = free_mib();
    int l4 = cuGraphLaunch(e, s);
    printf("free=%d after_free=%zu relaunch=%d ", f, after_free, l4);
    cuMemFreeAsync(p, s);
    /* Explicit: an allocation node and its free node; nothing held after a launch. */
    unsigned char params[120];
    memset(params, 0, sizeof params);
    *(int *)(params + 8) = 1;                           /* location: a device */
    *(int *)(params + 12) = 0;                          /* device 0 */
    *(size_t *)(params + 104) = (size_t)1 << 30;        /* 1 GiB */
    cuGraphCreate(&g2, 0);
    int add = cuGraphAddMemAllocNode(&n, g2, 0, 0, params);
    CUdeviceptr q = *(CUdeviceptr *)(params + 112);
    int addf = cuGraphAddMemFreeNode(&n2, g2, &n, 1, q);
    cuGraphInstantiateWithFlags(&e2, g2, 0);
    int l3 = cuGraphLaunch(e2, s);
    printf("explicit=%d,%d addr2=%d launch2=%d after_alloc_free=%zu ", add, addf, q != 0, l3, free_mib());
    /* More than the device: the launch fails with out of memory. */
    CUgraph g3; CUgraphExec e3; CUgraphNode n3;
    *(size_t *)(params + 104) = (size_t)64 << 30;
    cuGraphCreate(&g3, 0);
    cuGraphAddMemAllocNode(&n3, g3, 0, 0, params);
    cuGraphInstantiateWithFlags(&e3, g3, 0);
    int l5 = cuGraphLaunch(e3, s);
    printf("too_big=%d pool=%llu,%llu,%llu,%llu ", l5, attr(0), attr(1), attr(2), attr(3));
    /* What a node says about itself. */
    CUgraphNode nodes[4]; size_t count = 4; int t0 = -1, t1 = -1;
    cuGraphGetNodes(g2, nodes, &count);
    cuGraphNodeGetType(nodes[0], &t0);
    cuGraphNodeGetType(nodes[1], &t1);
    unsigned char got[120]; CUdeviceptr freed = 0;
    memset(got, 0xff, sizeof got);
    int gp = cuGraphMemAllocNodeGetParams(nodes[0], got);
    int fp = cuGraphMemFreeNodeGetParams(nodes[1], &freed);
    printf("nodes=%zu types=%d,%d params=%d,%d size=%zu same_addr=%d,%d location=%d,%d ",
           count, t0, t1, gp, fp, *(size_t *)(got + 104) >> 20, *(CUdeviceptr *)(got + 112) == q,
           freed == q, *(int *)(got + 8), *(int *)(got + 12));
    int trim = cuDeviceGraphMemTrim(0);
    printf("trim=%d after_trim=%zu ", trim, free_mib());
    /* Freed on each launch: relaunching while holding is allowed. */
    CUgraph g4; CUgraphExec e4; CUdeviceptr r = 0;
    cuStreamBeginCapture_v2(s, 0);
    cuMemAllocAsync(&r, 256u << 20, s);
    cuStreamEndCapture(s, &g4);
    cuGraphInstantiateWithFlags(&e4, g4, 1);
    int a1 = cuGraphLaunch(e4, s), a2 = cuGraphLaunch(e4, s);
    printf("auto_free=%d,%d held=%zu ", a1, a2, free_mib());
    /* A captured free of stream-ordered memory made outside the graph. */
    CUgraph g5; CUgraphExec e5; CUdeviceptr m = 0;
    cuMemAllocAsync(&m, 128u << 20, s);
    size_t with_m = free_mib();
    cuStreamBeginCapture_v2(s, 0);
    int cf = cuMemFreeAsync(m, s);
    cuStreamEndCapture(s, &g5);
    size_t after_captured_free = free_mib();
    cuGraphInstantiateWithFlags(&e5, g5, 0);
    int l6 = cuGraphLaunch(e5, s);
    printf("with_m=%zu captured_free=%d still=%zu freed_by_graph=%d end=%zu\n", with_m, cf,
           after_captured_free, l6, free_mib());
    return 0;
}
