//! The device-memory wall on the simulated node: every allocation path, reached three ways,
//! stops at the exact byte; processes share one limit; killed processes give their memory
//! back; and the slice is what cuMemGetInfo and NVML report.

mod common;

use common::{MIB, Slice};
use gpuslice_cuda_abi::{compressed, writer};

const MODES: &[&str] = &["link", "dlsym", "procaddr", "procaddr_ptds"];
const PATHS: &[&str] = &[
    "alloc", "managed", "pitch", "array", "array3d", "mipmap", "vmm", "heap",
];

/// The stream-ordered paths: their pools take device memory in steps of 32 MiB, as the real
/// driver's do, and the slice holds on what the pool reserves.
const POOL_PATHS: &[&str] = &["async", "pool", "default_pool"];

#[test]
fn every_allocation_path_stops_at_the_exact_byte_however_the_driver_is_reached() {
    // 64 MiB less a 2 MiB context leaves 62 MiB: every path's shapes divide it exactly. For
    // the stream-ordered paths 66 MiB leave 64, two whole steps of their pool.
    for (limit, paths) in [(64 * MIB, PATHS), (66 * MIB, POOL_PATHS)] {
        let slice = Slice::new(limit, 2 * MIB);
        assert_paths_stop_at_the_exact_byte(&slice, paths);
    }
}

fn assert_paths_stop_at_the_exact_byte(slice: &Slice, paths: &[&str]) {
    let r = slice.remaining();
    for mode in MODES {
        for path in paths {
            let f = slice.wall(mode, path, r);
            let what = format!("{mode} {path}: {:?}", f.0);
            assert_eq!(f.num("total"), r + 2 * MIB, "{what}");
            assert_eq!(f.num("device_total"), r + 2 * MIB, "{what}");
            assert_eq!(f.num("start_free"), r, "{what}");
            assert_eq!(f.get("fit"), "CUDA_SUCCESS", "{what}");
            assert_eq!(f.num("free_at_fit"), 0, "{what}");
            assert_eq!(f.get("over"), "CUDA_ERROR_OUT_OF_MEMORY", "{what}");
            assert_eq!(
                f.num("end_free"),
                r,
                "{what}: frees give back what was charged"
            );
        }
    }
    assert_eq!(
        slice.usage().totals(),
        vec![0],
        "exited processes hold nothing"
    );
}

#[test]
fn a_stream_ordered_allocation_whose_pool_step_would_not_fit_is_refused_and_leaves_nothing() {
    // 62 MiB left: 62 MiB from a pool would make it take two steps, 64 MiB.
    let slice = Slice::new(64 * MIB, 2 * MIB);
    let r = slice.remaining();
    for path in POOL_PATHS {
        let f = slice.wall("procaddr", path, r);
        let what = format!("{path}: {:?}", f.0);
        assert_eq!(f.get("fit"), "CUDA_ERROR_OUT_OF_MEMORY", "{what}");
        assert_eq!(f.num("free_at_fit"), r, "{what}: the step went back");
        assert_eq!(f.num("end_free"), r, "{what}");
    }
    // 32 MiB is one whole step: it fits, and the 30 MiB left are less than the next step.
    let f = slice.wall("procaddr", "async", 32 * MIB);
    assert_eq!(f.get("fit"), "CUDA_SUCCESS", "{:?}", f.0);
    assert_eq!(f.num("free_at_fit"), r - 32 * MIB, "{:?}", f.0);
    assert_eq!(f.num("end_free"), r, "{:?}", f.0);
    assert_eq!(slice.usage().totals(), vec![0]);
}

#[test]
fn a_pool_step_refused_beside_a_capture_another_thread_holds_open_leaves_the_capture_intact() {
    // 61 MiB left once the captured stream's 1 MiB buffer is taken: 61 MiB from the default
    // pool take two 32 MiB steps. Refused, the library waits for the stream before it trims
    // the pool; it once synchronized it, which the driver refuses while another thread
    // captures in the global mode and ends that capture for (901, invalidated).
    let slice = Slice::new(64 * MIB, 2 * MIB);
    let program = common::compile(&slice.sim, "capture_beside");
    let f = slice.facts(&program, &["pool", &(61 * MIB).to_string()]);
    assert_eq!(f.get("free_before"), "61", "{:?}", f.0);
    assert_eq!(f.get("call"), "2", "refused for the step: {:?}", f.0);
    assert_eq!(f.get("free_after"), "61", "the step went back: {:?}", f.0);
    assert_eq!(f.get("end"), "0", "the capture ended intact: {:?}", f.0);
}

