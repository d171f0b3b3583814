//! What the end-to-end tests and benchmarks stand on: a simulated GPU node, a private
//! `dbus-daemon`, and node agents run as real processes.

pub mod agent;
#[cfg(feature = "apiserver")]
pub mod apiserver;
pub mod bench;
pub mod bus;
#[cfg(feature = "cdi")]
pub mod cdi;
#[cfg(feature = "grpc")]
pub mod grpc;
pub mod http;
#[cfg(feature = "manifests")]
pub mod manifests;
#[cfg(feature = "monitoring")]
pub mod monitoring;
pub mod rootfs;
pub mod sim;

use std::path::PathBuf;

/// The cargo target directory of the running test or bench (`target/debug`, `target/release`).
#[must_use]
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// The programs that run at every container start, which the package ships statically
/// linked (`scripts/static-programs`); tests and benches run those builds of them.
pub const STATIC_PROGRAMS: [&str; 2] = ["gpuslice-runtime", "gpuslice-hook"];

/// A binary built by this workspace next to the running test; for [`STATIC_PROGRAMS`], its
/// statically linked build in `static/` beside them, which must be newer than every source
/// file it was built from (its dep-info in `target/static` lists them), else it would test
/// code that is no longer there.
#[must_use]
pub fn binary(name: &str) -> PathBuf {
    let built = target_dir().join(name);
    assert!(
        built.exists(),
        "{} is missing: run `cargo build --workspace` (with --release for benches) first",
        built.display()
    );
    if !STATIC_PROGRAMS.contains(&name) {
        return built;
    }
    let release = target_dir().ends_with("release");
    let run = format!(
        "run `scripts/static-programs --profile {}` after the build",
        if release { "release" } else { "dev" }
    );
    let shipped = target_dir().join("static").join(name);
    let modified = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let Some(made) = modified(&shipped) else {
        panic!("{} is missing: {run}", shipped.display());
    };
    let dep_info = target_dir()
        .parent()
        .expect("target directory")
        .join("static")
        .join(if release { "release" } else { "debug" })
        .join(format!("{name}.d"));
    let sources = std::fs::read_to_string(&dep_info)
        .unwrap_or_else(|e| panic!("{}: {e}: {run}", dep_info.display()));
    if let Some(newer) = dep_info_sources(&sources)
        .into_iter()
        .find(|source| modified(source).is_none_or(|m| m > made))
    {
        panic!(
            "{} is older than {}: {run}",
            shipped.display(),
            newer.display()
        );
    }
    shipped
}

/// The source files a cargo dep-info file (`target: source source …`, spaces in paths
/// escaped with a backslash) lists.
fn dep_info_sources(text: &str) -> Vec<PathBuf> {
    let Some((_, sources)) = text.lines().next().and_then(|l| l.split_once(": ")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut current = String::new();
    let mut chars = sources.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => current.extend(chars.next()),
            ' ' => {
                if !current.is_empty() {
                    out.push(PathBuf::from(std::mem::take(&mut current)));
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        out.push(PathBuf::from(current));
    }
    out
}

/// Where agents keep their state in tests: /dev/shm (a tmpfs, as /run is for the agent in
/// production) when it is writable, else the system's temporary directory.
#[must_use]
pub fn runtime_tmp() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    let writable = tempfile::tempdir_in(&shm).is_ok();
    if writable { shm } else { std::env::temp_dir() }
}

/// Runs `cmd` and returns what it printed; panics naming the command, its exit status and
/// its output when it fails (or cannot be started).
pub fn run_ok(cmd: &mut std::process::Command) -> std::process::Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("failed to run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Waits until `cond` holds, polling, for at most `timeout`.
pub fn wait_for(timeout: std::time::Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    cond()
}

/// The value of `key` in a test program's `key=value` output, failing the test where it is
/// missing.
#[must_use]
pub fn field<T: std::str::FromStr>(text: &str, key: &str) -> T {
    text.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {text}"))
}

/// Where a cgroup v2 hierarchy is mounted (the unified one on a hybrid host).
#[must_use]
pub fn cgroup2_root() -> PathBuf {
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    info.lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mount_point = left.split_whitespace().nth(4)?;
            right
                .starts_with("cgroup2 ")
                .then(|| PathBuf::from(mount_point))
        })
        .expect("a cgroup2 hierarchy is mounted")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dep_info_line_gives_its_sources_with_escaped_spaces_kept() {
        let text =
            "/t/static/release/gpuslice-runtime: /w/a.rs /w/my\\ dir/b.rs  /w/c.rs\n\n/w/a.rs:\n";
        assert_eq!(
            dep_info_sources(text),
            ["/w/a.rs", "/w/my dir/b.rs", "/w/c.rs"].map(PathBuf::from)
        );
        assert!(dep_info_sources("").is_empty());
    }
}
