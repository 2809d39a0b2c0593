//! The spans of a delivery: `deliver`, one per attempt (a child of the context the batch's first
//! event travels in; the batch's other traces as links), and `settle`, what the attempt's
//! outcome did to the batch (a child of `deliver`). Built only when the tracer is on; with it
//! off, each event's context is passed to the destination unchanged.

use super::payload::{first_trace, Pending};
use super::queue::Batch;
use super::retry::DropReason;
use super::sink::{FailureKind, OnwardTrace, Outcome};
use super::state::SubConfig;
use crate::telemetry::{now_ns, Link, SpanData, SpanKind, Status, TraceContext, Tracer, Value};
use std::sync::Arc;
use std::time::Duration;

/// Event ids on one span at most.
const MAX_IDS: usize = 100;

/// The ids of `items` for a span (`telemetry__eventIdsOnSpans`), at most [`MAX_IDS`].
pub(super) fn event_ids(items: &[Pending]) -> Vec<Arc<str>> {
    items
        .iter()
        .take(MAX_IDS)
        .map(|p| Arc::from(&*p.event.id))
        .collect()
}

/// The ids of `items` as a span attribute: `messaging.message.id` for one event,
/// `gridlet.event_ids` for more.
pub(super) fn ids_attribute(items: &[Pending]) -> (&'static str, Value) {
    let ids = event_ids(items);
    if let [one] = ids.as_slice() {
        return ("messaging.message.id", one.clone().into());
    }
    ("gridlet.event_ids", Value::StrList(ids))
}