#[test]
fn a_pool_that_keeps_what_is_freed_stays_charged_reuses_it_and_gives_it_back_when_trimmed() {
    let slice = Slice::new(66 * MIB, 2 * MIB);
    let r = slice.remaining();
    let f = slice.wall("procaddr", "pool_keep", 32 * MIB);
    let what = format!("{:?}", f.0);
    assert_eq!(f.get("fit"), "CUDA_SUCCESS", "{what}");
    assert_eq!(
        f.num("free_at_fit"),
        r - 32 * MIB,
        "{what}: the kept step is charged"
    );
    assert_eq!(
        f.get("again"),
        "CUDA_SUCCESS",
        "{what}: the kept step is used again"
    );
    // 32 MiB and a byte take a second step: the pool then keeps both.
    assert_eq!(f.get("over"), "CUDA_SUCCESS", "{what}");
    assert_eq!(f.num("kept_free"), 0, "{what}");
    assert_eq!(f.num("end_free"), r, "{what}: the trim gave it all back");
}

#[test]
fn memory_from_a_pool_in_host_memory_is_not_charged_and_a_gpu_pool_in_its_place_is() {
    // Page-locked host memory from a pool on host NUMA node 0: four times the slice is
    // granted, and the GPU still has all of its slice.
    let slice = Slice::new(256 * MIB, 0);
    let program = common::compile(&slice.sim, "host_pool");
    let chunk = (64 * MIB).to_string();
    let run = |mode: &str| slice.facts(&program, &[mode, &chunk, "16"]);
    let f = run("host");
    assert_eq!(f.num("host"), 16, "{:?}", f.0);
    assert_eq!(f.num("device"), 256, "{:?}", f.0);
    // A pool on the GPU made where a destroyed host pool was, the same handle or not, is
    // charged as the GPU's.
    let f = run("reuse");
    assert_eq!(f.num("device"), 256, "{:?}", f.0);
    assert_eq!(slice.usage().totals(), vec![0]);
}

#[test]
fn pitched_rows_are_charged_with_their_padding() {
    let slice = Slice::new(64 * MIB, 2 * MIB);
    let f = slice.wall("link", "pitch", slice.remaining());
    // 62 rows of 1 MiB - 1 bytes: 62 MiB - 62 bytes asked for, 62 rows of 1 MiB taken.
    assert_eq!(f.num("pitch"), MIB);
    assert_eq!(f.num("free_at_fit"), 0, "{:?}", f.0);
}

#[test]
fn a_context_takes_its_reservation_from_the_slice() {
    let slice = Slice::new(4 * MIB, 2 * MIB);
    let f = slice.wall("link", "context", 2 * MIB);
    assert_eq!(f.get("fit"), "CUDA_SUCCESS", "{:?}", f.0);
    assert_eq!(f.num("free_at_fit"), 0);
    assert_eq!(f.get("over"), "CUDA_ERROR_OUT_OF_MEMORY");

    let tiny = Slice::new(MIB, 2 * MIB);
    let f = tiny.wall("link", "alloc", 1);
    assert_eq!(
        f.get("error"),
        "init",
        "a context larger than the slice is refused"
    );
}

#[test]
fn a_stack_raised_for_every_resident_thread_is_charged_before_the_driver_takes_it() {
    let slice = Slice::new(64 * MIB, 2 * MIB);
    let r = slice.remaining();
    for mode in MODES {
        let f = slice.wall(mode, "stack", r);
        let what = format!("{mode}: {:?}", f.0);
        // The T4: 40 SMs of 1024 threads.
        assert_eq!(f.num("unit"), 40 * 1024, "{what}");
        assert_eq!(f.get("fit"), "CUDA_SUCCESS", "{what}");
        assert_eq!(f.num("free_at_fit"), r % (40 * 1024), "{what}");
        assert_eq!(f.get("over"), "CUDA_ERROR_OUT_OF_MEMORY", "{what}");
        assert_eq!(
            f.num("kept_after_over"),
            1,
            "a refused limit is left as it was: {what}"
        );
        assert_eq!(f.get("lowered"), "CUDA_SUCCESS", "{what}");
        assert_eq!(f.num("end_free"), r, "lowering gives it back: {what}");
    }
}

