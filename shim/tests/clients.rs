//! Real CUDA software behind the wall on the simulated node: NVIDIA's CUDA runtime 12.9
//! (`libcudart.so.12`) and Debian's CUDA 11.8 runtime (`libcudart.so.11.0`), cuda-bindings,
//! numba-cuda and nvidia-ml-py (installed by `scripts/cuda-clients` and
//! `scripts/reference-driver`) each see the slice in their own memory query and meet their own
//! out-of-memory error at the limit; two processes of one slice share it; cuda-bindings'
//! conditional graphs meet the wall and the share's refusals; PyTorch, CuPy and numba-cuda copy
//! through page-locked host memory, which the slice does not count; CuPy and PyTorch share
//! device memory between processes of a slice; RAPIDS' memory manager meets the wall through
//! each of its memory resources. Each run's
//! unmodelled driver calls are listed in the test output.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{
    Facts, MIB, Slice, cache_dir, client_facts, client_script, print_unmodelled, python,
    script_output, torch_python,
};

const GIB: u64 = 1 << 30;

/// NVIDIA's CUDA 12 runtime, from the clients' environment.
fn runtime12() -> PathBuf {
    let venv = python().parent().unwrap().parent().unwrap().to_path_buf();
    let lib = std::fs::read_dir(venv.join("lib"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| {
            e.path()
                .join("site-packages/nvidia/cuda_runtime/lib/libcudart.so.12")
        })
        .find(|p| p.exists());
    lib.unwrap_or_else(|| {
        panic!(
            "no libcudart.so.12 in {}: run scripts/cuda-clients",
            venv.display()
        )
    })
}

fn reference_dir() -> PathBuf {
    std::env::var_os("GPUSLICE_REFERENCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("reference"))
}

/// Debian's CUDA 11.8 runtime, from `scripts/reference-driver`'s cache.
fn runtime11() -> PathBuf {
    let lib = reference_dir().join("driver/usr/lib/x86_64-linux-gnu/libcudart.so.11.0");
    assert!(
        lib.exists(),
        "{} is missing: run scripts/reference-driver (scripts/test does)",
        lib.display()
    );
    lib
}

fn script() -> PathBuf {
    client_script("wall.py")
}

fn client(slice: &Slice, log: &Path, args: &[&str]) -> Command {
    let python = if matches!(args[0], "torch" | "onnxruntime") {
        torch_python()
    } else {
        python()
    };
    let mut c = slice.command(&python);
    c.arg(script())
        .args(args)
        .env("GPUSLICE_SIM_UNMODELLED_LOG", log);
    c
}

/// Runs one client to its end; prints its unmodelled driver calls.
fn fill(slice: &Slice, name: &str, chunk: u64) -> Facts {
    fill_with(slice, name, chunk, "malloc")
}

fn fill_with(slice: &Slice, name: &str, chunk: u64, api: &str) -> Facts {
    fill_in(slice, name, chunk, api, &[])
}

/// As [`fill_with`], with more of the environment.
fn fill_in(slice: &Slice, name: &str, chunk: u64, api: &str, env: &[(&str, &str)]) -> Facts {
    let log = slice.dir.path().join(format!("unmodelled-{api}.log"));
    let out = client(slice, &log, &[name, "fill", &chunk.to_string(), api])
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{name}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    print_unmodelled(name, &log);
    Facts::parse(&text)
}

/// Runs `tests/clients/<script>` with `args` (the first the client: `torch` runs in PyTorch's
/// environment) in `slice` to its end, which must be a success; prints its unmodelled driver
/// calls and returns what it printed.
fn script_facts(slice: &Slice, script: &str, args: &[&str]) -> Facts {
    let python = if args[0] == "torch" {
        torch_python()
    } else {
        python()
    };
    let name = format!("{}-{}", script.trim_end_matches(".py"), args[0]);
    client_facts(slice, &python, script, args, &name)
}

#[test]
fn pytorch_cupy_and_numba_copy_through_page_locked_memory_which_takes_nothing_of_the_slice() {
    let slice = Slice::new(GIB, 0);
    for client in ["torch", "cupy", "numba"] {
        let f = script_facts(&slice, "pinned.py", &[client, &(4 * MIB).to_string()]);
        let what = format!("{client}: {:?}", f.0);
        assert_eq!((f.get("pinned"), f.get("same")), ("1", "1"), "{what}");
        assert_eq!(f.num("taken"), 0, "{what}");
    }
    assert_eq!(slice.usage().totals(), vec![0]);
}

#[test]
fn cuda_core_reads_its_kernels_parameter_layouts_from_cubin_and_ptx_in_a_slice() {
    let slice = Slice::new(GIB, 0);
    let f = script_facts(&slice, "params.py", &["cuda.core"]);
    // C's layout: each parameter at the next offset its alignment allows (the structure
    // { char; double; } is 16 bytes aligned to 8, float4 16 aligned to 16).
    for kind in ["cubin", "ptx"] {
        let what = format!("{kind}: {:?}", f.0);
        assert_eq!(
            f.get(&format!("{kind}_scalars")),
            "0:8,8:8,16:4,24:8,32:1,34:2,40:8",
            "{what}"
        );
        assert_eq!(
            f.get(&format!("{kind}_aggregates")),
            "0:16,16:16,32:4",
            "{what}"
        );
        assert_eq!(f.get(&format!("{kind}_none")), "0", "{what}");
    }
    assert_eq!(f.get("launched"), "1", "{:?}", f.0);
}

#[test]
fn cuda_core_builds_graphs_by_capture_with_conditional_nodes_and_by_edges_in_a_slice() {
    let slice = Slice::new(GIB, 0);
    let f = script_facts(&slice, "graphs.py", &["cuda.core"]);
    let what = format!("{:?}", f.0);
    for built in ["split_join", "if_cond", "while_loop", "ran"] {
        assert_eq!(f.get(built), "1", "{built}: {what}");
    }
    // Two kernel nodes, the second after the first; a join node after both.
    assert_eq!(f.num("edges"), 1, "{what}");
    assert_eq!((f.num("pred"), f.num("succ")), (0, 1), "{what}");
    assert_eq!(f.num("joined"), 3, "{what}");
}

#[test]
fn cupy_and_pytorch_share_device_memory_between_processes_of_a_slice_charged_to_the_exporter() {
    let slice = Slice::new(GIB, 0);
    for client in ["cupy", "torch"] {
        let f = script_facts(&slice, "ipc.py", &[client, &(4 * MIB).to_string()]);
        let what = format!("{client}: {:?}", f.0);
        assert_eq!((f.get("seen"), f.get("written_back")), ("1", "1"), "{what}");
        assert_eq!(f.get("closed"), "1", "{what}");
        // The opener's slice shows nothing more taken: the memory is the exporter's.
        assert_eq!(f.num("opener_taken"), 0, "{what}");
    }
    assert_eq!(slice.usage().totals(), vec![0]);
}

#[test]
fn cuda_bindings_sees_its_slice_and_gets_out_of_memory_at_the_limit() {
    let slice = Slice::new(GIB, 0);
    let f = fill(&slice, "bindings", 64 * MIB);
    assert_eq!(f.num("total"), GIB, "{:?}", f.0);
    assert_eq!(f.num("free"), GIB, "{:?}", f.0);
    assert_eq!(f.num("chunks"), 16, "{:?}", f.0);
    assert_eq!(f.get("error"), "CUDA_ERROR_OUT_OF_MEMORY", "{:?}", f.0);
    // Memory exported as file descriptors or dma-bufs is refused in a slice, and the
    // attributes cuda-bindings reads say so (the simulated GPU reports both supported).
    assert_eq!(f.get("posix_fd_handles"), "0", "{:?}", f.0);
    assert_eq!(f.get("dma_buf"), "0", "{:?}", f.0);
}

#[test]
fn numba_sees_its_slice_and_gets_out_of_memory_at_the_limit() {
    let slice = Slice::new(GIB, 0);
    let f = fill(&slice, "numba", 100 * MIB);
    assert_eq!(f.num("total"), GIB, "{:?}", f.0);
    assert_eq!(f.num("free"), GIB, "{:?}", f.0);
    // 10 arrays of 100 MiB fit in 1 GiB; the 11th does not.
    assert_eq!(f.num("chunks"), 10, "{:?}", f.0);
    assert_eq!(
        f.get("error"),
        "CudaAPIError:CUDA_ERROR_OUT_OF_MEMORY",
        "{:?}",
        f.0
    );
}

#[test]
fn a_numba_kernel_whose_local_array_does_not_fit_its_slice_is_refused_at_its_launch() {
    // `cuda.local.array(4096, int32)`: 16 KiB a thread, compiled by NVVM and linked by
    // nvJitLink into a real cubin; its launch makes the driver grow the stack by about 600 MiB
    // for the T4's 40960 resident threads. It runs in a 1 GiB slice, leaving room for fewer
    // 100 MiB chunks than without it (4, not 10); in a 512 MiB slice the launch fails with the
    // driver's out-of-memory error and the allocations after still get the whole slice.
    let local = [("WALL_LOCAL_INTS", "4096")];
    let roomy = Slice::new(GIB, 0);
    let f = fill_in(&roomy, "numba-jit", 100 * MIB, "malloc", &local);
    assert_eq!(f.get("local"), "ok", "{:?}", f.0);
    assert_eq!(f.num("chunks"), 4, "{:?}", f.0);
    let small = Slice::new(512 * MIB, 0);
    let f = fill_in(&small, "numba-jit", 100 * MIB, "malloc", &local);
    assert_eq!(
        f.get("local"),
        "CUDAError:CUDA_ERROR_OUT_OF_MEMORY",
        "{:?}",
        f.0
    );
    assert_eq!(f.num("chunks"), 5, "{:?}", f.0);
}

#[test]
fn numba_compiles_loads_and_launches_a_kernel_behind_the_wall() {
    let slice = Slice::new(GIB, 0);
    let f = fill(&slice, "numba-jit", 100 * MIB);
    assert_eq!(f.get("launched"), "1", "{:?}", f.0);
    assert_eq!(f.num("total"), GIB, "{:?}", f.0);
    assert_eq!(f.num("chunks"), 10, "{:?}", f.0);
    assert_eq!(
        f.get("error"),
        "CudaAPIError:CUDA_ERROR_OUT_OF_MEMORY",
        "{:?}",
        f.0
    );
}

#[test]
fn nvidia_ml_py_reports_the_slice_as_the_devices_memory() {
    let slice = Slice::new(GIB, 0);
    let f = fill(&slice, "nvml", 0);
    assert_eq!(f.num("total"), GIB, "{:?}", f.0);
    assert_eq!(f.num("free"), GIB, "{:?}", f.0);
}

/// `holder` takes 600 MiB of a 1 GiB slice and keeps it; `filler`, in another process, then
/// sees 424 MiB free and gets 53 chunks of 8 MiB before its own out-of-memory `error`.
fn share_one_slice(holder: &str, filler: &str, error: &str) {
    let slice = Slice::new(GIB, 0);
    let log = slice.dir.path().join("unmodelled-hold.log");
    let mut held = client(&slice, &log, &[holder, "hold", &(600 * MIB).to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(held.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(Facts::parse(&line).num("chunks"), 1, "{holder}: {line}");
    let f = fill(&slice, filler, 8 * MIB);
    assert_eq!(f.num("free"), 424 * MIB, "{:?}", f.0);
    assert_eq!(f.num("chunks"), 53, "{:?}", f.0);
    assert_eq!(f.get("error"), error, "{:?}", f.0);
    drop(held.stdin.take());
    assert!(held.wait().unwrap().success());
}

#[test]
fn two_real_clients_of_one_slice_share_its_limit() {
    share_one_slice("numba", "bindings", "CUDA_ERROR_OUT_OF_MEMORY");
}

/// Every allocation interface of one CUDA runtime stops at the slice with
/// `cudaErrorMemoryAllocation`, its memory query showing the slice: graph memory (captured
/// stream-ordered allocations and allocation nodes) at the launch that would cross it, the
/// device malloc heap and the per-thread stack at the `cudaDeviceSetLimit` that would.
fn runtime_meets_the_wall(library: &Path) {
    let client = format!("runtime:{}", library.display());
    for api in [
        "malloc",
        "async",
        "managed",
        "pitch",
        "array3d",
        "graph",
        "graph-node",
        "heap",
        "stack",
    ] {
        let slice = Slice::new(GIB, 0);
        let f = fill_with(&slice, &client, 64 * MIB, api);
        let what = format!("{api}: {:?}", f.0);
        assert_eq!(f.num("total"), GIB, "{what}");
        assert_eq!(f.num("free"), GIB, "{what}");
        assert_eq!(f.num("chunks"), 16, "{what}");
        assert_eq!(f.get("error"), "cudaErrorMemoryAllocation", "{what}");
    }
}

#[test]
fn cuda_device_reset_gives_the_slice_back_whole() {
    let slice = Slice::new(GIB, 0);
    let client = format!("runtime:{}", runtime12().display());
    let f = fill_in(&slice, &client, 64 * MIB, "malloc", &[("WALL_RESET", "1")]);
    let what = format!("{:?}", f.0);
    assert_eq!(f.num("chunks_before_reset"), 16, "{what}");
    assert_eq!(f.num("chunks"), 16, "{what}");
    assert_eq!(f.get("error"), "cudaErrorMemoryAllocation", "{what}");
}

#[test]
fn the_cuda_12_runtime_meets_the_wall_on_every_allocation_path() {
    runtime_meets_the_wall(&runtime12());
}

#[test]
fn the_cuda_11_runtime_meets_the_wall_on_every_allocation_path() {
    runtime_meets_the_wall(&runtime11());
}

#[test]
fn two_processes_of_different_cuda_runtimes_share_one_slice() {
    share_one_slice(
        &format!("runtime:{}", runtime11().display()),
        &format!("runtime:{}", runtime12().display()),
        "cudaErrorMemoryAllocation",
    );
}

#[test]
fn cupy_sees_its_slice_and_its_pool_stops_at_the_limit() {
    let slice = Slice::new(GIB, 0);
    let f = fill(&slice, "cupy", 64 * MIB);
    assert_eq!(f.num("total"), GIB, "{:?}", f.0);
    assert_eq!(f.num("free"), GIB, "{:?}", f.0);
    assert_eq!(f.num("chunks"), 16, "{:?}", f.0);
    assert_eq!(f.get("error"), "OutOfMemoryError", "{:?}", f.0);
    assert_eq!(f.num("pool_total"), GIB, "{:?}", f.0);
}

#[test]
fn cupy_with_its_stream_ordered_pool_stops_at_the_limit() {
    // MemoryAsyncPool: each device's current pool (cudaDeviceGetMemPool), its release
    // threshold set, every allocation a cudaMallocAsync. It visits every device it sees, so
    // it is shown only the slice's, as in a container.
    let slice = Slice::new(GIB, 0);
    let f = fill_in(
        &slice,
        "cupy-async",
        64 * MIB,
        "malloc",
        &[("CUDA_VISIBLE_DEVICES", "0")],
    );
    assert_eq!(f.num("total"), GIB, "{:?}", f.0);
    assert_eq!(f.num("chunks"), 16, "{:?}", f.0);
    assert_eq!(f.get("error"), "OutOfMemoryError", "{:?}", f.0);
}

#[test]
fn rapids_memory_manager_sees_its_slice_and_each_of_its_memory_resources_stops_at_the_limit() {
    // librmm links the CUDA runtime in statically: it finds the driver by itself. Its async
    // resource makes a pool of its own (cudaMemPoolCreate) and allocates from it.
    let slice = Slice::new(GIB, 0);
    for resource in ["cuda", "pool", "async", "managed"] {
        let f = fill_with(&slice, "rmm", 64 * MIB, resource);
        assert_eq!(f.num("total"), GIB, "{resource}: {:?}", f.0);
        assert_eq!(f.num("free"), GIB, "{resource}: {:?}", f.0);
        assert_eq!(f.num("chunks"), 16, "{resource}: {:?}", f.0);
        assert_eq!(f.get("error"), "MemoryError", "{resource}: {:?}", f.0);
    }
}

#[test]
fn onnx_runtime_runs_a_convolution_and_a_product_on_its_cuda_provider_and_its_arena_stops_at_the_limit()
 {
    // ONNX Runtime 1.23 (CUDA 12, cuDNN 9) in PyTorch's environment: a session on the CUDA
    // execution provider runs a convolution through cuDNN and a matrix product through
    // cuBLAS, then its arena gives out device memory 64 MiB at a time until it fails.
    let slice = Slice::new(GIB, 0);
    let f = fill(&slice, "onnxruntime", 64 * MIB);
    assert_eq!(f.get("provider"), "CUDAExecutionProvider", "{:?}", f.0);
    assert_eq!(f.get("output"), "4x512", "{:?}", f.0);
    assert_eq!(f.get("error"), "FailedToAllocate", "{:?}", f.0);
    // The session's weights and cuBLAS's workspace take some of the slice; the card's
    // 15 GiB would give some 230 chunks.
    let chunks = f.num("chunks");
    assert!(
        (14..=16).contains(&chunks),
        "{chunks} chunks of 64 MiB: {:?}",
        f.0
    );
}

/// `tests/clients/kernels.cu` compiled by nvcc 11.8 to an object in `dir`, with `defines`
/// (`-DNAME=VALUE`).
fn nvcc_object(dir: &Path, name: &str, defines: &[&str]) -> PathBuf {
    let object = dir.join(format!("{name}.o"));
    run_to_success(
        Command::new(nvcc())
            .args(["-arch=sm_75", "-c", "-o"])
            .arg(&object)
            .args(defines)
            .arg(client_script("kernels.cu")),
    );
    object
}

fn nvcc() -> PathBuf {
    let nvcc = reference_dir().join("bin/nvcc");
    assert!(
        nvcc.exists(),
        "{} is missing: run scripts/reference-driver (scripts/test does)",
        nvcc.display()
    );
    nvcc
}

fn run_to_success(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `object` linked by nvcc against its own runtime, CUDA 11.8's, as a shared library.
fn linked_with_runtime11(object: &Path) -> PathBuf {
    let program = object.with_extension("cudart11");
    run_to_success(
        Command::new(nvcc())
            .args(["-arch=sm_75", "-cudart", "shared", "-o"])
            .arg(&program)
            .arg(object),
    );
    program
}

/// `object` linked against NVIDIA's CUDA 12 runtime, as `nvcc -cudart shared` links a program
/// against its own.
fn linked_with_runtime12(object: &Path) -> PathBuf {
    let program = object.with_extension("cudart12");
    run_to_success(
        Command::new("g++")
            .arg(object)
            .arg(runtime12())
            .arg("-o")
            .arg(&program),
    );
    program
}

/// `object` linked against NVIDIA's static CUDA 12 runtime, as nvcc links a program by
/// default (`-cudart static`): the runtime inside the program finds the driver by `dlopen`.
fn linked_with_static_runtime12(object: &Path) -> PathBuf {
    let program = object.with_extension("cudart12-static");
    run_to_success(
        Command::new("g++")
            .arg(object)
            .arg(runtime12().with_file_name("libcudart_static.a"))
            .args(["-ldl", "-lpthread", "-lrt", "-o"])
            .arg(&program),
    );
    program
}

/// Runs an nvcc-built `program` in `slice` with the runtime in `runtime_dir`, asking for
/// `chunk`-byte allocations; prints its unmodelled driver calls.
fn run_nvcc_program(slice: &Slice, program: &Path, runtime_dir: &Path, chunk: u64) -> String {
    let name = program.file_name().unwrap().to_string_lossy();
    let log = slice.dir.path().join(format!("unmodelled-{name}.log"));
    let path = format!(
        "{}:{}",
        slice.sim.fronted_lib_dir().display(),
        runtime_dir.display()
    );
    let out = slice
        .command(program)
        .env("LD_LIBRARY_PATH", path)
        .env("GPUSLICE_SIM_UNMODELLED_LOG", &log)
        .arg(chunk.to_string())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{name}: {text}");
    println!("{name}: {}", text.trim_end());
    print_unmodelled(&name, &log);
    text
}

#[test]
fn a_program_built_by_nvcc_launches_its_kernels_uses_its_globals_and_meets_the_wall() {
    // One object, linked against the CUDA 11.8 runtime (by nvcc) and the CUDA 12 one, shared
    // and static: the same registered kernels and variables, loaded by each runtime.
    let slice = Slice::new(GIB, 0);
    let object = nvcc_object(slice.dir.path(), "kernels", &[]);
    let with_11 = linked_with_runtime11(&object);
    let dir_of = |lib: PathBuf| lib.parent().unwrap().to_path_buf();
    for (runtime, program, runtime_dir) in [
        ("11.8", with_11, dir_of(runtime11())),
        ("12", linked_with_runtime12(&object), dir_of(runtime12())),
        // The program's own copy of the runtime, as nvcc links one by default: no libcudart
        // on the library path.
        (
            "12",
            linked_with_static_runtime12(&object),
            slice.dir.path().to_path_buf(),
        ),
    ] {
        let text = run_nvcc_program(&slice, &program, &runtime_dir, 64 * MIB);
        let what = format!("CUDA {runtime} runtime: {text}");
        let f = Facts::parse(&text);
        assert_eq!(f.num("total"), GIB, "{what}");
        for key in [
            "set_device",
            "get_device",
            "malloc",
            "launch",
            "launch2",
            "sync",
        ] {
            assert_eq!(f.get(key), "cudaSuccess", "{key}: {what}");
        }
        assert_eq!(f.num("device"), 0, "{what}");
        // The module's 1 KiB table and 4-byte constant, written and read through their
        // symbols.
        assert_eq!(
            f.get("symbols"),
            "cudaSuccess,cudaSuccess,cudaSuccess",
            "{what}"
        );
        assert_eq!(f.num("symbol_size"), 1024, "{what}");
        assert_eq!(f.get("roundtrip"), "1", "{what}");
        // A texture and a surface object over an array, sampled and written by a kernel.
        assert_eq!(f.get("texture"), "cudaSuccess", "{what}");
        assert_eq!(f.get("error"), "cudaErrorMemoryAllocation", "{what}");
        // The module's globals (1028 bytes) take device memory. The CUDA 12 runtime has the
        // driver load its registered modules by `cuLibraryLoadData`, which the library
        // charges: the last of sixteen 64 MiB chunks no longer fits. The CUDA 11 runtime
        // loads them through the driver's private interface (`cuGetExportTable`), which the
        // library does not interpose: they are charged from the driver's figure at the
        // agent's next sample, and sixteen chunks still fit here (no agent runs).
        let chunks = if runtime == "12" { 15 } else { 16 };
        assert_eq!(f.num("chunks"), chunks, "{what}");
    }
}

#[test]
fn a_cuda_12_program_declaring_a_global_larger_than_its_slice_has_its_module_refused() {
    // `__device__ char extra[512 MiB]`: the CUDA 12 runtime has the driver load the module
    // when the first kernel is launched, and the library charges the globals first. In a
    // 1 GiB slice the module fits and leaves room for seven 64 MiB chunks; in a 256 MiB one
    // the load is refused (the launch fails) and the program's allocations still get the
    // whole slice.
    let dir = tempfile::tempdir().unwrap();
    let object = nvcc_object(
        dir.path(),
        "extra",
        &[&format!("-DEXTRA_GLOBAL_BYTES={}", 512 * MIB)],
    );
    let program = linked_with_runtime12(&object);
    let runtime_dir = runtime12().parent().unwrap().to_path_buf();

    let roomy = Slice::new(GIB, 0);
    let text = run_nvcc_program(&roomy, &program, &runtime_dir, 64 * MIB);
    let f = Facts::parse(&text);
    assert_eq!(f.get("launch"), "cudaSuccess", "{text}");
    assert_eq!(f.get("sync"), "cudaSuccess", "{text}");
    assert_eq!(f.num("chunks"), 7, "{text}");

    let small = Slice::new(256 * MIB, 0);
    let text = run_nvcc_program(&small, &program, &runtime_dir, 64 * MIB);
    let f = Facts::parse(&text);
    assert_eq!(f.get("malloc"), "cudaSuccess", "{text}");
    assert_ne!(
        f.get("launch"),
        "cudaSuccess",
        "the driver loaded the module: {text}"
    );
    assert_eq!(f.num("chunks"), 4, "{text}");
}

#[test]
fn a_program_whose_kernel_needs_more_local_memory_than_its_slice_holds_has_that_launch_refused() {
    // `char a[16 KiB]` in each thread: launching that kernel makes the driver grow the stack
    // by 15 KiB for each of the T4's 40960 resident threads, 600 MiB, through no allocation
    // call. The library charges it before the launch, with either runtime (both launch by
    // `cuLaunchKernel`). In a 1 GiB slice it fits and leaves room for six 64 MiB chunks; in a
    // 512 MiB one that launch fails as the driver's would, and the program goes on to get the
    // whole slice.
    let dir = tempfile::tempdir().unwrap();
    let object = nvcc_object(dir.path(), "deep", &["-DLOCAL_ARRAY_BYTES=16384"]);
    let with_11 = linked_with_runtime11(&object);
    for (runtime, program, runtime_dir) in [
        ("11.8", with_11, runtime11()),
        ("12", linked_with_runtime12(&object), runtime12()),
    ] {
        let runtime_dir = runtime_dir.parent().unwrap();
        let roomy = Slice::new(GIB, 0);
        let text = run_nvcc_program(&roomy, &program, runtime_dir, 64 * MIB);
        let f = Facts::parse(&text);
        let what = format!("CUDA {runtime} runtime, 1 GiB: {text}");
        assert_eq!(f.get("local"), "cudaSuccess", "{what}");
        assert_eq!(f.get("sync"), "cudaSuccess", "{what}");
        assert_eq!(f.num("chunks"), 6, "{what}");

        let small = Slice::new(512 * MIB, 0);
        let text = run_nvcc_program(&small, &program, runtime_dir, 64 * MIB);
        let f = Facts::parse(&text);
        let what = format!("CUDA {runtime} runtime, 512 MiB: {text}");
        assert_eq!(f.get("local"), "cudaErrorMemoryAllocation", "{what}");
        assert_eq!(f.get("launch2"), "cudaSuccess", "{what}");
        // The module's 1028 bytes of globals cost the last chunk where they are charged (the
        // CUDA 12 runtime's loads; see above).
        let chunks = if runtime == "12" { 7 } else { 8 };
        assert_eq!(f.num("chunks"), chunks, "{what}");
    }
}

/// The CUDA 12 runtime's array copies (`cudaMemcpy2DToArray`, `cudaMemcpy2DFromArray`) and
/// `cudaArrayGetInfo` in a slice.
#[test]
fn the_cuda_runtime_copies_to_and_from_arrays() {
    let slice = Slice::new(GIB, 0);
    let log = slice.dir.path().join("unmodelled-arrays.log");
    let text = script_output(
        slice
            .command(&python())
            .arg(client_script("arrays.py"))
            .arg(runtime12())
            .env("GPUSLICE_SIM_UNMODELLED_LOG", &log),
    );
    print_unmodelled("arrays", &log);
    assert_eq!(
        text.trim(),
        "malloc_array=0 to_array=0 from_array=0 round_trip=1 part=0 part_ok=1 info=0 \
         extent=64x16x0 format=32,2 free_array=0"
    );
}

#[test]
fn pytorch_sees_its_slice_runs_a_graph_and_its_caching_allocator_stops_at_the_limit() {
    let slice = Slice::new(GIB, 0);
    let f = fill(&slice, "torch", 64 * MIB);
    let what = format!("{:?}", f.0);
    assert_eq!(f.num("total"), GIB, "{what}");
    assert_eq!(f.num("free"), GIB, "{what}");
    assert_eq!(f.num("props_total"), GIB, "{what}");
    assert_eq!(f.get("graph"), "1", "{what}");
    // The modules of the kernels it ran declare global variables (in compressed fat binary
    // entries, 803 bytes on the simulated A10), charged with them: the sixteenth 64 MiB
    // chunk would bring the slice past its 1 GiB.
    assert_eq!(f.num("chunks"), 15, "{what}");
    assert_eq!(f.get("error"), "OutOfMemoryError", "{what}");
}

/// PyTorch's matrix products through cuBLAS and cuBLASLt (`tests/clients/gemms.py`) in a
/// 1 GiB slice of a simulated T4 and of a simulated H100, then PyTorch filling the rest of
/// the slice; returns the script's facts and the MiB the driver holds for the process as
/// the host sees it (the simulated nvidia-smi, without the library).
fn gemms_in_a_slice(model: &str) -> (Facts, u64) {
    let slice = Slice::of_model(model, GIB, 0);
    let log = slice.dir.path().join("unmodelled-gemms.log");
    let mut cmd = slice.command(&torch_python());
    cmd.arg(client_script("gemms.py"))
        .env("GPUSLICE_SIM_UNMODELLED_LOG", &log);
    let running = common::Running::start(cmd);
    let smi = Command::new(slice.sim.root().join("usr/bin/nvidia-smi"))
        .env("LD_LIBRARY_PATH", slice.sim.lib_dir())
        .args(["--query-gpu=memory.used", "--format=csv,noheader,nounits"])
        .output()
        .unwrap();
    let used = String::from_utf8_lossy(&smi.stdout)
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .expect("nvidia-smi's memory.used");
    let facts = Facts(running.facts.0.clone());
    running.finish();
    print_unmodelled(model, &log);
    (facts, used)
}

#[test]
fn pytorch_runs_its_matrix_products_through_cublas_and_cublaslt_in_a_slice() {
    // Before, cuBLAS's runtime found neither the thread's context nor its identity in the
    // driver's tools interfaces (every GEMM: CUBLAS_STATUS_NOT_SUPPORTED), cuBLASLt went on
    // without the device's SM count (GEMVs: CUBLAS_STATUS_EXECUTION_FAILED, fused bias:
    // no algorithm), and on Hopper cuBLAS could not make its handle
    // (cuOccupancyMaxActiveClusters) and cuBLASLt crashed on a table the driver did not give.
    for model in ["T4", "H100"] {
        let (f, used) = gemms_in_a_slice(model);
        let what = format!("{model}: {:?}", f.0);
        println!("{what} used={used}");
        for product in [
            "sgemm",
            "hgemm",
            "bf16gemm",
            "batched",
            "linear",
            "linear_bias",
            "linear_bias_half",
            "addmm",
            "gemv",
            "graphed_linear",
        ] {
            assert_eq!(f.get(product), "ok", "{product} on {what}");
        }
        assert_eq!(f.num("total"), GIB, "{what}");
        assert_eq!(f.get("error"), "OutOfMemoryError", "{what}");
        // cuBLAS's workspaces and kernels' globals are charged with the rest: the process
        // holds no more than its slice, and the fill found most of the slice still its own.
        assert!(
            used <= 1024,
            "{what}: the process holds {used} MiB of a 1 GiB slice"
        );
        assert!(f.num("chunks") >= 12, "{what}");
    }
}

/// What nvidia-ml-py reads of how the GPUs of a node laid out as NVLink pairs are connected:
/// `nvidia-smi topo -m` and the schedulers that read NVML (the agent through nvml-wrapper)
/// ask the same calls.
const TOPOLOGY_SCRIPT: &str = r"
import pynvml as n
n.nvmlInit()
hs = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
bus = [n.nvmlDeviceGetPciInfo(h).busId for h in hs]
for i, a in enumerate(hs):
    row = [n.nvmlDeviceGetTopologyCommonAncestor(a, b) if i != j else 0 for j, b in enumerate(hs)]
    print(f'ancestors{i}=' + ','.join(map(str, row)))
    peers = []
    for link in range(n.NVML_NVLINK_MAX_LINKS):
        try:
            if n.nvmlDeviceGetNvLinkState(a, link) != n.NVML_FEATURE_ENABLED:
                continue
            remote = n.nvmlDeviceGetNvLinkRemotePciInfo(a, link).busId
        except (n.NVMLError_NotSupported, n.NVMLError_InvalidArgument):
            # No NVLink, or past the device's links (this binding counts up to 36, drivers
            # of the simulated node's branch to 18): as nvidia-smi stops.
            break
        peers.append(str(bus.index(remote)) if remote in bus else 'switch')
    print(f'nvlinks{i}=' + ','.join(peers))
n.nvmlShutdown()
";

#[test]
fn nvidia_ml_py_reads_the_simulated_topology_as_laid_out() {
    let sim = gpuslice_testsupport::sim::SimNode::with_layout(8, "H100", "nvlink-pairs");
    let out = Command::new(python())
        .args(["-c", TOPOLOGY_SCRIPT])
        .env("LD_LIBRARY_PATH", sim.lib_dir())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let f = Facts::parse(&text);
    // A PCIe switch per pair (SINGLE, 10), a NUMA node per four (NODE, 40), across (SYSTEM, 50).
    assert_eq!(f.get("ancestors0"), "0,10,40,40,50,50,50,50", "{text}");
    assert_eq!(f.get("ancestors5"), "50,50,50,50,10,0,40,40", "{text}");
    // Four NVLinks from each GPU to its pair's other GPU, by its PCI bus id.
    assert_eq!(f.get("nvlinks0"), "1,1,1,1", "{text}");
    assert_eq!(f.get("nvlinks7"), "6,6,6,6", "{text}");
}

/// Runs `tests/clients/conditional.py` (cuda-bindings' conditional graphs, kernels needing
/// `local` bytes of local memory a thread) with `slice`'s node and the limits file `limits`
/// (none: outside any slice).
fn conditional_graphs(slice: &Slice, limits: Option<&Path>, local: u64) -> Facts {
    let mut c = slice.command(&python());
    match limits {
        Some(l) => c.env("GPUSLICE_LIMITS", l),
        None => c.env_remove("GPUSLICE_LIMITS"),
    };
    Facts::parse(&script_output(
        c.arg(client_script("conditional.py"))
            .arg(local.to_string()),
    ))
}

#[test]
fn cuda_bindings_conditional_graphs_meet_the_wall_and_a_loop_is_refused_on_a_paced_slice() {
    // 64 KiB a thread, for every thread the simulated T4 holds resident (40 SMs of 1,024):
    // 2.5 GiB of stack, past a 256 MiB slice; the graph's kernel stands in the body of an
    // `if` node, which the driver made and cuda-bindings read back from phGraph_out.
    let local = 64 * 1024;
    let slice = Slice::new(256 * MIB, 0);
    let f = conditional_graphs(&slice, Some(&slice.limits_path()), local);
    assert_eq!(f.get("if_small"), "CUDA_SUCCESS", "{:?}", f.0);
    assert_eq!(f.get("if_deep"), "CUDA_ERROR_OUT_OF_MEMORY", "{:?}", f.0);
    assert_eq!(
        f.get("while"),
        "CUDA_SUCCESS",
        "no share to pace: {:?}",
        f.0
    );
    // A slice with a share of the SMs: a `while` node's body runs as often as the graph's
    // kernels decide, so the graph is not instantiated there.
    let paced = tempfile::tempdir().unwrap();
    let limits = gpuslice_core::limits::Limits {
        container_id: "conditional-paced".into(),
        gpus: vec![gpuslice_core::limits::GpuLimit {
            uuid: slice.sim.spec.gpus[0].uuid.clone(),
            memory_bytes: 256 * MIB,
            cores: 30,
            context_bytes: 0,
            window: None,
        }],
    };
    common::write_slice(paced.path(), &limits);
    let f = conditional_graphs(&slice, Some(&paced.path().join("limits")), local);
    assert_eq!(f.get("if_small"), "CUDA_SUCCESS", "{:?}", f.0);
    assert_eq!(
        f.get("while"),
        "instantiate:CUDA_ERROR_NOT_SUPPORTED",
        "{:?}",
        f.0
    );
    // Outside a slice the same graphs run: the card has room for the stack.
    let f = conditional_graphs(&slice, None, local);
    for key in ["if_small", "if_deep", "while"] {
        assert_eq!(f.get(key), "CUDA_SUCCESS", "{key}: {:?}", f.0);
    }
}
