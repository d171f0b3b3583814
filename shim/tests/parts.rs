//! A container given several slices, as CDI slice devices give them (each slice's directory
//! mounted right under `/run/gpuslice`): real CUDA software (cuda-bindings, numba-cuda,
//! nvidia-ml-py, PyTorch, CuPy) sees on each GPU the slice it was given, meets that slice's
//! wall and moves data between the two GPUs, processes charge each GPU to its own slice, and
//! a region truncated under a process closes the wall of that process and kills nothing.

mod common;

use std::path::Path;
use std::process::Command;

use common::{Facts, MIB, Running, Slice, client_script, python, torch_python, write_slice};
use gpuslice_core::limits::{GpuLimit, Limits};

const GIB: u64 = 1 << 30;
/// The slice of GPU 1.
const SECOND: u64 = 512 * MIB;

/// A slice of 1 GiB of GPU 0 (directory `a`) and one of 512 MiB of GPU 1 (directory `b`).
struct TwoSlices {
    first: Slice,
    second: tempfile::TempDir,
}

impl TwoSlices {
    fn new() -> Self {
        Self::second_on(1)
    }

    /// As [`TwoSlices::new`], the second slice on GPU `gpu`.
    fn second_on(gpu: usize) -> Self {
        let first = Slice::new(GIB, 0);
        let second = tempfile::tempdir().unwrap();
        let limits = Limits {
            container_id: "second-slice".into(),
            gpus: vec![GpuLimit {
                uuid: first.sim.spec.gpus[gpu].uuid.clone(),
                memory_bytes: SECOND,
                cores: 0,
                context_bytes: 0,
                window: None,
            }],
        };
        write_slice(second.path(), &limits);
        Self { first, second }
    }

    /// `program` in a mount namespace of its own where both directories are mounted under
    /// `/run/gpuslice` as a container's runtime mounts them, and nothing names a slice in the
    /// environment.
    fn command(&self, program: &Path) -> Command {
        let script = r#"mount -t tmpfs tmpfs /run && mkdir -p /run/gpuslice/a /run/gpuslice/b \
            && mount --bind "$SLICE_A" /run/gpuslice/a && mount --bind "$SLICE_B" /run/gpuslice/b \
            && exec "$@""#;
        let mut cmd = self.first.in_mount_namespace(script);
        cmd.env_remove("GPUSLICE_LIMITS")
            .env("SLICE_A", self.first.dir.path())
            .env("SLICE_B", self.second.path())
            .arg(program);
        cmd
    }

    /// The client `name` of `tests/clients/wall.py` in `mode` with `bytes`, on `device`.
    fn client(&self, name: &str, mode: &str, bytes: u64, device: usize) -> Command {
        let python = if name == "torch" {
            torch_python()
        } else {
            python()
        };
        let mut cmd = self.command(&python);
        cmd.arg(client_script("wall.py"))
            .args([name, mode, &bytes.to_string()])
            .env("WALL_DEVICE", device.to_string());
        cmd
    }

    /// Runs the client to its end, which must be a success, and returns what it saw.
    fn fill(&self, name: &str, chunk: u64, device: usize) -> Facts {
        let out = self.client(name, "fill", chunk, device).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{name} on GPU {device}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Facts::parse(&text)
    }
}

#[test]
fn real_cuda_software_sees_on_each_gpu_the_slice_it_was_given_and_meets_its_wall() {
    let slices = TwoSlices::new();
    let f = slices.fill("nvml", 0, 1);
    assert_eq!(
        f.get("totals"),
        format!("{GIB},{SECOND}"),
        "nvidia-ml-py: {:?}",
        f.0
    );
    assert_eq!(f.num("free"), SECOND, "{:?}", f.0);
    let f = slices.fill("numba", 100 * MIB, 1);
    assert_eq!(
        (f.num("total"), f.num("free")),
        (SECOND, SECOND),
        "{:?}",
        f.0
    );
    assert_eq!(f.num("chunks"), 5, "numba on GPU 1: {:?}", f.0);
    assert_eq!(
        f.get("error"),
        "CudaAPIError:CUDA_ERROR_OUT_OF_MEMORY",
        "{:?}",
        f.0
    );
    let f = slices.fill("bindings", 64 * MIB, 0);
    assert_eq!(f.num("total"), GIB, "{:?}", f.0);
    assert_eq!(f.num("chunks"), 16, "cuda-bindings on GPU 0: {:?}", f.0);
    assert_eq!(f.get("error"), "CUDA_ERROR_OUT_OF_MEMORY", "{:?}", f.0);
}

