//! The broker: topics, subscriptions, and the publish path ([`publish`]: route → admit →
//! persist → enqueue, cancel-safe).
//!
//! Locking: the topic map and each topic's subscription list are copy-on-write snapshots behind
//! short `RwLock`s; publish clones `Arc`s and touches only the matching subscriptions' queue
//! mutexes — no lock is held across an await, and nothing global is locked per event.

mod publish;
mod replay;
mod resilience;

use crate::clock::Clock;
use crate::config::Config;
use crate::delivery::dispatcher::{self, AbortOnDrop, EngineCtx, SubConfig, SubShared};
use crate::delivery::queue::{EventData, Pending, SubQueue, Window};
use crate::delivery::sink::SinkFactory;
use crate::delivery::sinks::DESTINATIONS;
use crate::error::ApiError;
use crate::metrics::{self, Series, SeriesValue, SubscriptionMetrics, TopicMetrics};
use crate::model::names;
use crate::model::subscription::Subscription;
use crate::model::topic::{EventSchema, Topic};
use crate::store::{Store, StoreError};
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// A subscription registered with the broker: shared state plus its task.
pub struct SubEntry {
    /// State shared with the dispatcher.
    pub shared: Arc<SubShared>,
    _task: AbortOnDrop,
}

/// A topic and its subscriptions.
pub struct TopicEntry {
    topic: RwLock<Topic>,
    subs: RwLock<Arc<Vec<Arc<SubEntry>>>>,
    /// Topic metrics.
    pub metrics: TopicMetrics,
}

fn read<T: Clone>(l: &RwLock<T>) -> T {
    l.read().unwrap_or_else(|p| p.into_inner()).clone()
}

fn write<T>(l: &RwLock<T>, v: T) {
    *l.write().unwrap_or_else(|p| p.into_inner()) = v;
}

impl TopicEntry {
    /// The topic.
    pub fn topic(&self) -> Topic {
        read(&self.topic)
    }

    /// Snapshot of the subscriptions.
    pub fn subscriptions(&self) -> Arc<Vec<Arc<SubEntry>>> {
        read(&self.subs)
    }
}

struct Inner {
    cfg: Arc<Config>,
    ctx: Arc<EngineCtx>,
    sinks: Arc<dyn SinkFactory>,
    topics: RwLock<Arc<HashMap<String, Arc<TopicEntry>>>>,
    /// Serialises management operations (create/update/delete); publish never takes it.
    mgmt: Mutex<()>,
    /// Serialises dead-letter replays of persisted subscriptions (read, persist, then remove).
    replays: tokio::sync::Mutex<()>,
    seq: AtomicU64,
}

/// Cheap to clone handle to the broker.
#[derive(Clone)]
pub struct Broker {
    inner: Arc<Inner>,
}

impl Broker {
    /// Run a management operation (topic and subscription writes, endpoint re-enable, dead-letter
    /// purge) on tokio's blocking pool. These write and flush the metadata store, and deleting a persisted
    /// subscription removes all its events from disk: milliseconds on an SD card, seconds for a
    /// large backlog. Run on the runtime, two of them at once would hold both workers of a
    /// 2-core device (the second waits on the management lock), stopping publishes and
    /// deliveries until the flush ends. Off the runtime they wait without stopping anything.
    ///
    /// # Errors
    /// The operation's own error, or 500 if it panicked.
    pub async fn manage<T: Send + 'static>(
        &self,
        op: impl FnOnce(&Broker) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let broker = self.clone();
        tokio::task::spawn_blocking(move || op(&broker))
            .await
            .map_err(|e| ApiError::internal(&e))?
    }
}

fn store_err(e: StoreError) -> ApiError {
    match e {
        StoreError::Full { .. } => {
            ApiError::insufficient_storage(e.to_string(), Duration::from_secs(30))
        }
        other => ApiError::internal(&other),
    }
}

