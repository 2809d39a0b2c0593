//! Health and metrics routes.

use super::AppState;
use crate::config::Key;
use crate::error::ApiError;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use std::sync::atomic::Ordering;

/// Liveness: the process serves HTTP.
pub(super) async fn live() -> &'static str {
    "ok"
}

/// Readiness: the broker accepts work (503 while shutting down). The body says so, and names
/// any data the store found damaged at start (`persistence__onDamage=serve`): a second line.
pub(super) async fn ready(State(s): State<AppState>) -> Response {
    if s.ready.load(Ordering::Relaxed) {
        match s.broker.store_damage() {
            Some(damage) => (StatusCode::OK, format!("ready\n{damage}\n")).into_response(),
            None => (StatusCode::OK, "ready").into_response(),
        }
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down").into_response()
    }
}

/// Prometheus exposition, when `metrics__reporterType=prometheus`.
pub(super) async fn metrics(State(s): State<AppState>) -> Response {
    if !s.metrics_enabled {
        return ApiError::not_found(
            "NotFound",
            format!(
                "metrics are off ({}=prometheus enables them)",
                Key::metrics__reporterType.name()
            ),
        )
        .into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.broker.render_metrics(),
    )
        .into_response()
}
