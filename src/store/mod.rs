//! Storage behind one trait: topics, subscriptions, and the pending events of **persisted**
//! subscriptions.
//!
//! The delivery engine keeps every subscription's schedule in memory; the store is the durable
//! copy for persisted subscriptions (and for metadata), and it also holds the bodies of a
//! persisted backlog beyond the in-memory window (the engine keeps only their sequence numbers
//! and reads them back with [`Store::get`]). The engine's contract with a store:
//!
//! 1. one way to write: [`Store::stage`] takes [`Writes`] (a publish's events, one queue's
//!    settlements, or one attempt's dead letters and their events' removal) and answers a [`Commit`] that resolves at the step the caller asked for
//!    ([`Answer`]): once the frame holding the writes is synced (a publish, a pull
//!    acknowledgement: the group-commit point, concurrent callers share one frame and one
//!    sync), after the whole round (management calls), or not at all (a settlement nobody
//!    waits for rides the next frame);
//! 2. the settlements: a retry state when an event's attempts or due time change (a restart
//!    neither retries early nor resets attempts), a removal when it is settled, and dead
//!    letters ([`Letters`]), whose events' removal becomes durable only after the letters;
//!    a store whose staging falls behind its disk answers even an [`Answer::Nobody`] with a
//!    commit to wait for ([`Commit::waits`]): the caller waits, so a slow disk slows
//!    deliveries instead of growing memory;
//! 3. [`Store::submit`], [`Store::commit`], [`Store::update`] and [`Store::remove`] are
//!    [`Store::stage`] with the usual answer.
//!
//! [`log::LogStore`] (the default, `persistence__store=log`) keeps the events of persisted
//! subscriptions in gridlet's own append-only event log, dead letters in a log of their own, and
//! metadata (topics, subscriptions, endpoint health, MQTT records) in one file ([`meta`]; the
//! sled database of earlier releases, [`sled`], is read once to migrate); non-persisted
//! subscriptions never reach the store, so they stay in memory as in the original module.
//! [`memory::MemoryStore`] (`persistence__store=memory`) keeps everything in maps, lost on
//! restart. Every implementation
//! passes the same contract tests (`store::contract`).

pub mod deadletter;
pub mod fs;
pub mod log;
pub mod memory;
pub mod meta;
mod pending;
pub mod sled;
mod write;

pub use pending::{FreshRun, PendingRuns};
pub use write::{Answer, Commit, Letters, Settled, Settlement, Writes};

use crate::clock::WallMs;
use crate::model::record::{MqttKind, MqttRecord, SubscriptionRecord, TopicRecord};
use bytes::Bytes;
use deadletter::DeadLetterStore;
use futures_util::future::BoxFuture;
use serde_json::Value;

/// Open the store the configuration names.
///
/// # Errors
/// The event log or the metadata file cannot be opened or is damaged
/// ([`StoreError::Corrupt`] names the path).
pub fn open(cfg: &crate::config::Persistence) -> Result<std::sync::Arc<dyn Store>, StoreError> {
    match cfg.store {
        crate::config::StoreKind::Memory => Ok(std::sync::Arc::new(memory::MemoryStore::new())),
        crate::config::StoreKind::Log => {
            let s = log::LogStore::open(&log::LogStoreOptions {
                metadata_path: cfg.metadata_path.clone(),
                events_path: cfg.events_path.clone(),
                max_disk_bytes: cfg.max_disk_bytes,
                cache_bytes: cfg.cache_bytes,
                flush_every_ms: cfg.flush_every_ms,
                segment_bytes: log::SEGMENT_BYTES,
                compact_idle_ms: cfg.compact_after_idle_ms,
                refuse_damage: cfg.on_damage == crate::config::OnDamage::Refuse,
            })?;
            tracing::info!(
                metadata = %cfg.metadata_path.display(),
                events = %cfg.events_path.display(),
                max_disk_bytes = cfg.max_disk_bytes,
                segments = s.segments(),
                "event store open"
            );
            Ok(std::sync::Arc::new(s))
        }
    }
}

