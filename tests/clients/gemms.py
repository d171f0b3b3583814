"""cuBLAS and cuBLASLt through PyTorch, as models use them: matrix products in single, half
and bfloat16 precision, with a bias (cuBLASLt's fused epilogue) and without, batched, and
matrix-vector; then PyTorch fills what is left of the device in 64 MiB tensors.

Usage: gemms.py
Prints key=value pairs on one line, then waits for stdin to close before freeing: each
product's name and ok or its error's class and first line; total and free
(torch.cuda.mem_get_info after the products); chunks and error (the fill: tensors allocated,
and the error of the next).
"""
import sys

import torch

facts = {}
x = torch.randn(256, 256, device="cuda")
v = torch.randn(256, device="cuda")
PRODUCTS = {
    "sgemm": lambda: x @ x,
    "hgemm": lambda: x.half() @ x.half(),
    "bf16gemm": lambda: x.bfloat16() @ x.bfloat16(),
    "batched": lambda: torch.bmm(x.expand(4, 256, 256), x.expand(4, 256, 256)),
    "linear": lambda: torch.nn.functional.linear(x, x),
    "linear_bias": lambda: torch.nn.functional.linear(x, x, v),
    "linear_bias_half": lambda: torch.nn.functional.linear(x.half(), x.half(), v.half()),
    "addmm": lambda: torch.addmm(x, x, x),
    "gemv": lambda: x @ v,
}


def graphed():
    layer = torch.nn.Linear(256, 256).cuda().half()
    h = x.half()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        layer(h)  # warmed up outside the capture, as PyTorch asks
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer(h).relu()
    for _ in range(3):
        graph.replay()


PRODUCTS["graphed_linear"] = graphed
for name, product in PRODUCTS.items():
    try:
        product()
        torch.cuda.synchronize()
        facts[name] = "ok"
    except Exception as e:  # the error is the fact
        facts[name] = type(e).__name__ + ":" + str(e).splitlines()[0].replace(" ", "_")[:80]

free, total = torch.cuda.mem_get_info()
facts["total"], facts["free"] = total, free
held, chunks = [], 0
try:
    while True:
        held.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
        chunks += 1
except torch.cuda.OutOfMemoryError as e:
    facts["error"] = type(e).__name__
facts["chunks"] = chunks
print(" ".join(f"{k}={v}" for k, v in facts.items()), flush=True)
sys.stdin.read()
