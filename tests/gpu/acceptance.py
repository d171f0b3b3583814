"""The real-GPU acceptance suite: the wall as the host measures it, the views, the SM share
and the launch cost, with the node agent at its defaults and real CUDA software.

    tests/gpu/run.sh [--bundle DIR] [--limit MIB] [--sim] [--only ROW,...] [--markdown FILE]

It builds nothing: DIR (default target/release) holds gpuslice-agent, gpuslice,
libgpuslice.so and its fronts (scripts/gpu-bundle makes one, with a dbus-daemon for machines
that have none). It starts a private D-Bus and the agent on GPU 0 (the agent measures what a
context costs there), claims slices with `gpuslice claim` as a DRA plugin does, and runs each
client with the driver loaded as in a container: the fronts under the driver's sonames, the
library, and the host's driver under its private names, on LD_LIBRARY_PATH. What a process
holds is read from the host's nvidia-smi (NVML's per-process figure, outside any slice).

--sim runs the same on a simulated H100 (gpuslice-simnode, target/debug), to check the suite
itself where there is no GPU: clients the machine lacks are skipped there, and the SM share
uses a kernel that needs no cuBLAS. Prints one table; exits 1 if any row is out of bounds.
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WALL = ROOT / "tests/clients/wall.py"
WORK = ROOT / "tests/gpu/work.py"
MIB = 1 << 20
CHUNK = 16 * MIB
# Two of the agent's samples (--enforce-interval 1s): a client's start-up memory beyond the
# charged context is published by then, before it fills (one row fills at once instead).
SETTLE_S = 2.5
SM_LEVELS = (10, 30, 50, 70)
SM_TOLERANCE = 0.05
LAUNCH_TOLERANCE = 1.10

# Each client of the wall: row name, wall.py client, environment, and whether the wall is
# what stops it ("wall": refused within 1% below the slice as the host sees it) or the
# client's own limit within the slice ("within": the host sees no more than the slice).
CLIENTS = [
    ("torch", "torch", {}, "wall"),
    ("torch expandable_segments", "torch", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, "wall"),
    ("torch cudaMallocAsync", "torch", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, "wall"),
    ("cupy", "cupy", {}, "wall"),
    ("cupy async pool", "cupy-async", {}, "wall"),
    ("numba-cuda", "numba", {}, "wall"),
    ("cuda-bindings", "bindings", {}, "wall"),
    # Context limits the driver backs with device memory, raised step by step.
    ("cuda-bindings stack (cuCtxSetLimit)", "bindings", {"WALL_RAISE": "stack"}, "wall"),
    ("cuda-bindings malloc heap (cuCtxSetLimit)", "bindings", {"WALL_RAISE": "heap"}, "wall"),
    # Green contexts (drivers from 550): contexts made with part of the SMs, then cuMemAlloc.
    ("cuda-bindings green contexts (cuGreenCtxCreate)", "bindings", {"WALL_RAISE": "green"}, "wall"),
    # Modules whose global variables the driver allocates when it loads them.
    ("cuda-bindings module globals (cuModuleLoadData)", "bindings", {"WALL_RAISE": "module"}, "wall"),
    # JAX's allocator takes 75% of the memory it sees unless told otherwise: with its
    # defaults it stops at its own limit, inside the slice.
    ("jax defaults", "jax", {}, "within"),
    ("jax growing, all of the slice", "jax",
     {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_PYTHON_CLIENT_MEM_FRACTION": "1.0"}, "wall"),
    ("jax platform allocator", "jax", {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}, "wall"),
]
# The Python module each client needs (rows whose module is missing are skipped with --sim).
MODULES = {"torch": "torch", "cupy": "cupy", "cupy-async": "cupy", "numba": "numba",
           "bindings": "cuda.bindings", "jax": "jax", "nvml": "pynvml"}


def kv(line):
    return dict(p.split("=", 1) for p in line.split() if "=" in p)


class Table:
    def __init__(self):
        self.rows = []

    def add(self, check, result, bound, ok):
        """ok: True, False, or None for a figure with no bound."""
        self.rows.append((check, result, bound, {True: "pass", False: "FAIL", None: "info"}[ok]))
        print(f"{self.rows[-1][3]:4}  {check}: {result}  [{bound}]", flush=True)

    def failed(self):
        return sum(r[3] == "FAIL" for r in self.rows)

    def markdown(self):
        out = ["| check | result | bound | |", "|---|---|---|---|"]
        out += [f"| {c} | {r} | {b} | {s} |" for c, r, b, s in self.rows]
        return "\n".join(out)


class Node:
    """The driver (real or simulated), a private bus and the agent."""

    def __init__(self, args, work):
        self.work = work
        self.sim = args.sim
        self.bundle = Path(args.bundle).resolve()
        self.procs = []
        if args.sim:
            self.driver_root = self.simulated_node()
            self.driver_libs = self.driver_root / "usr/lib/x86_64-linux-gnu"
            self.smi = [str(self.driver_root / "usr/bin/nvidia-smi")]
            self.host_env = {**os.environ, "LD_LIBRARY_PATH": str(self.driver_libs)}
        else:
            self.driver_root = Path("/")
            self.driver_libs = None
            self.smi = ["nvidia-smi"]
            self.host_env = dict(os.environ)
        self.fronted = self.fronted_dir()
        self.bus = self.start_bus()
        self.start_agent()

    def simulated_node(self):
        simnode = ROOT / "target/debug/gpuslice-simnode"
        artefacts = ROOT / "target/debug"
        plain = self.work / "plain-node"
        subprocess.run([simnode, "create", "--root", plain, "--gpus", "1", "--model", "H100",
                        "--artefacts", artefacts, "--no-devices"], check=True,
                       stdout=subprocess.DEVNULL)
        spec = json.loads(subprocess.run([simnode, "show", "--root", plain], check=True,
                                         capture_output=True, text=True).stdout)
        root = self.work / "node"
        spec["state_dir"] = str(root / "run/gpuslice-sim")
        # Kernels take simulated time, so that the SM share has something to share.
        spec["gpus"][0]["kernel_ns_per_block"] = 1000
        (self.work / "node.json").write_text(json.dumps(spec))
        subprocess.run([simnode, "create", "--root", root, "--node", self.work / "node.json",
                        "--artefacts", artefacts], check=True, stdout=subprocess.DEVNULL)
        return root

    def driver_library(self, soname):
        if self.driver_libs:
            return self.driver_libs / soname
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if parts and parts[0] == soname and "x86-64" in line:
                return Path(parts[-1])
        sys.exit(f"{soname} is not in the dynamic linker's cache: no NVIDIA driver here")

    def fronted_dir(self):
        d = self.work / "lib"
        d.mkdir()
        (d / "libgpuslice.so").symlink_to(self.bundle / "libgpuslice.so")
        for soname, front, private in (
            ("libcuda.so.1", "libgpuslice_cuda.so", "libgpuslice-driver-cuda.so.1"),
            ("libnvidia-ml.so.1", "libgpuslice_nvml.so", "libgpuslice-driver-nvml.so.1"),
        ):
            # The front stands in for the soname and the development name, as in a container
            # (numba-cuda loads "libcuda.so" first: without it, the host's real driver would
            # answer by that name).
            (d / soname).symlink_to(self.bundle / front)
            (d / soname.removesuffix(".1")).symlink_to(self.bundle / front)
            (d / private).symlink_to(self.driver_library(soname))
        return d

    def spawn(self, argv, log, env=None):
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)
        self.procs.append(p)
        return p

    def start_bus(self):
        address = f"unix:path={self.work}/bus.socket"
        (self.work / "bus.conf").write_text(f"""<!DOCTYPE busconfig PUBLIC
 "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig><type>custom</type><listen>{address}</listen><auth>EXTERNAL</auth>
