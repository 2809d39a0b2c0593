//! The `receive` span: one per receive that took events (a pull subscription's counterpart of
//! the push `deliver` span, `super::super::trace`).
//!
//! OpenTelemetry's messaging conventions link a receive to each message's creation context,
//! and let a receive of one message be its child. Here, as for `deliver`: the span is a child
//! of the context the first received event travels in (so a trace reads `publish → receive`),
//! and the other events' traces are links. The receiver's own context (its request's
//! `traceparent`) is a link too, so its trace finds the receive; it is the parent only when no
//! event carries a context. With the tracer off nothing here runs: the receive checks one
//! `Option`.

use super::super::payload::{first_trace, Pending};
use super::super::state::SubscriptionState;
use crate::telemetry::{now_ns, Link, SpanData, SpanKind, Status, TraceContext, Tracer, Value};
use std::sync::Arc;

/// Event ids on one span at most.
const MAX_IDS: usize = 100;

/// What a receive knows of its trace before it takes events.
pub(super) struct ReceiveTrace<'a> {
    /// The receiver's context: its request's `traceparent` / `tracestate`.
    caller: Option<&'a TraceContext>,
    /// When the receive began (tracer on), for how long it waited.
    started_ns: u64,
}

impl<'a> ReceiveTrace<'a> {
    /// A receive beginning now, for `caller`.
    pub(super) fn begin(tracer: &Tracer, caller: Option<&'a TraceContext>) -> Self {
        Self {
            caller,
            started_ns: if tracer.enabled() { now_ns() } else { 0 },
        }
    }
}

/// Record the `receive` span of `items`, taken at `taken_ns` and locked for `lock_ms`.
pub(super) fn record(
    tracer: &Tracer,
    shared: &SubscriptionState,
    rt: &ReceiveTrace<'_>,
    items: &[Pending],
    taken_ns: u64,
    lock_ms: u64,
) {
    if !tracer.enabled() || items.is_empty() {
        return;
    }
    let parent = first_trace(items).or(rt.caller);
    let Some(ctx) = tracer.start(parent) else {
        return;
    };
    if !ctx.sampled() {
        return;
    }
    let mut links: Vec<Link> = Vec::new();
    // The receiver's context first, then the events' other traces.
    if let Some(c) = rt.caller {
        Link::add(&mut links, ctx.trace_id, c);
    }
    for t in items.iter().filter_map(|p| p.event.trace.as_deref()) {
        Link::add(&mut links, ctx.trace_id, t);
    }
    let mut d = SpanData {
        trace_id: ctx.trace_id,
        span_id: ctx.span_id,
        parent_span_id: parent.map_or(0, |p| p.span_id),
        trace_state: ctx.state.clone(),
        name: "receive",
        kind: SpanKind::Server,
        start_ns: taken_ns,
        end_ns: now_ns(),
        attributes: Vec::with_capacity(11),
        links,
        status: Status::Unset,
    };
    d.attr("messaging.system", "eventgrid");
    d.attr("messaging.operation.name", "receive");
    d.attr("messaging.operation.type", "receive");
    d.attr("messaging.destination.name", shared.topic.clone());
    d.attr(
        "messaging.destination.subscription.name",
        shared.name.clone(),
    );
    d.attr("messaging.batch.message_count", items.len() as u64);
    let most = items.iter().map(|p| p.attempts).max().unwrap_or(0);
    d.attr("gridlet.delivery.attempt", most);
    d.attr("gridlet.lock.duration_ms", lock_ms);
    d.attr(
        "gridlet.receive.waited_ms",
        taken_ns.saturating_sub(rt.started_ns) / 1_000_000,
    );
    if tracer.event_ids() {
        let ids: Vec<Arc<str>> = items
            .iter()
            .take(MAX_IDS)
            .map(|p| Arc::from(&*p.event.id))
            .collect();
        match ids.len() {
            1 => d.attr("messaging.message.id", ids[0].clone()),
            _ => d.attr("gridlet.event_ids", Value::StrList(ids)),
        }
    }
    tracer.record(d, true);
}
