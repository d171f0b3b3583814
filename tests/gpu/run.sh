#!/usr/bin/env bash
# The interception library on a real GPU, with PyTorch. Needs an NVIDIA GPU with its driver,
# python3 with torch (CUDA build), and either cargo (to build the library and its fronts) or
# LIBGPUSLICE pointing at a built libgpuslice.so with libgpuslice_cuda.so and
# libgpuslice_nvml.so beside it. Uses GPU 0; run it on an otherwise idle GPU. The driver is
# loaded as in a container: a directory on LD_LIBRARY_PATH holds the fronts under the driver's
# sonames, the library, and the host's real driver libraries under their private names.
#
#   tests/gpu/run.sh [LIMIT_MIB]        (default 4096)
#
# Checks, each printed as PASS or FAIL with the figures:
#  1. PyTorch allocating 64 MiB, then 1 MiB tensors under a LIMIT_MIB slice stops with
#     torch.cuda.OutOfMemoryError within 1% below the limit, never above it;
#  2. torch.cuda.mem_get_info() and nvidia-smi report the slice;
#  3. two processes share the one limit: together they never hold more than it;
#  4. kernel launches (small torch ops) with and without the library, ns per launch;
#  5. the SM share: matrix products in a slice with cores=30 run at 20-45% of their rate
#     without the library (the GPU is the bottleneck, so the rate follows the SM time).
set -uo pipefail
cd "$(dirname "$0")/../.."
limit_mib=${1:-4096}
limit=$((limit_mib << 20))
py=${PYTHON:-python3}
here=tests/gpu
fails=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
kv() { tr ' ' '\n' | sed -n "s/^$1=//p"; }

lib=${LIBGPUSLICE:-}
if [[ -z $lib ]]; then
    cargo build --release -p gpuslice-shim -p gpuslice-front-cuda -p gpuslice-front-nvml --quiet || exit 1
    lib=$PWD/target/release/libgpuslice.so
fi
real_lib() { ldconfig -p | awk -v n="$1" '$1 == n && /x86-64|AArch64/ { print $NF; exit }'; }
nvidia-smi -L || exit 1
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0)
$py -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))' || exit 1

# The context reservation: what one PyTorch process takes before allocating anything.
card=$($py "$here/torch_wall.py" context)
context=$(($(kv total <<<"$card") - $(kv free <<<"$card")))
busy=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0)
echo "card: $(kv total <<<"$card") bytes; one process's context and the card's other use: $context bytes (nvidia-smi used now: ${busy} MiB)"
# Charge a measured context, less what the card already used before this process.
ctx=$((context - busy * 1048576 > 0 ? context - busy * 1048576 : 0))

slice=$(mktemp -d /tmp/gpuslice-gpu.XXXXXX)
trap 'rm -rf "$slice"' EXIT
cat >"$slice/limits" <<LIMITS
version=1
container_id=gpu-test
gpus=1
gpu.0.uuid=$uuid
gpu.0.memory_bytes=$limit
gpu.0.cores=0
gpu.0.context_bytes=$ctx
LIMITS
fronted=$slice/lib
mkdir "$fronted"
ln -s "$lib" "$fronted/libgpuslice.so"
ln -s "$(dirname "$lib")/libgpuslice_cuda.so" "$fronted/libcuda.so.1"
ln -s "$(dirname "$lib")/libgpuslice_nvml.so" "$fronted/libnvidia-ml.so.1"
ln -s "$(real_lib libcuda.so.1)" "$fronted/libgpuslice-driver-cuda.so.1" || exit 1
ln -s "$(real_lib libnvidia-ml.so.1)" "$fronted/libgpuslice-driver-nvml.so.1" || exit 1
libs=$fronted${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
under() { LD_LIBRARY_PATH=$libs GPUSLICE_LIMITS=$slice/limits "$@"; }
echo "slice: $limit_mib MiB, context charged: $((ctx >> 20)) MiB"

# 1. The wall.
out=$(under $py "$here/torch_wall.py" fill 64)
echo "fill: $out"
reserved=$(kv reserved <<<"$out")
held=$((reserved + ctx))
if [[ $(kv error <<<"$out") == OutOfMemoryError ]] && ((held <= limit)) && ((held * 100 >= limit * 99)); then
    pass "wall: OutOfMemoryError with $((held >> 20)) MiB held of $limit_mib MiB (PyTorch reserved $((reserved >> 20)) MiB + context)"
else
    fail "wall: error=$(kv error <<<"$out"), held $held of $limit"
fi

# 2. What PyTorch and nvidia-smi see.
out=$(under $py "$here/torch_wall.py" info)
echo "info: $out"
if [[ $(kv total <<<"$out") == "$limit" && $(kv total_memory <<<"$out") == "$limit" ]]; then
    pass "mem_get_info total = get_device_properties total_memory = $limit"
else
    fail "mem_get_info/total_memory: $out"
fi
smi=$(under nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0)
if [[ $smi == "$limit_mib" ]]; then pass "nvidia-smi memory.total = $smi MiB"; else fail "nvidia-smi memory.total = $smi MiB"; fi

# 3. Two processes, one limit.
coproc HOLDER { under $py "$here/torch_wall.py" hold $((limit_mib * 6 / 10)); }
read -r line <&"${HOLDER[0]}"
echo "holder: $line"
out=$(under $py "$here/torch_wall.py" fill 64)
echo "second: $out"
second=$(($(kv reserved <<<"$out") + ctx))
first=$(((limit_mib * 6 / 10 << 20) + ctx))
exec {HOLDER[1]}>&-
wait "$HOLDER_PID" 2>/dev/null
if [[ $(kv error <<<"$out") == OutOfMemoryError ]] && ((first + second <= limit)); then
    pass "shared: $((first >> 20)) + $((second >> 20)) MiB held together, limit $limit_mib MiB"
else
    fail "shared: $((first >> 20)) + $((second >> 20)) MiB held together, limit $limit_mib MiB"
fi

# 4. Launch cost, alternating, five runs each.
plain=() ours=()
for _ in 1 2 3 4 5; do
    plain+=("$($py "$here/torch_wall.py" launch 20000 | kv ns_per_launch)")
    ours+=("$(under $py "$here/torch_wall.py" launch 20000 | kv ns_per_launch)")
done
median() { printf '%s\n' "$@" | sort -g | sed -n 3p; }
p=$(median "${plain[@]}") o=$(median "${ours[@]}")
echo "launch: without ${plain[*]} ns; with ${ours[*]} ns"
echo "INFO kernel launch (torch add_ on 16 floats, median of 5 x 20000): without $p ns, with $o ns, ratio $(awk "BEGIN { printf \"%.3f\", $o / $p }")"

# 5. The SM share.
sed 's/^gpu.0.cores=0$/gpu.0.cores=30/' "$slice/limits" >"$slice/limits-30"
free_rate=$($py "$here/torch_wall.py" matmul 5 | kv matmuls_per_s)
paced_rate=$(LD_LIBRARY_PATH=$libs GPUSLICE_LIMITS=$slice/limits-30 $py "$here/torch_wall.py" matmul 5 | kv matmuls_per_s)
ratio=$(awk "BEGIN { printf \"%.3f\", $paced_rate / $free_rate }")
if awk "BEGIN { exit !($ratio >= 0.20 && $ratio <= 0.45) }"; then
    pass "SM share 30%: $paced_rate matmuls/s against $free_rate without the library (ratio $ratio)"
else
    fail "SM share 30%: $paced_rate matmuls/s against $free_rate without the library (ratio $ratio)"
fi

echo "$fails check(s) failed"
exit $((fails > 0))
