//! The node the container tests run on: a simulated GPU node, a private bus, a real agent, the
//! interception library, and bundles with a busybox root filesystem.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use gpuslice_agent_api::Status;
use gpuslice_testsupport::{agent::Agent, binary, bus::Bus, rootfs, sim::SimNode, wait_for};

pub struct Node {
    pub sim: SimNode,
    pub bus: Bus,
    pub agent: Agent,
    pub work: tempfile::TempDir,
    pub interception_library: PathBuf,
}

impl Node {
    pub fn new() -> Self {
        Self::with_agent_args(&[])
    }

    /// A node whose agent runs with `args` besides the test defaults.
    pub fn with_agent_args(args: &[&str]) -> Self {
        Self::with_gpus(2, args)
    }

    /// A node whose agent's backstop kills a process over its slice, with no tolerance,
    /// checking every 200 ms.
    pub fn killing_over_its_slice() -> Self {
        Self::killing_over_its_slice_and(&[])
    }

    /// As [`Node::killing_over_its_slice`], the agent run with `args` too.
    pub fn killing_over_its_slice_and(args: &[&str]) -> Self {
        let mut all = vec![
            "--enforce-interval",
            "200ms",
            "--over-limit-action",
            "kill",
            "--over-limit-tolerance",
            "0",
        ];
        all.extend(args);
        Self::with_agent_args(&all)
    }

    /// A node of `gpus` T4s whose agent runs with `args` besides the test defaults.
    pub fn with_gpus(gpus: u32, args: &[&str]) -> Self {
        Self::on(SimNode::new(gpus, "T4", None), args)
    }

    /// A node on the simulated GPUs `sim` whose agent runs with `args` besides the test
    /// defaults.
    pub fn on(sim: SimNode, args: &[&str]) -> Self {
        let bus = Bus::start();
        let agent = Agent::start(&binary("gpuslice-agent"), &bus, &sim, args);
        let work = tempfile::tempdir().unwrap();
        let interception_library = gpuslice_testsupport::target_dir().join("libgpuslice.so");
        assert!(
            interception_library.exists(),
            "{} (cargo build -p gpuslice-shim)",
            interception_library.display()
        );
        Self {
            sim,
            bus,
            agent,
            work,
            interception_library,
        }
    }

    /// The interception library's test program (`shim/tests/c/wall.c`), built to reach the
    /// driver only through dlopen, so that it runs in a container where the driver is mounted.
    pub fn wall_program(&self) -> PathBuf {
        rootfs::wall_program(self.work.path())
    }

    /// `runtime-shim/tests/c/door.c`: a program that allocates past the interception library.
    pub fn door_program(&self) -> PathBuf {
        self.c_program("door")
    }

    /// `tests/c/NAME.c`, built once for this node.
    pub fn c_program(&self, name: &str) -> PathBuf {
        let out = self.work.path().join(format!("{name}-program"));
        if !out.exists() {
            let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/c")
                .join(format!("{name}.c"));
            let ok = Command::new("gcc")
                .args(["-O1", "-o"])
                .arg(&out)
                .arg(&src)
                .arg("-ldl")
                .status()
                .unwrap();
            assert!(ok.success());
        }
        out
    }

    pub fn runc_root(&self) -> PathBuf {
        self.work.path().join("runc-root")
    }

    /// A bundle whose container runs `args`, with `annotations`.
    pub fn bundle(&self, name: &str, args: &[&str], annotations: &[(&str, &str)]) -> PathBuf {
        let bundle = self.work.path().join(name);
        let smi = binary("nvidia-smi");
        rootfs::busybox(&bundle.join("rootfs"), &[&smi]);
        let wall = self.wall_program();
        std::fs::copy(&wall, bundle.join("rootfs/usr/bin/wall")).unwrap();
        let ok = Command::new("runc")
            .arg("spec")
            .current_dir(&bundle)
            .status()
            .unwrap();
        assert!(ok.success());
        let path = bundle.join("config.json");
        let mut spec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        spec["process"]["terminal"] = false.into();
        spec["process"]["args"] = serde_json::json!(args);
        if !annotations.is_empty() {
            spec["annotations"] = annotations
                .iter()
                .map(|(k, v)| ((*k).to_string(), serde_json::Value::from(*v)))
                .collect();
        }
        std::fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
        bundle
    }

    /// Runs the wrapper against this node.
    pub fn wrapper(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(binary("gpuslice-runtime"));
        cmd.arg("--root")
            .arg(self.runc_root())
            .args(args)
            .envs(self.env());
        output_via_files(&mut cmd)
    }

