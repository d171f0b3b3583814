"""Graphs with conditional nodes, made with NVIDIA's cuda-bindings (driver API, CUDA 12.3+).

Usage: conditional.py LOCAL_BYTES
Loads PTX of two kernels, `small` (no local memory) and `deep` (each thread a local array of
LOCAL_BYTES), and for each builds a graph whose one node is a conditional `if` node, its value
starting at 1, whose body holds one launch of the kernel (cuGraphConditionalHandleCreate,
cuGraphAddNode with CUgraphNodeParams, the body graph the driver wrote into phGraph_out, then
cuGraphAddKernelNode into it); instantiates, launches and synchronizes it. Then the same with
a `while` node around `small`. Prints key=value pairs on one line: if_small, if_deep and
while: the name of the first error met (CUDA_SUCCESS when none), prefixed "instantiate:"
where instantiating failed.
"""
import sys

from cuda.bindings import driver as cu


def check(result):
    err, *rest = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(err.name)
    return rest[0] if len(rest) == 1 else rest


def ptx(local_bytes):
    return (".version 7.0\n.target sm_50\n.address_size 64\n"
            ".visible .entry small()\n{\n ret;\n}\n"
            ".visible .entry deep()\n{\n"
            f" .local .align 16 .b8 __local_depot0[{local_bytes}];\n"
            " ret;\n}\n").encode() + b"\0"


def conditional_graph(ctx, kind, kernel):
    """A graph of one conditional node of `kind` whose body launches `kernel` once."""
    graph = check(cu.cuGraphCreate(0))
    params = cu.CUgraphNodeParams()
    params.type = cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
    # Set to 1 at each launch (CU_GRAPH_COND_ASSIGN_DEFAULT); nothing sets it to 0, so a
    # `while` body would loop until a kernel did: the simulated GPU runs it once.
    params.conditional.handle = check(cu.cuGraphConditionalHandleCreate(graph, ctx, 1, 1))
    params.conditional.type = kind
    params.conditional.size = 1
    params.conditional.ctx = ctx
    check(cu.cuGraphAddNode(graph, None, 0, params))
    body = params.conditional.phGraph_out[0]
    launch = cu.CUDA_KERNEL_NODE_PARAMS()
    launch.func = kernel
    launch.gridDimX = launch.gridDimY = launch.gridDimZ = 1
    launch.blockDimX = launch.blockDimY = launch.blockDimZ = 1
    check(cu.cuGraphAddKernelNode(body, None, 0, launch))
    return graph


def run(graph):
    err, exec_ = cu.cuGraphInstantiate(graph, 0)
    if err != cu.CUresult.CUDA_SUCCESS:
        return f"instantiate:{err.name}"
    err, = cu.cuGraphLaunch(exec_, 0)
    if err == cu.CUresult.CUDA_SUCCESS:
        err, = cu.cuCtxSynchronize()
    check(cu.cuGraphExecDestroy(exec_))
    return err.name


def main():
    local_bytes = int(sys.argv[1])
    check(cu.cuInit(0))
    dev = check(cu.cuDeviceGet(0))
    ctx = check(cu.cuDevicePrimaryCtxRetain(dev))
    check(cu.cuCtxSetCurrent(ctx))
    module = check(cu.cuModuleLoadData(ptx(local_bytes)))
    small = check(cu.cuModuleGetFunction(module, b"small"))
    deep = check(cu.cuModuleGetFunction(module, b"deep"))
    kinds = cu.CUgraphConditionalNodeType
    results = {
        "if_small": run(conditional_graph(ctx, kinds.CU_GRAPH_COND_TYPE_IF, small)),
        "if_deep": run(conditional_graph(ctx, kinds.CU_GRAPH_COND_TYPE_IF, deep)),
        "while": run(conditional_graph(ctx, kinds.CU_GRAPH_COND_TYPE_WHILE, small)),
    }
    print(" ".join(f"{k}={v}" for k, v in results.items()), flush=True)


if __name__ == "__main__":
    main()