#[test]
fn a_kernel_needing_more_local_memory_than_the_stack_is_charged_its_growth_before_it_launches() {
    let slice = Slice::new(64 * MIB, 2 * MIB);
    let r = slice.remaining();
    // The T4: 40 SMs of 1024 threads; the stack a thread grows by is the most that fits.
    let unit = 40 * 1024;
    for mode in MODES {
        let f = slice.wall(mode, "local", r);
        let what = format!("{mode}: {:?}", f.0);
        assert_eq!(f.num("unit"), unit, "{what}");
        assert_eq!(f.get("fit"), "CUDA_SUCCESS", "{what}");
        assert_eq!(
            f.num("grown_by"),
            r / unit,
            "the driver grew the stack: {what}"
        );
        assert_eq!(f.num("free_at_fit"), r % unit, "{what}");
        assert_eq!(
            f.get("over"),
            "CUDA_ERROR_OUT_OF_MEMORY",
            "a byte more a thread is refused: {what}"
        );
        assert_eq!(
            f.get("grid_over"),
            "CUDA_ERROR_OUT_OF_MEMORY",
            "through cuLaunchGrid too: {what}"
        );
        assert_eq!(f.num("kept_after_over"), 1, "{what}");
        assert_eq!(f.get("lowered"), "CUDA_SUCCESS", "{what}");
        assert_eq!(f.num("lowered_free"), r, "lowering gives it back: {what}");
        assert_eq!(f.get("graph_fit"), "CUDA_SUCCESS", "{what}");
        assert_eq!(
            f.num("graph_free"),
            r % unit,
            "a graph's kernel too: {what}"
        );
        assert_eq!(f.get("graph_over"), "CUDA_ERROR_OUT_OF_MEMORY", "{what}");
        // A graph instantiated with the kernel that fits, its node then given the one that
        // does not (cuGraphExecKernelNodeSetParams): refused as that kernel's launch is.
        assert_eq!(f.get("swap"), "CUDA_SUCCESS", "{what}");
        assert_eq!(f.get("graph_swapped"), "CUDA_ERROR_OUT_OF_MEMORY", "{what}");
        // Kernels standing in other graphs: a child graph, the body of a conditional `if`
        // node, and a node given another child graph or kernel in the executable graph alone
        // (cuGraphExecChildGraphNodeSetParams, cuGraphExecNodeSetParams).
        assert_eq!(f.get("child_fit"), "CUDA_SUCCESS", "{what}");
        for key in [
            "child_over",
            "if_over",
            "child_swapped",
            "child_swapped_generic",
            "kernel_swapped_generic",
        ] {
            assert_eq!(f.get(key), "CUDA_ERROR_OUT_OF_MEMORY", "{key}: {what}");
        }
        for key in [
            "child_swapped_change",
            "child_swapped_generic_change",
            "kernel_swapped_generic_change",
        ] {
            assert_eq!(f.get(key), "CUDA_SUCCESS", "{key}: {what}");
        }
        assert_eq!(f.num("end_free"), r, "{what}");
    }
    assert_eq!(
        slice.usage().totals(),
        vec![0],
        "exited processes hold nothing"
    );
}

#[test]
fn a_raised_limit_goes_back_with_its_context() {
    let slice = Slice::new(64 * MIB, 2 * MIB);
    let r = slice.remaining();
    let f = slice.wall("procaddr", "limit_gone", 30 * MIB);
    let what = format!("{:?}", f.0);
    assert_eq!(f.get("own_raised"), "CUDA_SUCCESS", "{what}");
    assert_eq!(f.num("after_destroy"), r, "{what}");
    assert_eq!(f.get("primary_raised"), "CUDA_SUCCESS", "{what}");
    assert_eq!(f.num("free_at_fit"), r - 30 * MIB, "{what}");
    assert_eq!(f.num("after_release"), r, "{what}");
    assert_eq!(slice.usage().totals(), vec![0], "{what}");
}