    /// The environment that points the wrapper and the hook at this node: the simulated
    /// node's runtime configuration (its driver root and extra mounts) as a file, as an
    /// operator writes /etc/gpuslice/runtime.json, and the rest as variables.
    pub fn env(&self) -> Vec<(String, String)> {
        let config = self.work.path().join("runtime.json");
        if !config.exists() {
            std::fs::write(&config, self.sim.runtime_config().to_string()).unwrap();
        }
        vec![
            (
                "GPUSLICE_RUNTIME_CONFIG".into(),
                config.display().to_string(),
            ),
            ("GPUSLICE_LOW_LEVEL_RUNTIME".into(), "runc".into()),
            (
                "GPUSLICE_RUN_DIR".into(),
                self.agent.run_dir.display().to_string(),
            ),
            ("GPUSLICE_BUS_ADDRESS".into(), self.bus.address.clone()),
            (
                "GPUSLICE_INTERCEPTION_LIBRARY".into(),
                self.interception_library.display().to_string(),
            ),
            (
                "GPUSLICE_HOOK".into(),
                binary("gpuslice-hook").display().to_string(),
            ),
        ]
    }

    /// Runs runc itself against this node's runc root.
    pub fn runc(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new("runc");
        cmd.arg("--root").arg(self.runc_root()).args(args);
        output_via_files(&mut cmd)
    }

    /// What one context takes on the node's GPUs (charged to the slice of each process that
    /// has one), in MiB.
    pub fn context_mib(&self) -> u64 {
        self.sim.spec.gpus[0].context_bytes >> 20
    }

