//! A stand-in for the Kubernetes API server, for the calls gpuslice makes: read a pod or a
//! node, get a ResourceClaim, create, get and replace a ResourceSlice, merge-patch a pod, a
//! node or a node's status subresource, list pods (paged), list and watch nodes, create a
//! pod's Binding, create and merge-patch an Event (events.k8s.io/v1, with the API server's
//! checks of its required fields). It answers as the API server does: objects
//! as JSON, `metadata.resourceVersion` bumped on each write, a watch started from a list's
//! `resourceVersion` replaying every change made after it (so that nothing written between
//! the list and the watch is lost), errors as `v1.Status` objects
//! with the API server's reasons and codes (404 NotFound, 409 Conflict for a pod already
//! bound or a patch whose `metadata.resourceVersion` is not the object's, 415 for a patch type
//! it does not take). There is no real API server on these
//! machines; this is what the Kubernetes calls are tested against.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, patch, post};
use futures_util::StreamExt;
use serde_json::{Value, json};

/// A change made to the objects between two pages of a list.
type PageChange = Box<dyn FnOnce(&mut Objects) + Send>;

pub struct Objects {
    /// (namespace, name) → Pod.
    pub pods: BTreeMap<(String, String), Value>,
    pub nodes: BTreeMap<String, Value>,
    /// (namespace, name) → ResourceClaim (resource.k8s.io/v1).
    pub resource_claims: BTreeMap<(String, String), Value>,
    /// name → Namespace; `default` and `kube-system` are there from the start, unlabelled, as
    /// in a new cluster.
    pub namespaces: BTreeMap<String, Value>,
    /// name → ResourceSlice (resource.k8s.io/v1), as created and replaced.
    pub resource_slices: BTreeMap<String, Value>,
    /// Bindings created, as posted.
    pub bindings: Vec<Value>,
    /// (namespace, name) → Event (events.k8s.io/v1), as created and patched.
    pub kube_events: BTreeMap<(String, String), Value>,
    /// When set, every Binding is refused with 409 Conflict, as when another scheduler bound
    /// the pod first.
    pub refuse_bindings: bool,
    /// The query of every pod list call answered (one per page; watches not included).
    pub pod_lists: Vec<String>,
    /// Run once after the first page of a node list with more pages.
    between_node_pages: Option<PageChange>,
    version: u64,
    /// Every change, in order: (resourceVersion, resource, `{"type", "object"}`), for watches
    /// that start from an earlier version. Kept whole (the API server keeps a window and
    /// answers 410 Gone before it; the tests' histories are small).
    history: Vec<(u64, Resource, Value)>,
    /// The same changes as they happen, for running watches.
    events: tokio::sync::broadcast::Sender<(u64, Resource, Value)>,
}

/// The kinds of object a watch follows.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Resource {
    Pods,
    Nodes,
}

impl Resource {
    fn plural(self) -> &'static str {
        match self {
            Self::Pods => "pods",
            Self::Nodes => "nodes",
        }
    }
}

impl Default for Objects {
    fn default() -> Self {
        Self {
            pods: BTreeMap::new(),
            nodes: BTreeMap::new(),
            resource_claims: BTreeMap::new(),
            namespaces: ["default", "kube-system"]
                .into_iter()
                .map(|n| (n.to_string(), namespace(n, &[])))
                .collect(),
            resource_slices: BTreeMap::new(),
            bindings: Vec::new(),
            kube_events: BTreeMap::new(),
            refuse_bindings: false,
            pod_lists: Vec::new(),
            between_node_pages: None,
            version: 0,
            history: Vec::new(),
            events: tokio::sync::broadcast::channel(4096).0,
        }
    }
}

