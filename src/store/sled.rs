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
//! # Durability (fsync policy)
//!
//! * [`Store::append_commit`] (the publish path) returns once the events are in the publish
//!   journal and `fdatasync`ed: one *committer* thread writes every publish that arrived while the
//!   previous sync ran as one record (group commit). The events wait in memory (the *unflushed*
//!   map, readable through every `Store` method) until a checkpoint, every 200 ms while anything
//!   changed, moves those still pending into sled, flushes sled and `fsync`s its data file; then
//!   the journal starts over. Events settled before the checkpoint never reach sled. See
//!   [`journal`] for the protocol and the recovery rule.
//! * [`Store::append`] + [`Store::commit`] (tests, tools) write sled directly; `commit` runs a
//!   checkpoint.
//! * Removals of delivered events ride on the next journal record; removals of dead-lettered
//!   events ([`Store::remove_dropped`]) and retry-state updates wait for the checkpoint. A crash
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
//! [`Store::pending_index`] per queue. Bodies are not kept: the engine reads them with
//! [`Store::get`] as events enter its delivery window.
//!
//! # Start-up checks
//!
//! A database that cannot be opened, or that is empty although its `*.format` marker says it was
//! initialised, is reported as [`StoreError::Corrupt`] naming the path: gridlet refuses to start
//! rather than start empty.

pub mod deadletters;
pub mod journal;

use super::deadletter::DeadLetterStore;
use super::{QueueId, RetryState, Snapshot, Store, StoreError, StoredEvent};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use tokio::sync::oneshot;

/// Directory (under both configured paths) holding gridlet's own files.
pub const SUBDIR: &str = "gridlet-v1";
const FORMAT_KEY: &[u8] = b"format";
const FORMAT_VERSION: &[u8] = b"1";
const VALUE_VERSION: u8 = 1;
const HEADER_LEN: usize = 1 + 4 + 8 + 8 + 4;
/// Estimated per-item cost in sled beyond key and value (node entry, lengths, page headers).
const ITEM_OVERHEAD: u64 = 48;
/// Bytes of disk budgeted per counted live byte, in tenths: sled's files measured at up to 2.09×
/// the live bytes (docs/BENCHMARKS.md), plus headroom.
pub const SPACE_FACTOR_TENTHS: u64 = 25;
const HIGH_WATER_KEY: [u8; 4] = [0xff; 4];
const META_CACHE_BYTES: u64 = 1 << 20;
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

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

/// Counters of the group commit (for benchmarks and metrics).
#[derive(Debug, Default, Clone, Copy)]
pub struct CommitStats {
    /// `commit` calls and journaled publishes answered.
    pub commits: u64,
    /// Groups written to the journal (one `fdatasync` each).
    pub groups: u64,
    /// Checkpoints (sled flush + `fsync` of its data file) run by the committer.
    pub flushes: u64,
}

/// A journaled publish waiting for the committer.
struct PendingAppend {
    /// `(queue, seq, sled value)`.
    items: Vec<journal::Item>,
    /// Live bytes reserved for `items` (given back for items not written).
    cost: u64,
    done: oneshot::Sender<Result<(), String>>,
}

#[derive(Default)]
struct CommitState {
    appends: Vec<PendingAppend>,
    /// Events settled since the last journal record: written with the next group, so a crash
    /// does not bring them back (see [`journal`]).
    removed: Vec<(QueueId, u64)>,
    waiters: Vec<oneshot::Sender<Result<(), String>>>,
    dirty: bool,
    shutdown: bool,
    stats: CommitStats,
    /// The committer waits on the condvar: a publish wakes it. While it writes and syncs a group
    /// it is not woken (it takes every waiting publish when it is done), which saves a futex
    /// call per publish under load.
    sleeping: bool,
}

/// Shared between the store and its committer thread.
struct Committer {
    state: Mutex<CommitState>,
    wake: Condvar,
}

/// How long changes that are not journaled (removals, retry state, dead letters) and journal
/// records wait for a checkpoint at most (default of [`SledOptions::checkpoint_every`]).
pub const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(200);
/// A journal this long is checkpointed at once (bounds its disk use and replay time).
const MAX_JOURNAL_BYTES: u64 = journal::PREALLOCATED_BYTES / 4 * 3;
/// Most operations in one sled batch (removing a whole queue, replaying the journal): until it
/// is applied, a batch costs ≈ 7 KB of memory per operation (measured: 100,000 inserts 718 MB,
/// 1,000,000 removals 7.6 GB; in batches of 256: 20 MB, and no growth beyond the starting RSS).
const SLED_BATCH: usize = 256;
/// Least time between two size-triggered checkpoints (keeps a failing one from running per group).
const MIN_CHECKPOINT_GAP: std::time::Duration = std::time::Duration::from_millis(10);
/// Key (default tree of the events database) holding the journal sequence number of the last
/// group applied to sled. Its 4-byte prefix is queue id `u32::MAX`, never handed out.
const JOURNAL_LSN_KEY: [u8; 5] = [0xff, 0xff, 0xff, 0xff, 0x01];

impl Committer {
    fn lock(&self) -> std::sync::MutexGuard<'_, CommitState> {
        // Every critical section is a few field updates with no panic path.
        crate::sync::lock(&self.state)
    }

    /// Ask for a checkpoint soon (within [`CHECKPOINT_EVERY`]) without waiting for it.
    fn nudge(&self) {
        self.lock().dirty = true;
        self.wake.notify_one();
    }

    /// The committer thread: journals each group of publishes with one `fdatasync`, and
    /// checkpoints (see [`journal`]).
    fn run(&self, mut w: Writer) {
        loop {
            let (mut appends, waiters, removed) = {
                let mut g = self.lock();
                loop {
                    if g.shutdown || !g.appends.is_empty() || !g.waiters.is_empty() {
                        break;
                    }
                    w.dirty |= std::mem::take(&mut g.dirty);
                    if w.dirty || !w.journal.is_empty() {
                        let due = w.last_checkpoint + w.checkpoint_every;
                        let now = std::time::Instant::now();
                        if now >= due {
                            break;
                        }
                        g.sleeping = true;
                        g = self
                            .wake
                            .wait_timeout(g, due - now)
                            .map(|(g, _)| g)
                            .unwrap_or_else(|p| p.into_inner().0);
                        g.sleeping = false;
                    } else {
                        g.sleeping = true;
                        g = self.wake.wait(g).unwrap_or_else(|p| p.into_inner());
                        g.sleeping = false;
                    }
                }
                if g.shutdown && g.appends.is_empty() && g.waiters.is_empty() {
                    break;
                }
                w.dirty |= std::mem::take(&mut g.dirty);
                g.stats.commits += (g.appends.len() + g.waiters.len()) as u64;
                g.stats.groups += u64::from(!g.appends.is_empty());
                let removed = if g.appends.is_empty() {
                    Vec::new()
                } else {
                    std::mem::take(&mut g.removed)
                };
                (
                    std::mem::take(&mut g.appends),
                    std::mem::take(&mut g.waiters),
                    removed,
                )
            };
            if !appends.is_empty() {
                let result = w.write_group(&mut appends, &removed);
                if let Err(e) = &result {
                    tracing::error!(error = %e, "event journal write failed");
                    // Not journaled: the removals ride the next record instead.
                    self.lock().removed.extend_from_slice(&removed);
                }
                for a in appends {
                    // A publisher whose request was cancelled is gone; nothing to tell it.
                    let _ = a.done.send(result.clone());
                }
            }
            let due = (w.dirty || !w.journal.is_empty())
                && w.last_checkpoint.elapsed() >= w.checkpoint_every;
            let full = w.journal.len() > MAX_JOURNAL_BYTES
                && w.last_checkpoint.elapsed() >= MIN_CHECKPOINT_GAP;
            if due || full || !waiters.is_empty() {
                // Removals noted before the checkpoint are made durable by it (sled's) or moot
                // (events that never reached sled); later ones wait for the next record.
                let noted = {
                    let mut g = self.lock();
                    g.stats.flushes += 1;
                    g.removed.len()
                };
                let result = w.checkpoint();
                if result.is_ok() {
                    let mut g = self.lock();
                    let n = noted.min(g.removed.len());
                    g.removed.drain(..n);
                }
                if let Err(e) = &result {
                    tracing::error!(error = %e, "event store checkpoint failed");
                }
                for tx in waiters {
                    let _ = tx.send(result.clone());
                }
            }
        }
        // Final checkpoint so a clean shutdown leaves nothing to replay.
        match w.checkpoint().and_then(|()| w.journal.close_clean()) {
            Ok(()) => {}
            Err(e) => tracing::error!(error = %e, "event store checkpoint at shutdown failed"),
        }
    }
}

