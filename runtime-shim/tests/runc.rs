//! The wrapper in front of the real runc: a GPU container gets its devices, driver, limits and
//! preload list; the agent holds its claim while it runs and not after; bad requests fail the
//! create with runc's JSON log and leave nothing behind; other containers pass untouched.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use gpuslice_nodeagent::client::Status;
use gpuslice_testsupport::{agent::Agent, binary, bus::Bus, rootfs, sim::SimNode, wait_for};

struct Node {
    sim: SimNode,
    bus: Bus,
    agent: Agent,
    work: tempfile::TempDir,
    interception_library: PathBuf,
}

impl Node {
    fn new() -> Self {
        let sim = SimNode::new(2, "T4", None);
        let bus = Bus::start();
        let agent = Agent::start(&binary("gpuslice-agent"), &bus, &sim, &[]);
        let work = tempfile::tempdir().unwrap();
        // Stands in for libgpuslice.so, which is built by the interception-library work: any
        // shared object shows that the file is mounted and preloaded.
        let src = work.path().join("marker.c");
        std::fs::write(&src, "int gpuslice_test_marker(void) { return 1; }\n").unwrap();
        let interception_library = work.path().join("libmarker.so");
        let ok = Command::new("gcc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&interception_library)
            .arg(&src)
            .status()
            .unwrap();
        assert!(ok.success());
        Self {
            sim,
            bus,
            agent,
            work,
            interception_library,
        }
    }

    fn runc_root(&self) -> PathBuf {
        self.work.path().join("runc-root")
    }

    /// A bundle whose container runs `args`, with `annotations`.
    fn bundle(&self, name: &str, args: &[&str], annotations: &[(&str, &str)]) -> PathBuf {
        let bundle = self.work.path().join(name);
        let smi = binary("nvidia-smi");
        rootfs::busybox(&bundle.join("rootfs"), &[&smi]);
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

    /// Runs the wrapper; its output goes to files, since a created container keeps the
    /// stdio it was given open.
    fn wrapper(&self, args: &[&str]) -> Output {
        let out = tempfile::tempfile().unwrap();
        let err = tempfile::tempfile().unwrap();
        let status = Command::new(binary("gpuslice-runtime"))
            .arg("--root")
            .arg(self.runc_root())
            .args(args)
            .env(
                "GPUSLICE_RUNTIME_CONFIG",
                self.work.path().join("absent.json"),
            )
            .env("GPUSLICE_LOW_LEVEL_RUNTIME", "runc")
            .env("GPUSLICE_DRIVER_ROOT", self.sim.root())
            .env("GPUSLICE_RUN_DIR", &self.agent.run_dir)
            .env("GPUSLICE_BUS_ADDRESS", &self.bus.address)
            .env("GPUSLICE_INTERCEPTION_LIBRARY", &self.interception_library)
            .env("GPUSLICE_HOOK", binary("gpuslice-hook"))
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

    fn runc(&self, args: &[&str]) -> Output {
        Command::new("runc")
            .arg("--root")
            .arg(self.runc_root())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn status(&self) -> Status {
        let out = Command::new(binary("gpuslice"))
            .args(["--bus-address", &self.bus.address, "status", "--json"])
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

fn read_all(mut f: std::fs::File) -> Vec<u8> {
    use std::io::{Read, Seek};
    let mut v = Vec::new();
    f.rewind().unwrap();
    f.read_to_end(&mut v).unwrap();
    v
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

const CHECKS: &str = r#"
for d in nvidia0 nvidia1 nvidiactl nvidia-uvm nvidia-uvm-tools; do
  if [ -c /dev/$d ]; then echo "dev $d present"; else echo "dev $d absent"; fi
done
cat /dev/nvidia0 2>&1 | sed 's/^/open nvidia0: /'
echo "preload $(cat /etc/ld.so.preload)"
[ -f /usr/lib/gpuslice/libgpuslice.so ] && echo "interception library mounted"
grep memory_bytes /run/gpuslice/limits
touch /run/gpuslice/limits 2>/dev/null && echo "limits writable" || echo "limits read-only"
/usr/bin/nvidia-smi -L
"#;

#[test]
fn a_gpu_container_run_by_runc_through_the_wrapper_gets_its_slice() {
    let node = Node::new();
    let bundle = node.bundle(
        "gpu",
        &["/bin/sleep", "60"],
        &[("gpuslice.io/memory", "2Gi")],
    );
    let b = bundle.display().to_string();
    let out = node.wrapper(&["create", "--bundle", &b, "gpu1"]);
    assert!(out.status.success(), "create failed: {}", text(&out));
    let out = node.wrapper(&["start", "gpu1"]);
    assert!(out.status.success(), "start failed: {}", text(&out));

    let s = node.status();
    assert_eq!(s.slices.len(), 1);
    let claim = &s.slices[0].claim;
    assert_eq!(claim.container_id, "gpu1");
    assert!(
        matches!(claim.state, gpuslice_core::ClaimState::Active { .. }),
        "poststart did not activate: {claim:?}"
    );
    assert_eq!(claim.gpus[0].minor, 0);

    let out = node.runc(&["exec", "gpu1", "/bin/sh", "-c", CHECKS]);
    let t = text(&out);
    for want in [
        "dev nvidia0 present",
        "dev nvidia1 absent",
        "dev nvidiactl present",
        "dev nvidia-uvm present",
        "dev nvidia-uvm-tools present",
        "open nvidia0: cat: can't open '/dev/nvidia0': No such device or address",
        "preload /usr/lib/gpuslice/libgpuslice.so",
        "interception library mounted",
        "gpu.0.memory_bytes=2147483648",
        "limits read-only",
        "GPU 0: Tesla T4",
    ] {
        assert!(t.contains(want), "{want:?} not in:\n{t}");
    }

    let out = node.runc(&["kill", "gpu1", "KILL"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(wait_for(Duration::from_secs(10), || text(
        &node.runc(&["state", "gpu1"])
    )
    .contains("\"stopped\"")));
    let out = node.wrapper(&["delete", "gpu1"]);
    assert!(out.status.success(), "delete failed: {}", text(&out));
    assert!(
        node.status().slices.is_empty(),
        "claim outlived its container"
    );
    assert!(!node.agent.run_dir.join("gpu1").exists());
}

#[test]
fn a_bad_request_fails_the_create_with_a_runc_json_log_and_leaves_nothing() {
    let node = Node::new();
    for (i, (key, value, why)) in [
        ("gpuslice.io/memory", "-1Gi", "negative"),
        ("gpuslice.io/memory", "64Gi", "has only 15Gi"),
    ]
    .iter()
    .enumerate()
    {
        let id = format!("bad{i}");
        let bundle = node.bundle(&id, &["/bin/true"], &[(key, value)]);
        let log = node.work.path().join(format!("{id}.log"));
        let (b, l) = (bundle.display().to_string(), log.display().to_string());
        let out = node.wrapper(&[
            "--log",
            &l,
            "--log-format",
            "json",
            "create",
            "--bundle",
            &b,
            &id,
        ]);
        assert!(!out.status.success(), "{id} was created");
        let line = std::fs::read_to_string(&log).unwrap();
        let entry: serde_json::Value = serde_json::from_str(line.lines().last().unwrap()).unwrap();
        assert_eq!(entry["level"], "error");
        let msg = entry["msg"].as_str().unwrap();
        assert!(
            msg.contains(&format!("annotation {key}={value:?}")) && msg.contains(why),
            "{msg}"
        );
        assert!(
            !text(&node.runc(&["state", &id])).contains("\"id\""),
            "runc knows {id}"
        );
        assert!(node.status().slices.is_empty());
        assert!(!node.agent.run_dir.join(&id).exists());
    }
}

#[test]
fn a_container_without_gpuslice_annotations_keeps_a_byte_identical_spec() {
    let node = Node::new();
    let bundle = node.bundle("plain", &["/bin/true"], &[("org.example/x", "1")]);
    let before = std::fs::read(bundle.join("config.json")).unwrap();
    let b = bundle.display().to_string();
    let out = node.wrapper(&["run", "--bundle", &b, "plain1"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(std::fs::read(bundle.join("config.json")).unwrap(), before);
    assert!(node.status().slices.is_empty());
}

#[test]
fn a_missing_interception_library_fails_the_create_and_releases_the_claim() {
    let mut node = Node::new();
    node.interception_library = Path::new("/nonexistent/libgpuslice.so").to_path_buf();
    let bundle = node.bundle("nolib", &["/bin/true"], &[("gpuslice.io/memory", "1Gi")]);
    let b = bundle.display().to_string();
    let out = node.wrapper(&["create", "--bundle", &b, "nolib1"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("interception library /nonexistent/libgpuslice.so is missing"),
        "{}",
        text(&out)
    );
    assert!(
        node.status().slices.is_empty(),
        "the claim of a container that was not created is held"
    );
}
