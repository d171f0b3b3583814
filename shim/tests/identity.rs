//! Which process holds what: a slot belongs to the process holding its lock, so a process in a
//! nested PID namespace keeps its charge, a child of a raw fork leaves its parent's alone, and
//! a process's charge ends when it exits (a zombie holds nothing) or execs.

mod common;

use common::{Facts, MIB, Running, Slice};

#[test]
fn a_process_in_a_nested_pid_namespace_keeps_its_charge() {
    let slice = Slice::new(64 * MIB, 0);
    // A new user, mount and PID namespace with its own /proc, as any user may make: the holder
    // is pid 1 there and reads its own start time from that /proc; pid 1 of this namespace is
    // another process altogether.
    let mut cmd = slice.command(std::path::Path::new("/usr/bin/unshare"));
    cmd.args(["-Urpf", "--mount-proc", "--"])
        .arg(&slice.wall)
        .args(["link", "hold", &(40 * MIB).to_string()]);
    let holder = Running::start(cmd);
    assert_eq!(
        holder.facts.get("fit"),
        "CUDA_SUCCESS",
        "{:?}",
        holder.facts.0
    );
    // 24 MiB are left: exactly that fits, a byte more does not (the holder was not reaped).
    let f = slice.wall("link", "alloc", 24 * MIB);
    assert_eq!(f.get("fit"), "CUDA_SUCCESS", "{:?}", f.0);
    assert_eq!(f.get("over"), "CUDA_ERROR_OUT_OF_MEMORY", "{:?}", f.0);
    holder.finish();
}

#[test]
fn a_child_of_a_raw_fork_leaves_its_parents_charge_alone() {
    let slice = Slice::new(64 * MIB, 0);
    let program = common::compile(&slice.sim, "lifecycle");
    let mut cmd = slice.command(&program);
    cmd.args(["rawfork", &(40 * MIB).to_string()]);
    let parent = Running::start(cmd);
    assert_eq!(parent.facts.get("alloc"), "0", "{:?}", parent.facts.0);
    assert_eq!(parent.facts.get("child_exited"), "1");
    assert_eq!(
        slice.usage().totals()[0],
        40 * MIB,
        "the child's exit wiped the parent's slot"
    );
    let f = slice.wall("link", "alloc", 24 * MIB);
    assert_eq!(f.get("over"), "CUDA_ERROR_OUT_OF_MEMORY", "{:?}", f.0);
    parent.finish();
}

#[test]
fn a_killed_process_left_a_zombie_holds_no_charge() {
    let slice = Slice::new(64 * MIB, 0);
    let program = common::compile(&slice.sim, "lifecycle");
    let mut cmd = slice.command(&program);
    cmd.args(["zombie", &(40 * MIB).to_string()]);
    let parent = Running::start(cmd);
    assert_eq!(parent.facts.get("child_alloc"), "0", "{:?}", parent.facts.0);
    assert_eq!(parent.facts.get("zombie"), "Z", "{:?}", parent.facts.0);
    // The driver freed its memory when it exited, as the real one does.
    let smi = std::process::Command::new(slice.sim.root().join("usr/bin/nvidia-smi"))
        .env("LD_LIBRARY_PATH", slice.sim.lib_dir())
        .args(["--query-gpu=memory.used", "--format=csv,noheader,nounits"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&smi.stdout).lines().next(),
        Some("0")
    );
    // The dead child's 40 MiB are free again although its parent has not reaped it.
    let f = slice.wall("link", "alloc", 64 * MIB);
    assert_eq!(f.get("fit"), "CUDA_SUCCESS", "{:?}", f.0);
    parent.finish();
}

#[test]
fn exec_gives_the_old_images_charge_back() {
    let slice = Slice::new(64 * MIB, 0);
    let program = common::compile(&slice.sim, "lifecycle");
    let out = slice
        .command(&program)
        .args(["exec", &(40 * MIB).to_string()])
        .arg(&slice.wall)
        .args(["link", "alloc", &(64 * MIB).to_string()])
        .output()
        .unwrap();
    let f = Facts::parse(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(f.get("alloc"), "0", "{:?}", f.0);
    assert_eq!(
        f.get("fit"),
        "CUDA_SUCCESS",
        "the old image's charge stayed: {:?}",
        f.0
    );
}
