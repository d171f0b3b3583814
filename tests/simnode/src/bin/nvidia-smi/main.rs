//! A small `nvidia-smi` over NVML: the summary table, `-L`, `-q` (see `report`), `-i`/`--id` (GPUs by index, UUID
//! or PCI bus id; none found: "No devices were found", exit status 6), an option it does not
//! take refused (exit status 2),
//! `--query-gpu=… --format=csv[,noheader][,nounits]` (index, count, driver_version,
//! compute_cap, uuid, name, pci.bus_id,
//! memory.*, utilization.gpu, temperature.gpu, power.draw, power.limit, clocks.{gr,sm,mem},
//! clocks.max.{gr,sm,mem}, pstate; `[N/A]` where NVML does not support a figure), and `--query-compute-apps=…` (one row
//! per process holding memory: pid, used_memory, gpu_uuid, gpu_bus_id). It loads `libnvidia-ml.so.1` as the
//! real one does, so it shows whatever NVML answers: the simulated node, or a slice when the
//! interception library is loaded.

mod report;

use std::ffi::OsStr;

use anyhow::{Context, Result, bail};
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;

pub(crate) const MIB: u64 = 1 << 20;
/// The clocks `clocks.gr`, `clocks.sm` and `clocks.mem` name, in that order.
const CLOCKS: [Clock; 3] = [Clock::Graphics, Clock::SM, Clock::Memory];

pub(crate) struct Row {
    pub(crate) index: u32,
    /// GPUs NVML shows, and its driver's version (the same on every row).
    pub(crate) count: u32,
    pub(crate) driver: String,
    pub(crate) compute_capability: (i32, i32),
    pub(crate) uuid: String,
    pub(crate) name: String,
    pub(crate) bus: String,
    pub(crate) total: u64,
    pub(crate) reserved: u64,
    pub(crate) used: u64,
    pub(crate) free: u64,
    pub(crate) util: u32,
    /// Sensors and clocks, None where NVML does not support them.
    pub(crate) celsius: Option<u32>,
    pub(crate) power_mw: Option<u32>,
    pub(crate) power_limit_mw: Option<u32>,
    pub(crate) clocks_mhz: [Option<u32>; 3],
    pub(crate) max_clocks_mhz: [Option<u32>; 3],
    pub(crate) pstate: Option<u32>,
    pub(crate) procs: Vec<(u32, u64)>,
}

fn rows(nvml: &Nvml) -> Result<Vec<Row>> {
    let mut out = Vec::new();
    for i in 0..nvml.device_count()? {
        let d = nvml.device_by_index(i)?;
        let mem = d.memory_info()?;
        let procs = d
            .running_compute_processes()?
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
        let cc = d.cuda_compute_capability()?;
        out.push(Row {
            index: i,
            count: nvml.device_count()?,
            driver: nvml.sys_driver_version()?,
            compute_capability: (cc.major, cc.minor),
            uuid: d.uuid()?,
            name: d.name()?,
            bus: d.pci_info()?.bus_id,
            total: mem.total,
            reserved: mem.reserved,
            used: mem.used,
            free: mem.free,
            util: d.utilization_rates().map(|u| u.gpu).unwrap_or(0),
            celsius: d.temperature(TemperatureSensor::Gpu).ok(),
            power_mw: d.power_usage().ok(),
            power_limit_mw: d.enforced_power_limit().ok(),
            clocks_mhz: CLOCKS.map(|c| d.clock_info(c).ok()),
            max_clocks_mhz: CLOCKS.map(|c| d.max_clock_info(c).ok()),
            pstate: d.performance_state().ok().map(|p| p.as_c()),
            procs,
        });
    }
    Ok(out)
}

