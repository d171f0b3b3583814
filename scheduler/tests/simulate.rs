//! `gpuslice-scheduler simulate` on the openb trace (a smaller cluster, so that it runs in the
//! test suite; the full replay is in docs/scheduler.md).

use std::path::{Path, PathBuf};
use std::process::Command;

fn traces() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/openb")
}

fn simulate(args: &[&str], out: &Path) -> std::process::Output {
    simulate_on(&traces().join("openb_node_list_gpu_node.csv"), args, out)
}

fn simulate_on(nodes: &Path, args: &[&str], out: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpuslice-scheduler"))
        .arg("simulate")
        .arg("--nodes")
        .arg(nodes)
        .arg("--csv")
        .arg(out.join("sim.csv"))
        .arg("--plot")
        .arg(out.join("sim.svg"))
        .args(args)
        .output()
        .unwrap()
}

fn summary(stdout: &str) -> Vec<(String, f64, f64)> {
    stdout
        .lines()
        .filter(|l| l.starts_with("policy="))
        .map(|l| {
            let kv: std::collections::HashMap<&str, &str> =
                l.split(' ').filter_map(|p| p.split_once('=')).collect();
            (
                kv["policy"].to_string(),
                kv["unallocated_pct_at_100"].parse().unwrap(),
                kv["unallocated_pct_at_130"].parse().unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_replay_of_the_openb_trace_reports_every_policy_and_frag_aware_strands_least() {
    let out = tempfile::tempdir().unwrap();
    let pods = traces().join("openb_pod_list_default.csv");
    let o = simulate(
        &[
            "--pods",
            pods.to_str().unwrap(),
            "--node-limit",
            "150",
            "--seeds",
            "42..43",
            "--policy",
            "random,best-fit,binpack,frag-aware",
        ],
        out.path(),
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines: Vec<&str> = stdout.lines().take_while(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    let re_ok = lines.iter().all(|l| {
        l.starts_with("policy=")
            && l.contains(" trace=default seeds=2 unallocated_pct_at_100=")
            && l.contains(" sd=")
            && l.contains(" unallocated_pct_at_130=")
    });
    assert!(re_ok, "{stdout}");
    let s = summary(&stdout);
    let at100 = |p: &str| s.iter().find(|x| x.0 == p).unwrap().1;
    assert!(at100("frag-aware") < at100("random"), "{stdout}");
    assert!(at100("frag-aware") < at100("best-fit"), "{stdout}");

    let csv = std::fs::read_to_string(out.path().join("sim.csv")).unwrap();
    let mut rows = csv.lines();
    assert_eq!(
        rows.next(),
        Some("trace,policy,seed,arrived_pct,allocated_pct,unallocated_pct,fragmentation_pct")
    );
    let rows: Vec<Vec<&str>> = rows.map(|r| r.split(',').collect()).collect();
    assert_eq!(rows.len(), 4 * 2 * 130);
    for r in &rows {
        assert_eq!(r[0], "default");
        let arrived: f64 = r[3].parse().unwrap();
        let allocated: f64 = r[4].parse().unwrap();
        let unallocated: f64 = r[5].parse().unwrap();
        assert!(
            allocated <= arrived + 1.0,
            "never more allocated than arrived: {r:?}"
        );
        assert!((allocated + unallocated - 100.0).abs() < 1e-3, "{r:?}");
    }
    let svg = std::fs::read_to_string(out.path().join("sim.svg")).unwrap();
    assert_eq!(svg.matches("<polyline").count(), 4);
    assert!(svg.contains(">frag-aware</text>"));

    // The table: the trace beside the FGD paper's published figures.
    let table: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.is_empty())
        .skip(1)
        .collect();
    assert_eq!(table.len(), 3, "{stdout}");
    assert!(
        table[1].contains("paper FGD") && table[1].contains("frag-aware − FGD"),
        "{stdout}"
    );
    assert!(
        table[2].starts_with("default ") && table[2].contains("4.77 / 4.61"),
        "{stdout}"
    );
}

#[test]
fn several_traces_are_replayed_and_compared_in_one_table() {
    let out = tempfile::tempdir().unwrap();
    let pods = ["default", "gpuspec10"]
        .map(|t| {
            traces()
                .join(format!("openb_pod_list_{t}.csv"))
                .to_string_lossy()
                .into_owned()
        })
        .join(",");
    let o = simulate(
        &[
            "--pods",
            &pods,
            "--node-limit",
            "60",
            "--seeds",
            "1",
            "--policy",
            "best-fit,frag-aware",
        ],
        out.path(),
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("policy="))
        .collect();
    assert_eq!(s.len(), 4, "{stdout}");
    assert!(
        s[3].starts_with("policy=frag-aware trace=gpuspec10 seeds=1 "),
        "{stdout}"
    );
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("default ") || l.starts_with("gpuspec10 "))
        .collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    assert!(
        rows[1].contains("5.34 / 5.05"),
        "the paper's FGD on gpuspec10: {stdout}"
    );
    for t in ["default", "gpuspec10"] {
        let svg = std::fs::read_to_string(out.path().join(format!("sim-{t}.svg"))).unwrap();
        assert_eq!(svg.matches("<polyline").count(), 2, "{t}");
    }
}

#[test]
fn a_replay_is_the_same_for_the_same_seed() {
    let out = tempfile::tempdir().unwrap();
    let pods = traces().join("openb_pod_list_default.csv");
    let run = || {
        let o = simulate(
            &[
                "--pods",
                pods.to_str().unwrap(),
                "--node-limit",
                "60",
                "--seeds",
                "7",
                "--policy",
                "random,frag-aware",
            ],
            out.path(),
        );
        assert!(o.status.success());
        (o.stdout, std::fs::read(out.path().join("sim.csv")).unwrap())
    };
    assert_eq!(run(), run());
}

#[test]
fn bad_input_is_refused_naming_the_file_the_row_and_the_value() {
    let out = tempfile::tempdir().unwrap();
    let pods = out.path().join("pods.csv");
    std::fs::write(
        &pods,
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,500\np1,1000,1024,1,2000\n",
    )
    .unwrap();
    let o = simulate(&["--pods", pods.to_str().unwrap()], out.path());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("pods.csv: row 3: gpu_milli=2000"), "{err}");

    let good = traces().join("openb_pod_list_default.csv");
    let o = simulate(
        &["--pods", good.to_str().unwrap(), "--policy", "fastest"],
        out.path(),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("\"fastest\""), "{err}");
    let o = simulate(
        &["--pods", good.to_str().unwrap(), "--seeds", "9..3"],
        out.path(),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("--seeds \"9..3\""),
        "{err}"
    );
}

/// `pods=N` of each run's log line: the pods that arrived until 130% of the GPUs' capacity.
fn arrived_pods(stderr: &str) -> Vec<u64> {
    stderr
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("pods="))
        .map(|n| n.parse().unwrap())
        .collect()
}

#[test]
fn a_node_list_with_cpu_only_nodes_is_replayed_and_those_nodes_add_no_gpu_capacity() {
    // As the openb release's full node list has them: no GPU, no model.
    let out = tempfile::tempdir().unwrap();
    let gpu_nodes = std::fs::read_to_string(traces().join("openb_node_list_gpu_node.csv")).unwrap();
    let kept: Vec<&str> = gpu_nodes.lines().take(61).collect();
    let only_gpu = out.path().join("gpu.csv");
    std::fs::write(&only_gpu, kept.join("\n") + "\n").unwrap();
    let cpu: String = (0..30)
        .map(|i| format!("cpu-node-{i},32000,262144,0,\n"))
        .collect();
    let mixed = out.path().join("mixed.csv");
    std::fs::write(&mixed, kept.join("\n") + "\n" + &cpu).unwrap();

    let pods = traces().join("openb_pod_list_default.csv");
    let args = [
        "--pods",
        pods.to_str().unwrap(),
        "--seeds",
        "42",
        "--policy",
        "frag-aware",
    ];
    let (a, b) = (
        simulate_on(&only_gpu, &args, out.path()),
        simulate_on(&mixed, &args, out.path()),
    );
    for o in [&a, &b] {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(summary(&String::from_utf8_lossy(&o.stdout)).len(), 1);
    }
    let (a, b) = (
        arrived_pods(&String::from_utf8_lossy(&a.stderr)),
        arrived_pods(&String::from_utf8_lossy(&b.stderr)),
    );
    assert!(!a.is_empty());
    assert_eq!(a, b, "the same GPU capacity takes the same pods");
}

/// The closeness line of a run with `--layout`: (multi-GPU pods placed, NVLink %, across
/// NUMA %).
fn closeness(stdout: &str) -> (u64, f64, f64) {
    let line = stdout
        .lines()
        .find(|l| l.contains("multi_gpu_pods_placed="))
        .unwrap_or_else(|| panic!("no closeness line: {stdout}"));
    let kv: std::collections::HashMap<&str, &str> =
        line.split(' ').filter_map(|p| p.split_once('=')).collect();
    (
        kv["multi_gpu_pods_placed"].parse().unwrap(),
        kv["nvlink_pct"].parse().unwrap(),
        kv["across_numa_pct"].parse().unwrap(),
    )
}

#[test]
fn with_a_layout_multi_gpu_pods_get_closer_gpus_than_the_policy_alone_gives_them() {
    let out = tempfile::tempdir().unwrap();
    let pods = traces().join("openb_pod_list_multigpu20.csv");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "--pods",
            pods.to_str().unwrap(),
            "--policy",
            "frag-aware",
            "--seeds",
            "1..2",
            "--node-limit",
            "120",
            "--layout",
            "nvlink-pairs",
        ];
        args.extend_from_slice(extra);
        let o = simulate(&args, out.path());
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        closeness(&String::from_utf8_lossy(&o.stdout))
    };
    let (placed, nvlink, across) = run(&[]);
    let (blind_placed, blind_nvlink, blind_across) = run(&["--topology-blind"]);
    assert!(placed > 20 && blind_placed > 20, "{placed} {blind_placed}");
    assert!(
        nvlink > blind_nvlink && across <= blind_across,
        "aware: {nvlink}% NVLink, {across}% across NUMA; blind: {blind_nvlink}%, {blind_across}%"
    );

    let o = simulate(
        &["--pods", pods.to_str().unwrap(), "--layout", "nvlink3"],
        out.path(),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("\"nvlink3\""), "{err}");
}