    /// What the host's driver says container `id`'s processes hold, in MiB: the simulated
    /// `nvidia-smi --query-compute-apps` on the host, summed over the pids `runc ps` gives.
    pub fn driver_held_mib(&self, id: &str) -> u64 {
        let ps = self.runc(&["ps", "--format", "json", id]);
        let pids: Vec<u32> = serde_json::from_slice(&ps.stdout).unwrap_or_default();
        let out = Command::new(binary("nvidia-smi"))
            .args([
                "--query-compute-apps=pid,used_memory",
                "--format=csv,noheader,nounits",
            ])
            .env("LD_LIBRARY_PATH", self.sim.lib_dir())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let (pid, mib) = l.split_once(", ")?;
                pids.contains(&pid.trim().parse().ok()?)
                    .then(|| mib.trim().parse::<u64>().ok())?
            })
            .sum()
    }

    pub fn status(&self) -> Status {
        let out = Command::new(binary("gpuslice"))
            .args(["--bus-address", &self.bus.address, "status", "--json"])
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

/// Runs podman with a store of this node's own, with `global` flags (e.g. `--hooks-dir DIR`)
/// before `args`.
pub fn podman(node: &Node, global: &[&std::ffi::OsStr], args: &[&str]) -> Output {
    rootfs::podman(node.work.path(), global, args)
}

/// Runs `cmd` with its output going to files rather than pipes: a created container keeps the
/// stdio it was given open, so reading a pipe to its end would wait for the container.
pub fn output_via_files(cmd: &mut Command) -> Output {
    let out = tempfile::tempfile().unwrap();
    let err = tempfile::tempfile().unwrap();
    let status = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(err.try_clone().unwrap())
        .status()
        .unwrap();
    Output {
        status,
        stdout: read_all(out),
        stderr: read_all(err),
    }
}

fn read_all(mut f: std::fs::File) -> Vec<u8> {
    use std::io::{Read, Seek};
    let mut v = Vec::new();
    f.rewind().unwrap();
    f.read_to_end(&mut v).unwrap();
    v
}

pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Checks run inside a GPU container; each prints a line the tests look for. The
/// container's directory is `$RUN_DIR`, `/run/gpuslice` unless set (a CDI slice device's is
/// `/run/gpuslice/<claim>`).
pub const CHECKS: &str = r#"
RUN_DIR=${RUN_DIR:-/run/gpuslice}
for d in nvidia0 nvidia1 nvidiactl nvidia-uvm nvidia-uvm-tools; do
  if [ -c /dev/$d ]; then echo "dev $d present"; else echo "dev $d absent"; fi
done
cat /dev/nvidia0 2>&1 | sed 's/^/open nvidia0: /'
[ -e /etc/ld.so.preload ] && echo "preload list present" || echo "no preload list"
[ -f /usr/lib/gpuslice/libgpuslice.so ] && echo "interception library mounted"
[ -f /usr/lib/gpuslice/driver/libgpuslice-driver-cuda.so.1 ] && echo "real driver under its private name"
(true > /usr/lib/x86_64-linux-gnu/libcuda.so.1) 2>/dev/null && echo "driver front replaced" || echo "driver front kept"
grep memory_bytes $RUN_DIR/limits
touch $RUN_DIR/limits 2>/dev/null && echo "limits writable" || echo "limits read-only"
busybox mkfifo $RUN_DIR/planted 2>/dev/null && echo "planted in run dir" || echo "run dir closed to new files"
busybox ln -s /etc/passwd $RUN_DIR/usage.link 2>/dev/null && echo "linked in run dir" || echo "run dir closed to links"
/usr/bin/nvidia-smi -L
/usr/bin/nvidia-smi --query-gpu=memory.total --format=csv,noheader | sed 's/^/slice memory /'
"#;

/// Fails unless `output` of [`CHECKS`] shows a container holding GPU 0 of the node, with a
/// 2 GiB wall.
pub fn assert_gpu_checks(t: &str) {
    for want in [
        "dev nvidia0 present",
        "dev nvidia1 absent",
        "dev nvidiactl present",
        "dev nvidia-uvm present",
        "dev nvidia-uvm-tools present",
        "open nvidia0: cat: can't open '/dev/nvidia0': No such device or address",
        "no preload list",
        "interception library mounted",
        "real driver under its private name",
        "driver front kept",
        "gpu.0.memory_bytes=2147483648",
        "limits read-only",
        "run dir closed to new files",
        "run dir closed to links",
        "GPU 0: Tesla T4",
        "slice memory 2048 MiB",
    ] {
        assert!(t.contains(want), "{want:?} not in:\n{t}");
    }
}

/// A private containerd, configured by `gpuslice-containerd`.
pub struct Containerd {
    child: std::process::Child,
    pub socket: PathBuf,
    pub config: PathBuf,
    pub dir: PathBuf,
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Containerd {
    /// Starts containerd in `node`'s work directory under `name`, with `extra` appended to
    /// its configuration, after `gpuslice-containerd configure` (as a drop-in when asked).
    pub fn start(node: &Node, name: &str, extra: &str, drop_in: bool) -> Self {
        let dir = node.work.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("containerd.sock");
        let config = dir.join("config.toml");
        let base = format!(
            "# private containerd for a test\nversion = 2\nroot = \"{0}/root\"\nstate = \"{0}/state\"\n\n[grpc]\n  address = \"{1}\"\n",
            dir.display(),
            socket.display()
        );
        std::fs::write(&config, base + extra).unwrap();
        let mut configure = Command::new(binary("gpuslice-containerd"));
        configure.args(["configure", "--config"]).arg(&config);
        if drop_in {
            configure
                .arg("--drop-in")
                .arg(dir.join("conf.d/gpuslice.toml"));
        }
        let out = configure
            .arg("--runtime-path")
            .arg(binary("gpuslice-runtime"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let log = std::fs::File::create(dir.join("containerd.log")).unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(&config)
            .envs(node.env())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("containerd (apt-get install containerd)");
        let up = wait_for(std::time::Duration::from_secs(20), || socket.exists());
        assert!(
            up,
            "containerd did not start:\n{}",
            std::fs::read_to_string(dir.join("containerd.log")).unwrap_or_default()
        );
        Self {
            child,
            socket,
            config,
            dir,
        }
    }

    /// Runs `ctr` against this containerd.
    pub fn ctr(&self, args: &[&str]) -> Output {
        Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }
}

/// `/etc/gpuslice/runtime.json` written for the length of a test and put back as it was:
/// podman starts its OCI runtime with an environment of its own, so the wrapper it runs
/// reads the operator's file. An exclusive lock keeps tests that write it apart.
pub struct EtcConfig {
    previous: Option<Vec<u8>>,
    _lock: std::fs::File,
}

const ETC_CONFIG: &str = "/etc/gpuslice/runtime.json";

impl EtcConfig {
    /// The configuration of the wrapper as an operator writes it for `node`: everything the
    /// tests otherwise pass in the environment.
    pub fn install_for(node: &Node) -> Self {
        let mut config = node.sim.runtime_config();
        config["runtime"] = "runc".into();
        config["run_dir"] = node.agent.run_dir.display().to_string().into();
        config["bus_address"] = node.bus.address.clone().into();
        config["interception_library"] = node.interception_library.display().to_string().into();
        config["hook"] = binary("gpuslice-hook").display().to_string().into();
        Self::install(&config)
    }

    pub fn install(config: &serde_json::Value) -> Self {
        let lock = std::fs::File::create("/run/gpuslice-test-etc-config.lock").unwrap();
        lock.lock().unwrap();
        let previous = std::fs::read(ETC_CONFIG).ok();
        std::fs::create_dir_all("/etc/gpuslice").unwrap();
        std::fs::write(ETC_CONFIG, config.to_string()).unwrap();
        Self {
            previous,
            _lock: lock,
        }
    }
}

impl Drop for EtcConfig {
    fn drop(&mut self) {
        match &self.previous {
            Some(bytes) => {
                let _ = std::fs::write(ETC_CONFIG, bytes);
            }
            None => {
                let _ = std::fs::remove_file(ETC_CONFIG);
                let _ = std::fs::remove_dir("/etc/gpuslice");
            }
        }
    }
}