#[test]
fn resetting_the_primary_context_gives_back_all_it_held() {
    // 64 MiB: the stream-ordered quarter (15.5 MiB) takes one 32 MiB step of its pool.
    let slice = Slice::new(66 * MIB, 2 * MIB);
    let r = slice.remaining();
    for mode in MODES {
        let f = slice.wall(mode, "reset", r);
        let what = format!("{mode}: {:?}", f.0);
        assert_eq!(
            f.get("held"),
            "CUDA_SUCCESS,CUDA_SUCCESS,CUDA_SUCCESS",
            "{what}"
        );
        assert!(f.num("before_reset") < r / 4, "{what}");
        assert_eq!(f.get("reset"), "CUDA_SUCCESS", "{what}");
        assert_eq!(f.get("fit"), "CUDA_SUCCESS", "{what}");
        assert_eq!(f.num("free_at_fit"), 0, "{what}");
        assert_eq!(f.get("over"), "CUDA_ERROR_OUT_OF_MEMORY", "{what}");
        assert_eq!(f.num("end_free"), r, "{what}");
    }
    assert_eq!(slice.usage().totals(), vec![0]);
}

#[test]
fn a_modules_global_variables_are_charged_before_the_driver_loads_it() {
    let slice = Slice::new(66 * MIB, 2 * MIB);
    let r = slice.remaining();
    for mode in MODES {
        let f = slice.wall(mode, "module", r);
        let what = format!("{mode}: {:?}", f.0);
        assert_eq!(f.get("fit"), "CUDA_SUCCESS", "{what}");
        assert_eq!(f.num("free_at_fit"), 0, "{what}");
        assert_eq!(f.num("after_unload"), r, "{what}");
        assert_eq!(f.get("over"), "CUDA_ERROR_OUT_OF_MEMORY", "{what}");
        assert_eq!(f.get("ex"), "CUDA_SUCCESS", "{what}");
        assert_eq!(f.num("ex_free"), r - r / 2, "{what}");
        assert_eq!(f.get("library"), "CUDA_SUCCESS", "{what}");
        assert_eq!(f.num("library_free"), r - r / 2, "{what}");
        assert_eq!(f.get("in_ctx"), "CUDA_SUCCESS", "{what}");
        assert_eq!(f.num("after_ctx"), r, "{what}");
        assert_eq!(f.num("end_free"), r, "{what}");
    }
    assert_eq!(slice.usage().totals(), vec![0]);
}

/// A fat binary of one PTX entry for compute capability 7.0 declaring a global of `bytes`,
/// compressed as `nvcc` compresses entries: an LZ4 block or a Zstandard frame.
fn compressed_module(bytes: u64, zstd: bool) -> Vec<u8> {
    let ptx = format!(
        ".version 7.0\n.target sm_70\n.address_size 64\n\
         .visible .global .align 8 .b8 wall_blob[{bytes}];\n\0"
    );
    let (flags, data) = if zstd {
        let data = ruzstd::encoding::compress_to_vec(
            ptx.as_bytes(),
            ruzstd::encoding::CompressionLevel::Fastest,
        );
        (compressed::ZSTD, data)
    } else {
        (compressed::LZ4, lz4_flex::block::compress(ptx.as_bytes()))
    };
    writer::fat_binary(&[writer::compressed_entry(
        writer::PTX,
        70,
        flags,
        &data,
        ptx.len(),
    )])
}

#[test]
fn a_compressed_modules_global_variables_are_charged_before_the_driver_loads_it() {
    let slice = Slice::new(66 * MIB, 2 * MIB);
    let r = slice.remaining();
    for zstd in [false, true] {
        let fits = slice.dir.path().join("fits.fatbin");
        let over = slice.dir.path().join("over.fatbin");
        std::fs::write(&fits, compressed_module(r / 2, zstd)).unwrap();
        std::fs::write(&over, compressed_module(r + 1, zstd)).unwrap();
        let env = [
            ("WALL_MODULE_IMAGE", fits.as_path()),
            ("WALL_MODULE_IMAGE_OVER", over.as_path()),
        ];
        let f = slice.wall_in("link", "module_image", r, &env);
        let what = format!("zstd {zstd}: {:?}", f.0);
        assert_eq!(f.get("fit"), "CUDA_SUCCESS", "{what}");
        assert_eq!(f.num("free_at_fit"), r - r / 2, "{what}");
        assert_eq!(f.num("after_unload"), r, "{what}");
        assert_eq!(f.get("over"), "CUDA_ERROR_OUT_OF_MEMORY", "{what}");
        assert_eq!(f.num("end_free"), r, "{what}");
    }
    assert_eq!(slice.usage().totals(), vec![0]);
}

