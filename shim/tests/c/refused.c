/* Calls, through dlopen("libcuda.so.1") and dlsym, each entry point whose memory the wall
 * cannot count, a stream-ordered allocation, and the legacy cuCtxCreate, and reads the device
 * attributes that tell of those features; gives a conditional node new parameters, in its
 * graph (cuGraphNodeSetParams) and in an executable graph (cuGraphExecNodeSetParams); prints
 * name=CUresult and attrN=value pairs on one line, then waits for stdin to close. */
#include <dlfcn.h>
#include <stdio.h>

#include "driver.h"

typedef CUresult (*fn)();

int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { printf("error=dlopen\n"); return 1; }
#define F(name) ((fn)dlsym(h, name))
    int dev = 0;
    void *ctx = 0, *out = 0;
    if (F("cuInit")(0) || F("cuDeviceGet")(&dev, 0) || F("cuDevicePrimaryCtxRetain")(&ctx, dev)
        || F("cuCtxSetCurrent")(ctx)) { printf("error=init\n"); return 1; }
    unsigned small = 0;
    printf("cuMemAlloc=%d ", F("cuMemAlloc")(&small, 1u << 20));
    printf("cuMemAllocPitch=%d ", F("cuMemAllocPitch")(&small, &small, 1024u, 1024u, 4u));
    printf("cuArrayCreate=%d ", F("cuArrayCreate")(&out, (void *)0));
    printf("cuArray3DCreate=%d ", F("cuArray3DCreate")(&out, (void *)0));
    printf("cuMemFree=%d ", F("cuMemFree")(small));
    printf("cuMemGetInfo=%d ", F("cuMemGetInfo")(&small, &small));
    printf("cuDeviceTotalMem=%d ", F("cuDeviceTotalMem")(&small, dev));
    printf("cuMemImportFromShareableHandle=%d ", F("cuMemImportFromShareableHandle")(&out, (void *)0, 1));
    printf("cuMemPoolImportFromShareableHandle=%d ", F("cuMemPoolImportFromShareableHandle")(&out, (void *)0, 1, 0ull));
    printf("cuMemPoolImportPointer=%d ", F("cuMemPoolImportPointer")(&out, (void *)0, (void *)0));
    printf("cuMemExportToShareableHandle=%d ", F("cuMemExportToShareableHandle")(&out, 1ull, 1, 0ull));
    printf("cuMemPoolExportToShareableHandle=%d ", F("cuMemPoolExportToShareableHandle")(&out, (void *)0, 1, 0ull));
    printf("cuMemPoolExportPointer=%d ", F("cuMemPoolExportPointer")(&out, 0ull));
    printf("cuMulticastCreate=%d ", F("cuMulticastCreate")(&out, (void *)0));
    /* A graph of one conditional `if` node, its body empty. */
    CUgraph graph = 0;
    CUgraphNode node = 0;
    CUgraphExec exec = 0;
    CUgraphNodeParams p = {0};
    p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
    p.conditional.type = CU_GRAPH_COND_TYPE_IF;
    p.conditional.size = 1;
    p.conditional.ctx = ctx;
    if (F("cuGraphCreate")(&graph, 0u) ||
        F("cuGraphConditionalHandleCreate")(&p.conditional.handle, graph, ctx, 1u, 1u) ||
        F("cuGraphAddNode")(&node, graph, (void *)0, (size_t)0, &p) ||
        F("cuGraphInstantiateWithFlags")(&exec, graph, 0ull)) {
        printf("error=conditional\n");
        return 1;
    }
    printf("cuGraphNodeSetParams=%d ", F("cuGraphNodeSetParams")(node, &p));
    printf("cuGraphExecNodeSetParams=%d ", F("cuGraphExecNodeSetParams")(exec, node, &p));
    int dmabuf = -1;
    printf("cuMemGetHandleForAddressRange=%d ",
           F("cuMemGetHandleForAddressRange")(&dmabuf, 0ull, (size_t)(2u << 20), 1, 0ull));
    /* Exported handle types (POSIX fd, Win32, Win32 KMT), a pool's handle types, dma-buf,
     * fabric handles, multicast. */
    static const int attrs[] = {103, 104, 105, 119, 124, 128, 132};
    for (unsigned i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
        int value = -1;
        int r = F("cuDeviceGetAttribute")(&value, attrs[i], dev);
        printf("attr%d=%d ", attrs[i], r ? -r : value);
    }
    void *stream = 0;
    unsigned long long dptr = 0;
    if (F("cuStreamCreate")(&stream, 0u)) { printf("error=stream\n"); return 1; }
    printf("cuMemAllocAsync.plain=%d ", F("cuMemAllocAsync")(&dptr, (size_t)(1u << 20), stream));
    void *legacy_ctx = 0;
    printf("cuCtxCreate=%d\n", F("cuCtxCreate")(&legacy_ctx, 0u, dev));
    fflush(stdout);
    char buf[16];
    while (fread(buf, 1, sizeof buf, stdin) > 0) {}
    return 0;
}
