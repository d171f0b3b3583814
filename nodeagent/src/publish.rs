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

use gpuslice_core::publication::{NODE_STATE_ANNOTATION, NodePublication, PublishedGpu};
use gpuslice_core::resources;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};

use crate::dbus::Shared;
use crate::ledger::Ledger;

/// What the ledger says, as the scheduler reads it.
#[must_use]
pub fn publication(ledger: &Ledger) -> NodePublication {
    NodePublication {
        version: 1,
        max_sharers: ledger.rules().max_sharers,
        gpus: ledger
            .loads()
            .into_iter()
            .map(|l| PublishedGpu {
                index: Some(l.index),
                model: l.model,
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
        topology: ledger.inventory().topology.clone(),
    }
}

/// Ticks after which the Node is written again even if nothing changed, in case something
/// else (a Node re-registered by kubelet) dropped what was written.
const REWRITE_EVERY_TICKS: u32 = 30;

/// Keeps the Node's annotation and extended resources up to date until the task is dropped.
/// Each is written when it changed (the capacity only when the GPUs change, not with every
/// claim) and both every [`REWRITE_EVERY_TICKS`] anyway.
pub async fn run(shared: Arc<Shared>, client: kube::Client, node: String, every: Duration) {
    let nodes: Api<Node> = Api::all(client);
    let mut last_state: Option<String> = None;
    let mut last_capacity: Option<BTreeMap<String, String>> = None;
    let mut ticks_since_rewrite = 0;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        ticks_since_rewrite += 1;
        let rewrite = ticks_since_rewrite >= REWRITE_EVERY_TICKS;
        let publication = publication(&shared.ledger());
        let state = match serde_json::to_string(&publication) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!("cannot encode the node publication: {e}");
                continue;
            }
        };
        let capacity = resources::node_capacity(&publication);
        let mut failed = false;
        if rewrite || last_state.as_ref() != Some(&state) {
            let patch =
                serde_json::json!({"metadata": {"annotations": {NODE_STATE_ANNOTATION: state}}});
            match nodes
                .patch(&node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => last_state = Some(state),
                Err(e) => {
                    failed = true;
                    tracing::warn!(node = %node, "publishing the node's GPUs failed (retrying): {e}");
                }
            }
        }
        // The status subresource is the only place the API server takes a capacity from.
        if rewrite || last_capacity.as_ref() != Some(&capacity) {
            let patch = serde_json::json!({"status": {"capacity": capacity}});
            match nodes
                .patch_status(&node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => last_capacity = Some(capacity),
                Err(e) => {
                    failed = true;
                    tracing::warn!(node = %node, "advertising the node's extended resources failed (retrying): {e}");
                }
            }
        }
        if rewrite && !failed {
            ticks_since_rewrite = 0;
        }
    }
}
