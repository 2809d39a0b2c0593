//! One task per subscription: picks batches from its [`SubQueue`], sends them through its
//! [`Sink`], and applies [`retry::next_step`] to every outcome.
//!
//! The task owns its in-flight sends (a `JoinSet`): deleting the subscription aborts the task and
//! with it every send. Completions are processed by the task itself, so queue state has a single
//! writer besides `publish` pushing to the ready lane.
//!
//! Isolation: a subscription can hold at most `max_in_flight` requests (a quarter of them
//! retries) and every request also needs a permit from the broker-wide semaphore; a hanging
//! endpoint therefore ties up only its own slots. A task waiting for a broker-wide permit keeps
//! settling its completed sends (the permit wait is one branch of its `select!`).
//!
//! Endpoint health ([`super::health`]) gates sending: a disabled endpoint gets one probe batch
//! per interval, a frozen one nothing; its events still expire by TTL. Events that leave
//! undelivered become dead letters ([`super::deadletter`]).

use super::deadletter::{DeadLetter, Forward};
use super::engine::{EngineCtx, Running};
use super::health::Admission;
use super::policy;
use super::queue::{Batch, EventData, Limits, Pending};
use super::retry::{self, DropReason, Step};
use super::sink::{DeliveryRequest, Outcome, Sink};
use super::subscription::{SubConfig, SubShared};
use crate::store::{QueueId, RetryState, Store, StoreError, StoredEvent};
use crate::sync::AbortOnDrop;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, TryAcquireError};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::Instrument;

/// Start the subscription's task.
pub(super) fn spawn(shared: Arc<SubShared>, ctx: Arc<EngineCtx>) -> AbortOnDrop {
    let running = Running::new(&ctx.drain.running);
    AbortOnDrop(tokio::spawn(async move {
        let _running = running;
        run(shared, ctx).await
    }))
}

type SendResult = (Batch, Outcome, Duration);

/// While sending is held back (endpoint disabled or frozen), queued events are checked for
/// expiry this often.
const EXPIRY_SWEEP: Duration = Duration::from_secs(1);