/// A `deliver` span in progress.
pub(super) struct DeliverSpan {
    pub ctx: TraceContext,
    parent_span_id: u64,
    start_ns: u64,
    links: Vec<Link>,
    attributes: Vec<(&'static str, Value)>,
}

/// The `deliver` span of an attempt about to start (tracer on), and what goes onward (none
/// when no event carries a context and the tracer is off).
pub(super) fn start(
    tracer: &Tracer,
    cfg: &SubConfig,
    topic: &Arc<str>,
    subscription: &Arc<str>,
    batch: &Batch,
    attempt: u32,
) -> (OnwardTrace, Option<Box<DeliverSpan>>) {
    let first = batch.items.iter().find_map(|p| p.event.trace.as_deref());
    if !tracer.enabled() {
        // Per event only when the batch's events travel in different contexts.
        let mixed = first.is_some()
            && batch
                .items
                .iter()
                .any(|p| p.event.trace.as_deref() != first);
        let request = first.cloned();
        let onward = match mixed {
            true => OnwardTrace::per_event(
                request,
                batch
                    .items
                    .iter()
                    .map(|p| p.event.trace.as_deref().cloned())
                    .collect(),
            ),
            false => OnwardTrace::whole(request),
        };
        return (onward, None);
    }
    let Some(ctx) = tracer.start(first) else {
        return (OnwardTrace::default(), None);
    };
    let mut links: Vec<Link> = Vec::new();
    // Every event in the request's trace (the usual case): no per-event list, nothing built.
    let mixed = batch.items.iter().any(|p| {
        p.event
            .trace
            .as_deref()
            .is_some_and(|t| t.trace_id != ctx.trace_id)
    });
    let events: Vec<Option<TraceContext>> = match mixed {
        false => Vec::new(),
        true => batch
            .items
            .iter()
            .map(|p| match p.event.trace.as_deref() {
                Some(t) if t.trace_id != ctx.trace_id => {
                    Link::add(&mut links, ctx.trace_id, t);
                    Some(t.clone())
                }
                _ => Some(ctx.clone()),
            })
            .collect(),
    };
    if !ctx.sampled() {
        // Not recorded: the context goes onward, nothing else is built.
        return (OnwardTrace::per_event(Some(ctx), events), None);
    }
    let dest = &cfg.sub.destination;
    let mut attributes: Vec<(&'static str, Value)> = Vec::with_capacity(14);
    attributes.push(("messaging.system", "eventgrid".into()));
    attributes.push(("messaging.operation.name", "deliver".into()));
    attributes.push(("messaging.operation.type", "send".into()));
    attributes.push(("messaging.destination.name", topic.clone().into()));
    attributes.push((
        "messaging.destination.subscription.name",
        subscription.clone().into(),
    ));
    attributes.push((
        "messaging.batch.message_count",
        (batch.items.len() as u64).into(),
    ));
    attributes.push(("gridlet.destination.type", dest.endpoint_type().into()));
    if let Some(host) = dest
        .url()
        .and_then(|u| url::Url::parse(u).ok())
        .and_then(|u| u.host_str().map(str::to_string))
    {
        attributes.push(("server.address", host.into()));
    }
    attributes.push(("gridlet.delivery.attempt", attempt.into()));
    attributes.push((
        "http.request.resend_count",
        attempt.saturating_sub(1).into(),
    ));
    attributes.push(("gridlet.retry_lane", batch.retry.into()));
    if tracer.event_ids() {
        attributes.push(ids_attribute(&batch.items));
    }
    let span = DeliverSpan {
        parent_span_id: first.map_or(0, |f| f.span_id),
        ctx: ctx.clone(),
        start_ns: now_ns(),
        links,
        attributes,
    };
    (
        OnwardTrace::per_event(Some(ctx), events),
        Some(Box::new(span)),
    )
}

/// Record the `deliver` span with the attempt's outcome; answers its context (the `settle`
/// span's parent).
pub(super) fn finish_deliver(
    tracer: &Tracer,
    span: DeliverSpan,
    outcome: &Outcome,
) -> TraceContext {
    let DeliverSpan {
        ctx,
        parent_span_id,
        start_ns,
        links,
        mut attributes,
    } = span;
    // Events reported apart: the attempt's span tells the batch's summary.
    let outcome = match outcome {
        Outcome::PerEvent(_) => outcome.summary(),
        o => o,
    };
    let status = match outcome {
        Outcome::Delivered => {
            attributes.push(("gridlet.outcome", "delivered".into()));
            Status::Unset
        }
        Outcome::PerEvent(_) => {
            attributes.push(("gridlet.outcome", "mixed".into()));
            Status::Unset
        }
        Outcome::Failed { kind, retry_after } => {
            let (error_type, code) = match kind {
                FailureKind::Status(s) | FailureKind::Service { status: s, .. } => {
                    (s.to_string(), Some(*s))
                }
                FailureKind::TooLarge(_) => ("too_large".to_string(), None),
                FailureKind::Refused { status, .. } => ("refused".to_string(), *status),
                FailureKind::Throttled { status, .. } => ("throttled".to_string(), Some(*status)),
                FailureKind::Timeout => ("timeout".to_string(), None),
                FailureKind::Connect => ("connect".to_string(), None),
                FailureKind::Unsupported(_) => ("unsupported".to_string(), None),
                FailureKind::Other(_) => ("_OTHER".to_string(), None),
                FailureKind::CredentialExpired(_) => ("credential_expired".to_string(), None),
            };
            if let Some(c) = code {
                attributes.push(("http.response.status_code", u32::from(c).into()));
            }
            if let Some(r) = retry_after {
                attributes.push(("gridlet.retry_after_ms", (r.as_millis() as u64).into()));
            }
            attributes.push(("gridlet.outcome", "failed".into()));
            attributes.push(("error.type", error_type.into()));
            Status::Error(kind.to_string())
        }
    };
    let sampled = ctx.sampled();
    tracer.record(
        SpanData {
            trace_id: ctx.trace_id,
            span_id: ctx.span_id,
            parent_span_id,
            trace_state: ctx.state.clone(),
            name: "deliver",
            kind: SpanKind::Client,
            start_ns,
            end_ns: now_ns(),
            attributes,
            links,
            status,
        },
        sampled,
    );
    ctx
}

/// What settling an attempt did to its batch.
#[derive(Debug, Default)]
pub(super) struct Settled {
    /// Acknowledged and removed.
    pub acked: usize,
    /// Scheduled for another attempt after this delay.
    pub retried: usize,
    pub delay: Duration,
    /// Dead-lettered, by reason.
    pub dropped: Vec<(DropReason, usize)>,
}

/// Record the `settle` span of an attempt (a child of its `deliver` span).
pub(super) fn settle_span(
    tracer: &Tracer,
    deliver: &TraceContext,
    start_ns: u64,
    now_ms: u64,
    s: &Settled,
) {
    let mut d = SpanData {
        trace_id: deliver.trace_id,
        span_id: match tracer.start(Some(deliver)) {
            Some(c) => c.span_id,
            None => return,
        },
        parent_span_id: deliver.span_id,
        trace_state: deliver.state.clone(),
        name: "settle",
        kind: SpanKind::Internal,
        start_ns,
        end_ns: now_ns(),
        attributes: Vec::with_capacity(6),
        links: Vec::new(),
        status: Status::Unset,
    };
    let outcome = match (s.acked > 0, s.retried > 0, !s.dropped.is_empty()) {
        (true, false, false) => "ack",
        (false, true, false) => "retry",
        (false, false, true) => "dead_letter",
        _ => "mixed",
    };
    d.attr("gridlet.settle.outcome", outcome);
    if s.acked > 0 {
        d.attr("gridlet.settle.acked", s.acked as u64);
    }
    if s.retried > 0 {
        d.attr("gridlet.settle.retried", s.retried as u64);
        d.attr("gridlet.retry.delay_ms", s.delay.as_millis() as u64);
        d.attr(
            "gridlet.retry.due_unix_ms",
            now_ms + s.delay.as_millis() as u64,
        );
    }
    if !s.dropped.is_empty() {
        let n: usize = s.dropped.iter().map(|(_, n)| n).sum();
        d.attr("gridlet.settle.dead_lettered", n as u64);
        let reasons: Vec<Arc<str>> = s
            .dropped
            .iter()
            .map(|(r, _)| Arc::from(r.as_str()))
            .collect();
        d.attr("gridlet.dead_letter.reason", Value::StrList(reasons));
        d.status = Status::Error("dead-lettered".into());
    }
    tracer.record(d, deliver.sampled());
}

/// The `settle` span of events dead-lettered without an attempt deciding it (time to live
/// passed while waiting, a full queue under `queueFullPolicy=deadLetter`): a child of the
/// context the first of them travels in, the others' traces linked.
pub(super) fn dropped_span(tracer: &Tracer, items: &[Pending], reason: DropReason) {
    if !tracer.enabled() {
        return;
    }
    let parent = first_trace(items);
    let Some(ctx) = tracer.start(parent) else {
        return;
    };
    let mut links: Vec<Link> = Vec::new();
    for t in items.iter().filter_map(|p| p.event.trace.as_deref()) {
        Link::add(&mut links, ctx.trace_id, t);
    }
    let now = now_ns();
    let mut d = SpanData {
        trace_id: ctx.trace_id,
        span_id: ctx.span_id,
        parent_span_id: parent.map_or(0, |p| p.span_id),
        trace_state: ctx.state.clone(),
        name: "settle",
        kind: SpanKind::Internal,
        start_ns: now,
        end_ns: now,
        attributes: Vec::with_capacity(4),
        links,
        status: Status::Error("dead-lettered".into()),
    };
    d.attr("gridlet.settle.outcome", "dead_letter");
    d.attr("gridlet.settle.dead_lettered", items.len() as u64);
    d.attr(
        "gridlet.dead_letter.reason",
        Value::StrList(vec![Arc::from(reason.as_str())]),
    );
    if tracer.event_ids() {
        d.attr("gridlet.event_ids", Value::StrList(event_ids(items)));
    }
    tracer.record(d, ctx.sampled());
}
