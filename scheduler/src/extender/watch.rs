//! The node cache for `nodeCacheCapable: true`: a watch on Nodes (kube-rs's watcher: list,
//! then watch, re-listing when the watch expires) that records each node's
//! `gpuslice.io/node-state`. A new publication replaces what bind had assumed there; a node
//! that stops publishing, or is deleted, is forgotten. At start, the pods already placed are
//! counted into the learned task mix. A watch on bound pods stops counting the placements of
//! pods deleted or finished before their agent showed them, and removes them from the
//! placements recorded on their Node. Placements recorded on a Node by any replica
//! ([`super::recorded`]) are counted from the watch too.

use std::sync::Arc;

use futures_util::StreamExt;
use gpuslice_core::publication::{NODE_STATE_ANNOTATION, NodePublication};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::ListParams;
use kube::runtime::watcher::{self, Event};

use super::{Extender, recorded};

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

/// Takes in what Node `n` (named `name`) says: its agent's publication and the placements
/// recorded on it.
fn take_in(extender: &Extender, name: &str, n: &Node) {
    extender.learn_recorded(name, &recorded::read(n.metadata.annotations.as_ref()));
    extender.update_node(name, publication(n));
}

fn warn(msg: &str) {
    tracing::warn!("{msg}");
}

/// Runs until the stream ends (it does not, short of the process ending).
pub async fn run(extender: Arc<Extender>, client: kube::Client) {
    let nodes: Api<Node> = Api::all(client);
    let mut events = watcher::watcher(nodes, watcher::Config::default()).boxed();
    let mut listed = false;
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::InitDone) if !listed => {
                listed = true;
                extender.watch_listed();
            }
            Ok(Event::Apply(n) | Event::InitApply(n)) => {
                if let Some(name) = n.metadata.name.as_deref() {
                    take_in(&extender, name, &n);
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

/// Pods listed per page when learning the task mix at start.
const POD_PAGE: u32 = 500;

/// Counts the pods already placed in the cluster (bound, not finished) into the learned task
/// mix, so that a restarted extender measures fragmentation against the workload it had seen
/// rather than against nothing, and counts their assigned placements until the agents show
/// them. Pages through the pods; returns how many were counted into the mix.
pub async fn learn_running_pods(
    extender: &Extender,
    client: kube::Client,
    key: Option<&[u8]>,
) -> usize {
    let pods: Api<Pod> = Api::all(client);
    let mut params = ListParams::default().limit(POD_PAGE);
    let mut counted = 0;
    loop {
        let page = match pods.list(&params).await {
            Ok(p) => p,
            Err(e) => {
                warn(&format!(
                    "listing pods to learn the task mix: {e} (learning from new pods only)"
                ));
                return counted;
            }
        };
        for pod in &page.items {
            let placed = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            if !placed || matches!(phase, Some("Succeeded" | "Failed")) {
                continue;
            }
            if let Ok(json) = serde_json::to_value(pod) {
                let before = extender.mix_pods();
                extender.learn_placed(&json, key);
                counted += extender.mix_pods() - before;
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return counted,
        }
    }
}

/// Whether a pod has finished for good (its containers' slices are released).
fn finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Watches bound pods and, when one is deleted or finishes, stops counting the placements bind
/// made for it that its node does not show yet, and takes the node's state in again (one read
/// of the Node). Runs until the stream ends.
pub async fn run_pods(extender: Arc<Extender>, client: kube::Client) {
    let pods: Api<Pod> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client);
    let config = watcher::Config::default().fields("spec.nodeName!=");
    let mut events = watcher::watcher(pods, config).boxed();
    let mut listed = false;
    while let Some(event) = events.next().await {
        let gone = match event {
            Ok(Event::InitDone) if !listed => {
                listed = true;
                extender.watch_listed();
                continue;
            }
            Ok(Event::Delete(p)) => p,
            Ok(Event::Apply(p) | Event::InitApply(p)) if finished(&p) => p,
            Ok(_) => continue,
            Err(e) => {
                warn(&format!("watching pods: {e}"));
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        let Some(uid) = gone.metadata.uid.as_deref() else {
            continue;
        };
        // Where it still counts (placed by this replica, or recorded on the Node by any),
        // its recorded placements go too (any replica may remove them: the write is
        // conditional on the Node's version), and the node is taken in again as it is now.
        for node in extender.forget_pod(uid) {
            match recorded::remove_pod(&nodes, &node, uid).await {
                Ok(n) => {
                    take_in(&extender, &node, &n);
                }
                Err(e) => warn(&format!(
                    "removing the placements of pod {uid} from node {node}: {e}"
                )),
            }
        }
    }
}
