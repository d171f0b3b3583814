//! What the interception library costs, measured side by side in one process:
//! - `cuMemAlloc`+`cuMemFree` pairs and `cuLaunchKernel` calls through libgpuslice.so (with a
//!   slice, so every allocation is counted in the usage region) against the same calls made
//!   directly into the simulated driver;
//! - start-up of a program that never calls CUDA (`/bin/true`) with and without the library
//!   preloaded.
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

fn main() {
    let sim = SimNode::new(1, "A100", None);
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits {
        container_id: "bench".into(),
        gpus: vec![GpuLimit {
            uuid: sim.spec.gpus[0].uuid.clone(),
            memory_bytes: 8 << 30,
            cores: 0,
            context_bytes: 0,
        }],
    };
    std::fs::write(dir.path().join("limits"), limits.render()).unwrap();
    std::fs::write(
        dir.path().join(usage::FILE_NAME),
        usage::new_region(1, usage::DEFAULT_SLOTS),
    )
    .unwrap();
    // SAFETY: single-threaded here; the library reads it on its first CUDA call.
    unsafe { std::env::set_var("GPUSLICE_LIMITS", dir.path().join("limits")) };

    let library = gpuslice_testsupport::target_dir().join("libgpuslice.so");
    let cuda = open(
        &sim.lib_dir().join("libcuda.so.1"),
        libc::RTLD_NOW | libc::RTLD_GLOBAL,
    );
    let ours = open(&library, libc::RTLD_NOW | libc::RTLD_LOCAL);

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

    startup(&library);
}

/// Start-up of programs that never call CUDA: plain, with an empty C library preloaded (what
/// preloading anything costs on this machine), and with libgpuslice.so preloaded.
fn startup(library: &Path) {
    let work = tempfile::tempdir().unwrap();
    let empty = work.path().join("libempty.so");
    std::fs::write(
        work.path().join("empty.c"),
        "int empty_marker(void) { return 0; }\n",
    )
    .unwrap();
    let built = Command::new("gcc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&empty)
        .arg(work.path().join("empty.c"))
        .status()
        .is_ok_and(|s| s.success());
    let mut programs: Vec<Vec<&str>> = vec![vec!["/bin/true"]];
    if Path::new("/usr/bin/python3").exists() {
        programs.push(vec!["/usr/bin/python3", "-c", "pass"]);
    }
    for argv in programs {
        let run = |preload: Option<&Path>| {
            let argv = argv.clone();
            let preload = preload.map(Path::to_path_buf);
            move || {
                let mut c = Command::new(argv[0]);
                c.args(&argv[1..]);
                if let Some(p) = &preload {
                    c.env("LD_PRELOAD", p);
                }
                assert!(c.status().unwrap().success());
            }
        };
        let n = if argv.len() == 1 { 40 } else { 4 };
        let (mut plain, mut floor, mut ours) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            plain.push(per_call(n, run(None)));
            if built {
                floor.push(per_call(n, run(Some(&empty))));
            }
            ours.push(per_call(n, run(Some(library))));
        }
        let (p, o) = (median(plain) / 1000.0, median(ours) / 1000.0);
        let label = format!("start-up of {}", argv.join(" "));
        println!(
            "{label:<28} without {p:>9.1} µs   with libgpuslice     {o:>9.1} µs   added {:>7.1} µs   ratio {:.3}",
            o - p,
            o / p
        );
        if built {
            let f = median(floor) / 1000.0;
            println!(
                "{:<28} with an empty preloaded C library {f:>9.1} µs (ratio {:.3}): the floor for any preload",
                "",
                f / p
            );
        }
    }
}