/// The committer thread's side of the events database.
struct Writer {
    db: sled::Db,
    events: sled::Tree,
    live: Arc<AtomicU64>,
    deleted: Arc<RwLock<HashSet<QueueId>>>,
    journal: journal::Journal,
    unflushed: Arc<Unflushed>,
    /// sled's data file (`<dir>/db`), `fsync`ed at each checkpoint.
    data_file: PathBuf,
    lsn: u64,
    high_water: u64,
    checkpointed_high_water: u64,
    last_checkpoint: std::time::Instant,
    checkpoint_every: std::time::Duration,
    /// Unjournaled changes since the last checkpoint.
    dirty: bool,
    /// The journal's growth past its normal size, as charged to `live` (in live-byte units).
    journal_charged: u64,
}

impl Writer {
    /// Append a group of publishes to the journal and `fdatasync`, then make its events visible
    /// in the unflushed map (sled gets them at the next checkpoint, if still pending).
    /// The events' values move into the map (the publishers' copies are not needed after).
    fn write_group(
        &mut self,
        appends: &mut [PendingAppend],
        removed: &[(QueueId, u64)],
    ) -> Result<(), String> {
        let reserved: u64 = appends.iter().map(|a| a.cost).sum();
        // Held to the end: a subscription delete waits, then removes these events too.
        let deleted = crate::sync::read(&self.deleted);
        // Events of subscriptions deleted meanwhile are neither journaled nor kept.
        for a in appends.iter_mut() {
            a.items.retain(|(q, _, _)| !deleted.contains(q));
        }
        let items = || appends.iter().flat_map(|a| &a.items);
        let kept: u64 = items().map(|(_, _, v)| item_cost(v.len())).sum();
        if kept == 0 {
            sub_live(&self.live, reserved);
            if removed.is_empty() {
                return Ok(());
            }
            // The removals noted since the previous record still need one.
            let lsn = self.lsn + 1;
            self.journal.append(lsn, std::iter::empty(), removed)?;
            self.lsn = lsn;
            charge_journal(&self.journal, &self.live, &mut self.journal_charged);
            return Ok(());
        }
        let lsn = self.lsn + 1;
        let written = items().map(|(q, seq, v)| (*q, *seq, v.as_slice()));
        if let Err(e) = self.journal.append(lsn, written, removed) {
            sub_live(&self.live, reserved);
            return Err(e);
        }
        self.lsn = lsn;
        charge_journal(&self.journal, &self.live, &mut self.journal_charged);
        let max_seq = items().map(|(_, seq, _)| *seq).max().unwrap_or(0);
        self.high_water = self.high_water.max(max_seq);
        // Items of deleted queues give their bytes back; the others stay counted until removed.
        sub_live(&self.live, reserved.saturating_sub(kept));
        let mut map = lock_map(&self.unflushed);
        for a in appends.iter_mut() {
            for (q, seq, v) in a.items.drain(..) {
                map.insert((q, seq), v);
            }
        }
        Ok(())
    }

    /// Move the events still pending from the unflushed map into sled, record the journal
    /// sequence number, make sled durable (flush + `fsync` of its data file), and start the
    /// journal over.
    fn checkpoint(&mut self) -> Result<(), String> {
        // Counted from the attempt: a failing checkpoint (disk full, I/O error) is retried after
        // the interval, not in a busy loop.
        self.last_checkpoint = std::time::Instant::now();
        {
            // Removals racing with the move are ordered by the map's lock: an event is either
            // still in the map (its remover takes it from there) or already in sled.
            let deleted = crate::sync::read(&self.deleted);
            let keys: Vec<(QueueId, u64)> = lock_map(&self.unflushed).keys().copied().collect();
            for k in keys {
                let mut map = lock_map(&self.unflushed);
                let Some(v) = map.remove(&k) else { continue };
                if deleted.contains(&k.0) {
                    sub_live(&self.live, item_cost(v.len()));
                    continue;
                }
                if let Err(e) = self.events.insert(event_key(k.0, k.1), v.as_slice()) {
                    map.insert(k, v);
                    return Err(e.to_string());
                }
            }
        }
        if self.high_water > self.checkpointed_high_water {
            self.events
                .insert(HIGH_WATER_KEY, &self.high_water.to_be_bytes())
                .map_err(|e| e.to_string())?;
            self.checkpointed_high_water = self.high_water;
        }
        self.events
            .insert(JOURNAL_LSN_KEY, &self.lsn.to_be_bytes())
            .map_err(|e| e.to_string())?;
        self.db.flush().map_err(|e| e.to_string())?;
        journal::fsync_file(&self.data_file)?;
        self.journal.reset();
        charge_journal(&self.journal, &self.live, &mut self.journal_charged);
        self.dirty = false;
        Ok(())
    }
}

/// Remove every key of `queue` from `tree`, in batches of [`SLED_BATCH`]; returns the live bytes
/// freed. Not atomic, and need not be: callers remove the queue's record first, and what a crash
/// leaves is removed at the next start. One batch of a whole backlog is not affordable: deleting
/// a subscription with 1,000,000 stored events in one batch took 7.6 GB of RSS and 35 s; in
/// batches of 256 it stays within the RSS it started at and takes 6 s (`examples/sled_mem.rs`).
fn remove_prefix(tree: &sled::Tree, queue: QueueId) -> Result<u64, StoreError> {
    let mut freed = 0u64;
    loop {
        let mut batch = sled::Batch::default();
        let mut n = 0;
        for item in tree.scan_prefix(queue.to_be_bytes()).take(SLED_BATCH) {
            let (k, v) = item.map_err(io)?;
            freed += item_cost(v.len());
            batch.remove(k);
            n += 1;
        }
        if n == 0 {
            return Ok(freed);
        }
        tree.apply_batch(batch).map_err(io)?;
    }
}

/// Journaled events not in sled yet, by `(queue, seq)` → sled value.
type Unflushed = Mutex<HashMap<(QueueId, u64), Vec<u8>>>;

fn lock_map(m: &Unflushed) -> std::sync::MutexGuard<'_, HashMap<(QueueId, u64), Vec<u8>>> {
    crate::sync::lock(m)
}

