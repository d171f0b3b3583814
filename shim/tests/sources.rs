//! Where limits come from, and what the library does when there are none or CUDA is never
//! used: the mounted limits file wins over the environment; no file is pure pass-through; a
//! broken file closes the wall; a process that never calls CUDA is left alone.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{MIB, Slice};
use gpuslice_core::limits::{GpuLimit, Limits};

/// What a sleeping process has: its maps, its thread count and its open files.
fn observe(mut cmd: Command, exe: &str) -> (String, usize, Vec<String>) {
    let mut child = cmd.stdin(Stdio::null()).spawn().unwrap();
    let proc = format!("/proc/{}", child.id());
    // Wait for the exec and the loader to be done: the program is then in nanosleep.
    let read = |f: &str| std::fs::read_to_string(format!("{proc}/{f}")).unwrap_or_default();
    let asleep = gpuslice_testsupport::wait_for(std::time::Duration::from_secs(10), || {
        read("maps").contains(exe) && read("wchan").contains("nanosleep")
    });
    assert!(asleep, "{exe} running");
    let maps = read("maps");
    let threads = std::fs::read_dir(format!("{proc}/task")).unwrap().count();
    let mut fds: Vec<String> = std::fs::read_dir(format!("{proc}/fd"))
        .unwrap()
        .map(|e| {
            std::fs::read_link(e.unwrap().path())
                .unwrap()
                .display()
                .to_string()
        })
        .collect();
    fds.sort();
    child.kill().unwrap();
    child.wait().unwrap();
    (maps, threads, fds)
}

#[test]
fn a_process_that_never_loads_the_driver_never_loads_the_library() {
    let slice = Slice::new(64 * MIB, 2 * MIB);
    let mut sleep = slice.command(std::path::Path::new("/bin/sleep"));
    sleep.arg("30");
    let (maps, threads, _) = observe(sleep, "bin/sleep");
    assert!(!maps.contains("libgpuslice"), "{maps}");
    assert_eq!(threads, 1);
}

#[test]
fn a_process_that_loads_the_driver_but_never_calls_it_starts_no_thread_and_opens_no_file() {
    let slice = Slice::new(64 * MIB, 2 * MIB);
    let idle = common::compile(&slice.sim, "idle");
    let mut direct = Command::new(&idle);
    direct.env("LD_LIBRARY_PATH", slice.sim.lib_dir());
    let (plain_maps, plain_threads, plain_fds) = observe(direct, "idle");
    let (maps, threads, fds) = observe(slice.command(&idle), "idle");
    assert!(!plain_maps.contains("libgpuslice.so"));
    assert!(maps.contains("libgpuslice.so"), "the library is loaded");
    assert_eq!((threads, plain_threads), (1, 1));
    assert_eq!(fds, plain_fds, "no extra open file");
    assert!(
        !maps.contains(&slice.dir.path().display().to_string()),
        "nothing mapped"
    );
}

#[test]
fn without_a_limits_file_every_call_passes_through() {
    let slice = Slice::new(64 * MIB, 2 * MIB);
    let card = slice.sim.spec.gpus[0].memory_bytes;
    let out = slice
        .command(&slice.wall)
        .env_remove("GPUSLICE_LIMITS")
        .args(["link", "alloc", &(card - 2 * MIB).to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("total={card} ")), "{text}");
    assert!(text.contains("fit=CUDA_SUCCESS"), "{text}");
}

#[test]
fn a_limits_file_that_cannot_be_parsed_closes_the_wall() {
    let slice = Slice::new(64 * MIB, 0);
    std::fs::write(slice.limits_path(), "version=1\ngpus=banana\n").unwrap();
    let f = slice.wall("link", "alloc", 1);
    // Not even a context: the device is outside every slice the file could have named.
    assert_eq!(f.get("error"), "init", "{:?}", f.0);
    let log = slice
        .command(&slice.wall)
        .env("GPUSLICE_LOG", "1")
        .args(["link", "alloc", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&log.stderr);
    assert!(
        stderr.contains("every allocation will fail") && stderr.contains("limits"),
        "{stderr}"
    );
}

/// Fills `slice` to its end with the wall program, run by `script` in a mount namespace of
/// its own (`"$@"` is the program) with `env` set; fails unless the wall is the slice's.
fn fills_the_slice_from_a_mount_namespace(slice: &Slice, script: &str, env: &[(&str, &Path)]) {
    let mut cmd = slice.in_mount_namespace(script);
    cmd.envs(env.iter().copied()).arg(&slice.wall).args([
        "link",
        "alloc",
        &slice.remaining().to_string(),
    ]);
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(text.contains(&format!("total={} ", 64 * MIB)), "{text}");
    assert!(text.contains("fit=CUDA_SUCCESS"), "{text}");
    assert!(text.contains("over=CUDA_ERROR_OUT_OF_MEMORY"), "{text}");
}

#[test]
fn the_environment_never_overrides_the_limits_file_the_runtime_mounted() {
    let slice = Slice::new(64 * MIB, 2 * MIB);
    // A bigger slice named by the environment, as a container process could try.
    let other = tempfile::tempdir().unwrap();
    let bigger = Limits {
        container_id: "other".into(),
        gpus: vec![GpuLimit {
            uuid: slice.sim.spec.gpus[0].uuid.clone(),
            memory_bytes: 1024 * MIB,
            cores: 0,
            context_bytes: 0,
            window: None,
        }],
    };
    std::fs::write(other.path().join("limits"), bigger.render()).unwrap();
    // The slice's directory mounted at /run/gpuslice.
    let script = r#"mount -t tmpfs tmpfs /run && mkdir /run/gpuslice \
        && mount --bind "$SLICE_DIR" /run/gpuslice && exec "$@""#;
    let limits = other.path().join("limits");
    fills_the_slice_from_a_mount_namespace(
        &slice,
        script,
        &[
            ("GPUSLICE_LIMITS", &limits),
            ("SLICE_DIR", slice.dir.path()),
        ],
    );
}

#[test]
fn on_a_node_whose_run_directory_is_mounted_the_environment_names_the_slice_outside_containers() {
    let slice = Slice::new(64 * MIB, 2 * MIB);
    // The agent's run directory as packaged (a tmpfs at /run/gpuslice, one directory per
    // container in it, none of them mounted): a process on the host is in no container, and
    // its slice is the one the environment names.
    let script = r#"mount -t tmpfs tmpfs /run && mkdir /run/gpuslice \
        && mount -t tmpfs tmpfs /run/gpuslice && mkdir /run/gpuslice/some-container \
        && exec "$@""#;
    fills_the_slice_from_a_mount_namespace(&slice, script, &[]);
}
