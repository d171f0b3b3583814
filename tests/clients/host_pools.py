"""Stream-ordered page-locked host memory through NVIDIA's cuda.core (CUDA 13): its
PinnedMemoryResource takes from a driver pool in host memory, which is not the GPU's and is
not charged; the GPU's own memory is then filled in the same chunks.

Usage: host_pools.py MODE CHUNK COUNT
  MODE   current (the host's current pool: cuMemGetMemPool of the host location), host (a pool
         of its own on the host), numa (a pool of its own on host NUMA node 0)
Prints key=value pairs on one line: pinned (chunks granted by the pinned resource, at most
COUNT), device (MiB granted by the device's memory resource, in chunks, until one is refused).
"""
import sys

from cuda.core import (
    Device,
    DeviceMemoryResource,
    PinnedMemoryResource,
    PinnedMemoryResourceOptions,
)


def main():
    mode, chunk, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    dev = Device(0)
    dev.set_current()
    stream = dev.create_stream()
    options = {
        "current": None,
        "host": PinnedMemoryResourceOptions(),
        "numa": PinnedMemoryResourceOptions(numa_id=0),
    }[mode]
    pinned = PinnedMemoryResource(options)
    held = []
    while len(held) < count:
        held.append(pinned.allocate(chunk, stream=stream))
    pinned_chunks = len(held)
    gpu = DeviceMemoryResource(dev)
    device_mib = 0
    while True:
        try:
            held.append(gpu.allocate(chunk, stream=stream))
        except Exception as e:  # cuda.core's CUDAError: out of memory
            if "CUDA_ERROR_OUT_OF_MEMORY" not in str(e):
                raise
            break
        device_mib += chunk >> 20
    stream.sync()
    print(f"pinned={pinned_chunks} device={device_mib}")


if __name__ == "__main__":
    main()