/// Identifies a subscription's queue in the store. Assigned when the subscription is created,
/// never reused while the store lives.
pub type QueueId = u32;

/// Retry state kept next to each persisted event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RetryState {
    /// Attempts made so far.
    pub attempts: u32,
    /// When the event was first enqueued (wall ms): TTL counts from here, across restarts.
    pub first_enqueued_ms: WallMs,
    /// When the next attempt is due (wall ms); 0 = now.
    pub due_ms: WallMs,
}

/// One persisted event of one queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    /// Sequence number (unique per store, increasing).
    pub seq: u64,
    /// Event id.
    pub id: String,
    /// Delivered bytes.
    pub body: Bytes,
    /// Retry state.
    pub state: RetryState,
    /// The W3C trace context it travels in (its publisher's, or gridlet's `publish` span), so
    /// that a delivery after a restart stays in the same trace. `None`: it came without one.
    pub trace: Option<std::sync::Arc<crate::telemetry::TraceContext>>,
}

/// A stored event read back at start for what it was, settled or not
/// ([`Store::retained_events`]): enough to know its identity and when it was accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetainedEvent {
    /// Sequence number.
    pub seq: u64,
    /// When it was accepted (its first enqueue, wall ms on the broker's clock).
    pub accepted_ms: WallMs,
    /// The queues it was published to (pending or not now).
    pub queues: Vec<QueueId>,
    /// Event id.
    pub id: String,
    /// Its body.
    pub body: Bytes,
}

/// What a store holds at start-up.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Topic records (`Topic::to_record`), in creation order.
    pub topics: Vec<TopicRecord>,
    /// `(queue id, subscription record)` (`Subscription::to_record`).
    pub subscriptions: Vec<(QueueId, SubscriptionRecord)>,
    /// Highest sequence number ever used (the engine continues above it).
    pub max_seq: u64,
}

/// Group-commit counters of a durable store (Prometheus counters
/// `gridlet_store_commits_total`, `gridlet_store_journal_syncs_total`,
/// `gridlet_store_checkpoints_total`, `gridlet_store_compactions_total`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CommitCounters {
    /// Publishes (and explicit commits) made durable.
    pub commits: u64,
    /// Journal writes, one `fdatasync` each: `commits ÷ syncs` is the group-commit factor.
    pub syncs: u64,
    /// Checkpoints (sled flush + `fsync`).
    pub checkpoints: u64,
    /// Segments replaced by a compacted copy of their pending events.
    pub compactions: u64,
    /// Frames found damaged when the store opened (`docs/DURABILITY.md`, damage).
    pub damaged_frames: u64,
    /// Events lost in them.
    pub damaged_events: u64,
    /// Settled segments kept for the deduplication window ([`Store::retain_since`]) deleted
    /// early because the disk bound needed their space.
    pub window_evicted_segments: u64,
}

/// A store failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The configured disk bound is reached; nothing of the failed call was written.
    #[error("event store is full ({used} of {limit} bytes)")]
    Full {
        /// Bytes in use.
        used: u64,
        /// Configured limit.
        limit: u64,
    },
    /// The data is unreadable (corruption, wrong format).
    #[error("event store data is corrupt or unreadable: {0}")]
    Corrupt(String),
    /// An I/O or engine error.
    #[error("event store I/O error: {0}")]
    Io(String),
}

