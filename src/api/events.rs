//! Publishing: `POST /topics/{topic}/events` and `POST /topics/{topic}/events/{eventId}`.

use super::{read_body, AppState};
use crate::error::ApiError;
use crate::model::event::{self, IncomingEvent, PublishInput};
use crate::telemetry::{now_ns, Link, SpanData, SpanKind, Status, TraceContext, Tracer};
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
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

pub(super) async fn run(
    s: AppState,
    topic: String,
    single_id: Option<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match publish_request(s, topic, single_id, headers, body).await {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => e.into_response(),
    }
}

/// One publish request, counted in the topic's metrics and traced; the error is the caller's to
/// render (the namespaces routes answer some of them differently: `api/pull.rs`).
pub(super) async fn publish_request(
    s: AppState,
    topic: String,
    single_id: Option<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<(), ApiError> {
    let started = Instant::now();
    let mut trace = PublishTrace::start(s.broker.tracer(), &headers);
    let entry = s.broker.find_topic(&topic)?;
    let result = async {
        let limits = &s.broker.config().broker;
        let bytes = read_body(&headers, body, limits.max_request_body_bytes, &s.bodies).await?;
        trace.bytes = bytes.len();
        let t = entry.topic();
        let mut events = event::parse(&PublishInput {
            schema: t.input_schema,
            topic: &t.name,
            headers: &headers,
            body: &bytes,
            single_id: single_id.as_deref(),
            max_events: limits.max_events_per_request,
        })?;
        trace.assign(&mut events);
        s.broker
            .publish(&entry, events, trace.span.as_ref())
            .await?;
        Ok::<(), ApiError>(())
    }
    .await;
    let response = match result {
        Ok(()) => {
            entry.metrics.success_requests.inc();
            entry
                .metrics
                .success_request_latency_ms
                .observe_ms(started.elapsed().as_millis() as u64);
            trace.finish(&topic, StatusCode::OK, None);
            return Ok(());
        }
        Err(e) => {
            if e.is_user_error() {
                entry.metrics.user_error_requests.inc();
            } else {
                entry.metrics.system_error_requests.inc();
            }
            e
        }
    };
    trace.finish(&topic, response.status, Some(&response));
    Err(response)
}

/// The `publish` span of one request, and the trace context its events travel in.
///
/// Parent: the request's `traceparent` header, else the first event's CloudEvents
/// `traceparent` attribute (Event Grid's own schema defines no trace field: the header is the
/// only source there). Every event that carries no context of another trace travels in the
/// `publish` span's; with the tracer off, in the header's (passed on unchanged).
struct PublishTrace<'a> {
    tracer: &'a Tracer,
    /// The request's `traceparent` / `tracestate` headers.
    header: Option<TraceContext>,
    /// The publisher's span (the `publish` span's parent).
    parent: Option<TraceContext>,
    /// The `publish` span (tracer on).
    span: Option<TraceContext>,
    start_ns: u64,
    bytes: usize,
    events: usize,
    ids: Vec<Arc<str>>,
    links: Vec<Link>,
}

/// Event ids on a span at most (the attribute is for finding one event, not for bulk).
const MAX_IDS_ON_SPAN: usize = 100;
/// W3C trace context headers, named once (a lookup by `&str` parses the name each time).
static TRACEPARENT: axum::http::HeaderName = axum::http::HeaderName::from_static("traceparent");
static TRACESTATE: axum::http::HeaderName = axum::http::HeaderName::from_static("tracestate");

/// The request's W3C trace context (`traceparent` / `tracestate` headers), if valid.
pub(super) fn header_trace(headers: &HeaderMap) -> Option<TraceContext> {
    let tp = headers.get(&TRACEPARENT)?.to_str().ok()?;
    let state = headers.get(&TRACESTATE).and_then(|v| v.to_str().ok());
    TraceContext::parse(tp, state)
}

impl<'a> PublishTrace<'a> {
    fn start(tracer: &'a Tracer, headers: &HeaderMap) -> Self {
        Self {
            tracer,
            header: header_trace(headers),
            parent: None,
            span: None,
            start_ns: if tracer.enabled() { now_ns() } else { 0 },
            bytes: 0,
            events: 0,
            ids: Vec::new(),
            links: Vec::new(),
        }
    }

    /// Decide the `publish` span and the context each event travels in.
    fn assign(&mut self, events: &mut [IncomingEvent]) {
        self.events = events.len();
        if !self.tracer.enabled() {
            // Nothing recorded: pass the publisher's context on unchanged.
            if let Some(h) = &self.header {
                let shared = Arc::new(h.clone());
                for ev in events.iter_mut().filter(|e| e.trace.is_none()) {
                    ev.trace = Some(shared.clone());
                }
            }
            return;
        }
        self.parent = self
            .header
            .clone()
            .or_else(|| events.first().and_then(|e| e.trace.as_deref().cloned()));
        let Some(span) = self.tracer.start(self.parent.as_ref()) else {
            return;
        };
        let shared = Arc::new(span.clone());
        for ev in events.iter_mut() {
            match &ev.trace {
                Some(own) if own.trace_id != span.trace_id => {
                    Link::add(&mut self.links, span.trace_id, own);
                }
                _ => ev.trace = Some(shared.clone()),
            }
        }
        if self.tracer.event_ids() && span.sampled() {
            self.ids = events
                .iter()
                .take(MAX_IDS_ON_SPAN)
                .map(|e| Arc::from(e.id.as_str()))
                .collect();
        }
        self.span = Some(span);
    }

    /// Record the span (when the request got as far as one) with the request's answer.
    fn finish(self, topic: &str, status: StatusCode, error: Option<&ApiError>) {
        let span = match self.span {
            Some(s) => s,
            // Refused before its events were read (unknown topic, body, invalid events): a
            // span all the same, so a publisher's trace shows why.
            None => match self.tracer.start(self.header.as_ref()) {
                Some(s) => s,
                None => return,
            },
        };
        if !span.sampled() {
            return;
        }
        let parent = self.parent.as_ref().or(self.header.as_ref());
        let mut d = SpanData {
            trace_id: span.trace_id,
            span_id: span.span_id,
            parent_span_id: parent.map_or(0, |p| p.span_id),
            trace_state: span.state.clone(),
            name: "publish",
            kind: SpanKind::Server,
            start_ns: self.start_ns,
            end_ns: now_ns(),
            attributes: Vec::with_capacity(12),
            links: self.links,
            status: match error {
                Some(e) => Status::Error(format!("{}: {}", e.detail, e.message)),
                None => Status::Unset,
            },
        };
        d.attr("messaging.system", "eventgrid");
        d.attr("messaging.operation.name", "publish");
        d.attr("messaging.destination.name", topic);
        d.attr("messaging.batch.message_count", self.events as u64);
        d.attr("http.request.method", "POST");
        d.attr("http.route", "/topics/{topic}/events");
        d.attr("http.request.body.size", self.bytes as u64);
        d.attr("http.response.status_code", u32::from(status.as_u16()));
        d.attr("gridlet.outcome", error.map_or("accepted", |e| e.detail));
        if let Some(e) = error {
            d.attr("error.type", e.detail);
        }
        match self.ids.len() {
            0 => {}
            1 => d.attr("messaging.message.id", self.ids[0].clone()),
            _ => d.attr(
                "gridlet.event_ids",
                crate::telemetry::Value::StrList(self.ids),
            ),
        }
        self.tracer.record(d, span.sampled());
    }
}
