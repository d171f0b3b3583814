"""The wall seen by real CUDA software: each client asks for its memory the way its users do.

Usage: wall.py CLIENT MODE BYTES [API]
  CLIENT  bindings (NVIDIA's cuda-bindings, driver API), numba (numba-cuda), numba-jit
          (numba-cuda compiling and launching a kernel first), cupy (CuPy and
          its memory pool), nvml (nvidia-ml-py), runtime:PATH (the CUDA runtime library at PATH, through ctypes),
          torch (PyTorch and its caching allocator, after launching kernels and replaying a
          captured CUDA graph; PYTORCH_CUDA_ALLOC_CONF chooses the allocator as usual),
          cupy-async (CuPy with its stream-ordered pool, cudaMallocAsync), jax (JAX arrays;
          XLA_PYTHON_CLIENT_* choose the allocator as usual), rmm (RAPIDS' memory manager;
          API names its memory resource: cuda, pool, async or managed), onnxruntime (ONNX
          Runtime's CUDA execution provider running a model through cuDNN and cuBLAS, then
          OrtValues in its arena; in
          PyTorch's environment; total and free are not read: 0)
  MODE    fill: allocate BYTES at a time until the client's own out-of-memory error, free
          everything, and print what it saw; peak: the same, waiting for stdin to close
          before freeing; hold: allocate BYTES once, print, and wait for stdin to close
  API     for the runtime: malloc (default), async, managed, pitch, array3d; graph (each
          allocation a graph captured around cudaMallocAsync, instantiated and launched,
          its allocation left unfreed); graph-node (the same with an allocation node made
          by cudaGraphAddMemAllocNode); heap (each allocation the device malloc heap raised
          by BYTES with cudaDeviceSetLimit), stack (the per-thread stack raised by as much as
          BYTES reserve for every thread that can be resident)
Prints key=value pairs on one line: total, free (the client's own memory query before
allocating), chunks (allocations that succeeded), error (the client's error for the next),
and what else the client read (the bindings client: posix_fd_handles and dma_buf, the device
attributes telling whether memory can be exported as file descriptors and dma-bufs).
WALL_SETTLE_S: seconds to wait after the client's start-up (context, first kernels) before
allocating. WALL_LOCAL_INTS=N: numba-jit also launches a kernel whose threads each need a
local array of N 32-bit integers, and prints local=ok or its error. WALL_RAISE=stack or heap: the bindings client allocates by raising the per-thread
stack or the device malloc heap (cuCtxSetLimit) instead of by cuMemAlloc; WALL_RAISE=green:
it makes green contexts until refused, then allocates; WALL_RAISE=module: it loads modules
whose global variable takes BYTES (cuModuleLoadData). WALL_RESET=1: the
runtime client fills, calls cudaDeviceReset, and fills again (chunks_before_reset: the first).
WALL_DEVICE=N: the bindings, numba, torch and nvml clients use device N (default 0); the nvml client
also prints every device's total (totals, comma-separated, in index order).
"""
import os
import sys
import time


# More key=value pairs a client read, printed after the others.
SEEN = {}


def settle():
    time.sleep(float(os.environ.get("WALL_SETTLE_S", "0")))


def device():
    """The device index the client uses: WALL_DEVICE, or 0."""
    return int(os.environ.get("WALL_DEVICE", "0"))


def bindings(mode, size):
    from cuda.bindings import driver as cu

    def check(result):
        err, *rest = result
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"{err.name}")
        return rest

    check(cu.cuInit(0))
    dev, = check(cu.cuDeviceGet(device()))
    ctx, = check(cu.cuDevicePrimaryCtxRetain(dev))
    check(cu.cuCtxSetCurrent(ctx))
    free, total = check(cu.cuMemGetInfo())
    attr = cu.CUdevice_attribute
    for key, a in [
        ("posix_fd_handles", attr.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED),
        ("dma_buf", attr.CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED),
    ]:
        SEEN[key], = check(cu.cuDeviceGetAttribute(a, dev))
    settle()
    raised = os.environ.get("WALL_RAISE")
    if raised == "green":
        return bindings_green(cu, check, dev, mode, size, total, free)
    if raised == "module":
        return bindings_modules(cu, check, mode, size, total, free)
    if raised:
        return bindings_limit(cu, check, dev, raised, mode, size, total, free)
    held, error = bindings_fill(cu, mode, lambda: cu.cuMemAlloc(size))
    return total, free, held, error, lambda: [check(cu.cuMemFree(p)) for p in held]


