//! Start-up recovery: topics, subscriptions and persisted events restored from the store.

use super::*;
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
        let broker = Self {
            inner: Arc::new(BrokerState {
                cfg: cfg.clone(),
                ctx,
                sinks,
                topics: RwLock::new(Arc::new(HashMap::new())),
                mgmt: Mutex::new(()),
                replays: tokio::sync::Mutex::new(()),
                seq: Mutex::new(snapshot.max_seq + 1),
            }),
        };
        let topics = restore_topics(snapshot.topics)?;
        broker.restore_subscriptions(&topics, snapshot.subscriptions)?;
        write(&broker.inner.topics, Arc::new(topics));
        broker.inner.ctx.health.prune_unclaimed();
        Ok(broker)
    }

    /// Subscriptions from their stored records, each started (and its persisted events
    /// restored) under its topic.
    fn restore_subscriptions(
        &self,
        topics: &HashMap<String, Arc<TopicEntry>>,
        records: Vec<(String, QueueId, serde_json::Value)>,
    ) -> Result<(), OpenError> {
        // Stored subscriptions were valid when created; outbound rules may have been tightened
        // since (e.g. httpsOnly). Load them anyway, with a warning, rather than lose them.
        let mut lenient = (*self.inner.cfg).clone();
        lenient.outbound.webhook_https_only = false;
        lenient.outbound.eventgrid_https_only = false;
        lenient.outbound.eventgrid_allow_invalid_hostnames = true;
        // Still refused at connect time (the HTTP client checks the resolved address).
        lenient.outbound.denied_ranges = Vec::new();
        for (topic_name, queue_id, rec) in records {
            let name = rec
                .get("name")
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string();
            let entry = topics
                .get(&names::key(&topic_name))
                .ok_or_else(|| OpenError::Record {
                    what: "subscription",
                    name: name.clone(),
                    reason: format!("its topic '{topic_name}' is missing"),
                })?;
            let topic = entry.topic();
            let sub = match Subscription::from_put(
                &topic,
                &name,
                rec.clone(),
                &self.inner.cfg,
                &DESTINATIONS,
            ) {
                Ok(s) => s,
                Err(strict) => {
                    let s = Subscription::from_put(&topic, &name, rec, &lenient, &DESTINATIONS)
                        .map_err(|e| OpenError::Record {
                            what: "subscription",
                            name: name.clone(),
                            reason: e.message,
                        })?;
                    tracing::warn!(subscription = %name, reason = %strict.message, "stored subscription no longer meets the current settings; loaded anyway");
                    s
                }
            };
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
    records: Vec<serde_json::Value>,
) -> Result<HashMap<String, Arc<TopicEntry>>, OpenError> {
    let mut topics = HashMap::new();
    for rec in records {
        let name = rec
            .get("name")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string();
        let topic = Topic::from_put(&name, rec).map_err(|e| OpenError::Record {
            what: "topic",
            name: name.clone(),
            reason: e.message,
        })?;
        topics.insert(
            names::key(&topic.name),
            Arc::new(TopicEntry {
                topic: RwLock::new(topic),
                subs: RwLock::new(Arc::new(Vec::new())),
                metrics: TopicMetrics::default(),
            }),
        );
    }
    Ok(topics)
}
