//! The sled store (sled 0.34.7): metadata in one database, persisted events in another.
//!
//! # Layout
//!
//! ```text
//! <persistence__metadataPath>/gridlet-v1/meta/      sled db: trees `topics`, `subs`, `health`,
//!                                                     `gridlet`
//! <persistence__metadataPath>/gridlet-v1/meta.format  marker: written once the db is initialised
//! <persistence__eventsPath>/gridlet-v1/events/      sled db: default tree = the event queues,
//!                                                     tree `deadletters` ([`deadletters`])
//! <persistence__eventsPath>/gridlet-v1/events.format
//! <persistence__eventsPath>/gridlet-v1/events.journal  the publish journal ([`journal`]), 8 MiB
//! ```
//!
//! The `gridlet-v1/` sub-directory keeps our files apart from anything the original module left in
//! the same volumes (those are ignored, never read or deleted).
//!
//! * `topics`: topic key → `order u64 BE ‖ record JSON` (order = creation order).
//! * `subs`: `queue_id u32 BE` → `{"topic": name, "record": {...}}`.
//! * `health`: destination URL → endpoint-health record JSON (disabled or frozen endpoints only;
//!   written on state transitions, see `delivery::health`).
//! * events (default tree): `queue_id u32 BE ‖ seq u64 BE` → [`encode_value`] (a versioned header:
//!   attempts, first-enqueue ms, due ms, id; then the event bytes). Big-endian keys make a queue
//!   one contiguous, sequence-ordered range. The key `[0xff; 4]` (queue id `u32::MAX`, never
//!   handed out) holds the highest sequence number ever appended, `[0xff; 4] ‖ 1` the journal
//!   sequence number of the last checkpoint.
//!
//! # Files
//!
//! * this file: options, the [`SledStore`] struct, live-byte accounting (the disk bound);
//! * `open.rs`: opening both databases, format markers, journal replay, the scan at open;
//! * `committer.rs`: the `gridlet-commit` thread (group commit, checkpoints);
//! * `events.rs`: the [`Store`](crate::store::Store) implementation and the event operations;
//! * `metadata.rs`: topics, subscriptions, queue ids, endpoint-health records;
//! * `codec.rs`: key and value byte layouts;
//! * [`journal`]: the publish journal's file format; [`deadletters`]: the dead-letter tree.
//!
//! # Durability (fsync policy)
//!
//! * [`Store::append_commit`](crate::store::Store::append_commit) (the publish path) returns once the events are in the publish
//!   journal and `fdatasync`ed: one *committer* thread writes every publish that arrived while the
//!   previous sync ran as one record (group commit). The events wait in memory (the *unflushed*
//!   map, readable through every `Store` method) until a checkpoint, every 200 ms while anything
//!   changed, moves those still pending into sled, flushes sled and `fsync`s its data file; then
//!   the journal starts over. Events settled before the checkpoint never reach sled. See
//!   [`journal`] for the protocol and the recovery rule.
//! * [`Store::append`](crate::store::Store::append) + [`Store::commit`](crate::store::Store::commit) (tests, tools) write sled directly; `commit` runs a
//!   checkpoint.
//! * Removals of delivered events ride on the next journal record; removals of dead-lettered
//!   events ([`Store::remove_dropped`](crate::store::Store::remove_dropped)) and retry-state updates wait for the checkpoint. A crash
//!   can therefore replay a delivery that had just succeeded (a duplicate, as at-least-once
//!   allows) or an attempt count one step old; never lose an acknowledged event.
//! * Metadata writes (topics, subscriptions, endpoint-health records) are flushed before the call
//!   returns.
//! * Dead letters ([`deadletters`]) are written to sled at once and made durable by the next
//!   checkpoint (not awaited).
//! * sled's own background `sync_all` (`persistence__flushEveryMs`) still runs on top.
//!
//! # Disk bound
//!
//! sled reuses freed space but never gives it back to the OS, and its files sit at about twice the
//! live data (measured: 2.09× the counted live bytes in steady fill/drain cycles). So the bound is
//! enforced here, on live bytes: an append is refused with [`StoreError::Full`] when
//! `live event bytes × 2.5` would exceed `persistence__maxDiskBytes`.
//! Deliveries and subscription deletes lower the live bytes, so publishing resumes as the
//! backlog drains.
//!
//! # Start-up
//!
//! Opening reads the events database once: it counts live bytes (disk bound), removes orphans,
//! and collects each queue's `(seq, retry state)` index, which answers the first
//! [`Store::pending_index`](crate::store::Store::pending_index) per queue. Bodies are not kept: the engine reads them with
//! [`Store::get`](crate::store::Store::get) as events enter its delivery window.
//!
//! # Start-up checks
//!
//! A database that cannot be opened, or that is empty although its `*.format` marker says it was
//! initialised, is reported as [`StoreError::Corrupt`] naming the path: gridlet refuses to start
//! rather than start empty.

mod codec;
mod committer;
pub mod deadletters;
mod events;
pub mod journal;
mod metadata;
mod open;
#[cfg(test)]
mod tests;

