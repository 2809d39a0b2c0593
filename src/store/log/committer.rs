//! The log store's threads: `gridlet-commit` waits for work and runs the round
//! ([`super::round`]) on the store's shared state; `gridlet-compact` copies the segments the
//! round hands over; `gridlet-scrub` checks, rate-limited, the frames the checkpoint vouched
//! for at open (`engine/scrub.rs`) and ends when they are all checked. The simulation runs the
//! same rounds and the same scrub in place, through [`Driver`].

use super::commit_trace::Group;
use super::engine::{Compaction, Log};
use super::round::{self, Host, Round, Waiter, Work};
use super::{letters, IDLE_TICK, SETTLE_EVERY};
use crate::store::deadletter::DeadLetterStore;
use crate::store::QueueId;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

#[derive(Default)]
pub(super) struct Waiting {
    /// Who waits for the next round (publishes, pull settlements, commits, management calls),
    /// each answered at its step.
    pub(super) waiters: Vec<Waiter>,
    /// Dead letters handed over, for the next round to put and sync before it stages their
    /// events' removal ([`round::Step::WriteLetters`]).
    pub(super) letters: Vec<(QueueId, crate::store::Letters)>,
    /// Their bytes ([`crate::store::Letters::bytes`]), for the bound.
    pub(super) letter_bytes: u64,
    /// Settlements staged (or dead letters handed over) since the last frame.
    pub(super) dirty: bool,
    pub(super) shutdown: bool,
    /// The committer waits on [`Shared::wake`] (set and cleared by it, under this lock): only
    /// then does new work need a wake-up. While it writes or syncs a frame it takes what was
    /// staged meanwhile when it comes back, and a `futex` wake per publish would be wasted.
    pub(super) asleep: bool,
    /// The publishes staged for the next frame (only while commits are traced).
    pub(super) group: Group,
}

impl Waiting {
    /// What the next round is given: everyone waiting, the dead letters handed over.
    pub(super) fn take_work(&mut self) -> Work {
        self.dirty = false;
        self.letter_bytes = 0;
        Work {
            waiters: std::mem::take(&mut self.waiters),
            letters: std::mem::take(&mut self.letters),
        }
    }
}

/// Where the round hands a planned compaction.
pub(super) enum Compactor {
    /// The `gridlet-compact` thread's queue; closed when the committer ends, which ends the
    /// compactor once it has finished what it has.
    Thread(Mutex<Option<std::sync::mpsc::Sender<Compaction>>>),
    /// Kept until the simulation runs it ([`super::Driver::run_compaction`]).
    Held(Mutex<Option<Compaction>>),
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
    /// Wall time, milliseconds (the system's; the simulation's own clock).
    pub(super) clock: Box<dyn Fn() -> u64 + Send + Sync>,
    pub(super) compactor: Compactor,
    /// Set when the store stops: the scrub ends at once.
    pub(super) scrub_stop: Mutex<bool>,
    pub(super) scrub_wake: Condvar,
    /// The dead letters, put and synced by the round before it stages the removal of their
    /// events (set once the store has opened them).
    pub(super) letters: std::sync::OnceLock<std::sync::Arc<letters::LogLetters>>,
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

    /// Wake the committer for work just added under `w`, if it is waiting for some (it looks
    /// at `w` again before it waits, under the same lock, so no wake-up is lost).
    pub(super) fn wake_for(&self, w: MutexGuard<'_, Waiting>) {
        let asleep = w.asleep;
        drop(w);
        if asleep {
            self.wake.notify_one();
        }
    }

    /// Whether rounds run in place, on the caller's thread (the simulation), rather than on
    /// `gridlet-commit`.
    pub(super) fn inline(&self) -> bool {
        matches!(self.compactor, Compactor::Held(_))
    }

    /// Run one round now with everyone waiting (the simulation's committer).
    pub(super) fn round_now(&self, round: Round) -> Result<(), crate::store::StoreError> {
        let work = self.waiting().take_work();
        round::run(self, round, work)
    }

    /// A copy made: swap it in, and have the next round take the checkpoint it makes due.
    pub(super) fn finish_compaction(&self, job: Compaction) {
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
        self.log().finish_compaction(done);
        self.waiting().dirty = true;
        self.wake.notify_one();
    }
}

