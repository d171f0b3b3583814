"""Extra contexts as a tenant makes them to hold more than its slice: NVIDIA's cuda-bindings
creates contexts (`cuCtxCreate`, which cuda-bindings 13 reaches as `cuCtxCreate_v4`) until
refused, then allocates 64 MiB at a time until refused.

Usage: contexts.py
Prints key=value pairs on one line: contexts (made), context_error (the refusal of the next),
free and total (cuMemGetInfo after them), chunks and error (the allocations), and host_used
(what NVML, the host's view, says this process holds on the device, in bytes).
"""
import os

from cuda.bindings import driver as d


def check(result):
    if result[0] != d.CUresult.CUDA_SUCCESS:
        raise RuntimeError(result[0].name)
    return result[1:]


def main():
    check(d.cuInit(0))
    (dev,) = check(d.cuDeviceGet(0))
    facts, contexts = {}, []
    while len(contexts) < 64:
        result = d.cuCtxCreate(None, 0, dev)
        if result[0] != d.CUresult.CUDA_SUCCESS:
            facts["context_error"] = result[0].name
            break
        contexts.append(result[1])
    facts["contexts"] = len(contexts)
    free, total = check(d.cuMemGetInfo())
    facts["free"], facts["total"] = free, total
    chunks = []
    while len(chunks) < 4096:
        result = d.cuMemAlloc(64 << 20)
        if result[0] != d.CUresult.CUDA_SUCCESS:
            facts["error"] = result[0].name
            break
        chunks.append(result[1])
    facts["chunks"] = len(chunks)
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    mine = [p for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid == os.getpid()]
    facts["host_used"] = mine[0].usedGpuMemory if mine else -1
    print(" ".join(f"{k}={v}" for k, v in facts.items()))


main()