/// Count the journal file's growth past its normal size against the disk bound (in the live-byte
/// units the bound is kept in), and give it back once a checkpoint cut the file back.
fn charge_journal(journal: &journal::Journal, live: &AtomicU64, charged: &mut u64) {
    let want = journal.excess_bytes() * 10 / SPACE_FACTOR_TENTHS;
    if want > *charged {
        live.fetch_add(want - *charged, Ordering::Relaxed);
    } else {
        sub_live(live, *charged - want);
    }
    *charged = want;
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
    /// the first [`Store::pending_index`] of each queue without a second pass over the
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

fn event_key(queue: QueueId, seq: u64) -> [u8; 12] {
    let mut k = [0u8; 12];
    let (q, s) = k.split_at_mut(4);
    q.copy_from_slice(&queue.to_be_bytes());
    s.copy_from_slice(&seq.to_be_bytes());
    k
}

fn parse_key(k: &[u8]) -> Option<(QueueId, u64)> {
    let q: [u8; 4] = k.get(..4)?.try_into().ok()?;
    let s: [u8; 8] = k.get(4..12)?.try_into().ok()?;
    (k.len() == 12).then(|| (u32::from_be_bytes(q), u64::from_be_bytes(s)))
}

/// Encode a stored event's value: `version u8 ‖ attempts u32 ‖ first_enqueued_ms u64 ‖ due_ms
/// u64 ‖ id_len u32 ‖ id ‖ body` (all big-endian).
pub fn encode_value(e: &StoredEvent) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER_LEN + e.id.len() + e.body.len());
    v.push(VALUE_VERSION);
    v.extend_from_slice(&e.state.attempts.to_be_bytes());
    v.extend_from_slice(&e.state.first_enqueued_ms.to_be_bytes());
    v.extend_from_slice(&e.state.due_ms.to_be_bytes());
    v.extend_from_slice(&(e.id.len() as u32).to_be_bytes());
    v.extend_from_slice(e.id.as_bytes());
    v.extend_from_slice(&e.body);
    v
}

fn be<const N: usize>(v: &[u8], at: usize) -> Option<[u8; N]> {
    v.get(at..at + N)?.try_into().ok()
}

/// A big-endian `u64` stored under `key` (the high-water mark, the journal sequence number);
/// 0 when absent.
fn read_u64(tree: &sled::Tree, key: &[u8]) -> Result<u64, StoreError> {
    Ok(tree
        .get(key)
        .map_err(io)?
        .and_then(|v| be::<8>(&v, 0))
        .map_or(0, u64::from_be_bytes))
}

fn decode_state(v: &[u8]) -> Option<RetryState> {
    if v.first() != Some(&VALUE_VERSION) {
        return None;
    }
    Some(RetryState {
        attempts: u32::from_be_bytes(be(v, 1)?),
        first_enqueued_ms: u64::from_be_bytes(be(v, 5)?),
        due_ms: u64::from_be_bytes(be(v, 13)?),
    })
}

/// Decode a value written by [`encode_value`]; `None` when it is not one.
pub fn decode_value(seq: u64, v: &[u8]) -> Option<StoredEvent> {
    let state = decode_state(v)?;
    let id_len = u32::from_be_bytes(be(v, 21)?) as usize;
    let id = std::str::from_utf8(v.get(HEADER_LEN..HEADER_LEN + id_len)?).ok()?;
    let body = v.get(HEADER_LEN + id_len..)?;
    Some(StoredEvent {
        seq,
        id: id.to_string(),
        body: Bytes::copy_from_slice(body),
        state,
    })
}

fn patch_state(v: &[u8], s: RetryState) -> Vec<u8> {
    let mut out = v.to_vec();
    if let Some(h) = out.get_mut(1..21) {
        let (attempts, rest) = h.split_at_mut(4);
        let (first, due) = rest.split_at_mut(8);
        attempts.copy_from_slice(&s.attempts.to_be_bytes());
        first.copy_from_slice(&s.first_enqueued_ms.to_be_bytes());
        due.copy_from_slice(&s.due_ms.to_be_bytes());
    }
    out
}

/// Queue ids that a subscription record owns.
fn known_queues(subs: &sled::Tree, path: &Path) -> Result<HashSet<QueueId>, StoreError> {
    subs.iter()
        .keys()
        .map(|k| {
            let k = k.map_err(io)?;
            let b: [u8; 4] = k
                .as_ref()
                .try_into()
                .map_err(|_| corrupt(path, "bad subscription key"))?;
            Ok(u32::from_be_bytes(b))
        })
        .collect()
}

fn item_cost(value_len: usize) -> u64 {
    12 + value_len as u64 + ITEM_OVERHEAD
}

/// Open one sled database at `<base>/gridlet-v1/<name>`, checking its format marker.
fn open_db(
    base: &Path,
    name: &str,
    cache: u64,
    flush_every_ms: u64,
) -> Result<sled::Db, StoreError> {
    let root = base.join(SUBDIR);
    let dir = root.join(name);
    let marker = root.join(format!("{name}.format"));
    let initialised = marker.exists();
    if initialised && !dir.is_dir() {
        return Err(corrupt(
            &dir,
            "the database directory is missing although it was initialised (restore it, or delete the whole gridlet-v1 directory to start empty)",
        ));
    }
    std::fs::create_dir_all(&root).map_err(|e| corrupt(&root, format!("cannot create: {e}")))?;
    let cfg = sled::Config::new()
        .path(&dir)
        .cache_capacity(cache)
        .mode(sled::Mode::LowSpace)
        .use_compression(false)
        .flush_every_ms((flush_every_ms > 0).then_some(flush_every_ms));
    // sled panics on some kinds of damage instead of returning an error: turn that into the same
    // clear start-up error (with panic=abort builds the panic message is printed and the process
    // exits, which is still not a silent empty start).
    //
    // sled holds an exclusive lock on its files: a previous instance still shutting down (the same
    // process in tests, an exiting container in production) gets a few seconds to let go.
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    let db = loop {
        let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cfg.open()))
            .map_err(|_| {
                corrupt(
                    &dir,
                    "sled panicked while opening the database (damaged files)",
                )
            })?;
        match opened {
            Ok(db) => break db,
            Err(sled::Error::Io(e)) if e.to_string().contains("could not acquire lock") => {
                if std::time::Instant::now() >= deadline {
                    return Err(StoreError::Io(format!(
                        "{}: the database is in use by another process (another gridlet on the same directory?)",
                        dir.display()
                    )));
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => return Err(corrupt(&dir, format!("cannot open the database: {e}"))),
        }
    };
    let marks = db.open_tree("gridlet").map_err(io)?;
    match marks.get(FORMAT_KEY).map_err(|e| corrupt(&dir, e))? {
        Some(v) if v.as_ref() == FORMAT_VERSION => {}
        Some(v) => {
            return Err(corrupt(
                &dir,
                format!(
                    "unsupported format version {:?} (this gridlet reads version 1)",
                    String::from_utf8_lossy(&v)
                ),
            ))
        }
        None if initialised => {
            return Err(corrupt(
                &dir,
                "the database is empty although it was initialised: its files are damaged or were replaced (restore them, or delete the whole gridlet-v1 directory to start empty)",
            ))
        }
        None => {
            marks.insert(FORMAT_KEY, FORMAT_VERSION).map_err(io)?;
            db.flush().map_err(io)?;
            write_marker(&marker)?;
        }
    }
    Ok(db)
}

fn write_marker(path: &Path) -> Result<(), StoreError> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).map_err(|e| corrupt(path, e))?;
    f.write_all(b"gridlet sled store, format 1\n")
        .and_then(|_| f.sync_all())
        .map_err(|e| corrupt(path, e))
}

