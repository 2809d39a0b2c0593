//! Pull delivery: a queue subscription (`deliveryMode: Queue`), whose events wait until a
//! client receives them under a lock and then acknowledges, releases, rejects or renews them
//! (Event Grid namespaces' data plane).
//!
//! A sibling of the push [`super::dispatcher`] behind the same seams: the same
//! [`super::queue::SubQueue`] (ready lane, retry lane, the window over a spilled backlog), the
//! same admission, restore, refill, dead-letter and store-writer paths. What differs is who
//! takes batches: a receive [`SubQueue::pick`]s them (so concurrent receivers get distinct
//! events, under the queue's lock) and locks them in a bounded [`locks::Locks`] table, and the
//! subscription's task ([`task`]) only refills the window, expires locks and wakes waiting
//! receivers.
//!
//! Durable state, on the store's existing records (no new record kind):
//! * a receive is a delivery attempt: the event's retry state becomes `attempts` = its
//!   `deliveryCount`, `due` = its lock's expiry. It is staged, not waited for: it reaches the
//!   disk with the next frame (an acknowledgement's, a publish's, or the committer's own within
//!   the store's settle interval, 100 ms). A lock is not worth a sync of its own: a crash ends
//!   every lock anyway (tokens are signed with a key drawn at each start), and at least once
//!   allows the event to come back. After a crash or restart an unsettled event comes back as
//!   the disk last recorded it: when the last lock of it that reached the disk would have
//!   expired (at once if none did), with that lock's count. So the `deliveryCount` a receive
//!   answers is one more than the earlier receives that reached the disk: after a crash it may
//!   be lower than the receives made (by those answered after the last frame), never higher
//!   ([`super::subscription::SubscriptionHandle::restore`] reads exactly that);
//! * acknowledge removes the event and answers once the removal is durable: it stages the
//!   removal with a commit answered by the frame holding it ([`crate::store::Store::stage`],
//!   [`Answer::Frame`]), shared with every other
//!   settlement and publish staged meanwhile, not for the committer's whole round. Frames are
//!   written in order, so the receives before it are durable then too. An acknowledged event
//!   never comes back;
//! * reject makes the events dead letters and answers once that is durable, as acknowledge:
//!   a rejected event never comes back either;
//! * release makes it due again (now, or after the delay) with its count kept; renew moves
//!   `due` to the new expiry. Both are staged like a receive: a crash before the next frame
//!   undoes them, and the event comes back when its earlier lock would have expired;
//! * a receive past `maxDeliveryCount` and the time to live end in the dead-letter path every
//!   subscription uses.
//!
//! Lock tokens ([`token`]) are unforgeable and name (subscription, event, attempt).

mod bodies;
mod locks;
mod tokens;
pub use locks::LockSummary;
pub(super) mod task;
mod trace;

use super::context::DeliveryContext;
use super::lock_token::{self as token, TokenId, TokenKey};
use super::payload::Pending;
use super::queue::{Limits, SubQueue};
use super::retry::{self, DropReason};
use super::sink::Outcome;
use super::state::SubscriptionState;
use super::writer::Write;
use crate::model::queue::QueueSettings;
use crate::store::{RetryState, StoreError};
use crate::telemetry::TraceContext;
use bodies::with_bodies;
use bytes::Bytes;
use locks::{Keep, Lock, Locks, Lost};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// The release delays Event Grid accepts (`releaseDelayInSeconds`).
pub const RELEASE_DELAYS: [u64; 5] = [0, 10, 60, 600, 3600];

/// How long a receive that found nothing waits, whatever its `maxWaitTime`, while events of a
/// persisted subscription's backlog are being read back from the event log into its window:
/// they are there, and answering none would tell the client the queue is empty.
pub const READ_BACK_WAIT: Duration = Duration::from_secs(1);

/// A queue subscription's pull state, shared by its handle and its task.
pub struct PullState {
    locks: Mutex<Locks>,
    /// Receivers waiting for events (woken by the task and by releases).
    arrived: Notify,
    key: Arc<TokenKey>,
}

