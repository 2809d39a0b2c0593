//! `/topics/{topic}/eventSubscriptions` handlers.

use super::{read_body, require_json, AppState, ConnInfo};
use crate::broker::BrokerError;
use crate::error::ApiError;
use crate::model::json::parse_body;
use crate::model::subscription::subscription_resource;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::Value;

type Conn = Option<Extension<ConnInfo>>;

pub(super) async fn put(
    State(s): State<AppState>,
    Path((topic, name)): Path<(String, String)>,
    conn: Conn,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    require_json(&headers)?;
    let bytes = read_body(
        &headers,
        body,
        s.broker.config().broker.max_request_body_bytes,
    )
    .await?;
    let body = parse_body(&bytes)?;
    let sub = s
        .broker
        .manage(move |b| b.put_subscription(&topic, &name, body))
        .await?;
    Ok(Json(subscription_resource(
        &sub,
        &s.resource_context(&headers, conn.as_ref().map(|c| &c.0)),
    )))
}

pub(super) async fn get(
    State(s): State<AppState>,
    Path((topic, name)): Path<(String, String)>,
    conn: Conn,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    s.broker
        .topic(&topic)
        .ok_or_else(|| BrokerError::topic_not_found(&topic))?;
    let sub = s
        .broker
        .subscription(&topic, &name)
        .ok_or_else(|| BrokerError::subscription_not_found(&topic, &name))?;
    let mut v = subscription_resource(
        &sub.config().sub,
        &s.resource_context(&headers, conn.as_ref().map(|c| &c.0)),
    );
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
    let entry = s
        .broker
        .topic(&topic)
        .ok_or_else(|| BrokerError::topic_not_found(&topic))?;
    let ctx = s.resource_context(&headers, conn.as_ref().map(|c| &c.0));
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
