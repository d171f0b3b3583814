//! The extender over HTTP: `POST /filter`, `POST /prioritize` (paths are the `filterVerb` and
//! `prioritizeVerb` of kube-scheduler's extender configuration), `GET /healthz`. A body that
//! is not an `ExtenderArgs` is answered in the protocol, with `Error` set (filter) or HTTP
//! 400 (prioritize, whose answer has no error field).

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json};
use axum::routing::{get, post};

use super::Extender;
use super::wire::{ExtenderArgs, ExtenderFilterResult};

/// The largest request body read (a NodeList of thousands of Nodes is a few MiB).
pub const MAX_BODY: usize = 64 << 20;

pub fn router(extender: Arc<Extender>) -> Router {
    Router::new()
        .route("/filter", post(filter))
        .route("/prioritize", post(prioritize))
        .route("/healthz", get(|| async { "ok" }))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .with_state(extender)
}

fn args(body: &Bytes) -> Result<ExtenderArgs, String> {
    serde_json::from_slice(body).map_err(|e| format!("gpuslice: request is not ExtenderArgs: {e}"))
}

async fn filter(State(ext): State<Arc<Extender>>, body: Bytes) -> Json<ExtenderFilterResult> {
    match args(&body) {
        Ok(a) => Json(ext.filter(&a)),
        Err(e) => Json(ExtenderFilterResult {
            error: e,
            ..ExtenderFilterResult::default()
        }),
    }
}

async fn prioritize(State(ext): State<Arc<Extender>>, body: Bytes) -> axum::response::Response {
    match args(&body) {
        Ok(a) => Json(ext.prioritize(&a)).into_response(),
        Err(e) => (StatusCode::BAD_REQUEST, e).into_response(),
    }
}
