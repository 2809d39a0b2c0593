//! The publish path: route → admit → persist → enqueue (a request is accepted whole or
//! rejected whole).
//!
//! 1. [`route`] every event through every subscription's compiled filter;
//! 2. [`Broker::admit`]: each matching in-memory subscription's bound and the memory bound
//!    (full → 503 + Retry-After, or dead letters under `queueFullPolicy=deadLetter`);
//! 3. [`persist`] the copies for **persisted** subscriptions (append + group commit); only then
//! 4. [`enqueue`] into the in-memory queues and wake the dispatchers.
//!
//! Cancel safety: steps 3 and 4 run in their own task, so a client that hangs up while the
//! commit is under way cannot leave an event durable but not queued (it would wait for a
//! restart, or expire). The request only waits for that task.

use super::{store_err, Broker, SubEntry, TopicEntry};
use crate::config::Key;
use crate::delivery::dispatcher::{SubConfig, SubShared};
use crate::delivery::queue::{EventData, Pending};
use crate::error::ApiError;
use crate::model::event::IncomingEvent;
use crate::store::{RetryState, Store, StoredEvent};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Where each event of a request goes.
struct Routes {
    /// Per subscription (same order as the topic's list): indexes of the matching events.
    per_sub: Vec<Vec<usize>>,
    /// Events no subscription matched.
    unmatched: u64,
    /// Bytes of the whole request.
    request_bytes: u64,
    /// Bytes of the events that go anywhere (for the memory bound).
    matched_bytes: u64,
}

/// One shared payload per matched event, with its sequence number (`None`: matched nowhere).
type Payloads = Vec<Option<(u64, Arc<EventData>)>>;

/// Route every event through every subscription's filter.
fn route(configs: &[Arc<SubConfig>], events: &[IncomingEvent]) -> Routes {
    let mut routes = Routes {
        per_sub: vec![Vec::new(); configs.len()],
        unmatched: 0,
        request_bytes: 0,
        matched_bytes: 0,
    };
    for (i, ev) in events.iter().enumerate() {
        let size = crate::delivery::queue::payload_size(&ev.body, &ev.id);
        routes.request_bytes += size;
        let view = ev.view();
        let mut matched = false;
        for (r, cfg) in routes.per_sub.iter_mut().zip(configs) {
            if cfg.sub.filter.as_ref().is_none_or(|f| f.matches(&view)) {
                r.push(i);
                matched = true;
            }
        }
        if matched {
            routes.matched_bytes += size;
        } else {
            routes.unmatched += 1;
        }
    }
    routes
}

/// Append the copies for persisted subscriptions and wait until they are durable.
async fn persist(
    store: &dyn Store,
    subs: &[Arc<SubEntry>],
    configs: &[Arc<SubConfig>],
    routes: &Routes,
    payloads: &Payloads,
    now_ms: u64,
) -> Result<(), ApiError> {
    let mut durable = Vec::new();
    for ((sub, cfg), r) in subs.iter().zip(configs).zip(&routes.per_sub) {
        if !cfg.sub.persisted {
            continue;
        }
        for &i in r {
            if let Some(Some((seq, data))) = payloads.get(i) {
                durable.push((
                    sub.shared.queue_id,
                    StoredEvent {
                        seq: *seq,
                        id: data.id.to_string(),
                        body: data.body.clone(),
                        state: RetryState {
                            attempts: 0,
                            first_enqueued_ms: now_ms,
                            due_ms: 0,
                        },
                    },
                ));
            }
        }
    }
    if durable.is_empty() {
        return Ok(());
    }
    store.append_commit(durable).await.map_err(store_err)
}

impl Broker {
    /// Route and enqueue a validated publish request; returns once every persisted copy is
    /// durable.
    ///
    /// # Errors
    /// 503 when a matching subscription is full (unless `broker__queueFullPolicy=deadLetter`:
    /// then that subscription's copies are dead-lettered), 507 when the store is full, 500 on
    /// store failure. Nothing is enqueued in any of these cases.
    pub async fn publish(
        &self,
        entry: &TopicEntry,
        events: Vec<IncomingEvent>,
    ) -> Result<(), ApiError> {
        entry.metrics.events_received.add(events.len() as u64);
        if events.is_empty() {
            return Ok(());
        }
        let subs = entry.subscriptions();
        let configs: Vec<_> = subs.iter().map(|s| s.shared.config()).collect();
        let routes = route(&configs, &events);
        entry.metrics.unmatched_events.add(routes.unmatched);
        let full = self.admit(&subs, &configs, &routes)?;
        let payloads = self.payloads(&routes, events);
        let now_ms = self.inner.ctx.clock.now_ms();
        let broker = self.clone();
        // Runs to completion even when the caller stops waiting (see the module docs).
        let commit_and_enqueue = async move {
            let store = broker.inner.ctx.store.clone();
            persist(&*store, &subs, &configs, &routes, &payloads, now_ms).await?;
            broker.enqueue(&subs, &routes, &full, &payloads, now_ms);
            Ok(())
        };
        tokio::spawn(commit_and_enqueue)
            .await
            .map_err(|e| ApiError::internal(&e))?
    }