impl Objects {
    /// Creates or replaces a node (watchers see ADDED or MODIFIED).
    pub fn put_node(&mut self, mut node: Value) {
        let name = node["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        node["metadata"]["resourceVersion"] = Value::String(self.next_version().to_string());
        let kind = if self.nodes.contains_key(&name) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        self.record(Resource::Nodes, kind, &node);
        self.nodes.insert(name, node);
    }

    /// Deletes a node (watchers see DELETED).
    pub fn delete_node(&mut self, name: &str) {
        if let Some(mut node) = self.nodes.remove(name) {
            node["metadata"]["resourceVersion"] = Value::String(self.next_version().to_string());
            self.record(Resource::Nodes, "DELETED", &node);
        }
    }

    /// Takes the next resourceVersion for a write.
    fn next_version(&mut self) -> u64 {
        self.version += 1;
        self.version
    }

    /// Records a change of `object` (already carrying its new resourceVersion) for watches.
    fn record(&mut self, resource: Resource, kind: &str, object: &Value) {
        let event = (
            self.version,
            resource,
            json!({"type": kind, "object": object}),
        );
        self.history.push(event.clone());
        let _ = self.events.send(event);
    }
}

pub struct ApiServer {
    pub url: String,
    pub objects: Arc<Mutex<Objects>>,
    _thread: std::thread::JoinHandle<()>,
}

impl ApiServer {
    #[must_use]
    pub fn start() -> Self {
        let objects = Arc::new(Mutex::new(Objects::default()));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let app = Router::new()
            .route(
                "/api/v1/namespaces/{ns}/pods/{name}",
                get(get_pod).patch(patch_pod),
            )
            .route(
                "/api/v1/namespaces/{ns}/pods/{name}/binding",
                post(bind_pod),
            )
            .route("/api/v1/namespaces/{ns}", get(get_namespace))
            .route("/api/v1/pods", get(list_pods))
            .route("/api/v1/nodes", get(list_nodes))
            .route("/api/v1/nodes/{name}", get(get_node).patch(patch_node))
            .route("/api/v1/nodes/{name}/status", patch(patch_node_status))
            .route(
                "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}",
                get(get_resource_claim),
            )
            .route(
                "/apis/resource.k8s.io/v1/resourceclaims",
                get(list_resource_claims),
            )
            .route(
                "/apis/resource.k8s.io/v1/resourceslices",
                post(create_resource_slice),
            )
            .route(
                "/apis/resource.k8s.io/v1/resourceslices/{name}",
                get(get_resource_slice).put(replace_resource_slice),
            )
            .route(
                "/apis/events.k8s.io/v1/namespaces/{ns}/events",
                post(create_event),
            )
            .route(
                "/apis/events.k8s.io/v1/namespaces/{ns}/events/{name}",
                patch(patch_event),
            )
            .with_state(objects.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let l = tokio::net::TcpListener::from_std(listener).expect("listener");
                axum::serve(l, app).await.expect("serve");
            });
        });
        Self {
            url,
            objects,
            _thread: thread,
        }
    }

    /// The Events posted so far, in name order.
    pub fn kube_events(&self) -> Vec<Value> {
        self.objects
            .lock()
            .expect("lock")
            .kube_events
            .values()
            .cloned()
            .collect()
    }

    pub fn put_pod(&self, pod: Value) {
        let ns = pod["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        let name = pod["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let mut o = self.objects.lock().expect("lock");
        let kind = if o.pods.contains_key(&(ns.clone(), name.clone())) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        let mut pod = pod;
        pod["metadata"]["resourceVersion"] = Value::String(o.next_version().to_string());
        o.record(Resource::Pods, kind, &pod);
        o.pods.insert((ns, name), pod);
    }

    /// Creates or replaces a ResourceClaim (resource.k8s.io/v1), as the scheduler leaves it
    /// allocated.
    /// Deletes a ResourceClaim.
    pub fn delete_resource_claim(&self, namespace: &str, name: &str) {
        self.objects
            .lock()
            .expect("lock")
            .resource_claims
            .remove(&(namespace.to_string(), name.to_string()));
    }

    /// Creates or replaces the namespace `name` with `labels`.
    pub fn put_namespace(&self, name: &str, labels: &[(&str, &str)]) {
        let mut o = self.objects.lock().expect("lock");
        let mut ns = namespace(name, labels);
        ns["metadata"]["resourceVersion"] = Value::String(o.next_version().to_string());
        o.namespaces.insert(name.to_string(), ns);
    }

    pub fn put_resource_claim(&self, mut claim: Value) {
        let ns = claim["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        let name = claim["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let mut o = self.objects.lock().expect("lock");
        claim["metadata"]["resourceVersion"] = Value::String(o.next_version().to_string());
        o.resource_claims.insert((ns, name), claim);
    }

    /// Creates or replaces a node (watchers see ADDED or MODIFIED).
    pub fn put_node(&self, node: Value) {
        self.objects.lock().expect("lock").put_node(node);
    }

    /// Runs `change` once, right after the first page of the next node list that has more
    /// pages is served: a change made while a client is still paging through the list.
    pub fn between_node_pages(&self, change: impl FnOnce(&mut Objects) + Send + 'static) {
        self.objects.lock().expect("lock").between_node_pages = Some(Box::new(change));
    }

    /// Deletes a pod (watchers see DELETED).
    pub fn delete_pod(&self, ns: &str, name: &str) {
        let mut o = self.objects.lock().expect("lock");
        if let Some(mut pod) = o.pods.remove(&(ns.to_string(), name.to_string())) {
            pod["metadata"]["resourceVersion"] = Value::String(o.next_version().to_string());
            o.record(Resource::Pods, "DELETED", &pod);
        }
    }

    /// Deletes a node (watchers see DELETED).
    pub fn delete_node(&self, name: &str) {
        self.objects.lock().expect("lock").delete_node(name);
    }

    #[must_use]
    pub fn node(&self, name: &str) -> Option<Value> {
        self.objects.lock().expect("lock").nodes.get(name).cloned()
    }

    #[must_use]
    pub fn pod(&self, ns: &str, name: &str) -> Option<Value> {
        self.objects
            .lock()
            .expect("lock")
            .pods
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }
}

type Shared = Arc<Mutex<Objects>>;

fn status(code: StatusCode, reason: &str, message: String, kind: &str, name: &str) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason,
        "details": {"name": name, "kind": kind}, "code": code.as_u16()
    });
    (code, Json(body)).into_response()
}

