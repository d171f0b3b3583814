//! Helpers shared by the agent's end-to-end tests.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Output};

use gpuslice_agent_api::{AgentProxy, Status};

pub const GIB: u64 = 1 << 30;

pub fn agent_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpuslice-agent"))
}

/// Runs the `gpuslice` CLI against `bus`.
pub fn cli(bus: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .arg("--bus-address")
        .arg(bus)
        .args(args)
        .output()
        .expect("run gpuslice")
}

/// Fails the test with the command's stderr unless it succeeded.
pub fn assert_success(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs the `gpuslice` CLI as an unprivileged user (nobody).
pub fn cli_as_nobody(bus: &str, args: &[&str]) -> Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_gpuslice"))
        .arg("--bus-address")
        .arg(bus)
        .args(args)
        .output()
        .expect("run setpriv gpuslice")
}

pub async fn proxy(bus: &str) -> AgentProxy<'static> {
    let conn = gpuslice_agent_api::connect(Some(bus))
        .await
        .expect("connect to bus");
    AgentProxy::builder(&conn)
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await
        .expect("proxy")
}

pub async fn status(p: &AgentProxy<'_>) -> Status {
    serde_json::from_str(&p.status().await.expect("status")).expect("status json")
}

pub fn ann<'a>(pairs: &[(&'a str, &'a str)]) -> HashMap<&'a str, &'a str> {
    pairs.iter().copied().collect()
}

/// The D-Bus error name and message of a failed call.
pub fn method_error(e: &zbus::Error) -> Option<(String, String)> {
    match e {
        zbus::Error::MethodError(name, msg, _) => {
            Some((name.to_string(), msg.clone().unwrap_or_default()))
        }
        _ => None,
    }
}

/// Fails the test if any GPU holds more than its capacity, by the agent's account.
pub fn assert_within_capacity(s: &Status) {
    for g in &s.gpus {
        assert!(
            g.memory_allocated <= g.memory_total,
            "GPU {} over memory capacity: {g:?}",
            g.index
        );
        assert!(
            g.cores_allocated <= 100,
            "GPU {} over core capacity: {g:?}",
            g.index
        );
    }
}

/// A cgroup of its own (a container's, as far as the agent can tell), removed when dropped.
pub struct Cgroup(PathBuf);

impl Cgroup {
    pub fn new(name: &str) -> Self {
        let path = gpuslice_testsupport::cgroup2_root()
            .join(format!("gpuslice-test-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }
    pub fn adopt(&self, pid: u32) {
        std::fs::write(self.procs_file(), pid.to_string()).unwrap();
    }
    /// The file a process writes its pid to, to move into the cgroup.
    pub fn procs_file(&self) -> PathBuf {
        self.0.join("cgroup.procs")
    }
    /// Whether the cgroup is frozen (`cgroup.freeze`).
    pub fn frozen(&self) -> bool {
        std::fs::read_to_string(self.0.join("cgroup.freeze"))
            .unwrap()
            .trim()
            == "1"
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Runs `script` with `sh -c` in front of the driver libraries in `libs`, under the limits
/// file `limits`, with `env` besides; returns what it printed, failing the test unless it
/// succeeded.
pub fn script_output(
    script: &str,
    libs: &std::path::Path,
    limits: &std::path::Path,
    env: &[(&str, &str)],
) -> String {
    let out = gpuslice_testsupport::run_ok(
        Command::new("/bin/sh")
            .args(["-c", script])
            .env("LD_LIBRARY_PATH", libs)
            .env("GPUSLICE_LIMITS", limits)
            .envs(env.iter().copied()),
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
