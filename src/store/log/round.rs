//! The committer's round as typed steps, and the one executor that runs them.
//!
//! A round is a plan ([`Round::steps`]): put the dead letters handed to it and make them
//! durable, then stage their events' removal; write what is staged as one frame and sync it,
//! answer the publishes in it, give back segments with nothing pending, hand a compaction
//! over, take a checkpoint when one is due, answer whoever waits for the whole round. [`run`] executes a
//! plan over a [`Host`]: the store's `gridlet-commit` thread runs it on the store's shared
//! state, the power-cut simulation runs the same store with the round executed in place
//! (`LogStore::simulated`), and the engine's own tests run it on a bare [`Log`]
//! ([`commit`]). There is no other sequence of these steps.
//!
//! # Order, and why
//!
//! 0. [`Step::RecordDamage`]: failing frames met since the last round by reads or the scrub
//!    (`engine/scrub.rs`) are recorded first: the events they held stop being pending before
//!    anything else is planned, and a damaged head is closed before a frame goes after it.
//! 1. [`Step::WriteLetters`]: the round's input ([`Work`]) may hold dead letters
//!    (`Writes::Letters`, one delivery attempt's each). They are put into the dead-letter log
//!    (within their bounds; a subscription deleted meanwhile keeps none) and synced, and only
//!    then are their events' removals staged, **before** the frame that writes them: after a
//!    crash an event is pending, a dead letter, or both, never neither. Only this step stages
//!    such removals, so no frame holds one whose letter is not synced. Letters of subscriptions
//!    that are not persisted (no events to remove) are put here and synced by the committer
//!    within `persistence__flushEveryMs`.
//! 2. [`Step::WriteFrame`]: one frame, `fdatasync`ed. A publish is acknowledged only after it.
//! 3. [`Step::AnswerPublishes`]: as soon as their frame is durable; nothing after this step
//!    (another file's write or sync) delays an acknowledgement.
//! 4. [`Step::RemoveSegments`]: the older live segments are restated in a frame of their own,
//!    synced, before a dead segment's file is removed (a younger segment's settle records may be
//!    all that keeps an older one's events settled).
//! 5. [`Step::HandOverCompaction`]: the plan restates the older segments; that frame is synced
//!    before the copy starts (`engine/compact.rs`).
//! 6. [`Step::Checkpoint`]: when due; then the segments that waited for a checkpoint recording
//!    them owing nothing go (`engine/collect.rs`).
//! 7. [`Step::AnswerRound`]: a `commit` and the management calls return once the space of what
//!    they settled or deleted is given back.
//!
//! A failed write or sync fails the log (fail-stop): the steps after it do nothing, and every
//! waiter gets the error. A failed put or sync of the letters does the same: their events'
//! removals are not staged, and nothing more may be written (a frame answering the round
//! would say that settlements handed to it are durable).

use super::commit_trace::{CommitSpan, Group};
use super::engine::{Compaction, Log};
use crate::store::deadletter::{keep, DeadLetterStore};
use crate::store::{Answer, Letters, QueueId, StoreError};
use std::ops::DerefMut;

/// One step of a round. See the module docs for the order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Record the damage reads and the scrub found (`engine/scrub.rs`).
    RecordDamage,
    /// Put the dead letters handed to the round, sync them, then stage their events' removal.
    WriteLetters,
    /// Write what is staged as one frame and sync it.
    WriteFrame,
    /// Answer the publishes whose events that frame holds.
    AnswerPublishes,
    /// Delete the segments with nothing pending, after a frame restating the older live ones.
    RemoveSegments,
    /// Plan a compaction worth doing, write the frame restating the older segments, and hand
    /// the copy to the compactor.
    HandOverCompaction,
    /// Write a checkpoint when one is due, then delete the segments that waited for it.
    Checkpoint,
    /// Answer the `commit`s and management calls waiting for the whole round.
    AnswerRound,
}

/// Which round to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// Something is staged or someone waits: the full round.
    Frame,
    /// Nothing to write for a while: weigh the segments for a compaction (a backlog left
    /// pinned after a drain is compacted with no traffic at all).
    Idle,
    /// The store stops: the last frame and what follows it; no new compaction starts.
    Stop,
    /// Only the damage found by reads or the scrub (the simulation's scrub, run in place).
    Damage,
}