impl Host for Shared {
    type Guard<'g> = std::sync::MutexGuard<'g, Log>;

    fn log(&self) -> Self::Guard<'_> {
        Shared::log(self)
    }

    fn now_ms(&self) -> u64 {
        (self.clock)()
    }

    fn compacts(&self) -> bool {
        true
    }

    fn hand_over(&self, job: Compaction) -> Option<Compaction> {
        match &self.compactor {
            Compactor::Thread(tx) => match crate::sync::lock(tx).as_ref() {
                Some(tx) => tx.send(job).err().map(|back| back.0),
                None => Some(job),
            },
            Compactor::Held(slot) => {
                // One compaction at a time (the log plans no second while one is in flight).
                *crate::sync::lock(slot) = Some(job);
                None
            }
        }
    }

    fn take_group(&self) -> Option<(&crate::telemetry::Tracer, Group)> {
        let t = self.tracer()?;
        Some((t, std::mem::take(&mut self.waiting().group)))
    }

    fn dead_letters(&self) -> Option<&dyn DeadLetterStore> {
        self.letters
            .get()
            .map(|l| l.as_ref() as &dyn DeadLetterStore)
    }

    fn sync_letters(&self) -> Result<(), crate::store::StoreError> {
        match self.letters.get() {
            Some(l) => l.sync(),
            None => Ok(()),
        }
    }

    fn publish_synced(&self) {
        self.publish_syncs.fetch_add(1, Ordering::Relaxed);
    }

    fn collected(&self) {
        self.collections.fetch_add(1, Ordering::Relaxed);
    }
}

/// The committer thread: waits for publishes, settlements or the idle tick, then runs the
/// round ([`Round::Frame`], [`Round::Idle`], [`Round::Stop`] at the end).
pub(super) fn committer(s: &Shared, letters_every: Duration) {
    let mut letters_synced = std::time::Instant::now();
    loop {
        let work = {
            let mut w = s.waiting();
            while w.waiters.is_empty() && !w.dirty && !w.shutdown {
                let tick = if letters_every.is_zero() {
                    IDLE_TICK
                } else {
                    letters_every.min(IDLE_TICK)
                };
                w.asleep = true;
                let (g, t) = s
                    .wake
                    .wait_timeout(w, tick)
                    .unwrap_or_else(|p| p.into_inner());
                w = g;
                w.asleep = false;
                if t.timed_out() {
                    drop(w);
                    // Letters of subscriptions that are not persisted (no event removal makes
                    // them durable): synced every `persistence__flushEveryMs` when idle.
                    if !letters_every.is_zero() && letters_synced.elapsed() >= letters_every {
                        letters_synced = std::time::Instant::now();
                        if let Err(e) = s.sync_letters() {
                            tracing::error!(error = %e, "could not make dead letters durable");
                        }
                    }
                    if let Err(e) = round::run(s, Round::Idle, Work::default()) {
                        tracing::error!(error = %e, "event log: could not start a compaction");
                    }
                    w = s.waiting();
                }
            }
            if w.waiters.is_empty() && w.dirty && !w.shutdown {
                // Settlements only: let more gather (and publishes join them).
                w.asleep = true;
                let (g, _) = s
                    .wake
                    .wait_timeout_while(w, SETTLE_EVERY, |w| w.waiters.is_empty() && !w.shutdown)
                    .unwrap_or_else(|p| p.into_inner());
                w = g;
                w.asleep = false;
            }
            if w.shutdown && w.waiters.is_empty() {
                let work = w.take_work();
                drop(w);
                let _ = round::run(s, Round::Stop, work);
                if let Compactor::Thread(tx) = &s.compactor {
                    crate::sync::lock(tx).take();
                }
                return;
            }
            w.take_work()
        };
        // A failure fails the log (`Log::fail`), which refuses the next publishes; the waiters
        // got the error.
        let _ = round::run(s, Round::Frame, work);
    }
}

/// The compactor thread: copies segments the round handed over ([`Compaction`]) while frames
/// go on being written, then swaps them in and has the committer take a checkpoint.
pub(super) fn compactor(s: &Shared, jobs: &std::sync::mpsc::Receiver<Compaction>) {
    for job in jobs {
        s.finish_compaction(job);
    }
}