#[test]
fn threads_raising_one_limit_at_once_leave_it_charged_exactly_what_it_holds() {
    let slice = Slice::new(66 * MIB, 2 * MIB);
    let r = slice.remaining();
    for mode in ["link", "procaddr"] {
        let f = slice.wall(mode, "heap_race", r);
        let what = format!("{mode}: {:?}", f.0);
        assert!(
            f.num("refused") > 0,
            "no size past the slice was asked: {what}"
        );
        assert!(f.num("raised_by") <= r, "{what}");
        assert_eq!(f.num("free_at_fit"), r - f.num("raised_by"), "{what}");
        assert_eq!(f.get("fit"), "CUDA_SUCCESS", "{what}");
        assert_eq!(f.get("over"), "CUDA_ERROR_OUT_OF_MEMORY", "{what}");
        assert_eq!(f.num("end_free"), r, "{what}");
    }
}

#[test]
fn threads_launching_kernels_that_grow_the_stack_at_once_leave_it_charged_exactly_what_it_holds() {
    let slice = Slice::new(64 * MIB, 2 * MIB);
    let r = slice.remaining();
    for mode in ["link", "procaddr"] {
        let f = slice.wall(mode, "local_race", r);
        let what = format!("{mode}: {:?}", f.0);
        assert_eq!(f.num("failed"), 0, "every kernel that fits ran: {what}");
        assert!(f.num("tried_over") > 0, "{what}");
        assert_eq!(
            f.num("refused"),
            f.num("tried_over"),
            "a byte a thread over is refused every time: {what}"
        );
        assert!(f.num("raised_by") > 0 && f.num("raised_by") <= r, "{what}");
        assert_eq!(
            f.num("free_at_fit"),
            r - f.num("raised_by"),
            "charged once, what the driver grew: {what}"
        );
        assert_eq!(f.get("fit"), "CUDA_SUCCESS", "{what}");
        assert_eq!(f.num("end_free"), r, "{what}");
    }
    assert_eq!(slice.usage().totals(), vec![0]);
}

#[test]
fn memory_left_in_a_destroyed_context_goes_back_with_it() {
    let slice = Slice::new(66 * MIB, 2 * MIB);
    let r = slice.remaining();
    for mode in MODES {
        let f = slice.wall(mode, "ctx_gone", r);
        let what = format!("{mode}: {:?}", f.0);
        assert_eq!(f.get("own_held"), "CUDA_SUCCESS,CUDA_SUCCESS", "{what}");
        assert_eq!(f.get("own_destroyed"), "CUDA_SUCCESS", "{what}");
        assert_eq!(f.num("after_destroy"), r, "{what}");
        // The primary context gone with its quarter: the context kept takes its place.
        assert_eq!(f.get("primary_held"), "CUDA_SUCCESS", "{what}");
        assert_eq!(f.num("after_release"), r, "{what}");
        assert_eq!(f.get("fit"), "CUDA_SUCCESS", "{what}");
        assert_eq!(f.num("free_at_fit"), 0, "{what}");
        assert_eq!(f.get("over"), "CUDA_ERROR_OUT_OF_MEMORY", "{what}");
    }
    assert_eq!(slice.usage().totals(), vec![0]);
}

#[test]
fn a_green_context_is_charged_as_a_context_and_so_is_the_primary_one_it_retains() {
    // Room for five more contexts and a half: green contexts on 8 of the T4's 40 SMs.
    let slice = Slice::new(13 * MIB, 2 * MIB);
    let r = slice.remaining();
    for mode in MODES {
        let f = slice.wall(mode, "green", r);
        let what = format!("{mode}: {:?}", f.0);
        assert_eq!((f.num("sms"), f.num("group")), (40, 8), "{what}");
        assert_eq!(f.num("made"), 5, "{what}");
        assert_eq!(f.get("over"), "CUDA_ERROR_OUT_OF_MEMORY", "{what}");
        assert_eq!(f.num("free_at_fit"), MIB, "{what}");
        assert_eq!(f.get("alloc_in_green"), "CUDA_SUCCESS", "{what}");
        assert_eq!(f.num("destroyed"), 5, "{what}");
        assert_eq!(f.num("after_destroy"), r, "{what}");
        // With the primary context released, a green context retains it again: both charged.
        assert_eq!(f.get("alone"), "CUDA_SUCCESS", "{what}");
        assert_eq!(f.num("alone_free"), r - 2 * MIB, "{what}");
        // The primary context ends with the green context holding it last, and with it what
        // was allocated in it.
        assert_eq!(f.get("left"), "CUDA_SUCCESS,CUDA_SUCCESS", "{what}");
        assert_eq!(f.num("end_free"), r, "{what}");
    }
    assert_eq!(slice.usage().totals(), vec![0]);
}

