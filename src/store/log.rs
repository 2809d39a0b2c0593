//! The default store: persisted events and dead letters in gridlet's own append-only logs,
//! metadata in one file.
//!
//! ```text
//! <persistence__metadataPath>/gridlet-v2/meta.json    topics, subscriptions, queue ids,
//!                                                      endpoint health, MQTT records
//!                                                      ([`crate::store::meta::disk`])
//! <persistence__eventsPath>/gridlet-v2/log/*.seg      the event log ([`engine`], [`format`])
//! <persistence__eventsPath>/gridlet-v2/dead-letters/*.dlq   dead letters ([`letters`])
//! ```
//!
//! # Group commit
//!
//! [`Store::submit`] ([`Store::stage`] of [`Writes::Events`]) stages a publish's events in the log (each body once, with the queues it
//! is pending in) under the log's lock, in the order the broker numbered them, and returns a
//! [`Commit`] that resolves once they are durable. One committer thread (`gridlet-commit`) takes
//! everything staged as one frame, writes it and `fdatasync`s it outside the lock, then answers
//! every publish in that frame: concurrent publishes share one sync. With the tracer on, each
//! frame is a `commit` span ([`commit_trace`]).
//!
//! Everything goes through [`Store::stage`], with one [`Commit`] type: a publish's events and a
//! queue's settlements (retry states, removals) are staged under the log's lock, dead letters
//! ([`Writes::Letters`]) are handed to the committer's next round, and the commit is answered
//! at the step of the round the caller named ([`Answer`]: once its frame is synced, after the
//! whole round, or nobody waits). Nothing here touches a file on the caller's thread, so a
//! delivery settles in place, on its async worker, with no thread of its own. Settlements
//! nobody waits for ride on the next publish's frame, or on a frame of their own within
//! [`SETTLE_EVERY`]. A crash can therefore repeat a delivery that had just succeeded (at
//! least once) or resume an event with an attempt count one step old; it never loses an
//! acknowledged event. The round puts the dead letters into their log and syncs them **before**
//! it stages the removal of their events ([`round::Step::WriteLetters`]), so after a crash an
//! event is pending, a dead letter, or both; never neither. Bounded: past [`LETTERS_BOUND`]
//! letters (or [`LETTER_BYTES_BOUND`]) handed over and not yet taken, or [`STAGED_BOUND`] bytes
//! staged, even a write nobody waits for gets a commit to wait for ([`Commit::waits`]), so a
//! disk slower than the deliveries slows them instead of growing memory.
//!
//! # Disk bound
//!
//! A publish is refused ([`StoreError::Full`]) when the log's segments plus the dead-letter
//! files plus the new events would pass `persistence__maxDiskBytes`. Segments with nothing
//! pending are deleted after the frame that made them so (see [`engine`]), so the space comes
//! back as events are delivered. Dead letters keep within half of what the event log leaves of
//! the bound, and their files are compacted (see [`letters`]): the two logs together stay within
//! the bound plus one letter segment plus one letter.

mod commit_trace;
mod committer;
#[cfg(test)]
mod committer_tests;
#[cfg(test)]
mod compact_tests;
pub mod engine;
pub(crate) mod format;
pub(crate) mod letters;
mod open;
#[cfg(test)]
mod retain_tests;
pub mod round;
#[cfg(test)]
mod round_tests;
#[cfg(test)]
mod scrub_tests;
pub mod sim;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod trace_tests;
#[cfg(test)]
mod write_tests;

