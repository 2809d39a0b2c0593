//! The writer does: [`apply`] carries out the [`Effects`] `settle` decided, in their order:
//! the attempt's slot freed, dead letters counted and logged, the store writes handed to the
//! store writer, which stages them in order (retry states before requeueing, letters before
//! their events' removal), letters forwarded, retries requeued in memory, settled places given back. (What
//! the attempt itself counts and logs, delivered or failed, is the dispatcher's.)

use super::context::DeliveryContext;
use super::forward::Forward;
use super::payload::first_trace;
use super::retry::DropReason;
use super::settle::{Dropped, Effects};
use super::state::SubscriptionState;
use super::trace;
use crate::telemetry::TraceContext;
use std::sync::Arc;
use tokio::time::Instant;

/// Do `fx` for `shared`'s subscription; answers what became of the events (the `settle` span's
/// attributes). The store writes' and forwards' log lines name `fx`'s trace.
pub(super) fn apply(
    shared: &Arc<SubscriptionState>,
    ctx: &DeliveryContext,
    mut fx: Effects,
) -> trace::Settled {
    let trace = fx.trace.take();
    let settled = tally(&fx);
    let leaving = fx.leaving();
    if let Some(retry_lane) = fx.freed {
        shared.queue().finish(retry_lane);
    }
    for d in &fx.dropped {
        dead_lettered(shared, ctx, d);
    }
    if !fx.writes.is_empty() {
        ctx.writer.submit(shared.owner(trace.as_ref()), fx.writes);
    }
    if !fx.forward.is_empty() {
        if let Some(sink) = &shared.config().dead_letter_sink {
            ctx.forwarder.submit(Forward {
                sink: sink.clone(),
                topic: shared.topic.clone(),
                subscription: shared.name.clone(),
                letters: fx.forward,
                trace,
            });
        }
    }
    let mut q = shared.queue();
    if let Some(r) = fx.requeue {
        q.schedule_retry(Instant::now() + r.delay, r.items);
    }
    q.settle(leaving.0, leaving.1);
    settled
}

/// What became of the events, for the `settle` span.
fn tally(fx: &Effects) -> trace::Settled {
    let mut dropped: Vec<(DropReason, usize)> = Vec::new();
    for d in &fx.dropped {
        match dropped.iter_mut().find(|(r, _)| *r == d.reason) {
            Some((_, n)) => *n += d.items.len(),
            None => dropped.push((d.reason, d.items.len())),
        }
    }
    trace::Settled {
        acked: fx.delivered.len(),
        retried: fx.requeue.as_ref().map_or(0, |r| r.items.len()),
        delay: fx.requeue.as_ref().map_or(Default::default(), |r| r.delay),
        dropped,
    }
}

/// Events that will not be delivered: counted, logged (and, when no attempt decided it, given a
/// `settle` span of their own).
fn dead_lettered(shared: &SubscriptionState, ctx: &DeliveryContext, d: &Dropped) {
    let (items, reason) = (&d.items, d.reason);
    let n = items.len() as u64;
    if !d.by_attempt {
        trace::dropped_span(&ctx.tracer, items, reason);
    }
    let m = &shared.metrics;
    m.expired_counts.add(n);
    match reason {
        DropReason::MaxDeliveryAttemptsExceeded => m.dropped_max_attempts.add(n),
        DropReason::TimeToLiveExceeded => m.dropped_expired.add(n),
        DropReason::DeliveryRefused => m.dropped_refused.add(n),
        DropReason::QueueFull => m.dropped_queue_full.add(n),
    }
    let trace = first_trace(items);
    tracing::info!(topic = %shared.topic, subscription = %shared.name, events = n, reason = reason.as_str(), first_event_id = items.first().map(|p| &*p.event.id).unwrap_or(""), trace_id = trace.map(TraceContext::trace_hex), span_id = trace.map(TraceContext::span_hex), "events dead-lettered");
}
