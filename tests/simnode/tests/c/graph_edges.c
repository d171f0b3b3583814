/* A graph's dependency edges, a capture's dependency set, capturing into an existing graph,
 * user objects and the DOT file, on the simulated driver. Prints key=value pairs. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUgraph, *CUgraphExec, *CUgraphNode,
    *CUuserObject;
typedef struct { unsigned char from_port, to_port, type, reserved[5]; } CUgraphEdgeData;
int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(CUcontext *, int);
int cuCtxSetCurrent(CUcontext);
int cuStreamCreate(CUstream *, unsigned);
int cuGraphCreate(CUgraph *, unsigned);
int cuGraphDestroy(CUgraph);
int cuGraphAddEmptyNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t);
int cuGraphAddHostNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, const void *);
int cuGraphAddDependencies(CUgraph, const CUgraphNode *, const CUgraphNode *, size_t);
int cuGraphRemoveDependencies(CUgraph, const CUgraphNode *, const CUgraphNode *, size_t);
int cuGraphGetEdges(CUgraph, CUgraphNode *, CUgraphNode *, size_t *);
int cuGraphGetEdges_v2(CUgraph, CUgraphNode *, CUgraphNode *, CUgraphEdgeData *, size_t *);
int cuGraphNodeGetDependencies(CUgraphNode, CUgraphNode *, size_t *);
int cuGraphNodeGetDependentNodes(CUgraphNode, CUgraphNode *, size_t *);
int cuGraphGetNodes(CUgraph, CUgraphNode *, size_t *);
int cuStreamBeginCapture_v2(CUstream, int);
int cuStreamBeginCaptureToGraph(CUstream, CUgraph, const CUgraphNode *, const CUgraphEdgeData *, size_t, int);
int cuStreamEndCapture(CUstream, CUgraph *);
int cuStreamGetCaptureInfo_v2(CUstream, int *, unsigned long long *, CUgraph *, const CUgraphNode **, size_t *);
int cuStreamUpdateCaptureDependencies(CUstream, CUgraphNode *, size_t, unsigned);
int cuLaunchHostFunc(CUstream, void (*)(void *), void *);
int cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
int cuGraphExecDestroy(CUgraphExec);
int cuUserObjectCreate(CUuserObject *, void *, void (*)(void *), unsigned, unsigned);
int cuUserObjectRelease(CUuserObject, unsigned);
int cuGraphRetainUserObject(CUgraph, CUuserObject, unsigned, unsigned);
int cuGraphReleaseUserObject(CUgraph, CUuserObject, unsigned);
int cuGraphDebugDotPrint(CUgraph, const char *, unsigned);

static void nothing(void *p) { (void)p; }
static volatile int destroyed = 0;
static void destroy(void *p) { destroyed = *(int *)p; }

/* Waits up to a second for the destructor, which runs on a thread of the driver's. */
static int destroyed_soon(void) {
    for (int i = 0; i < 100 && !destroyed; i++) usleep(10000);
    return destroyed;
}

