//! What `simulate` writes: every run's curve as CSV, one summary line per trace and policy,
//! and one table of all traces beside the FGD paper's published figures.

use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::published;
use crate::simulate::{self, Run};

/// Every run's curve, one row per percent of arrived GPU demand.
pub fn write_csv(out: &mut impl Write, runs: &[Run]) -> std::io::Result<()> {
    writeln!(
        out,
        "trace,policy,seed,arrived_pct,allocated_pct,unallocated_pct,fragmentation_pct"
    )?;
    for r in runs {
        for p in &r.points {
            writeln!(
                out,
                "{},{},{},{},{:.4},{:.4},{:.4}",
                r.trace,
                r.policy,
                r.seed,
                p.arrived_pct,
                p.allocated_pct,
                100.0 - p.allocated_pct,
                p.fragmentation_pct
            )?;
        }
    }
    Ok(())
}

/// The plot of one of several traces: `sim.svg` → `sim-<trace>.svg` (the index when the
/// name is not a plain file name).
#[must_use]
pub fn plot_path(plot: &Path, trace: &str, index: usize) -> PathBuf {
    let stem = plot.file_stem().unwrap_or_default().to_string_lossy();
    let ext = plot
        .extension()
        .map_or_else(String::new, |e| format!(".{}", e.to_string_lossy()));
    let plain = !trace.is_empty()
        && trace
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    let tag = if plain {
        trace.to_string()
    } else {
        index.to_string()
    };
    plot.with_file_name(format!("{stem}-{tag}{ext}"))
}

/// Mean unallocated GPU % over seeds at each arrived percent, per policy (for the plot).
#[must_use]
pub fn curves(runs: &[Run], policies: &[String]) -> Vec<(String, Vec<(f64, f64)>)> {
    policies
        .iter()
        .map(|name| {
            let mine: Vec<&Run> = runs.iter().filter(|r| &r.policy == name).collect();
            let curve = (1..=simulate::ARRIVED_MAX_PCT)
                .filter_map(|pct| {
                    let v: Vec<f64> = mine.iter().filter_map(|r| r.unallocated_at(pct)).collect();
                    (!v.is_empty()).then(|| (f64::from(pct), simulate::mean_sd(&v).0))
                })
                .collect();
            (name.clone(), curve)
        })
        .collect()
}

/// Mean and standard deviation over seeds of the unallocated % at `pct` arrived.
fn at(runs: &[Run], trace: &str, policy: &str, pct: u32) -> (f64, f64, usize) {
    let v: Vec<f64> = runs
        .iter()
        .filter(|r| r.trace == trace && r.policy == policy)
        .filter_map(|r| r.unallocated_at(pct))
        .collect();
    let (m, sd) = simulate::mean_sd(&v);
    (m, sd, v.len())
}

/// One line per trace and policy:
/// `policy=<p> trace=<t> seeds=<n> unallocated_pct_at_100=<m> sd=<sd> unallocated_pct_at_130=<m>`.
#[must_use]
pub fn summary_lines(runs: &[Run], traces: &[String], policies: &[String]) -> Vec<String> {
    let mut lines = Vec::new();
    for t in traces {
        for p in policies {
            let (m100, sd100, n) = at(runs, t, p, 100);
            let (m130, ..) = at(runs, t, p, 130);
            lines.push(format!(
                "policy={p} trace={t} seeds={n} unallocated_pct_at_100={m100:.2} sd={sd100:.2} unallocated_pct_at_130={m130:.2}"
            ));
        }
    }
    lines
}

/// Per trace and policy, how close the GPUs of the multi-GPU pods placed were (from
/// [`crate::simulate::Closeness`]), in % of those pods, pooled over the seeds.
#[must_use]
pub fn closeness_lines(runs: &[Run], traces: &[String], policies: &[String]) -> Vec<String> {
    let mut lines = Vec::new();
    for t in traces {
        for p in policies {
            let mut c = crate::simulate::Closeness::default();
            for r in runs.iter().filter(|r| &r.trace == t && &r.policy == p) {
                c.placed += r.closeness.placed;
                c.nvlink += r.closeness.nvlink;
                c.one_numa_node += r.closeness.one_numa_node;
                c.across += r.closeness.across;
            }
            let pct = |n: usize| n as f64 * 100.0 / c.placed.max(1) as f64;
            lines.push(format!(
                "policy={p} trace={t} multi_gpu_pods_placed={} nvlink_pct={:.1} one_numa_node_pct={:.1} across_numa_pct={:.1}",
                c.placed,
                pct(c.nvlink),
                pct(c.one_numa_node),
                pct(c.across)
            ));
        }
    }
    lines
}

/// The paper's name for a policy of this simulator.
fn paper_name(policy: &str) -> &str {
    if policy == "frag-aware" {
        "fgd"
    } else {
        policy
    }
}

