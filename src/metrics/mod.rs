//! Metrics: the original module's names, cheap on the hot path.
//!
//! Every counter is an `AtomicU64` owned by the topic or subscription it describes, so recording
//! costs one relaxed atomic add and no lookup or lock; deleting a subscription removes its series.
//! Every family (name, kind, help, where its value comes from) is declared once, in
//! [`families`]; the broker hands [`render`] a [`Snapshot`] of plain views and gets the
//! Prometheus text exposition back ([`text`] writes the format). Names follow the original
//! (`EventsReceived`, `DeliverySuccessCounts`, …) with labels `topic` and `subscription`, so
//! existing dashboards keep working; gridlet's own additions are prefixed `gridlet_`.

pub mod families;
pub mod ring;
pub mod text;
pub mod views;

pub use families::{
    render, visit, BrokerView, CommitView, EndpointView, EntraStatus, EntraView, Kind,
    MqttDestinationView, MqttView, Snapshot, SubscriptionView, TopicView,
};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A monotonically increasing count.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Add `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }
    /// Add one.
    pub fn inc(&self) {
        self.add(1);
    }
    /// Current value.
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// Upper bounds (ms) of the latency histogram buckets.
pub const LATENCY_BUCKETS_MS: [u64; 12] = [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 5000, 60000];

/// A latency histogram in milliseconds.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS_MS.len()],
    sum: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    /// Record one observation.
    pub fn observe_ms(&self, ms: u64) {
        if let Some(i) = LATENCY_BUCKETS_MS.iter().position(|b| ms <= *b) {
            self.buckets[i].fetch_add(1, Relaxed);
        }
        self.sum.fetch_add(ms, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }

    /// Observations per bucket (not cumulative; those above the last bound are the count less
    /// their sum), the sum in ms, and the count.
    pub fn read(&self) -> ([u64; LATENCY_BUCKETS_MS.len()], u64, u64) {
        let buckets = std::array::from_fn(|i| self.buckets[i].load(Relaxed));
        (buckets, self.sum.load(Relaxed), self.count.load(Relaxed))
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }
}

/// Per-topic metrics (docs/COMPATIBILITY.md §8).
#[derive(Debug, Default)]
pub struct TopicMetrics {
    /// Events accepted by publish requests.
    pub events_received: Counter,
    /// Events that matched no subscription (dropped).
    pub unmatched_events: Counter,
    /// Publish requests answered 200.
    pub success_requests: Counter,
    /// Publish requests that failed on the broker's side (5xx).
    pub system_error_requests: Counter,
    /// Publish requests rejected as the client's fault (4xx).
    pub user_error_requests: Counter,
    /// Latency of successful publish requests.
    pub success_request_latency_ms: Histogram,
    /// Events answered 200 but not routed: their identity was accepted within the
    /// deduplication window.
    pub deduplicated: Counter,
}

/// Per-subscription metrics (docs/COMPATIBILITY.md §8, plus gridlet's drop accounting).
#[derive(Debug, Default)]
pub struct SubscriptionMetrics {
    /// Events delivered.
    pub delivery_success_counts: Counter,
    /// Events whose delivery attempt failed.
    pub delivery_failure_counts: Counter,
    /// Latency of successful delivery requests.
    pub delivery_success_latency_ms: Histogram,
    /// Latency of failed delivery requests.
    pub delivery_failure_latency_ms: Histogram,
    /// Time from publish to the first attempt.
    pub system_delay_for_first_attempt_ms: Histogram,
    /// Delivery attempts (per event).
    pub delivery_attempts_count: Counter,
    /// Events dropped for time-to-live or attempts (the original counted both here).
    pub expired_counts: Counter,
    /// Events dropped because `maxDeliveryAttempts` was reached.
    pub dropped_max_attempts: Counter,
    /// Events dropped because their time to live passed.
    pub dropped_expired: Counter,
    /// Events accepted into this subscription's queue.
    pub enqueued: Counter,
    /// Events refused for good by the endpoint (400/413 under the `standard` policy).
    pub dropped_refused: Counter,
    /// Events dead-lettered at publish because the queue was full.
    pub dropped_queue_full: Counter,
    /// Attempts an Azure service answered with a configuration fault, indexed by
    /// [`crate::policy::ConfigFault`].
    pub destination_faults: [Counter; 4],
    /// Events kept as dead letters.
    pub dead_lettered: Counter,
    /// Dead letters evicted to stay within the bound.
    pub dead_letters_evicted: Counter,
    /// Dead letters replayed through the API.
    pub dead_letters_replayed: Counter,
    /// Queue subscriptions: events received (each receive of an event counts).
    pub received: Counter,
    /// Queue subscriptions: events acknowledged.
    pub acknowledged: Counter,
    /// Queue subscriptions: events released.
    pub released: Counter,
    /// Queue subscriptions: events rejected (dead-lettered by the receiver).
    pub rejected: Counter,
    /// Queue subscriptions: locks that expired unsettled.
    pub lock_expired: Counter,
}

/// One MQTT destination connection's status (docs/MQTT.md, "MQTT as a destination"): its
/// connection task and the publishes write, the metrics and the readiness detail read.
#[derive(Debug, Default)]
pub struct MqttDestinationMetrics {
    /// 1 while an MQTT session is up.
    pub connected: AtomicU64,
    /// Messages written to the connection (PUBLISH packets sent; a QoS 0 one is then delivered).
    pub published: Counter,
    /// QoS 1 messages the broker acknowledged with a success reason code (below 0x80).
    pub acknowledged: Counter,
    /// QoS 1 messages the broker refused (PUBACK reason code 0x80 or above).
    pub refused: Counter,
    /// Connection attempts that failed, and sessions that ended.
    pub connection_errors: Counter,
    /// The last error (connection, refusal), if any.
    last_error: std::sync::Mutex<Option<String>>,
}

impl MqttDestinationMetrics {
    /// Record `e` as the last error.
    pub fn set_error(&self, e: String) {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
    }

    /// The last error.
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether a session is up.
    pub fn is_connected(&self) -> bool {
        self.connected.load(Relaxed) == 1
    }
}

/// One MQTT source connection's status (docs/MQTT.md): the task that drives it writes, the
/// metrics and the readiness detail read.
#[derive(Debug, Default)]
pub struct MqttConnectionMetrics {
    /// 1 while an MQTT session is up.
    pub connected: AtomicU64,
    /// 1 while back-pressure holds its messages (gridlet answered 503/507; nothing is
    /// acknowledged or dropped meanwhile except QoS 0 messages).
    pub paused: AtomicU64,
    /// Messages received from the broker.
    pub received: Counter,
    /// QoS 1 messages acknowledged (PUBACK) after gridlet accepted their events.
    pub acknowledged: Counter,
    /// Messages refused for good (no valid event for the topic; no route): acknowledged,
    /// no event.
    pub refused: Counter,
    /// QoS 0 messages that could not be accepted (back-pressure): dropped.
    pub dropped: Counter,
    /// Connection attempts that failed, and sessions that ended.
    pub connection_errors: Counter,
    /// The last error (connection, subscription or publish), if any.
    last_error: std::sync::Mutex<Option<String>>,
}

impl MqttConnectionMetrics {
    /// Record `e` as the last error.
    pub fn set_error(&self, e: String) {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
    }

    /// The last error.
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether a session is up.
    pub fn is_connected(&self) -> bool {
        self.connected.load(Relaxed) == 1
    }
}
