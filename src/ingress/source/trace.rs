//! The `publish` span of one MQTT batch offered to one gridlet topic (see `source.rs`).

use crate::broker::BrokerError;
use crate::model::event::IncomingEvent;
use crate::telemetry::{now_ns, SpanData, SpanKind, Status, TraceContext, Tracer};
use std::sync::Arc;

/// The `publish` span of one batch offered to one topic (tracer on): its parent is the first
/// event's own trace context (a CloudEvent's `traceparent`), and every event without one
/// travels in it, as for an HTTP publish.
pub(super) struct BatchTrace<'a> {
    tracer: &'a Tracer,
    parent: Option<TraceContext>,
    span: Option<TraceContext>,
    start_ns: u64,
    events: usize,
}

impl<'a> BatchTrace<'a> {
    pub(super) fn start(tracer: &'a Tracer, events: &mut [IncomingEvent]) -> Self {
        let parent = events.first().and_then(|e| e.trace.as_deref().cloned());
        let span = tracer.start(parent.as_ref());
        if let Some(s) = &span {
            let shared = Arc::new(s.clone());
            for ev in events.iter_mut().filter(|e| e.trace.is_none()) {
                ev.trace = Some(shared.clone());
            }
        }
        Self {
            tracer,
            parent,
            start_ns: if span.is_some() { now_ns() } else { 0 },
            span,
            events: events.len(),
        }
    }

    pub(super) fn span(&self) -> Option<&TraceContext> {
        self.span.as_ref()
    }

    pub(super) fn finish(self, connection: &str, topic: &str, result: &Result<(), BrokerError>) {
        let Some(span) = self.span else { return };
        if !span.sampled() {
            return;
        }
        let mut d = SpanData {
            trace_id: span.trace_id,
            span_id: span.span_id,
            parent_span_id: self.parent.as_ref().map_or(0, |p| p.span_id),
            trace_state: span.state.clone(),
            name: "publish",
            kind: SpanKind::Consumer,
            start_ns: self.start_ns,
            end_ns: now_ns(),
            attributes: Vec::with_capacity(6),
            links: Vec::new(),
            status: match result {
                Err(e) => Status::Error(e.to_string()),
                Ok(()) => Status::Unset,
            },
        };
        d.attr("messaging.system", "mqtt");
        d.attr("messaging.operation.name", "publish");
        d.attr("messaging.destination.name", topic.to_string());
        d.attr("messaging.batch.message_count", self.events as u64);
        d.attr("gridlet.mqtt.connection", connection.to_string());
        d.attr(
            "gridlet.outcome",
            if result.is_ok() { "accepted" } else { "held" },
        );
        self.tracer.record(d, true);
    }
}
