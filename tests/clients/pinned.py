"""Page-locked host memory as CUDA software uses it for fast copies: the client pins a
buffer, copies it to the GPU and back through pinned memory, and reads what came back.

Usage: pinned.py CLIENT BYTES
  CLIENT  torch (Tensor.pin_memory, a DataLoader with pin_memory=True, non-blocking copies),
          cupy (cupyx.empty_pinned and CuPy's pinned memory pool), numba (cuda.pinned_array,
          cuda.mapped_array, whose device address is its host address, and cuda.pinned,
          which registers the program's own array)
Prints key=value pairs on one line: pinned (the client's own query says the buffer is
page-locked, 1 or 0), same (every copy read back equal to what was sent), taken (how much
the GPU's free memory fell while only the pinned buffers were held: page-locked memory is
host memory).
"""
import sys

import numpy as np


def torch_client(data):
    import torch

    free = torch.cuda.mem_get_info()[0]
    src = torch.from_numpy(data).pin_memory()
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.from_numpy(data)), batch_size=len(data) // 4,
        pin_memory=True,
    )
    batches = [b for (b,) in loader]
    taken = free - torch.cuda.mem_get_info()[0]
    pinned = src.is_pinned() and all(b.is_pinned() for b in batches)
    dev = src.to("cuda", non_blocking=True)
    back = torch.empty_like(src).pin_memory()
    back.copy_(dev, non_blocking=True)
    torch.cuda.synchronize()
    same = torch.equal(back, src) and torch.equal(torch.cat(batches), src)
    return pinned, same, taken


def cupy_client(data):
    import cupy
    import cupyx

    free = cupy.cuda.runtime.memGetInfo()[0]
    buf = cupyx.empty_pinned(data.shape, dtype=data.dtype)
    buf[...] = data
    mem = cupy.cuda.alloc_pinned_memory(data.nbytes)
    back = np.frombuffer(mem, data.dtype, data.size)
    taken = free - cupy.cuda.runtime.memGetInfo()[0]
    attrs = cupy.cuda.runtime.pointerGetAttributes(buf.ctypes.data)
    pinned = attrs.type == cupy.cuda.runtime.memoryTypeHost
    stream = cupy.cuda.Stream(non_blocking=True)
    dev = cupy.empty(data.shape, dtype=data.dtype)
    dev.set(buf, stream=stream)
    dev.get(stream=stream, out=back)
    stream.synchronize()
    same = np.array_equal(back, data)
    return pinned, same, taken


def numba_client(data):
    from numba import cuda

    free = cuda.current_context().get_memory_info()[0]
    p = cuda.pinned_array(data.shape, dtype=data.dtype)
    p[...] = data
    m = cuda.mapped_array(data.shape, dtype=data.dtype)
    m[...] = data
    own = np.zeros_like(data)
    taken = free - cuda.current_context().get_memory_info()[0]
    # A mapped array is a device array at the device address of its host memory (the same
    # address, under unified addressing).
    pinned = cuda.is_cuda_array(m) and m.device_ctypes_pointer.value == m.ctypes.data
    stream = cuda.stream()
    dev = cuda.to_device(p, stream=stream)
    back = cuda.pinned_array(data.shape, dtype=data.dtype)
    dev.copy_to_host(back, stream=stream)
    with cuda.pinned(own):
        dev.copy_to_host(own, stream=stream)
    stream.synchronize()
    same = np.array_equal(back, data) and np.array_equal(own, data) and np.array_equal(m, data)
    return pinned, same, taken


def main():
    client, n = sys.argv[1], int(sys.argv[2])
    data = np.random.default_rng(11).integers(0, 256, n, dtype=np.uint8)
    clients = {"torch": torch_client, "cupy": cupy_client, "numba": numba_client}
    pinned, same, taken = clients[client](data)
    print(f"pinned={int(pinned)} same={int(same)} taken={taken}")


if __name__ == "__main__":
    main()
