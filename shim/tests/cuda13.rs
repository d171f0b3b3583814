//! Real CUDA 13 software behind the wall: what `pip install cuda-bindings cupy-cuda13x
//! numba-cuda[cu13]` gives today (installed by `scripts/cuda-clients cuda13`) on a simulated
//! node standing for NVIDIA's driver 580 (CUDA 13.0), in a slice of its H100, each context
//! charged what one takes there. NVIDIA's CUDA 13.5 runtime (`libcudart.so.13`, through
//! ctypes, and inside cuda-bindings), CuPy (whose own runtime is CUDA 13.2), numba-cuda (its
//! kernels compiled by NVVM 13) and cuda-bindings' driver API each see the slice in their own
//! memory query and meet their own out-of-memory error at the limit; contexts a tenant makes
//! through cuda-bindings 13 are charged, and the host's NVML sees the process within its slice. Before the simulated
//! driver modelled a 580 driver, these runtimes refused to start (`cudaErrorInsufficientDriver`
//! on a 550 driver is what a real one answers too). Each run's unmodelled driver calls are
//! listed in the test output.

mod common;

use std::path::PathBuf;

use common::{Facts, MIB, Slice, client_facts, cuda13_python};
use gpuslice_testsupport::sim::SimNode;

const GIB: u64 = 1 << 30;

/// A 2 GiB slice of an H100 of a node with driver 580.
fn slice() -> Slice {
    Slice::on(SimNode::with_driver(2, "H100", "580.95.05"), 2 * GIB)
}

/// NVIDIA's CUDA 13 runtime, from the CUDA 13 clients' environment.
fn runtime13() -> PathBuf {
    let venv = cuda13_python()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    std::fs::read_dir(venv.join("lib"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| {
            e.path()
                .join("site-packages/nvidia/cu13/lib/libcudart.so.13")
        })
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("no libcudart.so.13 in {}", venv.display()))
}

/// Runs `wall.py CLIENT fill CHUNK [API]` in `slice` with the CUDA 13 clients' python, to
/// success; prints its unmodelled driver calls.
fn fill(slice: &Slice, args: &[&str]) -> Facts {
    run_client(slice, "wall.py", args)
}

/// Runs `tests/clients/<script>` with `args` in `slice` with the CUDA 13 clients' python, to
/// success; prints its unmodelled driver calls.
fn run_client(slice: &Slice, script: &str, args: &[&str]) -> Facts {
    let first = args.first().copied().unwrap_or(script);
    let name = first.rsplit('/').next().unwrap_or(first);
    client_facts(slice, &cuda13_python(), script, args, name)
}

/// The client saw the slice as its device's memory, filled what its context leaves of it in
/// `chunk`s, and met `error` at the next.
fn assert_filled(slice: &Slice, f: &Facts, chunk: u64, error: &str) {
    assert_eq!(f.num("total"), slice.limit, "{:?}", f.0);
    let room = slice.limit - slice.context_bytes;
    assert!(
        f.num("free") <= room && f.num("free") > room - chunk,
        "{:?}",
        f.0
    );
    assert_eq!(f.num("chunks"), room / chunk, "{:?}", f.0);
    assert_eq!(f.get("error"), error, "{:?}", f.0);
}

#[test]
fn the_cuda_13_runtime_meets_the_wall_by_cuda_malloc_and_by_its_stream_ordered_pool() {
    let slice = slice();
    let runtime = format!("runtime:{}", runtime13().display());
    for api in ["malloc", "async"] {
        let f = fill(&slice, &[&runtime, "fill", &(128 * MIB).to_string(), api]);
        assert_filled(&slice, &f, 128 * MIB, "cudaErrorMemoryAllocation");
    }
}

#[test]
fn cuda_bindings_13_sees_its_slice_and_gets_out_of_memory_at_the_limit() {
    let slice = slice();
    let f = fill(&slice, &["bindings", "fill", &(128 * MIB).to_string()]);
    assert_filled(&slice, &f, 128 * MIB, "CUDA_ERROR_OUT_OF_MEMORY");
}

#[test]
fn cupy_for_cuda_13_sees_its_slice_and_its_pool_stops_at_the_limit() {
    let slice = slice();
    let f = fill(&slice, &["cupy", "fill", &(128 * MIB).to_string()]);
    assert_filled(&slice, &f, 128 * MIB, "OutOfMemoryError");
}

