//! `gpuslice-agent` as a real process on a private bus and a simulated node, started the way
//! systemd starts it: readiness is its `READY=1` on `NOTIFY_SOCKET`.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::bus::Bus;
use crate::sim::SimNode;

pub struct Agent {
    exe: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    child: Option<Child>,
    dir: tempfile::TempDir,
    notify: UnixDatagram,
    pub state_dir: PathBuf,
    pub run_dir: PathBuf,
    pub metrics_address: String,
    pub bus_address: String,
}

impl Agent {
    /// Starts the agent at `exe` and waits until it reports ready. `extra` are further
    /// command-line arguments.
    #[must_use]
    pub fn start(exe: &Path, bus: &Bus, sim: &SimNode, extra: &[&str]) -> Self {
        Self::start_with_env(exe, bus, sim, extra, &[])
    }

    #[must_use]
    pub fn start_with_env(
        exe: &Path,
        bus: &Bus,
        sim: &SimNode,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        Self::start_in(&crate::runtime_tmp(), exe, bus, sim, extra, env)
    }

    /// Starts an agent whose state and run directories live under `base` (a tmpfs like the
    /// agent's default /run, or a disk).
    #[must_use]
    pub fn start_in(
        base: &Path,
        exe: &Path,
        bus: &Bus,
        sim: &SimNode,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("gpuslice-agent-")
            .tempdir_in(base)
            .expect("tempdir");
        let notify_path = dir.path().join("notify");
        let notify = UnixDatagram::bind(&notify_path).expect("notify socket");
        notify
            .set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        let state_dir = dir.path().join("state");
        let run_dir = dir.path().join("run");
        let metrics_address = format!("127.0.0.1:{}", crate::http::free_port());
        let mut args: Vec<String> = vec![
            "--driver-root".into(),
            sim.root().display().to_string(),
            "--state-dir".into(),
            state_dir.display().to_string(),
            "--run-dir".into(),
            run_dir.display().to_string(),
            "--bus-address".into(),
            bus.address.clone(),
            "--metrics-address".into(),
            metrics_address.clone(),
            "--runtime-root".into(),
            dir.path().join("no-runtime").display().to_string(),
        ];
        // CDI specs go to a directory of the test's own unless the test names one.
        if !extra.contains(&"--cdi-dir") {
            args.extend([
                "--cdi-dir".into(),
                dir.path().join("cdi").display().to_string(),
            ]);
        }
        args.extend(extra.iter().map(|s| (*s).to_string()));
        let mut env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect();
        env.push(("NOTIFY_SOCKET".into(), notify_path.display().to_string()));
        let mut agent = Self {
            exe: exe.to_path_buf(),
            args,
            env,
            child: None,
            dir,
            notify,
            state_dir,
            run_dir,
            metrics_address,
            bus_address: bus.address.clone(),
        };
        agent.spawn();
        agent
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("log");
        let child = Command::new(&self.exe)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn gpuslice-agent");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if self
                .notifications()
                .iter()
                .any(|m| m.lines().any(|l| l == "READY=1"))
            {
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "gpuslice-agent exited with {status} before it was ready:\n{}",
                    self.log()
                );
            }
        }
        panic!("gpuslice-agent was not ready within 30s:\n{}", self.log());
    }

    /// The agent's private socket (its default place, in the state directory).
    #[must_use]
    pub fn private_socket(&self) -> PathBuf {
        self.state_dir.join("private")
    }

    /// Messages received on the notify socket since the last call (waits up to 200 ms).
    pub fn notifications(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = self.notify.recv(&mut buf) {
            out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            self.notify.set_nonblocking(true).ok();
        }
        self.notify.set_nonblocking(false).ok();
        out
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("agent.log")
    }

    /// Everything the agent wrote to stderr, across restarts.
    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The agent's log once it holds `text`, waiting up to `timeout` (the agent acts first and
    /// logs what it did after, so a test that saw the act may read the log a moment early);
    /// the log as it was where it never did.
    pub fn log_once_it_says(&self, text: &str, timeout: Duration) -> Result<String, String> {
        let mut log = String::new();
        if crate::wait_for(timeout, || {
            log = self.log();
            log.contains(text)
        }) {
            Ok(log)
        } else {
            Err(log)
        }
    }

    /// SIGKILL, as a crash at an arbitrary instant.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the agent again on the same state, bus and node.
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// Waits up to `timeout` for the agent to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.as_mut()?.try_wait().ok().flatten() {
                self.child = None;
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// SIGTERM and wait; returns the exit status.
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let mut c = self.child.take()?;
        // SAFETY: kill(2) on the pid of a child we own and have not yet reaped.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(i32::try_from(c.id()).ok()?, libc::SIGTERM);
        }
        c.wait().ok()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill9();
    }
}