async fn run(shared: Arc<SubShared>, ctx: Arc<EngineCtx>) {
    let mut in_flight: JoinSet<SendResult> = JoinSet::new();
    // A broker-wide permit acquired while waiting, kept for the next batch.
    let mut spare: Option<OwnedSemaphorePermit> = None;
    // While sending is held back, expiry is swept at most once per EXPIRY_SWEEP (publishes wake
    // the task far more often).
    let mut next_sweep = Instant::now();
    loop {
        if ctx.drain.started() {
            // Shutting down: start nothing, settle what is in flight, then end.
            match in_flight.join_next().await {
                Some(Ok((batch, outcome, latency))) => {
                    settle(&shared, &ctx, batch, outcome, latency)
                }
                Some(Err(_)) => {}
                None => return,
            }
            continue;
        }
        // A persisted subscription's window ran low, or spilled retries fell due: read the
        // next events' bodies from the store.
        let want = shared.queue().refill_wanted();
        if !want.is_empty() {
            refill(&shared, &ctx, Lane::Ready, want).await;
        }
        let due = shared.queue().retry_refill_wanted(Instant::now());
        if !due.is_empty() {
            refill(&shared, &ctx, Lane::Retry, due).await;
        }
        let mut wait_permit = false;
        // Sending held back by endpoint health: wake at this time (None = only when notified).
        let mut held: Option<Option<Instant>> = None;
        // Send everything that can go now.
        let mut lim;
        loop {
            let cfg = shared.config();
            lim = limits(&cfg, &ctx);
            let now_ms = ctx.clock.now_ms();
            let admission = cfg
                .health
                .as_ref()
                .map_or(Admission::Send, |h| h.admit(&ctx.health_cfg, now_ms));
            if let Admission::WaitUntil(_) | Admission::ProbeInFlight | Admission::Blocked =
                admission
            {
                // Nothing may go: only let expired events leave.
                if Instant::now() >= next_sweep {
                    next_sweep = Instant::now() + EXPIRY_SWEEP;
                    let expired = shared.queue().take_expired(|p| {
                        retry::is_expired(&cfg.policy, p.first_enqueued_ms, now_ms)
                    });
                    if !expired.is_empty() {
                        drop_events(&shared, &ctx, expired, DropReason::TimeToLiveExceeded, None);
                    }
                }
                let sweep = (shared.queue().pending() > 0).then_some(next_sweep);
                held = Some(match admission {
                    Admission::WaitUntil(t) => {
                        let probe =
                            Instant::now() + Duration::from_millis(t.saturating_sub(now_ms));
                        Some(sweep.map_or(probe, |s| s.min(probe)))
                    }
                    _ => sweep,
                });
                break;
            }
            let permit = match spare.take() {
                Some(p) => p,
                None => match ctx.global.clone().try_acquire_owned() {
                    Ok(p) => p,
                    Err(TryAcquireError::NoPermits) => {
                        wait_permit = true;
                        break;
                    }
                    Err(TryAcquireError::Closed) => return, // the broker is shutting down
                },
            };
            let mut expired = Vec::new();
            let picked = shared.queue().pick(
                Instant::now(),
                &lim,
                |p| retry::is_expired(&cfg.policy, p.first_enqueued_ms, now_ms),
                &mut expired,
            );
            if !expired.is_empty() {
                drop_events(&shared, &ctx, expired, DropReason::TimeToLiveExceeded, None);
            }
            let Some(mut batch) = picked else {
                drop(permit);
                break;
            };
            let now = Instant::now();
            for p in &mut batch.items {
                if p.attempts == 0 {
                    let delay = now.saturating_duration_since(p.enqueued_at);
                    shared
                        .metrics
                        .system_delay_for_first_attempt_ms
                        .observe_ms(delay.as_millis() as u64);
                }
                p.attempts += 1;
            }
            let req = DeliveryRequest {
                topic: shared.topic.clone(),
                subscription: shared.name.clone(),
                schema: cfg.sub.delivery_schema,
                events: batch.items.iter().map(|p| p.event.body.clone()).collect(),
                attempt: batch.items.first().map(|p| p.attempts).unwrap_or(1),
                batch_id: batch.items.first().map(|p| p.seq).unwrap_or(0),
            };
            in_flight.spawn(send(cfg.sink.clone(), req, batch, permit));
            if admission == Admission::Probe {
                if let Some(h) = &cfg.health {
                    h.start_probe(&ctx.health_cfg, now_ms);
                }
                break; // one probe only
            }
        }
        // Retry timers only matter while sending is allowed (a held-back due retry would
        // otherwise wake the task in a loop).
        let next_due = match held {
            Some(wake) => wake,
            None => shared.queue().next_wakeup(&lim),
        };
        tokio::select! {
            _ = shared.notify.notified() => {}
            Some(done) = in_flight.join_next(), if !in_flight.is_empty() => {
                match done {
                    Ok((batch, outcome, latency)) => settle(&shared, &ctx, batch, outcome, latency),
                    Err(e) if e.is_panic() => tracing::error!(subscription = %shared.name, "delivery task panicked"),
                    Err(_) => {}
                }
            }
            p = ctx.global.clone().acquire_owned(), if wait_permit => {
                match p {
                    Ok(p) => spare = Some(p),
                    Err(_) => return,
                }
            }
            _ = sleep_until_opt(next_due) => {}
        }
    }
}

/// Events read per sled call batch while refilling a window.
const REFILL_CHUNK: usize = 64;

/// What a window refill read: events (in the order asked), how many were gone from the store,
/// and the sequence numbers left unread (over the byte budget).
type WindowRead = (Vec<StoredEvent>, usize, Vec<u64>);

/// Read spilled events' bodies from the store, stopping once `room` body bytes are read (at
/// least one event is always read). Runs on a blocking thread.
fn read_window(
    store: &dyn Store,
    queue: QueueId,
    seqs: &[u64],
    room: usize,
) -> Result<WindowRead, StoreError> {
    let mut out = Vec::with_capacity(seqs.len());
    let mut missing = 0usize;
    let mut bytes = 0usize;
    let mut done = 0usize;
    for chunk in seqs.chunks(REFILL_CHUNK) {
        if !out.is_empty() && bytes >= room {
            break;
        }
        for e in store.get(queue, chunk)? {
            match e {
                Some(e) => {
                    bytes += e.body.len();
                    out.push(e);
                }
                None => missing += 1,
            }
        }
        done += chunk.len();
    }
    Ok((out, missing, seqs.get(done..).unwrap_or_default().to_vec()))
}