fn not_found(kind: &str, name: &str) -> Response {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("{kind} \"{name}\" not found"),
        kind,
        name,
    )
}

async fn get_pod(State(s): State<Shared>, Path((ns, name)): Path<(String, String)>) -> Response {
    match s.lock().expect("lock").pods.get(&(ns, name.clone())) {
        Some(p) => Json(p.clone()).into_response(),
        None => not_found("pods", &name),
    }
}

/// A Namespace object named `name` with `labels`.
#[must_use]
pub fn namespace(name: &str, labels: &[(&str, &str)]) -> Value {
    let labels: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| ((*k).to_string(), Value::String((*v).to_string())))
        .chain([(
            "kubernetes.io/metadata.name".to_string(),
            Value::String(name.to_string()),
        )])
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "uid": format!("ns-{name}"), "labels": labels},
        "status": {"phase": "Active"},
    })
}

async fn get_namespace(State(s): State<Shared>, Path(name): Path<String>) -> Response {
    match s.lock().expect("lock").namespaces.get(&name) {
        Some(n) => Json(n.clone()).into_response(),
        None => not_found("namespaces", &name),
    }
}

async fn get_resource_claim(
    State(s): State<Shared>,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    match s
        .lock()
        .expect("lock")
        .resource_claims
        .get(&(ns, name.clone()))
    {
        Some(c) => Json(c.clone()).into_response(),
        None => not_found("resourceclaims.resource.k8s.io", &name),
    }
}