fn field(row: &Row, name: &str, units: bool) -> Result<String> {
    let mib = |b: u64| {
        if units {
            format!("{} MiB", b / MIB)
        } else {
            (b / MIB).to_string()
        }
    };
    Ok(match name {
        "index" => row.index.to_string(),
        "driver_version" => row.driver.clone(),
        "count" => row.count.to_string(),
        "compute_cap" => format!("{}.{}", row.compute_capability.0, row.compute_capability.1),
        "uuid" | "gpu_uuid" => row.uuid.clone(),
        "name" | "gpu_name" => row.name.clone(),
        "pci.bus_id" | "gpu_bus_id" => row.bus.clone(),
        "memory.total" => mib(row.total),
        "memory.reserved" => mib(row.reserved),
        "memory.used" => mib(row.used),
        "memory.free" => mib(row.free),
        "utilization.gpu" => {
            if units {
                format!("{} %", row.util)
            } else {
                row.util.to_string()
            }
        }
        "temperature.gpu" => or_na(row.celsius.map(|c| c.to_string())),
        "power.draw" => or_na(row.power_mw.map(|mw| watts(mw, units))),
        "power.limit" | "enforced.power.limit" => {
            or_na(row.power_limit_mw.map(|mw| watts(mw, units)))
        }
        "pstate" => or_na(row.pstate.map(|p| format!("P{p}"))),
        _ => match clock(name) {
            Some((max, k)) => {
                let mhz = if max {
                    row.max_clocks_mhz[k]
                } else {
                    row.clocks_mhz[k]
                };
                or_na(mhz.map(|m| {
                    if units {
                        format!("{m} MHz")
                    } else {
                        m.to_string()
                    }
                }))
            }
            None => bail!("Field \"{name}\" is not a valid field to query."),
        },
    })
}

/// What nvidia-smi prints for a figure the GPU does not support.
fn or_na(v: Option<String>) -> String {
    v.unwrap_or_else(|| "[N/A]".to_string())
}

fn watts(mw: u32, units: bool) -> String {
    let w = f64::from(mw) / 1000.0;
    if units {
        format!("{w:.2} W")
    } else {
        format!("{w:.2}")
    }
}

/// A clock field: whether it is the most (`clocks.max.*`) and which of [`CLOCKS`].
fn clock(name: &str) -> Option<(bool, usize)> {
    let (max, kind) = match name.strip_prefix("clocks.max.") {
        Some(k) => (true, k),
        None => (false, name.strip_prefix("clocks.")?),
    };
    let k = match kind {
        "gr" | "graphics" => 0,
        "sm" => 1,
        "mem" | "memory" => 2,
        _ => return None,
    };
    Some((max, k))
}

fn table(nvml: &Nvml, rows: &[Row]) -> Result<()> {
    let driver = nvml.sys_driver_version()?;
    let cuda = nvml.sys_cuda_driver_version()?;
    let line = format!("+{}+", "-".repeat(87));
    println!("{line}");
    let head = format!(
        "NVIDIA-SMI {driver:<22} Driver Version: {driver:<14} CUDA Version: {}.{}",
        cuda / 1000,
        (cuda % 1000) / 10
    );
    println!("| {head:<85} |");
    println!("|{}+{}+{}|", "-".repeat(41), "-".repeat(24), "-".repeat(20));
    println!(
        "| GPU  Name                                | Bus-Id                 |  Memory-Usage      |"
    );
    println!("|{}+{}+{}|", "=".repeat(41), "=".repeat(24), "=".repeat(20));
    for r in rows {
        let mem = format!("{}MiB / {}MiB", r.used / MIB, r.total / MIB);
        println!(
            "| {:>3}  {:<34} | {:<22} | {:>18} |",
            r.index, r.name, r.bus, mem
        );
    }
    println!("{line}");
    println!("| {:<85} |", "Processes:");
    println!("| {:<85} |", " GPU        PID   Type   GPU Memory Usage");
    let mut any = false;
    for r in rows {
        for (pid, used) in &r.procs {
            any = true;
            println!(
                "| {:<85} |",
                format!("{:>4} {:>10}      C   {}MiB", r.index, pid, used / MIB)
            );
        }
    }
    if !any {
        println!("| {:<85} |", " No running processes found");
    }
    println!("{line}");
    Ok(())
}

const USAGE: &str = "usage: nvidia-smi [-L | -q [-d DISPLAY[,DISPLAY…]]] [-i ID[,ID…]] [--query-gpu=FIELD[,FIELD…] | --query-compute-apps=FIELD[,FIELD…]] [--format=csv[,noheader][,nounits]]";

/// The options this `nvidia-smi` knows: `-i`/`--id` takes a value (next or after `=`).
fn known(arg: &str) -> bool {
    [
        "-h",
        "--help",
        "-L",
        "--list-gpus",
        "-i",
        "-q",
        "--query",
        "-d",
    ]
    .contains(&arg)
        || [
            "--query-gpu=",
            "--query-compute-apps=",
            "--format=",
            "--id=",
            "-i=",
            "--display=",
        ]
        .iter()
        .any(|p| arg.starts_with(p))
}