/// Which in-memory window a refill is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// Events waiting for their first attempt.
    Ready,
    /// Retries that fell due.
    Retry,
}

/// Move spilled events into a window: read their bodies (and retry states) off the async
/// threads, drop the expired ones (TTL of a spilled event is checked here, when it enters the
/// window), queue the rest. A read failure puts them back and pauses refills for a second.
async fn refill(shared: &Arc<SubShared>, ctx: &Arc<EngineCtx>, lane: Lane, seqs: Vec<u64>) {
    let room = match lane {
        Lane::Ready => shared.queue().window_room_bytes(),
        Lane::Retry => shared.queue().retry_room_bytes(),
    };
    let store = ctx.store.clone();
    let queue = shared.queue_id;
    let asked = seqs.clone();
    // A retry's state is read back with its body: the update that wrote it must have run.
    let (writer, mark) = (ctx.writer.clone(), ctx.writer.mark());
    let read = tokio::task::spawn_blocking(move || {
        writer.wait_for(mark);
        read_window(store.as_ref(), queue, &seqs, room)
    })
    .await;
    let (events, missing, unread) = match read {
        Ok(Ok(r)) => r,
        failed => {
            let why = match failed {
                Ok(Err(e)) => e.to_string(),
                Err(e) => e.to_string(),
                Ok(Ok(_)) => String::new(),
            };
            tracing::error!(subscription = %shared.name, error = %why, "could not read queued events from the store; retrying in 1 s");
            hand_back(shared, ctx, lane, Vec::new(), asked);
            tokio::time::sleep(Duration::from_secs(1)).await;
            return;
        }
    };
    let cfg = shared.config();
    let now_ms = ctx.clock.now_ms();
    let now = Instant::now();
    let (expired, ready): (Vec<Pending>, Vec<Pending>) = events
        .into_iter()
        .map(|e| {
            let age = Duration::from_millis(now_ms.saturating_sub(e.state.first_enqueued_ms));
            Pending {
                seq: e.seq,
                event: Arc::new(EventData::new(
                    e.body,
                    e.id.into_boxed_str(),
                    Some(&ctx.pending_bytes),
                )),
                attempts: e.state.attempts,
                first_enqueued_ms: e.state.first_enqueued_ms,
                enqueued_at: now.checked_sub(age).unwrap_or(now),
            }
        })
        .partition(|p| retry::is_expired(&cfg.policy, p.first_enqueued_ms, now_ms));
    hand_back(shared, ctx, lane, ready, unread);
    shared.queue().settle(missing);
    if missing > 0 {
        tracing::warn!(subscription = %shared.name, events = missing, "queued events were no longer in the store; skipped");
    }
    if !expired.is_empty() {
        drop_events(shared, ctx, expired, DropReason::TimeToLiveExceeded, None);
        // An expired backlog is walked through window by window without waiting for a send.
        shared.notify.notify_one();
    }
}

/// Give a refill's result to its lane.
fn hand_back(
    shared: &SubShared,
    ctx: &EngineCtx,
    lane: Lane,
    loaded: Vec<Pending>,
    unread: Vec<u64>,
) {
    match lane {
        Lane::Ready => shared.queue().refilled(loaded, unread),
        Lane::Retry => {
            let lim = limits(&shared.config(), ctx);
            shared
                .queue()
                .retries_loaded(loaded, unread, Instant::now(), &lim);
        }
    }
}

fn limits(cfg: &SubConfig, ctx: &EngineCtx) -> Limits {
    Limits {
        max_events: cfg.caps.0,
        max_bytes: cfg.caps.1,
        max_in_flight: ctx.max_in_flight,
        retry_cap: (ctx.max_in_flight / 4).max(1),
    }
}

