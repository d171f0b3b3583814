//! Placements recorded on the Node: what bind placed on a node that the node's agent does not
//! show yet, written on the Node itself (`gpuslice.io/placements`) with the Node's
//! `resourceVersion` as a precondition. Every extender replica reads them (from its Node watch,
//! the Node objects kube-scheduler sends, and the Node bind reads), so two replicas binding at
//! once see each other's placements: the second write fails with 409 Conflict, and that bind
//! places again against the Node as the first left it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpuslice_core::assignment::AssignedGpu;
use gpuslice_core::fit::Shape;
use gpuslice_core::quantity::MemoryQuantity;
use gpuslice_core::selection::ModelSelector;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::cache::ASSUME_FOR;
use crate::cluster::Demand;

/// The Node annotation the placements are recorded in.
pub const PLACEMENTS_ANNOTATION: &str = "gpuslice.io/placements";

/// Tries of a write whose precondition failed (another replica, or the node's agent, wrote the
/// Node in between) before bind gives up; each try reads the Node again.
pub const WRITE_ATTEMPTS: usize = 8;

/// One container's placement, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recorded {
    /// `<pod UID>/<container>`, as the agent lists it in `claimed` once the claim is made.
    pub container: String,
    /// Its GPUs and what it takes on each.
    pub gpus: Vec<AssignedGpu>,
    /// Whole GPUs.
    #[serde(default)]
    pub exclusive: bool,
    /// When bind placed it (Unix milliseconds).
    pub at_ms: u64,
}

impl Recorded {
    /// The demand that takes what this placement takes.
    #[must_use]
    pub fn demand(&self) -> Demand {
        let first = self.gpus.first();
        let shape = if self.exclusive {
            Shape::whole()
        } else {
            Shape {
                exclusive: false,
                memory: MemoryQuantity::Bytes(first.map_or(0, |g| g.memory_bytes)),
                cores: first.map_or(0, |g| g.cores),
            }
        };
        Demand {
            cpu: 0,
            mem: 0,
            gpus: u32::try_from(self.gpus.len()).unwrap_or(u32::MAX),
            shape,
            devices: Vec::new(),
            avoid: Vec::new(),
            gpu_models: ModelSelector::default(),
            models: None,
        }
    }

    /// How long ago it was placed.
    #[must_use]
    pub fn age(&self) -> Duration {
        Duration::from_millis(now_ms().saturating_sub(self.at_ms))
    }

    /// Whether it still counts by its date: placed less than [`ASSUME_FOR`] ago, and not
    /// later than now by more than the clocks of two replicas may differ. A record dated
    /// further ahead was not written by bind (whoever else can write the Node could otherwise
    /// hold its room for ever); it counts as none.
    #[must_use]
    pub fn counts(&self) -> bool {
        self.at_ms <= now_ms().saturating_add(CLOCK_SKEW_MS) && self.age() < ASSUME_FOR
    }
}

/// How far ahead of this replica's clock another replica's may be, in milliseconds.
pub const CLOCK_SKEW_MS: u64 = 60_000;

/// Now, in Unix milliseconds.
#[must_use]
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The placements recorded on a Node with these annotations; an unreadable record counts as
/// none (it is rewritten whole at the next bind there).
#[must_use]
pub fn read(annotations: Option<&std::collections::BTreeMap<String, String>>) -> Vec<Recorded> {
    annotations
        .and_then(|a| a.get(PLACEMENTS_ANNOTATION))
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default()
}

/// The placements still to count: not yet shown by the agent (`claimed`), dated within
/// [`ASSUME_FOR`] ([`Recorded::counts`]).
#[must_use]
pub fn pending(recorded: Vec<Recorded>, claimed: &[String]) -> Vec<Recorded> {
    recorded
        .into_iter()
        .filter(|r| r.counts() && !claimed.contains(&r.container))
        .collect()
}

