//! The simulated driver seen from outside: a C program linked with -lcuda, NVML through
//! nvml-wrapper, and nvidia-smi, across processes.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

use gpuslice_testsupport::sim::SimNode;
use nvml_wrapper::Nvml;
use nvml_wrapper::enums::device::UsedGpuMemory;

mod common;

const GIB: u64 = 1 << 30;

fn compile_client(sim: &SimNode) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/cuda_client.c");
    let out = sim.root().join("cuda_client");
    let status = Command::new("gcc")
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .arg(format!("-L{}", sim.lib_dir().display()))
        .arg("-lcuda")
        .status()
        .expect("gcc (apt-get install gcc)");
    assert!(status.success());
    out
}

/// A running client holding its allocation, and the facts it printed.
struct Client {
    child: Child,
    stdin: Option<ChildStdin>,
    facts: HashMap<String, String>,
}

impl Client {
    fn start(exe: &Path, sim: &SimNode, ordinal: u32, bytes: u64, env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(exe)
            .arg(ordinal.to_string())
            .arg(bytes.to_string())
            .env("LD_LIBRARY_PATH", sim.lib_dir())
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let facts = line
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let stdin = child.stdin.take();
        Self {
            child,
            stdin,
            facts,
        }
    }

    fn get(&self, k: &str) -> &str {
        self.facts.get(k).map_or("", String::as_str)
    }

    fn num(&self, k: &str) -> u64 {
        self.get(k)
            .parse()
            .unwrap_or_else(|_| panic!("{k} in {:?}", self.facts))
    }

    fn finish(mut self) {
        drop(self.stdin.take());
        assert!(self.child.wait().unwrap().success());
    }
}

fn nvml(sim: &SimNode) -> Nvml {
    Nvml::builder()
        .lib_path(sim.lib_dir().join("libnvidia-ml.so.1").as_os_str())
        .init()
        .unwrap()
}

/// The simulated node's `nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits`.
fn query_gpu(sim: &SimNode, fields: &str) -> String {
    smi(
        sim,
        &[
            &format!("--query-gpu={fields}"),
            "--format=csv,noheader,nounits",
        ],
    )
    .1
}