/// The GPUs `-i`/`--id` names (indices, UUIDs or PCI bus ids, comma-separated), if given.
fn selected(args: &[String]) -> Option<Vec<String>> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let value = match a.as_str() {
            "-i" => it.next().cloned(),
            _ => a
                .strip_prefix("--id=")
                .or_else(|| a.strip_prefix("-i="))
                .map(str::to_string),
        };
        if let Some(v) = value {
            return Some(v.split(',').map(|s| s.trim().to_string()).collect());
        }
    }
    None
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return Ok(());
    }
    // Each argument with the one before it: the value of `-i` is not an option.
    let before = std::iter::once("").chain(args.iter().map(String::as_str));
    if let Some((bad, _)) = args
        .iter()
        .zip(before)
        .find(|(a, before)| !known(a) && *before != "-i" && *before != "-d")
    {
        // As the real one answers an option it does not take: nothing else is run.
        println!(
            "Invalid combination of input arguments ({bad}). Please run 'nvidia-smi -h' for help."
        );
        std::process::exit(2);
    }
    let nvml = Nvml::builder()
        .lib_path(OsStr::new("libnvidia-ml.so.1"))
        .init()
        .context("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver")?;
    let mut rows = rows(&nvml)?;
    if let Some(ids) = selected(&args) {
        rows.retain(|r| {
            ids.iter().any(|id| {
                *id == r.index.to_string()
                    || *id == r.uuid
                    || (id.contains(':') && r.bus.to_lowercase().ends_with(&id.to_lowercase()))
            })
        });
        if rows.is_empty() {
            println!("No devices were found");
            std::process::exit(6);
        }
    }
    if args.iter().any(|a| a == "-q" || a == "--query") {
        let displays = args
            .iter()
            .position(|a| a == "-d")
            .and_then(|i| args.get(i + 1))
            .map(String::as_str)
            .or_else(|| args.iter().find_map(|a| a.strip_prefix("--display=")));
        let count = nvml.device_count()?;
        let cuda = nvml.sys_cuda_driver_version()?;
        let driver = nvml.sys_driver_version()?;
        match report::report(&rows, &driver, cuda, count, displays) {
            Ok(lines) => println!("{}", lines.join("\n")),
            Err(e) => {
                println!("{e}");
                std::process::exit(2);
            }
        }
        return Ok(());
    }
    if args.iter().any(|a| a == "-L" || a == "--list-gpus") {
        for r in &rows {
            println!("GPU {}: {} (UUID: {})", r.index, r.name, r.uuid);
        }
        return Ok(());
    }
    let gpu_query = args.iter().find_map(|a| a.strip_prefix("--query-gpu="));
    let apps_query = args
        .iter()
        .find_map(|a| a.strip_prefix("--query-compute-apps="));
    let (Some(query), apps) = (gpu_query.or(apps_query), apps_query.is_some()) else {
        return table(&nvml, &rows);
    };
    let format = args
        .iter()
        .find_map(|a| a.strip_prefix("--format="))
        .unwrap_or("csv");
    let opts: Vec<&str> = format.split(',').collect();
    if opts.first() != Some(&"csv") {
        bail!("only --format=csv is supported");
    }
    let header = !opts.contains(&"noheader");
    let units = !opts.contains(&"nounits");
    let fields: Vec<&str> = query.split(',').map(str::trim).collect();
    if header {
        let names: Vec<String> = fields
            .iter()
            .map(|f| {
                if units && (f.starts_with("memory.") || *f == "used_memory") {
                    format!("{f} [MiB]")
                } else {
                    (*f).to_string()
                }
            })
            .collect();
        println!("{}", names.join(", "));
    }
    if apps {
        for r in &rows {
            for &(pid, used) in &r.procs {
                let vals = fields
                    .iter()
                    .map(|f| app_field(r, pid, used, f, units))
                    .collect::<Result<Vec<_>>>()?;
                println!("{}", vals.join(", "));
            }
        }
        return Ok(());
    }
    for r in &rows {
        let vals = fields
            .iter()
            .map(|f| field(r, f, units))
            .collect::<Result<Vec<_>>>()?;
        println!("{}", vals.join(", "));
    }
    Ok(())
}

/// A field of `--query-compute-apps` for process `pid` holding `used` bytes on `row`'s GPU.
fn app_field(row: &Row, pid: u32, used: u64, name: &str, units: bool) -> Result<String> {
    Ok(match name {
        "pid" => pid.to_string(),
        "used_memory" | "used_gpu_memory" => {
            if units {
                format!("{} MiB", used / MIB)
            } else {
                (used / MIB).to_string()
            }
        }
        "gpu_uuid" | "gpu_bus_id" | "gpu_name" => field(row, name, units)?,
        _ => bail!("Field \"{name}\" is not a valid field to query."),
    })
}
