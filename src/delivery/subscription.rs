//! A subscription as the broker sees it: a [`SubscriptionHandle`] owning the subscription's
//! queue and dispatcher task. The broker admits, enqueues, restores and replays through it and
//! never touches the queue, its lock, [`Pending`] values or the task's `Notify`.
//!
//! Admission is a [`Reservation`]: places in an in-memory subscription's queue are counted as
//! pending when the publish is admitted (before anything is written), and the events are pushed
//! into them once the publish is durable. A publish that fails in between gives its places
//! back when the reservation drops, so the bound (`broker__maxPendingEventsPerSubscription`)
//! holds exactly, with no window between the check and the push.

use super::apply::apply;
use super::context::DeliveryContext;
use super::dispatcher;
use super::health::HealthSnapshot;
use super::payload::{EventData, Pending};
use super::pull::{PullState, Puller};
use super::queue::{SubQueue, Window};
use super::retry::{self, DropReason};
use super::settle;
use super::state::SubscriptionState;
use crate::clock::WallMs;
use crate::metrics::SubscriptionMetrics;
use crate::store::{QueueId, StoreError};
use crate::sync::AbortOnDrop;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

pub use super::state::SubConfig;

/// The queue has no room for the events asked (`broker__maxPendingEventsPerSubscription`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the subscription's queue holds {pending} of {bound} events")]
pub struct Full {
    /// Events pending now.
    pub pending: usize,
    /// The bound.
    pub bound: usize,
}

/// Places reserved in a subscription's queue by [`SubscriptionHandle::reserve`]; given back
/// when dropped unless used by [`SubscriptionHandle::enqueue`] or
/// [`SubscriptionHandle::replay`].
#[must_use = "a reservation holds queue places until it is used or dropped"]
pub struct Reservation {
    shared: Arc<SubscriptionState>,
    places: usize,
}

impl Reservation {
    /// Places held.
    pub fn places(&self) -> usize {
        self.places
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.places > 0 {
            self.shared.queue().unreserve(self.places);
        }
    }
}

/// A subscription's delivery side: its queue, its dispatcher task (aborted when the handle is
/// dropped, with every send in flight), its configuration and metrics.
pub struct SubscriptionHandle {
    shared: Arc<SubscriptionState>,
    ctx: Arc<DeliveryContext>,
    /// A queue subscription's locks (pull delivery; `None`: push).
    pull: Option<Arc<PullState>>,
    _task: AbortOnDrop,
}

impl SubscriptionHandle {
    /// Start delivering for a subscription with store queue `queue_id`. A persisted
    /// subscription's backlog lives in the store; memory holds a window of it.
    pub fn start(queue_id: QueueId, config: SubConfig, ctx: &Arc<DeliveryContext>) -> Self {
        let queue = if config.sub.persisted {
            SubQueue::windowed(Window::DEFAULT)
        } else {
            SubQueue::default()
        };
        let shared = Arc::new(SubscriptionState {
            queue_id,
            topic: Arc::from(config.sub.topic.as_str()),
            name: Arc::from(config.sub.name.as_str()),
            config: RwLock::new(Arc::new(config)),
            queue: Mutex::new(queue),
            notify: Notify::new(),
            metrics: Arc::default(),
            retired: Arc::default(),
            last_error: Mutex::new(None),
        });
        // A queue subscription is received from; its task only refills and expires locks.
        let (pull, task) = match shared.config().sub.queue {
            Some(_) => {
                let pull = Arc::new(PullState::new(
                    ctx.max_locks,
                    ctx.max_locked_bytes,
                    ctx.lock_tokens.clone(),
                ));
                let task = super::pull::task::spawn(shared.clone(), ctx.clone(), pull.clone());
                (Some(pull), task)
            }
            None => (None, dispatcher::spawn(shared.clone(), ctx.clone())),
        };
        Self {
            shared,
            ctx: ctx.clone(),
            pull,
            _task: task,
        }
    }

