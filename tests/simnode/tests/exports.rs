//! The simulated driver libraries export what the real ones export (Debian's driver 535, the
//! reference in `tests/reference/`), `cuGetProcAddress` answers every name and version as the
//! real driver does, and an entry point the simulation does not model answers "not supported"
//! and is counted.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use gpuslice_testsupport::sim::SimNode;

fn reference(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../reference")
        .join(file)
}

fn run(program: &Path, args: &[&Path]) -> String {
    let out = Command::new(program).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    text
}

/// Runs the C program `name` on `sim` to success, with the unmodelled calls logged: what it
/// printed, and the calls counted per program.
fn run_counted(
    sim: &SimNode,
    name: &str,
) -> (
    String,
    std::collections::BTreeMap<String, std::collections::BTreeMap<String, u64>>,
) {
    let program = common::compile(sim, name, &["cuda"]);
    let log = sim.root().join(format!("{name}-calls.log"));
    let out = Command::new(&program)
        .env("LD_LIBRARY_PATH", sim.lib_dir())
        .env("GPUSLICE_SIM_UNMODELLED_LOG", &log)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    let calls = gpuslice_simnode::unmodelled::summarise(&std::fs::read_to_string(&log).unwrap());
    (text, calls)
}

#[test]
fn every_function_of_the_real_driver_exists_and_get_proc_address_answers_as_it_does() {
    let sim = SimNode::new(1, "A10", None);
    let exports = common::compile(&sim, "exports", &["dl"]);
    let text = run(
        &exports,
        &[
            &sim.lib_dir().join("libcuda.so.1"),
            &reference("libcuda.symbols"),
            &reference("proc-address.tsv"),
        ],
    );
    let symbols = std::fs::read_to_string(reference("libcuda.symbols")).unwrap();
    assert!(
        text.contains(&format!("symbols={} ", symbols.lines().count())),
        "{text}"
    );
    assert!(text.contains("failures=0"), "{text}");
}

#[test]
fn every_function_of_the_real_nvml_exists() {
    let sim = SimNode::new(1, "A10", None);
    let exports = common::compile(&sim, "exports", &["dl"]);
    let text = run(
        &exports,
        &[
            &sim.lib_dir().join("libnvidia-ml.so.1"),
            &reference("libnvidia-ml.symbols"),
        ],
    );
    assert!(text.contains("failures=0"), "{text}");
}

#[test]
fn an_unmodelled_entry_point_answers_not_supported_and_is_counted() {
    let sim = SimNode::new(1, "A10", None);
    let (text, calls) = run_counted(&sim, "unmodelled");
    // cuMemPoolExportToShareableHandle twice, cuGraphicsUnregisterResource once:
    // CUDA_ERROR_NOT_SUPPORTED each time.
    assert_eq!(text.trim(), "export=801,801 graphics=801", "{text}");
    let mine = &calls["unmodelled"];
    assert_eq!(mine["cuMemPoolExportToShareableHandle"], 2, "{calls:?}");
    assert_eq!(mine["cuGraphicsUnregisterResource"], 1, "{calls:?}");
    assert_eq!(mine.len(), 2, "a modelled call was counted: {calls:?}");
}

#[test]
fn each_thread_keeps_a_stack_of_contexts_as_the_real_driver_does() {
    let sim = SimNode::new(2, "A10", None);
    let program = common::compile(&sim, "contexts", &["cuda"]);
    let out = Command::new(&program)
        .env("LD_LIBRARY_PATH", sim.lib_dir())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    // An exit handler's call, once the thread's storage is gone, is answered
    // CUDA_ERROR_DEINITIALIZED (4); before, the simulated driver panicked on it.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    // 201 is CUDA_ERROR_INVALID_CONTEXT.
    for fact in [
        "at_exit=4",
        "created_is_current=1",
        "primary_active_before=0",
        "primary_active=1",
        "push=0 pushed_is_current=1",
        "device=0",
        "stack_limit=4096",
        "pop=0 popped_primary=1 back_to_created=1",
        "profile_start=0 profile_stop=0",
        "device_after_pop=1",
        "set_null=0 empty=1",
        "pop_empty=201 profile_no_context=201",
        "destroy=0",
        "set_destroyed=201 push_destroyed=201",
        "primary_active_after=0",
        // 709 is CUDA_ERROR_CONTEXT_IS_DESTROYED; before, the device was asked in vain too.
        "set_unretained_primary=0 unretained_primary_device=0/0 unretained_primary_limit=709",
    ] {
        assert!(text.contains(fact), "{fact}: {text}");
    }
}

