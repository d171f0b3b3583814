/* Graph memory in a slice: captured and explicit allocation nodes, launches that fit and one
 * that does not, frees inside and outside graphs, the graph pool and its trim, frees on
 * launch, uploads, and a captured free of stream-ordered memory. Prints, as key=value pairs,
 * each call's CUresult and the MiB the slice has free (cuMemGetInfo) after each step, and the
 * driver's own graph pool figures ("drv_*", MiB). */
#include <stdio.h>
#include <string.h>

typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUstream, *CUgraph, *CUgraphExec, *CUgraphNode;
int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(CUcontext *, int);
int cuCtxSetCurrent(CUcontext);
int cuMemGetInfo_v2(size_t *, size_t *);
int cuMemAlloc_v2(CUdeviceptr *, size_t);
int cuMemFree_v2(CUdeviceptr);
int cuStreamCreate(CUstream *, unsigned);
int cuStreamBeginCapture_v2(CUstream, int);
int cuStreamEndCapture(CUstream, CUgraph *);
int cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
int cuMemFreeAsync(CUdeviceptr, CUstream);
int cuGraphCreate(CUgraph *, unsigned);
int cuGraphAddMemAllocNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, void *);
int cuGraphAddMemFreeNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUdeviceptr);
int cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
int cuGraphLaunch(CUgraphExec, CUstream);
int cuGraphUpload(CUgraphExec, CUstream);
int cuGraphExecDestroy(CUgraphExec);
int cuDeviceGraphMemTrim(int);
int cuDeviceGetGraphMemAttribute(int, int, void *);
int cuGraphExecUpdate_v2(CUgraphExec, CUgraph, void *);

static size_t free_mib(void) { size_t f = 0, t = 0; cuMemGetInfo_v2(&f, &t); return f >> 20; }
static unsigned long long drv_reserved(void) { unsigned long long v = 0; cuDeviceGetGraphMemAttribute(0, 2, &v); return v >> 20; }

/* An explicit graph with one allocation node of `mib` MiB, and its free node if `freed`. */
static int explicit_graph(CUgraph *g, size_t mib, int freed, CUdeviceptr *addr) {
    unsigned char params[120];
    memset(params, 0, sizeof params);
    *(int *)(params + 8) = 1;  /* location: a device */
    *(int *)(params + 12) = 0; /* device 0 */
    *(size_t *)(params + 104) = mib << 20;
    CUgraphNode n, f;
    int r = cuGraphCreate(g, 0);
    if (!r) r = cuGraphAddMemAllocNode(&n, *g, 0, 0, params);
    *addr = *(CUdeviceptr *)(params + 112);
    if (!r && freed) r = cuGraphAddMemFreeNode(&f, *g, &n, 1, *addr);
    return r;
}

int main(void) {
    CUcontext ctx; CUstream s;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) || cuStreamCreate(&s, 0)) {
        printf("error=init\n"); return 1;
    }
    printf("start=%zu ", free_mib());
    /* Captured: recorded, not taken. */
    CUgraph g1; CUgraphExec e1; CUdeviceptr p = 0;
    cuStreamBeginCapture_v2(s, 0);
    int a = cuMemAllocAsync(&p, 200u << 20, s);
    cuStreamEndCapture(s, &g1);
    printf("captured=%d after_capture=%zu ", a, free_mib());
    cuGraphInstantiateWithFlags(&e1, g1, 0);
    int l1 = cuGraphLaunch(e1, s);
    printf("launch=%d after_launch=%zu drv_after_launch=%llu ", l1, free_mib(), drv_reserved());
    int l2 = cuGraphLaunch(e1, s);
    printf("relaunch_held=%d after_relaunch=%zu ", l2, free_mib());
    /* Freed: back in the pool, still held from the slice. */
    int f1 = cuMemFree_v2(p);
    printf("free=%d after_free=%zu ", f1, free_mib());
    CUdeviceptr big = 0, fits = 0;
    int ab = cuMemAlloc_v2(&big, 400u << 20);
    int af = cuMemAlloc_v2(&fits, 300u << 20);
    printf("alloc_over_pool=%d alloc_beside_pool=%d ", ab, af);
    cuMemFree_v2(fits);
    /* More than the slice: refused before the driver runs it. */
    CUgraph g2; CUgraphExec e2; CUdeviceptr q = 0;
    explicit_graph(&g2, 600, 0, &q);
    cuGraphInstantiateWithFlags(&e2, g2, 0);
    int l3 = cuGraphLaunch(e2, s);
    int u3 = cuGraphUpload(e2, s);
    printf("too_big=%d upload_too_big=%d after_too_big=%zu drv_after_too_big=%llu ", l3, u3,
           free_mib(), drv_reserved());
    /* Allocated and freed inside one graph: the pool grows to 300 MiB and keeps it. */
    CUgraph g3; CUgraphExec e3; CUdeviceptr r3 = 0;
    explicit_graph(&g3, 300, 1, &r3);
    cuGraphInstantiateWithFlags(&e3, g3, 0);
    int l4 = cuGraphLaunch(e3, s);
    printf("inside=%d after_inside=%zu ", l4, free_mib());
    int l5 = cuGraphLaunch(e3, s);
    printf("inside_again=%d after_inside_again=%zu ", l5, free_mib());
    /* Trim: the pool's unused part goes back. */
    int t = cuDeviceGraphMemTrim(0);
    printf("trim=%d after_trim=%zu drv_after_trim=%llu ", t, free_mib(), drv_reserved());
    /* Freed on each launch. */
    CUgraph g4; CUgraphExec e4; CUdeviceptr r4 = 0;
    cuStreamBeginCapture_v2(s, 0);
    cuMemAllocAsync(&r4, 100u << 20, s);
    cuStreamEndCapture(s, &g4);
    cuGraphInstantiateWithFlags(&e4, g4, 1);
    int a1 = cuGraphLaunch(e4, s), a2 = cuGraphLaunch(e4, s), a3 = cuGraphLaunch(e4, s);
    printf("auto_free=%d,%d,%d after_auto_free=%zu ", a1, a2, a3, free_mib());
    cuMemFree_v2(r4);
    cuDeviceGraphMemTrim(0);
    /* Stream-ordered memory freed by a captured free: held until the graph runs. */
    CUgraph g5; CUgraphExec e5; CUdeviceptr m = 0;
    cuMemAllocAsync(&m, 100u << 20, s);
    size_t with_m = free_mib();
    cuStreamBeginCapture_v2(s, 0);
    int cf = cuMemFreeAsync(m, s);
    cuStreamEndCapture(s, &g5);
    size_t captured_free = free_mib();
    cuGraphInstantiateWithFlags(&e5, g5, 0);
    int l6 = cuGraphLaunch(e5, s);
    printf("with_m=%zu captured_free=%d after_captured_free=%zu freed_by_graph=%d end=%zu ",
           with_m, cf, captured_free, l6, free_mib());
    /* An executable graph updated from a graph that allocates more: its launches take the
     * new graph's memory. */
    CUgraph small, large; CUgraphExec eu; CUdeviceptr s1 = 0, s2 = 0;
    explicit_graph(&small, 100, 1, &s1);
    explicit_graph(&large, 300, 1, &s2);
    cuGraphInstantiateWithFlags(&eu, small, 0);
    struct { int result; void *node, *from; } info = {-1, 0, 0};
    int up = cuGraphExecUpdate_v2(eu, large, &info);
    int l7 = cuGraphLaunch(eu, s);
    printf("update=%d,%d updated_launch=%d after_update=%zu drv_after_update=%llu\n", up,
           info.result, l7, free_mib(), drv_reserved());
    return 0;
}