#[test]
fn numba_cuda_13_compiles_and_launches_a_kernel_then_meets_the_wall() {
    let slice = slice();
    let f = fill(&slice, &["numba-jit", "fill", &(128 * MIB).to_string()]);
    assert_filled(
        &slice,
        &f,
        128 * MIB,
        "CudaAPIError:CUDA_ERROR_OUT_OF_MEMORY",
    );
}

#[test]
fn contexts_made_through_cuda_bindings_13_are_charged_and_the_host_sees_the_process_within_its_slice()
 {
    // A tenant making contexts to hold device memory the allocation calls do not show:
    // cuda-bindings 13 reaches cuCtxCreate_v4, which the library charges each context's cost.
    let slice = slice();
    let f = run_client(&slice, "contexts.py", &[]);
    let fit = slice.limit / slice.context_bytes;
    assert_eq!(f.num("contexts"), fit, "{:?}", f.0);
    assert_eq!(
        f.get("context_error"),
        "CUDA_ERROR_OUT_OF_MEMORY",
        "{:?}",
        f.0
    );
    let room = slice.limit - fit * slice.context_bytes;
    assert_eq!(f.num("free"), room, "{:?}", f.0);
    assert_eq!(f.num("chunks"), room / (64 * MIB), "{:?}", f.0);
    // What the host's NVML says the process holds: its contexts and allocations, within the
    // slice.
    let held = fit * slice.context_bytes + f.num("chunks") * 64 * MIB;
    assert_eq!(f.num("host_used"), held, "{:?}", f.0);
    assert!(held <= slice.limit, "{:?}", f.0);
}

#[test]
fn memory_from_the_hosts_pools_by_location_is_not_charged_and_a_gpu_pool_named_the_hosts_is() {
    // CUDA 13 names pools by location. The host's default pool, its current one (the default
    // until one is set) and a host pool of the tenant's own made current there give out
    // page-locked host memory: 16 chunks of 64 MiB, and the GPU still has all that the
    // context leaves of the slice. Before the simulated driver answered host locations, each
    // was CUDA_ERROR_NOT_SUPPORTED there, and the library's handling of them never ran.
    let slice = slice();
    let program = common::compile(&slice.sim, "host_pool");
    let chunk = (64 * MIB).to_string();
    let run = |mode: &str| slice.facts(&program, &[mode, &chunk, "16"]);
    let left = slice.remaining() / MIB;
    for mode in ["default13", "current13", "set13"] {
        let f = run(mode);
        assert_eq!(
            (f.num("host"), f.num("device")),
            (16, left),
            "{mode}: {:?}",
            f.0
        );
    }
    // A pool on the GPU named as the host's current pool: the driver refuses it
    // (CUDA_ERROR_INVALID_VALUE, as cuda.h says), and the GPU's pool is charged all the same.
    let f = run("forged13");
    assert_eq!((f.get("set"), f.num("device")), ("1", left), "{:?}", f.0);
    assert_eq!(slice.usage().totals(), vec![0]);
}

#[test]
fn cuda_cores_pinned_memory_resources_take_host_memory_and_leave_the_slice_to_the_gpu() {
    // NVIDIA's cuda.core: its PinnedMemoryResource on the host's current pool, on a pool of
    // its own on the host, and on one on host NUMA node 0, 16 × 64 MiB each; then its
    // DeviceMemoryResource gets all that the context leaves of the slice, in those chunks.
    // Before the simulated driver offered host pools (HOST_MEMORY_POOLS_SUPPORTED 0, host
    // locations not answered), cuda.core refused the first two outright.
    let slice = slice();
    let chunks = (slice.remaining() / (64 * MIB)) * 64;
    for mode in ["current", "host", "numa"] {
        let f = run_client(
            &slice,
            "host_pools.py",
            &[mode, &(64 * MIB).to_string(), "16"],
        );
        assert_eq!(
            (f.num("pinned"), f.num("device")),
            (16, chunks),
            "{mode}: {:?}",
            f.0
        );
    }
    assert_eq!(slice.usage().totals(), vec![0]);
}
