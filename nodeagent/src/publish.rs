//! Publishing this node's GPUs to its Kubernetes Node, for the cluster scheduler: the
//! annotation `gpuslice.io/node-state` (a `NodePublication`: every GPU with what is allocated
//! on it), and for kubelet and kube-scheduler the node's extended resources
//! (`gpuslice.io/gpu-memory`, `gpuslice.io/gpu-cores` in `status.capacity`), written by JSON
//! merge patch whenever they changed (checked every interval) and every 30 intervals anyway. A failed
//! write is logged and retried at the next tick; the extender counts its own placements until
//! the next publication shows them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use gpuslice_core::cluster::{NODE_STATE_ANNOTATION, NodePublication, PublishedGpu};
use gpuslice_core::resources;
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
        claimed: {
            let mut c: Vec<String> = ledger
                .claims()
                .filter_map(|c| c.assigned_as.clone())
                .collect();
            c.sort();
            c
        },
    }
}

/// Ticks after which the Node is written again even if nothing changed, in case something
/// else (a Node re-registered by kubelet) dropped what was written.
const REWRITE_EVERY_TICKS: u32 = 30;

/// Keeps the Node's annotation and extended resources up to date until the task is dropped.
pub async fn run(shared: Arc<Shared>, client: kube::Client, node: String, every: Duration) {
    let nodes: Api<Node> = Api::all(client);
    let mut last: Option<(String, BTreeMap<String, String>)> = None;
    let mut ticks_since_write = 0;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        ticks_since_write += 1;
        let publication = publication(&shared.ledger());
        let current = match serde_json::to_string(&publication) {
            Ok(s) => (s, resources::node_capacity(&publication)),
            Err(e) => {
                tracing::error!("cannot encode the node publication: {e}");
                continue;
            }
        };
        if last.as_ref() == Some(&current) && ticks_since_write < REWRITE_EVERY_TICKS {
            continue;
        }
        match write(&nodes, &node, &current.0, &current.1).await {
            Ok(()) => {
                tracing::debug!(node = %node, "published the node's GPUs");
                last = Some(current);
                ticks_since_write = 0;
            }
            Err(e) => {
                tracing::warn!(node = %node, "publishing the node's GPUs failed (retrying): {e}")
            }
        }
    }
}

/// Writes the annotation (a merge patch of the Node) and the extended resources (a merge patch
/// of its status subresource, the only place the API server takes a capacity from).
async fn write(
    nodes: &Api<Node>,
    node: &str,
    state: &str,
    capacity: &BTreeMap<String, String>,
) -> Result<(), kube::Error> {
    let annotation =
        serde_json::json!({"metadata": {"annotations": {NODE_STATE_ANNOTATION: state}}});
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&annotation))
        .await?;
    let status = serde_json::json!({"status": {"capacity": capacity}});
    nodes
        .patch_status(node, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}