use crate::model::record::{MqttKind, MqttRecord, SubscriptionRecord, TopicRecord};
use crate::store::deadletter::DeadLetterStore;
use crate::store::meta::MetaStore;
#[cfg(test)]
use crate::store::RetryState;
use crate::store::{
    Answer, Commit, CommitCounters, QueueId, Settlement, Snapshot, Store, StoreError, StoredEvent,
    Writes,
};
pub use committer::Driver;
use committer::{Compactor, Shared};
use engine::Recovered;
use round::Waiter;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Directory under `persistence__eventsPath` holding this format.
pub const SUBDIR: &str = "gridlet-v2";
/// Longest a staged settlement waits for a frame when no publish comes.
pub const SETTLE_EVERY: Duration = Duration::from_millis(100);
/// Longest the idle committer sleeps before it looks for a compaction to do.
const IDLE_TICK: Duration = Duration::from_secs(1);
/// Dead letters handed to the committer and not yet taken by a round, past which a delivery
/// waits for the round (backpressure: a disk slower than the deliveries slows them).
pub const LETTERS_BOUND: usize = 4096;
/// The same in bytes of letters ([`crate::store::deadletter::DeadLetter::size`]).
pub const LETTER_BYTES_BOUND: u64 = 8 << 20;
/// Bytes staged for the next frame past which a settlement nobody waits for waits for that
/// frame all the same (backpressure, as [`LETTERS_BOUND`]).
pub const STAGED_BOUND: usize = 16 << 20;
/// Default size at which the head segment is closed and a new one started.
pub const SEGMENT_BYTES: u64 = 16 << 20;

/// Options of the log store (from `persistence__*` settings).
#[derive(Debug, Clone)]
pub struct LogStoreOptions {
    /// `persistence__metadataPath`.
    pub metadata_path: PathBuf,
    /// `persistence__eventsPath`.
    pub events_path: PathBuf,
    /// `persistence__maxDiskBytes`.
    pub max_disk_bytes: u64,
    /// `persistence__cacheBytes` (unused since dead letters and metadata left sled; kept for the
    /// setting).
    pub cache_bytes: u64,
    /// `persistence__flushEveryMs`: the sync of dead letters nobody waits for (0 = off).
    pub flush_every_ms: u64,
    /// Size at which a segment is closed.
    pub segment_bytes: u64,
    /// A closed segment pinned by a few events is compacted once none of its events was
    /// settled for this long ([`engine::COMPACT_IDLE_MS`] by default).
    pub compact_idle_ms: u64,
    /// `persistence__onDamage=refuse`: damaged data stops the open ([`StoreError::Corrupt`]),
    /// nothing changed.
    pub refuse_damage: bool,
}

/// The store. See the module docs.
pub struct LogStore {
    meta: Box<dyn MetaStore>,
    letters: Arc<letters::LogLetters>,
    shared: Arc<Shared>,
    /// Who runs the rounds, until stopped.
    running: Mutex<Running>,
    recovered: Mutex<Recovered>,
    /// What the open of the dead-letter log found damaged ([`engine::Damage`]); the event
    /// log's, the open's and the scrub's since, are the log's own.
    letters_damage: engine::Damage,
}

/// Who runs the committer's rounds.
enum Running {
    /// The committer and compactor threads, and the scrub's.
    Threads(
        std::thread::JoinHandle<()>,
        std::thread::JoinHandle<()>,
        std::thread::JoinHandle<()>,
    ),
    /// The caller, through a [`Driver`] (the simulation).
    Inline,
    /// Stopped (or crashed, in the simulation): nothing more is written.
    Stopped,
}

fn now_ms() -> u64 {
    crate::clock::system_wall_ms()
}