#[test]
fn properties_changed_by_another_thread_during_the_call_cannot_make_an_allocation_uncharged() {
    // A tenant's thread flips cuMemCreate's location between the host (not charged) and the
    // device while the call reads it: the driver is given the copy the library read.
    let slice = Slice::new(64 * MIB, 2 * MIB);
    let r = slice.remaining();
    for mode in MODES {
        let f = slice.wall(mode, "vmm_race", r);
        let what = format!("{mode}: {:?}", f.0);
        assert!(f.num("made") > 0, "{what}");
        assert!(f.num("made") <= f.num("room"), "{what}");
        assert_eq!(f.num("end_free"), r, "{what}");
    }
    assert_eq!(slice.usage().totals(), vec![0]);
}

#[test]
fn opengl_and_vdpau_interop_contexts_are_charged_as_contexts() {
    // Room for five more contexts and a half.
    let slice = Slice::new(13 * MIB, 2 * MIB);
    let r = slice.remaining();
    for mode in MODES {
        let f = slice.wall(mode, "interop", r);
        let what = format!("{mode}: {:?}", f.0);
        for call in ["gl", "vdpau"] {
            assert_eq!(f.num(&format!("{call}_made")), 5, "{call}: {what}");
            assert_eq!(
                f.get(&format!("{call}_over")),
                "CUDA_ERROR_OUT_OF_MEMORY",
                "{call}: {what}"
            );
            assert_eq!(f.num(&format!("{call}_free")), MIB, "{call}: {what}");
        }
        assert_eq!(f.get("fit"), "CUDA_SUCCESS", "{what}");
        assert_eq!(f.num("end_free"), r, "{what}");
    }
    assert_eq!(slice.usage().totals(), vec![0]);
}

#[test]
fn freeing_twice_or_freeing_a_stranger_gives_nothing_back_twice() {
    let slice = Slice::new(64 * MIB, 2 * MIB);
    let r = slice.remaining();
    let f = slice.wall("link", "double_free", r);
    assert_eq!(f.get("fit"), "CUDA_SUCCESS");
    assert_eq!(
        f.num("free_at_fit"),
        r,
        "usage went neither negative nor below zero"
    );
    assert_eq!(f.get("over"), "CUDA_ERROR_OUT_OF_MEMORY");
    assert!(slice.usage().totals()[0] <= 64 * MIB);
}