impl Round {
    /// The steps of this round, in order.
    pub fn steps(self) -> &'static [Step] {
        use Step::*;
        match self {
            Round::Frame => &[
                RecordDamage,
                WriteLetters,
                WriteFrame,
                AnswerPublishes,
                RemoveSegments,
                HandOverCompaction,
                Checkpoint,
                AnswerRound,
            ],
            Round::Idle => &[RecordDamage, HandOverCompaction],
            Round::Stop => &[
                RecordDamage,
                WriteLetters,
                WriteFrame,
                RemoveSegments,
                Checkpoint,
                AnswerRound,
            ],
            Round::Damage => &[RecordDamage],
        }
    }
}

/// Who waits for a round.
pub(super) enum Waiter {
    /// [`Answer::Frame`]: answered as soon as the frame holding its writes (and everything
    /// staged before them) is durable, at [`Step::AnswerPublishes`]: a publish, a pull
    /// acknowledgement.
    Frame(tokio::sync::oneshot::Sender<Result<(), StoreError>>),
    /// [`Answer::Round`], awaiting in a task: answered after the whole round (segments with
    /// nothing pending given back, checkpoint), at [`Step::AnswerRound`].
    Round(tokio::sync::oneshot::Sender<Result<(), StoreError>>),
    /// A management call on a blocking thread: as `Round` (a deleted subscription's space is
    /// free when it returns).
    RoundThread(std::sync::mpsc::Sender<Result<(), StoreError>>),
}

impl Waiter {
    /// A waiter answered at `answer`'s step, and what it answers (`None` for
    /// [`Answer::Nobody`]).
    pub(super) fn new(answer: Answer) -> Option<(Self, crate::store::Commit)> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let w = match answer {
            Answer::Nobody => return None,
            Answer::Frame => Waiter::Frame(tx),
            Answer::Round => Waiter::Round(tx),
        };
        Some((w, crate::store::Commit::pending(rx)))
    }

    fn answer(self, r: &Result<(), StoreError>) {
        let r = r.as_ref().map(|_| ()).map_err(clone_err);
        match self {
            Waiter::Frame(tx) | Waiter::Round(tx) => {
                let _ = tx.send(r);
            }
            Waiter::RoundThread(tx) => {
                let _ = tx.send(r);
            }
        }
    }
}

/// What a round is given to do besides what is staged in the log.
#[derive(Default)]
pub(super) struct Work {
    /// Who waits, answered at their steps.
    pub(super) waiters: Vec<Waiter>,
    /// Dead letters, per queue, put and synced by [`Step::WriteLetters`] before their events'
    /// removal is staged (only rounds whose plan has it are given any).
    pub(super) letters: Vec<(QueueId, Letters)>,
}