/// The comparison table: per trace, each policy's unallocated % at 100% / 130% arrived, the
/// paper's figure for each policy it published, and frag-aware's difference from FGD.
#[must_use]
pub fn table(runs: &[Run], traces: &[String], policies: &[String]) -> String {
    let pair = |a: f64, b: f64| format!("{a:.2} / {b:.2}");
    // One column per published policy (frag-aware and the fgd baseline share FGD's).
    let mut published_policies: Vec<&str> = Vec::new();
    for p in policies {
        let name = paper_name(p);
        if !published_policies.contains(&name)
            && traces.iter().any(|t| published::figure(t, name).is_some())
        {
            published_policies.push(name);
        }
    }
    let ran = |name: &str| policies.iter().any(|p| p == name);
    let frag_vs_fgd =
        ran("frag-aware") && traces.iter().any(|t| published::figure(t, "fgd").is_some());
    let frag_vs_fgd_here = ran("frag-aware") && ran("fgd");
    let width = traces.iter().map(String::len).max().unwrap_or(0).max(5);
    let mut header = format!("{:<width$}", "trace");
    for p in policies {
        let _ = write!(header, "  {p:>15}");
    }
    for p in &published_policies {
        let paper = if *p == "fgd" { "FGD" } else { p };
        let _ = write!(header, "  {:>15}", format!("paper {paper}"));
    }
    if frag_vs_fgd {
        let _ = write!(header, "  {:>17}", "frag-aware − FGD");
    }
    if frag_vs_fgd_here {
        let _ = write!(header, "  {:>17}", "frag-aware − fgd");
    }
    let seeds = runs
        .iter()
        .map(|r| r.seed)
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    let mut out = format!(
        "unallocated GPU % at 100% / 130% arrived, mean of {seeds} seeds; paper: published by the FGD paper's authors; FGD: the paper's, fgd: its policy run here\n{header}\n"
    );
    for t in traces {
        let mut row = format!("{t:<width$}");
        for p in policies {
            let _ = write!(
                row,
                "  {:>15}",
                pair(at(runs, t, p, 100).0, at(runs, t, p, 130).0)
            );
        }
        for p in &published_policies {
            let cell = published::figure(t, p)
                .map_or_else(|| "–".to_string(), |f| pair(f.at_100, f.at_130));
            let _ = write!(row, "  {cell:>15}");
        }
        if frag_vs_fgd {
            let cell = published::figure(t, "fgd").map_or_else(
                || "–".to_string(),
                |f| {
                    format!(
                        "{:+.2} / {:+.2}",
                        at(runs, t, "frag-aware", 100).0 - f.at_100,
                        at(runs, t, "frag-aware", 130).0 - f.at_130
                    )
                },
            );
            let _ = write!(row, "  {cell:>17}");
        }
        if frag_vs_fgd_here {
            let diff = |pct| at(runs, t, "frag-aware", pct).0 - at(runs, t, "fgd", pct).0;
            let cell = format!("{:+.2} / {:+.2}", diff(100), diff(130));
            let _ = write!(row, "  {cell:>17}");
        }
        out.push_str(&row);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::Point;

    fn run(trace: &str, policy: &str, seed: u64, at_100: f64, at_130: f64) -> Run {
        let point = |pct, unallocated: f64| Point {
            arrived_pct: pct,
            allocated_pct: 100.0 - unallocated,
            fragmentation_pct: 0.0,
        };
        Run {
            trace: trace.into(),
            policy: policy.into(),
            seed,
            points: vec![point(100, at_100), point(130, at_130)],
            placed: 0,
            failed: 0,
            closeness: crate::simulate::Closeness::default(),
        }
    }

    #[test]
    fn the_table_puts_each_trace_beside_the_papers_figures_and_the_difference_from_fgd() {
        let runs = vec![
            run("default", "frag-aware", 1, 4.0, 3.0),
            run("default", "frag-aware", 2, 5.0, 4.0),
            run("default", "best-fit", 1, 7.0, 6.0),
            run("default", "best-fit", 2, 7.0, 6.0),
            run("mine", "frag-aware", 1, 1.0, 1.0),
            run("mine", "best-fit", 1, 2.0, 2.0),
        ];
        let traces = vec!["default".to_string(), "mine".to_string()];
        let policies = vec!["frag-aware".to_string(), "best-fit".to_string()];
        let t = table(&runs, &traces, &policies);
        let lines: Vec<&str> = t.lines().collect();
        // A row's cells: the columns are separated by two spaces or more.
        let cells = |line: &str| -> Vec<String> {
            line.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect()
        };
        assert_eq!(lines.len(), 4, "{t}");
        assert!(lines[0].contains("mean of 2 seeds"), "{t}");
        for h in ["paper FGD", "paper best-fit", "frag-aware − FGD"] {
            assert!(lines[1].contains(h), "{h}: {t}");
        }
        assert_eq!(
            cells(lines[2]),
            [
                "default",
                "4.50 / 3.50",
                "7.00 / 6.00",
                "4.77 / 4.61",
                "7.14 / 6.92",
                "-0.27 / -1.11"
            ],
            "{t}"
        );
        assert_eq!(
            cells(lines[3]),
            ["mine", "1.00 / 1.00", "2.00 / 2.00", "–", "–", "–"],
            "{t}"
        );

        let summary = summary_lines(&runs, &traces, &policies);
        assert_eq!(
            summary[0],
            "policy=frag-aware trace=default seeds=2 unallocated_pct_at_100=4.50 sd=0.71 unallocated_pct_at_130=3.50"
        );
    }

    #[test]
    fn frag_aware_and_the_fgd_run_here_share_the_papers_fgd_column_and_are_compared() {
        let runs = vec![
            run("default", "frag-aware", 1, 4.5, 4.25),
            run("default", "fgd", 1, 4.75, 4.0),
        ];
        let traces = vec!["default".to_string()];
        let policies = vec!["frag-aware".to_string(), "fgd".to_string()];
        let t = table(&runs, &traces, &policies);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[1].matches("paper FGD").count(), 1, "{t}");
        assert!(lines[1].ends_with("frag-aware − fgd"), "{t}");
        assert!(lines[2].ends_with("-0.25 / +0.25"), "{t}");
    }

    #[test]
    fn several_traces_get_a_plot_each() {
        assert_eq!(
            plot_path(Path::new("/out/sim.svg"), "gpuspec10", 3),
            PathBuf::from("/out/sim-gpuspec10.svg")
        );
        assert_eq!(
            plot_path(Path::new("sim.svg"), "a b/c", 3),
            PathBuf::from("sim-3.svg")
        );
    }
}