/// A start-up failure.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The store could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A stored record no longer parses.
    #[error("stored {what} '{name}' is unreadable: {reason}")]
    Record {
        /// topic / subscription.
        what: &'static str,
        /// Its name.
        name: String,
        /// Why.
        reason: String,
    },
}

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
        let ctx = Arc::new(EngineCtx {
            clock,
            store: store.clone(),
            global: Arc::new(Semaphore::new(cfg.broker.max_in_flight_total)),
            max_in_flight: cfg.broker.max_in_flight_per_subscription,
            log_success: cfg.broker.log_delivery_success,
            health_cfg: cfg.resilience.health.clone(),
            // Disabled/frozen endpoints and dead letters live with the store: on disk with sled,
            // in memory with the memory store.
            health: crate::delivery::health::HealthRegistry::restore(store.clone())?,
            dead_letters: store
                .dead_letters()
                .unwrap_or_else(|| Arc::new(crate::delivery::deadletter::MemoryDeadLetters::new())),
            dead_letter_capacity: cfg.resilience.dead_letter_capacity,
            forwarder: crate::delivery::deadletter::Forwarder::start(),
            drain: Default::default(),
            pending_bytes: Arc::new(crate::delivery::queue::PendingBytes::new(
                cfg.broker.max_pending_bytes,
            )),
        });
        let broker = Self {
            inner: Arc::new(Inner {
                cfg: cfg.clone(),
                ctx,
                sinks,
                topics: RwLock::new(Arc::new(HashMap::new())),
                mgmt: Mutex::new(()),
                replays: tokio::sync::Mutex::new(()),
                seq: AtomicU64::new(snapshot.max_seq + 1),
            }),
        };
        // Stored subscriptions were valid when created; outbound rules may have been tightened
        // since (e.g. httpsOnly). Load them anyway, with a warning, rather than lose them.
        let mut lenient = (*cfg).clone();
        lenient.outbound.webhook_https_only = false;
        lenient.outbound.eventgrid_https_only = false;
        lenient.outbound.eventgrid_allow_invalid_hostnames = true;
        // Still refused at connect time (the HTTP client checks the resolved address).
        lenient.outbound.denied_ranges = Vec::new();
        let mut topics = HashMap::new();
        for rec in snapshot.topics {
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
        for (topic_name, queue_id, rec) in snapshot.subscriptions {
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
            let sub = match Subscription::from_put(&topic, &name, rec.clone(), &cfg, &DESTINATIONS)
            {
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
            let sub_entry = broker.start_subscription(queue_id, sub);
            if sub_entry.shared.config().sub.persisted {
                broker.restore_events(&sub_entry.shared)?;
            }
            let mut list = (*entry.subscriptions()).clone();
            list.push(sub_entry);
            write(&entry.subs, Arc::new(list));
        }
        write(&broker.inner.topics, Arc::new(topics));
        broker.inner.ctx.health.prune_unclaimed();
        Ok(broker)
    }

    /// Restore a persisted subscription's queue from the store's index (sequence numbers and
    /// retry states, no bodies): events waiting for their first attempt are queued by sequence
    /// number only and enter the delivery window as it drains (their bodies are read then);
    /// events waiting for a retry are read now and keep their due time.
    fn restore_events(&self, shared: &SubShared) -> Result<(), StoreError> {
        let store = &self.inner.ctx.store;
        let index = store.pending_index(shared.queue_id)?;
        let now_ms = self.inner.ctx.clock.now_ms();
        let now = Instant::now();
        let policy = shared.config().policy;
        let mut expired = Vec::new();
        let mut retries = Vec::new();
        {
            let mut q = shared.queue();
            for (seq, state) in index {
                // TTL counts from the first enqueue, across restarts: what expired while gridlet
                // was down is dead-lettered (and counted) below rather than delivered late.
                if crate::delivery::retry::is_expired(&policy, state.first_enqueued_ms, now_ms) {
                    expired.push(seq);
                } else if state.attempts == 0 {
                    q.push_spilled(seq);
                } else {
                    retries.push((seq, state));
                }
            }
        }
        for chunk in retries.chunks(1024) {
            let seqs: Vec<u64> = chunk.iter().map(|(s, _)| *s).collect();
            let events = store.get(shared.queue_id, &seqs)?;
            let mut q = shared.queue();
            for ((_, state), e) in chunk.iter().zip(events) {
                let Some(e) = e else { continue };
                let wait = Duration::from_millis(state.due_ms.saturating_sub(now_ms));
                q.push_recovered_retry(
                    now + wait,
                    Pending {
                        seq: e.seq,
                        event: Arc::new(EventData::new(
                            e.body,
                            e.id.into_boxed_str(),
                            Some(&self.inner.ctx.pending_bytes),
                        )),
                        attempts: state.attempts,
                        first_enqueued_ms: state.first_enqueued_ms,
                        enqueued_at: now,
                    },
                );
            }
        }
        // The dispatcher may already have looked at the empty queue and gone to sleep.
        shared.notify.notify_one();
        if !expired.is_empty() {
            // TTL counts from the first enqueue, across restarts: what expired while gridlet was
            // down is dead-lettered (and counted) now rather than delivered late. Bodies are read
            // in chunks so a large expired backlog never sits in memory at once.
            tracing::info!(topic = %shared.topic, subscription = %shared.name, events = expired.len(), reason = "TimeToLiveExceeded", "stored events expired while gridlet was stopped");
            for chunk in expired.chunks(1024) {
                let events = store.get(shared.queue_id, chunk)?;
                let items: Vec<Pending> = events
                    .into_iter()
                    .flatten()
                    .map(|e| Pending {
                        seq: e.seq,
                        event: Arc::new(EventData::new(
                            e.body,
                            e.id.into_boxed_str(),
                            Some(&self.inner.ctx.pending_bytes),
                        )),
                        attempts: e.state.attempts,
                        first_enqueued_ms: e.state.first_enqueued_ms,
                        enqueued_at: now,
                    })
                    .collect();
                // Counts them, keeps them as dead letters, then removes them from the store.
                dispatcher::dead_letter(
                    shared,
                    &self.inner.ctx,
                    &items,
                    crate::delivery::retry::DropReason::Expired,
                    None,
                );
            }
        }
        Ok(())
    }

    fn sub_config(&self, sub: Subscription) -> SubConfig {
        SubConfig {
            policy: sub.effective_policy(&self.inner.cfg),
            caps: sub.batching.caps(&self.inner.cfg),
            sink: self.inner.sinks.create(&sub),
            health: self.endpoint_health_for(&sub),
            dead_letter_sink: self.dead_letter_sink_for(&sub),
            sub,
        }
    }

    fn start_subscription(&self, queue_id: u32, sub: Subscription) -> Arc<SubEntry> {
        // A persisted subscription's backlog lives in the store; memory holds a window of it.
        let queue = if sub.persisted {
            SubQueue::windowed(Window::DEFAULT)
        } else {
            SubQueue::default()
        };
        let shared = Arc::new(SubShared {
            queue_id,
            topic: Arc::from(sub.topic.as_str()),
            name: Arc::from(sub.name.as_str()),
            config: RwLock::new(Arc::new(self.sub_config(sub))),
            queue: Mutex::new(queue),
            notify: Default::default(),
            metrics: SubscriptionMetrics::default(),
        });
        let task = dispatcher::spawn(shared.clone(), self.inner.ctx.clone());
        Arc::new(SubEntry {
            shared,
            _task: task,
        })
    }

    /// Shutdown drain: every subscription stops sending new attempts, finishes and settles its
    /// in-flight ones, and ends; waits up to `within` for that. Returns the number of
    /// subscriptions still running when the time ran out (their attempts are then abandoned:
    /// persisted events are redelivered after the restart).
    pub async fn drain(&self, within: Duration) -> usize {
        let ctx = &self.inner.ctx;
        ctx.drain.start();
        for topic in self.topics() {
            for sub in topic.subscriptions().iter() {
                sub.shared.notify.notify_one();
            }
        }
        let deadline = Instant::now() + within;
        while ctx.drain.running() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        ctx.drain.running()
    }

    /// The configuration in force.
    pub fn config(&self) -> &Arc<Config> {
        &self.inner.cfg
    }

    fn lock_mgmt(&self) -> std::sync::MutexGuard<'_, ()> {
        self.inner.mgmt.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Look a topic up (case-insensitively).
    pub fn topic(&self, name: &str) -> Option<Arc<TopicEntry>> {
        read(&self.inner.topics).get(&names::key(name)).cloned()
    }

    /// All topics, sorted by name.
    pub fn topics(&self) -> Vec<Arc<TopicEntry>> {
        let mut v: Vec<_> = read(&self.inner.topics).values().cloned().collect();
        v.sort_by_key(|t| names::key(&t.topic().name));
        v
    }

    /// Create or update a topic.
    ///
    /// # Errors
    /// 400 when the schema would change under existing subscriptions or the topic limit is hit.
    pub fn put_topic(&self, topic: Topic) -> Result<Topic, ApiError> {
        let _g = self.lock_mgmt();
        let key = names::key(&topic.name);
        let map = read(&self.inner.topics);
        if let Some(existing) = map.get(&key) {
            let mut current = existing.topic();
            if current.input_schema != topic.input_schema && !existing.subscriptions().is_empty() {
                return Err(ApiError::bad_request(
                    "InvalidSchema",
                    format!(
                        "topic '{}' has subscriptions delivering {}; delete them before changing inputSchema",
                        current.name,
                        current.input_schema.as_str()
                    ),
                ));
            }
            current.input_schema = topic.input_schema;
            self.inner
                .ctx
                .store
                .put_topic(&key, &current.to_record())
                .map_err(store_err)?;
            write(&existing.topic, current.clone());
            return Ok(current);
        }
        if map.len() >= self.inner.cfg.broker.max_topics {
            return Err(ApiError::bad_request(
                "LimitExceeded",
                format!(
                    "at most {} topics (broker__maxTopics)",
                    self.inner.cfg.broker.max_topics
                ),
            ));
        }
        self.inner
            .ctx
            .store
            .put_topic(&key, &topic.to_record())
            .map_err(store_err)?;
        let mut next = (*map).clone();
        next.insert(
            key,
            Arc::new(TopicEntry {
                topic: RwLock::new(topic.clone()),
                subs: RwLock::new(Arc::new(Vec::new())),
                metrics: TopicMetrics::default(),
            }),
        );
        write(&self.inner.topics, Arc::new(next));
        Ok(topic)
    }

    /// Delete a topic and all its subscriptions (their queued events go too).
    ///
    /// # Errors
    /// 404 when the topic does not exist.
    pub fn delete_topic(&self, name: &str) -> Result<(), ApiError> {
        let _g = self.lock_mgmt();
        let key = names::key(name);
        let map = read(&self.inner.topics);
        let entry = map
            .get(&key)
            .cloned()
            .ok_or_else(|| topic_not_found(name))?;
        for sub in entry.subscriptions().iter() {
            self.inner
                .ctx
                .store
                .delete_subscription(sub.shared.queue_id)
                .map_err(store_err)?;
            self.forget_dead_letters(sub.shared.queue_id);
        }
        self.inner.ctx.store.delete_topic(&key).map_err(store_err)?;
        write(&entry.subs, Arc::new(Vec::new()));
        let mut next = (*map).clone();
        next.remove(&key);
        write(&self.inner.topics, Arc::new(next));
        Ok(())
    }

    /// Create or update a subscription from a PUT body.
    ///
    /// # Errors
    /// 404 for an unknown topic, 400 for an invalid body or a changed persistence policy.
    pub fn put_subscription(
        &self,
        topic_name: &str,
        name: &str,
        body: serde_json::Value,
    ) -> Result<Subscription, ApiError> {
        let _g = self.lock_mgmt();
        let entry = self
            .topic(topic_name)
            .ok_or_else(|| topic_not_found(topic_name))?;
        let topic = entry.topic();
        let sub = Subscription::from_put(&topic, name, body, &self.inner.cfg, &DESTINATIONS)?;
        let subs = entry.subscriptions();
        let key = names::key(name);
        if let Some(existing) = subs.iter().find(|s| names::key(&s.shared.name) == key) {
            let old = existing.shared.config();
            if old.sub.persisted != sub.persisted {
                return Err(ApiError::bad_request(
                    "PersistencePolicyImmutable",
                    "persistencePolicy cannot be modified once created; delete and re-create the subscription",
                ));
            }
            let mut sub = sub;
            sub.name = old.sub.name.clone();
            self.inner
                .ctx
                .store
                .put_subscription(&topic.name, existing.shared.queue_id, &sub.to_record())
                .map_err(store_err)?;
            existing.shared.set_config(self.sub_config(sub.clone()));
            return Ok(sub);
        }
        if subs.len() >= self.inner.cfg.broker.max_subscriptions_per_topic {
            return Err(ApiError::bad_request(
                "LimitExceeded",
                format!(
                    "at most {} subscriptions per topic (broker__maxSubscriptionsPerTopic)",
                    self.inner.cfg.broker.max_subscriptions_per_topic
                ),
            ));
        }
        let queue_id = self.inner.ctx.store.next_queue_id().map_err(store_err)?;
        self.inner
            .ctx
            .store
            .put_subscription(&topic.name, queue_id, &sub.to_record())
            .map_err(store_err)?;
        let sub_entry = self.start_subscription(queue_id, sub.clone());
        let mut list = (*subs).clone();
        list.push(sub_entry);
        write(&entry.subs, Arc::new(list));
        Ok(sub)
    }

    /// Find a subscription.
    pub fn subscription(&self, topic: &str, name: &str) -> Option<Arc<SubEntry>> {
        let key = names::key(name);
        self.topic(topic)?
            .subscriptions()
            .iter()
            .find(|s| names::key(&s.shared.name) == key)
            .cloned()
    }

    /// Delete a subscription: its task and in-flight deliveries stop, its queued events go.
    ///
    /// # Errors
    /// 404 when the topic or subscription does not exist.
    pub fn delete_subscription(&self, topic: &str, name: &str) -> Result<(), ApiError> {
        let _g = self.lock_mgmt();
        let entry = self.topic(topic).ok_or_else(|| topic_not_found(topic))?;
        let key = names::key(name);
        let subs = entry.subscriptions();
        let found = subs
            .iter()
            .find(|s| names::key(&s.shared.name) == key)
            .ok_or_else(|| subscription_not_found(topic, name))?;
        self.inner
            .ctx
            .store
            .delete_subscription(found.shared.queue_id)
            .map_err(store_err)?;
        self.forget_dead_letters(found.shared.queue_id);
        let list: Vec<_> = subs
            .iter()
            .filter(|s| names::key(&s.shared.name) != key)
            .cloned()
            .collect();
        write(&entry.subs, Arc::new(list));
        Ok(())
    }

    /// Prometheus text exposition of every metric.
    pub fn render_metrics(&self) -> String {
        let topics = self.topics();
        let names: Vec<String> = topics.iter().map(|t| t.topic().name).collect();
        let mut out = String::with_capacity(4096);
        type TopicPick = fn(&TopicMetrics) -> SeriesValue<'_>;
        let topic_families: [(&str, &str, &str, TopicPick); 6] = [
            (
                "EventsReceived",
                "counter",
                "Events received by the topic",
                |m| SeriesValue::Number(m.events_received.get()),
            ),
            (
                "UnmatchedEvents",
                "counter",
                "Events that matched no subscription and were dropped",
                |m| SeriesValue::Number(m.unmatched_events.get()),
            ),
            (
                "SuccessRequests",
                "counter",
                "Publish requests answered 200",
                |m| SeriesValue::Number(m.success_requests.get()),
            ),
            (
                "SystemErrorRequests",
                "counter",
                "Publish requests that failed in the broker",
                |m| SeriesValue::Number(m.system_error_requests.get()),
            ),
            (
                "UserErrorRequests",
                "counter",
                "Publish requests rejected as invalid",
                |m| SeriesValue::Number(m.user_error_requests.get()),
            ),
            (
                "SuccessRequestLatencyMs",
                "histogram",
                "Latency of successful publish requests (ms)",
                |m| SeriesValue::Histogram(&m.success_request_latency_ms),
            ),
        ];
        for (name, kind, help, pick) in topic_families {
            let series: Vec<Series<'_>> = topics
                .iter()
                .zip(&names)
                .map(|(t, n)| Series {
                    labels: vec![("topic", n.as_str())],
                    value: pick(&t.metrics),
                })
                .collect();
            metrics::write_family(&mut out, name, kind, help, &series);
        }
        let subs: Vec<(String, Arc<SubEntry>)> = topics
            .iter()
            .zip(&names)
            .flat_map(|(t, n)| {
                t.subscriptions()
                    .iter()
                    .map(|s| (n.clone(), s.clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        type SubPick = fn(&SubShared) -> u64;
        let counters: [(&str, &str, SubPick); 7] = [
            ("DeliverySuccessCounts", "Events delivered", |s| {
                s.metrics.delivery_success_counts.get()
            }),
            (
                "DeliveryFailureCounts",
                "Events whose delivery attempt failed",
                |s| s.metrics.delivery_failure_counts.get(),
            ),
            (
                "DeliveryAttemptsCount",
                "Delivery attempts (per event)",
                |s| s.metrics.delivery_attempts_count.get(),
            ),
            (
                "ExpiredCounts",
                "Events dropped for time to live or max delivery attempts",
                |s| s.metrics.expired_counts.get(),
            ),
            (
                "gridlet_enqueued_events_total",
                "Events accepted into the subscription's queue",
                |s| s.metrics.enqueued.get(),
            ),
            (
                "gridlet_pending_events",
                "Events accepted and not yet settled",
                |s| s.queue().pending() as u64,
            ),
            (
                "gridlet_in_flight_requests",
                "Delivery requests in flight",
                |s| s.queue().in_flight() as u64,
            ),
        ];
        for (name, help, pick) in counters {
            let kind = if name.starts_with("gridlet_") && !name.ends_with("_total") {
                "gauge"
            } else {
                "counter"
            };
            let series: Vec<Series<'_>> = subs
                .iter()
                .map(|(t, s)| Series {
                    labels: vec![("topic", t.as_str()), ("subscription", &s.shared.name)],
                    value: SeriesValue::Number(pick(&s.shared)),
                })
                .collect();
            metrics::write_family(&mut out, name, kind, help, &series);
        }
        let dropped: Vec<Series<'_>> = subs
            .iter()
            .flat_map(|(t, s)| {
                [
                    (
                        "MaxDeliveryAttemptsExceeded",
                        s.shared.metrics.dropped_max_attempts.get(),
                    ),
                    ("TimeToLiveExceeded", s.shared.metrics.dropped_expired.get()),
                    ("DeliveryRefused", s.shared.metrics.dropped_refused.get()),
                    ("QueueFull", s.shared.metrics.dropped_queue_full.get()),
                ]
                .into_iter()
                .map(move |(reason, v)| Series {
                    labels: vec![
                        ("topic", t.as_str()),
                        ("subscription", &s.shared.name),
                        ("reason", reason),
                    ],
                    value: SeriesValue::Number(v),
                })
            })
            .collect();
        metrics::write_family(
            &mut out,
            "gridlet_dropped_events_total",
            "counter",
            "Events dropped undelivered, by reason",
            &dropped,
        );
        type HistPick = fn(&SubscriptionMetrics) -> &crate::metrics::Histogram;
        let hists: [(&str, &str, HistPick); 3] = [
            (
                "DeliverySuccessLatencyMs",
                "Latency of successful delivery requests (ms)",
                |m| &m.delivery_success_latency_ms,
            ),
            (
                "DeliveryFailureLatencyMs",
                "Latency of failed delivery requests (ms)",
                |m| &m.delivery_failure_latency_ms,
            ),
            (
                "SystemDelayForFirstAttemptMs",
                "Time from publish to the first delivery attempt (ms)",
                |m| &m.system_delay_for_first_attempt_ms,
            ),
        ];
        for (name, help, pick) in hists {
            let series: Vec<Series<'_>> = subs
                .iter()
                .map(|(t, s)| Series {
                    labels: vec![("topic", t.as_str()), ("subscription", &s.shared.name)],
                    value: SeriesValue::Histogram(pick(&s.shared.metrics)),
                })
                .collect();
            metrics::write_family(&mut out, name, "histogram", help, &series);
        }
        self.render_resilience_metrics(&mut out, &subs);
        metrics::write_family(
            &mut out,
            "gridlet_store_disk_bytes",
            "gauge",
            "Bytes the store's files occupy on disk (sled never shrinks them; freed space is reused)",
            &[Series {
                labels: vec![],
                value: SeriesValue::Number(self.inner.ctx.store.size_on_disk()),
            }],
        );
        if let Some(c) = self.inner.ctx.store.commit_counters() {
            let counters: [(&str, &str, u64); 3] = [
                (
                    "gridlet_store_commits_total",
                    "Persisted publishes made durable (answered only after their group's sync)",
                    c.commits,
                ),
                (
                    "gridlet_store_journal_syncs_total",
                    "Publish-journal writes, one fdatasync each (commits / syncs = events per group commit)",
                    c.syncs,
                ),
                (
                    "gridlet_store_checkpoints_total",
                    "Checkpoints: journaled events still pending moved into sled, sled flushed and fsynced",
                    c.checkpoints,
                ),
            ];
            for (name, help, v) in counters {
                metrics::write_family(
                    &mut out,
                    name,
                    "counter",
                    help,
                    &[Series {
                        labels: vec![],
                        value: SeriesValue::Number(v),
                    }],
                );
            }
        }
        out
    }

    /// The schema a topic accepts, if it exists.
    pub fn topic_schema(&self, name: &str) -> Option<EventSchema> {
        self.topic(name).map(|t| t.topic().input_schema)
    }
}

/// 404 for a topic.
pub fn topic_not_found(name: &str) -> ApiError {
    ApiError::not_found("TopicNotFound", format!("topic '{name}' does not exist"))
}

/// 404 for a subscription.
pub fn subscription_not_found(topic: &str, name: &str) -> ApiError {
    ApiError::not_found(
        "EventSubscriptionNotFound",
        format!("event subscription '{name}' does not exist on topic '{topic}'"),
    )
}