    /// Check the bounds of in-memory queues. Returns, per subscription, whether its copies go
    /// to dead letters because it is full (`queueFullPolicy=deadLetter`).
    fn admit(
        &self,
        subs: &[Arc<SubEntry>],
        configs: &[Arc<SubConfig>],
        routes: &Routes,
    ) -> Result<Vec<bool>, ApiError> {
        let max_pending = self.inner.cfg.broker.max_pending_events_per_subscription;
        let overflow_to_dead_letters = self.inner.cfg.resilience.queue_full_policy
            == crate::delivery::policy::QueueFullPolicy::DeadLetter;
        let mut full = vec![false; subs.len()];
        for (((sub, cfg), r), full) in subs.iter().zip(configs).zip(&routes.per_sub).zip(&mut full)
        {
            if r.is_empty() || cfg.sub.persisted {
                continue;
            }
            if !self.has_room(&sub.shared, r.len()) {
                if overflow_to_dead_letters {
                    *full = true;
                    continue;
                }
                return Err(ApiError::unavailable(
                    format!(
                        "subscription '{}' has {} pending events ({}); retry later",
                        sub.shared.name,
                        max_pending,
                        Key::broker__maxPendingEventsPerSubscription.name()
                    ),
                    Duration::from_secs(10),
                ));
            }
        }
        // Bytes held in memory for delivery, all subscriptions together. Only a publish that
        // reaches an in-memory subscription is refused: persisted subscriptions hold a bounded
        // window in memory and are bounded on disk.
        let to_memory = configs
            .iter()
            .zip(&routes.per_sub)
            .any(|(cfg, r)| !r.is_empty() && !cfg.sub.persisted);
        let pending_bytes = &self.inner.ctx.pending_bytes;
        if to_memory && !self.has_byte_room(routes.matched_bytes) {
            return Err(ApiError::unavailable(
                format!(
                    "gridlet holds {} of the {} bytes of undelivered events {} allows in memory; retry later",
                    pending_bytes.used(),
                    pending_bytes.limit(),
                    Key::broker__maxPendingBytes.name()
                ),
                Duration::from_secs(10),
            ));
        }
        Ok(full)
    }

    /// One shared payload per matched event, with one sequence number each.
    fn payloads(&self, routes: &Routes, mut events: Vec<IncomingEvent>) -> Payloads {
        // Event bodies can be slices of the request's buffer, which then stays in memory while
        // any of them is queued. When filters matched less than half of the request, the
        // matched bodies are copied out, so the buffer goes with the request and what is
        // counted is at least half of what is held.
        let copy_out = routes.matched_bytes * 2 < routes.request_bytes;
        let pending_bytes = &self.inner.ctx.pending_bytes;
        let mut payloads: Payloads = vec![None; events.len()];
        for r in &routes.per_sub {
            for &i in r {
                let (Some(slot), Some(ev)) = (payloads.get_mut(i), events.get_mut(i)) else {
                    continue;
                };
                if slot.is_some() {
                    continue;
                }
                let seq = self.inner.seq.fetch_add(1, Ordering::Relaxed);
                // Moved, not cloned: each event gets one payload, and `events` is not read
                // after this.
                let body = if copy_out {
                    bytes::Bytes::copy_from_slice(&ev.body)
                } else {
                    std::mem::take(&mut ev.body)
                };
                let id = std::mem::take(&mut ev.id).into_boxed_str();
                *slot = Some((seq, Arc::new(EventData::new(body, id, Some(pending_bytes)))));
            }
        }
        payloads
    }

    /// Push the routed copies into the in-memory queues (or dead letters, for a full
    /// subscription) and wake the dispatchers.
    fn enqueue(
        &self,
        subs: &[Arc<SubEntry>],
        routes: &Routes,
        full: &[bool],
        payloads: &Payloads,
        now_ms: u64,
    ) {
        let now = Instant::now();
        for ((sub, r), full) in subs.iter().zip(&routes.per_sub).zip(full) {
            if r.is_empty() {
                continue;
            }
            if *full {
                self.dead_letter_overflow(&sub.shared, r, payloads, now_ms, now);
                continue;
            }
            // A dispatcher with every slot taken picks up new events when a send completes:
            // waking it now would be wasted work (10 hanging endpoints = 10 idle wake-ups per
            // publish).
            let slot_free = {
                let mut q = sub.shared.queue();
                for &i in r {
                    if let Some(Some((seq, data))) = payloads.get(i) {
                        q.push(Pending {
                            seq: *seq,
                            event: data.clone(),
                            attempts: 0,
                            first_enqueued_ms: now_ms,
                            enqueued_at: now,
                        });
                    }
                }
                q.in_flight() < self.inner.ctx.max_in_flight
            };
            sub.shared.metrics.enqueued.add(r.len() as u64);
            if slot_free {
                sub.shared.notify.notify_one();
            }
        }
    }

    /// Whether an in-memory subscription's queue takes `events` more
    /// (`broker__maxPendingEventsPerSubscription`). The one check for publish and replay.
    pub(super) fn has_room(&self, shared: &SubShared, events: usize) -> bool {
        let max_pending = self.inner.cfg.broker.max_pending_events_per_subscription;
        shared.queue().pending() + events <= max_pending
    }

    /// Whether `bytes` more fit under `broker__maxPendingBytes`. The one check for publish and
    /// replay.
    pub(super) fn has_byte_room(&self, bytes: u64) -> bool {
        !self.inner.ctx.pending_bytes.would_exceed(bytes)
    }
}