/// The simulated node's `nvidia-smi` with `args`: its exit status and what it printed.
fn smi(sim: &SimNode, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(sim.root().join("usr/bin/nvidia-smi"))
        .args(args)
        .env("LD_LIBRARY_PATH", sim.lib_dir())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn a_c_program_linked_with_lcuda_sees_the_simulated_gpus() {
    let sim = SimNode::new(2, "T4", None);
    let exe = compile_client(&sim);
    let c = Client::start(&exe, &sim, 1, GIB, &[]);
    assert_eq!(c.get("version"), "12040");
    assert_eq!(c.get("count"), "2");
    assert_eq!(c.get("name"), "Tesla");
    assert_eq!(c.get("sms"), "40");
    assert_eq!(c.num("total"), 15 * GIB);
    assert_eq!(c.get("proc_status"), "0");
    assert_eq!(c.get("alloc"), "CUDA_SUCCESS");
    assert_eq!(c.get("roundtrip"), "1");
    assert_eq!(c.num("free_before") - c.num("free_after"), GIB);
    c.finish();
}

#[test]
fn device_memory_is_shared_across_processes_and_nvml_reports_each_process() {
    let sim = SimNode::new(2, "T4", None);
    // Each process's context takes device memory, as on a real card.
    let ctx = sim.spec.gpus[0].context_bytes;
    assert_eq!(ctx, 294 << 20);
    let exe = compile_client(&sim);
    let a = Client::start(&exe, &sim, 0, 6 * GIB, &[]);
    assert_eq!(a.get("alloc"), "CUDA_SUCCESS");
    let b = Client::start(&exe, &sim, 0, 10 * GIB, &[]);
    assert_eq!(b.get("alloc"), "CUDA_ERROR_OUT_OF_MEMORY", "{:?}", b.facts);
    assert_eq!(b.num("free_before"), 9 * GIB - 2 * ctx);
    b.finish();
    let c = Client::start(&exe, &sim, 0, 9 * GIB - 2 * ctx, &[]);
    assert_eq!(c.get("alloc"), "CUDA_SUCCESS");
    assert_eq!(c.num("free_after"), 0);

    let nvml = nvml(&sim);
    let dev = nvml.device_by_index(0).unwrap();
    assert_eq!(dev.memory_info().unwrap().used, 15 * GIB);
    let mut procs: Vec<(u32, u64)> = dev
        .running_compute_processes()
        .unwrap()
        .into_iter()
        .map(|p| {
            (
                p.pid,
                if let UsedGpuMemory::Used(b) = p.used_gpu_memory {
                    b
                } else {
                    0
                },
            )
        })
        .collect();
    procs.sort_unstable();
    let mut want = vec![(a.child.id(), 6 * GIB + ctx), (c.child.id(), 9 * GIB - ctx)];
    want.sort_unstable();
    assert_eq!(procs, want);
    assert!(
        nvml.device_by_index(1)
            .unwrap()
            .running_compute_processes()
            .unwrap()
            .is_empty()
    );

    let text = query_gpu(&sim, "index,memory.used,memory.free");
    assert_eq!(text.lines().next(), Some("0, 15360, 0"), "{text}");

    let a_pid = a.child.id();
    a.finish();
    let after: Vec<u32> = dev
        .running_compute_processes()
        .unwrap()
        .into_iter()
        .map(|p| p.pid)
        .collect();
    assert!(!after.contains(&a_pid));
    assert_eq!(
        dev.memory_info().unwrap().used,
        9 * GIB - ctx,
        "a process's context goes with it"
    );
    c.finish();
}

#[test]
fn memory_held_through_the_graphics_driver_is_used_and_listed_as_a_graphics_process() {
    let sim = SimNode::new(1, "T4", None);
    let mut painter = sim.hold_graphics(0, 2 * GIB);
    let nvml = nvml(&sim);
    let dev = nvml.device_by_index(0).unwrap();
    assert_eq!(dev.memory_info().unwrap().used, 2 * GIB);
    let graphics: Vec<(u32, u64)> = dev
        .running_graphics_processes()
        .unwrap()
        .into_iter()
        .map(|p| match p.used_gpu_memory {
            UsedGpuMemory::Used(b) => (p.pid, b),
            UsedGpuMemory::Unavailable => (p.pid, 0),
        })
        .collect();
    assert_eq!(graphics, vec![(painter.id(), 2 * GIB)]);
    assert!(dev.running_compute_processes().unwrap().is_empty());
    // A CUDA program sees the card that much fuller.
    let exe = compile_client(&sim);
    let cuda = Client::start(&exe, &sim, 0, GIB, &[]);
    let ctx = sim.spec.gpus[0].context_bytes;
    assert_eq!(cuda.num("free_before"), 13 * GIB - ctx, "{:?}", cuda.facts);
    cuda.finish();
    drop(painter.stdin.take());
    assert!(painter.wait().unwrap().success());
    assert_eq!(dev.memory_info().unwrap().used, 0);
    assert!(dev.running_graphics_processes().unwrap().is_empty());
}

#[test]
fn memory_the_driver_reserves_is_never_free_and_nvml_reports_it_as_the_real_one_does() {
    const MIB: u64 = 1 << 20;
    let reserved = 384 * MIB;
    let sim = SimNode::with_reserved_bytes(1, "T4", reserved);
    let ctx = sim.spec.gpus[0].context_bytes;
    let exe = compile_client(&sim);
    // The whole card less the reservation and the context: refused; the rest: given.
    let over = Client::start(&exe, &sim, 0, 15 * GIB - ctx - reserved + 1, &[]);
    assert_eq!(
        over.get("alloc"),
        "CUDA_ERROR_OUT_OF_MEMORY",
        "{:?}",
        over.facts
    );
    assert_eq!(over.num("total"), 15 * GIB);
    assert_eq!(over.num("free_before"), 15 * GIB - ctx - reserved);
    over.finish();
    let c = Client::start(&exe, &sim, 0, 15 * GIB - ctx - reserved, &[]);
    assert_eq!(c.get("alloc"), "CUDA_SUCCESS", "{:?}", c.facts);
    assert_eq!(c.num("free_after"), 0);
    // NVML's v2 query reports the reservation apart; its v1 query counts it as used.
    let nvml = nvml(&sim);
    let m = nvml.device_by_index(0).unwrap().memory_info().unwrap();
    assert_eq!(
        (m.total, m.reserved, m.used, m.free),
        (15 * GIB, reserved, 15 * GIB - reserved, 0)
    );
    let text = query_gpu(&sim, "memory.total,memory.reserved,memory.used,memory.free");
    assert_eq!(text.lines().next(), Some("15360, 384, 14976, 0"), "{text}");
    c.finish();
}

#[test]
fn a_killed_process_gives_its_device_memory_back() {
    let sim = SimNode::new(1, "T4", None);
    let exe = compile_client(&sim);
    let mut a = Client::start(&exe, &sim, 0, 12 * GIB, &[]);
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let b = Client::start(&exe, &sim, 0, 12 * GIB, &[]);
    assert_eq!(b.get("alloc"), "CUDA_SUCCESS", "{:?}", b.facts);
    b.finish();
}

#[test]
fn cuda_visible_devices_selects_and_renumbers_gpus() {
    let sim = SimNode::new(4, "A10", None);
    let exe = compile_client(&sim);
    let uuid = sim.spec.gpus[2].uuid.clone();
    let c = Client::start(&exe, &sim, 0, GIB, &[("CUDA_VISIBLE_DEVICES", &uuid)]);
    assert_eq!(c.get("count"), "1");
    c.finish();
    let nvml = nvml(&sim);
    let used = nvml.device_by_index(2).unwrap();
    assert_eq!(used.uuid().unwrap(), uuid);
    let c = Client::start(&exe, &sim, 1, GIB, &[("CUDA_VISIBLE_DEVICES", "3,1")]);
    assert_eq!(c.get("count"), "2");
    assert_eq!(
        nvml.device_by_index(1).unwrap().memory_info().unwrap().used,
        GIB + sim.spec.gpus[1].context_bytes
    );
    c.finish();
}

#[test]
fn nvml_reports_the_inventory_of_the_node_description() {
    let sim = SimNode::new(4, "L40S", None);
    let nvml = nvml(&sim);
    assert_eq!(nvml.device_count().unwrap(), 4);
    assert_eq!(nvml.sys_driver_version().unwrap(), "550.54.15");
    assert_eq!(nvml.sys_cuda_driver_version().unwrap(), 12040);
    for (i, g) in sim.spec.gpus.iter().enumerate() {
        let d = nvml.device_by_index(u32::try_from(i).unwrap()).unwrap();
        assert_eq!(d.uuid().unwrap(), g.uuid);
        assert_eq!(d.name().unwrap(), "NVIDIA L40S");
        assert_eq!(d.memory_info().unwrap().total, 48 * GIB);
        assert_eq!(d.minor_number().unwrap(), g.minor);
        assert_eq!(d.pci_info().unwrap().bus_id, g.pci_bus_id);
        assert_eq!(d.numa_node_id().unwrap(), g.numa_node.unwrap());
        assert_eq!(
            nvml.device_by_uuid(g.uuid.as_str())
                .unwrap()
                .index()
                .unwrap(),
            u32::try_from(i).unwrap()
        );
    }
}

#[test]
fn the_driver_root_has_real_character_devices_with_nvidia_numbers() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    // SAFETY: geteuid has no preconditions.
    #[allow(unsafe_code)]
    let root = unsafe { libc::geteuid() } == 0;
    assert!(root, "this test creates device nodes and must run as root");
    let sim = SimNode::new(2, "T4", None);
    for (name, major, minor) in [
        ("nvidia0", 195, 0),
        ("nvidia1", 195, 1),
        ("nvidiactl", 195, 255),
        ("nvidia-uvm", 510, 0),
        ("nvidia-uvm-tools", 510, 1),
    ] {
        let meta = std::fs::metadata(sim.root().join("dev").join(name)).unwrap();
        assert!(meta.file_type().is_char_device(), "{name}");
        let rdev = meta.rdev();
        assert_eq!(
            (libc::major(rdev), libc::minor(rdev)),
            (major, minor),
            "{name}"
        );
    }
    let err = std::fs::File::open(sim.root().join("dev/nvidia0")).unwrap_err();
    assert_eq!(
        err.raw_os_error(),
        Some(libc::ENXIO),
        "opening a GPU node with no driver gives ENXIO"
    );
}

