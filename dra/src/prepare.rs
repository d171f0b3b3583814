//! Preparing a ResourceClaim: read it from the API server, claim the device results of each
//! of its requests allocated to this node through the agent, one slice for the GPUs the
//! request consumes the same of (claim `dra-<claim uid>-<n>`, `n` the slice's first result,
//! owned by the plugin), write each slice's CDI spec, and answer with the CDI device names. Unpreparing releases them. A
//! request with `adminAccess` claims nothing: its GPUs are given as they are (a
//! `gpuslice.io/admin` CDI device the plugin writes and removes), once the claim's namespace
//! is seen still to allow it.
//! Both are idempotent: the kubelet retries, and the plugin may have been restarted between.

use std::path::PathBuf;

use gpuslice_agent_api::AgentProxy;
use gpuslice_core::Claim;
use gpuslice_core::inventory::Inventory;
use gpuslice_runtime_shim::config::Config;
use gpuslice_runtime_shim::nvidia_env::Capabilities;
use gpuslice_runtime_shim::{cdi, inject};
use kube::api::{Api, ApiResource, DynamicObject};
use serde_json::Value;

use crate::request::SliceOfRequest;

/// What a prepared device result is, for the kubelet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    pub request_names: Vec<String>,
    pub pool_name: String,
    pub device_name: String,
    pub cdi_device_ids: Vec<String>,
    pub share_id: Option<String>,
}

/// The plugin's view of the node.
pub struct Plugin {
    /// The node this plugin runs on: the pool its devices are allocated from.
    pub node: String,
    pub client: kube::Client,
    pub agent: AgentProxy<'static>,
    /// The runtime configuration (driver root, interception library, hook): what a slice's
    /// CDI spec gives a container.
    pub runtime: Config,
    pub cdi_dir: PathBuf,
    /// Where this process sees the host's root (`/`, or `/host` in a container): the CDI
    /// specs name host paths as the host sees them, since the engine reading them runs there.
    pub host_root: PathBuf,
}

/// The owner the plugin's claims carry: the agent releases them only when asked (the claim
/// lives until the kubelet unprepares it, across container restarts).
#[must_use]
pub fn owner() -> String {
    format!(
        "{}{}",
        gpuslice_core::claim::DRA_OWNER_PREFIX,
        crate::DRIVER
    )
}

/// The agent claim of the request whose first device result is the `n`th of the
/// ResourceClaim `uid`.
#[must_use]
pub fn claim_id(uid: &str, n: usize) -> String {
    format!("dra-{uid}-{n}")
}

/// The label that lets a namespace's claims have administrative access to devices.
pub const ADMIN_ACCESS_LABEL: &str = "resource.kubernetes.io/admin-access";

fn namespaces() -> ApiResource {
    ApiResource {
        group: String::new(),
        version: "v1".into(),
        api_version: "v1".into(),
        kind: "Namespace".into(),
        plural: "namespaces".into(),
    }
}

fn resource_claims() -> ApiResource {
    ApiResource {
        group: "resource.k8s.io".into(),
        version: "v1".into(),
        api_version: "resource.k8s.io/v1".into(),
        kind: "ResourceClaim".into(),
        plural: "resourceclaims".into(),
    }
}