/// Apply the journal's acknowledged groups that sled does not hold (see [`journal`]), make them
/// durable, and empty the journal. Returns the journal and the last applied sequence number.
fn replay_journal(
    db: &sled::Db,
    events: &sled::Tree,
    dir: &Path,
) -> Result<(journal::Journal, u64), StoreError> {
    let path = dir.join("events.journal");
    let (mut j, records) = journal::Journal::open(&path).map_err(StoreError::Io)?;
    let applied = read_u64(events, &JOURNAL_LSN_KEY)?;
    let mut lsn = applied;
    let mut replayed = 0usize;
    let mut max_seq = 0u64;
    for r in records.into_iter().filter(|r| r.lsn > applied) {
        // A record (one group of publishes) can hold many thousands of events, and a sled batch
        // costs ≈ 7 KB of memory per operation until applied (100,000 inserts: 718 MB), so it is
        // applied in batches of `SLED_BATCH`. A record need not be applied atomically: its
        // sequence number is written with its last batch, and replaying a record again after a
        // crash in between repeats the same inserts and removals.
        let mut batch = sled::Batch::default();
        let mut ops = 0;
        replayed += r.items.len();
        let inserts = r.items.into_iter().map(|(q, seq, v)| {
            max_seq = max_seq.max(seq);
            (event_key(q, seq), Some(v))
        });
        let removals = r
            .removed
            .into_iter()
            .map(|(q, seq)| (event_key(q, seq), None));
        for (key, value) in inserts.chain(removals) {
            match value {
                Some(v) => batch.insert(&key, v),
                None => batch.remove(&key),
            }
            ops += 1;
            if ops == SLED_BATCH {
                events.apply_batch(std::mem::take(&mut batch)).map_err(io)?;
                ops = 0;
            }
        }
        batch.insert(&JOURNAL_LSN_KEY, &r.lsn.to_be_bytes());
        events.apply_batch(batch).map_err(io)?;
        lsn = lsn.max(r.lsn);
    }
    if lsn > applied {
        // Sequence numbers of replayed events that were settled stay used.
        if max_seq > read_u64(events, &HIGH_WATER_KEY)? {
            events
                .insert(HIGH_WATER_KEY, &max_seq.to_be_bytes())
                .map_err(io)?;
        }
        tracing::info!(
            events = replayed,
            "replayed acknowledged events from the journal"
        );
        db.flush().map_err(io)?;
        journal::fsync_file(&dir.join("events").join("db")).map_err(StoreError::Io)?;
    }
    j.reset();
    Ok((j, lsn))
}

impl SledStore {
    /// Open (or create) both databases.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] naming the path when a database cannot be opened or is damaged.
    pub fn open(opts: &SledOptions) -> Result<Self, StoreError> {
        let meta = open_db(
            &opts.metadata_path,
            "meta",
            META_CACHE_BYTES,
            opts.flush_every_ms,
        )?;
        let events_db = open_db(
            &opts.events_path,
            "events",
            opts.cache_bytes,
            opts.flush_every_ms,
        )?;
        let topics = meta.open_tree("topics").map_err(io)?;
        let subs = meta.open_tree("subs").map_err(io)?;
        let health = meta.open_tree("health").map_err(io)?;
        let events: sled::Tree = (*events_db).clone();
        let events_dir = opts.events_path.join(SUBDIR);
        let (journal, lsn) = replay_journal(&events_db, &events, &events_dir)?;
        let high_water = read_u64(&events, &HIGH_WATER_KEY)?;
        let committer = Arc::new(Committer {
            state: Mutex::new(CommitState::default()),
            wake: Condvar::new(),
        });
        let live = Arc::new(AtomicU64::new(0));
        let deleted = Arc::new(RwLock::new(HashSet::new()));
        let unflushed: Arc<Unflushed> = Arc::default();
        let writer = Writer {
            db: events_db.clone(),
            events: events.clone(),
            live: live.clone(),
            deleted: deleted.clone(),
            journal,
            unflushed: unflushed.clone(),
            data_file: events_dir.join("events").join("db"),
            lsn,
            high_water,
            checkpointed_high_water: high_water,
            last_checkpoint: std::time::Instant::now(),
            checkpoint_every: opts.checkpoint_every,
            dirty: false,
            journal_charged: 0,
        };
        let thread = {
            let c = committer.clone();
            std::thread::Builder::new()
                .name("gridlet-commit".into())
                .spawn(move || c.run(writer))
                .map_err(|e| StoreError::Io(format!("cannot start the committer thread: {e}")))?
        };
        let (dead_letters, dead_letter_bytes) = deadletters::SledDeadLetterStore::open(
            &events_db,
            &known_queues(&subs, &opts.metadata_path)?,
            live.clone(),
            committer.clone(),
            opts.events_path.clone(),
        )?;
        let store = Self {
            meta,
            topics,
            subs,
            health,
            events_db,
            events,
            live,
            dead_letters: Arc::new(dead_letters),
            scanned_max_seq: AtomicU64::new(0),
            live_budget: opts.max_disk_bytes / SPACE_FACTOR_TENTHS * 10,
            max_disk_bytes: opts.max_disk_bytes,
            deleted,
            unflushed,
            topic_order: Mutex::new(()),
            committer,
            committer_thread: Some(thread),
            paths: (opts.metadata_path.clone(), opts.events_path.clone()),
            recovered: Mutex::new(HashMap::new()),
            has_recovered: AtomicBool::new(false),
        };
        store.scan_events()?;
        store.live.fetch_add(dead_letter_bytes, Ordering::Relaxed);
        Ok(store)
    }

    /// Count live bytes and remove events of queues no subscription owns (left by a crash between
    /// deleting a subscription's record and its events, or by a metadata directory that was reset).
    fn scan_events(&self) -> Result<(), StoreError> {
        let known: HashSet<QueueId> = self
            .subs
            .iter()
            .keys()
            .map(|k| {
                let k = k.map_err(io)?;
                let b: [u8; 4] = k
                    .as_ref()
                    .try_into()
                    .map_err(|_| corrupt(&self.paths.0, "bad subscription key"))?;
                Ok(u32::from_be_bytes(b))
            })
            .collect::<Result<_, StoreError>>()?;
        let mut live = 0u64;
        let mut max_seq = 0u64;
        let mut orphans: Vec<(QueueId, u64)> = Vec::new();
        let mut index: HashMap<QueueId, Vec<(u64, RetryState)>> = HashMap::new();
        for item in self.events.iter() {
            let (k, v) = item.map_err(io)?;
            if k.starts_with(&HIGH_WATER_KEY) {
                continue; // the high-water mark and the journal sequence number
            }
            let (q, seq) = parse_key(&k).ok_or_else(|| corrupt(&self.paths.1, "bad event key"))?;
            if known.contains(&q) {
                live += item_cost(v.len());
                max_seq = max_seq.max(seq);
                index
                    .entry(q)
                    .or_default()
                    .push((seq, self.state_of(q, seq, &v)?));
            } else {
                match orphans.last_mut() {
                    Some((oq, n)) if *oq == q => *n += 1,
                    _ => orphans.push((q, 1)),
                }
            }
        }
        for (q, n) in orphans {
            tracing::warn!(
                queue = q,
                events = n,
                "removing stored events of a subscription that no longer exists"
            );
            self.remove_queue(q)?;
        }
        self.live.store(live, Ordering::Relaxed);
        self.scanned_max_seq.store(max_seq, Ordering::Relaxed);
        self.has_recovered
            .store(!index.is_empty(), Ordering::Relaxed);
        *crate::sync::lock(&self.recovered) = index;
        Ok(())
    }

    /// Drop the scan-at-open index of `queue` (it is being written to).
    fn forget_recovered(&self, queue: QueueId) {
        if self.has_recovered.load(Ordering::Relaxed) {
            let mut g = crate::sync::lock(&self.recovered);
            g.remove(&queue);
            if g.is_empty() {
                self.has_recovered.store(false, Ordering::Relaxed);
            }
        }
    }

    /// Remove every stored event of `queue` (see [`remove_prefix`]).
    fn remove_queue(&self, queue: QueueId) -> Result<u64, StoreError> {
        let freed = remove_prefix(&self.events, queue)?;
        self.committer.nudge();
        Ok(freed)
    }

    fn sub_live(&self, n: u64) {
        sub_live(&self.live, n);
    }

