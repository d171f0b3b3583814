//! With `nodeCacheCapable: true`, the extender answers from a Node watch (list, then watch)
//! against the API-server stand-in: a node's publication, its change and its deletion are
//! seen.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gpuslice_core::cluster::{NODE_STATE_ANNOTATION, NodePublication, PublishedGpu};
use gpuslice_testsupport::apiserver::ApiServer;
use gpuslice_testsupport::http::{free_port, get, post_json};
use gpuslice_testsupport::wait_for;
use serde_json::{Value, json};

const GIB: u64 = 1 << 30;

struct Extender(Child, String);

impl Drop for Extender {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn node(name: &str, allocated_gib: u64) -> Value {
    let p = NodePublication {
        version: 1,
        gpus: vec![PublishedGpu {
            uuid: format!("GPU-{name}"),
            model: "NVIDIA A10".into(),
            memory_total: 24 * GIB,
            memory_allocated: allocated_gib * GIB,
            cores_allocated: 0,
            sharers: u32::from(allocated_gib > 0),
            exclusive: false,
        }],
    };
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name,
           "annotations": {NODE_STATE_ANNOTATION: serde_json::to_string(&p).unwrap()}}})
}

fn filter(e: &Extender, names: &[&str]) -> Value {
    let args = json!({
        "Pod": {"metadata": {"name": "p", "namespace": "default", "uid": "u",
                             "annotations": {"gpuslice.io/memory": "8Gi"}},
                "spec": {"containers": [{"name": "app"}]}},
        "NodeNames": names
    });
    let (_, _, body) = post_json(&e.1, "/filter", &args.to_string()).unwrap();
    serde_json::from_str(&body).unwrap()
}

#[test]
fn the_node_cache_follows_publications_changes_and_deletions() {
    let api = ApiServer::start();
    api.put_node(node("a", 0));
    let addr = format!("127.0.0.1:{}", free_port());
    let child = Command::new(env!("CARGO_BIN_EXE_gpuslice-scheduler"))
        .args(["serve", "--listen", &addr, "--api-server", &api.url])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let e = Extender(child, addr);
    assert!(wait_for(Duration::from_secs(10), || get(&e.1, "/healthz").is_ok()));

    let passes = |names: &[&str], want: Value| {
        wait_for(Duration::from_secs(10), || {
            filter(&e, names)["NodeNames"] == want
        })
    };
    assert!(
        passes(&["a", "b"], json!(["a"])),
        "listed node a: {}",
        filter(&e, &["a", "b"])
    );
    api.put_node(node("b", 0));
    assert!(
        passes(&["a", "b"], json!(["a", "b"])),
        "added node b: {}",
        filter(&e, &["a", "b"])
    );
    api.put_node(node("a", 20));
    assert!(
        passes(&["a", "b"], json!(["b"])),
        "node a filled: {}",
        filter(&e, &["a", "b"])
    );
    let r = filter(&e, &["a"]);
    assert!(
        r["FailedNodes"]["a"]
            .as_str()
            .unwrap()
            .contains("not enough free"),
        "{r}"
    );
    api.delete_node("b");
    assert!(
        passes(&["a", "b"], json!([])),
        "node b deleted: {}",
        filter(&e, &["a", "b"])
    );
}