/// `GET`: every ResourceClaim of every namespace, in one page.
async fn list_resource_claims(State(s): State<Shared>) -> Response {
    let o = s.lock().expect("lock");
    Json(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimList",
        "metadata": {"resourceVersion": o.version.to_string()},
        "items": o.resource_claims.values().cloned().collect::<Vec<_>>(),
    }))
    .into_response()
}

async fn get_resource_slice(State(s): State<Shared>, Path(name): Path<String>) -> Response {
    match s.lock().expect("lock").resource_slices.get(&name) {
        Some(o) => Json(o.clone()).into_response(),
        None => not_found("resourceslices.resource.k8s.io", &name),
    }
}

/// `POST`: creates a ResourceSlice; 409 AlreadyExists when the name is taken.
async fn create_resource_slice(State(s): State<Shared>, body: Bytes) -> Response {
    let Ok(mut object) = serde_json::from_slice::<Value>(&body) else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "not JSON".into(),
            "resourceslices",
            "",
        );
    };
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let mut o = s.lock().expect("lock");
    if o.resource_slices.contains_key(&name) {
        return status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("resourceslices.resource.k8s.io \"{name}\" already exists"),
            "resourceslices.resource.k8s.io",
            &name,
        );
    }
    object["metadata"]["resourceVersion"] = Value::String(o.next_version().to_string());
    o.resource_slices.insert(name, object.clone());
    (StatusCode::CREATED, Json(object)).into_response()
}

/// `PUT`: replaces a ResourceSlice whose `resourceVersion` the caller read (409 Conflict
/// otherwise, as the API server's optimistic concurrency answers).
async fn replace_resource_slice(
    State(s): State<Shared>,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    let Ok(mut object) = serde_json::from_slice::<Value>(&body) else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "not JSON".into(),
            "resourceslices",
            &name,
        );
    };
    let mut o = s.lock().expect("lock");
    let Some(current) = o.resource_slices.get(&name) else {
        return not_found("resourceslices.resource.k8s.io", &name);
    };
    if object["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"] {
        return status(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on resourceslices.resource.k8s.io \"{name}\": the object has been modified"
            ),
            "resourceslices.resource.k8s.io",
            &name,
        );
    }
    object["metadata"]["resourceVersion"] = Value::String(o.next_version().to_string());
    o.resource_slices.insert(name, object.clone());
    Json(object).into_response()
}

/// Whether `object` matches a field selector such as `spec.nodeName!=` or
/// `metadata.name=a` (comma-separated terms, all must hold; a missing field is "").
fn matches_fields(object: &Value, selector: Option<&str>) -> bool {
    let Some(selector) = selector.filter(|s| !s.is_empty()) else {
        return true;
    };
    selector.split(',').all(|term| {
        let (path, want, equal) = if let Some((p, v)) = term.split_once("!=") {
            (p, v, false)
        } else if let Some((p, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            (p, v, true)
        } else {
            return false;
        };
        let got = path
            .split('.')
            .try_fold(object, |v, key| v.get(key))
            .and_then(Value::as_str)
            .unwrap_or("");
        (got == want) == equal
    })
}

/// A watch response, one JSON event per line. From the client's `resourceVersion`: every
/// change made after it, then the changes as they come; without one (or "0"): an ADDED event
/// for each object there is, then the changes. Only objects matching `fieldSelector`.
fn watch(s: &Shared, resource: Resource, query: &HashMap<String, String>) -> Response {
    let selector = query.get("fieldSelector").cloned();
    let since = query
        .get("resourceVersion")
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|v| *v > 0);
    let o = s.lock().expect("lock");
    let first: Vec<Value> = match since {
        Some(since) => o
            .history
            .iter()
            .filter(|(v, r, _)| *v > since && *r == resource)
            .map(|(_, _, e)| e.clone())
            .collect(),
        None => {
            let objects: Vec<&Value> = match resource {
                Resource::Pods => o.pods.values().collect(),
                Resource::Nodes => o.nodes.values().collect(),
            };
            objects
                .into_iter()
                .map(|object| json!({"type": "ADDED", "object": object}))
                .collect()
        }
    };
    // Subscribed under the same lock as the snapshot: nothing falls between the two.
    let rx = o.events.subscribe();
    drop(o);
    let keep = move |event: &Value| matches_fields(&event["object"], selector.as_deref());
    let first: Vec<Value> = first.into_iter().filter(|e| keep(e)).collect();
    let live = futures_util::stream::unfold(rx, move |mut rx| {
        let keep = keep.clone();
        async move {
            loop {
                match rx.recv().await {
                    Ok((_, r, event)) if r == resource && keep(&event) => return Some((event, rx)),
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                }
            }
        }
    });
    let lines = futures_util::stream::iter(first).chain(live).map(|event| {
        let mut line = event.to_string();
        line.push('\n');
        Ok::<_, std::convert::Infallible>(line)
    });
    (
        [("content-type", "application/json")],
        axum::body::Body::from_stream(lines),
    )
        .into_response()
}

