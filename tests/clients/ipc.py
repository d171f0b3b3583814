"""Device memory shared between two processes by CUDA's interprocess handles, as CuPy gives
them (cudaIpcGetMemHandle, cudaIpcOpenMemHandle): this process fills an allocation and
exports it, a second process opens the handle, reads the memory, writes into it, and closes
it; this process then reads what the other wrote.

Usage: ipc.py BYTES
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


def main():
    if sys.argv[1] == "open":
        return opener()
    import cupy

    n = int(sys.argv[1])
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
