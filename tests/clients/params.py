"""Kernel parameter layouts as NVIDIA's cuda.core reads them (`Kernel.num_arguments`,
`Kernel.arguments_info`, which ask the driver's cuKernelGetParamInfo, CUDA 12.4): kernels
compiled by NVRTC to a cubin and to PTX (which the driver compiles at the load) are loaded,
their parameters asked for, and one launched with its arguments.

Usage: params.py cuda.core
Prints key=value pairs on one line, for each image kind K (cubin, ptx): K_scalars and
K_aggregates (each parameter's offset:size, comma separated, of a kernel taking scalars and
pointers and of one taking a structure and a vector by value), K_none (how many parameters
a kernel taking none has); launched (1 once the scalars' kernel of each image ran).
"""
import sys

import numpy as np

SOURCE = r"""
struct Pair { char c; double d; };
extern "C" __global__ void scalars(float* a, const float* b, int n, double k, char c, short s,
                                   long long q) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] += b[i] * k + c + s + q;
}
extern "C" __global__ void aggregates(Pair p, float4 v, int n) {
    if (threadIdx.x < n) v.w += p.d;
}
extern "C" __global__ void none() {}
"""


def layout(kernel):
    info = kernel.arguments_info
    assert kernel.num_arguments == len(info)
    return ",".join(f"{p.offset}:{p.size}" for p in info)


def main():
    from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch

    if sys.argv[1:] != ["cuda.core"]:
        sys.exit(__doc__)
    dev = Device(0)
    dev.set_current()
    stream = dev.create_stream()
    buf = dev.allocate(4096, stream=stream)
    facts = {}
    for kind in ("cubin", "ptx"):
        program = Program(SOURCE, code_type="c++", options=ProgramOptions(arch=f"sm_{dev.arch}"))
        module = program.compile(kind)
        kernel = module.get_kernel("scalars")
        facts[f"{kind}_scalars"] = layout(kernel)
        facts[f"{kind}_aggregates"] = layout(module.get_kernel("aggregates"))
        facts[f"{kind}_none"] = module.get_kernel("none").num_arguments
        launch(stream, LaunchConfig(grid=4, block=256), kernel, buf, buf, np.int32(1024),
               np.float64(2.0), np.int8(1), np.int16(3), np.int64(5))
        stream.sync()
    facts["launched"] = 1
    buf.close(stream)
    print(" ".join(f"{k}={v}" for k, v in facts.items()))


if __name__ == "__main__":
    main()