/// The merge patch that sets the Node's record to `list`, if the Node is still at `version`.
#[must_use]
pub fn patch(version: Option<&str>, list: &[Recorded]) -> serde_json::Value {
    let value = if list.is_empty() {
        serde_json::Value::Null
    } else {
        json!(serde_json::to_string(list).unwrap_or_default())
    };
    let mut metadata = json!({"annotations": {PLACEMENTS_ANNOTATION: value}});
    if let Some(v) = version {
        metadata["resourceVersion"] = json!(v);
    }
    json!({ "metadata": metadata })
}

/// Whether `e` is the API server's refusal of a write whose precondition failed.
#[must_use]
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_conflict())
}

/// Removes the placements of pod `pod_uid` from node `node`'s record (the pod is gone, or was
/// not bound), retrying when the Node changed in between, and returns the Node as it is then.
/// Nothing is written when the record holds none of them.
pub async fn remove_pod(nodes: &Api<Node>, node: &str, pod_uid: &str) -> Result<Node, kube::Error> {
    let prefix = gpuslice_core::publication::assigned_container(pod_uid, "");
    let mut n = nodes.get(node).await?;
    for _ in 0..WRITE_ATTEMPTS {
        let recorded = read(n.metadata.annotations.as_ref());
        let kept: Vec<Recorded> = recorded
            .iter()
            .filter(|r| !r.container.starts_with(&prefix))
            .cloned()
            .collect();
        if kept.len() == recorded.len() {
            break;
        }
        let p = patch(n.metadata.resource_version.as_deref(), &kept);
        match nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&p))
            .await
        {
            Ok(patched) => return Ok(patched),
            Err(e) if is_conflict(&e) => n = nodes.get(node).await?,
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placed(container: &str, age_ms: u64) -> Recorded {
        Recorded {
            container: container.into(),
            gpus: vec![AssignedGpu {
                uuid: "GPU-1".into(),
                memory_bytes: 4 << 30,
                cores: 30,
            }],
            exclusive: false,
            at_ms: now_ms() - age_ms,
        }
    }

    #[test]
    fn a_record_counts_until_the_agent_shows_it_or_it_grows_too_old() {
        let list = vec![
            placed("u1/app", 1_000),
            placed("u2/app", 1_000),
            placed(
                "u3/app",
                u64::try_from(ASSUME_FOR.as_millis()).unwrap() + 1_000,
            ),
        ];
        let left = pending(list, &["u2/app".to_string()]);
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].container, "u1/app");
        let d = left[0].demand();
        assert_eq!((d.gpus, d.shape.cores), (1, 30));
        assert_eq!(d.shape.memory, MemoryQuantity::Bytes(4 << 30));
    }

    #[test]
    fn a_record_dated_ahead_of_the_clock_counts_only_within_the_replicas_skew() {
        let ahead = |ms: u64| Recorded {
            at_ms: now_ms() + ms,
            ..placed("u1/app", 0)
        };
        assert!(ahead(1_000).counts(), "a replica's clock a second ahead");
        assert!(!ahead(CLOCK_SKEW_MS + 60_000).counts());
        assert!(
            !Recorded {
                at_ms: u64::MAX,
                ..placed("u1/app", 0)
            }
            .counts(),
            "forged to count for ever"
        );
        assert!(pending(vec![ahead(10 * CLOCK_SKEW_MS)], &[]).is_empty());
        // What is not a record at all is none.
        for text in ["not json", "{\"container\":1}", "[{\"container\":\"x\"}]"] {
            let a = std::collections::BTreeMap::from([(
                PLACEMENTS_ANNOTATION.to_string(),
                text.to_string(),
            )]);
            assert!(read(Some(&a)).is_empty(), "{text}");
        }
    }

    #[test]
    fn the_patch_names_the_version_it_applies_to_and_an_empty_record_is_removed() {
        let p = patch(Some("42"), &[]);
        assert_eq!(p["metadata"]["resourceVersion"], "42");
        assert!(p["metadata"]["annotations"][PLACEMENTS_ANNOTATION].is_null());
        let p = patch(Some("43"), &[placed("u1/app", 0)]);
        let text = p["metadata"]["annotations"][PLACEMENTS_ANNOTATION]
            .as_str()
            .unwrap();
        let back: Vec<Recorded> = serde_json::from_str(text).unwrap();
        assert_eq!(back[0].container, "u1/app");
    }
}
