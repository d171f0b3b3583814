//! Plain HTTP/1.1 GET and POST, enough to scrape a metrics endpoint and to call an extender
//! as kube-scheduler does; and HTTPS with a client certificate through curl ([`curl`]), as
//! kube-scheduler and Prometheus call the extender and the agents.

use std::io::{Read, Write};
use std::net::TcpStream;

/// Sends `request` (a whole HTTP/1.1 request with `Connection: close`) to `addr` and returns
/// (status line, headers, body).
fn exchange(addr: &str, request: &str) -> std::io::Result<(String, String, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.write_all(request.as_bytes())?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    Ok((status.to_string(), headers.to_string(), body.to_string()))
}

/// Returns (status line, headers, body) of `GET path` on `addr`.
pub fn get(addr: &str, path: &str) -> std::io::Result<(String, String, String)> {
    exchange(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    )
}

/// Returns (status line, headers, body) of `POST path` with a JSON `body` on `addr`.
pub fn post_json(addr: &str, path: &str, body: &str) -> std::io::Result<(String, String, String)> {
    exchange(
        addr,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
}

/// A local TCP port that was free a moment ago.
#[must_use]
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// curl's exit code, the HTTP status and the body (with curl's complaints after it) of a
/// request to `path` at `addr` over HTTPS, trusting `ca.crt` of `ca_dir`, presenting
/// `client.crt` and `client.key` of `client_dir` if any (the files `gpuslice-scheduler
/// tls-certs` writes), POSTing the JSON `body` if any.
#[must_use]
pub fn curl(
    addr: &str,
    path: &str,
    ca_dir: &std::path::Path,
    client_dir: Option<&std::path::Path>,
    body: Option<&str>,
) -> (i32, String, String) {
    let mut cmd = std::process::Command::new("curl");
    cmd.args([
        "-sS",
        "--max-time",
        "30",
        "-w",
        "\n%{http_code}",
        "--cacert",
    ])
    .arg(ca_dir.join("ca.crt"));
    if let Some(c) = client_dir {
        cmd.arg("--cert")
            .arg(c.join("client.crt"))
            .arg("--key")
            .arg(c.join("client.key"));
    }
    if let Some(b) = body {
        cmd.args(["-H", "Content-Type: application/json", "--data-binary", b]);
    }
    let out = cmd
        .arg(format!("https://{addr}{path}"))
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    (
        out.status.code().unwrap_or(-1),
        status.to_string(),
        format!("{body}{}", String::from_utf8_lossy(&out.stderr)),
    )
}
