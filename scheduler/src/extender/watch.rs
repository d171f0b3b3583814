//! The node cache for `nodeCacheCapable: true`: a watch on Nodes (kube-rs's watcher: list,
//! then watch, re-listing when the watch expires) that records each node's
//! `gpuslice.io/node-state`. A new publication replaces what bind had assumed there; a node
//! that stops publishing, or is deleted, is forgotten.

use std::sync::Arc;

use futures_util::StreamExt;
use gpuslice_core::cluster::{NODE_STATE_ANNOTATION, NodePublication};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::watcher::{self, Event};

use super::Extender;

fn publication(node: &Node) -> Option<NodePublication> {
    let text = node
        .metadata
        .annotations
        .as_ref()?
        .get(NODE_STATE_ANNOTATION)?;
    match serde_json::from_str(text) {
        Ok(p) => Some(p),
        Err(e) => {
            warn(&format!(
                "node {}: annotation {NODE_STATE_ANNOTATION} is not readable: {e}",
                node.metadata.name.as_deref().unwrap_or("?")
            ));
            None
        }
    }
}

fn warn(msg: &str) {
    eprintln!("gpuslice-scheduler: {msg}");
}

/// Runs until the stream ends (it does not, short of the process ending).
pub async fn run(extender: Arc<Extender>, client: kube::Client) {
    let nodes: Api<Node> = Api::all(client);
    let mut events = watcher::watcher(nodes, watcher::Config::default()).boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Apply(n) | Event::InitApply(n)) => {
                if let Some(name) = n.metadata.name.as_deref() {
                    extender.update_node(name, publication(&n));
                }
            }
            Ok(Event::Delete(n)) => {
                if let Some(name) = n.metadata.name.as_deref() {
                    extender.update_node(name, None);
                }
            }
            Ok(Event::Init | Event::InitDone) => {}
            // The watcher retries by itself; say why it had to.
            Err(e) => {
                warn(&format!("watching nodes: {e}"));
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
    }
}