#[test]
fn processes_of_a_slice_share_one_limit_and_never_exceed_it_together() {
    let slice = Slice::new(64 * MIB, 2 * MIB);
    let running: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..6)
            .map(|_| scope.spawn(|| slice.start("fill", MIB)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // A process that found no room even for its context stops at start-up.
    let started = running
        .iter()
        .filter(|r| r.facts.get("fit") == "CUDA_ERROR_OUT_OF_MEMORY")
        .count();
    let chunks: u64 = running
        .iter()
        .filter(|r| r.facts.get("error") != "init")
        .map(|r| r.facts.num("chunks"))
        .sum();
    let held = chunks * MIB + started as u64 * 2 * MIB;
    assert_eq!(
        held,
        64 * MIB,
        "filled to the byte, not beyond: {started} processes"
    );
    assert_eq!(slice.usage().totals(), vec![64 * MIB]);
    let holding = slice.usage().slots.iter().filter(|s| s.used[0] > 0).count();
    assert_eq!(holding, started, "one slot per process holding memory");
    for r in running {
        if r.facts.get("error") == "init" {
            r.kill();
        } else {
            r.finish();
        }
    }
    assert_eq!(slice.usage().totals(), vec![0]);
}

#[test]
fn a_killed_process_gives_its_memory_back_even_mid_update() {
    let slice = Slice::new(64 * MIB, 2 * MIB);
    let r = slice.remaining();
    let holder = slice.start("hold", r);
    assert_eq!(holder.facts.get("fit"), "CUDA_SUCCESS");
    assert_eq!(
        slice.wall("link", "alloc", 1).get("error"),
        "init",
        "no room for a context"
    );
    holder.kill();
    let f = slice.wall("link", "alloc", r);
    assert_eq!(f.num("start_free"), r, "{:?}", f.0);
    assert_eq!(f.get("fit"), "CUDA_SUCCESS");

    // Processes killed at random instants while they allocate and free.
    for round in 0..5u64 {
        let churners: Vec<_> = (0..4).map(|_| slice.start("churn", 3 * MIB)).collect();
        std::thread::sleep(std::time::Duration::from_millis(5 + 7 * round));
        for c in churners {
            c.kill();
        }
    }
    assert!(
        slice.usage().totals()[0] <= 64 * MIB,
        "never above the limit"
    );
    let f = slice.wall("link", "alloc", r);
    assert_eq!(
        f.num("start_free"),
        r,
        "every dead process reaped: {:?}",
        f.0
    );
    assert_eq!(f.get("fit"), "CUDA_SUCCESS");
    assert_eq!(f.get("over"), "CUDA_ERROR_OUT_OF_MEMORY");
    assert_eq!(slice.usage().totals(), vec![0]);
}

#[test]
fn a_usage_region_truncated_under_running_processes_closes_their_wall_and_kills_none() {
    let slice = Slice::new(64 * MIB, 0);
    let holder = slice.start("hold", 16 * MIB);
    common::truncate(&slice.dir.path().join(gpuslice_core::usage::FILE_NAME));
    // The holder frees its 16 MiB (touching the truncated region) and exits normally, where
    // SIGBUS used to end it.
    holder.finish();
    // A process that maps the truncated region cannot start a slice: its wall is closed.
    let f = slice.wall("link", "alloc", 1);
    assert_eq!(f.get("error"), "init", "{:?}", f.0);
}

#[test]
fn a_released_handle_stays_charged_until_its_last_unmap() {
    let slice = Slice::new(64 * MIB, 0);
    let vmm = common::compile(&slice.sim, "vmm");
    let out = slice
        .command(&vmm)
        .args([(32 * MIB).to_string(), "6".into()])
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&out.stdout);
    let f = common::Facts::parse(&line);
    // Two 32 MiB handles fill the 64 MiB slice while they stay mapped, released or not.
    assert_eq!(f.get("mapped"), "2", "{line}");
    assert_eq!(f.get("after_unmap"), "0", "{line}");
}

#[test]
fn a_retained_handle_keeps_its_allocation_charged_until_its_last_release() {
    // A tenant retains each mapped allocation, releases the handle it created and unmaps it:
    // the memory stays, held by the retained handle.
    let slice = Slice::new(64 * MIB, 0);
    let vmm = common::compile(&slice.sim, "vmm");
    let out = slice
        .command(&vmm)
        .args([(32 * MIB).to_string(), "6".into(), "retain".into()])
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&out.stdout);
    let f = common::Facts::parse(&line);
    assert_eq!(f.get("held"), "2", "{line}");
    assert_eq!(f.get("after_release"), "0", "{line}");
    assert_eq!(slice.usage().totals(), vec![0], "{line}");
}

#[test]
fn the_simulated_driver_frees_a_released_handle_at_its_last_unmap() {
    let slice = Slice::new(64 * MIB, 0);
    let vmm = common::compile(&slice.sim, "vmm");
    let card = slice.sim.spec.gpus[0].memory_bytes;
    // Without the library: the card holds as many chunks as fit, however they are released.
    let chunk = card / 4;
    let out = std::process::Command::new(&vmm)
        .env("LD_LIBRARY_PATH", slice.sim.lib_dir())
        .args([chunk.to_string(), "6".into()])
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&out.stdout);
    let f = common::Facts::parse(&line);
    assert_eq!(f.get("mapped"), "4", "{line}");
    assert_eq!(f.get("after_unmap"), "0", "{line}");
    // A retained handle is one more reference: the memory stays until it is released too.
    let out = std::process::Command::new(&vmm)
        .env("LD_LIBRARY_PATH", slice.sim.lib_dir())
        .args([chunk.to_string(), "6".into(), "retain".into()])
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&out.stdout);
    let f = common::Facts::parse(&line);
    assert_eq!(f.get("held"), "4", "{line}");
    assert_eq!(f.get("after_release"), "0", "{line}");
}

