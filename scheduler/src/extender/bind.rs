//! The bind verb: the extender commits its choice once. It reads the pod and the node from the
//! API server, places each container's slice on the node's published GPUs, writes the signed
//! assignment onto the pod (`gpuslice.io/assignment`, a JSON merge patch) and then creates the
//! pod's Binding. The node agent honours the assignment only if the signature checks and the
//! GPUs still fit; until the agent publishes again, the extender counts the placement in its
//! node cache so that the next pods do not see the room as free.

use std::collections::BTreeMap;

use gpuslice_core::annotations;
use gpuslice_core::assignment::{AssignedGpu, Assignment};
use gpuslice_core::cluster::{self, ClusterPolicy, NODE_STATE_ANNOTATION, NodePublication};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::Extender;
use super::wire::{ExtenderBindingArgs, ExtenderBindingResult};

/// What binding needs: an API client and the key shared with the node agents.
pub struct Binder {
    pub client: kube::Client,
    pub key: Vec<u8>,
}

impl Extender {
    /// The bind verb. Errors are answered in `Error`, as kube-scheduler expects.
    pub async fn bind(&self, binder: &Binder, args: &ExtenderBindingArgs) -> ExtenderBindingResult {
        match self.try_bind(binder, args).await {
            Ok(()) => ExtenderBindingResult::default(),
            Err(e) => ExtenderBindingResult {
                error: format!(
                    "gpuslice: binding pod {}/{} to {}: {e}",
                    args.pod_namespace, args.pod_name, args.node
                ),
            },
        }
    }

    async fn try_bind(&self, binder: &Binder, args: &ExtenderBindingArgs) -> Result<(), String> {
        let pods: Api<Pod> = Api::namespaced(binder.client.clone(), &args.pod_namespace);
        let pod = pods
            .get(&args.pod_name)
            .await
            .map_err(|e| format!("reading the pod: {e}"))?;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if !args.pod_uid.is_empty() && uid != args.pod_uid {
            return Err(format!(
                "the pod now has UID {uid:?}, kube-scheduler asked for {:?}",
                args.pod_uid
            ));
        }
        if let Some(bound) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            return Err(format!("the pod is already bound to node {bound:?}"));
        }
        let pod_json = serde_json::to_value(&pod).map_err(|e| e.to_string())?;
        let slices = super::pod_slices(&pod_json)?;
        if !slices.containers.is_empty() {
            let policy = slices.policy.unwrap_or(self.default_policy);
            let (signed, publication) = self
                .assign(binder, &args.node, &uid, &slices, policy)
                .await?;
            let mut written = slices.annotations_to_write();
            written.insert(
                format!("{}{}", annotations::PREFIX, annotations::ASSIGNMENT),
                signed,
            );
            let bound = async {
                let patch = json!({"metadata": {"annotations": written}});
                pods.patch(
                    &args.pod_name,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .map_err(|e| format!("writing the assignment: {e}"))?;
                create_binding(&pods, args, &uid).await
            }
            .await;
            if bound.is_err() {
                // Not bound: the room it was given is free again.
                self.unassume(&args.node, &uid, &publication);
            }
            return bound;
        }
        create_binding(&pods, args, &uid).await
    }
}

/// Creates the pod's Binding to `args.node`.
async fn create_binding(
    pods: &Api<Pod>,
    args: &ExtenderBindingArgs,
    uid: &str,
) -> Result<(), String> {
    let binding = json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": args.pod_name, "namespace": args.pod_namespace, "uid": uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": args.node}
    });
    pods.create_subresource::<Value, Value>(
        "binding",
        &args.pod_name,
        &PostParams::default(),
        &binding,
    )
    .await
    .map_err(|e| format!("creating the Binding: {e}"))?;
    Ok(())
}

impl Extender {
    /// Places the containers' slices on `node`, counts them there, and signs the result;
    /// also returns the node's publication they were placed against.
    async fn assign(
        &self,
        binder: &Binder,
        node: &str,
        pod_uid: &str,
        slices: &super::PodSlices,
        policy: ClusterPolicy,
    ) -> Result<(String, NodePublication), String> {
        let nodes: Api<Node> = Api::all(binder.client.clone());
        let n = nodes
            .get(node)
            .await
            .map_err(|e| format!("reading the node: {e}"))?;
        let published = n
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(NODE_STATE_ANNOTATION))
            .ok_or("the node publishes no GPUs (no gpuslice agent)")?;
        let publication: NodePublication = serde_json::from_str(published)
            .map_err(|e| format!("annotation {NODE_STATE_ANNOTATION} is not readable: {e}"))?;
        // Placing and counting the placement happen as one step, so that concurrent binds
        // (kube-scheduler binds asynchronously) see each other's placements.
        let _placing = self
            .placing
            .lock()
            .map_err(|_| "the extender's placement lock is poisoned".to_string())?;
        // What this extender already placed there counts too (the agent may not show it yet).
        let mut state = self.known(node, &publication).state;
        let mut placed = Vec::new();
        // The GPUs on the node are chosen as prioritize scored the node: by the pod's policy.
        let mix = self.mix_snapshot();
        let mut containers = BTreeMap::new();
        for c in &slices.containers {
            let (name, d) = (&c.name, &c.demand);
            let (_, gpus) = cluster::best_on_node(&state, d, policy, &mix)
                .ok_or_else(|| format!("container {name}: its slice no longer fits on the node"))?;
            let assigned: Vec<AssignedGpu> = gpus
                .iter()
                .map(|&i| {
                    let g = &state.gpus[i];
                    let (memory_bytes, cores) = if d.exclusive {
                        (g.memory_total, 100)
                    } else {
                        (d.memory.bytes_of(g.memory_total), d.cores)
                    };
                    AssignedGpu {
                        uuid: publication.gpus[i].uuid.clone(),
                        memory_bytes,
                        cores,
                    }
                })
                .collect();
            cluster::apply(&mut state, d, &gpus);
            placed.push(super::Assumed {
                container: cluster::assigned_container(pod_uid, name),
                demand: d.clone(),
                gpus: assigned.iter().map(|g| g.uuid.clone()).collect(),
                since: std::time::Instant::now(),
            });
            containers.insert(name.clone(), assigned);
        }
        let signed = Assignment {
            node: node.to_string(),
            pod_uid: pod_uid.to_string(),
            containers,
        }
        .sign(&binder.key)
        .map_err(|e| e.to_string())?;
        self.assume(node, placed, &publication);
        Ok((signed, publication))
    }
}