impl PullState {
    /// A pull state holding at most `max_locks` locks of `max_bytes` body bytes, its tokens
    /// signed with `key`.
    pub fn new(max_locks: usize, max_bytes: u64, key: Arc<TokenKey>) -> Self {
        Self {
            locks: Mutex::new(Locks::new(max_locks, max_bytes)),
            arrived: Notify::new(),
            key,
        }
    }

    fn locks(&self) -> std::sync::MutexGuard<'_, Locks> {
        crate::sync::lock(&self.locks)
    }

    /// Events received and not yet settled.
    pub fn locked(&self) -> usize {
        self.locks().len()
    }

    /// The locks summed up, for the console.
    pub fn summary(&self) -> LockSummary {
        self.locks().summary()
    }
}

/// One received event.
#[derive(Debug, Clone)]
pub struct Received {
    /// The event as published (a CloudEvent).
    pub body: Bytes,
    /// Its lock token.
    pub lock_token: String,
    /// Receives of it so far, this one included.
    pub delivery_count: u32,
}

/// Why a lock token could not be used (`failedLockTokens[].error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenFailure {
    /// Not a lock token gridlet issued (malformed or altered).
    Malformed,
    /// A token of another event subscription.
    Foreign,
    /// No such lock: the event was settled, or received again since (an older attempt's
    /// token), or the token is from before a restart (or its tag does not verify).
    Unknown,
    /// The lock expired.
    Expired,
}

impl TokenFailure {
    /// The error code on the wire.
    pub fn code(self) -> &'static str {
        match self {
            Self::Malformed | Self::Foreign => "BadToken",
            Self::Unknown | Self::Expired => "TokenLost",
        }
    }

    /// The error message on the wire.
    pub fn message(self) -> &'static str {
        match self {
            Self::Malformed => "the lock token is malformed",
            Self::Foreign => "the lock token belongs to another event subscription",
            Self::Unknown => "the lock token is unknown: its event was settled or received again, or the token predates a restart",
            Self::Expired => "the lock expired: the event is available to receivers again",
        }
    }
}

impl From<Lost> for TokenFailure {
    fn from(l: Lost) -> Self {
        match l {
            Lost::Unknown => Self::Unknown,
            Lost::Expired => Self::Expired,
        }
    }
}

/// The answer of acknowledge, release, reject and renew: each token succeeded or failed.
#[derive(Debug, Default, Clone)]
pub struct TokenResults {
    /// Tokens whose operation was done.
    pub succeeded: Vec<String>,
    /// Tokens refused, with why.
    pub failed: Vec<(String, TokenFailure)>,
}

/// What can go wrong in a pull operation as a whole.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// The subscription is not a queue subscription.
    #[error("the event subscription's deliveryMode is Push: it cannot be received from")]
    NotQueue,
    /// The store could not make the operation durable.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A queue subscription's operations (see the module docs).
pub struct Puller<'a> {
    pub(super) shared: &'a Arc<SubscriptionState>,
    pub(super) ctx: &'a Arc<DeliveryContext>,
    pub(super) pull: &'a PullState,
    /// The caller's trace context (its request's `traceparent`), linked from the operations'
    /// spans ([`trace`]).
    pub(super) caller: Option<&'a TraceContext>,
}

impl<'a> Puller<'a> {
    /// These operations on behalf of a caller whose request came in trace context `caller`:
    /// their spans link it (and are its children when no event carries a context).
    #[must_use]
    pub fn traced_by(self, caller: Option<&'a TraceContext>) -> Self {
        Self { caller, ..self }
    }
}