<policy context="default"><allow user="*"/><allow own="*"/>
<allow send_destination="*"/><allow receive_sender="*"/></policy></busconfig>
""")
        daemon, env = shutil.which("dbus-daemon"), None
        carried = self.bundle / "dbus/dbus-daemon"
        if carried.exists():
            daemon = str(carried)
            env = {**os.environ, "LD_LIBRARY_PATH": str(carried.parent)}
        if not daemon:
            sys.exit("no dbus-daemon: install dbus or use a bundle from scripts/gpu-bundle")
        self.spawn([daemon, "--nofork", f"--config-file={self.work}/bus.conf"],
                   open(self.work / "bus.log", "w"), env)
        wait_until(lambda: (self.work / "bus.socket").exists(), 10, "the D-Bus socket")
        return address

    def start_agent(self):
        self.run_dir = self.work / "run"
        argv = [self.bundle / "gpuslice-agent", "--driver-root", self.driver_root,
                "--state-dir", self.work / "state", "--run-dir", self.run_dir,
                "--bus-address", self.bus, "--metrics-address", "off", "--cdi-dir", "off",
                # The suite's claims are never activated: keep them for the whole run.
                "--pending-timeout", "1h"]
        self.agent_log = self.work / "agent.log"
        self.spawn([str(a) for a in argv], open(self.agent_log, "w"), self.host_env)
        wait_until(lambda: self.cli("status", "--json", check=False).returncode == 0, 60,
                   "the agent", self.agent_log)

    def cli(self, *args, check=True):
        p = subprocess.run([self.bundle / "gpuslice", *args], capture_output=True, text=True,
                           env={**self.host_env, "GPUSLICE_BUS_ADDRESS": self.bus})
        if check and p.returncode:
            sys.exit(f"gpuslice {' '.join(args)}: {p.stderr}\n{self.agent_log.read_text()}")
        return p

    def claim(self, name, memory_mib, cores=0):
        args = ["claim", name, "-a", f"gpuslice.io/memory={memory_mib}Mi"]
        if cores:
            args += ["-a", f"gpuslice.io/cores={cores}"]
        self.cli(*args)
        limits = self.run_dir / name / "limits"
        return limits, dict(l.split("=", 1) for l in limits.read_text().splitlines() if "=" in l)

    def release(self, name):
        self.cli("release", name, check=False)

    def env_in(self, limits, extra=None):
        """A process's environment in the slice whose limits file is `limits`."""
        env = {**os.environ, "GPUSLICE_LIMITS": str(limits), **(extra or {})}
        env["LD_LIBRARY_PATH"] = ":".join(
            p for p in (str(self.fronted), os.environ.get("LD_LIBRARY_PATH")) if p)
        return env

    def held_by(self):
        """What each process holds on GPU 0, as the host's nvidia-smi reports it (bytes)."""
        out = subprocess.run(self.smi + ["--query-compute-apps=pid,used_memory",
                                         "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, env=self.host_env, check=True)
        held = {}
        for line in out.stdout.splitlines():
            pid, used = (f.strip() for f in line.split(","))
            if used.isdigit():
                held[int(pid)] = int(used) * MIB
        return held

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)


def wait_until(ready, seconds, what, log=None):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.1)
    sys.exit(f"{what} did not come up in {seconds} s" + (f":\n{log.read_text()}" if log else ""))