/// The scrub thread: checks the frames the checkpoint vouched for, a chunk at a time, at most
/// `bytes_per_sec`; a failing frame wakes the committer, whose next round records it. Ends
/// when every segment is checked, or when the store stops.
pub(super) fn scrubber(s: &Shared, bytes_per_sec: u64) {
    let started = std::time::Instant::now();
    let mut read = 0u64;
    let mut buf = Vec::new();
    loop {
        let Some(job) = s.log().scrub_job(super::engine::SCRUB_CHUNK) else {
            tracing::debug!(
                bytes = read,
                ms = started.elapsed().as_millis() as u64,
                "event log scrub done"
            );
            return;
        };
        let found = match job.run(&mut buf) {
            Ok(done) => {
                read += done.bytes;
                s.log().scrub_done(done)
            }
            Err(e) => {
                // Left unchecked: a read error is the disk's, and reads report theirs.
                tracing::warn!(error = %e, "the event log's scrub could not read a segment; stopping the scrub");
                return;
            }
        };
        if found {
            s.waiting().dirty = true;
            s.wake.notify_one();
        }
        // The pace: `read` bytes take at least `read / bytes_per_sec` seconds.
        let due = Duration::from_secs_f64(read as f64 / bytes_per_sec.max(1) as f64);
        let pause = due.saturating_sub(started.elapsed());
        let stop = crate::sync::lock(&s.scrub_stop);
        let (stop, _) = s
            .scrub_wake
            .wait_timeout_while(stop, pause, |stop| !*stop)
            .unwrap_or_else(|p| p.into_inner());
        if *stop {
            return;
        }
    }
}

/// Runs a [`super::LogStore::simulated`] store's rounds: the same executor as the committer thread
/// ([`round`]), on the caller's thread, when told to.
pub struct Driver {
    pub(super) shared: std::sync::Arc<Shared>,
}

impl Driver {
    /// The committer's round ([`Round::Frame`]): whatever is staged as one frame, every
    /// waiting publish, `commit` and management call answered at its step.
    ///
    /// # Errors
    /// A write or sync failed (the log has failed then).
    pub fn round(&self) -> Result<(), crate::store::StoreError> {
        self.shared.round_now(Round::Frame)
    }

    /// The idle committer's round: weigh the segments for a compaction.
    ///
    /// # Errors
    /// As [`Driver::round`].
    pub fn idle(&self) -> Result<(), crate::store::StoreError> {
        round::run(&*self.shared, Round::Idle, Work::default())
    }

    /// The compactor's work: copy the segment a round handed over and swap it in, as
    /// `gridlet-compact` does. Whether there was one.
    pub fn compact(&self) -> bool {
        let job = match &self.shared.compactor {
            Compactor::Held(slot) => crate::sync::lock(slot).take(),
            Compactor::Thread(_) => None,
        };
        match job {
            Some(job) => {
                self.shared.finish_compaction(job);
                true
            }
            None => false,
        }
    }

    /// Hand over a compaction of a closed segment with events pending, chosen by `pick` from
    /// their numbers, whatever it holds (the round's own choice is [`Driver::idle`]'s): the
    /// simulation's way to copy segments the store would leave for longer.
    ///
    /// # Errors
    /// As [`Driver::round`].
    pub fn compact_one(
        &self,
        pick: impl FnOnce(&[u64]) -> Option<u64>,
    ) -> Result<(), crate::store::StoreError> {
        let closed = self.shared.log().closed_pending_segments();
        match pick(&closed) {
            Some(no) => round::hand_over_compaction(&*self.shared, Some(no)),
            None => Ok(()),
        }
    }

    /// A checkpoint now, as the round takes one when due.
    pub fn checkpoint(&self) {
        round::checkpoint(&*self.shared);
    }

    /// The scrub's work to the end, as `gridlet-scrub` does it, then the round that records
    /// what it found ([`Round::Damage`]).
    ///
    /// # Errors
    /// A read failed, or recording the damage did (the log has failed then).
    pub fn scrub(&self) -> Result<(), crate::store::StoreError> {
        round::scrub_all(&*self.shared)?;
        round::run(&*self.shared, Round::Damage, Work::from(Vec::new()))
    }
}