def bindings_fill(cu, mode, step):
    """Calls STEP (a cuda-bindings call answering an error and a handle) until it fails,
    once in hold mode: the handles, and the name of the error that stopped it."""
    held = []
    while True:
        err, handle = step()
        if err != cu.CUresult.CUDA_SUCCESS:
            return held, err.name
        held.append(handle)
        if mode == "hold":
            return held, ""


def bindings_limit(cu, check, dev, raised, mode, size, total, free):
    """WALL_RAISE=stack or heap: each allocation raises a context limit the driver backs with
    device memory by SIZE bytes of it (the stack is reserved for every thread that can be
    resident: SIZE / (SMs x threads per SM) bytes more a thread)."""
    limit = {"stack": cu.CUlimit.CU_LIMIT_STACK_SIZE,
             "heap": cu.CUlimit.CU_LIMIT_MALLOC_HEAP_SIZE}[raised]
    threads = 1
    if raised == "stack":
        a = cu.CUdevice_attribute
        sms, = check(cu.cuDeviceGetAttribute(a.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))
        per_sm, = check(cu.cuDeviceGetAttribute(
            a.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev))
        threads = sms * per_sm
    first, = check(cu.cuCtxGetLimit(limit))
    held, error = [], ""
    while True:
        now, = check(cu.cuCtxGetLimit(limit))
        err, = cu.cuCtxSetLimit(limit, now + size // threads)
        if err != cu.CUresult.CUDA_SUCCESS:
            error = err.name
            break
        held.append(now)
        if mode == "hold":
            break
    return total, free, held, error, lambda: check(cu.cuCtxSetLimit(limit, first))


def bindings_green(cu, check, dev, mode, size, total, free):
    """WALL_RAISE=green: green contexts (CUDA 12.4) on the fewest SMs a split gives, made until
    one is refused (each takes a context's memory and they are not allocation calls), then
    SIZE bytes at a time by cuMemAlloc until refused. Prints how many green contexts it
    made (greens)."""
    sm = cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM
    resource, = check(cu.cuDeviceGetDevResource(dev, sm))
    groups, _, _ = check(cu.cuDevSmResourceSplitByCount(1, resource, 0, 1))
    desc, = check(cu.cuDevResourceGenerateDesc([groups[0]], 1))
    flags = cu.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM
    greens, _ = bindings_fill(cu, mode, lambda: cu.cuGreenCtxCreate(desc, dev, flags))
    print(f"greens={len(greens)}", end=" ")
    held, error = bindings_fill(cu, mode, lambda: cu.cuMemAlloc(size))

    def release():
        for p in held:
            check(cu.cuMemFree(p))
        for g in greens:
            check(cu.cuGreenCtxDestroy(g))
    return total, free, held, error, release


def bindings_modules(cu, check, mode, size, total, free):
    """WALL_RAISE=module: each allocation is a module loaded from PTX (cuModuleLoadData)
    whose one global variable takes SIZE bytes, which the driver allocates."""
    ptx = (".version 7.0\n.target sm_50\n.address_size 64\n"
           f".visible .global .align 8 .b8 wall_blob[{size}];\n").encode() + b"\0"
    held, error = bindings_fill(cu, mode, lambda: cu.cuModuleLoadData(ptx))
    return total, free, held, error, lambda: [check(cu.cuModuleUnload(m)) for m in held]


def numba_jit(mode, size):
    import numpy as np
    from numba import cuda

    @cuda.jit
    def add(a, b):
        i = cuda.grid(1)
        if i < a.size:
            a[i] += b[i]

    a = cuda.to_device(np.ones(1024, dtype=np.float32))
    add[4, 256](a, a)
    cuda.synchronize()
    # The kernel was compiled (NVVM), linked (nvJitLink), loaded and launched.
    print("launched=1", end=" ")
    del a
    local_ints = int(os.environ.get("WALL_LOCAL_INTS", "0"))
    if local_ints:
        print(f"local={numba_local_array(local_ints)}", end=" ")
    return numba(mode, size)


def numba_local_array(ints):
    """Launches a kernel whose threads each fill a local array of `ints` 32-bit integers
    (cuda.local.array): the driver grows the context's stack to hold it for every thread that
    can be resident. Returns "ok" or the error the launch raised (numba launches through
    cuda.core, whose CUDAError names the driver's error first)."""
    import numpy as np
    from numba import cuda

    @cuda.jit
    def deep(out, k):
        scratch = cuda.local.array(ints, np.int32)
        for j in range(ints):
            scratch[j] = j * k
        out[cuda.threadIdx.x] = scratch[(k * 7 + cuda.threadIdx.x) % ints]

    out = cuda.device_array(32, dtype=np.int32)
    try:
        deep[1, 32](out, 3)
        cuda.synchronize()
        return "ok"
    except Exception as e:  # the launcher's own error type, whichever it is
        code = getattr(getattr(e, "code", None), "name", None) or str(e).split(":")[0]
        return f"{type(e).__name__}:{code}"
    finally:
        del out


def numba(mode, size):
    import numpy as np
    from numba import cuda
    from numba.cuda.cudadrv.driver import CudaAPIError

    if "WALL_DEVICE" in os.environ:
        cuda.select_device(device())
    free, total = cuda.current_context().get_memory_info()
    settle()
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


def cupy_client(mode, size, pool_kind="default"):
    import cupy

    if pool_kind == "async":
        cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)
    free, total = cupy.cuda.runtime.memGetInfo()
    settle()
    held, error = [], ""
    while True:
        try:
            held.append(cupy.empty(size, dtype=cupy.uint8))
        except cupy.cuda.memory.OutOfMemoryError:
            error = "OutOfMemoryError"
            break
        if mode == "hold":
            break
    pool = cupy.get_default_memory_pool()
    if pool_kind == "default":
        # What the pool holds from the device, on the same line as the other facts.
        print(f"pool_total={pool.total_bytes()}", end=" ")

    def release():
        held.clear()
        pool.free_all_blocks()

    return total, free, held, error, release