impl Puller<'_> {
    fn settings(
        &self,
    ) -> Result<
        (
            QueueSettings,
            crate::model::subscription::EffectivePolicy,
            bool,
        ),
        PullError,
    > {
        let cfg = self.shared.config();
        let q = cfg.sub.queue.clone().ok_or(PullError::NotQueue)?;
        Ok((q, cfg.policy, cfg.sub.persisted))
    }

    /// Events received and not yet settled.
    pub fn locked(&self) -> usize {
        self.pull.locked()
    }

    /// The locks summed up: delivery counts, the oldest locked event, the next expiry.
    pub fn lock_summary(&self) -> LockSummary {
        self.pull.summary()
    }

    /// Receive up to `max` events, waiting up to `wait` for the first to be available
    /// (answering as soon as some are). Each is locked for the subscription's lock duration.
    ///
    /// # Errors
    /// [`PullError::NotQueue`]; the store failed to record the receive.
    pub async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Received>, PullError> {
        self.receive_until(max, wait, std::future::pending()).await
    }

    /// [`Puller::receive`], whose wait also ends (with no events) when `ended` completes: the
    /// connection table takes the slot of a waiting receive back to make room.
    ///
    /// # Errors
    /// As [`Puller::receive`].
    pub async fn receive_until(
        &self,
        max: usize,
        wait: Duration,
        ended: impl std::future::Future<Output = ()>,
    ) -> Result<Vec<Received>, PullError> {
        let span = trace::ReceiveTrace::begin(&self.ctx.tracer, self.caller);
        let started = Instant::now();
        let deadline = started + wait;
        tokio::pin!(ended);
        loop {
            let arrived = self.pull.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            let taken_ns = match self.ctx.tracer.enabled() {
                true => crate::telemetry::now_ns(),
                false => 0,
            };
            let got = self.take(max)?;
            if !got.is_empty() {
                return self.record(got, &span, taken_ns);
            }
            // Events on their way into the window (see `READ_BACK_WAIT`) are waited for, when
            // there is room to lock them.
            let coming = self.shared.queue().spilled_ready() > 0 && !self.pull.locks().full();
            let end = match coming {
                false => deadline,
                true => deadline.max(started + READ_BACK_WAIT),
            };
            if Instant::now() >= end || self.ctx.drain.started() {
                return Ok(Vec::new());
            }
            tokio::select! {
                _ = arrived => {}
                _ = tokio::time::sleep_until(end) => {}
                () = &mut ended => return Ok(Vec::new()),
            }
        }
    }

    /// Take and lock up to `max` events from the queue.
    fn take(&self, max: usize) -> Result<Vec<Pending>, PullError> {
        let (q, policy, _) = self.settings()?;
        let (granted, byte_room) = self.pull.locks().reserve(max);
        if granted == 0 {
            return Ok(Vec::new());
        }
        let now = Instant::now();
        let now_ms = self.ctx.clock.now_ms();
        let (mut items, mut expired) = (Vec::new(), Vec::<Pending>::new());
        let mut bytes = 0u64;
        let keep_bodies;
        {
            let mut queue = self.shared.queue();
            // A persisted subscription's events are in the event log: its locks keep no bodies.
            keep_bodies = !queue.is_windowed();
            while items.len() < granted && bytes < byte_room {
                let lim = Limits {
                    max_events: granted - items.len(),
                    max_bytes: usize::try_from(byte_room - bytes).unwrap_or(usize::MAX),
                    max_in_flight: usize::MAX,
                    retry_cap: usize::MAX,
                };
                let is_expired =
                    |p: &Pending| retry::is_expired(&policy, p.first_enqueued_ms, now_ms);
                match pick(&mut queue, now, &lim, is_expired, &mut expired) {
                    Some(batch) => {
                        bytes += batch.iter().map(|p| p.event.body.len() as u64).sum::<u64>();
                        items.extend(batch);
                    }
                    None => break,
                }
            }
        }
        drop_events(
            self.shared,
            self.ctx,
            expired,
            DropReason::TimeToLiveExceeded,
            None,
        );
        // Received `maxDeliveryCount` times already (a lock that expired, or a release, after
        // the last one; or recovered so after a restart): a dead letter, not another receive.
        let (spent, mut items): (Vec<Pending>, Vec<Pending>) = items
            .into_iter()
            .partition(|p| p.attempts >= q.max_delivery_count);
        drop_events(
            self.shared,
            self.ctx,
            spent,
            DropReason::MaxDeliveryAttemptsExceeded,
            None,
        );
        for p in &mut items {
            p.attempts += 1;
        }
        let n = items.len();
        let expires = now + q.lock_duration;
        let keep = Keep {
            bodies: keep_bodies,
            traces: self.ctx.tracer.enabled(),
        };
        self.pull.locks().insert(granted, &items, expires, keep);
        self.shared.metrics.delivery_attempts_count.add(n as u64);
        self.shared.metrics.received.add(n as u64);
        // The window may want refilling now that events left it.
        if n > 0 {
            self.shared.notify.notify_one();
        }
        Ok(items)
    }

    /// Stage the receive of `items` (persisted subscriptions: not waited for, see the module
    /// docs), record its span (taken at `taken_ns`), then answer it.
    fn record(
        &self,
        items: Vec<Pending>,
        span: &trace::ReceiveTrace<'_>,
        taken_ns: u64,
    ) -> Result<Vec<Received>, PullError> {
        let (q, _, persisted) = self.settings()?;
        let lock_ms = q.lock_duration.as_millis() as u64;
        trace::record(
            &self.ctx.tracer,
            self.shared,
            span,
            &items,
            taken_ns,
            lock_ms,
        );
        if persisted {
            let due_ms = self.ctx.clock.now_ms() + q.lock_duration.as_millis() as u64;
            self.write_states(
                items
                    .iter()
                    .map(|p| (p.seq, p.attempts, p.first_enqueued_ms)),
                due_ms,
            );
        }
        let queue = self.shared.queue_id;
        Ok(items
            .into_iter()
            .map(|p| Received {
                lock_token: self.pull.key.issue(TokenId {
                    queue,
                    seq: p.seq,
                    attempt: p.attempts,
                }),
                delivery_count: p.attempts,
                body: p.event.body.clone(),
            })
            .collect())
    }

    /// Store the retry state of `items` (sequence number, attempts, first enqueue; due at
    /// `due_ms`), one write per distinct (attempts, first enqueue).
    fn write_states(&self, items: impl Iterator<Item = (u64, u32, u64)>, due_ms: u64) {
        let mut groups: Vec<(RetryState, Vec<u64>)> = Vec::new();
        for (seq, attempts, first_enqueued_ms) in items {
            let state = RetryState {
                attempts,
                first_enqueued_ms,
                due_ms,
            };
            match groups.iter_mut().find(|(s, _)| *s == state) {
                Some((_, seqs)) => seqs.push(seq),
                None => groups.push((state, vec![seq])),
            }
        }
        for (state, seqs) in groups {
            self.ctx.writer.submit(
                self.shared.owner(None),
                vec![Write::RetryState { seqs, state }],
            );
        }
    }
}

