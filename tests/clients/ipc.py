"""Device memory shared between two processes by CUDA's interprocess handles: this process
fills an allocation and shares it, a second process opens it, reads the memory, writes into
it, and lets it go; this process then reads what the other wrote.

Usage: ipc.py CLIENT BYTES
  CLIENT  cupy (cudaIpcGetMemHandle, cudaIpcOpenMemHandle) or torch (a CUDA tensor sent to a
          process started by torch.multiprocessing (spawn), which shares its memory and an
          interprocess event the receiver waits for)
Prints key=value pairs on one line: seen (the opener read what was written, 1 or 0),
written_back (this process reads what the opener wrote), opener_taken (how much the opener's
free memory fell while it held the memory open: it is the exporter's), closed (the opener
closed it without error).
"""
import subprocess
import sys

import numpy as np


def opener():
    import cupy

    handle = bytes.fromhex(sys.stdin.readline().strip())
    n = int(sys.argv[2])
    free = cupy.cuda.runtime.memGetInfo()[0]
    ptr = cupy.cuda.runtime.ipcOpenMemHandle(handle)
    taken = free - cupy.cuda.runtime.memGetInfo()[0]
    host = np.empty(n, dtype=np.uint8)
    cupy.cuda.runtime.memcpy(host.ctypes.data, ptr, n, cupy.cuda.runtime.memcpyDeviceToHost)
    seen = int(bool((host == 7).all()))
    host[:] = 9
    cupy.cuda.runtime.memcpy(ptr, host.ctypes.data, n, cupy.cuda.runtime.memcpyHostToDevice)
    cupy.cuda.runtime.ipcCloseMemHandle(ptr)
    print(f"seen={seen} opener_taken={taken} closed=1", flush=True)


def torch_receiver(inbox, outbox):
    import torch

    free = torch.cuda.mem_get_info()[0]
    t = inbox.get()
    taken = free - torch.cuda.mem_get_info()[0]
    seen = int(bool((t.cpu() == 7).all()))
    t.copy_(torch.full(t.shape, 9, dtype=torch.uint8))
    torch.cuda.synchronize()
    del t
    outbox.put(f"seen={seen} opener_taken={taken} closed=1")
    inbox.get()


def torch_sender(n):
    import torch
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    # A copy from the host (the simulated GPU runs no kernels, so no fill kernel).
    t = torch.from_numpy(np.full(n, 7, dtype=np.uint8)).cuda()
    receiver = ctx.Process(target=torch_receiver, args=(inbox, outbox))
    receiver.start()
    inbox.put(t)
    line = outbox.get(timeout=120)
    written_back = int(bool((t.cpu() == 9).all()))
    inbox.put(None)
    receiver.join(timeout=60)
    print(line, f"written_back={written_back}")


def main():
    if sys.argv[1] == "open":
        return opener()
    client, n = sys.argv[1], int(sys.argv[2])
    if client == "torch":
        return torch_sender(n)
    import cupy

    # A copy from the host (the simulated GPU runs no kernels, so no fill kernel).
    a = cupy.asarray(np.full(n, 7, dtype=np.uint8))
    cupy.cuda.Device().synchronize()
    handle = cupy.cuda.runtime.ipcGetMemHandle(a.data.ptr)
    child = subprocess.run(
        [sys.executable, __file__, "open", str(n)],
        input=handle.hex() + "\n",
        capture_output=True,
        text=True,
        check=True,
    )
    written_back = int(bool((a.get() == 9).all()))
    print(child.stdout.strip(), f"written_back={written_back}")


if __name__ == "__main__":
    main()