class Client:
    """A wall.py process that has printed its line and holds what it allocated."""

    def __init__(self, node, py, argv, env, timeout=300):
        self.proc = subprocess.Popen([py, str(WALL), *argv], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env)
        self.line = read_line(self.proc, timeout)
        self.pid = self.proc.pid
        self.fields = kv(self.line)

    def finish(self):
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        return self.proc.stderr.read()[-2000:]


def read_line(proc, timeout):
    got = []
    t = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)
    t.start()
    t.join(timeout)
    line = got[0].strip() if got else ""
    if not line:
        proc.kill()
        err = proc.stderr.read()[-3000:]
        raise RuntimeError(f"no output within {timeout} s (exit {proc.wait()}): {err}")
    return line


def run_work(py, argv, env, timeout=120):
    p = subprocess.run([py, str(WORK), *argv], capture_output=True, text=True, env=env,
                       timeout=timeout)
    if p.returncode:
        raise RuntimeError(f"work.py {' '.join(argv)}: {p.stderr[-2000:]}")
    if os.environ.get("GPUSLICE_LOG"):
        print(p.stderr, file=sys.stderr)
    return kv(p.stdout)


def have(py, module):
    return subprocess.run([py, "-c", f"import {module}"], capture_output=True).returncode == 0


def mib(b):
    return f"{b / MIB:.0f} MiB"


