//! Publishing this node's GPUs to its Kubernetes Node, for the cluster scheduler: the
//! annotation `gpuslice.io/node-state` (a `NodePublication`: every GPU with what is allocated
//! on it), written by JSON merge patch whenever it changed, checked every interval. A failed
//! write is logged and retried at the next tick; the extender counts its own placements until
//! the next publication shows them.

use std::sync::Arc;
use std::time::Duration;

use gpuslice_core::cluster::{NODE_STATE_ANNOTATION, NodePublication, PublishedGpu};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};

use crate::dbus::Shared;
use crate::ledger::Ledger;

/// What the ledger says, as the scheduler reads it.
#[must_use]
pub fn publication(ledger: &Ledger) -> NodePublication {
    let inventory = ledger.inventory();
    NodePublication {
        version: 1,
        gpus: ledger
            .loads()
            .into_iter()
            .map(|l| PublishedGpu {
                model: inventory
                    .gpus
                    .iter()
                    .find(|g| g.uuid == l.uuid)
                    .map(|g| g.name.clone())
                    .unwrap_or_default(),
                uuid: l.uuid,
                memory_total: l.memory_total,
                memory_allocated: l.memory_allocated,
                cores_allocated: l.cores_allocated,
                sharers: l.sharers,
                exclusive: l.exclusive,
            })
            .collect(),
    }
}

/// Keeps the Node's annotation up to date until the task is dropped.
pub async fn run(shared: Arc<Shared>, client: kube::Client, node: String, every: Duration) {
    let nodes: Api<Node> = Api::all(client);
    let mut last: Option<String> = None;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let current = match serde_json::to_string(&publication(&shared.ledger())) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!("cannot encode the node publication: {e}");
                continue;
            }
        };
        if last.as_deref() == Some(current.as_str()) {
            continue;
        }
        let patch =
            serde_json::json!({"metadata": {"annotations": {NODE_STATE_ANNOTATION: current}}});
        match nodes
            .patch(&node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::debug!(node = %node, "published the node's GPUs");
                last = Some(current);
            }
            Err(e) => {
                tracing::warn!(node = %node, "publishing the node's GPUs failed (retrying): {e}")
            }
        }
    }
}