def runtime(path, api, mode, size):
    import ctypes
    from ctypes import byref, c_int, c_size_t, c_uint, c_void_p

    class ChannelFormat(ctypes.Structure):
        _fields_ = [("x", c_int), ("y", c_int), ("z", c_int), ("w", c_int), ("f", c_int)]

    class Extent(ctypes.Structure):
        _fields_ = [("width", c_size_t), ("height", c_size_t), ("depth", c_size_t)]

    class MemAllocNodeParams(ctypes.Structure):
        # cudaMemAllocNodeParams: cudaMemPoolProps (allocType, handleTypes, location type and
        # id, then 72 bytes this client leaves zero), access descriptors, size, address out.
        _fields_ = [("alloc_type", c_int), ("handle_types", c_int), ("location_type", c_int),
                    ("location_id", c_int), ("rest", ctypes.c_ubyte * 72),
                    ("access_descs", c_void_p), ("access_desc_count", c_size_t),
                    ("bytesize", c_size_t), ("dptr", c_void_p)]

    rt = ctypes.CDLL(path)
    rt.cudaGetErrorName.restype = ctypes.c_char_p
    free, total = c_size_t(), c_size_t()
    err = rt.cudaMemGetInfo(byref(free), byref(total))
    if err:
        raise RuntimeError(rt.cudaGetErrorName(err).decode())
    mib = 1 << 20
    stream = c_void_p()
    if api.startswith("graph") and rt.cudaStreamCreate(byref(stream)):
        raise RuntimeError("cudaStreamCreate")

    def launch_graph(graph):
        # Each graph's allocation is left unfreed: every launch holds `size` more.
        exec_ = c_void_p()
        err = rt.cudaGraphInstantiateWithFlags(byref(exec_), graph, ctypes.c_ulonglong(0))
        return err or rt.cudaGraphLaunch(exec_, stream)

    limit = {"heap": 2, "stack": 0}.get(api)  # cudaLimitMallocHeapSize, cudaLimitStackSize
    first = c_size_t()
    if limit is not None and rt.cudaDeviceGetLimit(byref(first), c_int(limit)):
        raise RuntimeError("cudaDeviceGetLimit")
    step = size
    if api == "stack":
        sms, per_sm = c_int(), c_int()
        # cudaDevAttrMultiProcessorCount, cudaDevAttrMaxThreadsPerMultiProcessor
        rt.cudaDeviceGetAttribute(byref(sms), c_int(16), c_int(0))
        rt.cudaDeviceGetAttribute(byref(per_sm), c_int(39), c_int(0))
        step = size // (sms.value * per_sm.value)

    def alloc():
        p, pitch = c_void_p(), c_size_t()
        if limit is not None:
            now = c_size_t()
            rt.cudaDeviceGetLimit(byref(now), c_int(limit))
            return rt.cudaDeviceSetLimit(c_int(limit), c_size_t(now.value + step)), p
        if api == "graph":
            graph = c_void_p()
            rt.cudaStreamBeginCapture(stream, c_int(0))
            err = rt.cudaMallocAsync(byref(p), c_size_t(size), stream)
            end = rt.cudaStreamEndCapture(stream, byref(graph))
            return err or end or launch_graph(graph), p
        if api == "graph-node":
            graph, node = c_void_p(), c_void_p()
            params = MemAllocNodeParams(alloc_type=1, location_type=1, location_id=0,
                                        bytesize=size)
            err = rt.cudaGraphCreate(byref(graph), c_uint(0)) or rt.cudaGraphAddMemAllocNode(
                byref(node), graph, None, c_size_t(0), byref(params))
            return err or launch_graph(graph), c_void_p(params.dptr)
        if api == "malloc":
            return rt.cudaMalloc(byref(p), c_size_t(size)), p
        if api == "async":
            return rt.cudaMallocAsync(byref(p), c_size_t(size), c_void_p(0)), p
        if api == "managed":
            return rt.cudaMallocManaged(byref(p), c_size_t(size), c_uint(1)), p
        if api == "pitch":
            # Rows of 1 MiB: the pitch adds nothing, so `size` bytes are asked for.
            return rt.cudaMallocPitch(byref(p), byref(pitch), c_size_t(mib), c_size_t(size // mib)), p
        if api == "array3d":
            desc = ChannelFormat(8, 0, 0, 0, 1)  # one unsigned byte per element
            extent = Extent(1024, 1024, size // mib)
            return rt.cudaMalloc3DArray(byref(p), byref(desc), extent, c_uint(0)), p
        raise ValueError(api)

    def fill():
        held, error = [], ""
        while True:
            err, p = alloc()
            if err:
                error = rt.cudaGetErrorName(err).decode()
                rt.cudaGetLastError()
                break
            held.append(p)
            if mode == "hold":
                break
        return held, error

    settle()
    held, error = fill()
    if os.environ.get("WALL_RESET") == "1":
        # cudaDeviceReset frees everything the process allocated: it fills again.
        err = rt.cudaDeviceReset()
        if err:
            raise RuntimeError(f"cudaDeviceReset: {rt.cudaGetErrorName(err).decode()}")
        before = len(held)
        held, error = fill()
        print(f"chunks_before_reset={before}", end=" ")

    def release():
        if limit is not None:
            rt.cudaDeviceSetLimit(c_int(limit), first)
            return
        for p in held:
            rt.cudaFreeArray(p) if api == "array3d" else rt.cudaFree(p)
        rt.cudaDeviceSynchronize()
        if api.startswith("graph"):
            rt.cudaDeviceGraphMemTrim(c_int(0))

    return total.value, free.value, held, error, release


def torch_client(mode, size):
    import torch

    torch.cuda.set_device(device())
    free, total = torch.cuda.mem_get_info()
    # The device's memory as PyTorch's device properties report it (cudaGetDeviceProperties).
    print(f"props_total={torch.cuda.get_device_properties(device()).total_memory}", end=" ")
    a = torch.ones(1 << 20, device="cuda")
    b = a + 1
    # A captured CUDA graph: warm-up on a side stream, capture, replay.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        c = a * 2
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c = a * b
    graph.replay()
    torch.cuda.synchronize()
    print("graph=1", end=" ")
    del a, b, c, graph
    torch.cuda.empty_cache()
    settle()
    held, error = [], ""
    while True:
        try:
            held.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        except torch.cuda.OutOfMemoryError:
            error = "OutOfMemoryError"
            break
        if mode == "hold":
            break

    def release():
        held.clear()
        torch.cuda.empty_cache()

    return total, free, held, error, release


def jax_client(mode, size):
    import jax
    import jax.numpy as jnp

    device = jax.devices()[0]
    # JAX has no memory query of the device; its allocator's limit is the nearest figure.
    total = (device.memory_stats() or {}).get("bytes_limit", 0)
    jnp.ones(1024).block_until_ready()
    settle()
    held, error = [], ""
    while True:
        try:
            held.append(jnp.zeros(size, dtype=jnp.uint8).block_until_ready())
        except Exception as e:  # jax.errors.JaxRuntimeError, named differently by version
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            error = "RESOURCE_EXHAUSTED"
            break
        if mode == "hold":
            break
    return total, 0, held, error, held.clear


def rmm_client(mode, size, resource):
    import rmm

    # RAPIDS' memory manager (librmm, with the CUDA runtime linked in statically), each
    # memory resource as its users set it: cudaMalloc, a pool growing from cudaMalloc, a pool
    # of the driver's own (cudaMemPoolCreate, then cudaMallocFromPoolAsync), managed memory.
    resources = {
        "cuda": rmm.mr.CudaMemoryResource,
        "pool": lambda: rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), size),
        "async": rmm.mr.CudaAsyncMemoryResource,
        "managed": rmm.mr.ManagedMemoryResource,
    }
    free, total = rmm.mr.available_device_memory()
    rmm.mr.set_current_device_resource(resources[resource]())
    settle()
    held, error = [], ""
    while True:
        try:
            held.append(rmm.DeviceBuffer(size=size))
        except MemoryError:
            error = "MemoryError"
            break
        if mode == "hold":
            break
    return total, free, held, error, held.clear


def onnxruntime_client(mode, size):
    # PyTorch first: it loads the CUDA 12 runtime, cuBLAS and cuDNN from its environment, as
    # ONNX Runtime's documentation has users do.
    import torch  # noqa: F401
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    # A model of a convolution (cuDNN), a ReLU and a matrix product (cuBLAS), on the CUDA
    # execution provider. The product is 512 x 512: for most other shapes ONNX Runtime's
    # cuBLAS calls into a table of the driver the simulated one does not describe.
    filters = numpy_helper.from_array(np.ones((2, 3, 3, 3), dtype=np.float32), "filters")
    weight = numpy_helper.from_array(np.ones((2 * 16 * 16, 512), dtype=np.float32), "weight")
    nodes = [
        helper.make_node("Conv", ["x", "filters"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"]),
        helper.make_node("MatMul", ["f", "weight"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 512])],
        [filters, weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    session = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
    SEEN["provider"] = session.get_providers()[0]
    x = np.ones((4, 3, 16, 16), np.float32)
    SEEN["output"] = "x".join(map(str, session.run(None, {"x": x})[0].shape))
    settle()
    held, error = [], ""
    while True:
        try:
            # Device memory from the CUDA provider's arena (BFCArena, cudaMalloc beneath).
            held.append(ort.OrtValue.ortvalue_from_shape_and_type([size // 4], np.float32, "cuda", 0))
        except RuntimeError as e:
            if "Failed to allocate memory" not in str(e):
                raise
            error = "FailedToAllocate"
            break
        if mode == "hold":
            break
    return 0, 0, held, error, held.clear


def nvml(_mode, _size):
    import pynvml

    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    SEEN["totals"] = ",".join(str(pynvml.nvmlDeviceGetMemoryInfo(h).total) for h in handles)
    info = pynvml.nvmlDeviceGetMemoryInfo(handles[device()])
    return info.total, info.free, [], "", pynvml.nvmlShutdown


def main():
    client, mode, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    api = sys.argv[4] if len(sys.argv) > 4 else "malloc"
    if client.startswith("runtime:"):
        total, free, held, error, release = runtime(client[len("runtime:"):], api, mode, size)
    elif client == "rmm":
        total, free, held, error, release = rmm_client(mode, size, api)
    else:
        clients = {
            "bindings": bindings,
            "numba": numba,
            "numba-jit": numba_jit,
            "cupy": cupy_client,
            "cupy-async": lambda m, n: cupy_client(m, n, "async"),
            "jax": jax_client,
            "nvml": nvml,
            "onnxruntime": onnxruntime_client,
            "torch": torch_client,
        }
        total, free, held, error, release = clients[client](mode, size)
    seen = "".join(f" {k}={v}" for k, v in SEEN.items())
    print(f"total={total} free={free} chunks={len(held)} error={error}{seen}", flush=True)
    if mode in ("hold", "peak"):
        sys.stdin.read()
    release()


if __name__ == "__main__":
    main()
