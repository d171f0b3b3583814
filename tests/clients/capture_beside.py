"""CUDA graphs captured by PyTorch in one thread while another launches matrix products on the
default stream, as a server that captures a model while it serves requests does. PyTorch
captures in the global mode (its default `capture_error_mode`): a call from any thread that the
driver deems unsafe meanwhile (a synchronization, an event queried from a thread in the global
mode) invalidates the capture, and its end raises.

Usage: capture_beside.py CAPTURES HOLD_MS
Each capture records one product and is held open HOLD_MS milliseconds, then replayed once.
Prints key=value pairs on one line: captured (captures that ended and replayed), failed, error
(the first failure's class and first line, or none), launches (products the other thread
launched while the captures were made).
"""
import sys
import threading
import time

import torch


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    captures, hold_s = int(sys.argv[1]), int(sys.argv[2]) / 1000
    a = torch.randn(256, 256, device="cuda")
    served = torch.empty_like(a)
    # cuBLAS's handle and workspace are made before any capture, as PyTorch asks.
    a @ a
    x = torch.randn(256, 256, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x @ x
    torch.cuda.synchronize()

    done = threading.Event()
    launches = 0

    def serve():
        nonlocal launches
        while not done.is_set():
            torch.matmul(a, a, out=served)
            launches += 1
        torch.cuda.current_stream().synchronize()

    server = threading.Thread(target=serve)
    server.start()
    captured, failed, error = 0, 0, "none"
    for _ in range(captures):
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                y = x @ x
                time.sleep(hold_s)
            graph.replay()
            torch.cuda.current_stream().synchronize()
            captured += 1
        except RuntimeError as e:  # the failure is the fact
            failed += 1
            if error == "none":
                error = type(e).__name__ + ":" + str(e).splitlines()[0].replace(" ", "_")[:80]
    done.set()
    server.join()
    del y
    print(f"captured={captured} failed={failed} error={error} launches={launches}")


main()
