//! `nvidia-smi -q`: the report of each GPU, section by section, as the real one lays it out
//! (a label padded to a column, then `: value`); `-d` keeps the sections named (MEMORY,
//! UTILIZATION, TEMPERATURE, POWER, CLOCK, PERFORMANCE, PIDS). Only what NVML answers here is
//! reported: the real one's other sections (ECC, PCIe, encoder, …) are left out.

use anyhow::{Result, bail};

use super::{MIB, Row};

/// The column values start at, as the real report aligns them.
const VALUE_COLUMN: usize = 42;

/// The sections `-d` may name.
const DISPLAYS: [&str; 7] = [
    "MEMORY",
    "UTILIZATION",
    "TEMPERATURE",
    "POWER",
    "CLOCK",
    "PERFORMANCE",
    "PIDS",
];

fn line(depth: usize, label: &str, value: impl std::fmt::Display) -> String {
    let indent = "    ".repeat(depth);
    let width = VALUE_COLUMN.saturating_sub(indent.len());
    format!("{indent}{label:<width$}: {value}")
}

fn or_na<T: std::fmt::Display>(v: Option<T>, unit: &str) -> String {
    v.map_or_else(|| "N/A".to_string(), |v| format!("{v}{unit}"))
}

/// The report of `rows` (driver `driver`, CUDA `cuda` as NVML gives it, `count` GPUs
/// attached), with only the sections of `displays` when given.
pub fn report(
    rows: &[Row],
    driver: &str,
    cuda: i32,
    count: u32,
    displays: Option<&str>,
) -> Result<Vec<String>> {
    let wanted: Option<Vec<String>> =
        displays.map(|d| d.split(',').map(|s| s.trim().to_uppercase()).collect());
    if let Some(w) = &wanted
        && let Some(bad) = w.iter().find(|d| !DISPLAYS.contains(&d.as_str()))
    {
        bail!(
            "Invalid combination of input arguments (-d {bad}). Please run 'nvidia-smi -h' for help."
        );
    }
    let shows = |s: &str| wanted.as_ref().is_none_or(|w| w.iter().any(|d| d == s));
    let mut out = vec![
        String::new(),
        "==============NVSMI LOG==============".to_string(),
        String::new(),
        line(0, "Driver Version", driver),
        line(
            0,
            "CUDA Version",
            format!("{}.{}", cuda / 1000, (cuda % 1000) / 10),
        ),
        String::new(),
        line(0, "Attached GPUs", count),
    ];
    for r in rows {
        out.push(format!("GPU {}", r.bus));
        if wanted.is_none() {
            out.push(line(1, "Product Name", &r.name));
            out.push(line(1, "GPU UUID", &r.uuid));
            out.push(line(1, "Minor Number", r.index));
            out.push(line(
                1,
                "CUDA Compute Capability",
                format!("{}.{}", r.compute_capability.0, r.compute_capability.1),
            ));
        }
        if shows("PERFORMANCE") {
            out.push(line(
                1,
                "Performance State",
                or_na(r.pstate.map(|p| format!("P{p}")), ""),
            ));
        }
        if shows("MEMORY") {
            out.push("    FB Memory Usage".to_string());
            for (label, bytes) in [
                ("Total", r.total),
                ("Reserved", r.reserved),
                ("Used", r.used),
                ("Free", r.free),
            ] {
                out.push(line(2, label, format!("{} MiB", bytes / MIB)));
            }
        }
        if shows("UTILIZATION") {
            out.push("    Utilization".to_string());
            out.push(line(2, "Gpu", format!("{} %", r.util)));
        }
        if shows("TEMPERATURE") {
            out.push("    Temperature".to_string());
            out.push(line(2, "GPU Current Temp", or_na(r.celsius, " C")));
        }
        if shows("POWER") {
            let watts = |mw: Option<u32>| mw.map(|mw| format!("{:.2}", f64::from(mw) / 1000.0));
            out.push("    GPU Power Readings".to_string());
            out.push(line(2, "Power Draw", or_na(watts(r.power_mw), " W")));
            out.push(line(
                2,
                "Current Power Limit",
                or_na(watts(r.power_limit_mw), " W"),
            ));
        }
        if shows("CLOCK") {
            for (title, clocks) in [("Clocks", r.clocks_mhz), ("Max Clocks", r.max_clocks_mhz)] {
                out.push(format!("    {title}"));
                for (label, mhz) in ["Graphics", "SM", "Memory"].iter().zip(clocks) {
                    out.push(line(2, label, or_na(mhz, " MHz")));
                }
            }
        }
        if shows("PIDS") {
            out.push("    Processes".to_string());
            if r.procs.is_empty() {
                out.push("        None".to_string());
            }
            for (pid, used) in &r.procs {
                let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .map_or_else(|_| "N/A".to_string(), |n| n.trim().to_string());
                out.push(line(2, "Process ID", pid));
                out.push(line(3, "Type", "C"));
                out.push(line(3, "Name", name));
                out.push(line(3, "Used GPU Memory", format!("{} MiB", used / MIB)));
            }
        }
        out.push(String::new());
    }
    Ok(out)
}