    /// Remove settled events: from the unflushed map, else from sled. `journal_removal`: note
    /// them for the next journal record (see [`Store::remove_dropped`] for when not to).
    fn remove_events(
        &self,
        queue: QueueId,
        seqs: &[u64],
        journal_removal: bool,
    ) -> Result<(), StoreError> {
        self.forget_recovered(queue);
        let mut freed = 0u64;
        // Events settled before their checkpoint never reach sled.
        let in_sled: Vec<u64> = {
            let mut map = lock_map(&self.unflushed);
            seqs.iter()
                .copied()
                .filter(|s| match map.remove(&(queue, *s)) {
                    Some(v) => {
                        freed += item_cost(v.len());
                        false
                    }
                    None => true,
                })
                .collect()
        };
        for s in &in_sled {
            if let Some(v) = self.events.remove(event_key(queue, *s)).map_err(io)? {
                freed += item_cost(v.len());
            }
        }
        self.sub_live(freed);
        {
            let mut g = self.committer.lock();
            if journal_removal {
                g.removed.extend(seqs.iter().map(|s| (queue, *s)));
            }
            g.dirty |= !in_sled.is_empty();
        }
        if !in_sled.is_empty() {
            self.committer.wake.notify_one();
        }
        Ok(())
    }

    fn unreadable(&self, queue: QueueId, seq: u64) -> StoreError {
        corrupt(
            &self.paths.1,
            format!("event {seq} of queue {queue} is unreadable"),
        )
    }

    fn state_of(&self, queue: QueueId, seq: u64, v: &[u8]) -> Result<RetryState, StoreError> {
        decode_state(v).ok_or_else(|| self.unreadable(queue, seq))
    }

