//! The packaged systemd units are valid for systemd itself.

use std::path::Path;
use std::process::Command;

#[test]
fn the_systemd_units_pass_systemd_analyze_verify() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("systemd-analyze is missing (apt-get install systemd)");
    }
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/systemd");
    let agent = env!("CARGO_BIN_EXE_gpuslice-agent");
    let dir = tempfile::tempdir().unwrap();
    let mut copies = Vec::new();
    for name in ["gpuslice-agent.service", "run-gpuslice.mount"] {
        let text = std::fs::read_to_string(units.join(name)).unwrap();
        let copy = dir.path().join(name);
        std::fs::write(&copy, text.replace("/usr/bin/gpuslice-agent", agent)).unwrap();
        copies.push(copy);
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(&copies)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let relevant: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("gpuslice-agent.service") || l.contains("run-gpuslice.mount"))
        .collect();
    assert!(out.status.success() && relevant.is_empty(), "{err}");
}