/// Races another thread of the program changing the driver's state (ending captures, or
/// swapping the device's current pool) against `what` for 1.5 s in a 256 MiB slice whose
/// contexts take nothing (`shim/tests/c/capture_race.c`), and returns the MiB the driver
/// holds for the program (the simulated nvidia-smi, without the library) with the program's
/// facts.
fn race_capture_ends(what: &[&str]) -> (u64, String) {
    let slice = Slice::new(256 * MIB, 0);
    let racer = common::compile(&slice.sim, "capture_race");
    let mut cmd = slice.command(&racer);
    cmd.args(what);
    let running = common::Running::start(cmd);
    let facts = format!("{:?}", running.facts.0);
    // The changes raced the calls (with "limit", the program stops once it finds the stack
    // grown behind the library's back, which may be soon).
    assert!(running.facts.num("captures") > 0, "no race: {facts}");
    assert!(running.facts.num("attempts") > 0, "no race: {facts}");
    let smi = std::process::Command::new(slice.sim.root().join("usr/bin/nvidia-smi"))
        .env("LD_LIBRARY_PATH", slice.sim.lib_dir())
        .args(["--query-gpu=memory.used", "--format=csv,noheader,nounits"])
        .output()
        .unwrap();
    let used: u64 = String::from_utf8_lossy(&smi.stdout)
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .expect("nvidia-smi's memory.used");
    running.finish();
    (used, facts)
}

#[test]
fn ending_a_capture_while_another_thread_allocates_on_its_stream_takes_nothing_past_the_slice() {
    // Eight 32 MiB stream-ordered allocations at most. Before the library held captures from
    // ending between its question and the driver's allocation, the program took the whole
    // 15 GiB card.
    let (used, facts) = race_capture_ends(&[&(32 * MIB).to_string(), "1500"]);
    assert!(
        used <= 256,
        "the process holds {used} MiB of a 256 MiB slice ({facts})"
    );
}

#[test]
fn ending_a_capture_while_another_thread_launches_on_its_stream_grows_no_stack_past_the_slice() {
    // 16 KiB of local memory a thread: the T4's stack for it is 640 MiB, more than the slice,
    // so the launch is refused outside a capture and recorded (taking nothing) inside one.
    let (used, facts) = race_capture_ends(&[&(16 << 10).to_string(), "1500", "launch"]);
    assert!(
        used <= 256,
        "the process holds {used} MiB of a 256 MiB slice ({facts})"
    );
}

#[test]
fn swapping_the_devices_pool_while_another_thread_allocates_from_it_takes_nothing_past_the_slice() {
    // 1 MiB allocations from the device's current pool while another thread makes each of 64
    // pools current in turn: each pool takes a 32 MiB step, charged to the pool it is.
    // The same with CUDA 13's cuMemSetMemPool (before the library held it as it holds
    // cuDeviceSetMemPool, the program took the whole 15 GiB card).
    for how in ["pools", "pools13"] {
        let (used, facts) = race_capture_ends(&[&MIB.to_string(), "1500", how]);
        assert!(
            used <= 256,
            "{how}: the process holds {used} MiB of a 256 MiB slice ({facts})"
        );
    }
}

#[test]
fn lowering_the_stack_while_another_thread_launches_a_kernel_that_needs_it_takes_nothing_past_the_slice()
 {
    // 4 KiB a thread: 160 MiB of the T4's stack. Another thread raises the stack to it and
    // lowers it again while this one launches the kernel, then fills the rest of the slice.
    let (used, facts) = race_capture_ends(&[&(4 << 10).to_string(), "1500", "limit"]);
    assert!(
        used <= 256,
        "the process holds {used} MiB of a 256 MiB slice ({facts})"
    );
}

#[test]
fn an_image_rewritten_while_its_module_loads_takes_nothing_past_the_slice() {
    // Another thread of the program declares the image's global 1 byte or 64 MiB long in
    // turn, in place, while this one loads it again and again.
    let (used, facts) = race_capture_ends(&[&(64 * MIB).to_string(), "1500", "module"]);
    assert!(
        used <= 256,
        "the process holds {used} MiB of a 256 MiB slice ({facts})"
    );
}
