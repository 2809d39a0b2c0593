//! `/topics` handlers.

use super::{read_json, AppState, Conn};
use crate::error::ApiError;
use crate::model::topic::{ResourceContext, Topic};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

pub(super) async fn put(
    State(s): State<AppState>,
    Path(name): Path<String>,
    conn: Conn,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let topic = Topic::from_put(&name, read_json(&s, &headers, body).await?)?;
    let topic = s.broker.manage(move |b| b.put_topic(topic)).await?;
    Ok(Json(topic_resource(
        &topic,
        &s.resource_context(&headers, &conn),
    )))
}

pub(super) async fn get(
    State(s): State<AppState>,
    Path(name): Path<String>,
    conn: Conn,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let entry = s.broker.find_topic(&name)?;
    Ok(Json(topic_resource(
        &entry.topic(),
        &s.resource_context(&headers, &conn),
    )))
}

pub(super) async fn list(State(s): State<AppState>, conn: Conn, headers: HeaderMap) -> Json<Value> {
    let ctx = s.resource_context(&headers, &conn);
    Json(Value::Array(
        s.broker
            .topics()
            .iter()
            .map(|t| topic_resource(&t.topic(), &ctx))
            .collect(),
    ))
}

pub(super) async fn delete(
    State(s): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    s.broker.manage(move |b| b.delete_topic(&name)).await?;
    Ok(StatusCode::OK.into_response())
}

/// The topic resource as the API returns it.
fn topic_resource(t: &Topic, ctx: &ResourceContext) -> Value {
    let mut v = json!({
        "id": format!("{}/topics/{}", ctx.id_prefix, t.name),
        "name": t.name,
        "type": "Microsoft.EventGrid/topics",
        "properties": {
            "endpoint": format!("{}/topics/{}/events?api-version={}", ctx.base_url, t.name, super::API_VERSION),
            "inputSchema": t.input_schema.as_str(),
        }
    });
    if let Some(w) = t.dedup_window_secs {
        v["properties"]["deduplicationWindowInSeconds"] = json!(w);
    }
    if let Some(days) = t.event_retention_days {
        v["properties"]["eventRetentionInDays"] = json!(days);
    }
    v
}