impl LogStore {
    /// Write what is staged and give back dead segments, waiting for it (management calls on
    /// the blocking pool: a deleted subscription's space is free when the call returns).
    fn flush_blocking(&self) -> Result<(), StoreError> {
        if self.shared.inline() {
            return self.shared.round_now(round::Round::Frame);
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let mut w = self.shared.waiting();
        w.waiters.push(Waiter::RoundThread(tx));
        self.shared.wake_for(w);
        rx.recv()
            .map_err(|_| StoreError::Io("the committer stopped".into()))?
    }

    /// Segment files of the log (tests, metrics).
    pub fn segments(&self) -> usize {
        self.shared.log().segments()
    }

    /// Bytes of the dead-letter files, for the disk bound.
    pub fn letter_disk_bytes(&self) -> u64 {
        self.letters.disk_bytes()
    }

    /// Segments replaced by their compacted copy since open (tests, metrics).
    pub fn compactions(&self) -> u64 {
        self.shared.log().compactions()
    }

    /// What was found damaged and lost, both logs: at open, and since by the scrub and reads.
    pub fn damage(&self) -> engine::Damage {
        let mut d = self.shared.log().damage().clone();
        d.extend(self.letters_damage.clone());
        d
    }

    /// Bytes of frames the scrub has still to check (tests).
    pub fn scrub_left(&self) -> u64 {
        self.shared.log().scrub_left()
    }

    /// Read events, recording a damaged frame met on the way first (through the committer's
    /// round, [`engine::Log::record_findings`]) and reading again: what the damage took is no
    /// longer pending, and the read steps over it. Bounded: a frame that fails again (it was
    /// not recorded: the log failed) is an error.
    fn get_recording(
        &self,
        queue: QueueId,
        seqs: &[u64],
    ) -> Result<Vec<Option<StoredEvent>>, StoreError> {
        let mut tries = 0;
        loop {
            let plans = self.shared.log().plan_get(queue, seqs);
            let read = plans.run();
            let found = self.shared.log().has_findings();
            match read {
                Err(StoreError::Corrupt(e)) if tries < 3 && found => {
                    tracing::debug!(error = %e, "a read met a damaged frame: recording it");
                    tries += 1;
                    self.flush_blocking()?;
                }
                other => return other,
            }
        }
    }

    /// Bytes the log's segments occupy (tests, metrics).
    pub fn log_bytes(&self) -> u64 {
        self.shared.log().bytes()
    }
}

/// What the log's tests read around the recovery path.
#[cfg(test)]
impl LogStore {
    /// Pending events of one queue, bodies included, in sequence order.
    pub(crate) fn pending(&self, queue: QueueId) -> Result<Vec<StoredEvent>, StoreError> {
        let seqs: Vec<u64> = self
            .pending_index(queue)?
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        Ok(self.get(queue, &seqs)?.into_iter().flatten().collect())
    }

    /// Sequence numbers and retry states of one queue's pending events, in sequence order.
    pub(crate) fn pending_index(
        &self,
        queue: QueueId,
    ) -> Result<Vec<(u64, RetryState)>, StoreError> {
        Ok(self.pending_runs(queue)?.events())
    }
}

impl Store for LogStore {
    fn load(&self) -> Result<Snapshot, StoreError> {
        let (topics, subscriptions) = self.meta.snapshot()?;
        Ok(Snapshot {
            topics,
            subscriptions,
            max_seq: self.shared.log().max_seq(),
        })
    }

    fn pending_runs(&self, queue: QueueId) -> Result<crate::store::PendingRuns, StoreError> {
        if let Some(v) = crate::sync::lock(&self.recovered).remove(&queue) {
            let log = self.shared.log();
            if log.losses_since_open() == 0 {
                return Ok(v);
            }
            // Damage found since the open (the scrub, a read) took some of these.
            let mut out = crate::store::PendingRuns::default();
            for (seq, st) in v.events() {
                if log.is_pending(queue, seq) {
                    out.push(seq, st);
                }
            }
            return Ok(out);
        }
        let mut out = crate::store::PendingRuns::default();
        for (seq, st) in self.shared.log().index_of(queue)? {
            out.push(seq, st);
        }
        Ok(out)
    }

    fn get(&self, queue: QueueId, seqs: &[u64]) -> Result<Vec<Option<StoredEvent>>, StoreError> {
        self.get_recording(queue, seqs)
    }

    fn put_topic(&self, key: &str, record: &TopicRecord) -> Result<(), StoreError> {
        self.meta.write_topic(key, record)
    }

    fn delete_topic(&self, key: &str) -> Result<(), StoreError> {
        self.meta.remove_topic(key)
    }

    fn put_subscription(
        &self,
        queue: QueueId,
        record: &SubscriptionRecord,
    ) -> Result<(), StoreError> {
        self.meta.write_subscription(queue, record)
    }

