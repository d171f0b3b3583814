//! Plain HTTP/1.1 GET and POST, enough to scrape a metrics endpoint and to call an extender
//! as kube-scheduler does.

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