    /// A queue subscription's receive and settle operations (`None`: a push subscription).
    pub fn pull(&self) -> Option<Puller<'_>> {
        self.pull.as_deref().map(|pull| Puller {
            shared: &self.shared,
            ctx: &self.ctx,
            pull,
            caller: None,
        })
    }

    /// The store queue id.
    pub fn queue_id(&self) -> QueueId {
        self.shared.queue_id
    }

    /// The subscription's name as created.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Current configuration snapshot.
    pub fn config(&self) -> Arc<SubConfig> {
        self.shared.config()
    }

    /// Replace the configuration (PUT on an existing subscription).
    pub fn set_config(&self, c: SubConfig) {
        *crate::sync::write(&self.shared.config) = Arc::new(c);
        self.wake();
    }

    /// The subscription's counters and histograms.
    pub fn metrics(&self) -> &SubscriptionMetrics {
        &self.shared.metrics
    }

    /// Events accepted and not yet settled (reserved places included).
    pub fn pending(&self) -> usize {
        self.shared.queue().pending()
    }

    /// Body bytes of the events accepted and not yet settled (`gridlet_pending_bytes`): a
    /// persisted subscription's from the store (its backlog's bodies are there, and the store
    /// keeps the count across restarts), an in-memory one's from its queue. `None`: the store
    /// does not count them.
    pub fn pending_bytes(&self) -> Option<u64> {
        let q = self.shared.queue();
        if !q.is_windowed() {
            return Some(q.pending_bytes());
        }
        drop(q);
        self.ctx.store.pending_bytes(self.queue_id())
    }

    /// What waits: the oldest event waiting for an attempt, the retries and the next one's time.
    pub fn waiting(&self) -> crate::delivery::queue::Waiting {
        self.shared.queue().waiting()
    }

    /// Events whose bodies are only in the store (persisted subscriptions).
    pub fn spilled(&self) -> usize {
        self.shared.queue().spilled()
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.shared.queue().in_flight()
    }

    /// The last failed delivery attempt: when (wall ms) and why.
    pub fn last_error(&self) -> Option<(u64, String)> {
        crate::sync::lock(&self.shared.last_error).clone()
    }

    /// The destination's health, when tracked.
    pub fn endpoint_health(&self) -> Option<HealthSnapshot> {
        self.config().health.as_ref().map(|h| h.snapshot())
    }

    /// The subscription is being deleted: its dead letters not yet kept are not kept (the
    /// store asks [`crate::store::deadletter::LetterReport::wanted`] before it puts them, and
    /// the log store's letters refuse a deleted queue's), so a late write cannot bring any back
    /// once the caller has deleted its stored events and letters.
    pub fn retire(&self) {
        self.shared.retired.store(true, Ordering::SeqCst);
    }

    /// Undo [`SubscriptionHandle::retire`] (the deletion failed; the subscription stays).
    pub fn reinstate(&self) {
        self.shared.retired.store(false, Ordering::SeqCst);
    }

    /// Let the task look at its queue and endpoint again (after an endpoint re-enable).
    pub fn wake(&self) {
        self.shared.notify.notify_one();
    }

    /// Reserve `places` for events to be [`enqueue`](Self::enqueue)d once they are durable.
    /// `bound`: the in-memory queue bound; `None` for a persisted subscription, whose backlog
    /// is bounded by the store.
    ///
    /// # Errors
    /// [`Full`] when the places would pass `bound`; nothing is reserved then.
    pub fn reserve(&self, places: usize, bound: Option<usize>) -> Result<Reservation, Full> {
        let mut q = self.shared.queue();
        if let Some(bound) = bound {
            if !q.has_room(places, bound) {
                return Err(Full {
                    pending: q.pending(),
                    bound,
                });
            }
        }
        q.reserve(places);
        Ok(Reservation {
            shared: self.shared.clone(),
            places,
        })
    }

    /// Queue published events into `reservation`'s places (at most that many; the rest of the
    /// places are given back) and wake the task if it has a free slot. `now_ms`: when they were
    /// accepted (their time to live counts from it).
    pub fn enqueue<'a>(
        &self,
        mut reservation: Reservation,
        events: impl IntoIterator<Item = (u64, &'a Arc<EventData>)>,
        now_ms: u64,
    ) -> usize {
        let now = Instant::now();
        let (pushed, slot_free) = {
            let mut q = self.shared.queue();
            let mut pushed = 0;
            for (seq, data) in events.into_iter().take(reservation.places) {
                q.push_reserved(fresh(seq, data.clone(), now_ms, now));
                pushed += 1;
            }
            q.unreserve(reservation.places - pushed);
            reservation.places = 0;
            (pushed, q.in_flight() < self.ctx.max_in_flight)
        };
        self.shared.metrics.enqueued.add(pushed as u64);
        // A dispatcher with every slot taken picks up new events when a send completes:
        // waking it now would be wasted work (10 hanging endpoints = 10 idle wake-ups per
        // publish).
        if slot_free {
            self.wake();
        }
        pushed
    }

    /// Dead-letter published events at once (`broker__queueFullPolicy = deadLetter` on a full
    /// queue). Counted as enqueued and dropped, so the accounting identity holds.
    pub fn dead_letter_overflow<'a>(
        &self,
        events: impl IntoIterator<Item = (u64, &'a Arc<EventData>)>,
        now_ms: u64,
    ) {
        let now = Instant::now();
        let items: Vec<Pending> = events
            .into_iter()
            .map(|(seq, data)| fresh(seq, data.clone(), now_ms, now))
            .collect();
        self.shared.metrics.enqueued.add(items.len() as u64);
        let (cfg, at) = (self.shared.config(), self.ctx.clock.now_ms());
        let fx = settle::dead_letter(cfg.rules(), items, DropReason::QueueFull, at, false);
        apply(&self.shared, &self.ctx, fx);
    }

    /// Queue replayed dead letters (new sequence numbers, fresh attempts and time to live)
    /// into `reservation`'s places. Returns how many were queued.
    pub fn replay(
        &self,
        reservation: Reservation,
        events: &[(u64, Arc<EventData>)],
        now_ms: u64,
    ) -> usize {
        let n = self.enqueue(reservation, events.iter().map(|(s, d)| (*s, d)), now_ms);
        self.shared.metrics.dead_letters_replayed.add(n as u64);
        n
    }

    /// Restore a persisted subscription's queue from the store's index (sequence numbers and
    /// retry states, no bodies): events waiting for their first attempt, and events waiting
    /// for a retry (with their due time), are queued by sequence number only; their bodies are
    /// read when they enter the delivery window or fall due. What expired while gridlet was
    /// stopped is dead-lettered (and counted) now rather than delivered late.
    ///
    /// # Errors
    /// Unreadable store data.
    pub fn restore(&self) -> Result<(), StoreError> {
        let store = &self.ctx.store;
        let index = store.pending_runs(self.shared.queue_id)?;
        let now_ms = self.ctx.clock.now_ms();
        let now = Instant::now();
        let cfg = self.config();
        let policy = cfg.policy;
        let live = |ms: WallMs| !retry::is_expired(&policy, ms, now_ms);
        let mut expired = Vec::new();
        {
            let mut q = self.shared.queue();
            for run in index.fresh {
                let seqs = run.first..run.first + u64::from(run.count);
                if !live(run.first_enqueued_ms) {
                    expired.extend(seqs);
                } else {
                    q.push_spilled_run(run.first, run.count);
                }
            }
            for (seq, state) in index.retrying {
                if !live(state.first_enqueued_ms) {
                    expired.push(seq);
                } else {
                    let wait = Duration::from_millis(state.due_ms.saturating_sub(now_ms));
                    q.push_spilled_retry(now + wait, seq);
                }
            }
        }
        // The dispatcher may already have looked at the empty queue and gone to sleep.
        self.wake();
        if !expired.is_empty() {
            tracing::info!(topic = %self.shared.topic, subscription = %self.shared.name, events = expired.len(), reason = DropReason::TimeToLiveExceeded.as_str(), "stored events expired while gridlet was stopped");
            // Bodies are read in chunks so a large expired backlog never sits in memory at once.
            for chunk in expired.chunks(1024) {
                let items: Vec<Pending> = store
                    .get(self.shared.queue_id, chunk)?
                    .into_iter()
                    .flatten()
                    .map(|e| Pending {
                        seq: e.seq,
                        event: Arc::new(EventData::new(
                            e.body,
                            e.id.into_boxed_str(),
                            e.trace,
                            Some(&self.ctx.pending_bytes),
                        )),
                        attempts: e.state.attempts,
                        first_enqueued_ms: e.state.first_enqueued_ms,
                        enqueued_at: now,
                    })
                    .collect();
                // Counts them, keeps them as dead letters, then removes them from the store
                // (they never held places in the queue).
                let reason = DropReason::TimeToLiveExceeded;
                let fx = settle::dead_letter(cfg.rules(), items, reason, now_ms, false);
                apply(&self.shared, &self.ctx, fx);
            }
        }
        Ok(())
    }
}

/// A new event's queue entry: no attempts yet.
fn fresh(seq: u64, event: Arc<EventData>, now_ms: u64, now: Instant) -> Pending {
    Pending {
        seq,
        event,
        attempts: 0,
        first_enqueued_ms: now_ms,
        enqueued_at: now,
    }
}
