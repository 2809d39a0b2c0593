//! `/topics/{topic}/eventSubscriptions` handlers.

use super::{read_json, AppState, Conn};
use crate::delivery::deadletter::rfc3339;
use crate::error::ApiError;
use crate::model::subscription::subscription_resource;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::Value;

pub(super) async fn put(
    State(s): State<AppState>,
    Path((topic, name)): Path<(String, String)>,
    conn: Conn,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let body = read_json(&s, &headers, body).await?;
    let sub = s
        .broker
        .manage(move |b| b.put_subscription(&topic, &name, body))
        .await?;
    Ok(Json(subscription_resource(
        &sub,
        &s.resource_context(&headers, &conn),
    )))
}

pub(super) async fn get(
    State(s): State<AppState>,
    Path((topic, name)): Path<(String, String)>,
    conn: Conn,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let sub = s.broker.find_subscription(&topic, &name)?;
    let mut v = subscription_resource(&sub.config().sub, &s.resource_context(&headers, &conn));
    // Live state, not part of the stored record: the destination's health, shown only while it
    // is disabled or frozen, so a healthy subscription's GET stays identical to its PUT answer
    // (as the original's). Always available at `.../endpointHealth`.
    if let Some(props) = v.get_mut("properties").and_then(Value::as_object_mut) {
        if let Some(h) = sub
            .endpoint_health()
            .filter(|h| h.state != crate::delivery::health::HealthState::Closed)
        {
            props.insert("endpointHealth".into(), super::deadletters::health_json(&h));
        }
    }
    Ok(Json(v))
}

pub(super) async fn list(
    State(s): State<AppState>,
    Path(topic): Path<String>,
    conn: Conn,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let entry = s.broker.find_topic(&topic)?;
    let ctx = s.resource_context(&headers, &conn);
    let mut subs: Vec<_> = entry
        .subscriptions()
        .iter()
        .map(|e| e.config().sub.clone())
        .collect();
    subs.sort_by_key(|s| s.name.to_ascii_lowercase());
    Ok(Json(Value::Array(
        subs.iter()
            .map(|s| subscription_resource(s, &ctx))
            .collect(),
    )))
}

pub(super) async fn delete(
    State(s): State<AppState>,
    Path((topic, name)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    s.broker
        .manage(move |b| b.delete_subscription(&topic, &name))
        .await?;
    Ok(StatusCode::OK.into_response())
}

/// `GET …/eventSubscriptions/{sub}/status`: the subscription's live state (the console's
/// columns: backlog, in flight, dead letters, counts since start, a queue's locked events), and
/// its endpoint health whatever its state.
pub(super) async fn status(
    State(s): State<AppState>,
    Path((topic, name)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let st = s.broker.subscription_status(&topic, &name)?;
    let health = s
        .broker
        .find_subscription(&topic, &name)?
        .endpoint_health()
        .map_or(Value::Null, |h| super::deadletters::health_json(&h));
    Ok(Json(serde_json::json!({
        "pending": st.pending,
        "inFlight": st.in_flight,
        "deadLetters": st.dead_letters,
        "delivered": st.delivered,
        "failedAttempts": st.failed_attempts,
        "deadLettered": st.dead_lettered,
        "locked": st.locks.as_ref().map(|l| l.summary.locked),
        "queue": st.locks.as_ref().map(|l| serde_json::json!({
            "locked": l.summary.locked,
            "deliveryCounts": {
                "1": l.summary.delivery_counts[0],
                "2": l.summary.delivery_counts[1],
                "3": l.summary.delivery_counts[2],
                "4": l.summary.delivery_counts[3],
                "5+": l.summary.delivery_counts[4],
            },
            "oldestLockedEventTime": l.summary.oldest_enqueued_ms.map(rfc3339),
            "nextLockExpiryInSeconds": l.next_expiry_in.map(|d| d.as_secs()),
        })),
        "lastError": st.last_error.as_ref().map(|(at, why)| serde_json::json!({
            "time": rfc3339(*at),
            "message": why,
        })),
        "oldestWaitingEventTime": st.oldest_ms.map(rfc3339),
        "retrying": st.retrying,
        "nextRetryInSeconds": st.next_retry_in.map(|d| d.as_secs()),
        "persisted": st.persisted,
        "endpointHealth": health,
    })))
}
