//! The extender over HTTPS with the certificates `gpuslice-scheduler tls-certs` makes, called
//! by curl as kube-scheduler calls it (its extender `tlsConfig`: the CA, a client certificate
//! and key): filter, prioritize and bind answer only a caller presenting kube-scheduler's client
//! certificate, while probes and Prometheus need none; an extender others can reach refuses to
//! serve bind without client certificates; a connection stalled in its handshake holds up no
//! one.

mod common;

use std::io::Read;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Extender, publish_one_gpu};
use gpuslice_testsupport::apiserver::ApiServer;
use gpuslice_testsupport::http::curl;
use serde_json::json;

const KEY: &[u8] = b"shared between the scheduler and the agents";

/// A directory of certificates from `gpuslice-scheduler tls-certs`.
fn certs() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpuslice-scheduler"))
        .args(["tls-certs", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// The TLS flags of `serve` for the certificates in `dir`, client CA included.
fn tls_args(dir: &Path) -> Vec<String> {
    let f = |name: &str| dir.join(name).to_str().unwrap().to_string();
    vec![
        "--tls-cert-file".into(),
        f("tls.crt"),
        "--tls-private-key-file".into(),
        f("tls.key"),
        "--client-ca-file".into(),
        f("ca.crt"),
    ]
}

fn put_pod(api: &ApiServer, name: &str) {
    api.put_pod(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                     "resourceVersion": "1", "annotations": {"gpuslice.io/memory": "4Gi"}},
        "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}],
                 "runtimeClassName": "gpuslice"},
        "status": {"phase": "Pending"}
    }));
}

fn binding(name: &str) -> String {
    json!({"PodName": name, "PodNamespace": "default", "PodUID": format!("uid-{name}"),
           "Node": "gpu-node-1"})
    .to_string()
}

fn key_file(dir: &Path) -> PathBuf {
    let key = dir.join("assignment-key");
    std::fs::write(&key, KEY).unwrap();
    key
}

