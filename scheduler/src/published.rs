//! The FGD paper's published results on the openb traces (the five given with this project
//! and the twelve others of `alibaba/clusterdata`'s `cluster-trace-gpu-v2023`), for the
//! simulator to print beside its own: unallocated GPU % at 100% and 130% arrived workload,
//! mean of seeds 42..51, per policy. Source: the paper's simulator repository
//! (hkust-adsl/kubernetes-scheduler-simulator, commit 8f3d641,
//! `experiments/analysis/expected_results/analysis_allo_discrete.csv`, 100 − allocated %).

/// A published figure: unallocated GPU % at 100% and at 130% arrived.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figure {
    pub at_100: f64,
    pub at_130: f64,
}

/// The paper's policies, by the names this simulator gives its counterparts ("fgd" for the
/// paper's own, whose counterpart here is frag-aware).
const POLICIES: [&str; 6] = [
    "random",
    "dot-product",
    "gpu-clustering",
    "gpu-packing",
    "best-fit",
    "fgd",
];

/// Per trace (the pod list's name without `openb_pod_list_`), per policy of [`POLICIES`]:
/// every openb pod list the paper's simulator published results for.
#[allow(clippy::approx_constant)] // measured figures (6.28 is not τ)
#[rustfmt::skip]
const TABLE: [(&str, [(f64, f64); 6]); 17] = [
    ("default", [(13.70, 12.53), (9.38, 9.15), (8.35, 8.12), (8.22, 8.00), (7.14, 6.92), (4.77, 4.61)]),
    ("cpu050", [(10.98, 8.76), (6.97, 6.73), (6.48, 6.21), (6.54, 6.28), (6.44, 6.21), (5.00, 4.79)]),
    ("cpu100", [(12.57, 10.89), (8.27, 8.05), (7.58, 7.36), (7.50, 7.28), (6.74, 6.56), (4.79, 4.65)]),
    ("cpu200", [(16.97, 16.23), (12.55, 12.30), (10.33, 10.08), (10.02, 9.78), (7.85, 7.60), (5.18, 4.96)]),
    ("cpu250", [(20.00, 19.59), (16.43, 16.20), (12.25, 12.01), (11.95, 11.72), (8.79, 8.55), (6.80, 6.59)]),
    ("gpushare40", [(15.14, 14.00), (10.70, 10.44), (10.24, 9.98), (10.23, 9.97), (8.56, 8.31), (6.04, 5.85)]),
    ("gpushare60", [(17.19, 16.35), (13.18, 12.89), (13.10, 12.80), (12.85, 12.55), (10.94, 10.64), (8.75, 8.60)]),
    ("gpushare80", [(19.38, 18.78), (15.86, 15.51), (15.50, 15.15), (15.35, 15.00), (13.34, 12.99), (10.92, 10.70)]),
    ("gpushare100", [(21.10, 20.56), (18.02, 17.58), (17.77, 17.35), (17.87, 17.43), (15.38, 14.99), (13.36, 13.10)]),
    ("gpuspec10", [(13.74, 12.57), (9.83, 9.61), (8.04, 7.82), (7.76, 7.54), (6.90, 6.70), (5.34, 5.05)]),
    ("gpuspec20", [(14.10, 12.76), (11.71, 10.03), (10.89, 7.75), (10.72, 7.06), (11.54, 6.70), (5.34, 5.16)]),
    ("gpuspec25", [(14.58, 13.06), (14.56, 10.37), (13.59, 7.92), (13.23, 7.02), (14.33, 6.77), (6.09, 5.26)]),
    ("gpuspec33", [(16.13, 13.54), (20.18, 10.86), (18.91, 7.88), (17.78, 6.78), (19.61, 6.91), (12.16, 5.45)]),
    ("multigpu20", [(13.08, 11.31), (8.15, 7.94), (6.66, 6.44), (6.50, 6.29), (6.27, 6.07), (4.47, 4.35)]),
    ("multigpu30", [(13.37, 10.73), (6.89, 6.72), (5.45, 5.28), (5.30, 5.13), (5.43, 5.28), (3.64, 3.54)]),
    ("multigpu40", [(14.62, 9.91), (5.96, 5.81), (4.65, 4.50), (4.41, 4.26), (4.90, 4.77), (3.09, 3.01)]),
    ("multigpu50", [(18.72, 9.73), (5.27, 5.15), (4.31, 4.19), (3.94, 3.82), (4.38, 4.26), (2.91, 2.82)]),
];

/// The trace name of a pod list's file name: `openb_pod_list_gpuspec10.csv` → `gpuspec10`.
#[must_use]
pub fn trace_name(file_name: &str) -> &str {
    let stem = file_name.strip_suffix(".csv").unwrap_or(file_name);
    stem.strip_prefix("openb_pod_list_").unwrap_or(stem)
}

/// The paper's figure for `policy` (a name of this simulator, or "fgd") on `trace`.
#[must_use]
pub fn figure(trace: &str, policy: &str) -> Option<Figure> {
    let p = POLICIES.iter().position(|&x| x == policy)?;
    let (_, row) = TABLE.iter().find(|(t, _)| *t == trace)?;
    let (at_100, at_130) = row[p];
    Some(Figure { at_100, at_130 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_papers_figures_are_found_by_the_pod_lists_file_name() {
        let t = trace_name("openb_pod_list_gpuspec10.csv");
        assert_eq!(t, "gpuspec10");
        assert_eq!(
            figure(t, "fgd"),
            Some(Figure {
                at_100: 5.34,
                at_130: 5.05
            })
        );
        assert_eq!(figure("default", "best-fit").unwrap().at_100, 7.14);
        assert_eq!(figure("multigpu50", "random").unwrap().at_130, 9.73);
        assert_eq!(figure("default", "frag-aware"), None);
        assert_eq!(figure("my-cluster", "fgd"), None);
    }
}
