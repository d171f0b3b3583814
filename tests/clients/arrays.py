"""CUDA arrays through the CUDA runtime at PATH (ctypes): a 64 x 16 float array written with
cudaMemcpy2DToArray, read back whole and in part with cudaMemcpy2DFromArray, and described
by cudaArrayGetInfo.

Usage: arrays.py PATH
Prints key=value pairs on one line: each call's cudaError_t, and whether the data came back
as written (1) or not (0).
"""
import ctypes
import sys
from ctypes import byref, c_int, c_size_t, c_uint, c_void_p


class ChannelFormat(ctypes.Structure):
    _fields_ = [("x", c_int), ("y", c_int), ("z", c_int), ("w", c_int), ("f", c_int)]


class Extent(ctypes.Structure):
    _fields_ = [("width", c_size_t), ("height", c_size_t), ("depth", c_size_t)]


def main():
    rt = ctypes.CDLL(sys.argv[1])
    width, height = 64, 16
    data = (ctypes.c_float * (width * height))(*range(width * height))
    back = (ctypes.c_float * (width * height))()
    array = c_void_p()
    float_kind = 2  # cudaChannelFormatKindFloat
    desc = ChannelFormat(32, 0, 0, 0, float_kind)
    facts = {"malloc_array": rt.cudaMallocArray(byref(array), byref(desc), c_size_t(width),
                                                 c_size_t(height), c_uint(0))}
    row = width * 4
    to_device, to_host = 1, 2  # cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost
    facts["to_array"] = rt.cudaMemcpy2DToArray(array, c_size_t(0), c_size_t(0), data,
                                               c_size_t(row), c_size_t(row), c_size_t(height),
                                               c_int(to_device))
    facts["from_array"] = rt.cudaMemcpy2DFromArray(back, c_size_t(row), array, c_size_t(0),
                                                   c_size_t(0), c_size_t(row), c_size_t(height),
                                                   c_int(to_host))
    facts["round_trip"] = int(list(back) == list(data))
    part = (ctypes.c_float * 8)()
    # 8 floats from column 4 of row 3.
    facts["part"] = rt.cudaMemcpy2DFromArray(part, c_size_t(32), array, c_size_t(16), c_size_t(3),
                                             c_size_t(32), c_size_t(1), c_int(to_host))
    facts["part_ok"] = int(list(part) == [float(3 * width + 4 + i) for i in range(8)])
    got, extent, flags = ChannelFormat(), Extent(), c_uint()
    facts["info"] = rt.cudaArrayGetInfo(byref(got), byref(extent), byref(flags), array)
    facts["extent"] = f"{extent.width}x{extent.height}x{extent.depth}"
    facts["format"] = f"{got.x},{got.f}"
    facts["free_array"] = rt.cudaFreeArray(array)
    print(" ".join(f"{k}={v}" for k, v in facts.items()), flush=True)


if __name__ == "__main__":
    main()
