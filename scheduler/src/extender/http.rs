//! The extender over HTTP: `POST /filter`, `POST /prioritize`, `POST /bind` (paths are the
//! `filterVerb`, `prioritizeVerb` and `bindVerb` of kube-scheduler's extender configuration),
//! `GET /healthz` (alive), `GET /readyz` (the watches have listed the cluster), `GET /metrics`
//! (OpenMetrics). The verbs answer only the callers [`super::tls`] lets them. A body that
//! is not an `ExtenderArgs` is answered in the protocol, with `Error` set (filter) or HTTP
//! 400 (prioritize, whose answer has no error field).

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRequestParts, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Json};
use axum::routing::{get, post};

use super::Extender;
use super::bind::Binder;
use super::metrics::Metrics;
use super::tls::Caller;
use super::wire::{ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult};

/// The largest request body read (a NodeList of thousands of Nodes is a few MiB).
pub const MAX_BODY: usize = 64 << 20;

/// The extender's state as the handlers see it.
#[derive(Clone)]
pub struct Served {
    pub extender: Arc<Extender>,
    /// None: bind is not configured (no API access or no key).
    pub binder: Option<Arc<Binder>>,
    pub metrics: Arc<Metrics>,
}

pub fn router(extender: Arc<Extender>) -> Router {
    router_with_bind(extender, None)
}

pub fn router_with_bind(extender: Arc<Extender>, binder: Option<Arc<Binder>>) -> Router {
    Router::new()
        .route("/filter", post(filter))
        .route("/prioritize", post(prioritize))
        .route("/bind", post(bind))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .with_state(Served {
            extender,
            binder,
            metrics: Arc::default(),
        })
}

/// A verb's caller that [`super::tls`] lets ask it (`BIND`: bind; else filter and
/// prioritize). Taken from the request's head, before its body is read: anyone else gets
/// HTTP 403 with the extender protocol's `Error` (counted as refused) for nothing more than
/// the head. A router served without a word on its callers answers no one.
pub struct FromKubeScheduler<const BIND: bool>;

impl<const BIND: bool> FromRequestParts<Served> for FromKubeScheduler<BIND> {
    type Rejection = axum::response::Response;

    async fn from_request_parts(parts: &mut Parts, s: &Served) -> Result<Self, Self::Rejection> {
        let caller = parts.extensions.get::<Caller>().copied();
        let allowed = if BIND {
            caller.is_some_and(Caller::may_bind)
        } else {
            caller.is_some_and(Caller::may_ask)
        };
        if allowed {
            return Ok(Self);
        }
        let verb = match parts.uri.path() {
            "/bind" => "bind",
            "/filter" => "filter",
            _ => "prioritize",
        };
        s.metrics.count_refused(verb);
        let why = match caller {
            Some(Caller::Unlisted) => {
                "the common name of this connection's client certificate is not among the \
                 extender's --client-allowed-names"
            }
            Some(Caller::Unknown { .. }) => {
                "the extender has no --client-ca-file to know it by and does not listen on a \
                 loopback address"
            }
            _ => {
                "this connection presented no client certificate signed by the extender's \
                  --client-ca-file"
            }
        };
        let refused = ExtenderBindingResult {
            error: format!("gpuslice: {verb} answers kube-scheduler only: {why}"),
        };
        Err((StatusCode::FORBIDDEN, Json(refused)).into_response())
    }
}

/// Ready once the node cache and the pod watch have listed the cluster (at once without
/// API access): before that, answers would come from a partial cluster.
async fn readyz(State(s): State<Served>) -> axum::response::Response {
    if s.extender.ready() {
        "ok".into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the Node and pod watches have not listed the cluster yet",
        )
            .into_response()
    }
}

async fn metrics(State(s): State<Served>) -> axum::response::Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.render(&s.extender),
    )
        .into_response()
}

async fn bind(
    _: FromKubeScheduler<true>,
    State(s): State<Served>,
    body: Bytes,
) -> Json<ExtenderBindingResult> {
    let args: ExtenderBindingArgs = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => {
            s.metrics.count("bind", false);
            return Json(ExtenderBindingResult {
                error: format!("gpuslice: request is not ExtenderBindingArgs: {e}"),
            });
        }
    };
    let result = match &s.binder {
        Some(b) => s.extender.bind(b, &args).await,
        None => ExtenderBindingResult {
            error: "gpuslice: bind is not configured (start with --assignment-key and API access)"
                .into(),
        },
    };
    s.metrics.count("bind", result.error.is_empty());
    Json(result)
}

fn args(body: &Bytes) -> Result<ExtenderArgs<'_>, String> {
    serde_json::from_slice(body).map_err(|e| format!("gpuslice: request is not ExtenderArgs: {e}"))
}

/// `value` as a JSON response, written before the request it borrows from is dropped.
fn json<T: serde::Serialize>(value: &T) -> axum::response::Response {
    match serde_json::to_vec(value) {
        Ok(body) => (
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn filter(
    _: FromKubeScheduler<false>,
    State(s): State<Served>,
    body: Bytes,
) -> axum::response::Response {
    let args = args(&body);
    let result = match &args {
        Ok(a) => s.extender.filter(a),
        Err(e) => ExtenderFilterResult {
            error: e.clone(),
            ..ExtenderFilterResult::default()
        },
    };
    s.metrics.count("filter", result.error.is_empty());
    json(&result)
}

async fn prioritize(
    _: FromKubeScheduler<false>,
    State(s): State<Served>,
    body: Bytes,
) -> axum::response::Response {
    let args = args(&body);
    s.metrics.count("prioritize", args.is_ok());
    match &args {
        Ok(a) => json(&s.extender.prioritize(a)),
        Err(e) => (StatusCode::BAD_REQUEST, e.clone()).into_response(),
    }
}