/// One [`SubQueue::pick`], the slot it counts given back at once (a receive holds no send).
fn pick(
    queue: &mut SubQueue,
    now: Instant,
    lim: &Limits,
    expired: impl Fn(&Pending) -> bool,
    expired_out: &mut Vec<Pending>,
) -> Option<Vec<Pending>> {
    let batch = queue.pick(now, lim, expired, expired_out)?;
    queue.finish(batch.retry);
    Some(batch.items)
}

/// Put events back in the queue's retry lane, due at `due`, one entry each (a later receive
/// takes as many as it asks for, never a whole released batch). Those whose lock kept no body
/// (a persisted subscription) go back by sequence number, read from the store when due.
fn requeue(queue: &Mutex<SubQueue>, due: Instant, items: Vec<Lock>) {
    let mut q = crate::sync::lock(queue);
    let mut spilled = Vec::new();
    for l in items {
        match l.into_pending() {
            Ok(p) => q.schedule_retry(due, vec![p]),
            Err(l) => spilled.push(l.seq),
        }
    }
    q.return_spilled(due, spilled);
}

/// Events that leave undelivered (expired, received `maxDeliveryCount` times, rejected): `settle`
/// decides their letters and store writes, `apply` does them, and their places in the queue are
/// given back. `last`: the receiver's answer that sent them there (a reject).
pub(super) fn drop_events(
    shared: &Arc<SubscriptionState>,
    ctx: &DeliveryContext,
    items: Vec<Pending>,
    reason: DropReason,
    last: Option<&Outcome>,
) {
    if items.is_empty() {
        return;
    }
    let now_ms = ctx.clock.now_ms();
    let cfg = shared.config();
    let fx = super::settle::decided(cfg.rules(), items, reason, last, now_ms, true);
    super::apply::apply(shared, ctx, fx);
}
