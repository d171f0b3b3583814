//! A slice on a simulated GPU node: a limits file and its usage region in a directory, the
//! interception library, and the test program `tests/c/wall.c` built against the fake driver.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command};

use gpuslice_core::limits::{GpuLimit, Limits};
use gpuslice_core::usage::{self, UsageSnapshot};
use gpuslice_testsupport::sim::SimNode;

pub const MIB: u64 = 1 << 20;

/// Writes `limits` and a fresh usage region for them into `dir`, as the agent does.
pub fn write_slice(dir: &Path, limits: &Limits) {
    std::fs::write(dir.join("limits"), limits.render()).unwrap();
    std::fs::write(
        dir.join(usage::FILE_NAME),
        usage::new_region(limits.gpus.len(), usage::DEFAULT_SLOTS),
    )
    .unwrap();
}

/// Builds the test program `tests/c/<name>.c` against the node's fake driver, into the node.
pub fn compile(sim: &SimNode, name: &str) -> PathBuf {
    sim.test_program(name)
}

pub struct Slice {
    pub sim: SimNode,
    pub dir: tempfile::TempDir,
    pub wall: PathBuf,
    pub limit: u64,
    pub context_bytes: u64,
}

impl Slice {
    /// A `limit`-byte slice of GPU 0 of a two-GPU T4 node whose contexts take `context_bytes`.
    pub fn new(limit: u64, context_bytes: u64) -> Self {
        Self::of_model("T4", limit, context_bytes)
    }

    /// As [`Slice::new`], of a node of `model` GPUs.
    pub fn of_model(model: &str, limit: u64, context_bytes: u64) -> Self {
        Self::on(
            SimNode::with_context_bytes(2, model, None, context_bytes),
            limit,
        )
    }

    /// A `limit`-byte slice of GPU 0 of `sim`, each context charged what one takes there.
    pub fn on(sim: SimNode, limit: u64) -> Self {
        let context_bytes = sim.spec.gpus[0].context_bytes;
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits {
            container_id: "wall-test".into(),
            gpus: vec![GpuLimit {
                uuid: sim.spec.gpus[0].uuid.clone(),
                memory_bytes: limit,
                cores: 0,
                context_bytes,
                window: None,
            }],
        };
        write_slice(dir.path(), &limits);
        let wall = compile(&sim, "wall");
        Self {
            sim,
            dir,
            wall,
            limit,
            context_bytes,
        }
    }

    pub fn limits_path(&self) -> PathBuf {
        self.dir.path().join("limits")
    }

    /// Bytes left once one process has its context.
    pub fn remaining(&self) -> u64 {
        self.limit - self.context_bytes
    }

    /// `program` with the driver's libraries as a container has them (the fronts before the
    /// interception library and the simulated driver) and this slice.
    pub fn command(&self, program: &Path) -> Command {
        let mut c = Command::new(program);
        c.env("LD_LIBRARY_PATH", self.sim.fronted_lib_dir())
            .env("GPUSLICE_LIMITS", self.limits_path());
        c
    }

    /// `unshare` running `script` in a mount namespace of its own with this slice's
    /// environment; the caller adds the program and its arguments (`"$@"` in `script`).
    pub fn in_mount_namespace(&self, script: &str) -> Command {
        let mut c = self.command(Path::new("unshare"));
        c.args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
        ]);
        c
    }

    /// Runs the wall program to its end and returns what it printed.
    pub fn wall(&self, mode: &str, path: &str, bytes: u64) -> Facts {
        self.wall_in(mode, path, bytes, &[])
    }

    /// As [`Slice::wall`], with more of the environment.
    pub fn wall_in(&self, mode: &str, path: &str, bytes: u64, env: &[(&str, &Path)]) -> Facts {
        let out = self
            .command(&self.wall)
            .args([mode, path, &bytes.to_string()])
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success() || text.contains("error="),
            "wall {mode} {path}: {out:?}"
        );
        Facts::parse(&text)
    }

    /// Runs `program` with `args` in this slice to its end and returns what it printed.
    pub fn facts(&self, program: &Path, args: &[&str]) -> Facts {
        let out = self.command(program).args(args).output().unwrap();
        Facts::parse(&String::from_utf8_lossy(&out.stdout))
    }

    /// Starts a wall program that keeps running ("hold", "fill", "churn"), once it has printed.
    pub fn start(&self, path: &str, bytes: u64) -> Running {
        let mut cmd = self.command(&self.wall);
        cmd.args(["link", path, &bytes.to_string()]);
        Running::start(cmd)
    }

    /// The usage region as every process of the slice shares it.
    pub fn usage(&self) -> UsageSnapshot {
        let bytes = std::fs::read(self.dir.path().join(usage::FILE_NAME)).unwrap();
        UsageSnapshot::parse(&bytes).unwrap()
    }
}

