//! Building and running the C programs of `tests/c/` against a simulated node.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use gpuslice_testsupport::sim::SimNode;

/// `tests/c/<name>.c`, built into the node's root, linked with `libs` (e.g. `cuda`) from the
/// node's library directory.
pub fn compile(sim: &SimNode, name: &str, libs: &[&str]) -> PathBuf {
    let out = sim.root().join(name);
    let mut gcc = Command::new("gcc");
    gcc.arg("-o")
        .arg(&out)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c")))
        .arg(format!("-L{}", sim.lib_dir().display()));
    for lib in libs {
        gcc.arg(format!("-l{lib}"));
    }
    assert!(
        gcc.status().expect("gcc (apt-get install gcc)").success(),
        "{name}.c does not build"
    );
    out
}

/// Runs `program` with the node's libraries; returns what it printed, after checking it
/// exited 0.
pub fn run(sim: &SimNode, program: &Path, env: &[(&str, &Path)]) -> String {
    let out = Command::new(program)
        .env("LD_LIBRARY_PATH", sim.lib_dir())
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}: {text}", program.display());
    text
}

/// Builds and runs `tests/c/<name>.c` on `sim` (linked with libcuda), and checks that what it
/// printed holds each of `facts` and that it made no call the simulated driver does not
/// model.
pub fn run_checking(sim: &SimNode, name: &str, facts: &[&str]) {
    let exe = compile(sim, name, &["cuda"]);
    let log = sim.root().join("unmodelled.log");
    let text = run(sim, &exe, &[("GPUSLICE_SIM_UNMODELLED_LOG", &log)]);
    for fact in facts {
        assert!(text.contains(fact), "{fact}: {text}");
    }
    assert!(
        !log.exists(),
        "an unmodelled call: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}
