//! One task per subscription: picks batches from its [`super::queue::SubQueue`], sends them
//! through its [`Sink`], and settles every outcome: [`settle::settle`] decides (a pure function,
//! [`retry::next_step`] per event), [`apply`] does (the queue, the store writer
//! ([`super::writer`]), the dead-letter forwarder). Reading spilled events back is
//! [`super::refill`]'s.
//!
//! The task owns its in-flight sends (a `JoinSet`): deleting the subscription aborts the task and
//! with it every send. Completions are processed by the task itself, so queue state has a single
//! writer besides the subscription handle pushing new events.
//!
//! Isolation: a subscription can hold at most `max_in_flight` requests (a quarter of them
//! retries) and every request also needs a permit from the broker-wide semaphore; a hanging
//! endpoint therefore ties up only its own slots. A task waiting for a broker-wide permit keeps
//! settling its completed sends (the permit wait is one branch of its `select!`).
//!
//! Endpoint health ([`super::health`]) gates sending: a disabled endpoint gets one probe batch
//! per interval, a frozen one nothing, an unreachable one (an outage) one probe per outage
//! interval; its events still expire by TTL. When an outage ends with a success the tracker
//! announces it and every task delivering there makes its waiting retries due at once
//! ([`super::queue::SubQueue::all_due`]): the backlog drains oldest first, within the
//! subscription's in-flight budget and the broker-wide permits, so other subscriptions keep
//! their share. Events that leave
//! undelivered become dead letters ([`super::deadletter`], [`settle::dead_letter`]).

use super::apply::apply;
use super::classify;
use super::context::{DeliveryContext, Running};
use super::health::Admission;
use super::payload::Pending;
use super::queue::{Batch, Limits};
use super::refill::{refill, Lane};
use super::retry::{self, DropReason};
use super::settle::{self, Effects};
use super::sink::{DeliveryRequest, Outcome, Sink};
use super::state::{SubConfig, SubscriptionState};
use super::trace;
use crate::sync::AbortOnDrop;
use crate::telemetry::{now_ns, TraceContext, Tracer};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, OwnedSemaphorePermit, TryAcquireError};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::Instrument;

/// Start the subscription's task.
pub(super) fn spawn(shared: Arc<SubscriptionState>, ctx: Arc<DeliveryContext>) -> AbortOnDrop {
    let running = Running::new(&ctx.drain.running);
    AbortOnDrop(tokio::spawn(async move {
        let _running = running;
        run(shared, ctx).await
    }))
}

/// A finished attempt.
struct Sent {
    batch: Batch,
    outcome: Outcome,
    latency: Duration,
    /// Its `deliver` span's context when the span was recorded (tracer on, sampled): the
    /// `settle` span's parent, and what the attempt's log lines and store writes name.
    deliver: Option<TraceContext>,
}

/// While sending is held back (endpoint disabled or frozen), queued events are checked for
/// expiry this often.
const EXPIRY_SWEEP: Duration = Duration::from_secs(1);

/// What a round of sending left the task waiting for.
struct Round {
    /// The limits in force this round (for the retry wake-up).
    lim: Limits,
    /// Every broker-wide permit is taken: wait for one.
    wait_permit: bool,
    /// Sending is held back by endpoint health: wake at this time (`None` = only when
    /// notified). `None` here: not held back.
    held: Option<Option<Instant>>,
}

/// The task's own state between rounds.
struct Task {
    shared: Arc<SubscriptionState>,
    ctx: Arc<DeliveryContext>,
    in_flight: JoinSet<Sent>,
    /// A broker-wide permit acquired while waiting, kept for the next batch.
    spare: Option<OwnedSemaphorePermit>,
    /// While sending is held back, expiry is swept at most once per [`EXPIRY_SWEEP`]
    /// (publishes wake the task far more often).
    next_sweep: Instant,
    /// The endpoint's recoveries (outages ended by a success) this task has seen, keyed by the
    /// tracker (a PUT may change the destination): each makes the waiting retries due.
    recovery: Option<(usize, watch::Receiver<u64>)>,
}

