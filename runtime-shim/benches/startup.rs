//! Start-up cost of the two programs that run at every container start, side by side with
//! runc's own: `runc --version`, `gpuslice-runtime --version` (the wrapper starts, reads its
//! configuration, finds no GPU command and execs `runc --version`), and `gpuslice-hook
//! precreate` with a spec that asks for no GPU on stdin (the hook starts, reads the spec and
//! writes it back). Both as shipped (statically linked, `static/`) and as cargo links them
//! (dynamically). Interleaved rounds; prints medians and the ratios to runc.
//!
//! Run: `cargo build --release --workspace && scripts/static-programs && cargo bench -p
//! gpuslice-runtime-shim --bench startup` (`BENCH_ROUNDS`, default 200).
//! `GPUSLICE_BENCH_BIN_DIR` measures the binaries of another build (say, an earlier commit's
//! `target/release`) against the same runc.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpuslice_testsupport::bench::{median, rounds};

fn bin_dir() -> PathBuf {
    std::env::var_os("GPUSLICE_BENCH_BIN_DIR")
        .map_or_else(gpuslice_testsupport::target_dir, PathBuf::from)
}

/// Wall time of one run of `cmd` with `stdin` written to it; panics if it fails.
fn time(cmd: &mut Command, stdin: &[u8]) -> Duration {
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("write stdin");
    let status = child.wait().expect("wait");
    let elapsed = start.elapsed();
    assert!(status.success(), "{cmd:?} failed: {status}");
    elapsed
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rounds = rounds(200);
    let dir = bin_dir();
    let (wrapper, hook) = (
        dir.join("static/gpuslice-runtime"),
        dir.join("static/gpuslice-hook"),
    );
    let (dynamic_wrapper, dynamic_hook) = (dir.join("gpuslice-runtime"), dir.join("gpuslice-hook"));
    for b in [&wrapper, &hook, &dynamic_wrapper, &dynamic_hook] {
        assert!(
            b.exists(),
            "{} (cargo build --release --workspace && scripts/static-programs)",
            b.display()
        );
    }
    let work = tempfile::tempdir().expect("tempdir");
    let env = [
        (
            "GPUSLICE_RUNTIME_CONFIG",
            work.path().join("absent.json").display().to_string(),
        ),
        ("GPUSLICE_LOW_LEVEL_RUNTIME", "runc".to_string()),
    ];
    let spec = br#"{"ociVersion":"1.0.2","process":{"args":["/bin/true"],"cwd":"/"},"root":{"path":"rootfs"},"annotations":{"io.kubernetes.cri.container-type":"container"}}"#;
    let mut samples: [Vec<Duration>; 5] = Default::default();
    for i in 0..rounds + 5 {
        let runc = time(Command::new("runc").arg("--version"), b"");
        let wrapped = |w: &PathBuf| time(Command::new(w).arg("--version").envs(env.clone()), b"");
        let hooked = |h: &PathBuf| time(Command::new(h).arg("precreate").envs(env.clone()), spec);
        let round = [
            runc,
            wrapped(&wrapper),
            hooked(&hook),
            wrapped(&dynamic_wrapper),
            hooked(&dynamic_hook),
        ];
        if i >= 5 {
            for (s, d) in samples.iter_mut().zip(round) {
                s.push(d);
            }
        }
    }
    let [runc, wrapped, hooked, dynamic_wrapped, dynamic_hooked] = samples.map(median);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "bench=startup rounds={rounds} bin_dir={} runc_version_ms={:.3} wrapper_version_ms={:.3} hook_precreate_ms={:.3}",
        dir.display(),
        ms(runc),
        ms(wrapped),
        ms(hooked)
    );
    println!(
        "bench=startup wrapper_over_runc={:.3} hook_over_runc={:.3}",
        wrapped.as_secs_f64() / runc.as_secs_f64(),
        hooked.as_secs_f64() / runc.as_secs_f64()
    );
    println!(
        "bench=startup dynamically_linked wrapper_version_ms={:.3} hook_precreate_ms={:.3} wrapper_over_runc={:.3}",
        ms(dynamic_wrapped),
        ms(dynamic_hooked),
        dynamic_wrapped.as_secs_f64() / runc.as_secs_f64()
    );
}