impl From<Vec<Waiter>> for Work {
    fn from(waiters: Vec<Waiter>) -> Self {
        Self {
            waiters,
            letters: Vec::new(),
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

/// What a round runs on: the log (behind a lock or not), the clock, the compactor.
pub(super) trait Host {
    /// Exclusive access to the log (a frame is taken under it, and written outside it).
    type Guard<'g>: DerefMut<Target = Log>
    where
        Self: 'g;

    /// The log, locked.
    fn log(&self) -> Self::Guard<'_>;

    /// Wall time, milliseconds.
    fn now_ms(&self) -> u64;

    /// Whether there is a compactor to hand compactions to; without one,
    /// [`Step::HandOverCompaction`] plans nothing.
    fn compacts(&self) -> bool {
        false
    }

    /// Hand a planned compaction over; it comes back when no one can take it (then it runs in
    /// place).
    fn hand_over(&self, job: Compaction) -> Option<Compaction> {
        Some(job)
    }

    /// The publishes staged for the frame being taken, with the tracer, when commits are
    /// traced. Called under the log's lock.
    fn take_group(&self) -> Option<(&crate::telemetry::Tracer, Group)> {
        None
    }

    /// Where [`Step::WriteLetters`] puts the letters (none: they are dropped, their events stay).
    fn dead_letters(&self) -> Option<&dyn DeadLetterStore> {
        None
    }

    /// Make the dead letters put so far durable ([`Step::WriteLetters`]).
    ///
    /// # Errors
    /// The letters' sync failed.
    fn sync_letters(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// A frame answered at least one publish.
    fn publish_synced(&self) {}

    /// Segments were given back.
    fn collected(&self) {}

    /// A step did something (`n`: bytes written, waiters answered, segments removed, the
    /// segment handed over, or 1 for a checkpoint). Tests record it; a step that found nothing
    /// to do is not reported.
    fn did(&self, _step: Step, _n: u64) {}
}

/// Run `round` on `host` with `work`: its dead letters put, synced and their events' removal
/// staged at [`Step::WriteLetters`], its waiters answered at their steps. Returns the round's result (what the waiters for the whole
/// round got).
pub(super) fn run<H: Host>(host: &H, round: Round, work: Work) -> Result<(), StoreError> {
    let mut result = Ok(());
    let Work {
        mut waiters,
        mut letters,
    } = work;
    let publishes = waiters.iter().any(|w| matches!(w, Waiter::Frame(_)));
    for &step in round.steps() {
        match step {
            Step::RecordDamage => {
                let recorded = host.log().record_findings(host.now_ms());
                match recorded {
                    Ok(0) => {}
                    Ok(n) => host.did(step, n as u64),
                    // The log has failed (fail-stop): the frame step refuses, everyone hears.
                    Err(e) => result = Err(e),
                }
            }
            Step::WriteLetters if !letters.is_empty() && result.is_ok() => {
                result = write_letters(host, std::mem::take(&mut letters));
            }
            Step::WriteFrame if result.is_ok() => {
                result = write_frame(host, step);
                if publishes && result.is_ok() {
                    host.publish_synced();
                }
            }
            Step::AnswerPublishes => {
                let mut rest = Vec::new();
                let mut n = 0;
                for w in waiters {
                    match w {
                        Waiter::Frame(_) => {
                            w.answer(&result);
                            n += 1;
                        }
                        _ => rest.push(w),
                    }
                }
                waiters = rest;
                if n > 0 {
                    host.did(step, n);
                }
            }
            Step::RemoveSegments if result.is_ok() => result = remove_segments(host, step),
            Step::HandOverCompaction if result.is_ok() && host.compacts() => {
                result = hand_over_compaction(host, None);
            }
            Step::Checkpoint if result.is_ok() => {
                let (due, waited) = {
                    let log = host.log();
                    let due = log.checkpoint_due();
                    (due, due && log.owed_dead())
                };
                if due {
                    checkpoint(host);
                    host.did(step, 1);
                    // Segments that waited for a checkpoint recording them owing nothing go
                    // (asked before it: once it is taken, none of them is owed any more).
                    if waited {
                        result = remove_segments(host, Step::RemoveSegments);
                    }
                }
            }
            Step::AnswerRound => {
                let n = waiters.len() as u64;
                for w in std::mem::take(&mut waiters) {
                    w.answer(&result);
                }
                if n > 0 {
                    host.did(step, n);
                }
            }
            _ => {}
        }
    }
    // A plan without an answering step still answers everyone.
    for w in waiters {
        w.answer(&result);
    }
    result
}

/// Put `jobs`' letters, sync them, then stage their events' removal (see the module docs). A
/// failed put or sync fails the event log: nothing is staged, nothing more is written.
fn write_letters<H: Host>(host: &H, jobs: Vec<(QueueId, Letters)>) -> Result<(), StoreError> {
    let mut put = 0;
    let mut removals = Vec::new();
    let mut failed = None;
    for (queue, l) in jobs {
        let n = l.letters.len() as u64;
        let kept = match (&failed, host.dead_letters()) {
            (None, Some(store)) => keep(store, queue, l.letters, l.bound, l.report.as_ref()),
            _ => Ok(false),
        };
        match kept {
            Ok(true) => {
                put += n;
                if !l.events.is_empty() {
                    removals.push((queue, l.events));
                }
            }
            // Not wanted any more (the subscription is being deleted): its events stay.
            Ok(false) => {}
            Err(e) => failed = Some(e),
        }
    }
    let synced = match failed {
        Some(e) => Err(e),
        None if removals.is_empty() => Ok(()),
        None => host.sync_letters(),
    };
    if let Err(e) = synced {
        // Letters a crash may lose, or none at all: no frame may remove their events now, and
        // the removals of the letters before them in this round may not wait for a restart.
        host.log().fail(format!("dead letters: {e}"));
        return Err(e);
    }
    if put > 0 {
        host.did(Step::WriteLetters, put);
    }
    let mut log = host.log();
    for (queue, events) in &removals {
        log.stage_settle(*queue, events);
    }
    Ok(())
}

/// Write what is staged as one frame, outside the log's lock, and sync it; a failure fails the
/// log.
fn write_frame<H: Host>(host: &H, step: Step) -> Result<(), StoreError> {
    let (frame, group) = {
        let mut log = host.log();
        let frame = log.take_frame(host.now_ms())?;
        // Under the log's lock, as `submit` gathers it: exactly the publishes in this frame.
        (frame, host.take_group())
    };
    let Some(f) = frame else {
        return Ok(());
    };
    let span = group.and_then(|(t, g)| Some((t, CommitSpan::start(t, g, f.bytes())?)));
    // Outside the lock: publishes keep staging while this frame syncs.
    let written = f.write().and_then(|()| {
        let synced = std::time::Instant::now();
        f.sync().map(|()| synced.elapsed())
    });
    match written {
        Ok(fsync) => {
            host.log().syncs += 1;
            if let Some((t, span)) = span {
                span.finish(t, Some(fsync), None);
            }
            host.did(step, f.bytes() as u64);
            Ok(())
        }
        Err(e) => {
            if let Some((t, span)) = span {
                span.finish(t, None, Some(&e.to_string()));
            }
            host.log().fail(e.to_string());
            Err(StoreError::Io(format!("event log write failed: {e}")))
        }
    }
}

/// Delete the segments with nothing pending, after the frame restating older ones.
fn remove_segments<H: Host>(host: &H, step: Step) -> Result<(), StoreError> {
    let dead = host.log().stage_collection(host.now_ms());
    if dead.is_empty() {
        return Ok(());
    }
    write_frame(host, Step::WriteFrame)?;
    host.log().remove_segments(&dead)?;
    host.collected();
    host.did(step, dead.len() as u64);
    Ok(())
}

/// Plan a compaction worth doing (or of segment `only`, whatever it holds: the simulation) and
/// hand it over once the frame restating the older segments is durable (see
/// `engine/compact.rs`).
pub(super) fn hand_over_compaction<H: Host>(host: &H, only: Option<u64>) -> Result<(), StoreError> {
    let step = Step::HandOverCompaction;
    let job = {
        let mut log = host.log();
        log.note_time(host.now_ms());
        log.plan_compaction(only)
    };
    let Some(job) = job else {
        return Ok(());
    };
    write_frame(host, Step::WriteFrame)?;
    let no = job.segment();
    if let Some(job) = host.hand_over(job) {
        // The compactor is gone (it panicked): run it here.
        let done = job.run();
        host.log().finish_compaction(done);
    }
    host.did(step, no);
    Ok(())
}

/// Write a checkpoint (prepared under the log's lock, written outside it). A failure is logged:
/// the previous checkpoint stays valid, and opening the log reads more.
pub(super) fn checkpoint<H: Host>(host: &H) {
    let prepared = host.log().prepare_checkpoint();
    let result = prepared.and_then(|w| {
        let written = w.run();
        host.log().reuse_checkpoint_buffer(w);
        written
    });
    if let Err(e) = &result {
        tracing::warn!(error = %e, "could not write the event log's checkpoint; the next start reads more of the log");
    }
    host.log().checkpoint_done(result.is_ok());
}

/// A bare log as a host: no compactor, no tracer (the engine's tests).
pub struct Bare<'a>(std::cell::RefCell<&'a mut Log>, u64);

impl Host for Bare<'_> {
    type Guard<'g>
        = std::cell::RefMut<'g, Log>
    where
        Self: 'g;

    fn log(&self) -> Self::Guard<'_> {
        std::cell::RefMut::map(self.0.borrow_mut(), |l| &mut **l)
    }

    fn now_ms(&self) -> u64 {
        self.1
    }
}

/// Check every frame the checkpoint vouched for now ([`Log::scrub_job`] to the end), then record
/// what was found in a [`Round::Damage`] (tests of the engine; the store's scrub runs on
/// `gridlet-scrub`, the simulation's through its driver).
///
/// # Errors
/// Recording the damage failed (the log has failed then).
pub fn scrub(log: &mut Log, now_ms: u64) -> Result<(), StoreError> {
    let host = Bare(std::cell::RefCell::new(log), now_ms);
    scrub_all(&host)?;
    run(&host, Round::Damage, Work::from(Vec::new()))
}

/// Run the scrub's jobs to the end, in place (reads that fail leave their segment unchecked).
pub(super) fn scrub_all<H: Host>(host: &H) -> Result<(), StoreError> {
    let mut buf = Vec::new();
    loop {
        let Some(job) = host.log().scrub_job(super::engine::SCRUB_CHUNK) else {
            return Ok(());
        };
        match job.run(&mut buf) {
            Ok(done) => {
                host.log().scrub_done(done);
            }
            Err(e) => return Err(StoreError::Io(format!("the scrub could not read: {e}"))),
        }
    }
}

/// Run a [`Round::Frame`] on a bare log at `now_ms`: the frame, segments given back, a
/// checkpoint when due (tests of the engine; the store runs the same round on its thread).
///
/// # Errors
/// A write or sync failed (the log has failed then).
pub fn commit(log: &mut Log, now_ms: u64) -> Result<(), StoreError> {
    run(
        &Bare(std::cell::RefCell::new(log), now_ms),
        Round::Frame,
        Work::default(),
    )
}