async fn run(shared: Arc<SubscriptionState>, ctx: Arc<DeliveryContext>) {
    let mut t = Task {
        shared,
        ctx,
        in_flight: JoinSet::new(),
        spare: None,
        next_sweep: Instant::now(),
        recovery: None,
    };
    loop {
        if t.ctx.drain.started() {
            // Shutting down: start nothing, settle what is in flight, then end.
            match t.in_flight.join_next().await {
                Some(Ok(sent)) => settle(&t.shared, &t.ctx, sent),
                Some(Err(_)) => {}
                None => return,
            }
            continue;
        }
        t.refill_due().await;
        let Some(round) = t.send_ready() else {
            return; // the broker is shutting down
        };
        if !t.wait(round).await {
            return;
        }
    }
}

impl Task {
    /// A persisted subscription's window ran low, or spilled retries fell due: read the next
    /// events' bodies from the store.
    async fn refill_due(&self) {
        let want = self.shared.queue().refill_wanted();
        if !want.is_empty() {
            refill(&self.shared, &self.ctx, Lane::Ready, want).await;
        }
        let due = self.shared.queue().retry_refill_wanted(Instant::now());
        if !due.is_empty() {
            refill(&self.shared, &self.ctx, Lane::Retry, due).await;
        }
    }

    /// The endpoint came back from an outage (announced by its tracker since this task last
    /// looked): every waiting retry is due now, not at its next slot.
    fn catch_recovery(&mut self, cfg: &SubConfig) {
        let Some(h) = &cfg.health else {
            self.recovery = None;
            return;
        };
        let key = Arc::as_ptr(h) as usize;
        match &mut self.recovery {
            Some((k, rx)) if *k == key => {
                if rx.has_changed().unwrap_or(false) {
                    rx.borrow_and_update();
                    let live_first = cfg.sub.batching.live_first();
                    self.shared.queue().all_due(Instant::now(), live_first);
                }
            }
            _ => {
                let mut rx = h.recoveries();
                rx.borrow_and_update();
                self.recovery = Some((key, rx));
            }
        }
    }

    /// Start every batch that can go now. `None`: the broker-wide semaphore is closed.
    fn send_ready(&mut self) -> Option<Round> {
        loop {
            let cfg = self.shared.config();
            self.catch_recovery(&cfg);
            let lim = cfg.limits(self.ctx.max_in_flight);
            let now_ms = self.ctx.clock.now_ms();
            let admission = cfg
                .health
                .as_ref()
                .map_or(Admission::Send, |h| h.admit(&self.ctx.health_cfg, now_ms));
            if let Admission::WaitUntil(_) | Admission::ProbeInFlight | Admission::Blocked =
                admission
            {
                let held = Some(self.hold_back(&cfg, admission, now_ms));
                return Some(Round {
                    lim,
                    wait_permit: false,
                    held,
                });
            }
            let permit = match self.spare.take() {
                Some(p) => p,
                None => match self.ctx.global.clone().try_acquire_owned() {
                    Ok(p) => p,
                    Err(TryAcquireError::NoPermits) => {
                        return Some(Round {
                            lim,
                            wait_permit: true,
                            held: None,
                        })
                    }
                    Err(TryAcquireError::Closed) => return None,
                },
            };
            let mut expired = Vec::new();
            let picked = self.shared.queue().pick(
                Instant::now(),
                &lim,
                |p| retry::is_expired(&cfg.policy, p.first_enqueued_ms, now_ms),
                &mut expired,
            );
            self.expire(&cfg, expired, now_ms);
            let Some(batch) = picked else {
                return Some(Round {
                    lim,
                    wait_permit: false,
                    held: None,
                });
            };
            self.start_attempt(&cfg, batch, permit);
            if admission == Admission::Probe {
                if let Some(h) = &cfg.health {
                    h.start_probe(&self.ctx.health_cfg, now_ms);
                }
                // One probe only.
                return Some(Round {
                    lim,
                    wait_permit: false,
                    held: None,
                });
            }
        }
    }

