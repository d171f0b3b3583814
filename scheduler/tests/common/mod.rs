//! `gpuslice-scheduler serve` as a real process on a local port, for the extender's tests.

#![allow(dead_code)] // each test file uses its own part

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuslice_core::publication::{NODE_STATE_ANNOTATION, NodePublication, PublishedGpu};
use gpuslice_testsupport::apiserver::ApiServer;
use gpuslice_testsupport::http::{get, post_json};
use serde_json::{Value, json};

pub const GIB: u64 = 1 << 30;

pub struct Extender {
    child: Child,
    pub addr: String,
    /// The extender's log lines so far, printed when a test fails.
    log: Arc<Mutex<Vec<String>>>,
}

impl Drop for Extender {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- the extender's log ---");
            for line in self.log.lock().unwrap().iter() {
                eprintln!("{line}");
            }
        }
    }
}

impl Extender {
    /// Starts the extender with `args` after `serve --listen` on a port the kernel picks (the
    /// extender logs the address it listens on; a port chosen beforehand could be taken by a
    /// test running beside this one), and waits until it answers `/healthz` with `ok`.
    #[must_use]
    pub fn start(args: &[&str]) -> Self {
        Self::start_until(args, |addr| {
            get(addr, "/healthz").is_ok_and(|(s, _, b)| s.contains("200") && b == "ok")
        })
    }

    /// As [`Extender::start`], waiting until `up` says the extender at its address answers.
    #[must_use]
    pub fn start_until(args: &[&str], up: impl Fn(&str) -> bool) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_gpuslice-scheduler"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .env("GPUSLICE_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let log = Arc::new(Mutex::new(Vec::new()));
        let kept = log.clone();
        // Reads the log to its end, so that the extender never blocks on a full pipe.
        std::thread::spawn(move || {
            use std::io::BufRead;
            let mut tx = Some(tx);
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if let Some(rest) = line.split("serving the extender on ").nth(1)
                    && let Some(addr) = rest.split_whitespace().next()
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(addr.to_string());
                }
                kept.lock().unwrap().push(line);
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the extender logged no listening address");
        let e = Self { child, addr, log };
        let up = gpuslice_testsupport::wait_for(Duration::from_secs(10), || up(&e.addr));
        assert!(up, "extender did not come up on {}", e.addr);
        e
    }

    /// With API access (`api_url`) and, for bind, the shared key in `key`.
    #[must_use]
    pub fn with_api(api_url: &str, key: Option<&Path>) -> Self {
        let mut args = vec!["--api-server", api_url];
        let key = key.map(|k| k.to_str().unwrap().to_string());
        if let Some(k) = &key {
            args.extend(["--assignment-key", k]);
        }
        let e = Self::start(&args);
        // Ready once its Node and pod watches have listed the cluster.
        let ready = gpuslice_testsupport::wait_for(Duration::from_secs(60), || {
            get(&e.addr, "/readyz").is_ok_and(|(s, _, _)| s.contains("200"))
        });
        assert!(ready, "extender on {} never became ready", e.addr);
        e
    }

    /// Whether the extender has logged a line containing `text`.
    pub fn logged(&self, text: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(text))
    }

    /// The extender's process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// POSTs `body` to `verb` and returns (HTTP status line, the answer as JSON, or as a JSON
    /// string when it is not JSON).
    pub fn post(&self, verb: &str, body: &str) -> (String, Value) {
        let (status, _, body) = post_json(&self.addr, verb, body).unwrap();
        let v = serde_json::from_str(&body).unwrap_or(Value::String(body));
        (status, v)
    }

    /// POSTs `body` to `verb`, which must answer 200, and returns the answer.
    pub fn call(&self, verb: &str, body: &Value) -> Value {
        let (status, v) = self.post(verb, &body.to_string());
        assert!(status.contains("200"), "{verb}: {status} {v}");
        v
    }

    /// The value of the sample named `name` (with its labels, as exposed) on `/metrics`.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let (_, _, body) = get(&self.addr, "/metrics").ok()?;
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    }
}

/// A temporary file holding `key`, as a mounted Secret would.
#[must_use]
pub fn key_file(key: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("key");
    std::fs::write(&path, key).unwrap();
    (dir, path)
}

/// The node agent on `sim`, as node `gpu-node-1`, honouring assignments signed with the key in
/// `key`, with `extra` flags.
#[must_use]
pub fn node_agent(
    bus: &gpuslice_testsupport::bus::Bus,
    sim: &gpuslice_testsupport::sim::SimNode,
    key: &Path,
    extra: &[&str],
) -> gpuslice_testsupport::agent::Agent {
    let mut args = vec![
        "--assignment-key",
        key.to_str().unwrap(),
        "--node-name",
        "gpu-node-1",
    ];
    args.extend(extra);
    gpuslice_testsupport::agent::Agent::start(
        &gpuslice_testsupport::binary("gpuslice-agent"),
        bus,
        sim,
        &args,
    )
}

/// Claims a slice for container `container` of pod `pod_uid` with the pod's annotations, as
/// the runtime does once containerd has copied them into the container (`gpuslice claim`).
pub fn claim_as_container(
    bus: &gpuslice_testsupport::bus::Bus,
    pod_annotations: &Value,
    container: &str,
    pod_uid: &str,
) -> std::process::Output {
    let mut cmd = Command::new(gpuslice_testsupport::binary("gpuslice"));
    cmd.args(["--bus-address", &bus.address, "claim"])
        .arg(format!("ctr-{pod_uid}-{container}"))
        .arg("--json");
    for (k, v) in pod_annotations.as_object().into_iter().flatten() {
        cmd.args(["-a", &format!("{k}={}", v.as_str().unwrap_or_default())]);
    }
    cmd.arg("-a")
        .arg(format!("io.kubernetes.cri.container-name={container}"))
        .arg("-a")
        .arg(format!("io.kubernetes.cri.sandbox-uid={pod_uid}"))
        .output()
        .unwrap()
}

/// A 15 GiB T4 as its agent publishes it, with `allocated` bytes taken (by one slice).
pub fn t4(uuid: &str, allocated: u64) -> PublishedGpu {
    PublishedGpu {
        index: None,
        uuid: uuid.into(),
        model: "Tesla T4".into(),
        memory_total: 15 * GIB,
        memory_allocated: allocated,
        cores_allocated: 0,
        sharers: u32::from(allocated > 0),
        exclusive: false,
    }
}

/// Node gpu-node-1 as its agent publishes `gpus`, with the scheduler-assigned containers it
/// lists as `claimed`.
pub fn publish(api: &ApiServer, gpus: Vec<PublishedGpu>, claimed: &[&str]) -> NodePublication {
    let publication = NodePublication {
        topology: None,
        max_sharers: 16,
        version: 1,
        claimed: claimed.iter().map(|c| (*c).to_string()).collect(),
        gpus,
    };
    api.put_node(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "gpu-node-1", "annotations": {
            NODE_STATE_ANNOTATION: serde_json::to_string(&publication).unwrap()}}
    }));
    publication
}

/// Node gpu-node-1 with one 15 GiB GPU with `allocated` bytes taken.
pub fn publish_one_gpu(api: &ApiServer, allocated: u64, claimed: &[&str]) {
    publish(
        api,
        vec![t4("GPU-00000000-0000-4000-8000-000000000001", allocated)],
        claimed,
    );
}