fn is_watch(query: &HashMap<String, String>) -> bool {
    query.get("watch").is_some_and(|w| w == "true" || w == "1")
}

/// The value of parameter `name` in a raw (still encoded) query.
fn raw_param(query: &str, name: &str) -> Option<String> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        .map(str::to_string)
}

/// A list (`kind`) of `matching` in pages of the query's `limit`, with a `continue` token as
/// the API server gives them. The token here is `<offset>-<resourceVersion of the first
/// page>` (clients treat it as opaque, as they do the real one); every page carries the first
/// page's resourceVersion, so that a watch started from the last page replays every change
/// made since the list began.
fn paged(kind: &str, matching: &[&Value], version: u64, query: &str) -> Value {
    let (start, version) = raw_param(query, "continue")
        .and_then(|c| {
            let (offset, v) = c.split_once('-')?;
            Some((offset.parse().ok()?, v.parse().ok()?))
        })
        .unwrap_or((0usize, version));
    let limit: usize = raw_param(query, "limit")
        .and_then(|l| l.parse().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let items: Vec<Value> = matching
        .iter()
        .skip(start)
        .take(limit)
        .map(|v| (*v).clone())
        .collect();
    let next = start.saturating_add(items.len());
    let mut metadata = json!({"resourceVersion": version.to_string()});
    if next < matching.len() {
        metadata["continue"] = Value::String(format!("{next}-{version}"));
    }
    json!({"kind": kind, "apiVersion": "v1", "metadata": metadata, "items": items})
}

/// `GET /api/v1/nodes`: a NodeList in pages of `limit`, or with `watch=true` a stream of
/// watch events.
async fn list_nodes(
    State(s): State<Shared>,
    Query(decoded): Query<HashMap<String, String>>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    if is_watch(&decoded) {
        return watch(&s, Resource::Nodes, &decoded);
    }
    let mut o = s.lock().expect("lock");
    let matching: Vec<&Value> = o.nodes.values().collect();
    let page = paged("NodeList", &matching, o.version, &query.unwrap_or_default());
    if page["metadata"]["continue"].is_string()
        && let Some(change) = o.between_node_pages.take()
    {
        change(&mut o);
    }
    Json(page).into_response()
}

/// `GET /api/v1/pods`: a PodList of every namespace, in pages of `limit`, or with
/// `watch=true` a stream of watch events.
async fn list_pods(
    State(s): State<Shared>,
    Query(decoded): Query<HashMap<String, String>>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    if is_watch(&decoded) {
        return watch(&s, Resource::Pods, &decoded);
    }
    let query = query.unwrap_or_default();
    let mut o = s.lock().expect("lock");
    let selector = decoded.get("fieldSelector").map(String::as_str);
    let matching: Vec<&Value> = o
        .pods
        .values()
        .filter(|p| matches_fields(p, selector))
        .collect();
    let list = paged("PodList", &matching, o.version, &query);
    o.pod_lists.push(query);
    Json(list).into_response()
}

async fn get_node(State(s): State<Shared>, Path(name): Path<String>) -> Response {
    match s.lock().expect("lock").nodes.get(&name) {
        Some(n) => Json(n.clone()).into_response(),
        None => not_found("nodes", &name),
    }
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().expect("object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// The body of a merge patch, or the API server's refusal of another patch type.
#[allow(clippy::result_large_err)] // the Err is the response itself, returned at once
fn merge_patch_body(
    headers: &HeaderMap,
    body: &Bytes,
    kind: &str,
    name: &str,
) -> Result<Value, Response> {
    let ct = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !ct.starts_with("application/merge-patch+json") {
        return Err(status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/merge-patch+json (got {ct})"
            ),
            kind,
            name,
        ));
    }
    serde_json::from_slice::<Value>(body).map_err(|_| {
        status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the request body is not JSON".into(),
            kind,
            name,
        )
    })
}

