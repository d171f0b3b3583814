//! A stand-in for the Kubernetes API server, for the calls gpuslice makes: read a pod or a
//! node, merge-patch a pod or a node, create a pod's Binding. It answers as the API server does: objects
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
use axum::routing::{get, post};
use serde_json::{Value, json};

#[derive(Default)]
pub struct Objects {
    /// (namespace, name) → Pod.
    pub pods: BTreeMap<(String, String), Value>,
    pub nodes: BTreeMap<String, Value>,
    /// Bindings created, as posted.
    pub bindings: Vec<Value>,
    version: u64,
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
            .route("/api/v1/nodes/{name}", get(get_node).patch(patch_node))
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
        self.objects
            .lock()
            .expect("lock")
            .pods
            .insert((ns, name), pod);
    }

    pub fn put_node(&self, node: Value) {
        let name = node["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        self.objects.lock().expect("lock").nodes.insert(name, node);
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

async fn patch_node(
    State(s): State<Shared>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let patch = match merge_patch_body(&headers, &body, "nodes", &name) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let mut o = s.lock().expect("lock");
    o.version += 1;
    let version = o.version;
    match o.nodes.get_mut(&name) {
        Some(node) => patched(node, &patch, version),
        None => not_found("nodes", &name),
    }
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
    let Some(pod) = o.pods.get_mut(&(ns, name.clone())) else {
        return not_found("pods", &name);
    };
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
