"""PyTorch work that tests/gpu/acceptance.py times, one subcommand per run.

    rate KIND WARMUP SECONDS  run KIND for WARMUP seconds, print "measuring", then count how
                              many complete in SECONDS: matmul (4096x4096 fp16 products, compute-bound),
                              scale (a 16M-element in-place multiply: no cuBLAS, for the
                              simulated node, whose driver runs no real kernels)
    launch N REPS             REPS times N small kernel launches (a 16-float add_), timed;
                              the median ns per launch

Each prints one line of key=value pairs.
"""
import statistics
import sys
import time

import torch


def rate(kind, warmup, seconds):
    dev = torch.device("cuda:0")
    if kind == "matmul":
        a = torch.randn(4096, 4096, device=dev, dtype=torch.float16)
        b = torch.randn(4096, 4096, device=dev, dtype=torch.float16)
        step, batch = (lambda: a @ b), 20
    elif kind == "scale":
        x = torch.ones(1 << 24, device=dev)
        step, batch = (lambda: x.mul_(1.0)), 4
    else:
        sys.exit(f"unknown kind {kind}")
    done, start, measuring = 0, time.perf_counter(), False
    while True:
        for _ in range(batch):
            step()
        torch.cuda.synchronize()
        now = time.perf_counter()
        if not measuring and now - start >= warmup:
            done, start, measuring = 0, now, True
            print("measuring", flush=True)
        elif measuring:
            done += batch
            if now - start >= seconds:
                break
    print(f"per_s={done / (now - start):.2f}")


def launch(n, reps):
    a = torch.ones(16, device="cuda:0")
    for _ in range(1000):
        a.add_(1)
    torch.cuda.synchronize()
    each = []
    for _ in range(reps):
        start = time.perf_counter_ns()
        for _ in range(n):
            a.add_(1)
        torch.cuda.synchronize()
        each.append((time.perf_counter_ns() - start) / n)
    print(f"ns_per_launch={statistics.median(each):.1f}")


def main():
    cmd = sys.argv[1]
    if cmd == "rate":
        rate(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
    elif cmd == "launch":
        launch(int(sys.argv[2]), int(sys.argv[3]))
    else:
        sys.exit(f"unknown subcommand {cmd}")


if __name__ == "__main__":
    main()
