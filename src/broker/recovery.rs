//! Start-up recovery: topics, subscriptions and persisted events restored from the store, and
//! each topic's deduplication window rebuilt from the events the store kept (settled or not:
//! `retention.rs` keeps them for the longest window).

use super::*;
use crate::clock::WallMs;
use crate::model::record::{SubscriptionRecord, TopicRecord};
use crate::store::QueueId;

/// The identities of stored events accepted within their topic's deduplication window, by
/// topic key: `(accepted, seq, identity)`.
type Recent = HashMap<String, Vec<(WallMs, u64, dedup::Identity)>>;

impl Broker {
    /// Open the broker on `store`, restoring topics, subscriptions and persisted events.
    ///
    /// Must run inside a tokio runtime (it starts one task per subscription).
    ///
    /// # Errors
    /// Unreadable store data: the broker refuses to start rather than start empty.
    pub fn open(
        cfg: Arc<Config>,
        store: Arc<dyn Store>,
        sinks: Arc<dyn SinkFactory>,
        clock: Clock,
    ) -> Result<Self, OpenError> {
        let snapshot = store.load()?;
        // Disabled/frozen endpoints and dead letters live with the store: on disk with the log
        // store, in memory with the memory store.
        let dead_letters = store
            .dead_letters()
            .unwrap_or_else(|| Arc::new(crate::delivery::deadletter::MemoryDeadLetters::new()));
        let dead_letter_bound = crate::store::deadletter::DeadLetterBound {
            per_subscription: cfg.resilience.dead_letter_capacity,
            max_bytes: cfg.resilience.dead_letter_max_bytes,
        };
        let writer = crate::delivery::writer::StoreWriter::new(store.clone(), dead_letter_bound);
        let ctx = Arc::new(DeliveryContext {
            clock,
            store: store.clone(),
            global: Arc::new(Semaphore::new(cfg.broker.max_in_flight_total)),
            max_in_flight: cfg.broker.max_in_flight_per_subscription,
            max_locks: cfg.broker.max_locks_per_subscription,
            max_locked_bytes: cfg.broker.max_locked_bytes_per_subscription,
            lock_tokens: Arc::new(crate::delivery::lock_token::TokenKey::random()),
            log_success: cfg.broker.log_delivery_success,
            health_cfg: cfg.resilience.health.clone(),
            health: crate::delivery::health::HealthRegistry::restore(store.clone())?,
            dead_letters,
            dead_letter_bound,
            forwarder: crate::delivery::deadletter::Forwarder::with_policy(
                cfg.resilience.dead_letter_forward,
            ),
            drain: Default::default(),
            tracer: crate::telemetry::Tracer::new(&cfg.telemetry, &cfg.edge),
            writer: Arc::new(writer),
            pending_bytes: Arc::new(crate::delivery::payload::PendingBytes::new(
                cfg.broker.max_pending_bytes,
            )),
        });
        store.trace_commits(&ctx.tracer);
        let started_ms = ctx.clock.now_ms();
        let broker = Self {
            inner: Arc::new(BrokerState {
                cfg: cfg.clone(),
                ctx,
                sinks,
                topics: RwLock::new(Arc::new(HashMap::new())),
                mgmt: Mutex::new(()),
                replays: tokio::sync::Mutex::new(()),
                seq: Mutex::new(snapshot.max_seq + 1),
                mqtt: RwLock::new(Vec::new()),
                entra: std::sync::OnceLock::new(),
                samples: super::overview::ring(),
                started_ms,
                retention: std::sync::OnceLock::new(),
            }),
        };
        let topics = restore_topics(snapshot.topics, cfg.broker.deduplication_max_identities);
        // Before anything can settle or be collected: the store keeps what the windows need
        // (`retention.rs`), then the windows are read from it, then delivery starts.
        let now_ms = broker.inner.ctx.clock.now_ms();
        let longest = super::retention::longest_window_ms(&topics, cfg.broker.deduplication_window);
        let since = super::retention::horizon(now_ms, longest);
        store.retain_since(since);
        let recent = match since {
            Some(since) => {
                broker.read_identities(&topics, &snapshot.subscriptions, since, now_ms)?
            }
            None => Recent::new(),
        };
        broker.restore_subscriptions(&topics, snapshot.subscriptions)?;
        broker.rebuild_windows(&topics, recent);
        write(&broker.inner.topics, Arc::new(topics));
        broker.start_retention();
        broker.inner.ctx.health.prune_unclaimed();
        Ok(broker)
    }