/// Applies a merge patch to the object `key` names, gives it the next resourceVersion,
/// records the change for watches and answers with the object.
fn apply_patch(
    o: &mut Objects,
    resource: Resource,
    key: &(String, String),
    patch: &Value,
) -> Response {
    let exists = match resource {
        Resource::Pods => o.pods.contains_key(key),
        Resource::Nodes => o.nodes.contains_key(&key.1),
    };
    if !exists {
        return not_found(resource.plural(), &key.1);
    }
    // A resourceVersion in the patch is a precondition, as the API server takes it
    // (optimistic concurrency): the patch applies only to that version of the object.
    if let Some(wanted) = patch["metadata"]["resourceVersion"].as_str() {
        let current = match resource {
            Resource::Pods => &o.pods[key],
            Resource::Nodes => &o.nodes[&key.1],
        }["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or("")
            .to_string();
        if wanted != current {
            return status(
                StatusCode::CONFLICT,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{}\": the object has been modified; please apply your changes to the latest version and try again",
                    resource.plural(),
                    key.1
                ),
                resource.plural(),
                &key.1,
            );
        }
    }
    let version = o.next_version().to_string();
    let object = match resource {
        Resource::Pods => o.pods.get_mut(key),
        Resource::Nodes => o.nodes.get_mut(&key.1),
    }
    .expect("checked above");
    merge(object, patch);
    object["metadata"]["resourceVersion"] = Value::String(version);
    let object = object.clone();
    o.record(resource, "MODIFIED", &object);
    Json(object).into_response()
}

async fn patch_pod(
    State(s): State<Shared>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let patch = match merge_patch_body(&headers, &body, "pods", &name) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let mut o = s.lock().expect("lock");
    apply_patch(&mut o, Resource::Pods, &(ns, name), &patch)
}

/// `PATCH /api/v1/nodes/{name}`: as the API server, changes to `status` are dropped there
/// (they go through the status subresource).
async fn patch_node(
    State(s): State<Shared>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut patch = match merge_patch_body(&headers, &body, "nodes", &name) {
        Ok(p) => p,
        Err(r) => return r,
    };
    if let Some(p) = patch.as_object_mut() {
        p.remove("status");
    }
    apply_node_patch(&s, &name, &patch)
}

/// `PATCH /api/v1/nodes/{name}/status`: only `status` changes there.
async fn patch_node_status(
    State(s): State<Shared>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let patch = match merge_patch_body(&headers, &body, "nodes", &name) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let patch = json!({"status": patch.get("status").cloned().unwrap_or(json!({}))});
    apply_node_patch(&s, &name, &patch)
}

fn apply_node_patch(s: &Shared, name: &str, patch: &Value) -> Response {
    let mut o = s.lock().expect("lock");
    apply_patch(
        &mut o,
        Resource::Nodes,
        &(String::new(), name.to_string()),
        patch,
    )
}