/// cuBLAS's and cuBLASLt's CUDA 12.8 runtime asks, at its calls, the tools' interfaces for the
/// thread's context and that context's identity, and makes its context after asking whether
/// it is a CUDA-in-graphics one. Before, the first answered CUDA_ERROR_NOT_SUPPORTED and the
/// second was not served (cuBLAS reported CUBLAS_STATUS_NOT_SUPPORTED for every GEMM), the
/// limit answered CUDA_ERROR_UNSUPPORTED_LIMIT (cuBLASLt went on without the device's SM
/// count: its GEMVs launched grids of no blocks), and cuBLASLt on Hopper crashed calling into
/// a table the driver did not give.
#[test]
fn the_tools_interfaces_answer_the_threads_context_and_its_identity_as_cublas_asks() {
    let sim = SimNode::new(1, "A10", None);
    let (text, calls) = run_counted(&sim, "tools_tables");
    // 201 is CUDA_ERROR_INVALID_CONTEXT, 215 CUDA_ERROR_UNSUPPORTED_LIMIT, 801
    // CUDA_ERROR_NOT_SUPPORTED.
    assert_eq!(
        text.trim(),
        "tls_size=32 context_size=760 current=0 is_pushed=1 identity=0 same_as_driver=1 \
         other_differs=1 null_identity=0 null_id=0 after_pop_is_created=1 cig=0 cig_enabled=0 \
         set_cig=215 destroyed_identity=201 undescribed=1 undescribed_call=801"
    );
    assert_eq!(
        calls["tools_tables"]["cuGetExportTable(1734dc26800d47458726c0f1e7dd8bca)"], 1,
        "{calls:?}"
    );
}

#[test]
fn two_gpus_of_the_node_access_each_others_memory_once_peer_access_is_enabled() {
    let sim = SimNode::new(2, "A10", None);
    // 1 invalid value, 101 invalid device, 201 invalid context, 217 peer access unsupported,
    // 704 already enabled, 705 not enabled.
    common::run_checking(
        &sim,
        "peers",
        &[
            "can_0_1=1 can_1_0=1 can_0_0=0 can_bad=101",
            "attr_access=1 attr_rank=0 attr_same=101 attr_unknown=1",
            "enable=0 enable_again=704 enable_self=201 enable_flags=1",
            "enable_same_device=217 enable_destroyed=201",
            "copy_peer=0 peer_same=1 copy_unified=0 unified_same=1",
            "disable=0 disable_again=705 reverse_enable=0",
            "disable_after_reset=705 enable_after_reset=0",
            "name_704=CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
        ],
    );
}

#[test]
fn a_pools_memory_is_reached_by_its_own_device_and_by_the_others_its_access_was_set_for() {
    let sim = SimNode::new(2, "A10", None);
    // Flags: 0 none, 1 read, 3 read and write; 1 invalid value, 101 invalid device (a
    // negative figure is an error code from cuMemPoolGetAccess).
    common::run_checking(
        &sim,
        "pool_access",
        &[
            "own=3 other=0 set_rw=0 other_rw=3 default_other=0 set_ro=0 other_ro=1",
            "bad_flags=1 bad_type=1 bad_dev=101 still_ro=1",
            "set_own=0 own_after=3 set_none=0 other_none=0",
            "set_default=0 default_rw=3 get_bad_dev=-101",
        ],
    );
}

#[test]
fn the_newer_entry_points_answer_at_the_versions_the_headers_give_them() {
    // Each row of proc-address-newer.tsv names a PFN_<name>_v<version> of the CUDA 12.9
    // headers, and the symbol is exported by the simulated driver.
    #[path = "../../reference/prototypes.rs"]
    mod prototypes;
    let typedefs =
        std::fs::read_to_string(prototypes::header_dirs()[0].join("cudaTypedefs.h")).unwrap();
    let sim = SimNode::new(1, "A10", None);
    let exported = run(
        Path::new("nm"),
        &[Path::new("-D"), &sim.lib_dir().join("libcuda.so.1")],
    );
    let rows = std::fs::read_to_string(reference("proc-address-newer.tsv")).unwrap();
    let rows: Vec<&str> = rows.lines().filter(|l| !l.starts_with('#')).collect();
    assert!(!rows.is_empty());
    for row in rows {
        let [name, version, stream, symbol] = row.split('\t').collect::<Vec<_>>()[..] else {
            panic!("malformed row {row:?}");
        };
        let suffix = match stream {
            "default" => "",
            "ptsz" | "ptds" => &format!("_{stream}"),
            other => panic!("{row}: stream {other}"),
        };
        // The typedef, or for a few the headers declare no typedef of (12.9's
        // cuModuleGetFunctionCount), the name defined as that version.
        assert!(
            typedefs.contains(&format!("PFN_{name}_v{version}{suffix})"))
                || typedefs.contains(&format!(
                    "#define PFN_{name}{suffix} PFN_{name}_v{version}{suffix}\n"
                )),
            "no PFN_{name}_v{version}{suffix} in the headers"
        );
        assert!(
            exported.contains(&format!(" T {symbol}\n")),
            "the simulated driver does not export {symbol}"
        );
    }
}

