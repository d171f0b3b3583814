//! Graph memory nodes in a slice: counted when a launch takes them, from a per-device pool
//! that keeps what it reserved until a trim, as the driver's does; a launch the slice has no
//! room for is refused before it reaches the driver.

mod common;

use common::{Facts, MIB, Slice};
use gpuslice_testsupport::sim::SimNode;

const GIB: u64 = 1 << 30;

#[test]
fn graph_allocations_are_charged_at_launch_and_the_pool_stays_charged_until_a_trim() {
    let slice = Slice::new(512 * MIB, 2 * MIB);
    let program = common::compile(&slice.sim, "graphs");
    let out = slice.command(&program).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let f = Facts::parse(&text);
    // Free MiB of the slice: 512 less the context's 2. 1 is CUDA_ERROR_INVALID_VALUE (the
    // driver refusing a graph relaunched while it holds its allocation), 2 out of memory.
    let expected = [
        ("start", "510"),
        ("captured", "0"),
        ("after_capture", "510"),
        ("launch", "0"),
        ("after_launch", "310"),
        ("drv_after_launch", "200"),
        ("relaunch_held", "1"),
        ("after_relaunch", "310"),
        ("free", "0"),
        // The freed 200 MiB stay in the graph pool: 2 + 200 + 400 is over the slice.
        ("after_free", "310"),
        ("alloc_over_pool", "2"),
        ("alloc_beside_pool", "0"),
        ("too_big", "2"),
        ("upload_too_big", "2"),
        ("after_too_big", "310"),
        ("drv_after_too_big", "200"),
        // 300 MiB allocated and freed inside one graph: the pool grows by 100 MiB.
        ("inside", "0"),
        ("after_inside", "210"),
        ("inside_again", "0"),
        ("after_inside_again", "210"),
        ("trim", "0"),
        ("after_trim", "510"),
        ("drv_after_trim", "0"),
        ("auto_free", "0,0,0"),
        ("after_auto_free", "410"),
        // 100 MiB from the default pool, which takes it in 32 MiB steps: 128 MiB.
        ("with_m", "382"),
        ("captured_free", "0"),
        // A free captured into a graph gives nothing back until the graph runs.
        ("after_captured_free", "382"),
        ("freed_by_graph", "0"),
        ("end", "510"),
        // Updated from a 100 MiB graph to a 300 MiB one: the launch takes 300 MiB.
        ("update", "0,0"),
        ("updated_launch", "0"),
        ("after_update", "210"),
        ("drv_after_update", "300"),
    ];
    for (k, v) in expected {
        assert_eq!(f.get(k), v, "{k}: {text}");
    }
    // The process has exited: nothing stays charged.
    assert_eq!(slice.usage().totals()[0], 0);
}

#[test]
fn a_trim_keeps_what_a_running_graph_uses_and_breaks_no_capture_another_thread_holds_open() {
    // A graph allocating 100 MiB, running a 200 ms kernel and freeing them, then a trim from a
    // second thread while the first captures in the global mode. The library once waited for
    // the context's work before giving the pool back, a synchronization the driver refuses
    // during such a capture and ends it for (901, invalidated); giving back what its books
    // count as unused without waiting would give back what the running graph still uses,
    // which the driver keeps. Once the graph has run, a trim gives it back.
    let sim = SimNode::with_kernel_time(1, "T4", None, 1_000);
    let slice = Slice::on(sim, GIB);
    let program = common::compile(&slice.sim, "capture_beside");
    let f = slice.facts(&program, &["trim", &(100 * MIB).to_string()]);
    let what = format!("{:?}", f.0);
    assert_eq!(f.get("call"), "0", "{what}");
    assert_eq!(f.get("end"), "0", "the capture ended intact: {what}");
    assert_eq!(
        f.num("free_after"),
        f.num("free_before"),
        "the running graph's memory stayed charged: {what}"
    );
    assert_eq!((f.get("done"), f.get("again")), ("0", "0"), "{what}");
    assert_eq!(
        f.num("free_end"),
        f.num("free_before") + 100,
        "the pool went back once the graph had run: {what}"
    );
}

#[test]
fn graphs_that_may_run_at_once_are_charged_memory_of_their_own() {
    // Four graphs of 100 MiB each (allocated, used by a 100 ms kernel, freed), each launched
    // on a stream of its own while the others run, in a slice with room for three: the
    // driver gives each graph memory of its own, so the fourth launch is refused. Then, once
    // all have run, the four on one stream reuse the same memory, and all four go.
    let sim = SimNode::with_kernel_time(1, "T4", None, 1_000);
    let context = sim.spec.gpus[0].context_bytes;
    let slice = Slice::on(sim, context + 310 * MIB);
    let program = common::compile(&slice.sim, "graph_streams");
    let f = slice.facts(&program, &["4", &(100 * MIB).to_string()]);
    let what = format!("{:?}", f.0);
    let launch = |k: &str| -> (String, u64, u64) {
        let v: Vec<&str> = f.get(k).split(',').collect();
        (
            v[0].to_string(),
            v[1].parse().unwrap(),
            v[2].parse().unwrap(),
        )
    };
    for i in 0..3 {
        let (r, free, pool) = launch(&format!("apart{i}"));
        assert_eq!(r, "0", "launch {i} apart: {what}");
        assert_eq!(
            pool,
            100 * (i + 1),
            "the driver's pool after launch {i}: {what}"
        );
        assert_eq!(
            free,
            310 - pool,
            "launch {i} apart is charged the pool: {what}"
        );
    }
    let (r, _, pool) = launch("apart3");
    assert_eq!(r, "2", "the fourth graph at once has no room: {what}");
    assert_eq!(pool, 300, "{what}");
    for i in 0..4 {
        let (r, _, pool) = launch(&format!("inline{i}"));
        assert_eq!(r, "0", "launch {i} on one stream: {what}");
        assert_eq!(pool, 300, "the pool is reused on one stream: {what}");
    }
    assert_eq!(slice.usage().totals()[0], 0, "{what}");
    // The same four, each launched by a thread of its own on its per-thread default stream:
    // one handle, four streams.
    let f = slice.facts(&program, &["4", &(100 * MIB).to_string(), "threads"]);
    let what = format!("{:?}", f.0);
    for i in 0..3 {
        assert_eq!(
            f.get(&format!("threads{i}")),
            format!("0,{}", 100 * (i + 1)),
            "{what}"
        );
    }
    assert_eq!(f.get("threads3"), "2,300", "{what}");
}