int main(void) {
    CUcontext ctx; CUstream s; CUgraph g;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) || cuStreamCreate(&s, 0)
        || cuGraphCreate(&g, 0)) { printf("error=init\n"); return 1; }

    /* Edges made with nodes, added, read back and removed. */
    CUgraphNode a, b, c, other;
    cuGraphAddEmptyNode(&a, g, 0, 0);
    cuGraphAddEmptyNode(&b, g, &a, 1);
    CUgraphNode ab[2] = {a, b};
    cuGraphAddEmptyNode(&c, g, ab, 2);
    size_t n = 0;
    cuGraphGetEdges(g, 0, 0, &n);
    printf("edges=%zu ", n);
    CUgraphNode from[4], to[4];
    n = 4;
    cuGraphGetEdges(g, from, to, &n);
    printf("read=%zu first=%d rest_null=%d ", n, from[0] == a && to[0] == b, from[3] == 0 && to[3] == 0);
    CUgraphNode deps[2] = {0};
    n = 2;
    cuGraphNodeGetDependencies(c, deps, &n);
    printf("deps_of_c=%zu,%d ", n, deps[0] == a && deps[1] == b);
    n = 0;
    cuGraphNodeGetDependentNodes(a, 0, &n);
    printf("dependents_of_a=%zu ", n);
    printf("add_existing=%d ", cuGraphAddDependencies(g, &a, &b, 1));
    printf("add_self=%d ", cuGraphAddDependencies(g, &a, &a, 1));
    CUgraph g2; cuGraphCreate(&g2, 0); cuGraphAddEmptyNode(&other, g2, 0, 0);
    printf("add_foreign=%d ", cuGraphAddDependencies(g, &a, &other, 1));
    printf("node_foreign_dep=%d ", cuGraphAddEmptyNode(&other, g, &other, 1));
    printf("remove=%d ", cuGraphRemoveDependencies(g, &a, &c, 1));
    printf("remove_again=%d ", cuGraphRemoveDependencies(g, &a, &c, 1));
    n = 0;
    cuGraphGetEdges(g, 0, 0, &n);
    printf("edges_after=%zu ", n);
    CUgraphEdgeData data[4];
    memset(data, 7, sizeof data);
    n = 4;
    cuGraphGetEdges_v2(g, from, to, data, &n);
    printf("edge_data_zero=%d\n", data[0].type == 0 && data[1].from_port == 0);

    /* Capture: each captured node depends on the last; the set can be replaced. */
    int status = 0;
    const CUgraphNode *set = 0;
    size_t count = 9;
    cuStreamBeginCapture_v2(s, 0);
    cuStreamGetCaptureInfo_v2(s, &status, 0, 0, &set, &count);
    printf("capture_start_deps=%zu ", count);
    cuLaunchHostFunc(s, nothing, 0);
    cuLaunchHostFunc(s, nothing, 0);
    CUgraph cg = 0;
    cuStreamGetCaptureInfo_v2(s, &status, 0, &cg, &set, &count);
    CUgraphNode last = count ? set[0] : 0;
    printf("capture_deps=%zu ", count);
    CUgraphNode mine;
    cuGraphAddEmptyNode(&mine, cg, &last, 1);
    printf("update_set=%d ", cuStreamUpdateCaptureDependencies(s, &mine, 1, 1));
    cuStreamGetCaptureInfo_v2(s, &status, 0, 0, &set, &count);
    printf("set_now=%zu,%d ", count, count == 1 && set[0] == mine);
    printf("update_add=%d ", cuStreamUpdateCaptureDependencies(s, &last, 1, 0));
    cuStreamGetCaptureInfo_v2(s, &status, 0, 0, &set, &count);
    printf("added_now=%zu ", count);
    printf("update_flags=%d ", cuStreamUpdateCaptureDependencies(s, &last, 1, 2));
    printf("update_foreign=%d ", cuStreamUpdateCaptureDependencies(s, &a, 1, 0));
    cuLaunchHostFunc(s, nothing, 0);
    CUgraph captured;
    cuStreamEndCapture(s, &captured);
    n = 0;
    cuGraphGetEdges(captured, 0, 0, &n);
    printf("captured_edges=%zu ", n);
    printf("update_not_capturing=%d\n", cuStreamUpdateCaptureDependencies(s, &last, 1, 0));

    /* Capturing into an existing graph after one of its nodes; the end answers that graph. */
    CUgraph into; CUgraphNode root;
    cuGraphCreate(&into, 0);
    cuGraphAddEmptyNode(&root, into, 0, 0);
    printf("to_graph=%d ", cuStreamBeginCaptureToGraph(s, into, &root, 0, 1, 0));
    cuLaunchHostFunc(s, nothing, 0);
    CUgraph ended = 0;
    cuStreamEndCapture(s, &ended);
    n = 0;
    cuGraphGetNodes(into, 0, &n);
    size_t e = 0;
    cuGraphGetEdges(into, 0, 0, &e);
    printf("same_graph=%d nodes=%zu edges=%zu\n", ended == into, n, e);

    /* User objects: the destructor runs once the program, the graph and an executable graph
     * made from it have all let go. */
    int value = 42;
    CUuserObject obj;
    printf("create=%d ", cuUserObjectCreate(&obj, &value, destroy, 1, 1));
    printf("create_no_flag=%d ", cuUserObjectCreate(&obj, &value, destroy, 1, 0));
    printf("retain=%d ", cuGraphRetainUserObject(g, obj, 1, 0));
    CUgraphExec exec;
    cuGraphInstantiateWithFlags(&exec, g, 0);
    cuUserObjectRelease(obj, 1);
    printf("release_too_many=%d ", cuGraphReleaseUserObject(g, obj, 2));
    cuGraphDestroy(g);
    usleep(50000);
    printf("alive_with_exec=%d ", destroyed == 0);
    cuGraphExecDestroy(exec);
    printf("destroyed=%d ", destroyed_soon());

    /* The DOT file: a node per line, an edge per arrow. */
    printf("dot=%d ", cuGraphDebugDotPrint(into, "/proc/no/such/dir/g.dot", 0));
    char path[] = "/tmp/graph_edges_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    printf("dot_written=%d ", cuGraphDebugDotPrint(into, path, 0));
    FILE *f = fopen(path, "r");
    char line[256]; int arrows = 0, empties = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (strstr(line, "->")) arrows++;
        else if (strstr(line, "EMPTY")) empties++;
    }
    if (f) fclose(f);
    unlink(path);
    printf("dot_arrows=%d dot_empty=%d\n", arrows, empties);
    return 0;
}
