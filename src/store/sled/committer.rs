//! The committer thread (`gridlet-commit`): group commit of publishes into the journal, and
//! checkpoints that move what is still pending into sled. See [`super::journal`] for the
//! protocol and the recovery rule.
//!
//! Invariants: a publish is answered only after its group's `fdatasync` returned; an event is
//! either in the unflushed map or in sled, never both (the map's lock orders removals against
//! the checkpoint's move); removals noted before a checkpoint are dropped only once it succeeded.

use super::codec::event_key;
use super::{item_cost, journal, sub_live, HIGH_WATER_KEY, JOURNAL_LSN_KEY, SPACE_FACTOR_TENTHS};
use crate::store::{CommitCounters, QueueId, StoreError};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use tokio::sync::oneshot;

/// A journaled publish waiting for the committer.
pub(super) struct PendingAppend {
    /// `(queue, seq, sled value)`.
    pub(super) items: Vec<journal::Item>,
    /// Live bytes reserved for `items` (given back for items not written).
    pub(super) cost: u64,
    pub(super) done: oneshot::Sender<Result<(), String>>,
}

#[derive(Default)]
pub(super) struct CommitState {
    pub(super) appends: Vec<PendingAppend>,
    /// Events settled since the last journal record: written with the next group, so a crash
    /// does not bring them back (see [`journal`]).
    pub(super) removed: Vec<(QueueId, u64)>,
    pub(super) waiters: Vec<oneshot::Sender<Result<(), String>>>,
    pub(super) dirty: bool,
    pub(super) shutdown: bool,
    pub(super) stats: CommitCounters,
    /// The committer waits on the condvar: a publish wakes it. While it writes and syncs a group
    /// it is not woken (it takes every waiting publish when it is done), which saves a futex
    /// call per publish under load.
    pub(super) sleeping: bool,
}

/// What the committer took from [`CommitState`] for one round.
struct Work {
    appends: Vec<PendingAppend>,
    waiters: Vec<oneshot::Sender<Result<(), String>>>,
    /// Removals journaled with `appends` (empty when there are none).
    removed: Vec<(QueueId, u64)>,
}

/// Shared between the store and its committer thread.
#[derive(Default)]
pub(super) struct Committer {
    pub(super) state: Mutex<CommitState>,
    pub(super) wake: Condvar,
}

/// How long changes that are not journaled (removals, retry state, dead letters) and journal
/// records wait for a checkpoint at most (default of [`super::SledOptions::checkpoint_every`]).
pub const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(200);
/// A journal this long is checkpointed at once (bounds its disk use and replay time).
const MAX_JOURNAL_BYTES: u64 = journal::PREALLOCATED_BYTES / 4 * 3;
/// Least time between two size-triggered checkpoints (keeps a failing one from running per group).
const MIN_CHECKPOINT_GAP: std::time::Duration = std::time::Duration::from_millis(10);

impl Committer {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, CommitState> {
        // Every critical section is a few field updates with no panic path.
        crate::sync::lock(&self.state)
    }

    /// Ask for a checkpoint soon (within [`CHECKPOINT_EVERY`]) without waiting for it.
    pub(super) fn nudge(&self) {
        self.lock().dirty = true;
        self.wake.notify_one();
    }

    /// Start the `gridlet-commit` thread over `writer`.
    pub(super) fn start(
        this: &Arc<Self>,
        writer: Writer,
    ) -> Result<std::thread::JoinHandle<()>, StoreError> {
        let c = this.clone();
        std::thread::Builder::new()
            .name("gridlet-commit".into())
            .spawn(move || c.run(writer))
            .map_err(|e| StoreError::Io(format!("cannot start the committer thread: {e}")))
    }

    /// Wait until there is work: publishes or commit waiters, a checkpoint due, or shutdown.
    /// Takes the waiting publishes and waiters (and, with publishes, the removals to journal
    /// with them); `None` once shut down with nothing left to answer.
    fn next_work(&self, w: &mut Writer) -> Option<Work> {
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
            return None;
        }
        w.dirty |= std::mem::take(&mut g.dirty);
        g.stats.commits += (g.appends.len() + g.waiters.len()) as u64;
        g.stats.syncs += u64::from(!g.appends.is_empty());
        let removed = if g.appends.is_empty() {
            Vec::new()
        } else {
            std::mem::take(&mut g.removed)
        };
        Some(Work {
            appends: std::mem::take(&mut g.appends),
            waiters: std::mem::take(&mut g.waiters),
            removed,
        })
    }

    /// The committer thread: journals each group of publishes with one `fdatasync`, and
    /// checkpoints (see [`journal`]).
    fn run(&self, mut w: Writer) {
        while let Some(work) = self.next_work(&mut w) {
            let Work {
                mut appends,
                waiters,
                removed,
            } = work;
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
                    g.stats.checkpoints += 1;
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
pub(super) struct Writer {
    pub(super) db: sled::Db,
    pub(super) events: sled::Tree,
    pub(super) live: Arc<AtomicU64>,
    pub(super) deleted: Arc<RwLock<HashSet<QueueId>>>,
    pub(super) journal: journal::Journal,
    pub(super) unflushed: Arc<Unflushed>,
    /// sled's data file (`<dir>/db`), `fsync`ed at each checkpoint.
    pub(super) data_file: PathBuf,
    pub(super) lsn: u64,
    pub(super) high_water: u64,
    pub(super) checkpointed_high_water: u64,
    pub(super) last_checkpoint: std::time::Instant,
    pub(super) checkpoint_every: std::time::Duration,
    /// Unjournaled changes since the last checkpoint.
    pub(super) dirty: bool,
    /// The journal's growth past its normal size, as charged to `live` (in live-byte units).
    pub(super) journal_charged: u64,
}

impl Writer {
    /// Append a group of publishes to the journal and `fdatasync`, then make its events visible
    /// in the unflushed map (sled gets them at the next checkpoint, if still pending).
    /// The events' values move into the map (the publishers' copies are not needed after).
    pub(super) fn write_group(
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
    pub(super) fn checkpoint(&mut self) -> Result<(), String> {
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

/// Journaled events not in sled yet, by `(queue, seq)` → sled value.
pub(super) type Unflushed = Mutex<HashMap<(QueueId, u64), Vec<u8>>>;

pub(super) fn lock_map(
    m: &Unflushed,
) -> std::sync::MutexGuard<'_, HashMap<(QueueId, u64), Vec<u8>>> {
    crate::sync::lock(m)
}

/// Count the journal file's growth past its normal size against the disk bound (in the live-byte
/// units the bound is kept in), and give it back once a checkpoint cut the file back.
pub(super) fn charge_journal(journal: &journal::Journal, live: &AtomicU64, charged: &mut u64) {
    let want = journal.excess_bytes() * 10 / SPACE_FACTOR_TENTHS;
    if want > *charged {
        live.fetch_add(want - *charged, Ordering::Relaxed);
    } else {
        sub_live(live, *charged - want);
    }
    *charged = want;
}