use crate::store::{QueueId, RetryState, StoreError};
pub use codec::{decode_value, encode_value};
pub use committer::CHECKPOINT_EVERY;
use committer::{Committer, Unflushed};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// Directory (under both configured paths) holding gridlet's own files.
pub const SUBDIR: &str = "gridlet-v1";
/// Estimated per-item cost in sled beyond key and value (node entry, lengths, page headers).
const ITEM_OVERHEAD: u64 = 48;
/// Bytes of disk budgeted per counted live byte, in tenths: sled's files measured at up to 2.09×
/// the live bytes (docs/BENCHMARKS.md), plus headroom.
pub const SPACE_FACTOR_TENTHS: u64 = 25;
const HIGH_WATER_KEY: [u8; 4] = [0xff; 4];
/// Most operations in one sled batch (removing a whole queue, replaying the journal): until it
/// is applied, a batch costs ≈ 7 KB of memory per operation (measured: 100,000 inserts 718 MB,
/// 1,000,000 removals 7.6 GB; in batches of 256: 20 MB, and no growth beyond the starting RSS).
const SLED_BATCH: usize = 256;
/// Key (default tree of the events database) holding the journal sequence number of the last
/// group applied to sled. Its 4-byte prefix is queue id `u32::MAX`, never handed out.
const JOURNAL_LSN_KEY: [u8; 5] = [0xff, 0xff, 0xff, 0xff, 0x01];

/// Options of the sled store (from `persistence__*` settings).
#[derive(Debug, Clone)]
pub struct SledOptions {
    /// `persistence__metadataPath`.
    pub metadata_path: PathBuf,
    /// `persistence__eventsPath`.
    pub events_path: PathBuf,
    /// `persistence__maxDiskBytes`: the bound on the events database (see the module docs).
    pub max_disk_bytes: u64,
    /// `persistence__cacheBytes`: sled page cache of the events database. Not an RSS bound: sled
    /// counts on-disk page bytes, real memory use is higher.
    pub cache_bytes: u64,
    /// `persistence__flushEveryMs`: period of sled's background `sync_all` (0 = off).
    pub flush_every_ms: u64,
    /// Longest wait for a checkpoint while anything changed (see [`journal`]); the default
    /// [`CHECKPOINT_EVERY`] bounds how far back a crash can replay deliveries as duplicates.
    pub checkpoint_every: std::time::Duration,
}

fn sub_live(live: &AtomicU64, n: u64) {
    if n > 0 {
        let _ = live.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            Some(v.saturating_sub(n))
        });
    }
}

/// Metadata and persisted events in two sled databases. See the module docs.
pub struct SledStore {
    meta: sled::Db,
    topics: sled::Tree,
    subs: sled::Tree,
    /// Endpoint-health records (destination URL → JSON).
    health: sled::Tree,
    events_db: sled::Db,
    events: sled::Tree,
    /// Live bytes of events and dead letters (keys + values + an estimated per-item overhead).
    live: Arc<AtomicU64>,
    /// Dead letters, in a tree of the events database.
    dead_letters: Arc<deadletters::SledDeadLetterStore>,
    /// Highest sequence number among the events found at open. The high-water key can lag behind
    /// it (concurrent appends write it without coordination), so `load` reports the larger one.
    scanned_max_seq: AtomicU64,
    /// Highest live-bytes value allowed (`max_disk_bytes / 2.5`).
    live_budget: u64,
    max_disk_bytes: u64,
    /// Queues deleted in this process: appends racing with a delete are dropped. The write lock is
    /// taken by delete, the read lock by append across check-and-write.
    deleted: Arc<RwLock<HashSet<QueueId>>>,
    /// Journaled events not yet moved into sled (see [`journal`]).
    unflushed: Arc<Unflushed>,
    /// Serialises `put_topic` order assignment.
    topic_order: Mutex<()>,
    committer: Arc<Committer>,
    committer_thread: Option<std::thread::JoinHandle<()>>,
    paths: (PathBuf, PathBuf),
    /// Per queue, the `(seq, retry state)` of every event found by the scan at open: answers
    /// the first [`Store::pending_index`](crate::store::Store::pending_index) of each queue without a second pass over the
    /// database. A queue's entry is dropped as soon as anything writes to it (it would be stale).
    recovered: Mutex<HashMap<QueueId, Vec<(u64, RetryState)>>>,
    has_recovered: AtomicBool,
}

fn io(e: sled::Error) -> StoreError {
    match e {
        sled::Error::Corruption { .. } => StoreError::Corrupt(e.to_string()),
        other => StoreError::Io(other.to_string()),
    }
}

fn corrupt(path: &Path, what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{}: {what}", path.display()))
}

fn item_cost(value_len: usize) -> u64 {
    12 + value_len as u64 + ITEM_OVERHEAD
}

impl SledStore {
    fn sub_live(&self, n: u64) {
        sub_live(&self.live, n);
    }

    /// Count `cost` live bytes against the disk bound, or refuse with [`StoreError::Full`].
    fn reserve_live(&self, cost: u64) -> Result<(), StoreError> {
        let budget = self.live_budget;
        self.live
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                let next = used.saturating_add(cost);
                (next <= budget).then_some(next)
            })
            .map(|_| ())
            .map_err(|used| StoreError::Full {
                used: used.saturating_mul(SPACE_FACTOR_TENTHS) / 10,
                limit: self.max_disk_bytes,
            })
    }

    /// Live event bytes as counted for the disk bound.
    pub fn live_bytes(&self) -> u64 {
        self.live.load(Ordering::Relaxed)
    }
}

impl Drop for SledStore {
    fn drop(&mut self) {
        self.committer.lock().shutdown = true;
        self.committer.wake.notify_one();
        if let Some(t) = self.committer_thread.take() {
            let _ = t.join();
        }
        let _ = self.meta.flush();
    }
}
