//! Start-up recovery: topics, subscriptions and persisted events restored from the store, and
//! each topic's deduplication window rebuilt from the restored events.

use super::*;
use crate::clock::WallMs;
use crate::model::record::{SubscriptionRecord, TopicRecord};
use crate::store::QueueId;
use std::collections::HashSet;

/// The identities of restored events first enqueued within their topic's deduplication
/// window, by topic key: `(first enqueued, seq, identity)`, and the sequence numbers read (an
/// event in several queues is read once).
type Recent = HashMap<String, (Vec<(WallMs, u64, dedup::Identity)>, HashSet<u64>)>;

/// Events read at once while rebuilding a window.
const REBUILD_CHUNK: usize = 1024;

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
        let writer =
            crate::delivery::writer::StoreWriter::start(crate::delivery::writer::Targets {
                store: store.clone(),
                dead_letters: dead_letters.clone(),
                bound: dead_letter_bound,
            })
            .map_err(|e| StoreError::Io(format!("cannot start the store writer: {e}")))?;
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
            }),
        };
        let topics = restore_topics(snapshot.topics, cfg.broker.deduplication_max_identities);
        let recent = broker.restore_subscriptions(&topics, snapshot.subscriptions)?;
        broker.rebuild_windows(&topics, recent);
        write(&broker.inner.topics, Arc::new(topics));
        broker.inner.ctx.health.prune_unclaimed();
        Ok(broker)
    }

    /// Subscriptions from their stored records (read back as they were created: no setting
    /// applies), each started (and its persisted events restored) under its topic. Returns the
    /// restored events within their topic's deduplication window.
    fn restore_subscriptions(
        &self,
        topics: &HashMap<String, Arc<TopicEntry>>,
        records: Vec<(QueueId, SubscriptionRecord)>,
    ) -> Result<Recent, OpenError> {
        let mut recent = Recent::new();
        let now_ms = self.inner.ctx.clock.now_ms();
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
                let topic = entry.topic();
                let window = dedup::window_ms(&topic, self.inner.cfg.broker.deduplication_window);
                let since = window.map(|w| now_ms.saturating_sub(w));
                let cloud = topic.input_schema == EventSchema::CloudEventV1_0;
                sub_entry.restore(since, |events| {
                    let (ids, read) = recent.entry(topic_key).or_default();
                    self.identities(entry, queue_id, events, cloud, ids, read)
                })?;
            }
            let mut list = (*entry.subscriptions()).clone();
            list.push(sub_entry);
            write(&entry.subs, Arc::new(list));
        }
        Ok(recent)
    }

    /// The identities of `events` of `queue` (`(first enqueued, seq)`) not yet in `read`, read
    /// from their stored bodies in chunks, added to `ids`.
    fn identities(
        &self,
        entry: &TopicEntry,
        queue: QueueId,
        events: &[(WallMs, u64)],
        cloud: bool,
        ids: &mut Vec<(WallMs, u64, dedup::Identity)>,
        read: &mut HashSet<u64>,
    ) -> Result<(), StoreError> {
        let seqs: Vec<u64> = events
            .iter()
            .filter(|(_, seq)| read.insert(*seq))
            .map(|(_, seq)| *seq)
            .collect();
        for chunk in seqs.chunks(REBUILD_CHUNK) {
            let stored = self.inner.ctx.store.get(queue, chunk)?;
            let w = crate::sync::lock(&entry.dedup);
            for e in stored.into_iter().flatten() {
                let source = if cloud {
                    dedup::cloud_event_source(&e.body)
                } else {
                    None
                };
                let id = w.identity(source.as_deref(), &e.id);
                ids.push((e.state.first_enqueued_ms, e.seq, id));
            }
        }
        Ok(())
    }

    /// Each topic's deduplication window rebuilt from its restored events: every pending event
    /// of a persisted subscription first enqueued within the window is remembered as accepted
    /// then. Nothing was written for this; events already settled are not in the store any
    /// more and are not remembered (docs/CLOUD.md).
    fn rebuild_windows(&self, topics: &HashMap<String, Arc<TopicEntry>>, recent: Recent) {
        let default = self.inner.cfg.broker.deduplication_window;
        for (key, (mut ids, _)) in recent {
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