#[test]
fn pytorch_on_the_second_gpu_sees_its_slice_runs_a_graph_and_stops_at_its_limit() {
    let slices = TwoSlices::new();
    let f = slices.fill("torch", 64 * MIB, 1);
    let what = format!("{:?}", f.0);
    assert_eq!((f.num("total"), f.num("free")), (SECOND, SECOND), "{what}");
    assert_eq!(f.num("props_total"), SECOND, "{what}");
    assert_eq!(f.get("graph"), "1", "{what}");
    // Less the global variables of the modules of its kernels (charged with them): the
    // eighth 64 MiB chunk would bring the slice past its 512 MiB.
    assert_eq!(f.num("chunks"), 7, "{what}");
    assert_eq!(f.get("error"), "OutOfMemoryError", "{what}");
}

#[test]
fn pytorch_and_cupy_move_data_between_the_gpus_of_two_slices_each_copy_charged_where_it_is() {
    let slices = TwoSlices::new();
    let n = 4 * MIB;
    // PyTorch with its caching allocator and with the driver's stream-ordered one, which
    // gives the other GPU access to its pool (cudaMemPoolSetAccess) before the copy.
    for (client, allocator) in [
        ("torch", "native"),
        ("torch", "cudaMallocAsync"),
        ("cupy", "native"),
    ] {
        let python = if client == "torch" {
            torch_python()
        } else {
            python()
        };
        let out = slices
            .command(&python)
            .arg(client_script("peers.py"))
            .args([client, &n.to_string()])
            .env("PYTORCH_CUDA_ALLOC_CONF", format!("backend:{allocator}"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{client}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let f = Facts::parse(&text);
        let what = format!("{client} ({allocator}): {:?}", f.0);
        assert_eq!((f.get("can"), f.get("same")), ("1", "1"), "{what}");
        assert_eq!((f.num("total0"), f.num("total1")), (GIB, SECOND), "{what}");
        // Two copies on GPU 0, one on GPU 1, each in its own slice (PyTorch's caching
        // allocator takes 20 MiB segments for them, the driver's pools 32 MiB steps).
        assert!((2 * n..=40 * MIB).contains(&f.num("used0")), "{what}");
        assert!((n..=32 * MIB).contains(&f.num("used1")), "{what}");
    }
}

#[test]
fn two_slices_of_one_gpu_give_a_container_their_sum_there() {
    // 1 GiB and 512 MiB of GPU 0 (two claims on one card, each admitted): real CUDA software
    // sees 1.5 GiB and fills it. Before, the second slice was given nothing: 1 GiB.
    let slices = TwoSlices::second_on(0);
    let f = slices.fill("bindings", 64 * MIB, 0);
    assert_eq!(f.num("total"), GIB + SECOND, "{:?}", f.0);
    assert_eq!(f.num("chunks"), 24, "cuda-bindings on GPU 0: {:?}", f.0);
    assert_eq!(f.get("error"), "CUDA_ERROR_OUT_OF_MEMORY", "{:?}", f.0);
    let f = slices.fill("nvml", 0, 0);
    // GPU 1 is in neither slice: no memory.
    assert_eq!(f.get("totals"), format!("{},0", GIB + SECOND), "{:?}", f.0);
    // What a process holds there is charged to the first slice by name, as the agent charges
    // the driver's figure for it.
    let holder = Running::start(slices.client("bindings", "hold", 1100 * MIB, 0));
    assert_eq!(slices.first.usage().totals(), vec![1100 * MIB]);
    holder.finish();
}

#[test]
fn what_a_process_holds_on_one_gpu_is_charged_to_that_gpus_slice_only() {
    let slices = TwoSlices::new();
    let holder = Running::start(slices.client("numba", "hold", 600 * MIB, 0));
    assert_eq!(holder.facts.num("chunks"), 1, "{:?}", holder.facts.0);
    // Another process of the container: GPU 1's slice is whole, GPU 0's is less the hold.
    let f = slices.fill("bindings", 8 * MIB, 1);
    assert_eq!((f.num("free"), f.num("chunks")), (SECOND, 64), "{:?}", f.0);
    let f = slices.fill("bindings", 8 * MIB, 0);
    assert_eq!(
        (f.num("free"), f.num("chunks")),
        (424 * MIB, 53),
        "{:?}",
        f.0
    );
    assert_eq!(f.get("error"), "CUDA_ERROR_OUT_OF_MEMORY", "{:?}", f.0);
    holder.finish();
    assert_eq!(slices.first.usage().totals(), vec![0]);
}

#[test]
fn a_region_truncated_under_a_process_of_two_slices_closes_its_wall_and_kills_it_not() {
    let slices = TwoSlices::new();
    let holder = Running::start(slices.client("bindings", "hold", 64 * MIB, 1));
    assert_eq!(holder.facts.num("chunks"), 1, "{:?}", holder.facts.0);
    common::truncate(&slices.second.path().join(gpuslice_core::usage::FILE_NAME));
    // The holder frees its 64 MiB through the truncated region (the second mapping it
    // holds) and exits normally.
    holder.finish();
    // A process mapping the truncated region gets nothing on that GPU, not even a context;
    // the other slice is untouched.
    let out = slices
        .client("bindings", "fill", 64 * MIB, 1)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("RuntimeError: CUDA_ERROR_OUT_OF_MEMORY"),
        "GPU 1 after the truncation: {out:?}"
    );
    let f = slices.fill("bindings", 64 * MIB, 0);
    assert_eq!(f.num("chunks"), 16, "GPU 0 after the truncation: {:?}", f.0);
}

/// The MiB the simulated driver's processes hold on each GPU (its `nvidia-smi`, without the
/// library).
fn held_per_gpu(slice: &Slice) -> Vec<u64> {
    let smi = Command::new(slice.sim.root().join("usr/bin/nvidia-smi"))
        .env("LD_LIBRARY_PATH", slice.sim.lib_dir())
        .args(["--query-gpu=memory.used", "--format=csv,noheader,nounits"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&smi.stdout)
        .lines()
        .map(|l| l.trim().parse().expect("nvidia-smi's memory.used"))
        .collect()
}

/// A slice of `limit` bytes on each GPU of a two-GPU T4 node whose contexts take nothing.
fn slice_of_two_gpus(limit: u64) -> Slice {
    let slice = Slice::new(limit, 0);
    let limits = Limits {
        container_id: "two-gpus".into(),
        gpus: (0..2)
            .map(|i| GpuLimit {
                uuid: slice.sim.spec.gpus[i].uuid.clone(),
                memory_bytes: limit,
                cores: 0,
                context_bytes: 0,
                window: None,
            })
            .collect(),
    };
    write_slice(slice.dir.path(), &limits);
    slice
}

#[test]
fn a_kernel_launched_on_another_gpus_stream_has_its_stack_charged_to_that_gpu() {
    // 4 KiB of local memory a thread: 120 MiB of the simulated T4's stack. GPU 0's context
    // grows its stack to it within its 512 MiB; the same kernel (a library's, which runs in
    // its stream's context) launched on a stream of GPU 1 while GPU 0's context is current
    // makes the driver grow GPU 1's stack too. Before the library charged that to GPU 1,
    // GPU 1 then held 632 MiB of its 512.
    let slice = slice_of_two_gpus(512 * MIB);
    let program = common::compile(&slice.sim, "launch_device");
    let mut cmd = slice.command(&program);
    cmd.arg((4 << 10).to_string());
    let running = Running::start(cmd);
    let facts = format!("{:?}", running.facts.0);
    assert_eq!(
        (running.facts.get("on0"), running.facts.get("on1")),
        ("0", "0"),
        "{facts}"
    );
    let held = held_per_gpu(&slice);
    assert!(held[0] >= 100, "GPU 0's stack: {held:?} MiB ({facts})");
    assert_eq!(held[1], 512, "MiB held on each GPU: {held:?} ({facts})");
    running.finish();
}

#[test]
fn stream_ordered_allocations_made_for_another_gpu_than_the_current_one_are_charged_to_it() {
    // A slice of 256 MiB on each GPU. The tenant, GPU 0's context current, allocates on GPU 1
    // by every stream-ordered way there is until refused, then fills GPU 1 plainly. Before
    // the library charged these to the GPU they come from (the stream's, or the pool's) and
    // knew the pools of every call that gives one out, they were charged to GPU 0 and GPU 1
    // held 512 MiB.
    let slice = slice_of_two_gpus(256 * MIB);
    let program = common::compile(&slice.sim, "pool_device");
    for mode in ["stream", "pool", "pool13", "default13", "set13"] {
        let mut cmd = slice.command(&program);
        cmd.args([mode, &(8 * MIB).to_string()]);
        let running = Running::start(cmd);
        let facts = format!("{mode}: {:?}", running.facts.0);
        let held = held_per_gpu(&slice);
        assert_eq!(held.len(), 2, "{facts}");
        assert!(held[1] <= 256, "GPU 1 holds {held:?} MiB ({facts})");
        assert_eq!(held[0], 0, "GPU 0 holds {held:?} MiB ({facts})");
        // The stream-ordered allocations themselves came to the slice's size (less the last
        // step of their pool, 32 MiB): the wall is the slice's, not a refusal of the path.
        assert!(
            running.facts.num("async") * 8 >= 224,
            "GPU 1 holds {held:?} MiB ({facts})"
        );
        running.finish();
    }
}
