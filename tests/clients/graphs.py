"""CUDA graphs as NVIDIA's cuda.core builds them: by capture (GraphBuilder: work split over
two streams and joined, an `if` node taken and a `while` node whose condition starts false,
whose bodies are captured into the conditional node's graphs) and explicitly (GraphDef:
kernel nodes with dependency edges, read back as edges and as each node's predecessors and
successors, with the kernels' arguments tied to the graph by user objects).

Usage: graphs.py cuda.core
Prints key=value pairs on one line: split_join, if_cond, while_loop (1 once each graph ran),
edges (GraphDef's edge count), pred, succ (the first node's predecessors and successors),
joined (edges once a join node is added), ran (1 once the GraphDef's executable graph ran).
"""
import gc
import sys

import numpy as np

SOURCE = r"""
extern "C" __global__ void k(float* a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] += 1;
}
"""


def main():
    from cuda.core import Device, GraphDef, LaunchConfig, Program, ProgramOptions, launch

    if sys.argv[1:] != ["cuda.core"]:
        sys.exit(__doc__)
    dev = Device(0)
    dev.set_current()
    s = dev.create_stream()
    options = ProgramOptions(arch=f"sm_{dev.arch}")
    k = Program(SOURCE, code_type="c++", options=options).compile("cubin").get_kernel("k")
    config = LaunchConfig(grid=1, block=32)
    buf = dev.allocate(4096, stream=s)
    s.sync()
    facts = {}

    gb = s.create_graph_builder().begin_building()
    launch(gb, config, k, buf, np.int32(32))
    left, right = gb.split(2)
    launch(left, config, k, buf, np.int32(32))
    launch(right, config, k, buf, np.int32(32))
    joined = type(gb).join(left, right)
    joined.end_building().complete().launch(s)
    s.sync()
    facts["split_join"] = 1
    # Each builder is done with before the next captures on the stream (a builder dropped
    # later would end that capture).
    del gb, left, right, joined
    gc.collect()

    for kind, start in (("if_cond", 1), ("while_loop", 0)):
        gb = s.create_graph_builder().begin_building()
        handle = gb.create_conditional_handle(default_value=start)
        body = getattr(gb, kind)(handle)
        body.begin_building()
        launch(body, config, k, buf, np.int32(32))
        body.end_building()
        gb.end_building().complete().launch(s)
        s.sync()
        facts[kind] = 1
        del gb, body
        gc.collect()

    g = GraphDef()
    first = g.launch(config, k, buf, np.int32(32))
    first.launch(config, k, buf, np.int32(32))
    facts["edges"] = len(g.edges())
    facts["pred"], facts["succ"] = len(first.pred), len(first.succ)
    g.join(*g.nodes())
    facts["joined"] = len(g.edges())
    g.instantiate().launch(s)
    s.sync()
    facts["ran"] = 1
    del g, first
    gc.collect()
    buf.close(s)
    print(" ".join(f"{k}={v}" for k, v in facts.items()))


if __name__ == "__main__":
    main()
