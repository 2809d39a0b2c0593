//! The publish path: route → admit → persist → enqueue (a request is accepted whole or
//! rejected whole).
//!
//! 1. [`route`] every event through every subscription's compiled filter;
//! 2. [`Broker::admit`]: each matching subscription reserves its places
//!    ([`SubscriptionHandle::reserve`]: an in-memory subscription within its bound), and the
//!    memory bound is checked (full → 503 + Retry-After, or dead letters under
//!    `queueFullPolicy=deadLetter`);
//! 3. [`persist`] the copies for **persisted** subscriptions (numbered and submitted to the store
//!    in one step, so the store sees sequence order; then the group commit); only then
//! 4. [`Broker::enqueue`] into the reserved places ([`SubscriptionHandle::enqueue`], which
//!    wakes the dispatchers).
//!
//! Cancel safety: steps 3 and 4 run in their own task, so a client that hangs up while the
//! commit is under way cannot leave an event durable but not queued (it would wait for a
//! restart, or expire). The request only waits for that task.

use super::dedup::Identity;
use super::route_trace::{Admission, RouteSpans};
use super::{Broker, BrokerError, TopicEntry};
use crate::config::Key;
use crate::delivery::payload::EventData;
use crate::delivery::subscription::{Reservation, SubConfig, SubscriptionHandle};
use crate::model::event::IncomingEvent;
use crate::model::topic::EventSchema;
use crate::store::{Commit, Store};
use crate::telemetry::TraceContext;
use std::sync::Arc;

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

/// What admission decided for one subscription's copies of a request.
enum Admitted {
    /// Nothing matched it.
    Nothing,
    /// Places reserved in its queue.
    Queue(Reservation),
    /// It is full and `queueFullPolicy=deadLetter`: its copies become dead letters.
    Overflow,
}

/// The routed copies of subscription `r`'s events with their sequence numbers.
fn routed<'a>(
    r: &'a [usize],
    payloads: &'a Payloads,
) -> impl Iterator<Item = (u64, &'a Arc<EventData>)> {
    r.iter()
        .filter_map(|&i| payloads.get(i).and_then(Option::as_ref))
        .map(|(seq, data)| (*seq, data))
}

/// An event as the topic's live tail samples it.
fn tailed(ev: &IncomingEvent) -> super::tail::Offered<'_> {
    let view = ev.view();
    super::tail::Offered {
        id: &ev.id,
        subject: view.subject,
        event_type: view.event_type,
        body: &ev.body,
    }
}

