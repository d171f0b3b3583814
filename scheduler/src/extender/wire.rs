//! The kube-scheduler extender protocol (k8s.io/kube-scheduler/extender/v1), as JSON with the
//! Go field names: those types carry no JSON tags, so kube-scheduler writes and reads `Pod`,
//! `Nodes`, `NodeNames`, `FailedNodes`, `FailedAndUnresolvableNodes`, `Error`, `Host`,
//! `Score`, `PodName`, `PodNamespace`, `PodUID`, `Node`. Go's decoder also accepts other
//! letter cases; the lower-case forms are accepted here too. Pods and Nodes stay JSON values,
//! so that every field kube-scheduler sends comes back as it was.
//!
//! Node names are borrowed from the request where its JSON allows (no escapes), in the
//! arguments and in the answers: a decision over 15,000 nodes then copies no name.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Highest score an extender gives (`MaxExtenderPriority`); kube-scheduler scales it.
pub const MAX_EXTENDER_PRIORITY: i64 = 10;

#[derive(Debug, Clone, Deserialize)]
pub struct ExtenderArgs<'a> {
    #[serde(rename = "Pod", alias = "pod")]
    pub pod: Value,
    /// With `nodeCacheCapable: false`.
    #[serde(rename = "Nodes", alias = "nodes", default)]
    pub nodes: Option<NodeList>,
    /// With `nodeCacheCapable: true`.
    #[serde(
        rename = "NodeNames",
        alias = "nodenames",
        alias = "nodeNames",
        default,
        borrow
    )]
    pub node_names: Option<Vec<Cow<'a, str>>>,
}

/// A `v1.NodeList`: `items`, and whatever else it carries, kept.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct NodeList {
    #[serde(default)]
    pub items: Vec<Value>,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ExtenderFilterResult<'a> {
    #[serde(rename = "Nodes")]
    pub nodes: Option<NodeList>,
    #[serde(rename = "NodeNames", borrow)]
    pub node_names: Option<Vec<Cow<'a, str>>>,
    #[serde(rename = "FailedNodes", borrow)]
    pub failed_nodes: BTreeMap<Cow<'a, str>, Cow<'a, str>>,
    #[serde(rename = "FailedAndUnresolvableNodes", borrow)]
    pub failed_and_unresolvable_nodes: BTreeMap<Cow<'a, str>, Cow<'a, str>>,
    #[serde(rename = "Error")]
    pub error: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HostPriority<'a> {
    #[serde(rename = "Host", borrow)]
    pub host: Cow<'a, str>,
    #[serde(rename = "Score")]
    pub score: i64,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ExtenderBindingArgs {
    #[serde(rename = "PodName", alias = "podName")]
    pub pod_name: String,
    #[serde(rename = "PodNamespace", alias = "podNamespace")]
    pub pod_namespace: String,
    #[serde(rename = "PodUID", alias = "podUID")]
    pub pod_uid: String,
    #[serde(rename = "Node", alias = "node")]
    pub node: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ExtenderBindingResult {
    #[serde(rename = "Error")]
    pub error: String,
}

/// `metadata.name` of a Pod or Node.
#[must_use]
pub fn name(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or("")
}

/// `metadata.annotations` of a Pod or Node.
#[must_use]
pub fn annotations(object: &Value) -> BTreeMap<String, String> {
    object["metadata"]["annotations"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}