/// Storage for metadata and persisted events.
pub trait Store: Send + Sync + 'static {
    /// Everything needed to rebuild the broker at start-up.
    ///
    /// # Errors
    /// Corrupt or unreadable data: the broker refuses to start rather than start empty.
    fn load(&self) -> Result<Snapshot, StoreError>;

    /// One queue's pending events without their bodies (recovery keeps only these in memory;
    /// bodies are read with [`Store::get`] when an event enters the delivery window): events
    /// never attempted as runs of consecutive sequence numbers with one first-enqueue time, and
    /// the retrying ones apart, so a large backlog is restored without a list entry per event.
    /// The log store answers the first call per queue from the scan it made when it opened, so
    /// start-up reads the log once.
    ///
    /// # Errors
    /// Unreadable data.
    fn pending_runs(&self, queue: QueueId) -> Result<PendingRuns, StoreError>;

    /// Read events of one queue by sequence number, in the order asked; `None` for one that is
    /// not stored (settled meanwhile).
    ///
    /// # Errors
    /// Unreadable data.
    fn get(&self, queue: QueueId, seqs: &[u64]) -> Result<Vec<Option<StoredEvent>>, StoreError>;

    /// Create or replace a topic record.
    ///
    /// # Errors
    /// Write failure.
    fn put_topic(&self, key: &str, record: &TopicRecord) -> Result<(), StoreError>;

    /// Delete a topic record (the caller deletes its subscriptions first).
    ///
    /// # Errors
    /// Write failure.
    fn delete_topic(&self, key: &str) -> Result<(), StoreError>;

    /// Create or replace the record of the subscription with queue `queue`.
    ///
    /// # Errors
    /// Write failure.
    fn put_subscription(
        &self,
        queue: QueueId,
        record: &SubscriptionRecord,
    ) -> Result<(), StoreError>;

    /// Delete a subscription record and all its events.
    ///
    /// # Errors
    /// Write failure.
    fn delete_subscription(&self, queue: QueueId) -> Result<(), StoreError>;

    /// A fresh queue id.
    ///
    /// # Errors
    /// Write failure.
    fn next_queue_id(&self) -> Result<QueueId, StoreError>;

    /// The one way to write events and settlements: stage `writes` and answer a [`Commit`] at
    /// the step `answer` names. A store with a committer (the log) stages them in memory, under
    /// its lock, and answers from its round; the memory store writes them at once.
    ///
    /// # Errors
    /// [`StoreError::Full`] when events would pass the disk bound (nothing is staged then); a
    /// store that failed earlier.
    fn stage(&self, writes: Writes<'_>, answer: Answer) -> Result<Commit, StoreError>;

    /// Whether [`Store::stage`] of settlements and dead letters waits on nothing but a short
    /// lock (no disk; a store whose disk is behind says so with [`Commit::waits`]): the store
    /// writer then calls it on the async worker that settled the attempt. Otherwise it calls it
    /// inside `block_in_place`, so the worker's other tasks move on.
    fn stages_in_memory(&self) -> bool {
        false
    }

    /// The publish path: stage a publish's events, answered once their frame is durable
    /// ([`Answer::Frame`]). The log store makes a whole group of publishes durable with one sync
    /// (its committer); the memory store answers at once.
    ///
    /// # Errors
    /// [`StoreError::Full`] when the disk bound would be exceeded; nothing is written then.
    fn submit(&self, items: Vec<(QueueId, StoredEvent)>) -> Result<Commit, StoreError> {
        self.stage(Writes::Events(items), Answer::Frame)
    }

    /// Make everything staged so far durable, answered after the whole round
    /// ([`Answer::Round`]). Concurrent callers share one round.
    fn commit(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        let c = self.stage(Writes::Staged, Answer::Round);
        Box::pin(async move { c?.wait().await })
    }

    /// Rewrite the retry state of events (nobody waits: [`Answer::Nobody`]).
    ///
    /// # Errors
    /// Write failure.
    fn update(&self, queue: QueueId, seqs: &[u64], state: RetryState) -> Result<(), StoreError> {
        let s = [Settlement::Retry(seqs, state)];
        self.stage(Writes::Settle(queue, &s), Answer::Nobody)
            .map(drop)
    }

    /// Remove settled events, each with its body's size (nobody waits: [`Answer::Nobody`]).
    ///
    /// # Errors
    /// Write failure.
    fn remove(&self, queue: QueueId, events: &[Settled]) -> Result<(), StoreError> {
        let s = [Settlement::Remove(events)];
        self.stage(Writes::Settle(queue, &s), Answer::Nobody)
            .map(drop)
    }

    /// Keep the events accepted at or after `since_ms` (wall ms on the broker's clock, as their
    /// `first_enqueued_ms`) readable by [`Store::retained_events`] after they are settled,
    /// across restarts; `None` keeps only what is pending. The broker moves it forward as time
    /// passes (its deduplication windows). A store may keep less when its disk bound needs the
    /// space (counted in [`CommitCounters::window_evicted_segments`]). The default keeps
    /// nothing more: the memory store loses everything at a restart anyway.
    fn retain_since(&self, _since_ms: Option<WallMs>) {}

    /// Every stored event accepted at or after `since_ms`, settled (and kept by
    /// [`Store::retain_since`]) or still pending, each once, handed to `f` in sequence order.
    /// Start-up reads it to rebuild the deduplication windows. The default has none.
    ///
    /// # Errors
    /// Unreadable data.
    fn retained_events(
        &self,
        _since_ms: WallMs,
        _f: &mut dyn FnMut(RetainedEvent),
    ) -> Result<(), StoreError> {
        Ok(())
    }

    /// A clean stop's last call, after the last write: stores with background work finish it
    /// here (the log store writes its last frame and a checkpoint), on the calling thread, so it
    /// is done before the process exits. Writes after it are not made durable.
    fn close(&self) {}

    /// Body bytes of `queue`'s pending events ([`StoredEvent::body`]: the event as stored and
    /// delivered, without its id, trace context or the store's framing), exact across restarts
    /// (`gridlet_pending_bytes`); `None` from a store that does not count them.
    fn pending_bytes(&self, _queue: QueueId) -> Option<u64> {
        None
    }

    /// Bytes the store occupies (for metrics and the disk bound).
    fn size_on_disk(&self) -> u64 {
        0
    }

    /// Group-commit counters, for stores that have them (the sled store's journal).
    fn commit_counters(&self) -> Option<CommitCounters> {
        None
    }

    /// What the store's open found damaged and lost, in one line (the readiness detail);
    /// `None` when nothing was.
    fn damage_summary(&self) -> Option<String> {
        None
    }

    /// Record a `commit` span per group commit with `tracer` (stores that have a group commit;
    /// the log store). Called once at start-up; a tracer that is off records nothing.
    fn trace_commits(&self, _tracer: &crate::telemetry::Tracer) {}

    /// The dead letters that [`Writes::Letters`] puts into (the log store's own log, the memory
    /// store's maps), for listing, replay and purge; `None` from a store that keeps none (the
    /// broker then lists from an empty memory store).
    fn dead_letters(&self) -> Option<std::sync::Arc<dyn DeadLetterStore>> {
        None
    }

    /// Stored endpoint-health records, `(destination URL, record)` (see
    /// `delivery::health::Tracker::to_record`).
    ///
    /// # Errors
    /// Unreadable data.
    fn endpoint_health(&self) -> Result<Vec<(String, Value)>, StoreError> {
        Ok(Vec::new())
    }

    /// Keep (`Some`) or forget (`None`) a destination's health record; durable on return.
    ///
    /// # Errors
    /// Write failure.
    fn put_endpoint_health(&self, _url: &str, _record: Option<&Value>) -> Result<(), StoreError> {
        Ok(())
    }

    /// The MQTT connections and routes made through the management API (`crate::ingress`).
    ///
    /// # Errors
    /// Unreadable data, or a record this build does not read.
    fn mqtt_records(&self) -> Result<Vec<MqttRecord>, StoreError> {
        Ok(Vec::new())
    }

    /// Keep (`Some`) or forget (`None`) the MQTT connection or route `kind` `name`; durable on
    /// return.
    ///
    /// # Errors
    /// Write failure, or a store that keeps no MQTT records.
    fn put_mqtt_record(
        &self,
        _kind: MqttKind,
        _name: &str,
        _record: Option<&MqttRecord>,
    ) -> Result<(), StoreError> {
        Err(StoreError::Io(
            "this store keeps no MQTT connections or routes".into(),
        ))
    }
}

/// The contract every store implementation must pass.
#[cfg(test)]
pub mod contract;
