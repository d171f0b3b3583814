"""PyTorch under libgpuslice.so: the pieces tests/gpu/run.sh runs, one per subcommand.

    context                 bytes the driver takes for this process's context
    fill CHUNK_MIB [hold]   allocate CHUNK_MIB tensors until PyTorch's out-of-memory error,
                            then 1 MiB ones until the error again
    info                    torch.cuda.mem_get_info() and the device's total_memory
    hold MIB                allocate MIB, print, and wait for stdin to close
    launch N                N small kernel launches, timed (ns per launch)
    matmul SECONDS          4096x4096 fp16 matrix products for SECONDS (products per second)

Each prints one line of key=value pairs.
"""
import sys
import time

import torch


def main():
    cmd = sys.argv[1]
    dev = torch.device("cuda:0")
    if cmd == "context":
        torch.cuda.init()
        torch.zeros(1, device=dev)
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        print(f"free={free} total={total}")
    elif cmd == "fill":
        held = []
        error = "none"
        for chunk in (int(sys.argv[2]) << 20, 1 << 20):
            try:
                while True:
                    held.append(torch.empty(chunk, dtype=torch.uint8, device=dev))
            except torch.cuda.OutOfMemoryError as e:
                error = type(e).__name__
        free, total = torch.cuda.mem_get_info()
        print(
            f"error={error} chunks={len(held)} allocated={torch.cuda.memory_allocated()} "
            f"reserved={torch.cuda.memory_reserved()} free={free} total={total}"
        )
        sys.stdout.flush()
        if len(sys.argv) > 3:
            sys.stdin.read()
    elif cmd == "info":
        free, total = torch.cuda.mem_get_info()
        props = torch.cuda.get_device_properties(0)
        print(f"free={free} total={total} total_memory={props.total_memory}")
    elif cmd == "hold":
        t = torch.empty(int(sys.argv[2]) << 20, dtype=torch.uint8, device=dev)
        free, total = torch.cuda.mem_get_info()
        print(f"held={t.numel()} free={free} total={total}")
        sys.stdout.flush()
        sys.stdin.read()
    elif cmd == "launch":
        n = int(sys.argv[2])
        a = torch.ones(16, device=dev)
        for _ in range(1000):
            a.add_(1)
        torch.cuda.synchronize()
        start = time.perf_counter_ns()
        for _ in range(n):
            a.add_(1)
        torch.cuda.synchronize()
        print(f"ns_per_launch={(time.perf_counter_ns() - start) / n:.1f}")
    elif cmd == "matmul":
        seconds = float(sys.argv[2])
        a = torch.randn(4096, 4096, device=dev, dtype=torch.float16)
        b = torch.randn(4096, 4096, device=dev, dtype=torch.float16)
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        done = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            for _ in range(20):
                a @ b
            torch.cuda.synchronize()
            done += 20
        print(f"matmuls_per_s={done / (time.perf_counter() - start):.1f}")
    else:
        sys.exit(f"unknown subcommand {cmd}")


if __name__ == "__main__":
    main()