#[test]
fn every_allocation_path_charges_the_documented_bytes_and_gives_them_back() {
    let sim = SimNode::new(1, "T4", None);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/alloc_paths.c");
    let exe = sim.root().join("alloc_paths");
    let ok = Command::new("gcc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg(format!("-L{}", sim.lib_dir().display()))
        .arg("-lcuda")
        .status()
        .unwrap();
    assert!(ok.success());
    let out = Command::new(&exe)
        .env("LD_LIBRARY_PATH", sim.lib_dir())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let mipmapped = 8 * 4 + 4 * 2 + 2 + 1;
    for (path, bytes) in [
        ("pitch", 1024 * 3),
        ("managed", 12345),
        // Stream-ordered: the pool takes a whole step of 32 MiB for 4096 and 8192 bytes.
        ("async", 32 << 20),
        ("pool", 32 << 20),
        ("array2d", 100 * 10 * 4 * 4),
        ("array3d", 8 * 8 * 8 * 2 * 2),
        ("mipmapped", mipmapped),
        ("vmm", 4 << 20),
        ("stack", 1000 * 40 * 1024),
        ("launch_local", (3000 - 1024) * 40 * 1024),
        ("heap", 1000),
        ("fifo", 1000),
        // The primary context (294 MiB on the T4), 1 MiB, a pool step, the heap raised from 8
        // to 16 MiB: all freed by the reset.
        ("reset", (294 << 20) + (1 << 20) + (32 << 20) + (8 << 20)),
    ] {
        let want = format!("path={path} rc=0 charged={bytes} restored=1");
        assert!(text.lines().any(|l| l == want), "{want:?} not in:\n{text}");
    }
    for want in [
        "pitch=1024",
        "granularity=2097152 vmm_map=0 vmm_access=0 vmm_readback=1",
        // 1 is CUDA_ERROR_INVALID_VALUE: access to a range not all mapped, a copy into a
        // mapping without access or past the reservation's mappings. Before, the access was
        // granted and every copy into mapped memory refused.
        "striped_unmapped_access=1 striped_half_accessible=1 striped_copy=0 striped_set=0 \
         striped_back=0 striped_ok=1 striped_beyond=1",
        // Pinned device memory on GPU 0, no compression on a T4; a released handle is none.
        "properties=0,1,1,0,0 released_properties=1",
        "lookup_legacy=1 lookup_per_thread=1 launch=0 empty_grid=1",
        "kept_freed=0",
        "local_size=3000 stack_grown_to=3000 again=0 again_charged=0 huge=2 stack_after_huge=3000",
    ] {
        assert!(text.contains(want), "{want:?} not in:\n{text}");
    }
}

#[test]
fn nvml_reads_the_gpus_brand_sensors_and_clocks_which_follow_its_utilization() {
    // 1 ms of simulated GPU time per thread block: kernels of 4 blocks back to back keep it
    // busy.
    let sim = SimNode::with_kernel_time(1, "A10", None, 1_000_000);
    let nvml = nvml(&sim);
    let d = nvml.device_by_index(0).unwrap();
    use nvml_wrapper::enum_wrappers::device::{Brand, Clock, PerformanceState, TemperatureSensor};
    assert_eq!(d.brand().unwrap(), Brand::Nvidia);
    // The A10's board: 150 W, clocks at most 1695 and 6251 MHz.
    assert_eq!(d.enforced_power_limit().unwrap(), 150_000);
    assert_eq!(d.power_management_limit().unwrap(), 150_000);
    for clock in [Clock::Graphics, Clock::SM] {
        assert_eq!(d.max_clock_info(clock).unwrap(), 1695);
        assert_eq!(d.clock_info(clock).unwrap(), 1695);
    }
    assert_eq!(d.clock_info(Clock::Memory).unwrap(), 6251);
    assert_eq!(d.performance_state().unwrap(), PerformanceState::Zero);
    // Idle: no utilization, 30 °C, a quarter of the limit.
    assert_eq!(d.utilization_rates().unwrap().gpu, 0);
    assert_eq!(d.temperature(TemperatureSensor::Gpu).unwrap(), 30);
    assert_eq!(d.power_usage().unwrap(), 37_500);
    assert_eq!(
        query_gpu(
            &sim,
            "temperature.gpu,power.draw,power.limit,clocks.sm,clocks.max.mem,pstate"
        )
        .trim(),
        "30, 37.50, 150.00, 1695, 6251, P0"
    );

    let busy = common::compile(&sim, "busy", &["cuda"]);
    let mut child = Command::new(&busy)
        .args(["4", "3000"])
        .env("LD_LIBRARY_PATH", sim.lib_dir())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "launching=1");
    // Two sampling periods (1/6 s each) in, the last one ended was busy throughout.
    std::thread::sleep(std::time::Duration::from_millis(700));
    let util = d.utilization_rates().unwrap().gpu;
    let celsius = d.temperature(TemperatureSensor::Gpu).unwrap();
    let power = d.power_usage().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(util >= 90, "utilization {util}%");
    assert!(celsius >= 70, "{celsius} °C at {util}%");
    assert!(power >= 140_000, "{power} mW at {util}%");
}