    fn delete_subscription(&self, queue: QueueId) -> Result<(), StoreError> {
        // Record first: a crash in between leaves events of an unknown queue, which are not
        // pending at the next start.
        self.meta.remove_subscription(queue)?;
        crate::sync::lock(&self.recovered).remove(&queue);
        self.shared.log().stage_drop_queue(queue);
        self.letters.delete_queue(queue)?;
        self.flush_blocking()
    }

    fn next_queue_id(&self) -> Result<QueueId, StoreError> {
        self.meta.new_queue_id()
    }

    fn stage(&self, writes: Writes<'_>, answer: Answer) -> Result<Commit, StoreError> {
        let events = matches!(writes, Writes::Events(_));
        let reserved = if events { self.letters.disk_bytes() } else { 0 };
        let commit;
        {
            // Staged and queued for an answer under the log's lock: frames keep the staging
            // order, and no frame can be taken between the two.
            let mut log = self.shared.log();
            let mut letters = None;
            let mut group = None;
            match writes {
                Writes::Events(items) => {
                    log.stage_events(&items, reserved)?;
                    group = Some(items);
                }
                Writes::Settle(queue, settlements) => {
                    for s in settlements {
                        match *s {
                            Settlement::Remove(seqs) => log.stage_settle(queue, seqs),
                            Settlement::Retry(seqs, state) => log.stage_retry(queue, seqs, state),
                        }
                    }
                }
                // Handed to the next round, which puts and syncs them and only then stages
                // their events' removal (`round::Step::WriteLetters`): see the module docs.
                Writes::Letters(queue, l) => letters = Some((queue, l)),
                Writes::Staged => {}
            }
            let mut w = self.shared.waiting();
            if let Some((queue, l)) = letters {
                w.letter_bytes += l.bytes();
                w.letters.push((queue, l));
            }
            // Backpressure: staging that has run ahead of the disk makes even a write nobody
            // waits for wait for the next frame (not once the committer has stopped: no frame
            // would come).
            let behind = (w.letters.len() > LETTERS_BOUND
                || w.letter_bytes > LETTER_BYTES_BOUND
                || log.staged_bytes() > STAGED_BOUND)
                && !w.shutdown;
            let answer = match answer {
                Answer::Nobody if behind => Answer::Frame,
                a => a,
            };
            let waiter = match Waiter::new(answer) {
                Some((waiter, c)) => {
                    commit = c;
                    Some(waiter)
                }
                None => {
                    commit = Commit::done();
                    None
                }
            };
            if let (Some(items), true) = (&group, self.shared.tracer().is_some()) {
                w.group.add(items);
            }
            let wake = match waiter {
                Some(waiter) => {
                    w.waiters.push(waiter);
                    true
                }
                // Nobody waits: the committer writes them within `SETTLE_EVERY`. Only the
                // first since the last frame wakes it (one wake per frame, not per batch).
                None => !std::mem::replace(&mut w.dirty, true),
            };
            if wake {
                // Only if it sleeps: a committer at work looks at the waiters again first.
                self.shared.wake_for(w);
            }
        }
        if events {
            self.shared.commits.fetch_add(1, Ordering::Relaxed);
        }
        Ok(commit)
    }

    fn stages_in_memory(&self) -> bool {
        true
    }

    fn pending_bytes(&self, queue: QueueId) -> Option<u64> {
        Some(self.shared.log().pending_bytes(queue))
    }

    fn size_on_disk(&self) -> u64 {
        self.shared.log().disk_bytes() + self.letters.disk_bytes()
    }

    fn retain_since(&self, since_ms: Option<crate::clock::WallMs>) {
        let released = self.shared.log().retain_since(since_ms);
        if released {
            // A round gives the segments back (collection runs after a frame): nothing new is
            // staged, nobody waits; the committer's next round comes within its interval.
            let _ = self.stage(Writes::Staged, Answer::Nobody);
        }
    }