async fn sleep_until_opt(due: Option<Instant>) {
    match due {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

async fn send(
    sink: Arc<dyn Sink>,
    req: DeliveryRequest,
    batch: Batch,
    permit: OwnedSemaphorePermit,
) -> SendResult {
    // One span per attempt, debug level: disabled (and nearly free) at the default level.
    let span = tracing::debug_span!(
        "delivery_attempt",
        subscription = %req.subscription,
        attempt = req.attempt,
        events = batch.items.len(),
        outcome = tracing::field::Empty,
    );
    let started = Instant::now();
    let outcome = sink.send(&req).instrument(span.clone()).await;
    span.record("outcome", tracing::field::debug(&outcome));
    drop(permit);
    (batch, outcome, started.elapsed())
}

/// Apply an attempt's outcome to its batch.
fn settle(
    shared: &Arc<SubShared>,
    ctx: &EngineCtx,
    batch: Batch,
    outcome: Outcome,
    latency: Duration,
) {
    let cfg = shared.config();
    let m = &shared.metrics;
    let n = batch.items.len() as u64;
    m.delivery_attempts_count.add(n);
    let ms = latency.as_millis() as u64;
    let persisted = cfg.sub.persisted;
    if let Some(h) = &cfg.health {
        h.record_outcome(&ctx.health_cfg, &outcome, ctx.clock.now_ms());
    }
    if outcome == Outcome::Delivered {
        m.delivery_success_counts.add(n);
        m.delivery_success_latency_ms.observe_ms(ms);
        if ctx.log_success {
            tracing::info!(topic = %shared.topic, subscription = %shared.name, events = n, attempt = batch.items.first().map(|p| p.attempts), latency_ms = ms, "delivered");
        }
        if persisted {
            let seqs: Vec<u64> = batch.items.iter().map(|p| p.seq).collect();
            let (store, queue, name) = (ctx.store.clone(), shared.queue_id, shared.name.clone());
            ctx.writer.submit(Box::new(move || {
                if let Err(e) = store.remove(queue, &seqs) {
                    tracing::error!(subscription = %name, error = %e, "could not remove delivered events from the store; they may be delivered again after a restart");
                }
            }));
        }
        let mut q = shared.queue();
        q.finish(batch.retry);
        q.settle(batch.items.len());
        drop(q);
        shared.notify.notify_one();
        return;
    }
    m.delivery_failure_counts.add(n);
    m.delivery_failure_latency_ms.observe_ms(ms);
    if let Outcome::Failed { kind, .. } = &outcome {
        tracing::debug!(topic = %shared.topic, subscription = %shared.name, events = n, failure = %kind, "delivery attempt failed");
    }
    let now_ms = ctx.clock.now_ms();
    let mut retry_items = Vec::new();
    let mut retry_delay = Duration::ZERO;
    let mut dropped: Vec<(DropReason, Pending)> = Vec::new();
    for p in batch.items {
        match retry::next_step(
            &cfg.policy,
            p.attempts,
            p.first_enqueued_ms,
            now_ms,
            &outcome,
            policy::jitter_key(p.seq, p.attempts),
        ) {
            Step::Retry(d) => {
                retry_delay = retry_delay.max(d);
                retry_items.push(p);
            }
            Step::Drop(r) => dropped.push((r, p)),
            Step::Done => {}
        }
    }
    if persisted && !retry_items.is_empty() {
        let seqs: Vec<u64> = retry_items.iter().map(|p| p.seq).collect();
        let first = retry_items
            .iter()
            .map(|p| p.first_enqueued_ms)
            .min()
            .unwrap_or(now_ms);
        let state = RetryState {
            attempts: retry_items.first().map(|p| p.attempts).unwrap_or(0),
            first_enqueued_ms: first,
            due_ms: now_ms + retry_delay.as_millis() as u64,
        };
        let (store, queue, name) = (ctx.store.clone(), shared.queue_id, shared.name.clone());
        ctx.writer.submit(Box::new(move || {
            if let Err(e) = store.update(queue, &seqs, state) {
                tracing::error!(subscription = %name, error = %e, "could not persist retry state");
            }
        }));
    }
    {
        let mut q = shared.queue();
        q.finish(batch.retry);
        if !retry_items.is_empty() {
            q.schedule_retry(Instant::now() + retry_delay, retry_items);
        }
    }
    let mut by_reason: Vec<(DropReason, Vec<Pending>)> = Vec::new();
    for (r, p) in dropped {
        match by_reason.iter_mut().find(|(x, _)| *x == r) {
            Some((_, v)) => v.push(p),
            None => by_reason.push((r, vec![p])),
        }
    }
    for (r, items) in by_reason {
        drop_events(shared, ctx, items, r, Some(&outcome));
    }
    shared.notify.notify_one();
}

/// Events leave the queue undelivered: dead-lettered ([`dead_letter`]) and settled.
fn drop_events(
    shared: &Arc<SubShared>,
    ctx: &EngineCtx,
    items: Vec<Pending>,
    reason: DropReason,
    last: Option<&Outcome>,
) {
    if items.is_empty() {
        return;
    }
    let n = items.len();
    dead_letter(shared, ctx, &items, reason, last);
    shared.queue().settle(n);
}

/// Events that will not be delivered: counted, logged, kept as dead letters (and forwarded to
/// the dead-letter webhook), removed from the store. `last` is the attempt that decided it, if
/// any. The caller settles them in the queue if they were in it.
pub(super) fn dead_letter(
    shared: &Arc<SubShared>,
    ctx: &EngineCtx,
    items: &[Pending],
    reason: DropReason,
    last: Option<&Outcome>,
) {
    if items.is_empty() {
        return;
    }
    let n = items.len();
    let m = &shared.metrics;
    m.expired_counts.add(n as u64);
    match reason {
        DropReason::MaxDeliveryAttemptsExceeded => m.dropped_max_attempts.add(n as u64),
        DropReason::TimeToLiveExceeded => m.dropped_expired.add(n as u64),
        DropReason::DeliveryRefused => m.dropped_refused.add(n as u64),
        DropReason::QueueFull => m.dropped_queue_full.add(n as u64),
    }
    tracing::info!(topic = %shared.topic, subscription = %shared.name, events = n, reason = reason.as_str(), first_event_id = items.first().map(|p| &*p.event.id).unwrap_or(""), "events dead-lettered");
    let cfg = shared.config();
    let now_ms = ctx.clock.now_ms();
    let (last_status, last_error) = super::deadletter::describe(last);
    let letters: Vec<DeadLetter> = items
        .iter()
        .map(|p| DeadLetter {
            id: 0,
            seq: p.seq,
            event_id: p.event.id.to_string(),
            body: p.event.body.clone(),
            reason,
            last_status,
            last_error: last_error.clone(),
            attempts: p.attempts,
            first_enqueued_ms: p.first_enqueued_ms,
            dead_lettered_ms: now_ms,
        })
        .collect();
    // Kept (and their events removed from the store) on the writer thread, in that order:
    // after a crash each event is pending, a dead letter, or both, never neither.
    let seqs: Vec<u64> = if cfg.sub.persisted {
        items.iter().map(|p| p.seq).collect()
    } else {
        Vec::new()
    };
    ctx.writer
        .submit(keep_letters(shared.clone(), ctx, letters.clone(), seqs));
    if let Some(sink) = &cfg.dead_letter_sink {
        ctx.forwarder.submit(Forward {
            sink: sink.clone(),
            topic: shared.topic.clone(),
            subscription: shared.name.clone(),
            letters,
        });
    }
}

/// The writer job that keeps `letters` and then removes the events `seqs` from the store. A
/// subscription deleted meanwhile keeps nothing (its letters would outlive it).
fn keep_letters(
    shared: Arc<SubShared>,
    ctx: &EngineCtx,
    letters: Vec<DeadLetter>,
    seqs: Vec<u64>,
) -> super::writer::Job {
    let (dead_letters, store) = (ctx.dead_letters.clone(), ctx.store.clone());
    let bound = ctx.dead_letter_bound;
    Box::new(move || {
        if shared.is_retired() {
            return;
        }
        let m = &shared.metrics;
        for l in letters {
            match dead_letters.put(shared.queue_id, l, bound) {
                Ok(evicted) => {
                    if bound.keeps_any() {
                        m.dead_lettered.inc();
                    }
                    m.dead_letters_evicted.add(evicted as u64);
                }
                Err(e) => {
                    tracing::error!(subscription = %shared.name, error = %e, "could not keep a dead letter")
                }
            }
        }
        if !seqs.is_empty() {
            if let Err(e) = store.remove_dropped(shared.queue_id, &seqs) {
                tracing::error!(subscription = %shared.name, error = %e, "could not remove dropped events from the store");
            }
        }
    })
}
