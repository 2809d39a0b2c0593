//! The `route` spans of a publish: one per subscription the request's events matched, a child
//! of the `publish` span, telling what routing decided there (how many events its filter took,
//! whether they were queued, dead-lettered as overflow or refused, whether they were persisted).
//! Each span lasts from routing until its copies were queued, so for a persisted subscription
//! it covers the wait for the group commit (the store's `commit` span, a child of the same
//! `publish` span or linked to it, shows the frame).
//!
//! Built only when the `publish` span is recorded: with the tracer off or the publish not
//! sampled, [`RouteSpans::start`] answers `None` and the publish path does nothing more.

use crate::delivery::subscription::{SubConfig, SubscriptionHandle};
use crate::telemetry::{now_ns, SpanData, SpanKind, Status, TraceContext, Tracer};
use std::sync::Arc;

/// What admission did with one subscription's copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Admission {
    /// Places reserved: the copies are queued once durable.
    Queued,
    /// The subscription was full under `queueFullPolicy=deadLetter`: the copies became dead
    /// letters.
    DeadLetter,
    /// The subscription was full: the whole request was refused (503).
    Refused,
    /// The request was refused for another reason (another subscription was full, or the
    /// memory bound): nothing was queued here either.
    NotAdmitted,
}

impl Admission {
    fn as_str(self) -> &'static str {
        match self {
            Admission::Queued => "queued",
            Admission::DeadLetter => "dead_letter",
            Admission::Refused => "refused",
            Admission::NotAdmitted => "not_admitted",
        }
    }
}

/// The `route` spans of one publish in progress.
pub(super) struct RouteSpans {
    tracer: Tracer,
    parent: TraceContext,
    start_ns: u64,
    spans: Vec<SpanData>,
}

impl RouteSpans {
    /// Route spans under `parent` (the `publish` span), or `None` when it is not recorded.
    pub(super) fn start(tracer: &Tracer, parent: Option<&TraceContext>) -> Option<Self> {
        let parent = parent.filter(|p| p.sampled() && tracer.enabled())?;
        Some(Self {
            tracer: tracer.clone(),
            parent: parent.clone(),
            start_ns: now_ns(),
            spans: Vec::new(),
        })
    }

    /// One span per subscription that matched any event (`per_sub[i]`: the events subscription
    /// `i` matched, of `events` in the request), with what admission decided for it.
    pub(super) fn decided(
        &mut self,
        topic: &str,
        subs: &[Arc<SubscriptionHandle>],
        configs: &[Arc<SubConfig>],
        per_sub: &[Vec<usize>],
        events: usize,
        admission: impl Fn(usize) -> Admission,
    ) {
        let topic: Arc<str> = Arc::from(topic);
        for (i, ((sub, cfg), r)) in subs.iter().zip(configs).zip(per_sub).enumerate() {
            if r.is_empty() {
                continue;
            }
            let Some(ctx) = self.tracer.start(Some(&self.parent)) else {
                return;
            };
            if !ctx.sampled() {
                continue;
            }
            let admitted = admission(i);
            let mut d = SpanData {
                trace_id: ctx.trace_id,
                span_id: ctx.span_id,
                parent_span_id: self.parent.span_id,
                trace_state: ctx.state.clone(),
                name: "route",
                kind: SpanKind::Internal,
                start_ns: self.start_ns,
                end_ns: 0,
                attributes: Vec::with_capacity(11),
                links: Vec::new(),
                status: match admitted {
                    Admission::Refused => {
                        Status::Error(format!("subscription '{}' is full", sub.name()))
                    }
                    _ => Status::Unset,
                },
            };
            d.attr("messaging.system", "eventgrid");
            d.attr("messaging.operation.name", "route");
            d.attr("messaging.destination.name", topic.clone());
            d.attr("messaging.destination.subscription.name", sub.name());
            d.attr("messaging.batch.message_count", r.len() as u64);
            d.attr("gridlet.route.filtered", cfg.sub.filter.is_some());
            d.attr("gridlet.route.matched", r.len() as u64);
            d.attr(
                "gridlet.route.unmatched",
                events.saturating_sub(r.len()) as u64,
            );
            d.attr("gridlet.route.admission", admitted.as_str());
            d.attr("gridlet.persisted", cfg.sub.persisted);
            d.attr(
                "gridlet.destination.type",
                cfg.sub.destination.endpoint_type(),
            );
            self.spans.push(d);
        }
    }

    /// Record the spans: the copies are queued (`Ok`), or the publish failed with `error`.
    pub(super) fn finish(self, error: Option<&str>) {
        let end = now_ns();
        for mut d in self.spans {
            d.end_ns = end;
            if let (Some(e), Status::Unset) = (error, &d.status) {
                d.status = Status::Error(e.to_string());
            }
            self.tracer.record(d, true);
        }
    }
}
