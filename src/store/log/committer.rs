//! The log store's threads: `gridlet-commit` writes what is staged as one frame, syncs it,
//! answers the publishes in it, gives dead segments back, hands compactions to
//! `gridlet-compact` and takes checkpoints (see the module docs of [`super`]).

use super::commit_trace::{CommitSpan, Group};
use super::engine::Log;
use super::{engine, letters, now_ms, IDLE_TICK, SETTLE_EVERY};
use crate::store::deadletter::DeadLetterStore;
use crate::store::StoreError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Who waits for the next frame.
pub(super) enum Waiter {
    /// A publish: answered as soon as the frame holding its events is durable.
    Publish(tokio::sync::oneshot::Sender<Result<(), StoreError>>),
    /// A `commit`, awaiting in a task: answered after the whole round (segments with nothing
    /// pending given back, checkpoint).
    Task(tokio::sync::oneshot::Sender<Result<(), StoreError>>),
    /// A management call on a blocking thread: as `Task` (a deleted subscription's space is
    /// free when it returns).
    Thread(std::sync::mpsc::Sender<Result<(), StoreError>>),
}

impl Waiter {
    pub(super) fn answer(self, r: Result<(), StoreError>) {
        match self {
            Waiter::Publish(tx) | Waiter::Task(tx) => {
                let _ = tx.send(r);
            }
            Waiter::Thread(tx) => {
                let _ = tx.send(r);
            }
        }
    }
}

#[derive(Default)]
pub(super) struct Waiting {
    /// Publishes staged and not yet answered.
    pub(super) waiters: Vec<Waiter>,
    /// Settlements staged since the last frame.
    pub(super) dirty: bool,
    pub(super) shutdown: bool,
    /// The publishes staged for the next frame (only while commits are traced).
    pub(super) group: Group,
}

pub(super) struct Shared {
    pub(super) log: Mutex<Log>,
    pub(super) waiting: Mutex<Waiting>,
    pub(super) wake: Condvar,
    pub(super) commits: AtomicU64,
    /// Frames that answered at least one publish.
    pub(super) publish_syncs: AtomicU64,
    pub(super) collections: AtomicU64,
    /// Records a `commit` span per frame once set ([`Store::trace_commits`], tracer on).
    pub(super) tracer: std::sync::OnceLock<crate::telemetry::Tracer>,
}

impl Shared {
    pub(super) fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        crate::sync::lock(&self.log)
    }
    pub(super) fn waiting(&self) -> std::sync::MutexGuard<'_, Waiting> {
        crate::sync::lock(&self.waiting)
    }
    pub(super) fn tracer(&self) -> Option<&crate::telemetry::Tracer> {
        self.tracer.get()
    }
}

/// The committer thread: one frame per round, every publish staged before it answered after
/// its sync; then dead segments given back.
pub(super) fn committer(
    s: &Shared,
    letters: &letters::LogLetters,
    letters_every: Duration,
    jobs: &std::sync::mpsc::Sender<engine::Compaction>,
) {
    let mut letters_synced = std::time::Instant::now();
    loop {
        let waiters = {
            let mut w = s.waiting();
            while w.waiters.is_empty() && !w.dirty && !w.shutdown {
                let tick = if letters_every.is_zero() {
                    IDLE_TICK
                } else {
                    letters_every.min(IDLE_TICK)
                };
                let (g, t) = s
                    .wake
                    .wait_timeout(w, tick)
                    .unwrap_or_else(|p| p.into_inner());
                w = g;
                if t.timed_out() {
                    drop(w);
                    // Letters of subscriptions that are not persisted (no event removal makes
                    // them durable): synced every `persistence__flushEveryMs` when idle.
                    if !letters_every.is_zero() && letters_synced.elapsed() >= letters_every {
                        letters_synced = std::time::Instant::now();
                        if let Err(e) = letters.sync() {
                            tracing::error!(error = %e, "could not make dead letters durable");
                        }
                    }
                    // A backlog left pinned after a drain is compacted with no traffic at all.
                    if let Err(e) = compact(s, jobs) {
                        tracing::error!(error = %e, "event log: could not start a compaction");
                    }
                    w = s.waiting();
                }
            }
            if w.waiters.is_empty() && w.dirty && !w.shutdown {
                // Settlements only: let more gather (and publishes join them).
                let (g, _) = s
                    .wake
                    .wait_timeout_while(w, SETTLE_EVERY, |w| w.waiters.is_empty() && !w.shutdown)
                    .unwrap_or_else(|p| p.into_inner());
                w = g;
            }
            if w.shutdown && w.waiters.is_empty() {
                drop(w);
                let _ = write_round(s, None);
                return;
            }
            w.dirty = false;
            std::mem::take(&mut w.waiters)
        };
        // Publishes are answered as soon as their frame is durable: giving segments back,
        // compactions and checkpoints (a write and a sync of their own) come after, off their
        // path. A failure there fails the log (`Log::fail`), which refuses the next publishes.
        let framed = write_frame(s);
        if !waiters.is_empty() && framed.is_ok() {
            s.publish_syncs.fetch_add(1, Ordering::Relaxed);
        }
        let mut after_round = Vec::new();
        for w in waiters {
            match w {
                Waiter::Publish(_) => w.answer(framed.as_ref().map(|_| ()).map_err(clone_err)),
                _ => after_round.push(w),
            }
        }
        let result = framed.and_then(|()| housekeeping(s, Some(jobs)));
        for w in after_round {
            w.answer(result.as_ref().map(|_| ()).map_err(clone_err));
        }
    }
}

