/* Work captured on two streams: a second stream joins a capture by waiting on an event
 * recorded in it (a fork), the first waits on the second's event (a join), and the graph
 * holds both streams' work with the edges between them, as PyTorch's and CUTLASS's
 * multi-stream captures make; a fork never joined back refuses the capture's end. Prints
 * key=value pairs on one line. */
#include <stdio.h>

typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUevent, *CUgraph, *CUgraphNode;
int cuInit(unsigned);
int cuCtxCreate_v2(CUcontext *, unsigned, int);
int cuModuleLoadData(CUmodule *, const void *);
int cuModuleGetFunction(CUfunction *, CUmodule, const char *);
int cuStreamCreate(CUstream *, unsigned);
int cuEventCreate(CUevent *, unsigned);
int cuEventRecord(CUevent, CUstream);
int cuStreamWaitEvent(CUstream, CUevent, unsigned);
int cuStreamBeginCapture_v2(CUstream, int);
int cuStreamEndCapture(CUstream, CUgraph *);
int cuStreamIsCapturing(CUstream, int *);
int cuStreamGetCaptureInfo_v2(CUstream, int *, unsigned long long *, CUgraph *, const CUgraphNode **, size_t *);
int cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
int cuGraphGetNodes(CUgraph, CUgraphNode *, size_t *);
int cuGraphGetEdges(CUgraph, CUgraphNode *, CUgraphNode *, size_t *);

static int launch(CUfunction f, CUstream s) { return cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, 0, 0); }

int main(void) {
    CUcontext ctx; CUmodule m; CUfunction f; CUstream s1, s2, s3; CUevent forked, joined;
    static const char image[] = "//\n.version 7.0\n.target sm_86\n.entry k() { ret; }\n";
    if (cuInit(0) || cuCtxCreate_v2(&ctx, 0, 0) || cuModuleLoadData(&m, image)
        || cuModuleGetFunction(&f, m, "k") || cuStreamCreate(&s1, 1) || cuStreamCreate(&s2, 1)
        || cuStreamCreate(&s3, 1) || cuEventCreate(&forked, 2) || cuEventCreate(&joined, 2)) {
        printf("error=init\n");
        return 1;
    }
    cuStreamBeginCapture_v2(s1, 2);
    launch(f, s1);
    int r = cuEventRecord(forked, s1);
    printf("record=%d ", r);
    r = cuStreamWaitEvent(s2, forked, 0);
    int capturing = -1;
    cuStreamIsCapturing(s2, &capturing);
    unsigned long long id1 = 0, id2 = 0;
    int status = 0;
    cuStreamGetCaptureInfo_v2(s1, &status, &id1, 0, 0, 0);
    cuStreamGetCaptureInfo_v2(s2, &status, &id2, 0, 0, 0);
    printf("fork=%d joined_capturing=%d same_capture=%d ", r, capturing, id1 == id2 && id1 != 0);
    printf("forked_launch=%d ", launch(f, s2));
    CUgraph wrong = 0;
    printf("end_from_joined=%d ", cuStreamEndCapture(s2, &wrong));
    cuStreamBeginCapture_v2(s3, 2);
    printf("other_capture_waits=%d ", cuStreamWaitEvent(s3, forked, 0));
    CUgraph other;
    cuStreamEndCapture(s3, &other);
    cuEventRecord(joined, s2);
    printf("join=%d ", cuStreamWaitEvent(s1, joined, 0));
    launch(f, s1);
    CUgraph g = 0;
    r = cuStreamEndCapture(s1, &g);
    capturing = -1;
    cuStreamIsCapturing(s2, &capturing);
    size_t nodes = 0, edges = 0;
    cuGraphGetNodes(g, 0, &nodes);
    cuGraphGetEdges(g, 0, 0, &edges);
    printf("end=%d joined_after=%d nodes=%zu edges=%zu ", r, capturing, nodes, edges);
    /* Outside a capture, the event is an ordinary one again. */
    cuEventRecord(forked, s1);
    r = cuStreamWaitEvent(s2, forked, 0);
    capturing = -1;
    cuStreamIsCapturing(s2, &capturing);
    printf("plain_wait=%d,%d ", r, capturing);
    /* A fork whose work is never joined back: the end is refused, no graph given, and the
     * capture ends on both streams. */
    cuStreamBeginCapture_v2(s1, 2);
    launch(f, s1);
    cuEventRecord(forked, s1);
    cuStreamWaitEvent(s2, forked, 0);
    launch(f, s2);
    launch(f, s1);
    CUgraph unjoined = 0;
    r = cuStreamEndCapture(s1, &unjoined);
    int capturing1 = -1, capturing2 = -1;
    cuStreamIsCapturing(s1, &capturing1);
    cuStreamIsCapturing(s2, &capturing2);
    printf("unjoined_end=%d graph=%d capturing=%d,%d ", r, unjoined != 0, capturing1, capturing2);
    printf("launch_after=%d\n", launch(f, s2));
    return 0;
}