/// Route every event through every subscription's filter.
fn route(configs: &[Arc<SubConfig>], events: &[IncomingEvent]) -> Routes {
    let mut routes = Routes {
        per_sub: vec![Vec::new(); configs.len()],
        unmatched: 0,
        request_bytes: 0,
        matched_bytes: 0,
    };
    for (i, ev) in events.iter().enumerate() {
        let size = crate::delivery::payload::payload_size(&ev.body, &ev.id);
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

/// Submit the copies for persisted subscriptions to the store; the [`Commit`] resolves once they
/// are durable. Each event's body is shared by its copies (the store writes it once).
fn persist(
    store: &dyn Store,
    subs: &[Arc<SubscriptionHandle>],
    configs: &[Arc<SubConfig>],
    routes: &Routes,
    payloads: &Payloads,
    now_ms: u64,
) -> Result<Commit, BrokerError> {
    let mut durable = Vec::new();
    for ((sub, cfg), r) in subs.iter().zip(configs).zip(&routes.per_sub) {
        if !cfg.sub.persisted {
            continue;
        }
        for (seq, data) in routed(r, payloads) {
            durable.push((sub.queue_id(), data.to_stored(seq, now_ms)));
        }
    }
    if durable.is_empty() {
        return Ok(Commit::done());
    }
    store.submit(durable).map_err(BrokerError::Store)
}

impl Broker {
    /// Route and enqueue a validated publish request; returns once every persisted copy is
    /// durable. `span` is the request's `publish` span: when it is recorded, each subscription
    /// the events matched gets a `route` span under it.
    ///
    /// # Errors
    /// [`BrokerError::Unavailable`] when a matching subscription is full (unless
    /// `broker__queueFullPolicy=deadLetter`: then that subscription's copies are dead-lettered),
    /// [`BrokerError::Store`] when the store is full or fails. Nothing is enqueued in any of these cases.
    pub async fn publish(
        &self,
        entry: &TopicEntry,
        events: Vec<IncomingEvent>,
        span: Option<&TraceContext>,
    ) -> Result<(), BrokerError> {
        entry.metrics.events_received.add(events.len() as u64);
        let (events, fresh) = self.deduplicate(entry, events);
        if events.is_empty() {
            return Ok(());
        }
        let now_ms = self.inner.ctx.clock.now_ms();
        if entry.tail.watched(now_ms) {
            entry.tail.offer(now_ms, events.iter().map(tailed));
        }
        let mut spans = RouteSpans::start(self.tracer(), span);
        let subs = entry.subscriptions();
        let configs: Vec<_> = subs.iter().map(|s| s.config()).collect();
        let routes = route(&configs, &events);
        entry.metrics.unmatched_events.add(routes.unmatched);
        let admitted = match self.admit(&subs, &configs, &routes) {
            Ok(a) => a,
            Err((e, refused)) => {
                if let Some(mut s) = spans {
                    let n = events.len();
                    let t = entry.topic();
                    s.decided(
                        &t.name,
                        &subs,
                        &configs,
                        &routes.per_sub,
                        n,
                        |i| match refused {
                            Some(r) if i == r => Admission::Refused,
                            _ => Admission::NotAdmitted,
                        },
                    );
                    s.finish(Some(&e.to_string()));
                }
                return Err(e);
            }
        };
        if let Some(s) = &mut spans {
            let t = entry.topic();
            s.decided(
                &t.name,
                &subs,
                &configs,
                &routes.per_sub,
                events.len(),
                |i| match admitted.get(i) {
                    Some(Admitted::Overflow) => Admission::DeadLetter,
                    _ => Admission::Queued,
                },
            );
        }
        let numbered = {
            // Numbered and submitted in one step: the store sees events in sequence order.
            let mut next = crate::sync::lock(&self.inner.seq);
            let payloads = self.payloads(&routes, events, &mut next);
            let store = &*self.inner.ctx.store;
            persist(store, &subs, &configs, &routes, &payloads, now_ms).map(|c| (payloads, c))
        };
        let (payloads, commit) = match numbered {
            Ok(n) => n,
            Err(e) => {
                if let Some(s) = spans {
                    s.finish(Some(&e.to_string()));
                }
                return Err(e);
            }
        };
        let broker = self.clone();
        // Runs to completion even when the caller stops waiting (see the module docs).
        let commit_and_enqueue = async move {
            let durable = commit.wait().await.map_err(BrokerError::Store);
            if let Some(s) = spans {
                s.finish(durable.as_ref().err().map(|e| e.to_string()).as_deref());
            }
            durable?;
            broker.enqueue(&subs, &routes, admitted, &payloads, now_ms);
            Ok(())
        };
        let accepted = tokio::spawn(commit_and_enqueue).await?;
        if let (Ok(()), Some((ids, window_ms))) = (&accepted, fresh) {
            let now_ms = self.inner.ctx.clock.now_ms();
            let mut w = crate::sync::lock(&entry.dedup);
            for id in ids {
                w.record(id, now_ms, window_ms);
            }
        }
        accepted
    }

    /// The events of a publish whose identity the topic has not accepted within its
    /// deduplication window (nor earlier in the same request), and, when the window is on,
    /// their identities with the window (recorded once the publish succeeds). Suppressed
    /// events are counted.
    fn deduplicate(
        &self,
        entry: &TopicEntry,
        events: Vec<IncomingEvent>,
    ) -> (Vec<IncomingEvent>, Option<(Vec<Identity>, u64)>) {
        let topic = entry.topic();
        let Some(window_ms) =
            super::dedup::window_ms(&topic, self.inner.cfg.broker.deduplication_window)
        else {
            return (events, None);
        };
        let now_ms = self.inner.ctx.clock.now_ms();
        let cloud = topic.input_schema == EventSchema::CloudEventV1_0;
        let mut w = crate::sync::lock(&entry.dedup);
        let mut ids = Vec::with_capacity(events.len());
        let mut in_request = std::collections::HashSet::with_capacity(events.len());
        let mut kept = Vec::with_capacity(events.len());
        for ev in events {
            let source = if cloud {
                super::dedup::cloud_event_source(&ev.body)
            } else {
                None
            };
            let id = w.identity(source.as_deref(), &ev.id);
            if w.seen(id, now_ms, window_ms) || !in_request.insert(id) {
                entry.metrics.deduplicated.inc();
                continue;
            }
            ids.push(id);
            kept.push(ev);
        }
        (kept, Some((ids, window_ms)))
    }

    /// Reserve each matching subscription's places, within the bounds of in-memory queues.
    /// A full subscription's copies go to dead letters under `queueFullPolicy=deadLetter`.
    /// On error every reservation made so far is given back (dropped); the error names the
    /// subscription that refused (its index; `None`: the memory bound).
    fn admit(
        &self,
        subs: &[Arc<SubscriptionHandle>],
        configs: &[Arc<SubConfig>],
        routes: &Routes,
    ) -> Result<Vec<Admitted>, (BrokerError, Option<usize>)> {
        let max_pending = self.inner.cfg.broker.max_pending_events_per_subscription;
        let overflow_to_dead_letters = self.inner.cfg.resilience.queue_full_policy
            == crate::delivery::classify::QueueFullPolicy::DeadLetter;
        let mut admitted = Vec::with_capacity(subs.len());
        for ((sub, cfg), r) in subs.iter().zip(configs).zip(&routes.per_sub) {
            if r.is_empty() {
                admitted.push(Admitted::Nothing);
                continue;
            }
            let bound = (!cfg.sub.persisted).then_some(max_pending);
            match sub.reserve(r.len(), bound) {
                Ok(places) => admitted.push(Admitted::Queue(places)),
                Err(_) if overflow_to_dead_letters => admitted.push(Admitted::Overflow),
                Err(_) => {
                    let e = BrokerError::unavailable(format!(
                        "subscription '{}' has {} pending events ({}); retry later",
                        sub.name(),
                        max_pending,
                        Key::broker__maxPendingEventsPerSubscription.name()
                    ));
                    return Err((e, Some(admitted.len())));
                }
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
            let e = BrokerError::unavailable(
                format!(
                    "gridlet holds {} of the {} bytes of undelivered events {} allows in memory; retry later",
                    pending_bytes.used(),
                    pending_bytes.limit(),
                    Key::broker__maxPendingBytes.name()
                ),
            );
            return Err((e, None));
        }
        Ok(admitted)
    }

    /// One shared payload per matched event, with one sequence number each.
    fn payloads(
        &self,
        routes: &Routes,
        mut events: Vec<IncomingEvent>,
        next: &mut u64,
    ) -> Payloads {
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
                let seq = *next;
                *next += 1;
                // Moved, not cloned: each event gets one payload, and `events` is not read
                // after this.
                let body = if copy_out {
                    bytes::Bytes::copy_from_slice(&ev.body)
                } else {
                    std::mem::take(&mut ev.body)
                };
                let id = std::mem::take(&mut ev.id).into_boxed_str();
                let data = EventData::new(body, id, ev.trace.take(), Some(pending_bytes));
                *slot = Some((seq, Arc::new(data)));
            }
        }
        payloads
    }

    /// Push the routed copies into their reserved places (or dead letters, for a full
    /// subscription); the handles wake the dispatchers.
    fn enqueue(
        &self,
        subs: &[Arc<SubscriptionHandle>],
        routes: &Routes,
        admitted: Vec<Admitted>,
        payloads: &Payloads,
        now_ms: u64,
    ) {
        for ((sub, r), admitted) in subs.iter().zip(&routes.per_sub).zip(admitted) {
            match admitted {
                Admitted::Nothing => {}
                Admitted::Queue(places) => {
                    sub.enqueue(places, routed(r, payloads), now_ms);
                }
                Admitted::Overflow => sub.dead_letter_overflow(routed(r, payloads), now_ms),
            }
        }
    }

    /// Whether `bytes` more fit under `broker__maxPendingBytes`. The one check for publish and
    /// replay.
    pub(super) fn has_byte_room(&self, bytes: u64) -> bool {
        !self.inner.ctx.pending_bytes.would_exceed(bytes)
    }
}