fn clone_err(e: &StoreError) -> StoreError {
    match e {
        StoreError::Full { used, limit } => StoreError::Full {
            used: *used,
            limit: *limit,
        },
        StoreError::Corrupt(m) => StoreError::Corrupt(m.clone()),
        StoreError::Io(m) => StoreError::Io(m.clone()),
    }
}

/// Write what is staged (one frame, synced), then [`housekeeping`].
fn write_round(
    s: &Shared,
    jobs: Option<&std::sync::mpsc::Sender<engine::Compaction>>,
) -> Result<(), StoreError> {
    write_frame(s)?;
    housekeeping(s, jobs)
}

/// After a frame: delete segments with nothing pending, then hand a compaction that is worth
/// it to the compactor (after the frame restating the older segments), then write a checkpoint
/// when one is due.
fn housekeeping(
    s: &Shared,
    jobs: Option<&std::sync::mpsc::Sender<engine::Compaction>>,
) -> Result<(), StoreError> {
    collect(s)?;
    if let Some(jobs) = jobs {
        compact(s, jobs)?;
    }
    if s.log().checkpoint_due() {
        checkpoint(s);
        // Segments that waited for a checkpoint recording them owing nothing (see
        // `engine/collect.rs`) go now.
        if s.log().owed_dead() {
            collect(s)?;
        }
    }
    Ok(())
}

/// Delete the segments with nothing pending (after the frame restating older ones).
fn collect(s: &Shared) -> Result<(), StoreError> {
    let dead = s.log().stage_collection(now_ms());
    if !dead.is_empty() {
        write_frame(s)?;
        s.log().remove_segments(&dead)?;
        s.collections.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// Hand a compaction that is worth it to the compactor, after the frame that restates the
/// older segments is durable (see `engine/compact.rs`).
fn compact(
    s: &Shared,
    jobs: &std::sync::mpsc::Sender<engine::Compaction>,
) -> Result<(), StoreError> {
    let job = {
        let mut log = s.log();
        log.note_time(now_ms());
        log.plan_compaction(None)
    };
    if let Some(job) = job {
        write_frame(s)?;
        if let Err(back) = jobs.send(job) {
            // The compactor is gone (it panicked): run it here.
            let done = back.0.run();
            s.log().finish_compaction(done);
        }
    }
    Ok(())
}

/// The compactor thread: copies segments the committer planned ([`engine::Compaction`]) while
/// frames go on being written, then swaps them in and has the committer take a checkpoint.
pub(super) fn compactor(s: &Shared, jobs: &std::sync::mpsc::Receiver<engine::Compaction>) {
    for job in jobs {
        let no = job.segment();
        let started = std::time::Instant::now();
        let done = job.run();
        if let Some(bytes) = done.replaced_bytes() {
            tracing::debug!(
                segment = no,
                bytes,
                ms = started.elapsed().as_millis() as u64,
                "compacted a segment of the event log"
            );
        }
        s.log().finish_compaction(done);
        s.waiting().dirty = true;
        s.wake.notify_one();
    }
}

/// Write a checkpoint (prepared under the log's lock, written outside it). A failure is logged:
/// the previous checkpoint stays valid, and opening the log reads more.
pub(super) fn checkpoint(s: &Shared) {
    let prepared = s.log().prepare_checkpoint();
    let result = prepared.and_then(|w| w.run());
    if let Err(e) = &result {
        tracing::warn!(error = %e, "could not write the event log's checkpoint; the next start reads more of the log");
    }
    s.log().checkpoint_done(result.is_ok());
}

fn write_frame(s: &Shared) -> Result<(), StoreError> {
    let (frame, group) = {
        let mut log = s.log();
        let frame = log.take_frame(now_ms())?;
        // Under the log's lock, as `submit` gathers it: exactly the publishes in this frame.
        let group = match s.tracer() {
            Some(_) => std::mem::take(&mut s.waiting().group),
            None => Group::default(),
        };
        (frame, group)
    };
    if let Some(f) = frame {
        let span = s
            .tracer()
            .and_then(|t| Some((t, CommitSpan::start(t, group, f.bytes())?)));
        // Outside the lock: publishes keep staging while this frame syncs.
        let written = f.write().and_then(|()| {
            let synced = std::time::Instant::now();
            f.sync().map(|()| synced.elapsed())
        });
        let fsync = match written {
            Ok(d) => d,
            Err(e) => {
                if let Some((t, span)) = span {
                    span.finish(t, None, Some(&e.to_string()));
                }
                let mut log = s.log();
                log.fail(e.to_string());
                return Err(StoreError::Io(format!("event log write failed: {e}")));
            }
        };
        s.log().syncs += 1;
        if let Some((t, span)) = span {
            span.finish(t, Some(fsync), None);
        }
    }
    Ok(())
}