    /// Nothing may go (endpoint disabled or frozen): only let expired events leave. Returns
    /// when to wake (`None`: only when notified).
    fn hold_back(&mut self, cfg: &SubConfig, admission: Admission, now_ms: u64) -> Option<Instant> {
        if Instant::now() >= self.next_sweep {
            self.next_sweep = Instant::now() + EXPIRY_SWEEP;
            let expired = self
                .shared
                .queue()
                .take_expired(|p| retry::is_expired(&cfg.policy, p.first_enqueued_ms, now_ms));
            self.expire(cfg, expired, now_ms);
        }
        let sweep = (self.shared.queue().pending() > 0).then_some(self.next_sweep);
        match admission {
            Admission::WaitUntil(t) => {
                let probe = Instant::now() + Duration::from_millis(t.saturating_sub(now_ms));
                Some(sweep.map_or(probe, |s| s.min(probe)))
            }
            _ => sweep,
        }
    }

    /// Queued events past their time to live leave as dead letters.
    fn expire(&self, cfg: &SubConfig, expired: Vec<Pending>, now_ms: u64) {
        if !expired.is_empty() {
            let reason = DropReason::TimeToLiveExceeded;
            apply(
                &self.shared,
                &self.ctx,
                settle::dead_letter(cfg.rules(), expired, reason, now_ms, true),
            );
        }
    }

    /// Count the attempt and send the batch in its own task.
    fn start_attempt(&mut self, cfg: &SubConfig, mut batch: Batch, permit: OwnedSemaphorePermit) {
        let now = Instant::now();
        for p in &mut batch.items {
            if p.attempts == 0 {
                let delay = now.saturating_duration_since(p.enqueued_at);
                self.shared
                    .metrics
                    .system_delay_for_first_attempt_ms
                    .observe_ms(delay.as_millis() as u64);
            }
            p.attempts += 1;
        }
        let attempt = batch.items.first().map(|p| p.attempts).unwrap_or(1);
        let (onward, span) = trace::start(
            &self.ctx.tracer,
            cfg,
            &self.shared.topic,
            &self.shared.name,
            &batch,
            attempt,
        );
        let req = DeliveryRequest {
            topic: self.shared.topic.clone(),
            subscription: self.shared.name.clone(),
            schema: cfg.sub.delivery_schema,
            events: batch.items.iter().map(|p| p.event.body.clone()).collect(),
            attempt,
            attempts_each: batch.items.iter().map(|p| p.attempts).collect(),
            batch_id: batch.items.first().map(|p| p.seq).unwrap_or(0),
            trace: onward,
            time_left: {
                let now_ms = self.ctx.clock.now_ms();
                let ttl = cfg.policy.ttl.as_millis() as u64;
                batch
                    .items
                    .iter()
                    .map(|p| {
                        let expires = p.first_enqueued_ms.saturating_add(ttl);
                        Duration::from_millis(expires.saturating_sub(now_ms))
                    })
                    .collect()
            },
        };
        let tracer = self.ctx.tracer.clone();
        self.in_flight
            .spawn(send(cfg.sink.clone(), req, batch, permit, tracer, span));
    }

    /// Wait for what the round left pending: a wake-up, a finished send (settled here), a
    /// broker-wide permit, or a retry falling due. `false`: the broker is shutting down.
    async fn wait(&mut self, round: Round) -> bool {
        // Retry timers only matter while sending is allowed and a broker-wide permit is at
        // hand: a due retry that is held back, or that waits for a permit (the broker-wide
        // budget is full), would otherwise wake the task in a loop, spinning a core.
        let next_due = match round.held {
            Some(wake) => wake,
            None if round.wait_permit => None,
            None => self.shared.queue().next_wakeup(&round.lim),
        };
        tokio::select! {
            _ = self.shared.notify.notified() => {}
            Some(done) = self.in_flight.join_next(), if !self.in_flight.is_empty() => {
                match done {
                    Ok(sent) => settle(&self.shared, &self.ctx, sent),
                    Err(e) if e.is_panic() => tracing::error!(subscription = %self.shared.name, "delivery task panicked"),
                    Err(_) => {}
                }
            }
            p = self.ctx.global.clone().acquire_owned(), if round.wait_permit => {
                match p {
                    Ok(p) => self.spare = Some(p),
                    Err(_) => return false,
                }
            }
            _ = recovered(&mut self.recovery) => {
                let live_first = self.shared.config().sub.batching.live_first();
                self.shared.queue().all_due(Instant::now(), live_first);
            }
            _ = sleep_until_opt(next_due) => {}
        }
        true
    }
}

