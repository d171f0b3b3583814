//! The agent's metrics endpoint over HTTPS, scraped by Prometheus itself (Debian's
//! `prometheus`) and by curl presenting what a scrape configuration's `tls_config` names (the
//! CA, a client certificate and key). `/metrics` names the node's containers and pods and what
//! each holds: with a client CA, only the scraper's certificate reads it, while `/healthz`
//! answers everyone; files that make no configuration stop the agent at start, naming the flag.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use gpuslice_testsupport::http::{self, curl};
use gpuslice_testsupport::{agent::Agent, bus::Bus, sim::SimNode, wait_for};
use gpuslice_tls::certs::{Authority, Pem};

/// Writes `pem` into `dir` as `name.crt` and `name.key`.
fn write(dir: &Path, name: &str, pem: &Pem) {
    std::fs::write(dir.join(format!("{name}.crt")), &pem.cert).unwrap();
    std::fs::write(dir.join(format!("{name}.key")), &pem.key).unwrap();
}

/// A directory with `ca`'s certificate and a client certificate of it named `client`.
fn client_of(ca: &Authority, client: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.crt"), &ca.pem.cert).unwrap();
    write(dir.path(), "client", &ca.client(client).unwrap());
    dir
}

/// A directory with a CA's certificate, the agent's server certificate for 127.0.0.1 signed
/// by it, and the scraper's client certificate named `prometheus` (the files
/// `gpuslice-scheduler tls-certs` writes), and the CA.
fn certs() -> (tempfile::TempDir, Authority) {
    let ca = Authority::new(1).unwrap();
    let dir = client_of(&ca, "prometheus");
    write(
        dir.path(),
        "tls",
        &ca.server(&["127.0.0.1".into()]).unwrap(),
    );
    (dir, ca)
}

fn file(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

/// An agent serving /metrics over HTTPS with the certificates in `dir` ([`certs`]),
/// answering the client certificate named `prometheus` only.
fn tls_agent(sim: &SimNode, bus: &Bus, dir: &Path) -> Agent {
    Agent::start(
        &agent_exe(),
        bus,
        sim,
        &[
            "--metrics-tls-cert-file",
            &file(dir, "tls.crt"),
            "--metrics-tls-private-key-file",
            &file(dir, "tls.key"),
            "--metrics-client-ca-file",
            &file(dir, "ca.crt"),
            "--metrics-client-allowed-names",
            "prometheus",
        ],
    )
}

#[test]
fn with_a_client_ca_only_the_scrapers_certificate_reads_the_metrics_and_health_answers_everyone() {
    let (dir, ca) = certs();
    let sim = SimNode::new(1, "T4", None);
    let bus = Bus::start();
    let agent = tls_agent(&sim, &bus, dir.path());
    let out = cli(
        &bus.address,
        &["claim", "web-1", "-a", "gpuslice.io/memory=2Gi"],
    );
    assert_success(&out);
    let addr = &agent.metrics_address;

    // Any pod of the cluster, with no certificate: refused, the container's name not shown.
    let (_, status, body) = curl(addr, "/metrics", dir.path(), None, None);
    assert_eq!(status, "403", "{body}");
    assert!(body.contains("--metrics-client-ca-file"), "{body}");
    assert!(!body.contains("web-1"), "{body}");
    // A certificate of the same CA with another name (a CA that signs others' too).
    let kubelet = client_of(&ca, "system:node:gpu-node-1");
    let (_, status, body) = curl(addr, "/metrics", dir.path(), Some(kubelet.path()), None);
    assert_eq!(status, "403", "{body}");
    assert!(body.contains("--metrics-client-allowed-names"), "{body}");
    // A certificate of another CA does not even finish the handshake.
    let stranger = client_of(&Authority::new(1).unwrap(), "prometheus");
    let (code, status, body) = curl(addr, "/metrics", dir.path(), Some(stranger.path()), None);
    assert!(code != 0 && status == "000", "curl {code} {status}: {body}");
    // Health answers everyone.
    let (_, status, body) = curl(addr, "/healthz", dir.path(), None, None);
    assert_eq!(status, "200", "{body}");
    // Plain HTTP gets nothing from the HTTPS port.
    if let Ok((status, _, body)) = http::get(addr, "/metrics") {
        assert!(
            !status.contains("200") && !body.contains("web-1"),
            "{status} {body}"
        );
    }

    // The scraper reads everything, its refusals counted.
    let (_, status, body) = curl(addr, "/metrics", dir.path(), Some(dir.path()), None);
    assert_eq!(status, "200", "{body}");
    assert!(body.contains("container=\"web-1\""), "{body}");
    assert!(
        body.lines()
            .any(|l| l.starts_with("gpuslice_metrics_scrapes_refused_total ") && !l.ends_with(" 0")),
        "{body}"
    );
}

#[test]
fn a_metrics_key_that_is_not_its_certificates_stops_the_agent_at_start_naming_both_flags() {
    let (dir, _) = certs();
    // The client certificate's key beside the server certificate.
    let key = file(dir.path(), "client.key");
    let sim = SimNode::new(1, "T4", None);
    let bus = Bus::start();
    let state = tempfile::tempdir().unwrap();
    let out = Command::new(agent_exe())
        .args(["--driver-root", &sim.root().display().to_string()])
        .args([
            "--state-dir",
            &state.path().join("state").display().to_string(),
        ])
        .args(["--run-dir", &state.path().join("run").display().to_string()])
        .args(["--bus-address", &bus.address])
        .args(["--metrics-address", "127.0.0.1:0"])
        .args(["--metrics-tls-cert-file", &file(dir.path(), "tls.crt")])
        .args(["--metrics-tls-private-key-file", &key])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--metrics-tls-cert-file")
            && err.contains(&format!("--metrics-tls-private-key-file {key}")),
        "{err}"
    );
}