/// A stand-in API server with node gpu-node-1 (one free T4) and the pending pod `web`, and
/// the extender binding there over HTTPS with the certificates in `dir` and `extra` flags,
/// once it is ready (asked without a client certificate, as a probe asks).
fn binding_extender(dir: &Path, extra: &[&str]) -> (ApiServer, Extender) {
    let api = ApiServer::start();
    publish_one_gpu(&api, 0, &[]);
    put_pod(&api, "web");
    let key = key_file(dir);
    let mut args = vec![
        "--api-server".to_string(),
        api.url.clone(),
        "--assignment-key".into(),
        key.to_str().unwrap().into(),
    ];
    args.extend(tls_args(dir));
    args.extend(extra.iter().map(|a| (*a).to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let ext = Extender::start_until(&args, |addr| {
        curl(addr, "/readyz", dir, None, None).1 == "200"
    });
    (api, ext)
}

/// The extender over HTTPS with the certificates in `dir` (no API access), once it answers
/// `/healthz`.
fn tls_extender(dir: &Path) -> Extender {
    let args = tls_args(dir);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Extender::start_until(&args, |addr| {
        curl(addr, "/healthz", dir, None, None).1 == "200"
    })
}

/// Asks `ext` to bind the pod `web` presenting the client certificate in `client` (if any):
/// curl's exit code, the HTTP status and the body.
fn bind_web(ext: &Extender, ca: &Path, client: Option<&Path>) -> (i32, String, String) {
    curl(&ext.addr, "/bind", ca, client, Some(&binding("web")))
}

/// The node the pod `web` is bound to, if any.
fn node_of_web(api: &ApiServer) -> Option<String> {
    api.pod("default", "web").unwrap()["spec"]["nodeName"]
        .as_str()
        .map(str::to_owned)
}

#[test]
fn the_verbs_answer_only_a_caller_presenting_kube_schedulers_client_certificate() {
    let dir = certs();
    let (api, ext) = binding_extender(dir.path(), &[]);

    // Any other pod of the cluster: filter and bind refuse, nothing is bound.
    let filter = json!({"Pod": {"metadata": {"name": "web", "namespace": "default",
        "uid": "uid-web", "annotations": {"gpuslice.io/memory": "4Gi"}}},
        "NodeNames": ["gpu-node-1"]})
    .to_string();
    let (rc, status, body) = curl(&ext.addr, "/filter", dir.path(), None, Some(&filter));
    assert_eq!((rc, status.as_str()), (0, "403"), "{body}");
    assert!(
        body.contains("filter answers kube-scheduler only"),
        "{body}"
    );
    let (rc, status, body) = bind_web(&ext, dir.path(), None);
    assert_eq!((rc, status.as_str()), (0, "403"), "{body}");
    assert!(body.contains("--client-ca-file"), "{body}");
    assert_eq!(
        node_of_web(&api),
        None,
        "bound without a client certificate"
    );
    assert!(api.objects.lock().unwrap().bindings.is_empty());
    // Prometheus, without a certificate, reads the refusals.
    let (_, status, metrics) = curl(&ext.addr, "/metrics", dir.path(), None, None);
    assert_eq!(status, "200", "{metrics}");
    for verb in ["filter", "bind"] {
        let line =
            format!("gpuslice_scheduler_requests_total{{verb=\"{verb}\",outcome=\"refused\"}} 1");
        assert!(metrics.contains(&line), "no {line} in {metrics}");
    }

    // A client certificate from another CA fails the handshake.
    let other = certs();
    let (rc, _, body) = bind_web(&ext, dir.path(), Some(other.path()));
    assert_ne!(rc, 0, "a certificate of another CA was accepted: {body}");
    assert_eq!(node_of_web(&api), None);

    // kube-scheduler's certificate: filtered, then bound.
    let (rc, status, body) = curl(
        &ext.addr,
        "/filter",
        dir.path(),
        Some(dir.path()),
        Some(&filter),
    );
    assert_eq!((rc, status.as_str()), (0, "200"), "{body}");
    let answer: serde_json::Value = serde_json::from_str(body.trim()).unwrap();
    assert_eq!(answer["NodeNames"], json!(["gpu-node-1"]), "{body}");
    let (rc, status, body) = bind_web(&ext, dir.path(), Some(dir.path()));
    assert_eq!((rc, status.as_str()), (0, "200"), "{body}");
    let answer: serde_json::Value = serde_json::from_str(body.trim()).unwrap();
    assert_eq!(answer["Error"], "", "{body}");
    assert_eq!(node_of_web(&api).as_deref(), Some("gpu-node-1"));
}

/// As [`certs`], from `gpuslice_scheduler::certs` directly, with a second client certificate
/// of the same CA named `other` in `other/client.{crt,key}`.
fn certs_with_another_client(other: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let ca = gpuslice_scheduler::certs::Authority::new(1).unwrap();
    let server = ca.server(&["127.0.0.1".to_string()]).unwrap();
    let client = ca.client("system:kube-scheduler").unwrap();
    let stranger = ca.client(other).unwrap();
    std::fs::create_dir(dir.path().join("other")).unwrap();
    for (name, text) in [
        ("ca.crt", &ca.pem.cert),
        ("tls.crt", &server.cert),
        ("tls.key", &server.key),
        ("client.crt", &client.cert),
        ("client.key", &client.key),
        ("other/client.crt", &stranger.cert),
        ("other/client.key", &stranger.key),
    ] {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    dir
}

#[test]
fn a_certificate_of_the_client_ca_by_a_name_not_allowed_does_not_bind() {
    // The cluster's CA as client CA signs every kubelet's and user's certificate too:
    // --client-allowed-names keeps bind to kube-scheduler's.
    let dir = certs_with_another_client("system:node:gpu-node-1");
    let (api, ext) = binding_extender(
        dir.path(),
        &["--client-allowed-names=kube-scheduler,system:kube-scheduler"],
    );
    let other = dir.path().join("other");
    let (rc, status, body) = bind_web(&ext, dir.path(), Some(&other));
    assert_eq!((rc, status.as_str()), (0, "403"), "{body}");
    assert!(body.contains("--client-allowed-names"), "{body}");
    assert_eq!(node_of_web(&api), None);
    let (rc, status, body) = bind_web(&ext, dir.path(), Some(dir.path()));
    assert_eq!((rc, status.as_str()), (0, "200"), "{body}");
    assert_eq!(node_of_web(&api).as_deref(), Some("gpu-node-1"));
}

#[test]
fn an_extender_others_can_reach_refuses_to_serve_bind_without_client_certificates() {
    let dir = certs();
    let key = key_file(dir.path());
    for listen in ["0.0.0.0:0", "[::]:0"] {
        let out = Command::new(env!("CARGO_BIN_EXE_gpuslice-scheduler"))
            .args(["serve", "--listen", listen, "--assignment-key"])
            .arg(&key)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{listen}: served");
        assert!(err.contains(&format!("--listen {listen}")), "{err}");
        assert!(
            err.contains("--client-ca-file") && err.contains("loopback"),
            "{err}"
        );
    }
}

#[test]
fn a_connection_stalled_in_its_handshake_holds_up_no_other_caller() {
    let dir = certs();
    let ext = tls_extender(dir.path());
    // Connections that never send a byte of their handshake.
    let stalled: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(&ext.addr).unwrap())
        .collect();
    let (rc, status, body) = curl(&ext.addr, "/healthz", dir.path(), None, None);
    assert_eq!((rc, status.as_str(), body.trim()), (0, "200", "ok"));
    // Answered while every stalled connection was still waiting for its handshake (an
    // extender that handshook one connection at a time would have answered only after giving
    // up on each, closing it).
    for mut s in stalled {
        s.set_nonblocking(true).unwrap();
        let mut byte = [0u8; 1];
        let e = s
            .read(&mut byte)
            .expect_err("the stalled connection was closed or answered");
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}");
    }
}

#[test]
fn renewed_certificates_and_client_ca_are_served_without_a_restart() {
    // The extender's files in a directory of their own, first the old certificates'.
    let (old, new, served) = (certs(), certs(), tempfile::tempdir().unwrap());
    let files = ["tls.crt", "tls.key", "ca.crt"];
    for f in files {
        std::fs::copy(old.path().join(f), served.path().join(f)).unwrap();
    }
    let args = tls_args(served.path());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let ext = Extender::start_until(&args, |addr| {
        curl(addr, "/healthz", old.path(), None, None).1 == "200"
    });
    // A renewed Secret: every file replaced, each by a rename, as the kubelet swaps a Secret
    // volume's files.
    let staged = served.path().join("staged");
    std::fs::create_dir(&staged).unwrap();
    for f in files {
        std::fs::copy(new.path().join(f), staged.join(f)).unwrap();
        std::fs::rename(staged.join(f), served.path().join(f)).unwrap();
    }
    let served_new = gpuslice_testsupport::wait_for(std::time::Duration::from_secs(30), || {
        curl(&ext.addr, "/healthz", new.path(), None, None).1 == "200"
    });
    assert!(served_new, "the renewed certificate was not served");
    let (rc, _, body) = curl(&ext.addr, "/healthz", old.path(), None, None);
    assert_ne!(rc, 0, "the old CA still verifies the server: {body}");
    // The client CA too: the new client certificate passes the check of filter and
    // prioritize (its body is then refused as no ExtenderArgs: 400, not 403).
    let (rc, status, body) = curl(
        &ext.addr,
        "/prioritize",
        new.path(),
        Some(new.path()),
        Some("{}"),
    );
    assert_eq!((rc, status.as_str()), (0, "400"), "{body}");
}

#[test]
fn certificate_files_that_make_no_configuration_leave_the_one_before_served() {
    let dir = certs();
    let ext = tls_extender(dir.path());
    // A key that is not the certificate's.
    let other = certs();
    std::fs::copy(other.path().join("tls.key"), dir.path().join("tls.key")).unwrap();
    let warned = gpuslice_testsupport::wait_for(std::time::Duration::from_secs(30), || {
        ext.logged("make no configuration")
    });
    assert!(warned, "the broken files were not reported");
    let (rc, status, body) = curl(&ext.addr, "/healthz", dir.path(), None, None);
    assert_eq!((rc, status.as_str(), body.trim()), (0, "200", "ok"));
}
