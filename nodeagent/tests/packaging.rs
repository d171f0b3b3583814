//! The packaged systemd unit is valid for systemd itself.

use std::path::Path;
use std::process::Command;

#[test]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("systemd-analyze is missing (apt-get install systemd)");
    }
    let unit =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/systemd/gpuslice-agent.service");
    let text = std::fs::read_to_string(&unit).unwrap();
    let agent = env!("CARGO_BIN_EXE_gpuslice-agent");
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("gpuslice-agent.service");
    std::fs::write(&copy, text.replace("/usr/bin/gpuslice-agent", agent)).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let relevant: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("gpuslice-agent.service"))
        .collect();
    assert!(out.status.success() && relevant.is_empty(), "{err}");
}