    fn retained_events(
        &self,
        since_ms: crate::clock::WallMs,
        f: &mut dyn FnMut(crate::store::RetainedEvent),
    ) -> Result<(), StoreError> {
        let scan = self.shared.log().plan_retained(since_ms);
        scan.run(f)
    }

    fn commit_counters(&self) -> Option<CommitCounters> {
        // One lock of the log at a time: a guard in a field expression lives to the end of
        // the statement.
        let damage = self.damage();
        let (compactions, window_evicted_segments) = {
            let log = self.shared.log();
            (log.compactions(), log.kept_evicted())
        };
        Some(CommitCounters {
            commits: self.shared.commits.load(Ordering::Relaxed),
            syncs: self.shared.publish_syncs.load(Ordering::Relaxed),
            checkpoints: self.shared.collections.load(Ordering::Relaxed),
            compactions,
            damaged_frames: damage.frames(),
            damaged_events: damage.events(),
            window_evicted_segments,
        })
    }

    fn damage_summary(&self) -> Option<String> {
        self.damage().summary()
    }

    fn close(&self) {
        self.stop();
    }

    fn dead_letters(&self) -> Option<Arc<dyn DeadLetterStore>> {
        Some(self.letters.clone())
    }

    fn trace_commits(&self, tracer: &crate::telemetry::Tracer) {
        if tracer.enabled() {
            let _ = self.shared.tracer.set(tracer.clone());
        }
    }

    fn endpoint_health(&self) -> Result<Vec<(String, Value)>, StoreError> {
        self.meta.health_records()
    }

    fn put_endpoint_health(&self, url: &str, record: Option<&Value>) -> Result<(), StoreError> {
        self.meta.write_endpoint_health(url, record)
    }

    fn mqtt_records(&self) -> Result<Vec<MqttRecord>, StoreError> {
        self.meta.mqtt_records()
    }

    fn put_mqtt_record(
        &self,
        kind: MqttKind,
        name: &str,
        record: Option<&MqttRecord>,
    ) -> Result<(), StoreError> {
        self.meta.write_mqtt_record(kind, name, record)
    }
}

impl LogStore {
    /// Stop the committer after its last round, then leave a checkpoint of everything (the next
    /// start reads nothing more), seal the letters and sync the metadata. Idempotent: the server
    /// calls it at the end of a clean stop ([`Store::close`]), and dropping the store does it
    /// again if it was not called.
    fn stop(&self) {
        let running = std::mem::replace(&mut *crate::sync::lock(&self.running), Running::Stopped);
        match running {
            Running::Stopped => return,
            Running::Threads(t, compactor, scrub) => {
                *crate::sync::lock(&self.shared.scrub_stop) = true;
                self.shared.scrub_wake.notify_all();
                let _ = scrub.join();
                self.shared.waiting().shutdown = true;
                self.shared.wake.notify_one();
                let _ = t.join();
                // The committer's end closed the compactor's queue: it finishes what it has.
                let _ = compactor.join();
            }
            Running::Inline => {
                let _ = self.shared.round_now(round::Round::Stop);
                if let Compactor::Held(slot) = &self.shared.compactor {
                    if let Some(job) = crate::sync::lock(slot).take() {
                        self.shared.finish_compaction(job);
                    }
                }
            }
        }
        let due = {
            let log = self.shared.log();
            log.since_checkpoint() > 0 || log.checkpoint_due()
        };
        if due {
            round::checkpoint(&*self.shared);
        }
        // Sealed, not only synced: damage to the last letters is then told from a torn write.
        let _ = self.letters.seal();
        self.meta.flush();
    }

    /// The process dies here (the simulation's power cut): nothing more is written, not even
    /// at drop.
    pub fn crash(self) {
        *crate::sync::lock(&self.running) = Running::Stopped;
    }

    /// Heads started in the spare segment since open (tests).
    pub fn recycled(&self) -> u64 {
        self.shared.log().recycled()
    }
}

impl Drop for LogStore {
    fn drop(&mut self) {
        self.stop();
    }
}