    fn event_of(&self, queue: QueueId, seq: u64, v: &[u8]) -> Result<StoredEvent, StoreError> {
        decode_value(seq, v).ok_or_else(|| self.unreadable(queue, seq))
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

    /// Group-commit counters.
    pub fn commit_stats(&self) -> CommitStats {
        self.committer.lock().stats
    }

    fn flush_meta(&self) -> Result<(), StoreError> {
        self.meta.flush().map(|_| ()).map_err(io)
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

impl Store for SledStore {
    fn load(&self) -> Result<Snapshot, StoreError> {
        let mut topics = Vec::new();
        for item in self.topics.iter() {
            let (k, v) = item.map_err(io)?;
            let order = be::<8>(&v, 0)
                .map(u64::from_be_bytes)
                .ok_or_else(|| corrupt(&self.paths.0, "bad topic record"))?;
            let rec: Value = v
                .get(8..)
                .and_then(|b| serde_json::from_slice(b).ok())
                .ok_or_else(|| {
                    corrupt(
                        &self.paths.0,
                        format!("topic '{}' is unreadable", String::from_utf8_lossy(&k)),
                    )
                })?;
            topics.push((order, rec));
        }
        topics.sort_by_key(|(o, _)| *o);
        let mut subscriptions = Vec::new();
        for item in self.subs.iter() {
            let (k, v) = item.map_err(io)?;
            let q = be::<4>(&k, 0)
                .map(u32::from_be_bytes)
                .ok_or_else(|| corrupt(&self.paths.0, "bad subscription key"))?;
            let mut rec: Value = serde_json::from_slice(&v)
                .map_err(|e| corrupt(&self.paths.0, format!("subscription {q}: {e}")))?;
            let topic = rec
                .get("topic")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let record = rec.get_mut("record").map(Value::take).unwrap_or_default();
            subscriptions.push((topic, q, record));
        }
        let high_water = read_u64(&self.events, &HIGH_WATER_KEY)?;
        let max_seq = high_water.max(self.scanned_max_seq.load(Ordering::Relaxed));
        Ok(Snapshot {
            topics: topics.into_iter().map(|(_, v)| v).collect(),
            subscriptions,
            max_seq,
        })
    }

    fn pending(&self, queue: QueueId) -> Result<Vec<StoredEvent>, StoreError> {
        // The map's lock keeps a checkpoint from moving events between the two reads.
        let map = lock_map(&self.unflushed);
        let mut out = Vec::new();
        for ((q, seq), v) in map.iter() {
            if *q == queue {
                out.push(self.event_of(*q, *seq, v)?);
            }
        }
        for item in self.events.scan_prefix(queue.to_be_bytes()) {
            let (k, v) = item.map_err(io)?;
            let (_, seq) = parse_key(&k).ok_or_else(|| corrupt(&self.paths.1, "bad event key"))?;
            out.push(self.event_of(queue, seq, &v)?);
        }
        drop(map);
        out.sort_by_key(|e| e.seq);
        Ok(out)
    }

    fn pending_index(&self, queue: QueueId) -> Result<Vec<(u64, RetryState)>, StoreError> {
        if self.has_recovered.load(Ordering::Relaxed) {
            let mut g = crate::sync::lock(&self.recovered);
            let found = g.remove(&queue);
            if g.is_empty() {
                self.has_recovered.store(false, Ordering::Relaxed);
            }
            if let Some(v) = found {
                return Ok(v);
            }
        }
        // States only (no bodies): a large backlog is indexed without copying it.
        let map = lock_map(&self.unflushed);
        let mut out = Vec::new();
        for ((q, seq), v) in map.iter() {
            if *q == queue {
                out.push((*seq, self.state_of(*q, *seq, v)?));
            }
        }
        for item in self.events.scan_prefix(queue.to_be_bytes()) {
            let (k, v) = item.map_err(io)?;
            let (_, seq) = parse_key(&k).ok_or_else(|| corrupt(&self.paths.1, "bad event key"))?;
            out.push((seq, self.state_of(queue, seq, &v)?));
        }
        drop(map);
        out.sort_by_key(|(seq, _)| *seq);
        Ok(out)
    }

    fn get(&self, queue: QueueId, seqs: &[u64]) -> Result<Vec<Option<StoredEvent>>, StoreError> {
        // An event not in the map is in sled or settled: a checkpoint never moves one back.
        let from_map: Vec<Option<Vec<u8>>> = {
            let map = lock_map(&self.unflushed);
            seqs.iter()
                .map(|s| map.get(&(queue, *s)).cloned())
                .collect()
        };
        let mut out = Vec::with_capacity(seqs.len());
        for (&seq, mapped) in seqs.iter().zip(from_map) {
            let value = match mapped {
                Some(v) => Some(v),
                None => self
                    .events
                    .get(event_key(queue, seq))
                    .map_err(io)?
                    .map(|v| v.to_vec()),
            };
            out.push(match value {
                Some(v) => Some(self.event_of(queue, seq, &v)?),
                None => None,
            });
        }
        Ok(out)
    }

    fn put_topic(&self, key: &str, record: &Value) -> Result<(), StoreError> {
        let _g = crate::sync::lock(&self.topic_order);
        let order = match self.topics.get(key).map_err(io)? {
            Some(v) => be::<8>(&v, 0).map(u64::from_be_bytes).unwrap_or(0),
            None => self.meta.generate_id().map_err(io)?,
        };
        let mut v = order.to_be_bytes().to_vec();
        v.extend_from_slice(record.to_string().as_bytes());
        self.topics.insert(key, v).map_err(io)?;
        self.flush_meta()
    }

    fn delete_topic(&self, key: &str) -> Result<(), StoreError> {
        self.topics.remove(key).map_err(io)?;
        self.flush_meta()
    }

    fn put_subscription(
        &self,
        topic: &str,
        queue: QueueId,
        record: &Value,
    ) -> Result<(), StoreError> {
        let v = json!({"topic": topic, "record": record}).to_string();
        self.subs
            .insert(queue.to_be_bytes(), v.as_bytes())
            .map_err(io)?;
        self.flush_meta()
    }

    fn delete_subscription(&self, queue: QueueId) -> Result<(), StoreError> {
        self.forget_recovered(queue);
        self.deleted
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(queue);
        // Record first: a crash in between leaves orphan events, removed at the next start.
        self.subs.remove(queue.to_be_bytes()).map_err(io)?;
        self.flush_meta()?;
        let mut freed = 0u64;
        lock_map(&self.unflushed).retain(|(q, _), v| {
            if *q == queue {
                freed += item_cost(v.len());
            }
            *q != queue
        });
        freed += self.remove_queue(queue)?;
        self.sub_live(freed);
        Ok(())
    }

    fn next_queue_id(&self) -> Result<QueueId, StoreError> {
        let next = self
            .meta
            .update_and_fetch(b"next_queue", |old| {
                let n = old
                    .and_then(|o| be::<4>(o, 0))
                    .map(u32::from_be_bytes)
                    .unwrap_or(0);
                Some(n.saturating_add(1).to_be_bytes().to_vec())
            })
            .map_err(io)?
            .and_then(|v| be::<4>(&v, 0))
            .map(u32::from_be_bytes)
            .ok_or_else(|| StoreError::Io("queue id counter unreadable".into()))?;
        if next == u32::MAX {
            return Err(StoreError::Io("queue ids exhausted".into()));
        }
        self.flush_meta()?;
        Ok(next)
    }

    fn append(&self, items: &[(QueueId, StoredEvent)]) -> Result<(), StoreError> {
        let deleted = crate::sync::read(&self.deleted);
        let mut batch = sled::Batch::default();
        let mut cost = 0u64;
        let mut max_seq = 0u64;
        for (q, e) in items {
            if deleted.contains(q) {
                continue;
            }
            self.forget_recovered(*q);
            let v = encode_value(e);
            cost += item_cost(v.len());
            max_seq = max_seq.max(e.seq);
            batch.insert(&event_key(*q, e.seq), v);
        }
        if cost == 0 {
            return Ok(());
        }
        self.reserve_live(cost)?;
        // The high-water mark only grows: appends race, so never lower it.
        if max_seq > read_u64(&self.events, &HIGH_WATER_KEY)? {
            batch.insert(&HIGH_WATER_KEY, &max_seq.to_be_bytes());
        }
        if let Err(e) = self.events.apply_batch(batch) {
            self.sub_live(cost);
            return Err(io(e));
        }
        Ok(())
    }

    fn commit(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        let (tx, rx) = oneshot::channel();
        {
            let mut g = self.committer.lock();
            g.waiters.push(tx);
        }
        self.committer.wake.notify_one();
        Box::pin(async move {
            match rx.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(StoreError::Io(format!("flush failed: {e}"))),
                Err(_) => Err(StoreError::Io("the committer stopped".into())),
            }
        })
    }

    fn append_commit(
        &self,
        items: Vec<(QueueId, StoredEvent)>,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        let mut encoded = Vec::with_capacity(items.len());
        let mut cost = 0u64;
        for (q, e) in &items {
            self.forget_recovered(*q);
            let v = encode_value(e);
            cost += item_cost(v.len());
            encoded.push((*q, e.seq, v));
        }
        let reserved = self.reserve_live(cost);
        let (tx, rx) = oneshot::channel();
        if reserved.is_ok() && !encoded.is_empty() {
            let wake = {
                let mut g = self.committer.lock();
                g.appends.push(PendingAppend {
                    items: encoded,
                    cost,
                    done: tx,
                });
                g.sleeping
            };
            if wake {
                self.committer.wake.notify_one();
            }
        }
        Box::pin(async move {
            reserved?;
            if items.is_empty() {
                return Ok(());
            }
            match rx.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(StoreError::Io(format!("journal write failed: {e}"))),
                Err(_) => Err(StoreError::Io("the committer stopped".into())),
            }
        })
    }

    fn update(&self, queue: QueueId, seqs: &[u64], state: RetryState) -> Result<(), StoreError> {
        self.forget_recovered(queue);
        let in_sled: Vec<u64> = {
            let mut map = lock_map(&self.unflushed);
            seqs.iter()
                .copied()
                .filter(|s| match map.get_mut(&(queue, *s)) {
                    Some(v) => {
                        *v = patch_state(v, state);
                        false
                    }
                    None => true,
                })
                .collect()
        };
        if in_sled.is_empty() {
            return Ok(());
        }
        for s in &in_sled {
            // fetch_and_update is atomic: an event removed meanwhile stays removed.
            self.events
                .fetch_and_update(event_key(queue, *s), |old| {
                    old.map(|v| patch_state(v, state))
                })
                .map_err(io)?;
        }
        self.committer.nudge();
        Ok(())
    }

    fn remove(&self, queue: QueueId, seqs: &[u64]) -> Result<(), StoreError> {
        self.remove_events(queue, seqs, true)
    }

    fn remove_dropped(&self, queue: QueueId, seqs: &[u64]) -> Result<(), StoreError> {
        // Not journaled: the dead letters written just before live in sled and become durable at
        // the next checkpoint; a journaled removal could be replayed without them.
        self.remove_events(queue, seqs, false)
    }

    fn size_on_disk(&self) -> u64 {
        self.meta.size_on_disk().unwrap_or(0) + self.events_db.size_on_disk().unwrap_or(0)
    }

    fn dead_letters(&self) -> Option<Arc<dyn DeadLetterStore>> {
        Some(self.dead_letters.clone())
    }

    fn commit_counters(&self) -> Option<super::CommitCounters> {
        let s = self.commit_stats();
        Some(super::CommitCounters {
            commits: s.commits,
            syncs: s.groups,
            checkpoints: s.flushes,
        })
    }

    fn endpoint_health(&self) -> Result<Vec<(String, Value)>, StoreError> {
        let mut out = Vec::new();
        for item in self.health.iter() {
            let (k, v) = item.map_err(io)?;
            let url = String::from_utf8(k.to_vec())
                .map_err(|_| corrupt(&self.paths.0, "bad endpoint-health key"))?;
            let rec: Value = serde_json::from_slice(&v)
                .map_err(|e| corrupt(&self.paths.0, format!("endpoint health record: {e}")))?;
            out.push((url, rec));
        }
        Ok(out)
    }

    fn put_endpoint_health(&self, url: &str, record: Option<&Value>) -> Result<(), StoreError> {
        match record {
            Some(r) => self
                .health
                .insert(url.as_bytes(), r.to_string().as_bytes())
                .map(|_| ())
                .map_err(io)?,
            None => {
                if self.health.remove(url.as_bytes()).map_err(io)?.is_none() {
                    return Ok(()); // nothing stored: no flush needed
                }
            }
        }
        self.flush_meta()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(dir: &Path, max: u64) -> SledOptions {
        SledOptions {
            metadata_path: dir.join("m"),
            events_path: dir.join("e"),
            max_disk_bytes: max,
            cache_bytes: 4 << 20,
            flush_every_ms: 1000,
            checkpoint_every: CHECKPOINT_EVERY,
        }
    }

    /// No timed checkpoint during a test: the journal keeps what it was given.
    fn opts_untimed(dir: &Path) -> SledOptions {
        SledOptions {
            checkpoint_every: std::time::Duration::from_secs(3600),
            ..opts(dir, 1 << 30)
        }
    }

    fn ev(seq: u64, size: usize) -> StoredEvent {
        StoredEvent {
            seq,
            id: format!("id{seq}"),
            body: Bytes::from(vec![b'x'; size]),
            state: RetryState {
                attempts: 0,
                first_enqueued_ms: 5,
                due_ms: 0,
            },
        }
    }

    #[tokio::test]
    async fn sled_store_passes_the_contract() {
        let dir = tempfile::tempdir().unwrap();
        let s = SledStore::open(&opts(dir.path(), 1 << 30)).unwrap();
        crate::store::contract::run(&s).await;
    }

    #[test]
    fn values_round_trip() {
        let mut e = ev(7, 10);
        e.state = RetryState {
            attempts: 3,
            first_enqueued_ms: 11,
            due_ms: 99,
        };
        let v = encode_value(&e);
        assert_eq!(decode_value(7, &v), Some(e.clone()));
        let s = RetryState {
            attempts: 4,
            first_enqueued_ms: 11,
            due_ms: 1234,
        };
        assert_eq!(decode_value(7, &patch_state(&v, s)).unwrap().state, s);
        assert_eq!(decode_value(7, b"\x02garbage"), None);
    }

    #[tokio::test]
    async fn everything_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let q;
        {
            let s = SledStore::open(&opts(dir.path(), 1 << 30)).unwrap();
            s.put_topic("b", &json!({"name":"b"})).unwrap();
            s.put_topic("a", &json!({"name":"a"})).unwrap();
            q = s.next_queue_id().unwrap();
            s.put_subscription("b", q, &json!({"name":"s"})).unwrap();
            s.append(&[(q, ev(10, 5)), (q, ev(11, 5))]).unwrap();
            s.commit().await.unwrap();
            s.remove(q, &[10]).unwrap();
        }
        let s = SledStore::open(&opts(dir.path(), 1 << 30)).unwrap();
        let snap = s.load().unwrap();
        assert_eq!(snap.topics, vec![json!({"name":"b"}), json!({"name":"a"})]);
        assert_eq!(
            snap.subscriptions,
            vec![("b".into(), q, json!({"name":"s"}))]
        );
        assert_eq!(snap.max_seq, 11);
        // The index comes from the scan at open; a write to the queue makes it read afresh.
        s.append(&[(q, ev(12, 5))]).unwrap();
        assert_eq!(
            s.pending_index(q).unwrap(),
            vec![(11, ev(11, 5).state), (12, ev(12, 5).state)]
        );
        s.remove(q, &[12]).unwrap();
        assert_eq!(s.pending(q).unwrap(), vec![ev(11, 5)]);
        assert!(s.next_queue_id().unwrap() > q, "queue ids are not reused");
    }

    #[tokio::test]
    async fn journaled_publishes_are_durable_and_replay_exactly_once() {
        let dir = tempfile::tempdir().unwrap();
        let jpath = dir.path().join("e").join(SUBDIR).join("events.journal");
        let q;
        let (applied, kept);
        {
            let s = SledStore::open(&opts_untimed(dir.path())).unwrap();
            q = s.next_queue_id().unwrap();
            s.put_subscription("t", q, &json!({"name":"s"})).unwrap();
            s.append_commit(vec![(q, ev(1, 5)), (q, ev(2, 5))])
                .await
                .unwrap();
            // Readable at once (sled holds it), and counted for the disk bound.
            assert_eq!(s.pending(q).unwrap(), vec![ev(1, 5), ev(2, 5)]);
            assert!(s.live_bytes() > 0);
            // Journaled, not yet checkpointed (the checkpoint waits up to 200 ms).
            let (_, recs) = journal::Journal::open(&jpath).unwrap();
            kept = recs;
            assert_eq!(kept.len(), 1);
            assert_eq!(kept[0].items.len(), 2);
            s.remove(q, &[1]).unwrap();
            applied = kept[0].lsn;
        }
        // A clean close checkpoints and marks the journal empty: the next start reads nothing.
        let (_, recs) = journal::Journal::open(&jpath).unwrap();
        assert!(recs.is_empty());
        // A crash after the checkpoint can leave old records behind (truncation is not synced):
        // they are at or below the applied sequence number and must not resurrect event 1.
        {
            let (mut j, _) = journal::Journal::open(&jpath).unwrap();
            j.append(
                applied,
                kept[0].items.iter().map(|(q, s, v)| (*q, *s, v.as_slice())),
                &[],
            )
            .unwrap();
            // An acknowledged group that sled never got (crash before its checkpoint).
            let v = encode_value(&ev(3, 7));
            j.append(applied + 1, [(q, 3, v.as_slice())].into_iter(), &[])
                .unwrap();
            // An acknowledged event delivered before the crash: its removal rode on the next
            // group and is replayed too (no duplicate).
            let v6 = encode_value(&ev(6, 7));
            j.append(applied + 2, [(q, 6, v6.as_slice())].into_iter(), &[])
                .unwrap();
            j.append(applied + 3, std::iter::empty(), &[(q, 6)])
                .unwrap();
        }
        let s = SledStore::open(&opts(dir.path(), 1 << 30)).unwrap();
        assert_eq!(s.pending(q).unwrap(), vec![ev(2, 5), ev(3, 7)]);
        assert_eq!(
            s.load().unwrap().max_seq,
            6,
            "6 was replayed and removed, not reused"
        );
        // The next group continues above the replayed sequence number.
        s.append_commit(vec![(q, ev(4, 5))]).await.unwrap();
        // (Written at the start of the file; the older records behind it are still intact.)
        let (_, recs) = journal::Journal::open(&jpath).unwrap();
        assert_eq!(recs.first().map(|r| r.lsn), Some(applied + 4));
        // A full store refuses a publish before anything is written.
        drop(s);
        let s = SledStore::open(&opts(dir.path(), 100)).unwrap();
        assert!(matches!(
            s.append_commit(vec![(q, ev(5, 5))]).await,
            Err(StoreError::Full { .. })
        ));
        assert_eq!(s.pending(q).unwrap().len(), 3);
    }

    #[tokio::test]
    async fn a_journal_record_larger_than_a_sled_batch_replays_whole() {
        let dir = tempfile::tempdir().unwrap();
        let jpath = dir.path().join("e").join(SUBDIR).join("events.journal");
        let q = {
            let s = SledStore::open(&opts_untimed(dir.path())).unwrap();
            let q = s.next_queue_id().unwrap();
            s.put_subscription("t", q, &json!({"name":"s"})).unwrap();
            q
        };
        // A crash left one acknowledged group of 2.5 sled batches of events, and a second one
        // that settled the first 300 of them (removals crossing a batch boundary too).
        let n = SLED_BATCH as u64 * 5 / 2;
        {
            let (mut j, _) = journal::Journal::open(&jpath).unwrap();
            let values: Vec<(u64, Vec<u8>)> =
                (1..=n).map(|i| (i, encode_value(&ev(i, 3)))).collect();
            j.append(1, values.iter().map(|(i, v)| (q, *i, v.as_slice())), &[])
                .unwrap();
            let settled: Vec<(QueueId, u64)> = (1..=300).map(|i| (q, i)).collect();
            j.append(2, std::iter::empty(), &settled).unwrap();
        }
        let s = SledStore::open(&opts(dir.path(), 1 << 30)).unwrap();
        let seqs: Vec<u64> = s.pending(q).unwrap().iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (301..=n).collect::<Vec<_>>());
        assert_eq!(s.load().unwrap().max_seq, n);
        // Replayed once: a second start finds the same.
        drop(s);
        let s = SledStore::open(&opts(dir.path(), 1 << 30)).unwrap();
        assert_eq!(s.pending(q).unwrap().len(), (n - 300) as usize);
    }