def wall_rows(node, table, args):
    limit = args.limit * MIB
    limits, fields = node.claim("wall", args.limit)
    charged = int(fields["gpu.0.context_bytes"])
    table.add("context the agent measured and charges per context", mib(charged), "", None)
    env = node.env_in(limits)

    # A bare context: what the host sees a process hold that only made one.
    if have(args.python, "cuda.bindings"):
        c = Client(node, args.python, ["bindings", "hold", str(MIB)], env)
        held = node.held_by().get(c.pid, 0)
        c.finish()
        table.add("cuda-bindings, a context and 1 MiB, as the host sees it", mib(held),
                  f"≤ charged context + 1 MiB + 2 MiB rounding", held <= charged + 3 * MIB)

    for name, client, extra, stops in CLIENTS:
        bound = f"{mib(limit * 0.99)} – {mib(limit)}" if stops == "wall" else f"≤ {mib(limit)}"
        if args.only and name not in args.only:
            continue
        if not have(args.python, MODULES[client]):
            if args.sim:
                table.add(f"wall: {name}", "skipped: not installed here", bound, None)
                continue
        try:
            c = Client(node, args.python, [client, "peak", str(CHUNK)],
                       node.env_in(limits, {**extra, "WALL_SETTLE_S": str(SETTLE_S)}))
        except RuntimeError as e:
            table.add(f"wall: {name}", f"did not run: {e}", bound, False)
            continue
        held = node.held_by().get(c.pid, 0)
        f = c.fields
        err = c.finish()
        seen = int(f.get("total", 0))
        floor = limit * 0.99 if stops == "wall" else 0
        ok = f.get("error", "") != "" and floor <= held <= limit
        table.add(f"wall: {name}",
                  f"{f.get('error') or 'no error'} after {f.get('chunks')} × 16 MiB; host sees "
                  f"{mib(held)}; the client's total {mib(seen) if seen else '-'}",
                  bound, ok)
        if not ok and err:
            print(err)
        if client.startswith("torch") or client in ("cupy", "bindings"):
            table.add(f"view: {name} total memory", mib(seen), mib(limit), seen == limit)

    # A client filling at once, before the agent's periodic sample of it: its start-up beyond
    # the charged context is charged by the fresh sample the library asks for near the limit.
    if have(args.python, "torch") and (not args.only or "torch no settle" in args.only):
        c = Client(node, args.python, ["torch", "peak", str(CHUNK)], env)
        held = node.held_by().get(c.pid, 0)
        c.finish()
        table.add("wall: torch filling at once (no settle)", f"host sees {mib(held)}",
                  f"{mib(limit * 0.99)} – {mib(limit)}", limit * 0.99 <= held <= limit)

    # Two processes, one slice: one holds 60%, the other fills the rest.
    if have(args.python, "torch"):
        first = Client(node, args.python, ["torch", "hold", str(limit * 6 // 10)],
                       node.env_in(limits, {"WALL_SETTLE_S": str(SETTLE_S)}))
        second = Client(node, args.python, ["torch", "peak", str(CHUNK)],
                        node.env_in(limits, {"WALL_SETTLE_S": str(SETTLE_S)}))
        held = node.held_by()
        a, b = held.get(first.pid, 0), held.get(second.pid, 0)
        second.finish()
        first.finish()
        table.add("wall: two torch processes, one slice", f"host sees {mib(a)} + {mib(b)} = "
                  f"{mib(a + b)}; second: {second.fields.get('error')}", bound,
                  limit * 0.99 <= a + b <= limit)

    # What tools inside the slice see.
    out = subprocess.run(node.smi + ["--query-gpu=memory.total", "--format=csv,noheader,nounits",
                                     "-i", "0"], capture_output=True, text=True, env=env)
    smi = out.stdout.strip()
    table.add("view: nvidia-smi memory.total in the slice", f"{smi} MiB", f"{args.limit} MiB",
              smi == str(args.limit))
    if have(args.python, "pynvml"):
        c = Client(node, args.python, ["nvml", "fill", "0"], env)
        c.finish()
        total = int(c.fields.get("total", 0))
        table.add("view: NVML (pynvml) memory total in the slice", mib(total), mib(limit),
                  total == limit)
    node.release("wall")


class DeviceSampler:
    """The GPU's busy share (NVML's device utilization) and SM clock, sampled every 100 ms
    from the host while started; nothing where the harness has no pynvml."""

    def __init__(self, node):
        self.busy, self.clock, self.on = [], [], False
        try:
            import pynvml
            if node.driver_libs:
                import ctypes
                pynvml.nvmlLib = ctypes.CDLL(str(node.driver_libs / "libnvidia-ml.so.1"))
            pynvml.nvmlInit()
            self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # no pynvml here: the figures are left out
            self.nvml = None
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        while True:
            time.sleep(0.1)
            if self.on and self.nvml:
                try:
                    self.busy.append(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)
                    self.clock.append(self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM))
                except Exception:
                    pass

    def start(self):
        self.busy, self.clock, self.on = [], [], True

    def stop(self):
        self.on = False
        if not self.busy:
            return ""
        return (f"; GPU busy {statistics.mean(self.busy):.0f}%, SM clock "
                f"{statistics.median(self.clock):.0f} MHz")


def rates(py, kind, envs, sampler):
    """Runs `rate` once per environment, all at once; the device is sampled while they
    measure. Returns their rates and what the sampler saw."""
    procs = [subprocess.Popen([py, str(WORK), "rate", kind, "1", "5"], stdout=subprocess.PIPE,
                              stderr=None if os.environ.get("GPUSLICE_LOG") else subprocess.DEVNULL,
                              text=True, env=env) for env in envs]
    for p in procs:
        line = read_line(p, 120)
        if line != "measuring":
            raise RuntimeError(f"work.py rate: {line}")
    sampler.start()
    out = [kv(p.communicate(timeout=120)[0]) for p in procs]
    seen = sampler.stop()
    for p, o in zip(procs, out):
        if p.returncode or "per_s" not in o:
            raise RuntimeError(f"work.py rate exited {p.returncode}: {o}")
    return [float(o["per_s"]) for o in out], seen


NVCC_SLICE_MIB = 1024
NVCC_GLOBAL_MIB = 1536
# Local memory a thread of one kernel: at its launch the driver grows the stack to it for every
# thread that can be resident (4.1 GiB on an H100, 132 SMs of 2048 threads).
NVCC_LOCAL_BYTES = 16384


def nvcc_program(node, args, name, define):
    """tests/clients/kernels.cu built with `define`, as a CUDA program is: on a GPU machine by
    its nvcc (the toolkit's runtime, linked statically); on the simulated node by the
    reference nvcc 11.8, linked against the clients' CUDA 12 runtime (the 11 runtimes load a
    program's modules through the driver's private interface, which the library does not
    see: docs/interception.md). None where there is no nvcc."""
    source = ROOT / "tests/clients/kernels.cu"
    program = node.work / name
    if not args.sim:
        nvcc = shutil.which("nvcc")
        if not nvcc:
            return None
        subprocess.run([nvcc, "-arch=native", define, "-o", program, source], check=True,
                       capture_output=True)
        return program
    reference = os.environ.get("GPUSLICE_REFERENCE_DIR", str(Path.home() / ".cache/gpuslice/reference"))
    nvcc = Path(reference) / "bin/nvcc"
    prefix = subprocess.run([args.python, "-c", "import sys; print(sys.prefix)"],
                            capture_output=True, text=True).stdout.strip()
    runtimes = sorted(Path(prefix).glob("lib/python3*/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12"))
    if not nvcc.exists() or not runtimes:
        return None
    obj = node.work / f"{name}.o"
    subprocess.run([nvcc, "-arch=sm_90", define, "-c", "-o", obj, source], check=True,
                   capture_output=True)
    subprocess.run(["g++", obj, runtimes[0], f"-Wl,-rpath,{runtimes[0].parent}", "-o", program],
                   check=True, capture_output=True)
    return program


def nvcc_rows(node, table, args):
    """Programs that make the driver take memory through no allocation call, each in a slice
    it does not fit: a module declaring a global larger than the slice (the driver allocates
    it when the runtime has the module loaded) and a kernel whose threads need more local
    memory than the slice holds (the driver grows the context's stack at its launch). The
    library charges each before the driver is asked, so the launch is refused and the host
    never sees the process past its slice."""
    for check, name, define, key in (
            ("wall: nvcc-built program, a __device__ array larger than its slice",
             "kernels-extra", f"-DEXTRA_GLOBAL_BYTES={NVCC_GLOBAL_MIB * MIB}", "launch"),
            ("wall: nvcc-built program, a kernel's local memory larger than its slice",
             "kernels-local", f"-DLOCAL_ARRAY_BYTES={NVCC_LOCAL_BYTES}", "local")):
        bound = f"that launch refused; host sees ≤ {NVCC_SLICE_MIB} MiB"
        program = nvcc_program(node, args, name, define)
        if program is None:
            table.add(check, "skipped: no nvcc here", bound, None if args.sim else False)
            continue
        limits, _ = node.claim("nvcc", NVCC_SLICE_MIB)
        try:
            p = subprocess.Popen([program, str(CHUNK), "hold"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=node.env_in(limits))
            line = read_line(p, 120)
            held = node.held_by().get(p.pid, 0)
            p.stdin.close()
            p.wait(60)
            f = kv(line)
            ok = f.get(key) not in (None, "cudaSuccess") and held <= NVCC_SLICE_MIB * MIB
            table.add(check, f"{key} {f.get(key)}, then {f.get('chunks')} × 16 MiB; host sees "
                      f"{mib(held)}", bound, ok)
        finally:
            node.release("nvcc")


def sm_rows(node, table, args):
    """The SM share: the rate of compute-bound kernels in a slice against their rate alone
    without the library, over 5 s after a 1 s warm-up. The GPU's busy share and SM clock are
    shown beside: the share is held on the driver's measure of busy time, and a GPU that is
    less busy may run its SMs at a higher clock."""
    kind = "scale" if args.sim else "matmul"
    py = args.python
    sampler = DeviceSampler(node)
    base_env = node.host_env
    (free,), seen = rates(py, kind, [base_env], sampler)
    table.add("SM share: unlimited rate", f"{free:.1f} {kind}/s{seen}", "", None)
    for cores in SM_LEVELS:
        limits = node.claim(f"sm{cores}", 1024, cores)[0]
        (rate,), seen = rates(py, kind, [node.env_in(limits)], sampler)
        node.release(f"sm{cores}")
        share = rate / free
        table.add(f"SM share: cores {cores}, alone", f"{share:.3f} of the rate{seen}",
                  f"{(cores - 5) / 100:.2f} – {(cores + 5) / 100:.2f}",
                  abs(share - cores / 100) <= SM_TOLERANCE)
    # Two tenants at once, 30 and 70.
    slices = {c: node.claim(f"sm{c}", 1024, c)[0] for c in (30, 70)}
    both, seen = rates(py, kind, [node.env_in(slices[c]) for c in slices], sampler)
    for c, rate in zip(slices, both):
        share = rate / free
        table.add(f"SM share: cores {c}, beside cores {100 - c}", f"{share:.3f} of the rate{seen}",
                  f"{(c - 5) / 100:.2f} – {(c + 5) / 100:.2f}", abs(share - c / 100) <= SM_TOLERANCE)
    for c in slices:
        node.release(f"sm{c}")
    (after,), _ = rates(py, kind, [base_env], sampler)
    table.add("SM share: unlimited rate afterwards", f"{after:.1f} {kind}/s", "", None)


def launch_rows(node, table, args):
    limits = node.claim("launch", 1024)[0]
    base_env = node.host_env
    plain, ours = [], []
    for _ in range(3):
        for times, env, which in ((plain, base_env, "without the library"),
                                  (ours, node.env_in(limits), "with the library")):
            try:
                times.append(float(run_work(args.python, ["launch", "20000", "5"], env)["ns_per_launch"]))
            except RuntimeError as e:
                raise RuntimeError(f"{which}: {e}") from e
    p, o = statistics.median(plain), statistics.median(ours)
    table.add("launch cost (torch add_ on 16 floats)", f"{o:.0f} ns with the library, {p:.0f} ns "
              f"without: ratio {o / p:.3f}", f"≤ {LAUNCH_TOLERANCE:.2f}", o / p <= LAUNCH_TOLERANCE)
    node.release("launch")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", default=str(ROOT / "target/release"))
    ap.add_argument("--limit", type=int, default=4096, help="the wall's slice, MiB")
    ap.add_argument("--sim", action="store_true", help="a simulated H100 instead of GPU 0")
    ap.add_argument("--python", default=sys.executable, help="the clients' python")
    ap.add_argument("--only", type=lambda s: set(s.split(",")), default=None,
                    help="wall rows to run (names as in the table); nvcc, sm, launch for those parts")
    ap.add_argument("--markdown", help="also write the table here, in Markdown")
    args = ap.parse_args()
    if args.sim:
        args.bundle = str(ROOT / "target/debug") if args.bundle == str(ROOT / "target/release") else args.bundle
    table = Table()
    with tempfile.TemporaryDirectory(prefix="gpuslice-gpu-") as tmp:
        node = Node(args, Path(tmp))
        try:
            if not args.sim:
                out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.reserved",
                                      "--format=csv,noheader", "-i", "0"], capture_output=True, text=True)
                table.add("GPU 0", out.stdout.strip(), "", None)
            parts = [("wall", wall_rows), ("nvcc", nvcc_rows), ("sm", sm_rows),
                     ("launch", launch_rows)]
            for name, part in parts:
                if args.only and name != "wall" and name not in args.only:
                    continue
                if name == "wall" and args.only and not (args.only & ({c[0] for c in CLIENTS} | {"torch no settle"})):
                    continue
                try:
                    part(node, table, args)
                except Exception as e:  # one part failing still prints the others
                    table.add(name, f"did not run: {e}", "", False)
        finally:
            node.stop()
            log = node.agent_log.read_text()
            if args.markdown:
                Path(args.markdown).with_name("agent.log").write_text(log)
            if table.failed():
                print("--- agent log (last 40 lines)\n" + "\n".join(log.splitlines()[-40:]))
    print()
    print(table.markdown())
    if args.markdown:
        Path(args.markdown).write_text(table.markdown() + "\n")
    print(f"\n{table.failed()} row(s) out of bounds")
    return 1 if table.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
