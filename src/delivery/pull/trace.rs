//! The spans of pull operations: `receive`, one per receive that took events (a pull
//! subscription's counterpart of the push `deliver` span, `super::super::trace`), and
//! `acknowledge`, `release`, `reject` and `renewLock`, one per request that settled (or renewed)
//! at least one lock token.
//!
//! OpenTelemetry's messaging conventions link a receive or a settlement to each message's
//! creation context, and let an operation on one message be its child. Here, as for `deliver`:
//! the span is a child of the context the first event it took or settled travels in (so a
//! trace reads `publish → receive` and `publish → acknowledge`), and the other events' traces
//! are links. The caller's own context (its request's `traceparent`) is a link too, so its
//! trace finds the operation; it is the parent only when no event carries a context. A settle
//! reads its events' contexts from their locks ([`super::locks::Lock::trace`]), kept while the
//! tracer is on. With the tracer off nothing here runs: each operation checks one `Option`.

use super::super::payload::{first_trace, Pending};
use super::super::retry::DropReason;
use super::super::state::SubscriptionState;
use super::locks::Lock;
use super::TokenResults;
use crate::telemetry::{
    now_ns, Link, SpanData, SpanKind, Status, TraceContext, Tracer, Value, MAX_LINKS,
};
use std::sync::Arc;
use std::time::Duration;

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

/// A span of a pull operation on `shared`, named `name`, from `start_ns` to now: a child of
/// `parent` (the first event's context, else the caller's), linking `caller` and then `traces`.
/// `None` when the tracer is off or the trace is not sampled.
fn span<'t>(
    tracer: &Tracer,
    shared: &SubscriptionState,
    name: &'static str,
    start_ns: u64,
    parent: Option<&TraceContext>,
    caller: Option<&TraceContext>,
    traces: impl Iterator<Item = &'t TraceContext>,
) -> Option<SpanData> {
    let ctx = tracer.start(parent)?;
    if !ctx.sampled() {
        return None;
    }
    let mut links: Vec<Link> = Vec::new();
    // The caller's context first, then the events' other traces.
    if let Some(c) = caller {
        Link::add(&mut links, ctx.trace_id, c);
    }
    for t in traces {
        Link::add(&mut links, ctx.trace_id, t);
    }
    let mut d = SpanData {
        trace_id: ctx.trace_id,
        span_id: ctx.span_id,
        parent_span_id: parent.map_or(0, |p| p.span_id),
        trace_state: ctx.state.clone(),
        name,
        kind: SpanKind::Server,
        start_ns,
        end_ns: now_ns(),
        attributes: Vec::with_capacity(11),
        links,
        status: Status::Unset,
    };
    d.attr("messaging.system", "eventgrid");
    d.attr("messaging.operation.name", name);
    d.attr("messaging.destination.name", shared.topic.clone());
    d.attr(
        "messaging.destination.subscription.name",
        shared.name.clone(),
    );
    Some(d)
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
    let traces = items.iter().filter_map(|p| p.event.trace.as_deref());
    let Some(mut d) = span(
        tracer, shared, "receive", taken_ns, parent, rt.caller, traces,
    ) else {
        return;
    };
    d.attr("messaging.operation.type", "receive");
    d.attr("messaging.batch.message_count", items.len() as u64);
    let most = items.iter().map(|p| p.attempts).max().unwrap_or(0);
    d.attr("gridlet.delivery.attempt", most);
    d.attr("gridlet.lock.duration_ms", lock_ms);
    d.attr(
        "gridlet.receive.waited_ms",
        taken_ns.saturating_sub(rt.started_ns) / 1_000_000,
    );
    if tracer.event_ids() {
        let (key, ids) = super::super::trace::ids_attribute(items);
        d.attr(key, ids);
    }
    tracer.record(d, true);
}

/// What a request does with its lock tokens, for its span.
#[derive(Debug, Clone, Copy)]
pub(super) enum Settle {
    /// `:acknowledge`.
    Acknowledge,
    /// `:release`, with its `releaseDelayInSeconds`.
    Release(Duration),
    /// `:reject`.
    Reject,
    /// `:renewLock`, each lock held for this long again.
    RenewLock(Duration),
}

