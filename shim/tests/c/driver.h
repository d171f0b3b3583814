/* The driver calls the launching test programs make (spin.c, churn.c, lifecycle.c, and the
 * graph calls of wall.c), declared as cuda.h declares them, with the types they need. */
#ifndef GPUSLICE_TEST_DRIVER_H
#define GPUSLICE_TEST_DRIVER_H

#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUgraph, *CUgraphExec, *CUgraphNode;

typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ;
    unsigned blockDimX, blockDimY, blockDimZ;
    unsigned sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned numAttrs;
} CUlaunchConfig;

typedef struct {
    CUfunction function;
    unsigned gridDimX, gridDimY, gridDimZ;
    unsigned blockDimX, blockDimY, blockDimZ;
    unsigned sharedMemBytes;
    CUstream hStream;
    void **kernelParams;
} CUDA_LAUNCH_PARAMS;

typedef struct {
    CUfunction func;
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ;
    unsigned sharedMemBytes;
    void **kernelParams, **extra;
    void *kern;
    CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS_v2;
typedef struct {
    CUdeviceptr dst;
    size_t pitch;
    unsigned int value, elementSize;
    size_t width, height;
} CUDA_MEMSET_NODE_PARAMS;

/* CUgraphNodeParams (CUDA 12.2): the node's type, then its own parameters at byte 16. */
enum { CU_GRAPH_NODE_TYPE_KERNEL = 0, CU_GRAPH_NODE_TYPE_GRAPH = 4, CU_GRAPH_NODE_TYPE_CONDITIONAL = 13 };
enum { CU_GRAPH_COND_TYPE_IF = 0, CU_GRAPH_COND_TYPE_WHILE = 1 };
typedef struct {
    int type;
    int reserved0[3];
    union {
        long long reserved1[29];
        CUDA_KERNEL_NODE_PARAMS_v2 kernel;
        struct { CUgraph graph; } graph;
        struct {
            unsigned long long handle;
            int type;
            unsigned size;
            CUgraph *phGraph_out;
            CUcontext ctx;
        } conditional;
    };
    long long reserved2;
} CUgraphNodeParams;

/* CUlaunchAttributeValue: a union of 64 bytes; CUDA 12.4's device-updatable kernel node flag
 * (attribute 13) and the device handle the driver gives back. */
enum { CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE = 13 };
typedef union {
    struct { int deviceUpdatable; void *devNode; } deviceUpdatableKernelNode;
    char pad[64];
} CUlaunchAttributeValue;

CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuDevicePrimaryCtxReset_v2(CUdevice);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemsetD32Async(CUdeviceptr, unsigned int, size_t, CUstream);
CUresult cuMemsetD2D8_v2(CUdeviceptr, size_t, unsigned char, size_t, size_t);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);
CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchCooperativeKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   unsigned, unsigned, CUstream, void **);
CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *, unsigned, unsigned);
CUresult cuFuncSetBlockShape(CUfunction, int, int, int);
CUresult cuLaunchGridAsync(CUfunction, int, int, CUstream);
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuStreamBeginCapture_v2(CUstream, int);
CUresult cuStreamEndCapture(CUstream, CUgraph *);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuGraphCreate(CUgraph *, unsigned);
CUresult cuGraphDestroy(CUgraph);
CUresult cuGraphExecDestroy(CUgraphExec);
CUresult cuGraphAddMemsetNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                              const CUDA_MEMSET_NODE_PARAMS *, CUcontext);
CUresult cuGraphAddKernelNode_v2(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                                 const CUDA_KERNEL_NODE_PARAMS_v2 *);
CUresult cuGraphAddChildGraphNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraph);
CUresult cuGraphAddNode_v2(CUgraphNode *, CUgraph, const CUgraphNode *, const void *, size_t,
                           CUgraphNodeParams *);
CUresult cuGraphConditionalHandleCreate(unsigned long long *, CUgraph, CUcontext, unsigned,
                                        unsigned);
CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec, CUgraphNode,
                                           const CUDA_KERNEL_NODE_PARAMS_v2 *);
CUresult cuGraphExecChildGraphNodeSetParams(CUgraphExec, CUgraphNode, CUgraph);
CUresult cuGraphKernelNodeSetAttribute(CUgraphNode, int, const CUlaunchAttributeValue *);
typedef struct {
    unsigned long long flags;
    CUstream hUploadStream;
    CUgraphNode hErrNode_out;
    int result_out;
} CUDA_GRAPH_INSTANTIATE_PARAMS;
CUresult cuGraphInstantiateWithParams(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *);
CUresult cuGraphExecNodeSetParams(CUgraphExec, CUgraphNode, CUgraphNodeParams *);

#endif