async fn bind_pod(
    State(s): State<Shared>,
    Path((ns, name)): Path<(String, String)>,
    Json(binding): Json<Value>,
) -> Response {
    let mut o = s.lock().expect("lock");
    let target = binding["target"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let refuse = o.refuse_bindings;
    let Some(pod) = o.pods.get_mut(&(ns.clone(), name.clone())) else {
        return not_found("pods", &name);
    };
    if refuse {
        return status(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on pods/binding \"{name}\": the object has been modified"
            ),
            "pods/binding",
            &name,
        );
    }
    if let Some(node) = pod["spec"]["nodeName"].as_str() {
        return status(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on pods/binding \"{name}\": pod {name} is already assigned to node \"{node}\""
            ),
            "pods/binding",
            &name,
        );
    }
    pod["spec"]["nodeName"] = Value::String(target);
    let version = o.next_version().to_string();
    let key = (ns, name);
    let pod = o.pods.get_mut(&key).expect("found above");
    pod["metadata"]["resourceVersion"] = Value::String(version);
    let pod = pod.clone();
    o.record(Resource::Pods, "MODIFIED", &pod);
    o.bindings.push(binding);
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201});
    (StatusCode::CREATED, Json(body)).into_response()
}

/// Why the API server would refuse this events.k8s.io/v1 Event (its validation of the fields
/// a new-style Event must have), or `None`.
fn invalid_event(event: &Value) -> Option<String> {
    let text = |path: &[&str]| {
        path.iter()
            .fold(event, |v, k| &v[*k])
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    for (field, path) in [
        ("eventTime", &["eventTime"][..]),
        ("reportingController", &["reportingController"][..]),
        ("reportingInstance", &["reportingInstance"][..]),
        ("action", &["action"][..]),
        ("reason", &["reason"][..]),
        ("metadata.name", &["metadata", "name"][..]),
    ] {
        if text(path).is_empty() {
            return Some(format!("{field}: Required value"));
        }
    }
    if !matches!(text(&["type"]).as_str(), "Normal" | "Warning") {
        return Some(format!("type: Unsupported value: {:?}", text(&["type"])));
    }
    if text(&["note"]).len() > 1024 {
        return Some("note: Too long: may not be more than 1024 bytes".into());
    }
    None
}

/// `POST`: creates an Event in the namespace of the URL.
async fn create_event(State(s): State<Shared>, Path(ns): Path<String>, body: Bytes) -> Response {
    let Ok(mut event) = serde_json::from_slice::<Value>(&body) else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "not JSON".into(),
            "events.events.k8s.io",
            "",
        );
    };
    let name = event["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let body_ns = event["metadata"]["namespace"].as_str().unwrap_or(&ns);
    if body_ns != ns {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the namespace of the provided object does not match the namespace sent on the request"
                .into(),
            "events.events.k8s.io",
            &name,
        );
    }
    if let Some(why) = invalid_event(&event) {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!("Event.events.k8s.io \"{name}\" is invalid: {why}"),
            "events.events.k8s.io",
            &name,
        );
    }
    let mut o = s.lock().expect("lock");
    let key = (ns.clone(), name.clone());
    if o.kube_events.contains_key(&key) {
        return status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("events.events.k8s.io \"{name}\" already exists"),
            "events.events.k8s.io",
            &name,
        );
    }
    event["metadata"]["namespace"] = Value::String(ns);
    event["metadata"]["resourceVersion"] = Value::String(o.next_version().to_string());
    o.kube_events.insert(key, event.clone());
    (StatusCode::CREATED, Json(event)).into_response()
}

/// `PATCH` (merge): a series update of an Event.
async fn patch_event(
    State(s): State<Shared>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let patch = match merge_patch_body(&headers, &body, "events.events.k8s.io", &name) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let mut o = s.lock().expect("lock");
    let version = o.next_version().to_string();
    let Some(event) = o.kube_events.get_mut(&(ns, name.clone())) else {
        return not_found("events.events.k8s.io", &name);
    };
    merge(event, &patch);
    event["metadata"]["resourceVersion"] = Value::String(version);
    Json(event.clone()).into_response()
}
