//! A stand-in for the Kubernetes API server, for the calls gpuslice makes: read a pod or a
//! node, merge-patch a pod, a node or a node's status subresource, list pods (paged), list and
//! watch nodes, create a pod's Binding. It answers as the API server does: objects
//! as JSON, `metadata.resourceVersion` bumped on each write, errors as `v1.Status` objects
//! with the API server's reasons and codes (404 NotFound, 409 Conflict for a pod already
//! bound, 415 for a patch type it does not take). There is no real API server on these
//! machines; this is what the Kubernetes calls are tested against.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, patch, post};
use serde_json::{Value, json};

pub struct Objects {
    /// (namespace, name) → Pod.
    pub pods: BTreeMap<(String, String), Value>,
    pub nodes: BTreeMap<String, Value>,
    /// Bindings created, as posted.
    pub bindings: Vec<Value>,
    /// When set, every Binding is refused with 409 Conflict, as when another scheduler bound
    /// the pod first.
    pub refuse_bindings: bool,
    /// The query of every pod list call answered (one per page; watches not included).
    pub pod_lists: Vec<String>,
    version: u64,
    /// Watch events on nodes, as `{"type", "object"}`.
    node_events: tokio::sync::broadcast::Sender<Value>,
    /// Watch events on pods.
    pod_events: tokio::sync::broadcast::Sender<Value>,
}

impl Default for Objects {
    fn default() -> Self {
        Self {
            pods: BTreeMap::new(),
            nodes: BTreeMap::new(),
            bindings: Vec::new(),
            refuse_bindings: false,
            pod_lists: Vec::new(),
            version: 0,
            node_events: tokio::sync::broadcast::channel(1024).0,
            pod_events: tokio::sync::broadcast::channel(1024).0,
        }
    }
}

impl Objects {
    fn node_event(&self, kind: &str, node: &Value) {
        let _ = self.node_events.send(json!({"type": kind, "object": node}));
    }

    fn pod_event(&self, kind: &str, pod: &Value) {
        let _ = self.pod_events.send(json!({"type": kind, "object": pod}));
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
            .route("/api/v1/pods", get(list_pods))
            .route("/api/v1/nodes", get(list_nodes))
            .route("/api/v1/nodes/{name}", get(get_node).patch(patch_node))
            .route("/api/v1/nodes/{name}/status", patch(patch_node_status))
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
        o.pod_event(kind, &pod);
        o.pods.insert((ns, name), pod);
    }

    /// Creates or replaces a node (watchers see ADDED or MODIFIED).
    pub fn put_node(&self, mut node: Value) {
        let name = node["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let mut o = self.objects.lock().expect("lock");
        o.version += 1;
        node["metadata"]["resourceVersion"] = Value::String(o.version.to_string());
        let kind = if o.nodes.contains_key(&name) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        o.node_event(kind, &node);
        o.nodes.insert(name, node);
    }

    /// Deletes a pod (watchers see DELETED).
    pub fn delete_pod(&self, ns: &str, name: &str) {
        let mut o = self.objects.lock().expect("lock");
        if let Some(pod) = o.pods.remove(&(ns.to_string(), name.to_string())) {
            o.pod_event("DELETED", &pod);
        }
    }

    /// Deletes a node (watchers see DELETED).
    pub fn delete_node(&self, name: &str) {
        let mut o = self.objects.lock().expect("lock");
        if let Some(node) = o.nodes.remove(name) {
            o.node_event("DELETED", &node);
        }
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

/// A watch response: the events of `rx`, one JSON object per line, from now on (the client's
/// resourceVersion is not replayed).
fn event_stream(rx: tokio::sync::broadcast::Receiver<Value>) -> Response {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(event) => {
                    let mut line = event.to_string();
                    line.push('\n');
                    return Some((Ok::<_, std::convert::Infallible>(line), rx));
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    (
        [("content-type", "application/json")],
        axum::body::Body::from_stream(stream),
    )
        .into_response()
}

/// `GET /api/v1/nodes`: a NodeList, or with `watch=true` a stream of watch events, one JSON
/// object per line, from now on (the client's resourceVersion is not replayed).
async fn list_nodes(
    State(s): State<Shared>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    let watch = query
        .unwrap_or_default()
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let o = s.lock().expect("lock");
    if watch {
        let rx = o.node_events.subscribe();
        drop(o);
        return event_stream(rx);
    }
    let list = json!({
        "kind": "NodeList", "apiVersion": "v1",
        "metadata": {"resourceVersion": o.version.to_string()},
        "items": o.nodes.values().cloned().collect::<Vec<_>>()
    });
    Json(list).into_response()
}

/// `GET /api/v1/pods`: a PodList of every namespace, in pages of `limit` with a `continue`
/// token as the API server gives them (the token here is the offset; clients must treat it as
/// opaque, as they do the real one).
async fn list_pods(
    State(s): State<Shared>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    let query = query.unwrap_or_default();
    let param = |name: &str| {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .map(str::to_string)
    };
    let mut o = s.lock().expect("lock");
    if param("watch").is_some_and(|w| w == "true" || w == "1") {
        let rx = o.pod_events.subscribe();
        drop(o);
        return event_stream(rx);
    }
    let start: usize = param("continue").and_then(|c| c.parse().ok()).unwrap_or(0);
    let limit: usize = param("limit")
        .and_then(|l| l.parse().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let items: Vec<Value> = o.pods.values().skip(start).take(limit).cloned().collect();
    let next = start.saturating_add(items.len());
    let mut metadata = json!({"resourceVersion": o.version.to_string()});
    if next < o.pods.len() {
        metadata["continue"] = Value::String(next.to_string());
    }
    o.pod_lists.push(query.clone());
    Json(json!({"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": items}))
        .into_response()
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

/// Applies a merge patch to `object`, bumping its resourceVersion, and answers with it.
fn patched(object: &mut Value, patch: &Value, version: u64) -> Response {
    merge(object, patch);
    object["metadata"]["resourceVersion"] = Value::String(version.to_string());
    Json(object.clone()).into_response()
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
    o.version += 1;
    let version = o.version;
    match o.pods.get_mut(&(ns, name.clone())) {
        Some(pod) => patched(pod, &patch, version),
        None => not_found("pods", &name),
    }
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
    let name = name.to_string();
    let mut o = s.lock().expect("lock");
    o.version += 1;
    let version = o.version;
    let response = match o.nodes.get_mut(&name) {
        Some(node) => patched(node, patch, version),
        None => return not_found("nodes", &name),
    };
    if let Some(node) = o.nodes.get(&name) {
        o.node_event("MODIFIED", node);
    }
    response
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
    let Some(pod) = o.pods.get_mut(&(ns, name.clone())) else {
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
    o.bindings.push(binding);
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201});
    (StatusCode::CREATED, Json(body)).into_response()
}
