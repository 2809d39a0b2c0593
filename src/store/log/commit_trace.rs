//! The `commit` span of a group commit: one per frame the committer writes, with the group's
//! size (publishes and events), the frame's bytes and how long its `fdatasync` took.
//!
//! A frame that makes publishes durable is a child of the first of them whose trace is
//! recorded (the context its events travel in: gridlet's `publish` span, or the publisher's),
//! and links the others (at most [`MAX_LINKS`]); one whose publishes were all unsampled is not
//! recorded. A frame of settlements only (or of a collection) is the root of its own trace,
//! sampled as any new trace is. Nothing here runs unless the tracer is on: [`Group`]s are only
//! gathered then, and the committer checks one `Option` per frame.

use crate::store::{QueueId, StoredEvent};
use crate::telemetry::{now_ns, Link, SpanData, SpanKind, Status, TraceContext, Tracer, MAX_LINKS};
use std::time::Duration;

/// The publishes staged for the next frame (gathered only while the tracer is on).
#[derive(Debug, Default)]
pub(super) struct Group {
    /// Publishes (store submissions).
    pub publishes: u64,
    /// Events (each once, however many queues it goes to).
    pub events: u64,
    /// The recorded contexts their events travel in, first come first (the parent, then
    /// links).
    pub traces: Vec<TraceContext>,
}

impl Group {
    /// Count one submission (its events: the span of its sequence numbers, which the broker
    /// numbers consecutively per publish; no sort or allocation under the log's lock).
    pub fn add(&mut self, items: &[(QueueId, StoredEvent)]) {
        self.publishes += 1;
        let (lo, hi) = items.iter().fold((u64::MAX, 0), |(lo, hi), (_, e)| {
            (lo.min(e.seq), hi.max(e.seq))
        });
        self.events += (hi + 1).saturating_sub(lo);
        for t in items.iter().filter_map(|(_, e)| e.trace.as_deref()) {
            let seen = |x: &TraceContext| x.trace_id == t.trace_id && x.span_id == t.span_id;
            if !t.sampled() || self.traces.last().is_some_and(seen) {
                continue;
            }
            if self.traces.len() <= MAX_LINKS && !self.traces.iter().any(seen) {
                self.traces.push(t.clone());
            }
        }
    }
}

/// A `commit` span in progress.
pub(super) struct CommitSpan {
    ctx: TraceContext,
    parent_span_id: u64,
    links: Vec<Link>,
    start_ns: u64,
    attributes: Vec<(&'static str, crate::telemetry::Value)>,
}

impl CommitSpan {
    /// The span of a frame of `bytes` about to be written for `group`; `None` when it is not
    /// recorded.
    pub fn start(tracer: &Tracer, group: Group, bytes: usize) -> Option<Self> {
        let mut traces = group.traces.into_iter();
        let parent = traces.next();
        if group.publishes > 0 && parent.is_none() {
            return None; // its publishes were not sampled
        }
        let ctx = tracer.start(parent.as_ref())?;
        if !ctx.sampled() {
            return None;
        }
        let links = traces
            .map(|t| Link {
                trace_id: t.trace_id,
                span_id: t.span_id,
            })
            .collect();
        let mut attributes: Vec<(&'static str, crate::telemetry::Value)> = Vec::with_capacity(6);
        attributes.push(("gridlet.store.publishes", group.publishes.into()));
        attributes.push(("gridlet.store.events", group.events.into()));
        attributes.push(("gridlet.store.bytes", (bytes as u64).into()));
        Some(Self {
            parent_span_id: parent.map_or(0, |p| p.span_id),
            ctx,
            links,
            start_ns: now_ns(),
            attributes,
        })
    }

    /// Record it: the frame was written and synced (its `fdatasync` took `fsync`), or failed.
    pub fn finish(self, tracer: &Tracer, fsync: Option<Duration>, error: Option<&str>) {
        let mut attributes = self.attributes;
        if let Some(d) = fsync {
            attributes.push(("gridlet.store.fsync_us", (d.as_micros() as u64).into()));
        }
        tracer.record(
            SpanData {
                trace_id: self.ctx.trace_id,
                span_id: self.ctx.span_id,
                parent_span_id: self.parent_span_id,
                trace_state: self.ctx.state.clone(),
                name: "commit",
                kind: SpanKind::Internal,
                start_ns: self.start_ns,
                end_ns: now_ns(),
                attributes,
                links: self.links,
                status: error.map_or(Status::Unset, |e| Status::Error(e.to_string())),
            },
            true,
        );
    }
}
