//! The packaged observability (`packaging/monitoring/`: Prometheus alert rules and a Grafana
//! dashboard) checked against what the code exports: every query names only metrics a scrape
//! of the running component shows, and `promtool` accepts the rules and every dashboard query.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/monitoring")
}

pub fn rules_file() -> PathBuf {
    dir().join("gpuslice-alerts.yaml")
}

pub fn dashboard_file() -> PathBuf {
    dir().join("gpuslice-dashboard.json")
}

/// Every PromQL query of the rules and the dashboard, each with where it is.
#[must_use]
pub fn queries() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let rules: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(rules_file()).expect("rules"))
            .expect("the rules file is YAML");
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"].as_str().or(rule["record"].as_str());
            let expr = rule["expr"].as_str().expect("every rule has an expr");
            out.push((format!("rule {}", name.unwrap_or("?")), expr.to_string()));
        }
    }
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dashboard_file()).expect("dashboard"))
            .expect("the dashboard is JSON");
    for panel in dash["panels"].as_array().expect("panels") {
        for t in panel["targets"].as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or("?");
            out.push((
                format!("panel {title:?}"),
                t["expr"]
                    .as_str()
                    .expect("every target has an expr")
                    .to_string(),
            ));
        }
    }
    for v in dash["templating"]["list"].as_array().expect("templating") {
        if v["type"] == "query" {
            let q = v["query"].as_str().expect("a query variable has a query");
            // label_values(METRIC{…}, label): the metric is what is queried.
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|r| r.rsplit_once(','))
                .map_or(q, |(m, _)| m);
            out.push((format!("variable {}", v["name"]), inner.to_string()));
        }
    }
    out
}

/// The gpuslice metric names a query reads (identifiers outside quoted strings).
#[must_use]
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut quote: Option<char> = None;
    let mut word = String::new();
    let mut flush = |word: &mut String| {
        if word.starts_with("gpuslice_") {
            names.insert(std::mem::take(word));
        }
        word.clear();
    };
    for c in expr.chars() {
        match quote {
            Some(q) => {
                if c == q {
                    quote = None;
                }
            }
            None if c == '"' || c == '\'' || c == '`' => {
                flush(&mut word);
                quote = Some(c);
            }
            None if c.is_ascii_alphanumeric() || c == '_' || c == ':' => word.push(c),
            None => flush(&mut word),
        }
    }
    flush(&mut word);
    names
}

/// The sample names a scrape exposes (OpenMetrics text): each family's `# TYPE` line, with
/// `_total` for counters.
#[must_use]
pub fn exported(scrape: &str) -> BTreeSet<String> {
    scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let (name, kind) = l.split_once(' ')?;
            Some(if kind.trim() == "counter" {
                format!("{name}_total")
            } else {
                name.to_string()
            })
        })
        .collect()
}

/// The queries naming a metric with `prefix` that `scrape` does not export, as
/// `where: metric`.
#[must_use]
pub fn unknown_metrics(scrape: &str, prefix: &str, skip: &str) -> Vec<String> {
    let known = exported(scrape);
    let mut out = Vec::new();
    for (place, expr) in queries() {
        for m in metric_names(&expr) {
            let ours = m.starts_with(prefix) && (skip.is_empty() || !m.starts_with(skip));
            if ours && !known.contains(&m) {
                out.push(format!("{place}: {m}"));
            }
        }
    }
    out
}

/// The metrics of `scrape` with `prefix` that no rule or panel reads.
#[must_use]
pub fn unused_metrics(scrape: &str, prefix: &str, skip: &str) -> Vec<String> {
    let read: BTreeSet<String> = queries()
        .iter()
        .flat_map(|(_, e)| metric_names(e))
        .collect();
    exported(scrape)
        .into_iter()
        .filter(|m| m.starts_with(prefix) && (skip.is_empty() || !m.starts_with(skip)))
        .filter(|m| !read.contains(m))
        .collect()
}

/// Runs `promtool check rules` on the rules file and on the dashboard's queries made into
/// recording rules (Grafana's variables replaced by what they expand to). Returns promtool's
/// complaint, if any.
pub fn promtool_check() -> Result<(), String> {
    let tool = std::process::Command::new("promtool")
        .arg("--version")
        .output();
    if tool.is_err() {
        return Err("promtool is missing (apt-get install prometheus)".into());
    }
    let check = |file: &Path| -> Result<(), String> {
        let out = std::process::Command::new("promtool")
            .args(["check", "rules"])
            .arg(file)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    };
    check(&rules_file())?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (k, (_, expr)) in queries().iter().enumerate() {
        let expr = expr
            .replace("$__rate_interval", "5m")
            .replace("$instance", ".*")
            .replace("$container", ".*");
        let quoted = serde_json::to_string(&expr).map_err(|e| e.to_string())?;
        rules.push_str(&format!(
            "      - record: gpuslice:dashboard_query_{k}\n        expr: {quoted}\n"
        ));
    }
    let file = dir.path().join("dashboard-queries.yaml");
    std::fs::write(&file, rules).map_err(|e| e.to_string())?;
    check(&file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_names_are_read_whole_and_only_gpuslice_ones() {
        let names = metric_names(
            "sum by (x) (rate(gpuslice_claims_refused_total{a=\"gpuslice_no\"}[5m])) / on (x) gpuslice_gpu_sharers + up",
        );
        assert!(names.contains("gpuslice_claims_refused_total"));
        assert!(names.contains("gpuslice_gpu_sharers"));
        assert_eq!(names.len(), 2, "no label value, no other metric: {names:?}");
    }

    #[test]
    fn counters_are_exported_with_their_total_suffix() {
        let e = exported("# HELP a x\n# TYPE gpuslice_a counter\n# TYPE gpuslice_b gauge\n");
        assert!(e.contains("gpuslice_a_total") && e.contains("gpuslice_b"));
    }
}
