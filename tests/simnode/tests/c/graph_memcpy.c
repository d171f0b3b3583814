/* Memcpy nodes: a graph built by hand copying host to device, device to device and back (as
 * the CUDA sample simpleCudaGraphs builds one), a node's parameters read back and changed in
 * the executable graph, the generic node form, and copies captured from a stream, which run
 * at each launch and not at capture; a clone of the graph, changed apart from it, and a
 * graph with memory nodes, which is not cloned. Prints key=value pairs on one line. */
#include <stdio.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUstream, *CUgraph, *CUgraphExec, *CUgraphNode, *CUarray;
typedef struct {
    size_t srcXInBytes, srcY, srcZ, srcLOD;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    CUarray srcArray;
    void *reserved0;
    size_t srcPitch, srcHeight;
    size_t dstXInBytes, dstY, dstZ, dstLOD;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    CUarray dstArray;
    void *reserved1;
    size_t dstPitch, dstHeight;
    size_t WidthInBytes, Height, Depth;
} CUDA_MEMCPY3D;
typedef struct {
    int type, reserved0[3];
    union {
        struct { int flags, reserved; CUcontext copyCtx; CUDA_MEMCPY3D copyParams; } memcpy;
        long long pad[29];
    };
    long long reserved2;
} CUgraphNodeParams;

CUresult cuInit(unsigned);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, int);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuStreamSynchronize(CUstream);
CUresult cuStreamBeginCapture_v2(CUstream, int);
CUresult cuStreamEndCapture(CUstream, CUgraph *);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr, const void *, size_t, CUstream);
CUresult cuMemcpyDtoHAsync_v2(void *, CUdeviceptr, size_t, CUstream);
CUresult cuGraphCreate(CUgraph *, unsigned);
CUresult cuGraphAddMemcpyNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, const CUDA_MEMCPY3D *, CUcontext);
CUresult cuGraphMemcpyNodeGetParams(CUgraphNode, CUDA_MEMCPY3D *);
CUresult cuGraphAddNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraphNodeParams *);
CUresult cuGraphNodeGetType(CUgraphNode, int *);
CUresult cuGraphGetNodes(CUgraph, CUgraphNode *, size_t *);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
CUresult cuGraphExecMemcpyNodeSetParams(CUgraphExec, CUgraphNode, const CUDA_MEMCPY3D *, CUcontext);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuGraphClone(CUgraph *, CUgraph);
CUresult cuGraphNodeFindInClone(CUgraphNode *, CUgraphNode, CUgraph);
CUresult cuGraphMemcpyNodeSetParams(CUgraphNode, const CUDA_MEMCPY3D *);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);

enum { HOST = 1, DEVICE = 2, MEMCPY_NODE = 1, N = 4096 };

static CUDA_MEMCPY3D linear(int dst_type, void *dst_host, CUdeviceptr dst,
                            int src_type, const void *src_host, CUdeviceptr src) {
    CUDA_MEMCPY3D c;
    memset(&c, 0, sizeof c);
    c.dstMemoryType = dst_type; c.dstHost = dst_host; c.dstDevice = dst;
    c.srcMemoryType = src_type; c.srcHost = src_host; c.srcDevice = src;
    c.WidthInBytes = N; c.Height = 1; c.Depth = 1;
    return c;
}

static unsigned char in[N], out[N], out2[N], out3[N], through_graph_memory[N], generic_out[N], captured_in[N], captured_out[N];