#[test]
fn nvidia_smi_reports_the_gpus_chosen_by_index_uuid_or_bus_id_and_refuses_options_it_does_not_take()
{
    let sim = SimNode::new(2, "A10", None);
    let uuid = &sim.spec.gpus[1].uuid;
    let bus = &sim.spec.gpus[1].pci_bus_id;
    let csv = "--format=csv,noheader";
    // Before, `-i` was ignored (both GPUs listed) and an unknown option printed the table.
    for id in ["1", uuid.as_str(), bus.as_str()] {
        let (code, text) = smi(&sim, &["-i", id, "--query-gpu=index,uuid", csv]);
        assert_eq!(code, Some(0), "{text}");
        assert_eq!(text.trim(), format!("1, {uuid}"), "-i {id}");
    }
    let (_, both) = smi(&sim, &["--id=0,1", "--query-gpu=index,count", csv]);
    assert_eq!(both.trim(), "0, 2\n1, 2");
    let (_, info) = smi(
        &sim,
        &["-i", "0", "--query-gpu=driver_version,compute_cap", csv],
    );
    assert_eq!(info.trim(), "550.54.15, 8.6");
    assert_eq!(
        smi(&sim, &["-i", "7", "-L"]),
        (Some(6), "No devices were found\n".to_string())
    );
    for bad in [&["--bogus"][..], &["-q", "-d", "BOGUS"]] {
        let (code, text) = smi(&sim, bad);
        assert_eq!(code, Some(2), "{bad:?}: {text}");
        assert!(
            text.starts_with("Invalid combination of input arguments"),
            "{text}"
        );
    }
    // The report, whole and by section (before, `-q` printed the summary table).
    let (code, report) = smi(&sim, &["-q", "-i", "1"]);
    assert_eq!(code, Some(0), "{report}");
    let total = sim.spec.gpus[1].memory_bytes >> 20;
    for expected in [
        format!("GPU {bus}"),
        format!("    GPU UUID                              : {uuid}"),
        "    CUDA Compute Capability               : 8.6".to_string(),
        format!("        Total                             : {total} MiB"),
        "        Gpu                               : 0 %".to_string(),
    ] {
        assert!(
            report.lines().any(|l| l == expected),
            "{expected:?} in {report}"
        );
    }
    let (_, memory) = smi(&sim, &["-q", "-d", "MEMORY"]);
    assert_eq!(memory.matches("FB Memory Usage").count(), 2, "{memory}");
    assert!(
        !memory.contains("Product Name") && !memory.contains("Utilization"),
        "{memory}"
    );
}
