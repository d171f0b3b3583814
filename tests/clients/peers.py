"""Data moved between two GPUs as multi-GPU programs move it: the client asks whether GPU 0
can reach GPU 1's memory, copies a buffer from the host to GPU 0, from GPU 0 to GPU 1 and
back, and reads each copy back.

Usage: peers.py CLIENT BYTES
  CLIENT  torch (tensor.to between devices: PyTorch enables peer access and copies
          device to device) or cupy (MemoryPointer.copy_from_device between devices: CuPy
          enables peer access and copies by unified addressing); PyTorch's allocator is
          the one PYTORCH_CUDA_ALLOC_CONF names (backend:cudaMallocAsync gives the other GPU
          access to the driver's pool first)
Prints key=value pairs on one line: can (the client's own peer-access query, 1 or 0), same
(every copy read back equal to what was sent), total0, total1 (each GPU's memory as the
client reads it), used0, used1 (how much each GPU's free memory fell while the copies
were held).
"""
import sys

import numpy as np


def torch_client(n, data):
    import torch

    can = torch.cuda.can_device_access_peer(0, 1)
    free = [torch.cuda.mem_get_info(i) for i in (0, 1)]
    src = torch.from_numpy(data)
    a = src.to("cuda:0")
    b = a.to("cuda:1")
    c = b.to("cuda:0")
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    same = torch.equal(b.cpu(), src) and torch.equal(c.cpu(), src)
    after = [torch.cuda.mem_get_info(i)[0] for i in (0, 1)]
    return can, same, free, after


def cupy_client(n, data):
    import cupy

    can = cupy.cuda.runtime.deviceCanAccessPeer(0, 1)
    free = []
    for i in (0, 1):
        with cupy.cuda.Device(i):
            free.append(cupy.cuda.runtime.memGetInfo())
    with cupy.cuda.Device(0):
        a = cupy.asarray(data)
    with cupy.cuda.Device(1):
        b = cupy.empty(n, dtype=cupy.uint8)
        b.data.copy_from_device(a.data, n)
        cupy.cuda.Device(1).synchronize()
    with cupy.cuda.Device(0):
        c = cupy.empty(n, dtype=cupy.uint8)
        c.data.copy_from_device(b.data, n)
        cupy.cuda.Device(0).synchronize()
    same = np.array_equal(b.get(), data) and np.array_equal(c.get(), data)
    after = []
    for i in (0, 1):
        with cupy.cuda.Device(i):
            after.append(cupy.cuda.runtime.memGetInfo()[0])
    return bool(can), same, free, after


def main():
    client, n = sys.argv[1], int(sys.argv[2])
    data = np.random.default_rng(7).integers(0, 256, n, dtype=np.uint8)
    can, same, free, after = {"torch": torch_client, "cupy": cupy_client}[client](n, data)
    print(
        f"can={int(can)} same={int(same)} total0={free[0][1]} total1={free[1][1]} "
        f"used0={free[0][0] - after[0]} used1={free[1][0] - after[1]}"
    )


if __name__ == "__main__":
    main()
