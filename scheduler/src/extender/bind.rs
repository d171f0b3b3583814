//! The bind verb: the extender commits its choice once. It reads the pod and the node from the
//! API server, places each container's slice on the node's published GPUs, records the
//! placement on the Node under the Node's `resourceVersion` (so that replicas binding at once
//! never both take the same room: see [`super::recorded`]), writes the signed assignment onto
//! the pod (`gpuslice.io/assignment`, a JSON merge patch) and then creates the pod's Binding. The node agent honours the assignment only if the signature checks and the
//! GPUs still fit; until the agent publishes again, the extender counts the placement in its
//! node cache so that the next pods do not see the room as free.

use std::collections::BTreeMap;

use gpuslice_core::annotations;
use gpuslice_core::assignment::{AssignedGpu, Assignment};
use gpuslice_core::policy::Policy;
use gpuslice_core::publication::{NODE_STATE_ANNOTATION, NodePublication, assigned_container};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tracing::Instrument;

use super::recorded::{self, Recorded};
use super::wire::{ExtenderBindingArgs, ExtenderBindingResult};
use super::{Assumed, Extender, PodSlices, RequestError};
use crate::cluster::{self, ClusterPolicy, NodeState, TaskMix};

/// Why a pod was not bound.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("the pod now has UID {now:?}, kube-scheduler asked for {asked:?}")]
    UidChanged { now: String, asked: String },
    #[error("the pod is already bound to node {0:?}")]
    AlreadyBound(String),
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error("the node publishes no GPUs (no gpuslice agent)")]
    NoAgent,
    #[error("annotation {NODE_STATE_ANNOTATION} is not readable: {0}")]
    Unreadable(serde_json::Error),
    #[error("container {0}: its slice no longer fits on the node")]
    NoLongerFits(String),
    #[error("signing the assignment: {0}")]
    Sign(String),
    #[error("{what}: {source}")]
    Api {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("encoding the pod: {0}")]
    Encode(serde_json::Error),
    #[error("the extender's placement lock is poisoned")]
    Poisoned,
    #[error("the node changed under each of {0} tries to record the placement on it")]
    Contended(usize),
}

fn api(what: &'static str) -> impl FnOnce(kube::Error) -> BindError {
    move |source| BindError::Api { what, source }
}

/// Each container's GPUs, by name, as the signed assignment carries them.
pub type AssignedContainers = BTreeMap<String, Vec<AssignedGpu>>;

/// The GPUs of `node` for each container of a pod (init containers included, each placed as
/// it will run: beside the sidecars started before it), chosen in turn by `policy` as
/// prioritize scored the node (the fit model decides what fits), and the placements to count
/// until the agent shows them (what runs once the pod has started). `node` is the node as published, with the placements not yet shown.
/// When the policy's choice for one container leaves no room for the next, the pod is placed
/// by binpack, the way filter found that it fits.
pub fn place_pod(
    node: &NodeState,
    publication: &NodePublication,
    pod_uid: &str,
    slices: &PodSlices,
    policy: ClusterPolicy,
    mix: &TaskMix,
) -> Result<(AssignedContainers, Vec<Assumed>), BindError> {
    match place_each(node.clone(), publication, pod_uid, slices, policy, mix) {
        Err(BindError::NoLongerFits(_)) if slices.all().count() > 1 => {
            place_each(node.clone(), publication, pod_uid, slices, BINPACK, mix)
        }
        other => other,
    }
}

const BINPACK: ClusterPolicy = ClusterPolicy::Axes {
    node: cluster::Axis::Binpack,
    gpu: cluster::Axis::Binpack,
};

fn place_each(
    mut node: NodeState,
    publication: &NodePublication,
    pod_uid: &str,
    slices: &PodSlices,
    policy: ClusterPolicy,
    mix: &TaskMix,
) -> Result<(AssignedContainers, Vec<Assumed>), BindError> {
    let mut placed = Vec::new();
    let mut containers = BTreeMap::new();
    // Init containers in turn: a sidecar keeps its slice beside the next ones, a plain init
    // container gives its slice back before the next starts (and is not counted after).
    let steps = slices
        .init
        .iter()
        .map(|(c, sidecar)| (c, *sidecar))
        .chain(slices.containers.iter().map(|c| (c, true)));
    for (c, stays) in steps {
        let (name, d) = (&c.name, &c.demand);
        let policy = with_gpu_policy(policy, c.resolved.request.gpu_policy);
        let (_, gpus) = cluster::best_on_node(&node, d, policy, mix)
            .ok_or_else(|| BindError::NoLongerFits(name.clone()))?;
        let assigned: Vec<AssignedGpu> = gpus
            .iter()
            .map(|&i| {
                let take = d.shape.take_on(node.gpus[i].memory_total);
                AssignedGpu {
                    uuid: publication.gpus[i].uuid.clone(),
                    memory_bytes: take.memory_bytes,
                    cores: take.cores,
                }
            })
            .collect();
        if stays {
            cluster::apply(&mut node, d, &gpus);
            placed.push(Assumed {
                container: assigned_container(pod_uid, name),
                demand: d.clone(),
                gpus: assigned.iter().map(|g| g.uuid.clone()).collect(),
                since: std::time::Instant::now(),
                from_record: false,
            });
        }
        containers.insert(name.clone(), assigned);
    }
    Ok((containers, placed))
}

/// `policy` with its GPU axis set by a container's `gpuslice.io/gpu-policy` (binpack or
/// spread), as the agent reads it; frag-aware chooses GPUs by its own measure.
fn with_gpu_policy(policy: ClusterPolicy, gpu_policy: Option<Policy>) -> ClusterPolicy {
    match (policy, gpu_policy) {
        (ClusterPolicy::Axes { node, .. }, Some(Policy::Binpack)) => ClusterPolicy::Axes {
            node,
            gpu: cluster::Axis::Binpack,
        },
        (ClusterPolicy::Axes { node, .. }, Some(Policy::Spread)) => ClusterPolicy::Axes {
            node,
            gpu: cluster::Axis::Spread,
        },
        _ => policy,
    }
}

