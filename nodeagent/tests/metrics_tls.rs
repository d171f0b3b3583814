//! The agent's metrics endpoint over HTTPS, scraped by curl as Prometheus scrapes it (its
//! `tls_config`: the CA, a client certificate and key). `/metrics` names the node's containers
//! and pods and what each holds: with a client CA, only the scraper's certificate reads it,
//! while `/healthz` answers everyone; files that make no configuration stop the agent at
//! start, naming the flag.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use gpuslice_testsupport::http::{self, curl};
use gpuslice_testsupport::{agent::Agent, bus::Bus, sim::SimNode};
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

#[test]
fn with_a_client_ca_only_the_scrapers_certificate_reads_the_metrics_and_health_answers_everyone() {
    let (dir, ca) = certs();
    let sim = SimNode::new(1, "T4", None);
    let bus = Bus::start();
    let agent = Agent::start(
        &agent_exe(),
        &bus,
        &sim,
        &[
            "--metrics-tls-cert-file",
            &file(dir.path(), "tls.crt"),
            "--metrics-tls-private-key-file",
            &file(dir.path(), "tls.key"),
            "--metrics-client-ca-file",
            &file(dir.path(), "ca.crt"),
            "--metrics-client-allowed-names",
            "prometheus",
        ],
    );
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
