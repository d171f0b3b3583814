//! What programs see of the slice: cuMemGetInfo and cuDeviceTotalMem (checked by every run of
//! the wall program), NVML through nvml-wrapper and nvidia-smi, which is built on it.

mod common;

use common::{MIB, Slice};

fn nvidia_smi(slice: &Slice) -> Vec<Vec<String>> {
    let out = slice
        .command(&slice.sim.root().join("usr/bin/nvidia-smi"))
        .args([
            "--query-gpu=uuid,memory.total,memory.used,memory.free",
            "--format=csv,noheader,nounits",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.split(", ").map(str::to_string).collect())
        .collect()
}

#[test]
fn nvidia_smi_in_the_slice_shows_the_slice_and_what_its_processes_hold() {
    let slice = Slice::new(64 * MIB, 2 * MIB);
    let holder = slice.start("hold", 10 * MIB);
    assert_eq!(holder.facts.get("fit"), "CUDA_SUCCESS");
    assert_eq!(holder.facts.num("free_at_fit"), 52 * MIB);

    let rows = nvidia_smi(&slice);
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0][0], slice.sim.spec.gpus[0].uuid);
    // 10 MiB allocated and the 2 MiB context.
    assert_eq!(rows[0][1..], ["64", "12", "52"], "{rows:?}");
    assert_eq!(
        rows[1][1..],
        ["0", "0", "0"],
        "a GPU outside the slice has no memory"
    );
    holder.finish();
    assert_eq!(nvidia_smi(&slice)[0][1..], ["64", "0", "64"]);
}

#[test]
fn without_the_library_nvidia_smi_shows_the_whole_card() {
    let slice = Slice::new(64 * MIB, 2 * MIB);
    let out = std::process::Command::new(slice.sim.root().join("usr/bin/nvidia-smi"))
        .env("LD_LIBRARY_PATH", slice.sim.lib_dir())
        .args(["--query-gpu=memory.total", "--format=csv,noheader,nounits"])
        .output()
        .unwrap();
    let total: u64 = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(total * MIB, slice.sim.spec.gpus[0].memory_bytes);
}