impl Plugin {
    /// Prepares the claim `namespace/name` whose uid the kubelet says is `uid`.
    pub async fn prepare(
        &self,
        namespace: &str,
        uid: &str,
        name: &str,
    ) -> Result<Vec<Prepared>, String> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &resource_claims());
        let object = api
            .get(name)
            .await
            .map_err(|e| format!("ResourceClaim {namespace}/{name}: {e}"))?;
        let found = object.metadata.uid.clone().unwrap_or_default();
        if found != uid {
            return Err(format!(
                "ResourceClaim {namespace}/{name} has uid {found}, not {uid}: it was replaced"
            ));
        }
        let results = object.data["status"]["allocation"]["devices"]["results"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        // The results of each request, in the order of their first result: one slice holds
        // them all (a request for two GPUs is one container's two GPUs, and a container sees
        // one slice).
        let mut requests: Vec<(&str, Vec<(usize, &Value)>)> = Vec::new();
        for (n, result) in results.iter().enumerate() {
            if result["driver"].as_str() != Some(crate::DRIVER) {
                continue;
            }
            let pool = result["pool"].as_str().unwrap_or_default();
            if pool != self.node {
                return Err(format!(
                    "ResourceClaim {namespace}/{name}: result {n} is from pool {pool:?}, not this node {:?}",
                    self.node
                ));
            }
            let request = result["request"].as_str().unwrap_or_default();
            match requests.iter_mut().find(|(r, _)| *r == request) {
                Some((_, of_request)) => of_request.push((n, result)),
                None => requests.push((request, vec![(n, result)])),
            }
        }
        let names: Vec<&str> = requests.iter().map(|(r, _)| *r).collect();
        let config = &object.data["status"]["allocation"]["devices"]["config"];
        if let Some(why) = configured(config, &names) {
            return Err(format!("ResourceClaim {namespace}/{name}: {why}"));
        }
        let admin: Vec<&str> = requests
            .iter()
            .filter(|(_, of_request)| {
                of_request
                    .iter()
                    .any(|(_, r)| r["adminAccess"].as_bool() == Some(true))
            })
            .map(|(r, _)| *r)
            .collect();
        if let Some(request) = admin.first()
            && let Err(why) = self.admin_access_allowed(namespace).await
        {
            // Fail closed, as for any request that cannot be prepared: nothing of the claim is
            // held, and a spec an earlier prepare wrote gives no later container the GPUs.
            let _ = self.unprepare(uid).await;
            return Err(format!(
                "ResourceClaim {namespace}/{name}: request {request:?}: {why}"
            ));
        }
        let mut prepared = Vec::new();
        for (request, of_request) in &requests {
            let result = if admin.contains(request) {
                let id = claim_id(uid, of_request[0].0);
                self.prepare_admin(&id, request, of_request).await
            } else {
                self.prepare_request(uid, request, of_request).await
            };
            match result {
                Ok(p) => prepared.extend(p),
                Err(e) => {
                    // Fail closed: nothing of a claim that cannot be prepared whole is held.
                    let _ = self.unprepare(uid).await;
                    return Err(format!(
                        "ResourceClaim {namespace}/{name}: request {request:?}: {e}"
                    ));
                }
            }
        }
        Ok(prepared)
    }

    /// Claims the device results of one request of the claim `uid` through the agent, as a
    /// slice for each set of GPUs it consumes the same of (one for a request for `count: 2`),
    /// and writes their CDI specs. The first result of each slice names its CDI device, the
    /// others none: a container given the request gets each slice once.
    async fn prepare_request(
        &self,
        uid: &str,
        request: &str,
        results: &[(usize, &Value)],
    ) -> Result<Vec<Prepared>, String> {
        let slices = SliceOfRequest::of(results).map_err(|e| e.to_string())?;
        for slice in &slices {
            self.prepare_slice(&claim_id(uid, slice.first), slice)
                .await?;
        }
        Ok(prepared_results(
            &self.node,
            request,
            results,
            cdi::SLICE_KIND,
            |n| {
                slices
                    .iter()
                    .find(|s| s.first == n)
                    .map(|s| claim_id(uid, s.first))
            },
        ))
    }

    /// Claims `gpus` as the slice `id` through the agent and writes its CDI spec.
    async fn prepare_slice(&self, id: &str, gpus: &SliceOfRequest) -> Result<(), String> {
        let devices = gpus
            .indexes
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let memory = gpus.consumed.memory.map(|b| b.to_string());
        let cores = gpus.consumed.cores.map(|c| c.to_string());
        let mut annotations = vec![("gpuslice.io/devices", devices.as_str())];
        if let Some(m) = &memory {
            annotations.push(("gpuslice.io/memory", m));
        }
        if let Some(c) = &cores {
            annotations.push(("gpuslice.io/cores", c));
        }
        let text = self
            .agent
            .claim_as(&owner(), id, annotations.into_iter().collect())
            .await
            .map_err(|e| match e {
                zbus::Error::MethodError(_, Some(msg), _) => msg,
                other => other.to_string(),
            })?;
        let claim: Claim = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let edits = inject::edits_for(&claim, Capabilities::DEFAULT, &self.runtime)
            .map_err(|e| format!("{e:#}"))?;
        let mut spec = cdi::slice(id, &edits, &self.runtime.driver_root);
        cdi::rebase(&mut spec, &self.host_root);
        cdi::write(&self.cdi_dir, &cdi::file_name(cdi::SLICE_KIND, id), &spec)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Whether `namespace` still allows administrative access: Kubernetes checks its label
    /// when a claim asking for it is created, not after, so a claim made while the label was
    /// there keeps `adminAccess` once it is gone. Checked again here, at every prepare; a
    /// namespace that cannot be read allows nothing.
    async fn admin_access_allowed(&self, namespace: &str) -> Result<(), String> {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &namespaces());
        let object = api
            .get(namespace)
            .await
            .map_err(|e| format!("admin access refused: namespace {namespace}: {e}"))?;
        let labels = object.metadata.labels.unwrap_or_default();
        match labels.get(ADMIN_ACCESS_LABEL).map(String::as_str) {
            Some("true") => Ok(()),
            other => Err(format!(
                "admin access refused: namespace {namespace} is not labelled {ADMIN_ACCESS_LABEL}=true (it is {}), as Kubernetes requires of a namespace whose claims have admin access",
                other.map_or("unset".to_string(), |v| format!("{v:?}"))
            )),
        }
    }

    /// Gives the GPUs of a request with `adminAccess` (Kubernetes allocates them beside the
    /// claims already on them, to an administrator's namespace) as they are: a CDI device of
    /// their device nodes and the driver's files, claiming nothing from the agent, so the
    /// slices there keep their GPUs and nothing holds this container to a wall.
    async fn prepare_admin(
        &self,
        id: &str,
        request: &str,
        results: &[(usize, &Value)],
    ) -> Result<Vec<Prepared>, String> {
        let text = self.agent.inventory().await.map_err(|e| e.to_string())?;
        let inventory: Inventory = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let mut gpus: Vec<(String, u32)> = Vec::new();
        for &(n, result) in results {
            let index = crate::request::device_index(n, result).map_err(|e| e.to_string())?;
            let gpu = inventory
                .gpus
                .iter()
                .find(|g| g.index == index)
                .ok_or_else(|| format!("result {n}: this node has no gpu-{index}"))?;
            if !gpus.iter().any(|(uuid, _)| *uuid == gpu.uuid) {
                gpus.push((gpu.uuid.clone(), gpu.minor));
            }
        }
        let driver = self
            .runtime
            .driver_files(Capabilities::all())
            .map_err(|e| e.to_string())?;
        let mut spec = cdi::admin(id, &driver, &gpus).map_err(|e| e.to_string())?;
        cdi::rebase(&mut spec, &self.host_root);
        cdi::write(&self.cdi_dir, &cdi::file_name(cdi::ADMIN_KIND, id), &spec)
            .map_err(|e| e.to_string())?;
        let first = results.first().map(|(n, _)| *n);
        Ok(prepared_results(
            &self.node,
            request,
            results,
            cdi::ADMIN_KIND,
            |n| (Some(n) == first).then(|| id.to_string()),
        ))
    }

    /// Removes the administrative-access spec of `id`, if there is one (the agent, which
    /// removes a slice's spec with its claim, knows nothing of these).
    fn remove_admin_spec(&self, id: &str) {
        let _ = cdi::remove(&self.cdi_dir, &cdi::file_name(cdi::ADMIN_KIND, id));
    }

    /// The ids of the administrative-access specs in the CDI directory.
    fn admin_specs(&self) -> Vec<String> {
        let prefix = cdi::file_name(cdi::ADMIN_KIND, "");
        let prefix = prefix.trim_end_matches(".json");
        std::fs::read_dir(&self.cdi_dir)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|f| Some(f.strip_prefix(prefix)?.strip_suffix(".json")?.to_string()))
            .collect()
    }

    /// Releases the slices of claims the API server no longer has (deleted while the kubelet
    /// could not unprepare them, or while this plugin was down); returns their ids.
    pub async fn collect(&self) -> Result<Vec<String>, String> {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource_claims());
        let live: std::collections::HashSet<String> = api
            .list(&kube::api::ListParams::default())
            .await
            .map_err(|e| format!("listing ResourceClaims: {e}"))?
            .items
            .into_iter()
            .filter_map(|c| c.metadata.uid)
            .collect();
        let text = self.agent.list_slices().await.map_err(|e| e.to_string())?;
        let slices: Vec<Value> = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let gone = |id: &str| claim_uid(id).is_some_and(|u| !live.contains(u));
        let mut released = Vec::new();
        for s in slices {
            if s["owner"].as_str() != Some(owner().as_str()) {
                continue;
            }
            let id = s["container_id"].as_str().unwrap_or_default();
            if gone(id) {
                self.agent
                    .release_as(&owner(), id)
                    .await
                    .map_err(|e| format!("releasing {id}: {e}"))?;
                released.push(id.to_string());
            }
        }
        for id in self.admin_specs() {
            if gone(&id) {
                self.remove_admin_spec(&id);
                released.push(id);
            }
        }
        Ok(released)
    }

    /// Releases every slice prepared for the claim `uid` (the agent removes their CDI specs).
    pub async fn unprepare(&self, uid: &str) -> Result<(), String> {
        let text = self.agent.list_slices().await.map_err(|e| e.to_string())?;
        let slices: Vec<Value> = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let prefix = format!("dra-{uid}-");
        for s in slices {
            let id = s["container_id"].as_str().unwrap_or_default();
            if id.starts_with(&prefix) {
                self.agent
                    .release_as(&owner(), id)
                    .await
                    .map_err(|e| format!("releasing {id}: {e}"))?;
            }
        }
        for id in self.admin_specs() {
            if id.starts_with(&prefix) {
                self.remove_admin_spec(&id);
            }
        }
        Ok(())
    }
}