    /// A burst that grows the journal past its preallocated size counts against the disk bound
    /// until the checkpoint that cuts the file back. (The journal is driven directly: in a
    /// running store the committer checkpoints a grown journal as soon as it can.)
    #[test]
    fn journal_growth_counts_against_the_disk_bound_until_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let (mut j, _) = journal::Journal::open(&dir.path().join("j")).unwrap();
        let live = AtomicU64::new(1_000);
        let mut charged = 0;
        j.reset();
        let big = vec![b'b'; journal::PREALLOCATED_BYTES as usize + 500_000];
        j.append(1, [(1, 1, big.as_slice())].into_iter(), &[])
            .unwrap();
        charge_journal(&j, &live, &mut charged);
        let excess = j.excess_bytes();
        assert!(excess > 500_000);
        assert_eq!(
            live.load(Ordering::Relaxed),
            1_000 + excess * 10 / SPACE_FACTOR_TENTHS
        );
        // The checkpoint's reset cuts the file back and the charge goes.
        j.reset();
        charge_journal(&j, &live, &mut charged);
        assert_eq!(live.load(Ordering::Relaxed), 1_000);
        assert_eq!(charged, 0);
    }

    /// A group whose events all belong to a subscription deleted meanwhile still journals the
    /// removals noted since the previous record; before, they were dropped with the group, and
    /// a crash before the next checkpoint delivered those events again.
    #[tokio::test]
    async fn removals_ride_a_group_whose_events_were_all_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let jpath = dir.path().join("e").join(SUBDIR).join("events.journal");
        let s = SledStore::open(&opts_untimed(dir.path())).unwrap();
        let q1 = s.next_queue_id().unwrap();
        s.put_subscription("t", q1, &json!({"name":"s1"})).unwrap();
        let q2 = s.next_queue_id().unwrap();
        s.put_subscription("t", q2, &json!({"name":"s2"})).unwrap();
        s.append_commit(vec![(q1, ev(1, 5))]).await.unwrap();
        s.remove(q1, &[1]).unwrap();
        s.delete_subscription(q2).unwrap();
        // Every event of this group belongs to the deleted subscription.
        s.append_commit(vec![(q2, ev(2, 5))]).await.unwrap();
        let (_, recs) = journal::Journal::open(&jpath).unwrap();
        let removed: Vec<_> = recs.iter().flat_map(|r| r.removed.clone()).collect();
        assert_eq!(removed, vec![(q1, 1)], "the removal of q1/1 is journaled");
    }

    #[tokio::test]
    async fn delivered_removals_are_journaled_dropped_ones_wait_for_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let jpath = dir.path().join("e").join(SUBDIR).join("events.journal");
        let s = SledStore::open(&opts_untimed(dir.path())).unwrap();
        let q = s.next_queue_id().unwrap();
        s.put_subscription("t", q, &json!({"name":"s"})).unwrap();
        s.append_commit(vec![(q, ev(1, 5)), (q, ev(2, 5))])
            .await
            .unwrap();
        s.remove(q, &[1]).unwrap();
        // Dead-lettered: its letter is in sled, durable only at the checkpoint; a journaled
        // removal could be replayed without it (neither pending nor a letter).
        s.remove_dropped(q, &[2]).unwrap();
        assert!(s.pending(q).unwrap().is_empty());
        s.append_commit(vec![(q, ev(3, 5))]).await.unwrap();
        let (_, recs) = journal::Journal::open(&jpath).unwrap();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[1].removed, vec![(q, 1)]);
    }

    #[tokio::test]
    async fn the_index_at_open_matches_the_stored_events() {
        let dir = tempfile::tempdir().unwrap();
        let q;
        {
            let s = SledStore::open(&opts(dir.path(), 1 << 30)).unwrap();
            q = s.next_queue_id().unwrap();
            s.put_subscription("t", q, &json!({})).unwrap();
            s.append(&[(q, ev(1, 5)), (q, ev(2, 5)), (q, ev(3, 5))])
                .unwrap();
            s.update(
                q,
                &[2],
                RetryState {
                    attempts: 2,
                    first_enqueued_ms: 5,
                    due_ms: 77,
                },
            )
            .unwrap();
            s.commit().await.unwrap();
        }
        let s = SledStore::open(&opts(dir.path(), 1 << 30)).unwrap();
        let idx = s.pending_index(q).unwrap();
        assert_eq!(idx.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(idx[1].1.due_ms, 77);
        assert_eq!(s.pending_index(q).unwrap(), idx, "a second call scans");
        assert_eq!(s.get(q, &[3]).unwrap(), vec![Some(ev(3, 5))]);
    }

    #[tokio::test]
    async fn full_store_refuses_whole_appends_and_recovers_after_removal() {
        let dir = tempfile::tempdir().unwrap();
        // Budget: 2 events of ~1 KiB (live bytes × 2.5 ≤ 6000).
        let s = SledStore::open(&opts(dir.path(), 6000)).unwrap();
        let q = s.next_queue_id().unwrap();
        s.put_subscription("t", q, &json!({})).unwrap();
        s.append(&[(q, ev(1, 1000)), (q, ev(2, 1000))]).unwrap();
        let err = s.append(&[(q, ev(3, 1000))]).unwrap_err();
        assert!(matches!(err, StoreError::Full { .. }), "{err}");
        assert_eq!(
            s.pending(q).unwrap().len(),
            2,
            "nothing of the refused call written"
        );
        s.remove(q, &[1]).unwrap();
        s.append(&[(q, ev(3, 1000))]).unwrap();
        s.delete_subscription(q).unwrap();
        assert_eq!(
            s.live_bytes(),
            0,
            "deleting a subscription frees its events"
        );
    }

    #[tokio::test]
    async fn deleting_a_subscription_removes_more_events_than_one_batch() {
        let dir = tempfile::tempdir().unwrap();
        let n = SLED_BATCH as u64 * 3 + 7;
        let (q, other) = {
            let s = SledStore::open(&opts(dir.path(), 1 << 30)).unwrap();
            let q = s.next_queue_id().unwrap();
            let other = s.next_queue_id().unwrap();
            s.put_subscription("t", q, &json!({})).unwrap();
            s.put_subscription("t", other, &json!({})).unwrap();
            // Most in sled (a checkpoint at close), the last ones still in the journal's map.
            s.append(&(1..=n).map(|i| (q, ev(i, 10))).collect::<Vec<_>>())
                .unwrap();
            s.append(&[(other, ev(n + 1, 10))]).unwrap();
            s.commit().await.unwrap();
            (q, other)
        };
        let s = SledStore::open(&opts(dir.path(), 1 << 30)).unwrap();
        s.append_commit(vec![(q, ev(n + 2, 10))]).await.unwrap();
        assert_eq!(s.pending(q).unwrap().len(), n as usize + 1);
        s.delete_subscription(q).unwrap();
        assert!(s.pending(q).unwrap().is_empty());
        assert_eq!(
            s.pending(other).unwrap().len(),
            1,
            "other queues keep theirs"
        );
        drop(s);
        let s = SledStore::open(&opts(dir.path(), 1 << 30)).unwrap();
        assert!(s.pending(q).unwrap().is_empty(), "gone after a restart too");
        assert_eq!(s.pending(other).unwrap().len(), 1);
    }

    #[tokio::test]
    async fn orphan_events_are_removed_at_start() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = SledStore::open(&opts(dir.path(), 1 << 30)).unwrap();
            s.append(&[(42, ev(1, 10))]).unwrap();
            s.commit().await.unwrap();
        }
        let s = SledStore::open(&opts(dir.path(), 1 << 30)).unwrap();
        assert!(s.pending(42).unwrap().is_empty());
        assert_eq!(s.live_bytes(), 0);
    }

    #[tokio::test]
    async fn concurrent_commits_share_flushes() {
        let dir = tempfile::tempdir().unwrap();
        let s = Arc::new(SledStore::open(&opts(dir.path(), 1 << 30)).unwrap());
        let q = s.next_queue_id().unwrap();
        s.put_subscription("t", q, &json!({})).unwrap();
        let mut tasks = Vec::new();
        for i in 0..64u64 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                s.append(&[(q, ev(i + 1, 100))]).unwrap();
                s.commit().await.unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let st = s.commit_stats();
        assert_eq!(st.commits, 64);
        assert!(st.flushes <= 64);
        assert_eq!(s.pending(q).unwrap().len(), 64);
    }

    #[test]
    fn damaged_or_replaced_database_is_an_error_not_an_empty_start() {
        let dir = tempfile::tempdir().unwrap();
        drop(SledStore::open(&opts(dir.path(), 1 << 30)).unwrap());
        let db_dir = dir.path().join("e").join(SUBDIR).join("events");
        std::fs::remove_dir_all(&db_dir).unwrap();
        std::fs::create_dir_all(&db_dir).unwrap();
        let err = SledStore::open(&opts(dir.path(), 1 << 30))
            .err()
            .expect("refuses to start");
        assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
        assert!(err.to_string().contains("events"), "{err}");
    }
}
