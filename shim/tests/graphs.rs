//! Graph memory nodes in a slice: counted when a launch takes them, from a per-device pool
//! that keeps what it reserved until a trim, as the driver's does; a launch the slice has no
//! room for is refused before it reaches the driver.

mod common;

use common::{Facts, MIB, Slice};

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
fn a_trim_gives_the_pool_back_without_breaking_a_capture_another_thread_holds_open() {
    // 100 MiB launched and freed into the graph pool, then trimmed from a second thread while
    // the first captures in the global mode. The library once waited for the context's work
    // before giving the pool back, a synchronization the driver refuses during such a capture
    // and ends it for (901, invalidated).
    let slice = Slice::new(512 * MIB, 2 * MIB);
    let program = common::compile(&slice.sim, "capture_beside");
    let f = slice.facts(&program, &["trim", &(100 * MIB).to_string()]);
    // Free MiB of the slice: 512 less the context's 2 and the captured stream's 1 MiB buffer.
    assert_eq!(f.get("free_before"), "409", "{:?}", f.0);
    assert_eq!(f.get("call"), "0", "{:?}", f.0);
    assert_eq!(f.get("free_after"), "509", "the pool went back: {:?}", f.0);
    assert_eq!(f.get("end"), "0", "the capture ended intact: {:?}", f.0);
}
