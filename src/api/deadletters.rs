//! Dead letters and endpoint health of a subscription, in the API's style:
//!
//! | method | route (all under `/topics/{topic}/eventSubscriptions/{sub}`) | does |
//! |---|---|---|
//! | GET | `/deadLetters?after=<id>&top=<n>` | list, oldest first (`top` ≤ 1000, default 100) |
//! | POST | `/deadLetters/replay` (body optional: `{"ids": ["3", "4"]}`) | re-enqueue, fresh attempts and TTL |
//! | POST | `/deadLetters/{id}/replay` | re-enqueue one |
//! | DELETE | `/deadLetters` (body optional: `{"ids": [...]}`) | discard |
//! | GET | `/endpointHealth` | the destination's health |
//! | POST | `/endpointHealth/enable` | re-enable a disabled or frozen destination |

use super::{query_param, read_json, AppState};
use crate::delivery::health::HealthSnapshot;
use crate::error::ApiError;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::Json;
use serde_json::{json, Value};

/// Default page size.
const DEFAULT_TOP: usize = 100;

fn bad_query(name: &str) -> ApiError {
    ApiError::bad_request(
        "InvalidRequest",
        format!("query parameter {name} must be a whole number"),
    )
}

fn dead_letter_not_found(id: &str) -> ApiError {
    ApiError::not_found(
        "DeadLetterNotFound",
        format!("dead letter '{id}' does not exist"),
    )
}

pub(super) async fn list(
    State(s): State<AppState>,
    Path((topic, name)): Path<(String, String)>,
    RawQuery(q): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let q = q.unwrap_or_default();
    let after = match query_param(&q, "after") {
        Some(v) => v.parse::<u64>().map_err(|_| bad_query("after"))?,
        None => 0,
    };
    let top = match query_param(&q, "top").or(query_param(&q, "$top")) {
        Some(v) => v.parse::<usize>().map_err(|_| bad_query("top"))?,
        None => DEFAULT_TOP,
    };
    // The page the store returns is at most MAX_PAGE: a larger `top` is cut to it here, so a
    // full page still points to the next.
    let top = top.clamp(1, crate::broker::MAX_PAGE);
    let letters = s
        .broker
        .manage(move |b| b.dead_letters(&topic, &name, after, top))
        .await?;
    let next = if letters.len() >= top {
        letters.last().map(|l| l.id.to_string())
    } else {
        None
    };
    Ok(Json(json!({
        "value": letters.iter().map(|l| l.to_json()).collect::<Vec<_>>(),
        "nextAfter": next,
    })))
}

/// `{"ids": ["1", 2]}` → ids; no body or no `ids` → `None` (all).
async fn ids_from_body(
    s: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Option<Vec<u64>>, ApiError> {
    let v = read_json(s, headers, body).await?;
    let Some(ids) = v.get("ids").or(v.get("Ids")) else {
        return Ok(None);
    };
    let bad = || ApiError::bad_request("InvalidRequest", "ids must be an array of dead-letter ids");
    let arr = ids.as_array().ok_or_else(bad)?;
    arr.iter()
        .map(|i| match i {
            Value::String(s) => s.trim().parse::<u64>().ok(),
            Value::Number(n) => n.as_u64(),
            _ => None,
        })
        .collect::<Option<Vec<u64>>>()
        .map(Some)
        .ok_or_else(bad)
}

pub(super) async fn replay(
    State(s): State<AppState>,
    Path((topic, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let ids = ids_from_body(&s, &headers, body).await?;
    let n = s.broker.replay_dead_letters(&topic, &name, ids).await?;
    Ok(Json(json!({ "replayed": n })))
}

pub(super) async fn replay_one(
    State(s): State<AppState>,
    Path((topic, name, id)): Path<(String, String, String)>,
) -> Result<Json<Value>, ApiError> {
    let id = id.parse::<u64>().map_err(|_| dead_letter_not_found(&id))?;
    let n = s
        .broker
        .replay_dead_letters(&topic, &name, Some(vec![id]))
        .await?;
    if n == 0 {
        return Err(dead_letter_not_found(&id.to_string()));
    }
    Ok(Json(json!({ "replayed": n })))
}

pub(super) async fn purge(
    State(s): State<AppState>,
    Path((topic, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let ids = ids_from_body(&s, &headers, body).await?;
    let n = s
        .broker
        .manage(move |b| b.purge_dead_letters(&topic, &name, ids.as_deref()))
        .await?;
    Ok(Json(json!({ "deleted": n })))
}

/// The health object shown in the subscription GET and the health routes.
pub fn health_json(h: &HealthSnapshot) -> Value {
    json!({
        "state": h.state.as_str(),
        "consecutiveFailures": h.consecutive_failures,
        "failureRate": (h.failure_rate * 1000.0).round() / 1000.0,
        "recentAttempts": h.window_attempts,
        "lastSuccessTime": crate::delivery::deadletter::rfc3339(h.last_success_ms),
        "nextProbeTime": h.next_probe_ms.map(crate::delivery::deadletter::rfc3339),
    })
}

pub(super) async fn health(
    State(s): State<AppState>,
    Path((topic, name)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let sub = s.broker.find_subscription(&topic, &name)?;
    Ok(Json(
        sub.endpoint_health()
            .map_or(Value::Null, |h| health_json(&h)),
    ))
}

pub(super) async fn enable(
    State(s): State<AppState>,
    Path((topic, name)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let h = s
        .broker
        .manage(move |b| b.enable_endpoint(&topic, &name))
        .await?;
    Ok(Json(health_json(&h)))
}
