//! Publishing: `POST /topics/{topic}/events` and `POST /topics/{topic}/events/{eventId}`.

use super::{read_body, AppState};
use crate::error::ApiError;
use crate::model::event::{self, PublishInput};
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;

// The handlers take the whole request and split it instead of extracting `HeaderMap`: that
// extractor clones every header map (~1 % of the publish path's CPU in the bench profile).
pub(super) async fn publish(
    State(s): State<AppState>,
    Path(topic): Path<String>,
    req: Request,
) -> Response {
    let (parts, body) = req.into_parts();
    run(s, topic, None, parts.headers, body).await
}

pub(super) async fn publish_single(
    State(s): State<AppState>,
    Path((topic, id)): Path<(String, String)>,
    req: Request,
) -> Response {
    let (parts, body) = req.into_parts();
    run(s, topic, Some(id), parts.headers, body).await
}

async fn run(
    s: AppState,
    topic: String,
    single_id: Option<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let entry = match s.broker.find_topic(&topic) {
        Ok(entry) => entry,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let result = async {
        let limits = &s.broker.config().broker;
        let bytes = read_body(&headers, body, limits.max_request_body_bytes, &s.bodies).await?;
        let t = entry.topic();
        let events = event::parse(&PublishInput {
            schema: t.input_schema,
            topic: &t.name,
            headers: &headers,
            body: &bytes,
            single_id: single_id.as_deref(),
            max_events: limits.max_events_per_request,
        })?;
        s.broker.publish(&entry, events).await?;
        Ok::<(), ApiError>(())
    }
    .await;
    match result {
        Ok(()) => {
            entry.metrics.success_requests.inc();
            entry
                .metrics
                .success_request_latency_ms
                .observe_ms(started.elapsed().as_millis() as u64);
            StatusCode::OK.into_response()
        }
        Err(e) => {
            if e.is_user_error() {
                entry.metrics.user_error_requests.inc();
            } else {
                entry.metrics.system_error_requests.inc();
            }
            e.into_response()
        }
    }
}