int main(void) {
    CUcontext ctx; CUstream s; CUdeviceptr a, b;
    if (cuInit(0) || cuCtxCreate_v2(&ctx, 0, 0) || cuStreamCreate(&s, 0) || cuMemAlloc_v2(&a, N)
        || cuMemAlloc_v2(&b, N)) { printf("error=init\n"); return 1; }
    memset(in, 7, N);
    CUgraph g; CUgraphNode up, across, down, generic, nodes[4];
    cuGraphCreate(&g, 0);
    CUDA_MEMCPY3D c = linear(DEVICE, 0, a, HOST, in, 0);
    int r = cuGraphAddMemcpyNode(&up, g, 0, 0, &c, ctx);
    printf("add=%d ", r);
    c = linear(DEVICE, 0, b, DEVICE, 0, a);
    cuGraphAddMemcpyNode(&across, g, &up, 1, &c, ctx);
    c = linear(HOST, out, 0, DEVICE, 0, b);
    cuGraphAddMemcpyNode(&down, g, &across, 1, &c, ctx);
    printf("no_params=%d ", cuGraphAddMemcpyNode(&generic, g, 0, 0, 0, ctx));
    c.WidthInBytes = 0;
    printf("no_width=%d ", cuGraphAddMemcpyNode(&generic, g, 0, 0, &c, ctx));
    CUgraphNodeParams p;
    memset(&p, 0, sizeof p);
    p.type = MEMCPY_NODE;
    p.memcpy.copyCtx = ctx;
    p.memcpy.copyParams = linear(HOST, generic_out, 0, DEVICE, 0, b);
    r = cuGraphAddNode(&generic, g, &down, 1, &p);
    printf("generic=%d ", r);
    int type = -1;
    cuGraphNodeGetType(down, &type);
    CUDA_MEMCPY3D back;
    memset(&back, 0, sizeof back);
    cuGraphMemcpyNodeGetParams(down, &back);
    printf("type=%d params_back=%d ", type, back.dstHost == out && back.WidthInBytes == N);
    size_t count = 4;
    cuGraphGetNodes(g, nodes, &count);
    CUgraphExec e;
    r = cuGraphInstantiateWithFlags(&e, g, 0);
    printf("nodes=%zu instantiate=%d before_launch=%d ", count, r, out[0]);
    r = cuGraphLaunch(e, s);
    cuStreamSynchronize(s);
    printf("launch=%d copied=%d,%d ", r, out[0] == 7 && out[N - 1] == 7, generic_out[N - 1] == 7);
    c = linear(HOST, out2, 0, DEVICE, 0, b);
    r = cuGraphExecMemcpyNodeSetParams(e, down, &c, ctx);
    memset(in, 9, N);
    cuGraphLaunch(e, s);
    cuStreamSynchronize(s);
    printf("exec_set=%d relaunch=%d,%d ", r, out2[0] == 9, out[0] == 7);

    memset(captured_in, 5, N);
    CUgraph cg; CUgraphExec ce;
    cuStreamBeginCapture_v2(s, 0);
    int h = cuMemcpyHtoDAsync_v2(a, captured_in, N, s);
    int d = cuMemcpyDtoHAsync_v2(captured_out, a, N, s);
    cuStreamEndCapture(s, &cg);
    count = 4;
    cuGraphGetNodes(cg, nodes, &count);
    type = -1;
    cuGraphNodeGetType(nodes[0], &type);
    printf("captured=%d,%d captured_nodes=%zu captured_type=%d at_capture=%d ", h, d, count, type,
           captured_out[0]);
    cuGraphInstantiateWithFlags(&ce, cg, 0);
    cuGraphLaunch(ce, s);
    cuStreamSynchronize(s);
    printf("replayed=%d ", captured_out[0] == 5 && captured_out[N - 1] == 5);

    CUgraph clone; CUgraphNode cloned_down = 0, elsewhere = 0; CUgraphExec ee;
    r = cuGraphClone(&clone, g);
    printf("clone=%d ", r);
    r = cuGraphNodeFindInClone(&cloned_down, down, clone);
    printf("found=%d,%d ", r, cloned_down != 0 && cloned_down != down);
    printf("not_a_clone=%d ", cuGraphNodeFindInClone(&elsewhere, down, cg));
    c = linear(HOST, out3, 0, DEVICE, 0, b);
    cuGraphMemcpyNodeSetParams(cloned_down, &c);
    memset(&back, 0, sizeof back);
    cuGraphMemcpyNodeGetParams(down, &back);
    printf("original_kept=%d ", back.dstHost == out);
    memset(in, 3, N);
    cuGraphInstantiateWithFlags(&ee, clone, 0);
    cuGraphLaunch(ee, s);
    cuStreamSynchronize(s);
    printf("clone_ran=%d,%d ", out3[0] == 3, out[0] == 7);

    CUgraph with_memory, refused = 0; CUdeviceptr scratch = 0;
    cuStreamBeginCapture_v2(s, 0);
    cuMemAllocAsync(&scratch, N, s);
    cuMemcpyHtoDAsync_v2(scratch, captured_in, N, s);
    cuMemcpyDtoHAsync_v2(through_graph_memory, scratch, N, s);
    cuMemFreeAsync(scratch, s);
    cuStreamEndCapture(s, &with_memory);
    printf("memory_nodes_clone=%d ", cuGraphClone(&refused, with_memory));
    CUgraphExec me;
    cuGraphInstantiateWithFlags(&me, with_memory, 0);
    r = cuGraphLaunch(me, s);
    cuStreamSynchronize(s);
    printf("through_graph_memory=%d,%d\n", r, through_graph_memory[N - 1] == 5);
    return 0;
}
