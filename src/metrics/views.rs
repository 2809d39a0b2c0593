//! What the metrics read: plain views of topics, subscriptions, endpoints, connections and the
//! broker, filled by the broker without holding its locks ([`Snapshot`]), and read by the
//! families in `families.rs`.

use super::{SubscriptionMetrics, TopicMetrics};

/// A topic, as the metrics see it.
pub struct TopicView<'a> {
    /// Topic name (label `topic`).
    pub name: &'a str,
    /// Its counters.
    pub metrics: &'a TopicMetrics,
}

/// A subscription, as the metrics see it.
pub struct SubscriptionView<'a> {
    /// Topic name (label `topic`).
    pub topic: &'a str,
    /// Subscription name (label `subscription`).
    pub name: &'a str,
    /// Its counters.
    pub metrics: &'a SubscriptionMetrics,
    /// Events accepted and not yet settled.
    pub pending: u64,
    /// Their body bytes (`None`: the store does not count them).
    pub pending_bytes: Option<u64>,
    /// Delivery requests in flight.
    pub in_flight: u64,
    /// Received, unsettled events (queue subscriptions only).
    pub locked: Option<u64>,
    /// Dead letters kept.
    pub dead_letters: u64,
    /// Its destination's health, when tracked.
    pub health: Option<EndpointView>,
}

/// A destination's health, as the metrics see it.
#[derive(Debug, Clone, Copy)]
pub struct EndpointView {
    /// 0 enabled, 1 disabled, 2 frozen.
    pub state: u64,
    /// Consecutive failed attempts.
    pub consecutive_failures: u64,
    /// Unreachable (an uplink outage) now.
    pub outage: bool,
    /// Seconds since its last success (or since tracking began).
    pub seconds_since_success: u64,
}

/// A journaling store's group-commit counters.
#[derive(Debug, Clone, Copy, Default)]
pub struct CommitView {
    /// Publishes made durable.
    pub commits: u64,
    /// Journal writes (one `fdatasync` each).
    pub syncs: u64,
    /// Checkpoints.
    pub checkpoints: u64,
    /// Segments compacted.
    pub compactions: u64,
    /// Frames found damaged at start.
    pub damaged_frames: u64,
    /// Events lost in them.
    pub damaged_events: u64,
    /// Settled segments kept for the deduplication window deleted early for the disk bound.
    pub window_evicted_segments: u64,
}

/// Broker-wide values.
pub struct BrokerView {
    /// Bytes of undelivered events held in memory.
    pub pending_event_bytes: u64,
    /// Dead letters posted to dead-letter webhooks.
    pub dead_letters_forwarded: u64,
    /// Dead letters whose forwarding failed for good.
    pub dead_letters_forward_failed: u64,
    /// Bytes the store's files occupy.
    pub store_disk_bytes: u64,
    /// Bytes of dead letters kept.
    pub dead_letter_bytes: u64,
    /// Group-commit counters, for a journaling store.
    pub commits: Option<CommitView>,
    /// Spans exported and dropped, when OpenTelemetry export is on.
    pub spans: Option<(u64, u64)>,
    /// The Entra ID signing keys, when Entra tokens are enabled.
    pub entra: Option<EntraView>,
}

/// The Entra ID signing keys, as the metrics see them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EntraView {
    /// Keys tokens may be signed with (the JWKS file's and the fetched ones).
    pub keys: u64,
    /// Seconds since the fetched set in use was fetched, if there is one.
    pub age_secs: Option<u64>,
    /// Keys are fetched and none was within two refresh intervals.
    pub stale: bool,
    /// Fetches that succeeded, by this run.
    pub fetched: u64,
    /// Fetches that failed, by this run.
    pub failed: u64,
}

/// Where the broker reads the Entra keys' state (the API's key set registers itself: it sits
/// above the broker).
pub trait EntraStatus: Send + Sync {
    /// The state at `now_ms` (the broker's clock).
    fn view(&self, now_ms: u64) -> EntraView;
}

/// An MQTT source connection, as the metrics see it.
pub struct MqttView<'a> {
    /// Connection name (label `connection`).
    pub name: &'a str,
    /// Its status.
    pub metrics: &'a super::MqttConnectionMetrics,
}

/// An MQTT destination connection, as the metrics see it.
pub struct MqttDestinationView<'a> {
    /// The broker, `mqtt(s)://host:port` (label `broker`).
    pub broker: &'a str,
    /// The connection's client id (label `client_id`: connections to one broker with other
    /// credentials are other connections).
    pub client_id: &'a str,
    /// Its status.
    pub metrics: &'a super::MqttDestinationMetrics,
}

/// Everything one exposition shows.
pub struct Snapshot<'a> {
    /// MQTT source connections.
    pub mqtt: Vec<MqttView<'a>>,
    /// MQTT destination connections.
    pub mqtt_destinations: Vec<MqttDestinationView<'a>>,
    /// Topics, in the order to show them.
    pub topics: Vec<TopicView<'a>>,
    /// Subscriptions, in the order to show them.
    pub subscriptions: Vec<SubscriptionView<'a>>,
    /// Broker-wide values.
    pub broker: BrokerView,
}