/// Prometheus itself (Debian's `prometheus`), run for a test with `config` in a directory of
/// its own, killed when dropped.
struct Prometheus {
    child: std::process::Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(config: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        let addr = format!("127.0.0.1:{}", http::free_port());
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("log")).unwrap())
            .spawn()
            .expect("run prometheus (Debian's prometheus package)");
        Self {
            child,
            addr,
            _dir: dir,
        }
    }

    /// The JSON `data` of `GET path` on Prometheus's API, once it answers.
    fn api(&self, path: &str) -> Option<serde_json::Value> {
        let (status, _, body) = http::get(&self.addr, path).ok()?;
        if !status.contains("200") {
            return None;
        }
        let body: serde_json::Value = serde_json::from_str(&body).ok()?;
        Some(body["data"].clone())
    }

    /// Each job's target (one a job), once every one of them was scraped: its health and last
    /// error.
    fn scraped_targets(&self) -> Option<Vec<(String, String, String)>> {
        let data = self.api("/api/v1/targets")?;
        let targets: Vec<(String, String, String)> = data["activeTargets"]
            .as_array()?
            .iter()
            .map(|t| {
                let s = |k: &str| t[k].as_str().unwrap_or_default().to_string();
                (
                    t["labels"]["job"].as_str().unwrap_or_default().to_string(),
                    s("health"),
                    s("lastError"),
                )
            })
            .collect();
        (!targets.is_empty() && targets.iter().all(|t| t.1 != "unknown")).then_some(targets)
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn prometheus_scrapes_the_agent_with_its_client_certificate_and_without_one_is_refused() {
    let (dir, _) = certs();
    let sim = SimNode::new(1, "T4", None);
    let bus = Bus::start();
    let agent = tls_agent(&sim, &bus, dir.path());
    assert_success(&cli(
        &bus.address,
        &["claim", "web-1", "-a", "gpuslice.io/memory=2Gi"],
    ));
    // Two jobs on the same agent, as a scrape configuration's tls_config names the files: one
    // with the scraper's client certificate, one trusting the server and presenting none.
    let f = |name: &str| file(dir.path(), name);
    let config = format!(
        r#"global: {{scrape_interval: 1s, scrape_timeout: 1s}}
scrape_configs:
  - job_name: scraper
    scheme: https
    tls_config: {{ca_file: "{ca}", cert_file: "{cert}", key_file: "{key}"}}
    static_configs: [{{targets: ["{addr}"]}}]
  - job_name: anyone
    scheme: https
    tls_config: {{ca_file: "{ca}"}}
    static_configs: [{{targets: ["{addr}"]}}]
"#,
        ca = f("ca.crt"),
        cert = f("client.crt"),
        key = f("client.key"),
        addr = agent.metrics_address,
    );
    let prometheus = Prometheus::start(&config);
    let mut targets = None;
    assert!(
        wait_for(Duration::from_secs(30), || {
            targets = prometheus.scraped_targets();
            targets.is_some()
        }),
        "Prometheus scraped nothing in 30 s"
    );
    let targets = targets.unwrap();
    let job = |name: &str| targets.iter().find(|t| t.0 == name).unwrap().clone();
    let (_, health, error) = job("scraper");
    assert_eq!(health, "up", "{error}");
    let (_, health, error) = job("anyone");
    assert_eq!(health, "down");
    assert!(error.contains("403"), "{error}");
    // What the scraper read is in Prometheus: the slice's wall, by container.
    let query = "/api/v1/query?query=gpuslice_slice_memory_limit_bytes";
    let mut walls = Vec::new();
    assert!(wait_for(Duration::from_secs(10), || {
        walls = prometheus
            .api(query)
            .and_then(|d| d["result"].as_array().cloned())
            .unwrap_or_default();
        !walls.is_empty()
    }));
    assert_eq!(walls[0]["metric"]["container"], "web-1", "{walls:?}");
    assert_eq!(walls[0]["metric"]["job"], "scraper", "{walls:?}");
    assert_eq!(walls[0]["value"][1], (2u64 << 30).to_string(), "{walls:?}");
}
