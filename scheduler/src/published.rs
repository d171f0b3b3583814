//! The FGD paper's published results on the openb traces given with this project, for the
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

/// Per trace (the pod list's name without `openb_pod_list_`), per policy of [`POLICIES`].
#[allow(clippy::approx_constant)] // measured figures (6.28 is not τ)
const TABLE: [(&str, [(f64, f64); 6]); 5] = [
    (
        "default",
        [
            (13.70, 12.53),
            (9.38, 9.15),
            (8.35, 8.12),
            (8.22, 8.00),
            (7.14, 6.92),
            (4.77, 4.61),
        ],
    ),
    (
        "cpu050",
        [
            (10.98, 8.76),
            (6.97, 6.73),
            (6.48, 6.21),
            (6.54, 6.28),
            (6.44, 6.21),
            (5.00, 4.79),
        ],
    ),
    (
        "gpushare40",
        [
            (15.14, 14.00),
            (10.70, 10.44),
            (10.24, 9.98),
            (10.23, 9.97),
            (8.56, 8.31),
            (6.04, 5.85),
        ],
    ),
    (
        "gpuspec10",
        [
            (13.74, 12.57),
            (9.83, 9.61),
            (8.04, 7.82),
            (7.76, 7.54),
            (6.90, 6.70),
            (5.34, 5.05),
        ],
    ),
    (
        "multigpu20",
        [
            (13.08, 11.31),
            (8.15, 7.94),
            (6.66, 6.44),
            (6.50, 6.29),
            (6.27, 6.07),
            (4.47, 4.35),
        ],
    ),
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
        assert_eq!(figure("default", "frag-aware"), None);
        assert_eq!(figure("my-cluster", "fgd"), None);
    }
}