    /// Subscriptions from their stored records (read back as they were created: no setting
    /// applies), each started (and its persisted events restored) under its topic.
    fn restore_subscriptions(
        &self,
        topics: &HashMap<String, Arc<TopicEntry>>,
        records: Vec<(QueueId, SubscriptionRecord)>,
    ) -> Result<(), OpenError> {
        for (queue_id, rec) in records {
            let name = rec.name.clone();
            let topic_key = names::key(&rec.topic);
            let entry = topics.get(&topic_key).ok_or_else(|| OpenError::Record {
                what: "subscription",
                name: name.clone(),
                reason: format!("its topic '{}' is missing", rec.topic),
            })?;
            let types = crate::outbound::sinks::resources::Resolving {
                types: &DESTINATIONS,
                resources: &self.inner.cfg.outbound.resources,
            };
            let sub = Subscription::from_record(rec, &types).map_err(|e| OpenError::Record {
                what: "subscription",
                name,
                reason: e.message,
            })?;
            let sub_entry = self.start_subscription(queue_id, sub);
            if sub_entry.config().sub.persisted {
                // The windows were read from the store already (`read_identities`).
                sub_entry.restore()?;
            }
            let mut list = (*entry.subscriptions()).clone();
            list.push(sub_entry);
            write(&entry.subs, Arc::new(list));
        }
        Ok(())
    }

    /// The identities of the stored events accepted at or after `since` (the horizon of the
    /// longest window) and within their own topic's window: every event the store holds, the
    /// settled ones it kept included, read once, in one pass over the log. An event's topic is
    /// that of the subscriptions it was published to; one whose subscriptions were all deleted
    /// is not remembered.
    fn read_identities(
        &self,
        topics: &HashMap<String, Arc<TopicEntry>>,
        subs: &[(QueueId, SubscriptionRecord)],
        since: WallMs,
        now_ms: WallMs,
    ) -> Result<Recent, StoreError> {
        let default = self.inner.cfg.broker.deduplication_window;
        // Per queue: its topic's key and entry, the start of its window, and whether the
        // identity includes the CloudEvents `source`.
        let mut by_queue: HashMap<QueueId, (String, Arc<TopicEntry>, WallMs, bool)> =
            HashMap::new();
        for (queue, rec) in subs {
            let key = names::key(&rec.topic);
            let Some(entry) = topics.get(&key) else {
                continue;
            };
            let topic = entry.topic();
            let Some(window) = dedup::window_ms(&topic, default) else {
                continue;
            };
            let cloud = topic.input_schema == EventSchema::CloudEventV1_0;
            let from = now_ms.saturating_sub(window);
            by_queue.insert(*queue, (key, entry.clone(), from, cloud));
        }
        let mut recent = Recent::new();
        if by_queue.is_empty() {
            return Ok(recent);
        }
        let started = std::time::Instant::now();
        let mut read = 0u64;
        self.inner.ctx.store.retained_events(since, &mut |e| {
            read += 1;
            let Some((key, entry, from, cloud)) = e.queues.iter().find_map(|q| by_queue.get(q))
            else {
                return;
            };
            if e.accepted_ms < *from {
                return;
            }
            let source = if *cloud {
                dedup::cloud_event_source(&e.body)
            } else {
                None
            };
            let id = crate::sync::lock(&entry.dedup).identity(source.as_deref(), &e.id);
            recent
                .entry(key.clone())
                .or_default()
                .push((e.accepted_ms, e.seq, id));
        })?;
        tracing::info!(
            events = read,
            ms = started.elapsed().as_millis() as u64,
            "deduplication windows read from the stored events"
        );
        Ok(recent)
    }

    /// Each topic's deduplication window rebuilt from the identities read: each remembered as
    /// accepted when it was, so the window's edge does not move with the restart. Nothing was
    /// written for this beyond the events' own records (docs/CLOUD.md).
    fn rebuild_windows(&self, topics: &HashMap<String, Arc<TopicEntry>>, recent: Recent) {
        let default = self.inner.cfg.broker.deduplication_window;
        for (key, mut ids) in recent {
            let Some(entry) = topics.get(&key) else {
                continue;
            };
            let topic = entry.topic();
            let Some(window_ms) = dedup::window_ms(&topic, default) else {
                continue;
            };
            // Remembered in acceptance order, as the publishes did.
            ids.sort_unstable_by_key(|&(ms, seq, _)| (ms, seq));
            let mut w = crate::sync::lock(&entry.dedup);
            for (ms, _, id) in &ids {
                w.record(*id, *ms, window_ms);
            }
            tracing::info!(topic = %topic.name, identities = w.len(), window_ms, "deduplication window rebuilt from the stored events");
        }
    }
}

/// Topics from their stored records, by key.
fn restore_topics(
    records: Vec<TopicRecord>,
    max_identities: usize,
) -> HashMap<String, Arc<TopicEntry>> {
    let mut topics = HashMap::new();
    for rec in records {
        let topic = Topic::from_record(rec);
        topics.insert(
            names::key(&topic.name),
            Arc::new(TopicEntry::new(topic, max_identities)),
        );
    }
    topics
}
