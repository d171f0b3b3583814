//! What the interception library costs, measured side by side in one process:
//! - `cuMemAlloc`+`cuMemFree` pairs and `cuLaunchKernel` calls through the driver's front
//!   (`libcuda.so.1` as a container has it: libgpuslice.so in front of the driver, with a
//!   slice, so every allocation is counted in the usage region) against the same calls made
//!   directly into the simulated driver;
//! - start-up of a program that never loads the driver (`/bin/true`) and of one that loads it
//!   and calls `cuInit`, with the container's library path and with the driver alone.
//!
//! Run: `cargo build --release --workspace && cargo bench -p gpuslice-shim --bench interception`
//! Each figure is the median over rounds that alternate the two sides.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_int, c_uint, c_void};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use gpuslice_core::limits::{GpuLimit, Limits};
use gpuslice_core::usage;
use gpuslice_testsupport::sim::SimNode;

type Alloc = unsafe extern "C" fn(*mut u64, usize) -> c_uint;
type Free = unsafe extern "C" fn(u64) -> c_uint;
type GraphLaunch = unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_uint;
type LaunchEx = unsafe extern "C" fn(
    *const gpuslice_cuda_abi::cuda::CUlaunchConfig,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> c_uint;
type MemsetAsync = unsafe extern "C" fn(u64, c_uint, usize, *mut c_void) -> c_uint;
type Launch = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> c_uint;

const ROUNDS: usize = 15;

fn open(path: &Path, flags: c_int) -> *mut c_void {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: dlopen with a NUL-terminated path.
    let h = unsafe { libc::dlopen(c.as_ptr(), flags) };
    assert!(!h.is_null(), "dlopen {}", path.display());
    h
}

fn sym<T: Copy>(h: *mut c_void, name: &CStr) -> T {
    // SAFETY: dlsym on a live handle with a NUL-terminated name.
    let p = unsafe { libc::dlsym(h, name.as_ptr()) };
    assert!(!p.is_null(), "{name:?}");
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: T is the function pointer type of `name` (asserted pointer-sized).
    unsafe { std::mem::transmute_copy(&p) }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Nanoseconds per call of `f` over `n` calls.
fn per_call(n: u32, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

fn side_by_side(label: &str, n: u32, mut direct: impl FnMut(), mut ours: impl FnMut()) {
    let (mut d, mut o) = (Vec::new(), Vec::new());
    per_call(n / 10, &mut direct);
    per_call(n / 10, &mut ours);
    for _ in 0..ROUNDS {
        d.push(per_call(n, &mut direct));
        o.push(per_call(n, &mut ours));
    }
    let (d, o) = (median(d), median(o));
    println!(
        "{label:<28} direct {d:>9.1} ns   through libgpuslice {o:>9.1} ns   added {:>7.1} ns   ratio {:.3}",
        o - d,
        o / d
    );
}

/// Set in the measuring process: the directory holding the driver as a container has it.
const FRONTED: &str = "GPUSLICE_BENCH_FRONTED";

fn main() {
    // The loader reads LD_LIBRARY_PATH at start, so the measurements run in a child started
    // with the container's library layout; this process makes the node and the slice.
    if std::env::var_os(FRONTED).is_some() {
        measure();
        return;
    }
    let sim = SimNode::new(1, "A100", None);
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits {
        container_id: "bench".into(),
        gpus: vec![GpuLimit {
            uuid: sim.spec.gpus[0].uuid.clone(),
            memory_bytes: 8 << 30,
            cores: 0,
            context_bytes: 0,
            window: None,
        }],
    };
    std::fs::write(dir.path().join("limits"), limits.render()).unwrap();
    std::fs::write(
        dir.path().join(usage::FILE_NAME),
        usage::new_region(1, usage::DEFAULT_SLOTS),
    )
    .unwrap();
    // The driver's share, as the agent creates it: every check of an allocation reads it.
    std::fs::write(
        dir.path().join(gpuslice_core::held::FILE_NAME),
        gpuslice_core::held::new_file(1, usage::DEFAULT_SLOTS),
    )
    .unwrap();
    let fronted = sim.fronted_lib_dir();
    let status = Command::new(std::env::current_exe().unwrap())
        .args(std::env::args_os().skip(1))
        .env(FRONTED, &fronted)
        .env("LD_LIBRARY_PATH", &fronted)
        .env("GPUSLICE_BENCH_DRIVER_DIR", sim.lib_dir())
        .env("GPUSLICE_LIMITS", dir.path().join("limits"))
        .status()
        .unwrap();
    assert!(status.success());
}

fn measure() {
    let fronted = std::path::PathBuf::from(std::env::var_os(FRONTED).unwrap());
    let driver_dir =
        std::path::PathBuf::from(std::env::var_os("GPUSLICE_BENCH_DRIVER_DIR").unwrap());
    // The front by its soname (found through LD_LIBRARY_PATH, as in a container), then the real
    // driver it loaded, by its private name.
    let ours = open(
        Path::new(gpuslice_core::layout::CUDA_SONAME),
        libc::RTLD_NOW | libc::RTLD_GLOBAL,
    );
    let cuda = open(
        Path::new(gpuslice_core::layout::REAL_CUDA),
        libc::RTLD_NOW | libc::RTLD_NOLOAD,
    );
    assert_ne!(
        sym::<*mut c_void>(ours, c"cuMemAlloc_v2"),
        sym::<*mut c_void>(cuda, c"cuMemAlloc_v2"),
        "the front finds the library's allocator, the driver its own"
    );

    let init: unsafe extern "C" fn(c_uint) -> c_uint = sym(cuda, c"cuInit");
    let retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_uint =
        sym(ours, c"cuDevicePrimaryCtxRetain");
    let set_current: unsafe extern "C" fn(*mut c_void) -> c_uint = sym(cuda, c"cuCtxSetCurrent");
    let load: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> c_uint =
        sym(cuda, c"cuModuleLoadData");
    let function: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const i8) -> c_uint =
        sym(cuda, c"cuModuleGetFunction");
    let mut ctx = std::ptr::null_mut();
    let (mut module, mut kernel) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: the driver API called in order on live out-pointers.
    unsafe {
        assert_eq!(init(0), 0);
        assert_eq!(retain(&raw mut ctx, 0), 0);
        assert_eq!(set_current(ctx), 0);
        assert_eq!(load(&raw mut module, c"image".as_ptr().cast()), 0);
        assert_eq!(function(&raw mut kernel, module, c"k".as_ptr()), 0);
    }

    println!("interception overhead (simulated driver, {ROUNDS} rounds, medians)");
    let pair = |alloc: Alloc, free: Free| {
        move || {
            let mut p = 0u64;
            // SAFETY: allocating and freeing 1 MiB with the context current.
            unsafe {
                assert_eq!(alloc(&raw mut p, 1 << 20), 0);
                assert_eq!(free(p), 0);
            }
        }
    };
    side_by_side(
        "cuMemAlloc+cuMemFree pair",
        2_000,
        pair(sym(cuda, c"cuMemAlloc_v2"), sym(cuda, c"cuMemFree_v2")),
        pair(sym(ours, c"cuMemAlloc_v2"), sym(ours, c"cuMemFree_v2")),
    );
    let launch = |f: Launch| {
        move || {
            // SAFETY: a launch of the function loaded above with a 1x1x1 grid and block.
            let r = unsafe {
                f(
                    kernel,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    0,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
            assert_eq!(r, 0);
        }
    };
    side_by_side(
        "cuLaunchKernel",
        2_000_000,
        launch(sym(cuda, c"cuLaunchKernel")),
        launch(sym(ours, c"cuLaunchKernel")),
    );

    let config = gpuslice_cuda_abi::cuda::CUlaunchConfig {
        grid_dim_x: 1,
        grid_dim_y: 1,
        grid_dim_z: 1,
        block_dim_x: 1,
        block_dim_y: 1,
        block_dim_z: 1,
        shared_mem_bytes: 0,
        stream: std::ptr::null_mut(),
        attrs: std::ptr::null_mut(),
        num_attrs: 0,
    };
    let launch_ex = |f: LaunchEx| {
        move || {
            // SAFETY: a launch of the function loaded above with a 1x1x1 grid and block.
            let r = unsafe {
                f(
                    &raw const config,
                    kernel,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
            assert_eq!(r, 0);
        }
    };
    side_by_side(
        "cuLaunchKernelEx",
        2_000_000,
        launch_ex(sym(cuda, c"cuLaunchKernelEx")),
        launch_ex(sym(ours, c"cuLaunchKernelEx")),
    );

    let mut buffer = 0u64;
    let alloc: Alloc = sym(cuda, c"cuMemAlloc_v2");
    // SAFETY: a 1 MiB allocation with the context current.
    assert_eq!(unsafe { alloc(&raw mut buffer, 1 << 20) }, 0);
    let memset = |f: MemsetAsync| {
        move || {
            // SAFETY: setting the first 4 bytes of the allocation above on the default stream.
            assert_eq!(unsafe { f(buffer, 0, 1, std::ptr::null_mut()) }, 0);
        }
    };
    side_by_side(
        "cuMemsetD32Async (4 bytes)",
        2_000_000,
        memset(sym(cuda, c"cuMemsetD32Async")),
        memset(sym(ours, c"cuMemsetD32Async")),
    );

    // A graph of one kernel node, instantiated through the library (which reads its nodes).
    let create: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> c_uint =
        sym(cuda, c"cuGraphCreate");
    let add_kernel: unsafe extern "C" fn(
        *mut *mut c_void,
        *mut c_void,
        *const *mut c_void,
        usize,
        *const gpuslice_cuda_abi::cuda::CUDA_KERNEL_NODE_PARAMS_v2,
    ) -> c_uint = sym(cuda, c"cuGraphAddKernelNode_v2");
    let instantiate: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, u64) -> c_uint =
        sym(ours, c"cuGraphInstantiateWithFlags");
    let (mut graph, mut node, mut exec) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    let params = gpuslice_cuda_abi::cuda::CUDA_KERNEL_NODE_PARAMS_v2 {
        func: kernel,
        grid_dim_x: 1,
        grid_dim_y: 1,
        grid_dim_z: 1,
        block_dim_x: 1,
        block_dim_y: 1,
        block_dim_z: 1,
        shared_mem_bytes: 0,
        kernel_params: std::ptr::null_mut(),
        extra: std::ptr::null_mut(),
        kern: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
    };
    // SAFETY: the graph API called in order on live out-pointers and parameters.
    unsafe {
        assert_eq!(create(&raw mut graph, 0), 0);
        assert_eq!(
            add_kernel(&raw mut node, graph, std::ptr::null(), 0, &raw const params),
            0
        );
        assert_eq!(instantiate(&raw mut exec, graph, 0), 0);
    }
    let graph_launch = |f: GraphLaunch| {
        move || {
            // SAFETY: launching the executable graph made above on the default stream.
            assert_eq!(unsafe { f(exec, std::ptr::null_mut()) }, 0);
        }
    };
    side_by_side(
        "cuGraphLaunch",
        1_000_000,
        graph_launch(sym(cuda, c"cuGraphLaunch")),
        graph_launch(sym(ours, c"cuGraphLaunch")),
    );

    startup(&fronted, &driver_dir);
}

/// Start-up of a program that never loads the driver (`/bin/true`) and of one that loads it
/// and calls `cuInit` (`tests/c/idle.c`): with the container's library path (the fronts)
/// against the simulated driver alone.
fn startup(fronted: &Path, driver_dir: &Path) {
    let work = tempfile::tempdir().unwrap();
    let init = work.path().join("idle");
    let built = Command::new("gcc")
        .args(["-O1", "-o"])
        .arg(&init)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/idle.c"))
        .arg(format!("-L{}", driver_dir.display()))
        .arg("-lcuda")
        .status()
        .is_ok_and(|s| s.success());
    assert!(built, "gcc tests/c/idle.c");
    let init = init.display().to_string();
    let programs: Vec<(&str, Vec<&str>)> = vec![
        ("/bin/true", vec!["/bin/true"]),
        ("cuInit (idle.c)", vec![init.as_str(), "init"]),
    ];
    for (label, argv) in programs {
        let run = |libs: &Path| {
            let argv = argv.clone();
            let libs = libs.to_path_buf();
            move || {
                let mut c = Command::new(argv[0]);
                c.args(&argv[1..]).env("LD_LIBRARY_PATH", &libs);
                assert!(c.status().unwrap().success(), "{argv:?}");
            }
        };
        let (mut plain, mut ours) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            plain.push(per_call(40, run(driver_dir)));
            ours.push(per_call(40, run(fronted)));
        }
        let (p, o) = (median(plain) / 1000.0, median(ours) / 1000.0);
        println!(
            "start-up of {label:<16} driver alone {p:>9.1} µs   through the front {o:>9.1} µs   added {:>7.1} µs   ratio {:.3}",
            o - p,
            o / p
        );
    }
}