/// Resolves when the endpoint announces a recovery (never without a tracker).
async fn recovered(r: &mut Option<(usize, watch::Receiver<u64>)>) {
    match r {
        Some((_, rx)) => {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
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
    tracer: Tracer,
    deliver: Option<Box<trace::DeliverSpan>>,
) -> Sent {
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
    let latency = started.elapsed();
    let deliver = deliver.map(|d| trace::finish_deliver(&tracer, *d, &outcome));
    Sent {
        batch,
        outcome,
        latency,
        deliver,
    }
}

/// Apply an attempt's outcome to its batch: each event by its own outcome when the sink
/// reported them apart ([`Outcome::PerEvent`]), else the whole batch alike. A recorded
/// `deliver` span gets its `settle` span.
fn settle(shared: &Arc<SubscriptionState>, ctx: &DeliveryContext, sent: Sent) {
    let span = sent.deliver.clone().map(|d| (d, now_ns()));
    let settled = settle_batch(shared, ctx, sent);
    if let Some((deliver, start_ns)) = span {
        let now_ms = ctx.clock.now_ms();
        trace::settle_span(&ctx.tracer, &deliver, start_ns, now_ms, &settled);
    }
}

/// Apply an attempt's outcome to its batch (decided by [`settle::settle`], done by
/// [`apply`]); answers what became of its events. Its log lines and store writes name the
/// `deliver` span when it was recorded, else the context the first event travels in.
fn settle_batch(
    shared: &Arc<SubscriptionState>,
    ctx: &DeliveryContext,
    sent: Sent,
) -> trace::Settled {
    let Sent {
        batch,
        outcome,
        latency,
        deliver,
    } = sent;
    let cfg = shared.config();
    let m = &shared.metrics;
    m.delivery_attempts_count.add(batch.items.len() as u64);
    let now_ms = ctx.clock.now_ms();
    if let Some(h) = &cfg.health {
        h.record_outcome(&ctx.health_cfg, &outcome, now_ms);
    }
    if let Some(fault) = classify::config_fault(&outcome) {
        m.destination_faults[fault as usize].inc();
    }
    let mut fx = settle::settle(cfg.rules(), batch, outcome, now_ms);
    if deliver.is_some() {
        fx.trace = deliver;
    }
    count_attempt(shared, ctx, &fx, latency.as_millis() as u64);
    let settled = apply(shared, ctx, fx);
    shared.notify.notify_one();
    settled
}

/// What the attempt counts and logs: its events delivered and failed, its latency.
fn count_attempt(shared: &SubscriptionState, ctx: &DeliveryContext, fx: &Effects, ms: u64) {
    let span = fx.trace.as_ref();
    let m = &shared.metrics;
    if !fx.delivered.is_empty() {
        let n = fx.delivered.len() as u64;
        m.delivery_success_counts.add(n);
        if ctx.log_success {
            tracing::info!(topic = %shared.topic, subscription = %shared.name, events = n, attempt = fx.delivered.first().map(|p| p.attempts), latency_ms = ms, trace_id = span.map(TraceContext::trace_hex), span_id = span.map(TraceContext::span_hex), "delivered");
        }
        m.delivery_success_latency_ms.observe_ms(ms);
    }
    for (o, n) in &fx.failed {
        m.delivery_failure_counts.add(*n as u64);
        if let Outcome::Failed { kind, .. } = o {
            *crate::sync::lock(&shared.last_error) = Some((ctx.clock.now_ms(), kind.to_string()));
            tracing::debug!(topic = %shared.topic, subscription = %shared.name, events = n, failure = %kind, trace_id = span.map(TraceContext::trace_hex), span_id = span.map(TraceContext::span_hex), "delivery attempt failed");
        }
    }
    if !fx.failed.is_empty() {
        m.delivery_failure_latency_ms.observe_ms(ms);
    }
}