/// What binding needs: an API client and the key shared with the node agents.
pub struct Binder {
    pub client: kube::Client,
    pub key: Vec<u8>,
}

impl Extender {
    /// The bind verb. Errors are answered in `Error`, as kube-scheduler expects.
    pub async fn bind(&self, binder: &Binder, args: &ExtenderBindingArgs) -> ExtenderBindingResult {
        // Instrumented, not entered: a guard held across `.await` would leave the span on
        // whichever worker thread the task started on.
        let span = tracing::info_span!("bind", pod = %format!("{}/{}", args.pod_namespace, args.pod_name), node = %args.node);
        match self.try_bind(binder, args).instrument(span.clone()).await {
            Ok(()) => {
                span.in_scope(|| tracing::info!("bound"));
                ExtenderBindingResult::default()
            }
            Err(e) => ExtenderBindingResult {
                error: format!(
                    "gpuslice: binding pod {}/{} to {}: {e}",
                    args.pod_namespace, args.pod_name, args.node
                ),
            },
        }
    }

    async fn try_bind(&self, binder: &Binder, args: &ExtenderBindingArgs) -> Result<(), BindError> {
        let pods: Api<Pod> = Api::namespaced(binder.client.clone(), &args.pod_namespace);
        let pod = pods
            .get(&args.pod_name)
            .await
            .map_err(api("reading the pod"))?;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if !args.pod_uid.is_empty() && uid != args.pod_uid {
            return Err(BindError::UidChanged {
                now: uid,
                asked: args.pod_uid.clone(),
            });
        }
        if let Some(bound) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            return Err(BindError::AlreadyBound(bound.to_string()));
        }
        let pod_json = serde_json::to_value(&pod).map_err(BindError::Encode)?;
        let slices = super::pod_slices(&pod_json)?;
        if !slices.is_empty() {
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
                .map_err(api("writing the assignment"))?;
                create_binding(&pods, args, &uid).await
            }
            .await;
            if bound.is_err() {
                // Not bound: the room it was given is free again.
                let nodes: Api<Node> = Api::all(binder.client.clone());
                if let Err(e) = recorded::remove_pod(&nodes, &args.node, &uid).await {
                    tracing::warn!("removing the placement of an unbound pod from its node: {e}");
                }
                let _ = self.cache.forget_pod(&uid);
                self.cache.take_in(&args.node, &publication);
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
) -> Result<(), BindError> {
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
    .map_err(api("creating the Binding"))?;
    Ok(())
}

impl Extender {
    /// Places the containers' slices on `node` and records the placement on the Node (its
    /// `resourceVersion` as the precondition: a replica or agent that wrote the Node in
    /// between makes this place again against the Node as it is now); counts them in the
    /// node cache and signs the result. Also returns the node's publication they were placed
    /// against.
    async fn assign(
        &self,
        binder: &Binder,
        node: &str,
        pod_uid: &str,
        slices: &PodSlices,
        policy: ClusterPolicy,
    ) -> Result<(String, NodePublication), BindError> {
        let nodes: Api<Node> = Api::all(binder.client.clone());
        for _ in 0..recorded::WRITE_ATTEMPTS {
            let n = nodes.get(node).await.map_err(api("reading the node"))?;
            let annotations = n.metadata.annotations.as_ref();
            let published = annotations
                .and_then(|a| a.get(NODE_STATE_ANNOTATION))
                .ok_or(BindError::NoAgent)?;
            let publication: NodePublication =
                serde_json::from_str(published).map_err(BindError::Unreadable)?;
            let mut record = recorded::pending(recorded::read(annotations), &publication.claimed);
            let (containers, placed) = {
                // Placing against what this replica counts (its own placements the Node may
                // not show yet included) is one step, so that its concurrent binds
                // (kube-scheduler binds asynchronously) see each other's placements.
                let _placing = self.placing.lock().map_err(|_| BindError::Poisoned)?;
                self.cache.learn_recorded(node, &record);
                let state = self.cache.known(node, &publication).state;
                let (_, mix) = self.mix_snapshot();
                place_pod(&state, &publication, pod_uid, slices, policy, &mix)?
            };
            let at_ms = recorded::now_ms();
            record.retain(|r| !placed.iter().any(|p| p.container == r.container));
            record.extend(placed.iter().map(|p| {
                Recorded {
                    container: p.container.clone(),
                    gpus: p
                        .container
                        .rsplit_once('/')
                        .and_then(|(_, name)| containers.get(name))
                        .cloned()
                        .unwrap_or_default(),
                    exclusive: p.demand.shape.exclusive,
                    at_ms,
                }
            }));
            let patch = recorded::patch(n.metadata.resource_version.as_deref(), &record);
            match nodes
                .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {}
                Err(e) if recorded::is_conflict(&e) => {
                    tracing::debug!("the node changed while placing; placing again");
                    continue;
                }
                Err(e) => return Err(api("recording the placement on the node")(e)),
            }
            let signed = Assignment {
                node: node.to_string(),
                pod_uid: pod_uid.to_string(),
                containers,
            }
            .sign(&binder.key)
            .map_err(|e| BindError::Sign(e.to_string()))?;
            self.cache.assume(node, placed);
            self.cache.take_in(node, &publication);
            return Ok((signed, publication));
        }
        Err(BindError::Contended(recorded::WRITE_ATTEMPTS))
    }
}
