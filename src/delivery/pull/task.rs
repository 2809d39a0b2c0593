//! A queue subscription's task: what the push dispatcher does between sends, without sending.
//! It refills the window over a spilled backlog (and reads spilled retries back when due, both
//! through [`super::super::refill`]), expires locks (the event is due again, or a dead letter
//! once it has been received `maxDeliveryCount` times), and wakes waiting receivers when events
//! arrive, fall due or come back.

use super::super::context::{DeliveryContext, Running};
use super::super::refill::{refill, Lane};
use super::super::retry::DropReason;
use super::super::state::SubscriptionState;
use super::drop_events;
use super::{requeue, with_bodies, PullState};
use crate::sync::AbortOnDrop;
use std::sync::Arc;
use tokio::time::Instant;

/// Start the task.
pub(in crate::delivery) fn spawn(
    shared: Arc<SubscriptionState>,
    ctx: Arc<DeliveryContext>,
    pull: Arc<PullState>,
) -> AbortOnDrop {
    let running = Running::new(&ctx.drain.running);
    AbortOnDrop(tokio::spawn(async move {
        let _running = running;
        run(shared, ctx, pull).await
    }))
}

async fn run(shared: Arc<SubscriptionState>, ctx: Arc<DeliveryContext>, pull: Arc<PullState>) {
    // Retry due times already acted on: a due retry nobody receives must not wake the task
    // again and again (receivers take it when they come).
    let mut seen = Instant::now();
    loop {
        if ctx.drain.started() {
            // Nothing in flight to settle: receivers' locks are staged in the store already,
            // and a clean stop's last frame writes them.
            pull.arrived.notify_waiters();
            return;
        }
        let want = shared.queue().refill_wanted();
        if !want.is_empty() {
            refill(&shared, &ctx, Lane::Ready, want).await;
        }
        let now = Instant::now();
        let due = shared.queue().retry_refill_wanted(now);
        if !due.is_empty() {
            refill(&shared, &ctx, Lane::Retry, due).await;
        }
        expire_locks(&shared, &ctx, &pull, Instant::now()).await;
        pull.arrived.notify_waiters();
        let now = Instant::now();
        let retry_due = shared.queue().next_due().filter(|d| *d > seen);
        seen = now;
        let lock_due = pull.locks().next_expiry();
        let wake = match (retry_due, lock_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        tokio::select! {
            _ = shared.notify.notified() => {}
            _ = sleep_until_opt(wake) => {}
        }
    }
}

/// Locks expired at `now`: each event is due again at once (its count kept: the store already
/// says so), or a dead letter when it has been received `maxDeliveryCount` times.
async fn expire_locks(
    shared: &Arc<SubscriptionState>,
    ctx: &Arc<DeliveryContext>,
    pull: &PullState,
    now: Instant,
) {
    let expired = pull.locks().expired(now);
    if expired.is_empty() {
        return;
    }
    let max = shared
        .config()
        .sub
        .queue
        .as_ref()
        .map_or(u32::MAX, |q| q.max_delivery_count);
    shared.metrics.lock_expired.add(expired.len() as u64);
    let (spent, again): (Vec<_>, Vec<_>) = expired.into_iter().partition(|p| p.attempts >= max);
    if !again.is_empty() {
        requeue(&shared.queue, now, again);
        // Those kept by sequence number only are read back by this task: go round again.
        shared.notify.notify_one();
    }
    if spent.is_empty() {
        return;
    }
    let spent = with_bodies(shared, ctx, spent).await;
    drop_events(
        shared,
        ctx,
        spent,
        DropReason::MaxDeliveryAttemptsExceeded,
        None,
    );
}

async fn sleep_until_opt(due: Option<Instant>) {
    match due {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