#[test]
fn a_580_driver_answers_every_cuda_13_entry_point_and_a_550_driver_none_newer_than_itself() {
    let rows = std::fs::read_to_string(reference("proc-address-13000.tsv")).unwrap();
    let rows: Vec<(String, i32)> = rows
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let cols: Vec<&str> = l.split('\t').collect();
            (
                format!("{}@{}/{}", cols[0], cols[1], cols[2]),
                cols[1].parse().unwrap(),
            )
        })
        .collect();
    assert!(rows.len() >= 40, "{rows:?}");
    // What the exports program printed (it exits 1 when a row is not answered as listed).
    let answers = |sim: &SimNode| {
        let exports = common::compile(sim, "exports", &["dl"]);
        let out = Command::new(&exports)
            .arg(sim.lib_dir().join("libcuda.so.1"))
            .arg(reference("libcuda.symbols"))
            .arg(reference("proc-address-13000.tsv"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = answers(&SimNode::with_driver(1, "H100", "580.95.05"));
    assert!(text.contains("failures=0"), "{text}");
    // The 550 driver (CUDA 12.4) answers the rows of its version and older, not the others.
    let text = answers(&SimNode::new(1, "A10", None));
    let refused: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("wrong="))
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    let newer: Vec<&str> = rows
        .iter()
        .filter(|(_, v)| *v > 12040)
        .map(|(r, _)| r.as_str())
        .collect();
    assert_eq!(refused, newer, "{text}");
    assert!(
        rows.len() > newer.len(),
        "no row of 12.4 or older to answer"
    );
}

#[test]
fn a_cuda_13_runtime_finds_what_it_asks_of_a_580_driver_and_a_550_driver_says_what_it_lacks() {
    let sim = SimNode::with_driver(2, "H100", "580");
    assert_eq!(sim.spec.driver_version, "580.95.05");
    let program = common::compile(&sim, "driver13", &["cuda"]);
    let log = sim.root().join("unmodelled.log");
    let text = common::run(&sim, &program, &[("GPUSLICE_SIM_UNMODELLED_LOG", &log)]);
    // 1 invalid value, 201 invalid context, 500 not found, 801 not supported; an H100 SXM5
    // is PCI device 10de:2330.
    for fact in [
        "version_before_init=13000 ",
        "pci_device_id=233010de partial_atomics=0 attribute_148=-1 ",
        "absent_table=500 ",
        "device_of_a=0:0 device_current=0:1 ",
        "synchronize_a=0 synchronize_bogus=201 ",
        "stream_device=0:1 stream_ctx_is_b=0:1 green_null=1 ",
        "default_pool=0:1 host_pool=0:0:1 managed_pool=801 bad_location=1 ",
        "host_pool_for_device=1 device_pool_for_host=1 ",
        "set_pool=0 current_is_mine=0:1 ",
        // The error log (12.9): a callback registered once, the tail at 0, an empty dump.
        "logs_register=0:1 logs_register_null=1 logs_current=0:0 ",
        "logs_dump=0:0:0 logs_dump_no_room=1 logs_unregister=0,1",
    ] {
        assert!(text.contains(fact), "{fact}: {text}");
    }
    // The absent table is counted with the unmodelled calls; nothing else is.
    let counted = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        counted
            .lines()
            .all(|l| l.contains("cuGetExportTable(f8cff95121468b4eb9e2fb469e7c0dd9)")),
        "{counted}"
    );

    let sim = SimNode::new(1, "A10", None);
    let program = common::compile(&sim, "driver13", &["cuda"]);
    let text = common::run(&sim, &program, &[]);
    for fact in [
        "version_before_init=12040 ",
        "pci_device_id=error:1 partial_atomics=-1 ",
        // Names a 550 driver lacks are not found; those it has answer at their older variant.
        "device_of_a=0:0 ",
        "cuStreamGetDevice=missing:1 ",
        "cuMemGetDefaultMemPool=missing:1 cuMemGetMemPool=missing:1 cuMemSetMemPool=missing:1",
    ] {
        assert!(text.contains(fact), "{fact}: {text}");
    }
    assert!(!text.contains("cuCtxGetDevice=missing"), "{text}");
}
