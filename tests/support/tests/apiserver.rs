//! The API-server stand-in answers a watch as the API server does: from the resourceVersion
//! of a list, every change made after it is replayed, so a client that lists, then watches,
//! misses nothing written in between.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use gpuslice_testsupport::apiserver::ApiServer;
use serde_json::{Value, json};

/// Sends `GET path` and returns the response's body lines as they come (chunked transfer
/// coding: a size line, then the chunk).
fn get(api: &ApiServer, path: &str) -> impl Iterator<Item = String> + use<> {
    let addr = api.url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("request");
    let mut lines = BufReader::new(stream).lines().map_while(Result::ok);
    for line in lines.by_ref() {
        if line.is_empty() {
            break; // end of the headers
        }
    }
    lines.filter(|l| !l.is_empty() && !l.chars().all(|c| c.is_ascii_hexdigit()))
}

fn node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
}

#[test]
fn a_watch_from_a_lists_version_replays_what_changed_after_it() {
    let api = ApiServer::start();
    api.put_node(node("a"));
    let list: Value =
        serde_json::from_str(&get(&api, "/api/v1/nodes").next().expect("list")).expect("json");
    let version = list["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_string();
    // Written after the list, before the watch starts.
    api.put_node(node("b"));
    api.delete_node("a");
    let mut events = get(
        &api,
        &format!("/api/v1/nodes?watch=true&resourceVersion={version}"),
    );
    let mut next = || -> (String, String) {
        let e: Value = serde_json::from_str(&events.next().expect("event")).expect("json");
        (
            e["type"].as_str().unwrap_or_default().into(),
            e["object"]["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .into(),
        )
    };
    assert_eq!(next(), ("ADDED".into(), "b".into()));
    assert_eq!(next(), ("DELETED".into(), "a".into()));
    // Then the changes as they come.
    api.put_node(node("b"));
    assert_eq!(next(), ("MODIFIED".into(), "b".into()));
}

#[test]
fn a_watch_without_a_version_starts_with_every_object_and_honours_the_field_selector() {
    let api = ApiServer::start();
    let pod = |name: &str, node: Option<&str>| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "default"},
               "spec": {"nodeName": node}})
    };
    api.put_pod(pod("placed", Some("n1")));
    api.put_pod(pod("pending", None));
    let mut events = get(
        &api,
        "/api/v1/pods?watch=true&fieldSelector=spec.nodeName%21%3D",
    );
    let first: Value = serde_json::from_str(&events.next().expect("event")).expect("json");
    assert_eq!(first["type"], "ADDED");
    assert_eq!(first["object"]["metadata"]["name"], "placed");
    api.put_pod(pod("pending", None));
    api.put_pod(pod("bound", Some("n2")));
    let next: Value = serde_json::from_str(&events.next().expect("event")).expect("json");
    assert_eq!(
        next["object"]["metadata"]["name"], "bound",
        "the pod without a node is not watched: {next}"
    );
}

/// Sends a JSON merge patch to `path` and returns (status line, body).
fn merge_patch(api: &ApiServer, path: &str, body: &Value) -> (String, Value) {
    let addr = api.url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).expect("connect");
    let body = body.to_string();
    write!(
        stream,
        "PATCH {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/merge-patch+json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("request");
    let mut text = String::new();
    std::io::Read::read_to_string(&mut stream, &mut text).expect("response");
    let (head, rest) = text.split_once("\r\n\r\n").expect("headers");
    let status = head.lines().next().unwrap_or("").to_string();
    (
        status,
        serde_json::from_str(rest.trim()).unwrap_or(Value::Null),
    )
}

#[test]
fn a_patch_naming_a_resource_version_applies_only_to_that_version() {
    let api = ApiServer::start();
    api.put_node(node("gpu-1"));
    let version = api.node("gpu-1").unwrap()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let patch = |v: &str, value: &str| json!({"metadata": {"resourceVersion": v, "annotations": {"example.com/k": value}}});
    let (status, first) = merge_patch(&api, "/api/v1/nodes/gpu-1", &patch(&version, "a"));
    assert!(status.contains("200"), "{status} {first}");
    // The same precondition again: the node has moved on.
    let (status, refused) = merge_patch(&api, "/api/v1/nodes/gpu-1", &patch(&version, "b"));
    assert!(status.contains("409"), "{status}");
    assert_eq!(refused["reason"], "Conflict");
    assert_eq!(
        api.node("gpu-1").unwrap()["metadata"]["annotations"]["example.com/k"],
        "a"
    );
    let now = first["metadata"]["resourceVersion"].as_str().unwrap();
    let (status, _) = merge_patch(&api, "/api/v1/nodes/gpu-1", &patch(now, "b"));
    assert!(status.contains("200"), "{status}");
    // Without a resourceVersion a patch always applies.
    let (status, _) = merge_patch(
        &api,
        "/api/v1/nodes/gpu-1",
        &json!({"metadata": {"annotations": {"example.com/k": "c"}}}),
    );
    assert!(status.contains("200"), "{status}");
}

#[test]
fn a_node_list_comes_in_pages_that_all_carry_the_first_pages_version() {
    let api = ApiServer::start();
    for name in ["a", "b", "c"] {
        api.put_node(node(name));
    }
    let page = |path: &str| -> Value {
        serde_json::from_str(&get(&api, path).next().expect("list")).expect("json")
    };
    let first = page("/api/v1/nodes?limit=2");
    assert_eq!(first["items"].as_array().map(Vec::len), Some(2));
    let version = first["metadata"]["resourceVersion"].clone();
    let token = first["metadata"]["continue"]
        .as_str()
        .expect("a continue token")
        .to_string();
    // Written between the pages: the last page still carries the first page's version, so
    // that a watch from it replays this change.
    api.put_node(node("d"));
    let last = page(&format!("/api/v1/nodes?limit=2&continue={token}"));
    assert_eq!(last["metadata"]["resourceVersion"], version);
    let names: Vec<&str> = first["items"]
        .as_array()
        .into_iter()
        .chain(last["items"].as_array())
        .flatten()
        .filter_map(|n| n["metadata"]["name"].as_str())
        .collect();
    assert!(
        ["a", "b", "c"].iter().all(|n| names.contains(n)),
        "{names:?}"
    );
}
