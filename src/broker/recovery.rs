//! Start-up recovery: topics, subscriptions and persisted events restored from the store.

use super::*;
use crate::model::record::{SubscriptionRecord, TopicRecord};
use crate::store::QueueId;

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
        broker.restore_subscriptions(&topics, snapshot.subscriptions)?;
        write(&broker.inner.topics, Arc::new(topics));
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
            let entry = topics
                .get(&names::key(&rec.topic))
                .ok_or_else(|| OpenError::Record {
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
                sub_entry.restore()?;
            }
            let mut list = (*entry.subscriptions()).clone();
            list.push(sub_entry);
            write(&entry.subs, Arc::new(list));
        }
        Ok(())
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
