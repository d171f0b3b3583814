//! The real-GPU acceptance suite (`tests/gpu/run.sh`) run on a simulated H100 (`--sim`), so
//! that the suite itself keeps working where no GPU is: the agent at its defaults on a private
//! bus, claims made with `gpuslice claim`, each client of the clients' environment and of
//! PyTorch's (and raising the context limits the driver backs with memory) refused within 1%
//! below the slice as the simulated host's `nvidia-smi` sees it, an nvcc-built program whose
//! module declares more than its slice, and one whose kernel needs more local memory than it,
//! each refused at that launch, and the views inside the
//! slice; its SM share rows run (how closely pacing holds a share on
//! this node is `pacing.rs`'s to test, with its own program; the launch cost is a timing, left
//! to the real GPU).

mod common;

use std::path::Path;
use std::process::Command;

/// Runs the suite on the simulated node with `python` for the rows `only`; returns its output
/// (it exits 1 when a row is out of bounds: the callers check the rows they expect to pass).
fn suite(python: &Path, only: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(python)
        .arg(root.join("tests/gpu/acceptance.py"))
        .args(["--sim", "--only", only, "--python"])
        .arg(python)
        .output()
        .expect("python");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "the suite did not run on the simulated node:\n{text}"
    );
    text
}

/// Asserts that each of the rows named `checks` passed.
fn assert_pass(text: &str, checks: &[&str]) {
    for check in checks {
        assert!(row(text, check).ends_with("| pass |"), "{check}:\n{text}");
    }
}

/// The table row named `check`, e.g. `| wall: cupy | … | pass |`.
fn row<'a>(text: &'a str, check: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(&format!("| {check} |")))
        .unwrap_or_else(|| panic!("no row {check:?} in:\n{text}"))
}

#[test]
fn the_gpu_suite_passes_on_the_simulated_node_with_the_clients() {
    let text = suite(
        &common::python(),
        "cupy,cupy async pool,numba-cuda,cuda-bindings,cuda-bindings stack (cuCtxSetLimit),\
         cuda-bindings malloc heap (cuCtxSetLimit),cuda-bindings green contexts (cuGreenCtxCreate),\
         cuda-bindings module globals (cuModuleLoadData),nvcc",
    );
    assert_pass(
        &text,
        &[
            "wall: cupy",
            "wall: cupy async pool",
            "wall: numba-cuda",
            "wall: cuda-bindings",
            "wall: cuda-bindings stack (cuCtxSetLimit)",
            "wall: cuda-bindings malloc heap (cuCtxSetLimit)",
            "wall: cuda-bindings green contexts (cuGreenCtxCreate)",
            "wall: cuda-bindings module globals (cuModuleLoadData)",
            "wall: nvcc-built program, a __device__ array larger than its slice",
            "wall: nvcc-built program, a kernel's local memory larger than its slice",
            "view: nvidia-smi memory.total in the slice",
            "view: NVML (pynvml) memory total in the slice",
        ],
    );
}

#[test]
fn the_gpu_suite_passes_on_the_simulated_node_with_pytorch() {
    let text = suite(
        &common::torch_python(),
        "torch,torch expandable_segments,torch cudaMallocAsync,torch no settle,sm",
    );
    assert_pass(
        &text,
        &[
            "wall: torch",
            "wall: torch filling at once (no settle)",
            "wall: torch expandable_segments",
            "wall: torch cudaMallocAsync",
            "wall: two torch processes, one slice",
        ],
    );
    for cores in [10, 30, 50, 70] {
        let r = row(&text, &format!("SM share: cores {cores}, alone"));
        assert!(r.contains(" of the rate"), "{r}\n{text}");
    }
}