/// Truncates the file at `path` to nothing, as a process of the container could.
pub fn truncate(path: &Path) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(0)
        .unwrap();
}

/// `key=value` pairs printed on one line.
#[derive(Debug)]
pub struct Facts(pub HashMap<String, String>);

impl Facts {
    pub fn parse(line: &str) -> Self {
        Self(
            line.split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    pub fn get(&self, k: &str) -> &str {
        self.0.get(k).map_or("", String::as_str)
    }

    pub fn num(&self, k: &str) -> u64 {
        self.get(k)
            .parse()
            .unwrap_or_else(|_| panic!("{k} in {:?}", self.0))
    }
}

pub struct Running {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    pub facts: Facts,
}

impl Running {
    /// Starts `cmd` with piped stdin and stdout, once it has printed its first line.
    pub fn start(cmd: Command) -> Self {
        let (mut child, line) = gpuslice_testsupport::sim::start_holding(cmd);
        let stdin = child.stdin.take();
        Self {
            child,
            stdin,
            facts: Facts::parse(&line),
        }
    }

    /// Lets the program end and waits for it.
    pub fn finish(mut self) {
        drop(self.stdin.take());
        assert!(self.child.wait().unwrap().success());
    }

    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

/// The python of a cached environment of `scripts/cuda-clients [which]`: from `env`, or its
/// place in the cache (`dir`).
pub fn cached_python(env: &str, dir: &str, which: &str) -> PathBuf {
    let path = std::env::var_os(env)
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join(dir).join("bin/python"));
    assert!(
        path.exists(),
        "{} is missing: run scripts/cuda-clients {which} (scripts/test does) to install it",
        path.display()
    );
    path
}

/// The real CUDA clients' python (`tests/clients/requirements.txt`).
pub fn python() -> PathBuf {
    cached_python("GPUSLICE_CLIENTS_PYTHON", "clients", "")
}

/// PyTorch's python (`tests/clients/torch-requirements.txt`).
pub fn torch_python() -> PathBuf {
    cached_python("GPUSLICE_TORCH_PYTHON", "torch", "torch")
}

/// The CUDA 13 clients' python (`tests/clients/cuda13-requirements.txt`).
#[allow(dead_code)]
pub fn cuda13_python() -> PathBuf {
    cached_python("GPUSLICE_CUDA13_PYTHON", "cuda13", "cuda13")
}

/// The client program `name` in `tests/clients`.
pub fn client_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/clients")
        .join(name)
}

pub fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(&std::env::var_os("HOME").unwrap()).join(".cache"))
        .join("gpuslice")
}

/// Runs `cmd` to its end, which must be a success, and returns what it printed.
#[allow(dead_code)]
pub fn script_output(cmd: &mut Command) -> String {
    String::from_utf8_lossy(&gpuslice_testsupport::run_ok(cmd).stdout).into_owned()
}

/// Prints the unmodelled driver calls `name` made, from its log at `log`.
#[allow(dead_code)]
pub fn print_unmodelled(name: &str, log: &Path) {
    println!(
        "{name}: unmodelled driver calls {:?}",
        gpuslice_simnode::unmodelled::summarise(&std::fs::read_to_string(log).unwrap_or_default())
    );
}

/// Runs `tests/clients/<script>` with `args` in `slice` under `python` to its end, which must
/// be a success; prints the unmodelled driver calls it made (as `name`'s) and returns what it
/// printed.
#[allow(dead_code)]
pub fn client_facts(
    slice: &Slice,
    python: &Path,
    script: &str,
    args: &[&str],
    name: &str,
) -> Facts {
    let log = slice.dir.path().join(format!("unmodelled-{name}.log"));
    let text = script_output(
        slice
            .command(python)
            .arg(client_script(script))
            .args(args)
            .env("GPUSLICE_SIM_UNMODELLED_LOG", &log),
    );
    print_unmodelled(name, &log);
    Facts::parse(&text)
}
