"""The wall seen by real CUDA software: each client asks for its memory the way its users do.

Usage: wall.py CLIENT MODE BYTES
  CLIENT  bindings (NVIDIA's cuda-bindings, driver API), numba (numba-cuda), nvml
          (nvidia-ml-py)
  MODE    fill: allocate BYTES at a time until the client's own out-of-memory error, free
          everything, and print what it saw; hold: allocate BYTES once, print, and wait for
          stdin to close
Prints key=value pairs on one line: total, free (the client's own memory query before
allocating), chunks (allocations that succeeded), error (the client's error for the next).
"""
import sys


def bindings(mode, size):
    from cuda.bindings import driver as cu

    def check(result):
        err, *rest = result
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"{err.name}")
        return rest

    check(cu.cuInit(0))
    dev, = check(cu.cuDeviceGet(0))
    ctx, = check(cu.cuDevicePrimaryCtxRetain(dev))
    check(cu.cuCtxSetCurrent(ctx))
    free, total = check(cu.cuMemGetInfo())
    held, error = [], ""
    while True:
        err, ptr = cu.cuMemAlloc(size)
        if err != cu.CUresult.CUDA_SUCCESS:
            error = err.name
            break
        held.append(ptr)
        if mode == "hold":
            break
    return total, free, held, error, lambda: [check(cu.cuMemFree(p)) for p in held]


def numba(mode, size):
    import numpy as np
    from numba import cuda
    from numba.cuda.cudadrv.driver import CudaAPIError

    free, total = cuda.current_context().get_memory_info()
    held, error = [], ""
    while True:
        try:
            held.append(cuda.device_array(size, dtype=np.uint8))
        except CudaAPIError as e:
            error = f"CudaAPIError:{getattr(e.code, 'name', e.code)}"
            break
        if mode == "hold":
            break
    return total, free, held, error, held.clear


def nvml(_mode, _size):
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    info = pynvml.nvmlDeviceGetMemoryInfo(handle)
    return info.total, info.free, [], "", pynvml.nvmlShutdown


def main():
    client, mode, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    total, free, held, error, release = {"bindings": bindings, "numba": numba, "nvml": nvml}[
        client
    ](mode, size)
    print(f"total={total} free={free} chunks={len(held)} error={error}", flush=True)
    if mode == "hold":
        sys.stdin.read()
    release()


if __name__ == "__main__":
    main()