impl Settle {
    /// The span's name and `messaging.operation.name`: the operation after the `:`.
    fn name(self) -> &'static str {
        match self {
            Self::Acknowledge => "acknowledge",
            Self::Release(_) => "release",
            Self::Reject => "reject",
            Self::RenewLock(_) => "renewLock",
        }
    }
}

/// A settle request's span in the making: the contexts of the events it settled, gathered
/// from their locks (nothing is gathered with the tracer off).
pub(super) struct SettleTrace<'a> {
    op: Settle,
    /// The caller's context: its request's `traceparent` / `tracestate`.
    caller: Option<&'a TraceContext>,
    /// When the request began (0: the tracer is off).
    started_ns: u64,
    /// The settled events' contexts, one per trace in the order met: the first is the parent,
    /// the others links (so at most [`MAX_LINKS`] + 1 are worth keeping).
    traces: Vec<Arc<TraceContext>>,
}

impl<'a> SettleTrace<'a> {
    /// A settle request beginning now, for `caller`.
    pub(super) fn begin(tracer: &Tracer, op: Settle, caller: Option<&'a TraceContext>) -> Self {
        Self {
            op,
            caller,
            started_ns: if tracer.enabled() { now_ns() } else { 0 },
            traces: Vec::new(),
        }
    }

    /// Whether the span is being made (the tracer is on).
    pub(super) fn on(&self) -> bool {
        self.started_ns != 0
    }

    /// Note the contexts of the events of `locks`, settled.
    pub(super) fn took(&mut self, locks: &[Lock]) {
        if self.on() {
            for l in locks {
                self.settled(l.trace.as_ref());
            }
        }
    }

    /// Note the context of an event settled (or renewed).
    pub(super) fn settled(&mut self, trace: Option<&Arc<TraceContext>>) {
        let Some(t) = trace.filter(|_| self.on()) else {
            return;
        };
        if self.traces.len() <= MAX_LINKS && !self.traces.iter().any(|k| k.trace_id == t.trace_id) {
            self.traces.push(t.clone());
        }
    }

    /// Record the span of a request answered `results` (none settled: no span), whose durable
    /// write failed with `failed`, if it did.
    pub(super) fn record(
        self,
        tracer: &Tracer,
        shared: &SubscriptionState,
        results: &TokenResults,
        failed: Option<&dyn std::fmt::Display>,
    ) {
        if !self.on() || results.succeeded.is_empty() {
            return;
        }
        let parent = self.traces.first().map(|t| &**t).or(self.caller);
        let traces = self.traces.iter().map(|t| &**t);
        let name = self.op.name();
        let Some(mut d) = span(
            tracer,
            shared,
            name,
            self.started_ns,
            parent,
            self.caller,
            traces,
        ) else {
            return;
        };
        let succeeded = results.succeeded.len() as u64;
        if !matches!(self.op, Settle::RenewLock(_)) {
            d.attr("messaging.operation.type", "settle");
        }
        d.attr("messaging.batch.message_count", succeeded);
        d.attr("gridlet.lock_tokens.succeeded", succeeded);
        d.attr("gridlet.lock_tokens.failed", results.failed.len() as u64);
        match self.op {
            Settle::Acknowledge => {}
            Settle::Release(delay) => d.attr("gridlet.release.delay_ms", delay.as_millis() as u64),
            Settle::Reject => d.attr(
                "gridlet.dead_letter.reason",
                Value::StrList(vec![Arc::from(DropReason::DeliveryRefused.as_str())]),
            ),
            Settle::RenewLock(lock) => d.attr("gridlet.lock.duration_ms", lock.as_millis() as u64),
        }
        if let Some(e) = failed {
            d.attr("error.type", "store");
            d.status = Status::Error(e.to_string());
        }
        tracer.record(d, true);
    }
}
