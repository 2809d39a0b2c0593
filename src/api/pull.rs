//! Event Grid namespaces' data plane: `POST /topics/{topic}:publish` and
//! `POST /topics/{topic}/eventsubscriptions/{subscription}:{receive|acknowledge|release|reject|renewLock}`
//! (api-version `2023-11-01` or `2024-06-01`, checked by [`super::Guard`]).
//!
//! The router cannot match a parameter followed by `:operation` within one path segment, so
//! these routes are the segment-wide ones (`/topics/{topic}`, `.../{subscription}`) for POST,
//! and the operation is split off here.

use super::long_poll::ConnYield;
use super::{auth, read_body, AppState};
use crate::delivery::pull::{Received, TokenResults, RELEASE_DELAYS};
use crate::error::ApiError;
use crate::model::json::parse_body;
use crate::model::media;
use crate::model::topic::EventSchema;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::future::pending;
use std::sync::Arc;
use std::time::Duration;

/// Most events one receive may ask for (`maxEvents`).
pub const MAX_EVENTS: u64 = 100;
/// Longest long poll (`maxWaitTime`, seconds).
pub const MAX_WAIT_SECONDS: u64 = 120;
/// Default long poll.
const DEFAULT_WAIT_SECONDS: u64 = 60;
/// Most lock tokens one settle request may carry.
pub const MAX_LOCK_TOKENS: usize = 1000;
/// Whitespace allowed around each token of a settle body (a pretty-printer's newline and
/// indentation, with room to spare).
const TOKEN_SLACK: usize = 16;
/// The body limit of the settle routes (`:acknowledge`, `:release`, `:reject`, `:renewLock`):
/// [`MAX_LOCK_TOKENS`] tokens, each quoted, followed by a comma and [`TOKEN_SLACK`] bytes of
/// whitespace, inside a 1 KiB envelope; 63,024 bytes. Not `broker__maxRequestBodyBytes`
/// (1 MiB): a settle body has no use for more, and slow bodies of that size would fill
/// `inbound__maxBodyBytesInFlight` for publishers (issue 37, finding 7).
pub const SETTLE_BODY_LIMIT: usize =
    1024 + MAX_LOCK_TOKENS * (crate::delivery::lock_token::TOKEN_LEN + 2 + 1 + TOKEN_SLACK);

fn no_route() -> ApiError {
    ApiError::not_found("NotFound", "no such route")
}

/// `POST /topics/{topic}:publish`.
pub(super) async fn topic_post(
    State(s): State<AppState>,
    Path(raw): Path<String>,
    req: Request,
) -> Response {
    let Some(topic) = raw.strip_suffix(":publish") else {
        return no_route().into_response();
    };
    let (parts, body) = req.into_parts();
    let published = async {
        check_publish(&s, topic, &parts.headers)?;
        super::events::publish_request(s.clone(), topic.to_string(), None, parts.headers, body)
            .await
    };
    match published.await {
        // Event Grid answers a publish with an empty JSON object.
        Ok(()) => json_response(StatusCode::OK, b"{}".to_vec()),
        Err(e) => e.namespaces_response(true),
    }
}

/// A namespace publish carries CloudEvents to a CloudEvents topic: one or a batch in structured
/// mode, or one in binary mode (attributes in `ce-*` headers, the body its data, of any media
/// type), as the CloudEvents HTTP binding defines and the JS client sends with `binaryMode`.
fn check_publish(s: &AppState, topic: &str, headers: &HeaderMap) -> Result<(), ApiError> {
    let entry = s.broker.find_topic(topic)?;
    let schema = entry.topic().input_schema;
    if schema != EventSchema::CloudEventV1_0 {
        return Err(ApiError::bad_request(
            "InvalidSchema",
            format!(
                "topic '{topic}' takes {}: :publish carries CloudEvents only (publish to /topics/{topic}/events instead)",
                schema.as_str()
            ),
        ));
    }
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(media::essence)
        .unwrap_or_default();
    let binary = headers.contains_key("ce-specversion");
    if !binary && ct != "application/cloudevents+json" && ct != "application/cloudevents-batch+json"
    {
        return Err(ApiError::unsupported_media_type(format!(
            "Content-Type '{ct}' is not supported on :publish; use application/cloudevents+json (one event), application/cloudevents-batch+json (a batch), or binary mode (ce-* headers, the data as the body)"
        )));
    }
    Ok(())
}

/// The queue operations, by the name after the `:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Receive,
    Acknowledge,
    Release,
    Reject,
    RenewLock,
}

impl Op {
    fn parse(s: &str) -> Option<Self> {
        [
            ("receive", Self::Receive),
            ("acknowledge", Self::Acknowledge),
            ("release", Self::Release),
            ("reject", Self::Reject),
            ("renewLock", Self::RenewLock),
        ]
        .into_iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(s))
        .map(|(_, op)| op)
    }
}

/// `POST /topics/{topic}/eventsubscriptions/{subscription}:{operation}`.
pub(super) async fn subscription_post(
    State(s): State<AppState>,
    Path((topic, raw)): Path<(String, String)>,
    req: Request,
) -> Response {
    match subscription_op(s, &topic, &raw, req).await {
        Ok(r) => r,
        Err(e) => e.namespaces_response(false),
    }
}

