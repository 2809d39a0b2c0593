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

/// Longest a tail poll waits for an event.
const TAIL_MAX_WAIT_SECS: u64 = 25;

/// `GET /topics/{topic}/tail?after=<n>&wait=<s>&filter=<json>`: a sample of the events published
/// to the topic after position `after` (none: from now on), waiting up to `wait` seconds
/// (default and most 25) for one; `filter` is a subscription's `filter` object, URL-encoded
/// ([`crate::broker::tail`]).
pub(super) async fn tail(
    State(s): State<AppState>,
    Path(name): Path<String>,
    axum::extract::RawQuery(q): axum::extract::RawQuery,
) -> Result<Json<Value>, ApiError> {
    let q = q.unwrap_or_default();
    let bad = |what: &str| ApiError::bad_request("InvalidRequest", what.to_string());
    let after = match super::query_param(&q, "after") {
        Some(v) => Some(
            v.parse::<u64>()
                .map_err(|_| bad("query parameter after must be a whole number"))?,
        ),
        None => None,
    };
    let wait = match super::query_param(&q, "wait") {
        Some(v) => v
            .parse::<u64>()
            .map_err(|_| bad("query parameter wait must be a whole number of seconds"))?,
        None => TAIL_MAX_WAIT_SECS,
    }
    .min(TAIL_MAX_WAIT_SECS);
    let filter = match super::query_param(&q, "filter").filter(|f| !f.is_empty()) {
        Some(f) => {
            let text = percent_encoding::percent_decode_str(f)
                .decode_utf8()
                .map_err(|_| bad("query parameter filter must be URL-encoded UTF-8"))?;
            let v: Value = serde_json::from_str(&text)
                .map_err(|_| bad("query parameter filter must be a JSON object"))?;
            let lowered = crate::model::json::lower_keys(v);
            let obj = crate::model::json::Obj::new(&lowered, "filter")?;
            let max = s.broker.config().api.max_included_event_types;
            Some(crate::model::filter::Filter::parse(&obj, max)?)
        }
        None => None,
    };
    let entry = s.broker.find_topic(&name)?;
    let now = s.broker.now_ms();
    let poll = entry.tail.poll(
        after,
        filter.as_ref(),
        std::time::Duration::from_secs(wait),
        now,
    );
    let mut stopping = s.stopping.clone();
    let page = tokio::select! {
        page = poll => page,
        // gridlet is stopping: answer now (nothing new), so the poll does not hold the
        // listeners' graceful close for its whole wait.
        _ = stopping.wait_for(|stop| *stop) => crate::broker::tail::TailPage {
            next: after.unwrap_or(0),
            ..Default::default()
        },
    };
    let events: Vec<Value> = page
        .events
        .iter()
        .map(|e| {
            json!({
                "seq": e.seq,
                "time": crate::delivery::deadletter::rfc3339(e.at_ms),
                "id": e.id,
                "subject": e.subject,
                "eventType": e.event_type,
                "body": String::from_utf8_lossy(&e.body),
                "truncated": e.truncated,
            })
        })
        .collect();
    Ok(Json(json!({
        "events": events,
        "next": page.next,
        "missed": page.missed,
    })))
}
