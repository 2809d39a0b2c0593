//! The broker: topics, subscriptions, and the publish path. One job per file: `registry`
//! (topics and subscriptions), `recovery` (start-up), `publish` (route → admit → persist →
//! enqueue, cancel-safe), `replay` (dead-letter replay, cancel-safe), `resilience` (endpoint
//! health, dead-letter list and purge), `exposition` (Prometheus text).
//!
//! Locking: the topic map and each topic's subscription list are copy-on-write snapshots behind
//! short `RwLock`s; publish clones `Arc`s and touches only the matching subscriptions' queue
//! mutexes — no lock is held across an await, and nothing global is locked per event.

pub(crate) mod dedup;
mod error;
mod exposition;
mod overview;
mod publish;
mod recovery;
mod registry;
mod replay;
mod resilience;
mod retention;
mod route_trace;
pub(crate) mod tail;

pub use error::BrokerError;
pub use overview::{QueueLocks, SubscriptionStatus};
pub use resilience::MAX_PAGE;

use crate::clock::Clock;
use crate::config::Config;
use crate::delivery::context::DeliveryContext;
use crate::delivery::sink::SinkFactory;
use crate::delivery::subscription::{SubConfig, SubscriptionHandle};
use crate::metrics::{self, TopicMetrics};
use crate::model::names;
use crate::model::subscription::Subscription;
use crate::model::topic::{EventSchema, Topic};
use crate::outbound::sinks::DESTINATIONS;
use crate::store::{Store, StoreError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// A topic and its subscriptions.
pub struct TopicEntry {
    topic: RwLock<Topic>,
    subs: RwLock<Arc<Vec<Arc<SubscriptionHandle>>>>,
    /// Topic metrics.
    pub metrics: TopicMetrics,
    /// Identities accepted within the deduplication window.
    dedup: Mutex<dedup::Window>,
    /// A sample of the events as they are published, while someone watches (the console).
    pub tail: tail::Tail,
}

fn read<T: Clone>(l: &RwLock<T>) -> T {
    crate::sync::read(l).clone()
}

fn write<T>(l: &RwLock<T>, v: T) {
    *crate::sync::write(l) = v;
}

impl TopicEntry {
    /// A topic without subscriptions, remembering at most `max_identities` for deduplication.
    pub(crate) fn new(topic: Topic, max_identities: usize) -> Self {
        Self {
            topic: RwLock::new(topic),
            subs: RwLock::new(Arc::new(Vec::new())),
            metrics: TopicMetrics::default(),
            dedup: Mutex::new(dedup::Window::new(max_identities)),
            tail: Default::default(),
        }
    }

    /// The topic.
    pub fn topic(&self) -> Topic {
        read(&self.topic)
    }

    /// Snapshot of the subscriptions.
    pub fn subscriptions(&self) -> Arc<Vec<Arc<SubscriptionHandle>>> {
        read(&self.subs)
    }
}

struct BrokerState {
    cfg: Arc<Config>,
    ctx: Arc<DeliveryContext>,
    sinks: Arc<dyn SinkFactory>,
    topics: RwLock<Arc<HashMap<String, Arc<TopicEntry>>>>,
    /// Serialises management operations (create/update/delete); publish never takes it.
    mgmt: Mutex<()>,
    /// Serialises dead-letter replays of persisted subscriptions (read, persist, then remove).
    replays: tokio::sync::Mutex<()>,
    /// The next sequence number. Held while a publish numbers its events **and** submits them to
    /// the store, so the store receives events in sequence order (the event log's invariant).
    seq: Mutex<u64>,
    /// The MQTT sources' connection statuses (their tasks sit above the broker and register
    /// here so `/metrics` and the readiness detail show them).
    mqtt: RwLock<Vec<(String, Arc<crate::metrics::MqttConnectionMetrics>)>>,
    /// The Entra ID signing keys' state (the API's key set registers it, like the MQTT sources).
    entra: std::sync::OnceLock<Arc<dyn crate::metrics::EntraStatus>>,
    /// The last minutes of counters, for the console's overview.
    samples: Mutex<crate::metrics::ring::SampleRing>,
    /// When the broker started, ms since the epoch.
    started_ms: u64,
    /// The task moving the store's retention horizon (`retention.rs`).
    retention: std::sync::OnceLock<crate::sync::AbortOnDrop>,
}

/// Cheap to clone handle to the broker.
#[derive(Clone)]
pub struct Broker {
    inner: Arc<BrokerState>,
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
    /// The operation's own error, or [`BrokerError::Task`] if it panicked.
    pub async fn manage<T: Send + 'static>(
        &self,
        op: impl FnOnce(&Broker) -> Result<T, BrokerError> + Send + 'static,
    ) -> Result<T, BrokerError> {
        let broker = self.clone();
        tokio::task::spawn_blocking(move || op(&broker)).await?
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
    /// Shutdown drain: every subscription stops sending new attempts, finishes and settles its
    /// in-flight ones, and ends; waits up to `within` for that. Returns the number of
    /// subscriptions still running when the time ran out (their attempts are then abandoned:
    /// persisted events are redelivered after the restart).
    pub async fn drain(&self, within: Duration) -> usize {
        let ctx = &self.inner.ctx;
        ctx.drain.start();
        for topic in self.topics() {
            for sub in topic.subscriptions().iter() {
                sub.wake();
            }
        }
        let deadline = Instant::now() + within;
        while ctx.drain.running() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // What the settled attempts left to write (removals, retry states, dead letters), made
        // durable before the process ends (not left to the store's drop, which an exit may skip).
        let _ = tokio::time::timeout_at(deadline, ctx.store.commit()).await;
        ctx.drain.running()
    }

    /// The end of a clean stop, after [`Broker::drain`]: the store finishes its background work
    /// (the event log's last frame and checkpoint) before the process exits.
    pub async fn close_store(&self) {
        let store = self.inner.ctx.store.clone();
        let _ = tokio::task::spawn_blocking(move || store.close()).await;
    }

    /// Show an MQTT source connection's status in `/metrics` and the readiness detail.
    pub fn register_mqtt_connection(
        &self,
        name: &str,
        status: Arc<crate::metrics::MqttConnectionMetrics>,
    ) {
        let mut g = crate::sync::write(&self.inner.mqtt);
        g.retain(|(n, _)| n != name);
        g.push((name.to_string(), status));
    }

    /// Show the Entra ID signing keys' state in `/metrics` (the first registration stays).
    pub fn register_entra_keys(&self, status: Arc<dyn crate::metrics::EntraStatus>) {
        let _ = self.inner.entra.set(status);
    }

    /// The MQTT destination connections' statuses (broker URL, client id, status), from the
    /// sinks.
    pub fn mqtt_destinations(&self) -> Vec<crate::delivery::sink::MqttDestinationStatus> {
        self.inner.sinks.mqtt_destinations()
    }

    /// Stop showing MQTT source connection `name` (deleted through the management API).
    pub fn unregister_mqtt_connection(&self, name: &str) {
        crate::sync::write(&self.inner.mqtt).retain(|(n, _)| n != name);
    }

    /// The MQTT connections and routes made through the management API, as stored.
    ///
    /// # Errors
    /// The store cannot read them.
    pub fn mqtt_records(&self) -> Result<Vec<crate::model::record::MqttRecord>, BrokerError> {
        Ok(self.inner.ctx.store.mqtt_records()?)
    }

    /// Keep (`Some`) or forget (`None`) an MQTT connection or route made through the management
    /// API; durable on return. Writes the metadata store: run it through [`Broker::manage`].
    ///
    /// # Errors
    /// The store cannot write it.
    pub fn put_mqtt_record(
        &self,
        kind: crate::model::record::MqttKind,
        name: &str,
        record: Option<&crate::model::record::MqttRecord>,
    ) -> Result<(), BrokerError> {
        Ok(self.inner.ctx.store.put_mqtt_record(kind, name, record)?)
    }

    /// The MQTT source connections' statuses, by name.
    pub fn mqtt_connections(&self) -> Vec<(String, Arc<crate::metrics::MqttConnectionMetrics>)> {
        crate::sync::read(&self.inner.mqtt).clone()
    }

    /// The tracer spans are recorded with (off unless an OTLP endpoint is configured).
    pub fn tracer(&self) -> &crate::telemetry::Tracer {
        &self.inner.ctx.tracer
    }

    /// The schema a topic accepts, if it exists.
    pub fn topic_schema(&self, name: &str) -> Option<EventSchema> {
        self.topic(name).map(|t| t.topic().input_schema)
    }
}