/// Why the allocation's `config` cannot be honoured, if it cannot: opaque parameters for this
/// driver, from the claim or its DeviceClass, for any of `requests` (an entry naming no
/// request is for all; none prepared here, nothing to refuse). A slice is asked for by its capacity requests (`memory`, `cores`)
/// and there is nothing else to set, so parameters meant for it are refused rather than left
/// unread.
fn configured(config: &Value, requests: &[&str]) -> Option<String> {
    if requests.is_empty() {
        return None;
    }
    config
        .as_array()?
        .iter()
        .enumerate()
        .find_map(|(i, entry)| {
            let opaque = &entry["opaque"];
            if opaque["driver"].as_str() != Some(crate::DRIVER) {
                return None;
            }
            let named: Vec<&str> = entry["requests"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let applies = named.is_empty()
                || named.iter().any(|n| {
                    requests
                        .iter()
                        .any(|r| r == n || r.split_once('/').is_some_and(|(main, _)| main == *n))
                });
            applies.then(|| {
                let source = entry["source"].as_str().unwrap_or("the claim");
                format!(
                    "config {i} (source {source}) gives driver {} the opaque parameters {}, and it takes none: a slice is asked for by the capacity requests memory and cores",
                    crate::DRIVER,
                    opaque["parameters"]
                )
            })
        })
}

/// The uid of the ResourceClaim whose request the agent claim (or admin spec) `id` holds.
fn claim_uid(id: &str) -> Option<&str> {
    id.strip_prefix("dra-")
        .and_then(|rest| rest.rsplit_once('-'))
        .map(|(uid, _)| uid)
}

/// What the kubelet is told of a request's `results`: a result names the CDI device of
/// `kind` that `device_of` gives for its position among the claim's results (the first result
/// of each device), the others none, so a container given the request gets each device once.
fn prepared_results(
    node: &str,
    request: &str,
    results: &[(usize, &Value)],
    kind: &str,
    device_of: impl Fn(usize) -> Option<String>,
) -> Vec<Prepared> {
    results
        .iter()
        .map(|(n, result)| Prepared {
            request_names: if request.is_empty() {
                Vec::new()
            } else {
                vec![request.to_string()]
            },
            pool_name: node.to_string(),
            device_name: result["device"].as_str().unwrap_or_default().to_string(),
            cdi_device_ids: device_of(*n)
                .map(|id| vec![format!("{kind}={id}")])
                .unwrap_or_default(),
            share_id: result["shareID"].as_str().map(str::to_string),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn opaque(driver: &str, requests: &[&str]) -> Value {
        json!({"source": "FromClaim", "requests": requests,
               "opaque": {"driver": driver, "parameters": {"sharing": "mps"}}})
    }

    #[test]
    fn opaque_parameters_for_this_driver_are_refused_naming_them() {
        let config = json!([opaque("other.example.com", &[]), opaque("gpuslice.io", &[])]);
        let why = configured(&config, &["gpu"]).unwrap();
        assert!(why.starts_with("config 1 (source FromClaim)"), "{why}");
        assert!(why.contains(r#"{"sharing":"mps"}"#), "{why}");
    }

    #[test]
    fn opaque_parameters_count_only_for_the_requests_they_name() {
        let config = json!([opaque("gpuslice.io", &["other"])]);
        assert_eq!(configured(&config, &["gpu"]), None);
        // A subrequest of a prioritized list is named by its main request.
        let config = json!([opaque("gpuslice.io", &["gpu"])]);
        assert!(configured(&config, &["gpu/small"]).is_some());
        assert_eq!(
            configured(&json!([opaque("other.example.com", &["gpu"])]), &["gpu"]),
            None
        );
        assert_eq!(configured(&Value::Null, &["gpu"]), None);
        assert_eq!(configured(&json!([opaque("gpuslice.io", &[])]), &[]), None);
    }
}
