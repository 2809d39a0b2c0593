//! The bodies of locked events that a persisted subscription's lock table does not keep, read
//! back from the store when an event needs one again (a release for now, a reject, a last
//! expiry: the dead letter).

use super::super::context::DeliveryContext;
use super::super::payload::{EventData, Pending};
use super::super::state::SubscriptionState;
use super::locks::Lock;
use std::sync::Arc;
use tokio::time::Instant;

/// The store could not give back locked events' bodies: they become due again now (read back
/// later through the retry window), and only `out` goes on.
fn read_failed(
    shared: &SubscriptionState,
    out: Vec<Pending>,
    missing: Vec<Lock>,
    e: &dyn std::fmt::Display,
) -> Vec<Pending> {
    tracing::error!(subscription = %shared.name, error = %e, "could not read locked events from the store; they are due again");
    shared
        .queue()
        .return_spilled(Instant::now(), missing.iter().map(|l| l.seq));
    shared.notify.notify_one();
    out
}

/// The events of `locks` as queue entries: the kept payloads, and the others' read from the
/// store (on the blocking pool; what was submitted before is staged, and read as staged).
/// An event no longer in the store is left out and its place in the queue given back.
pub(super) async fn with_bodies(
    shared: &Arc<SubscriptionState>,
    ctx: &Arc<DeliveryContext>,
    locks: Vec<Lock>,
) -> Vec<Pending> {
    let mut out = Vec::with_capacity(locks.len());
    let mut missing = Vec::new();
    for l in locks {
        match l.into_pending() {
            Ok(p) => out.push(p),
            Err(l) => missing.push(l),
        }
    }
    if missing.is_empty() {
        return out;
    }
    let seqs: Vec<u64> = missing.iter().map(|l| l.seq).collect();
    let (store, queue) = (ctx.store.clone(), shared.queue_id);
    let read = tokio::task::spawn_blocking(move || store.get(queue, &seqs)).await;
    let found = match read {
        Ok(Ok(found)) => found,
        Ok(Err(e)) => return read_failed(shared, out, missing, &e),
        Err(e) => return read_failed(shared, out, missing, &e),
    };
    let mut gone = 0;
    for (l, e) in missing
        .into_iter()
        .zip(found.into_iter().chain(std::iter::repeat_with(|| None)))
    {
        match e {
            Some(e) => out.push(Pending {
                seq: l.seq,
                event: Arc::new(EventData::new(
                    e.body,
                    e.id.into_boxed_str(),
                    e.trace,
                    Some(&ctx.pending_bytes),
                )),
                attempts: l.attempts,
                first_enqueued_ms: l.first_enqueued_ms,
                enqueued_at: l.enqueued_at,
            }),
            None => gone += 1,
        }
    }
    if gone > 0 {
        // Not in the store: nothing of them is counted there (a windowed queue's bytes are).
        shared.queue().settle(gone, 0);
        tracing::warn!(subscription = %shared.name, events = gone, "locked events were no longer in the store; skipped");
    }
    out
}
