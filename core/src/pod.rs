//! The Kubernetes pod a container belongs to, as the engine that made it names the pod in the
//! container's OCI annotations: containerd's CRI plugin writes `io.kubernetes.cri.sandbox-*`,
//! CRI-O keeps the kubelet's container labels (`io.kubernetes.pod.*`) as JSON under
//! `io.kubernetes.cri-o.Labels`. The agent posts its Kubernetes Events on that pod.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// containerd's CRI plugin: the pod's name, namespace and UID.
pub const CRI_SANDBOX_NAME: &str = "io.kubernetes.cri.sandbox-name";
pub const CRI_SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
pub const CRI_SANDBOX_UID: &str = "io.kubernetes.cri.sandbox-uid";
/// CRI-O: the container's labels as JSON, the kubelet's `io.kubernetes.pod.*` among them.
pub const CRIO_LABELS: &str = "io.kubernetes.cri-o.Labels";
/// The kubelet's labels on every container.
pub const KUBELET_POD_NAME: &str = "io.kubernetes.pod.name";
pub const KUBELET_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const KUBELET_POD_UID: &str = "io.kubernetes.pod.uid";

/// A pod, by namespace and name (and UID when the engine says it), and the container's name
/// in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub container: String,
}

/// The pod of a container with these annotations; `None` outside Kubernetes (podman, runc,
/// the CLI) or when a name or namespace is missing or empty.
pub fn pod_ref(annotations: &BTreeMap<String, String>) -> Option<PodRef> {
    let made = |namespace: Option<&str>,
                name: Option<&str>,
                uid: Option<&str>,
                container: Option<&str>| {
        let (namespace, name) = (namespace?, name?);
        (!namespace.is_empty() && !name.is_empty()).then(|| PodRef {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: uid.unwrap_or_default().to_string(),
            container: container.unwrap_or_default().to_string(),
        })
    };
    let get = |key: &str| annotations.get(key).map(String::as_str);
    made(
        get(CRI_SANDBOX_NAMESPACE),
        get(CRI_SANDBOX_NAME),
        get(CRI_SANDBOX_UID),
        get(crate::annotations::CRI_CONTAINER_NAME),
    )
    .or_else(|| {
        let labels: BTreeMap<String, String> = serde_json::from_str(get(CRIO_LABELS)?).ok()?;
        let label = |key: &str| labels.get(key).map(String::as_str);
        made(
            label(KUBELET_POD_NAMESPACE),
            label(KUBELET_POD_NAME),
            label(KUBELET_POD_UID),
            label(crate::annotations::CRIO_CONTAINER_NAME),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn containerd_names_the_pod_in_its_sandbox_annotations() {
        let a = ann(&[
            (CRI_SANDBOX_NAME, "embeddings"),
            (CRI_SANDBOX_NAMESPACE, "ml"),
            (CRI_SANDBOX_UID, "4b1c"),
            (crate::annotations::CRI_CONTAINER_NAME, "model"),
            ("gpuslice.io/memory", "2Gi"),
        ]);
        let pod = pod_ref(&a).unwrap();
        assert_eq!(
            (pod.namespace.as_str(), pod.name.as_str(), pod.uid.as_str()),
            ("ml", "embeddings", "4b1c")
        );
        assert_eq!(pod.container, "model");
    }

    #[test]
    fn cri_o_names_it_in_the_kubelets_labels() {
        let labels = r#"{"io.kubernetes.pod.name":"web","io.kubernetes.pod.namespace":"shop","io.kubernetes.container.name":"model"}"#;
        let pod = pod_ref(&ann(&[(CRIO_LABELS, labels)])).unwrap();
        assert_eq!(
            (pod.namespace.as_str(), pod.name.as_str(), pod.uid.as_str()),
            ("shop", "web", "")
        );
        assert_eq!(pod.container, "model");
    }

    #[test]
    fn a_container_outside_kubernetes_or_half_named_has_no_pod() {
        assert_eq!(pod_ref(&ann(&[("gpuslice.io/memory", "2Gi")])), None);
        assert_eq!(pod_ref(&ann(&[(CRI_SANDBOX_NAME, "x")])), None);
        assert_eq!(
            pod_ref(&ann(&[
                (CRI_SANDBOX_NAME, "x"),
                (CRI_SANDBOX_NAMESPACE, "")
            ])),
            None
        );
        assert_eq!(pod_ref(&ann(&[(CRIO_LABELS, "not json")])), None);
    }
}