async fn subscription_op(
    s: AppState,
    topic: &str,
    raw: &str,
    req: Request,
) -> Result<Response, ApiError> {
    let Some((name, op)) = raw.rsplit_once(':') else {
        return Err(no_route());
    };
    let op = Op::parse(op).ok_or_else(no_route)?;
    let (parts, body) = req.into_parts();
    let query = parts.uri.query().unwrap_or("");
    let handle = s.broker.find_subscription(topic, name)?;
    // The caller's context, linked from the operation's span (read only when recorded).
    let caller = match s.broker.tracer().enabled() {
        true => super::events::header_trace(&parts.headers),
        false => None,
    };
    let puller = handle
        .pull()
        .ok_or_else(|| ApiError::from(crate::delivery::pull::PullError::NotQueue))?
        .traced_by(caller.as_ref());
    if op == Op::Receive {
        let max = int_param(query, "maxEvents", 1, 1, MAX_EVENTS)?;
        let wait = int_param(
            query,
            "maxWaitTime",
            DEFAULT_WAIT_SECONDS,
            0,
            MAX_WAIT_SECONDS,
        )?;
        if wait == 0 {
            let got = puller
                .receive_until(max as usize, Duration::ZERO, pending())
                .await?;
            return Ok(json_response(StatusCode::OK, receive_body(&got)));
        }
        // A long poll: within its caps, and ended early when the connection table needs the
        // slot (then its connection closes after the answer).
        let cfg = &s.broker.config().inbound;
        let credential = auth::credential(cfg, &parts.headers, parts.extensions.get());
        let _seat = s.long_polls.seat(topic, name, credential)?;
        let conn = parts.extensions.get::<Arc<ConnYield>>().cloned();
        let ended = async {
            match &conn {
                Some(c) => c.ended().await,
                None => pending().await,
            }
        };
        let got = puller
            .receive_until(max as usize, Duration::from_secs(wait), ended)
            .await?;
        let mut r = json_response(StatusCode::OK, receive_body(&got));
        if conn.is_some_and(|c| c.was_ended()) {
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        return Ok(r);
    }
    let delay = match op {
        Op::Release => release_delay(query)?,
        _ => Duration::ZERO,
    };
    let tokens = lock_tokens(&s, &parts.headers, body).await?;
    let settled = match op {
        Op::Acknowledge => puller.acknowledge(&tokens).await?,
        Op::Release => puller.release(&tokens, delay).await?,
        Op::Reject => puller.reject(&tokens).await?,
        Op::RenewLock | Op::Receive => puller.renew(&tokens)?,
    };
    Ok(json_response(StatusCode::OK, results_body(&settled)))
}

/// `name` from the query as a whole number in `min..=max` (fractions are cut, as the SDKs'
/// docs say); `default` when absent.
fn int_param(query: &str, name: &str, default: u64, min: u64, max: u64) -> Result<u64, ApiError> {
    let Some(v) = super::query_param(query, name) else {
        return Ok(default);
    };
    let n = v
        .parse::<f64>()
        .ok()
        .filter(|f| f.is_finite() && *f >= 0.0)
        .map(|f| f as u64);
    match n {
        Some(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(ApiError::bad_request(
            "InvalidQueryParameter",
            format!("{name} must be a whole number from {min} to {max} (got '{v}')"),
        )),
    }
}

fn release_delay(query: &str) -> Result<Duration, ApiError> {
    let Some(v) = super::query_param(query, "releaseDelayInSeconds") else {
        return Ok(Duration::ZERO);
    };
    match v.parse::<u64>() {
        Ok(n) if RELEASE_DELAYS.contains(&n) => Ok(Duration::from_secs(n)),
        _ => Err(ApiError::bad_request(
            "InvalidQueryParameter",
            format!("releaseDelayInSeconds must be one of 0, 10, 60, 600, 3600 (got '{v}')"),
        )),
    }
}

/// The body `{"lockTokens": ["…", …]}`: 1 to [`MAX_LOCK_TOKENS`] strings, within
/// [`SETTLE_BODY_LIMIT`] bytes (413 above it).
async fn lock_tokens(
    s: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Vec<String>, ApiError> {
    let bytes = read_body(headers, body, SETTLE_BODY_LIMIT, &s.bodies).await?;
    let v = parse_body(&bytes)?;
    let bad = |m: &str| ApiError::bad_request("InvalidLockTokens", m.to_string());
    let arr = v
        .as_object()
        .and_then(|o| o.iter().find(|(k, _)| k.eq_ignore_ascii_case("lockTokens")))
        .and_then(|(_, v)| v.as_array())
        .ok_or_else(|| bad("the body must be {\"lockTokens\": [\"<lock token>\", ...]}"))?;
    if arr.is_empty() || arr.len() > MAX_LOCK_TOKENS {
        return Err(bad(&format!(
            "lockTokens must hold 1 to {MAX_LOCK_TOKENS} lock tokens"
        )));
    }
    arr.iter()
        .map(|t| t.as_str().map(str::to_string))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| bad("every lock token must be a string"))
}

/// `{"value":[{"brokerProperties":{"lockToken":…,"deliveryCount":…},"event":…}]}`, the events
/// as they were published (copied, not re-encoded).
fn receive_body(got: &[Received]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + got.iter().map(|r| r.body.len() + 96).sum::<usize>());
    out.extend_from_slice(b"{\"value\":[");
    for (i, r) in got.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        // A lock token is base64url: nothing in it needs escaping.
        out.extend_from_slice(b"{\"brokerProperties\":{\"lockToken\":\"");
        out.extend_from_slice(r.lock_token.as_bytes());
        out.extend_from_slice(
            format!("\",\"deliveryCount\":{}}},\"event\":", r.delivery_count).as_bytes(),
        );
        out.extend_from_slice(&r.body);
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
    out
}

fn results_body(s: &TokenResults) -> Vec<u8> {
    let failed: Vec<Value> = s
        .failed
        .iter()
        .map(|(t, f)| json!({"lockToken": t, "error": {"code": f.code(), "message": f.message()}}))
        .collect();
    json!({"failedLockTokens": failed, "succeededLockTokens": s.succeeded})
        .to_string()
        .into_bytes()
}

fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    let mut r = (status, body).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    r
}
