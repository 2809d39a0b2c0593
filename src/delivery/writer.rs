//! The store writer: the store writes that follow a delivery attempt run on one dedicated
//! thread, `gridlet-settle`, in the order they were submitted, so no async worker ever waits
//! on the disk.
//!
//! The shortcut: a job of removals and retry states only, submitted while no job waits or
//! runs, is done in place, on the caller's thread, when the store stages settlements in memory
//! ([`Store::stages_in_memory`]: the event log, under its lock, and the memory store), as one
//! [`Store::stage`] nobody waits for. Nothing is reordered by it: a job runs in place only when every job submitted before
//! it has run, and what it writes is done before `submit` returns. (A job submitted by another
//! task at the same moment is about other events: one event has one attempt in flight per
//! subscription.) It saves a thread wake per delivery: in `gridlet-bench` (d) about one
//! context switch per event of three.
//!
//! What it writes is data, not code: a [`Write`] says what happens (remove delivered events,
//! record a retry's state, keep dead letters and then remove their events), decided by
//! `settle` (`settle::Effects::writes`), and [`write`] is the one place that does it. Order is
//! what makes this safe. One attempt's writes are one job, run in the order `settle` listed
//! them, and jobs run one at a time in submission order, so for any event its retry state
//! comes before its removal, and within
//! [`Write::KeepLetters`] the letters are kept **before** their events are removed: after a crash
//! each event is pending, a dead letter, or both, never neither. Readers that must see earlier
//! writes (reading a spilled retry's state back, listing or replaying dead letters) first wait
//! for the writer to reach the point at which they asked ([`StoreWriter::mark`] /
//! [`StoreWriter::wait_for`]), off the async workers too.
//!
//! Bounds: at most [`QUEUE_BOUND`] jobs wait. A dispatcher that finds the queue full waits for
//! room (on a multi-threaded runtime through `block_in_place`, so its worker's other tasks move
//! on): a disk slower than the deliveries slows the deliveries instead of growing memory.
//!
//! Panics: gridlet's release build aborts on panic (`panic = "abort"`), and nothing here has a
//! panic path; a panic would be a bug, and the process restarts and recovers from the store. So
//! the writer does not catch them.

use crate::metrics::SubscriptionMetrics;
use crate::store::deadletter::{DeadLetter, DeadLetterBound, DeadLetterStore};
use crate::store::{Answer, QueueId, RetryState, Settled, Settlement, Store, Writes};
use crate::telemetry::TraceContext;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex};

/// Jobs (one attempt's writes each) that may wait for the writer thread.
pub const QUEUE_BOUND: usize = 4096;

/// Whose write it is: for log lines, metrics, and to drop writes of a deleted subscription.
#[derive(Clone)]
pub struct Owner {
    /// Store queue id.
    pub queue: QueueId,
    /// Subscription name.
    pub name: Arc<str>,
    /// The subscription's metrics (dead letters kept and evicted).
    pub metrics: Arc<SubscriptionMetrics>,
    /// Set when the subscription is deleted: its letters still queued are not kept.
    pub retired: Arc<AtomicBool>,
    /// The trace context of the write's events (the attempt's `deliver` span, or the context
    /// the first of them travels in): error lines name its trace and span.
    pub trace: Option<TraceContext>,
}

impl Owner {
    fn trace_id(&self) -> Option<String> {
        self.trace.as_ref().map(TraceContext::trace_hex)
    }
    fn span_id(&self) -> Option<String> {
        self.trace.as_ref().map(TraceContext::span_hex)
    }
}

/// One store write after a delivery attempt (of the subscription its job's [`Owner`] names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Delivered events leave the store.
    Remove {
        /// Their sequence numbers and body sizes.
        events: Vec<Settled>,
    },
    /// A retrying batch's state (attempts, first enqueue, due time).
    RetryState {
        /// Their sequence numbers.
        seqs: Vec<u64>,
        /// The state.
        state: RetryState,
    },
    /// Keep the letters within the bound, then remove their events (`events`: persisted
    /// subscriptions only) from the store, in that order.
    KeepLetters {
        /// The letters.
        letters: Vec<DeadLetter>,
        /// Their events in the store, with their body sizes (empty: not persisted).
        events: Vec<Settled>,
    },
}

/// What the writer thread is handed: one subscription's writes, run in order.
enum Job {
    /// Whose, and what.
    Writes(Owner, Vec<Write>),
    /// Run a function (tests: gates and order probes).
    #[cfg(test)]
    Probe(Box<dyn FnOnce() + Send + 'static>),
}

/// What the writer writes to.
#[derive(Clone)]
pub struct Targets {
    /// The event store.
    pub store: Arc<dyn Store>,
    /// The dead-letter store.
    pub dead_letters: Arc<dyn DeadLetterStore>,
    /// The bound letters are kept within.
    pub bound: DeadLetterBound,
}

/// Do one job's writes, in order.
fn execute(job: Job, t: &Targets) {
    match job {
        Job::Writes(owner, writes) => {
            for w in writes {
                write(&owner, w, t);
            }
        }
        #[cfg(test)]
        Job::Probe(f) => f(),
    }
}

/// Do one write. Failures are logged: the event is then delivered again after a restart (a
/// removal), retried with an older attempt count (a state), or not kept as a letter.
pub fn write(owner: &Owner, w: Write, t: &Targets) {
    match w {
        Write::Remove { events } => {
            if let Err(e) = t.store.remove(owner.queue, &events) {
                tracing::error!(subscription = %owner.name, error = %e, trace_id = owner.trace_id(), span_id = owner.span_id(), "could not remove delivered events from the store; they may be delivered again after a restart");
            }
        }
        Write::RetryState { seqs, state } => {
            if let Err(e) = t.store.update(owner.queue, &seqs, state) {
                tracing::error!(subscription = %owner.name, error = %e, trace_id = owner.trace_id(), span_id = owner.span_id(), "could not persist retry state");
            }
        }
        Write::KeepLetters { letters, events } => keep_letters(owner, letters, &events, t),
    }
}

/// Keep `letters`, then remove their events: the one place dead letters are written.
fn keep_letters(owner: &Owner, letters: Vec<DeadLetter>, events: &[Settled], t: &Targets) {
    if owner.retired.load(Ordering::SeqCst) {
        return; // the subscription is gone: its letters would outlive it
    }
    for l in letters {
        match t.dead_letters.put(owner.queue, l, t.bound) {
            Ok(evicted) => {
                if t.bound.keeps_any() {
                    owner.metrics.dead_lettered.inc();
                }
                owner.metrics.dead_letters_evicted.add(evicted as u64);
            }
            Err(e) => {
                tracing::error!(subscription = %owner.name, error = %e, trace_id = owner.trace_id(), span_id = owner.span_id(), "could not keep a dead letter")
            }
        }
    }
    if !events.is_empty() {
        let dropped = [Settlement::Dropped(events)];
        if let Err(e) = t
            .store
            .stage(Writes::Settle(owner.queue, &dropped), Answer::Nobody)
        {
            tracing::error!(subscription = %owner.name, error = %e, trace_id = owner.trace_id(), span_id = owner.span_id(), "could not remove dropped events from the store");
        }
    }
}

/// How far the writer thread has got.
#[derive(Default)]
struct Progress {
    done: Mutex<u64>,
    advanced: Condvar,
}

/// Handle to the writer thread. The thread ends once the handle is dropped and every write
/// submitted before has run.
pub struct StoreWriter {
    tx: SyncSender<Job>,
    submitted: AtomicU64,
    progress: Arc<Progress>,
    targets: Targets,
}

impl StoreWriter {
    /// Start the writer thread.
    ///
    /// # Errors
    /// The OS could not start a thread.
    pub fn start(targets: Targets) -> std::io::Result<Self> {
        let (tx, rx) = sync_channel::<Job>(QUEUE_BOUND);
        let progress = Arc::new(Progress::default());
        let (p, t) = (progress.clone(), targets.clone());
        std::thread::Builder::new()
            .name("gridlet-settle".into())
            .spawn(move || run(rx, &p, &t))?;
        Ok(Self {
            tx,
            submitted: AtomicU64::new(0),
            progress,
            targets,
        })
    }

    /// Queue `owner`'s `writes` (run in order) behind every write submitted before them, or
    /// do them here when nothing is queued and the store only stages them (see the module
    /// docs). Waits for room when [`QUEUE_BOUND`] jobs are waiting; if the thread is gone,
    /// writes here.
    pub fn submit(&self, owner: Owner, writes: Vec<Write>) {
        if writes.is_empty() || self.settled_in_place(&owner, &writes) {
            return;
        }
        self.send(Job::Writes(owner, writes));
    }

    /// Do `writes` here if they are removals and retry states only, nothing submitted before
    /// is still to run, and the store stages them in memory (see the module docs).
    fn settled_in_place(&self, owner: &Owner, writes: &[Write]) -> bool {
        if !self.targets.store.stages_in_memory() || !self.idle() {
            return false;
        }
        let settlements: Option<Vec<Settlement<'_>>> = writes
            .iter()
            .map(|w| match w {
                Write::Remove { events } => Some(Settlement::Remove(events)),
                Write::RetryState { seqs, state } => Some(Settlement::Retry(seqs, *state)),
                Write::KeepLetters { .. } => None,
            })
            .collect();
        let Some(s) = settlements else {
            return false;
        };
        let staged = self
            .targets
            .store
            .stage(Writes::Settle(owner.queue, &s), Answer::Nobody);
        if let Err(e) = staged {
            tracing::error!(subscription = %owner.name, error = %e, trace_id = owner.trace_id(), span_id = owner.span_id(), "could not settle events in the store; they may be delivered again after a restart");
        }
        true
    }

    /// Every job submitted so far has run.
    fn idle(&self) -> bool {
        *crate::sync::lock(&self.progress.done) == self.submitted.load(Ordering::SeqCst)
    }

    fn send(&self, job: Job) {
        self.submitted.fetch_add(1, Ordering::SeqCst);
        let job = match self.tx.try_send(job) {
            Ok(()) => return,
            Err(TrySendError::Full(j)) => j,
            Err(TrySendError::Disconnected(j)) => {
                execute(j, &self.targets);
                self.advance();
                return;
            }
        };
        let send = || {
            if let Err(e) = self.tx.send(job) {
                execute(e.0, &self.targets);
                self.advance();
            }
        };
        match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(send),
            _ => send(),
        }
    }

    /// Run `f` on the writer thread in turn (tests: gates and order probes).
    #[cfg(test)]
    fn probe(&self, f: impl FnOnce() + Send + 'static) {
        self.send(Job::Probe(Box::new(f)));
    }

    /// Writes submitted so far: pass it to [`StoreWriter::wait_for`].
    pub fn mark(&self) -> u64 {
        self.submitted.load(Ordering::SeqCst)
    }

    /// Block until every write submitted before `mark` has run (blocking threads only).
    pub fn wait_for(&self, mark: u64) {
        let mut done = crate::sync::lock(&self.progress.done);
        while *done < mark {
            done = self
                .progress
                .advanced
                .wait(done)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Wait, without blocking the runtime, until every write submitted so far has run. When
    /// they have (a settlement done in place, nothing queued), it answers at once, without a
    /// hop to the blocking pool.
    pub async fn flush(self: &Arc<Self>) {
        let mark = self.mark();
        if *crate::sync::lock(&self.progress.done) >= mark {
            return;
        }
        let me = self.clone();
        let _ = tokio::task::spawn_blocking(move || me.wait_for(mark)).await;
    }

    fn advance(&self) {
        advance(&self.progress);
    }
}

fn advance(p: &Progress) {
    *crate::sync::lock(&p.done) += 1;
    p.advanced.notify_all();
}

fn run(rx: Receiver<Job>, progress: &Progress, targets: &Targets) {
    while let Ok(job) = rx.recv() {
        execute(job, targets);
        advance(progress);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::deadletter::DropReason;
    use crate::store::memory::MemoryStore;
    use crate::store::{StoreError, StoredEvent};
    use bytes::Bytes;

    fn targets() -> Targets {
        Targets {
            store: Arc::new(MemoryStore::new()),
            dead_letters: Arc::new(crate::delivery::deadletter::MemoryDeadLetters::new()),
            bound: DeadLetterBound {
                per_subscription: 100,
                max_bytes: 1 << 20,
            },
        }
    }

    fn owner(queue: QueueId) -> Owner {
        Owner {
            queue,
            name: "s".into(),
            metrics: Arc::default(),
            retired: Arc::default(),
            trace: None,
        }
    }

    #[test]
    fn writes_run_in_order_and_readers_wait_for_their_mark() {
        let w = StoreWriter::start(targets()).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        for i in 0..1000 {
            let seen = seen.clone();
            w.probe(move || crate::sync::lock(&seen).push(i));
        }
        w.wait_for(w.mark());
        assert_eq!(*crate::sync::lock(&seen), (0..1000).collect::<Vec<_>>());
    }

    fn stored(seq: u64) -> StoredEvent {
        StoredEvent {
            seq,
            id: format!("e{seq}"),
            body: Bytes::from_static(b"{}"),
            state: RetryState {
                attempts: 0,
                first_enqueued_ms: 1,
                due_ms: 0,
            },
            trace: None,
        }
    }

    fn pending(t: &Targets) -> Vec<u64> {
        crate::store::contract::pending(t.store.as_ref(), 1)
            .iter()
            .map(|e| e.seq)
            .collect()
    }

    #[test]
    fn settlements_are_done_in_place_only_behind_nothing() {
        let t = targets();
        // The memory store's commit is done at once.
        drop(
            t.store
                .submit(vec![(1, stored(1)), (1, stored(2)), (1, stored(3))])
                .unwrap(),
        );
        let w = StoreWriter::start(t.clone()).unwrap();
        // Idle writer: the removal is done before `submit` returns.
        w.submit(
            owner(1),
            vec![Write::Remove {
                events: Settled::all([1], 0),
            }],
        );
        assert_eq!(pending(&t), [2, 3]);
        // A job waits on the thread: the next removal queues behind it, in order.
        let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
        let seen = Arc::new(Mutex::new(Vec::new()));
        w.probe(move || {
            let _ = gate_rx.recv();
        });
        w.submit(
            owner(1),
            vec![Write::Remove {
                events: Settled::all([2], 0),
            }],
        );
        let (t2, s2) = (t.clone(), seen.clone());
        w.probe(move || crate::sync::lock(&s2).push(pending(&t2)));
        assert_eq!(
            pending(&t),
            [2, 3],
            "queued behind the gate, not done in place"
        );
        gate_tx.send(()).unwrap();
        w.wait_for(w.mark());
        assert_eq!(*crate::sync::lock(&seen), [vec![3]]);
        // A job with a letter in it always goes to the thread (the letters' sync).
        w.submit(
            owner(1),
            vec![
                Write::Remove { events: vec![] },
                Write::KeepLetters {
                    letters: vec![],
                    events: Settled::all([3], 0),
                },
            ],
        );
        w.wait_for(w.mark());
        assert!(pending(&t).is_empty());
    }

    /// A settlement done in place leaves nothing to wait for: `flush` answers on its first
    /// poll (no hop to the blocking pool); behind a queued job it waits for that job.
    #[tokio::test]
    async fn flush_answers_at_once_when_nothing_is_queued() {
        use std::future::Future;
        let t = targets();
        drop(t.store.submit(vec![(1, stored(1))]).unwrap());
        let w = Arc::new(StoreWriter::start(t.clone()).unwrap());
        w.submit(
            owner(1),
            vec![Write::Remove {
                events: Settled::all([1], 0),
            }],
        );
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(Box::pin(w.flush()).as_mut().poll(&mut cx).is_ready());
        let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
        w.probe(move || {
            let _ = gate_rx.recv();
        });
        let mut queued = Box::pin(w.flush());
        assert!(queued.as_mut().poll(&mut cx).is_pending());
        gate_tx.send(()).unwrap();
        queued.await;
    }

    #[test]
    fn letters_are_kept_before_their_events_leave_the_store() {
        let t = targets();
        let ev = StoredEvent {
            seq: 7,
            id: "e7".into(),
            body: Bytes::from_static(b"{}"),
            state: RetryState {
                attempts: 3,
                first_enqueued_ms: 1,
                due_ms: 0,
            },
            trace: None,
        };
        drop(t.store.submit(vec![(1, ev)]).unwrap());
        let letter = DeadLetter {
            id: 0,
            seq: 7,
            event_id: "e7".into(),
            body: Bytes::from_static(b"{}"),
            reason: DropReason::MaxDeliveryAttemptsExceeded,
            last_status: Some(500),
            last_error: None,
            attempts: 3,
            first_enqueued_ms: 1,
            dead_lettered_ms: 2,
        };
        let o = owner(1);
        write(
            &o,
            Write::KeepLetters {
                letters: vec![letter],
                events: Settled::all([7], 0),
            },
            &t,
        );
        assert_eq!(t.dead_letters.count(1), 1);
        assert!(crate::store::contract::pending(t.store.as_ref(), 1).is_empty());
        assert_eq!(o.metrics.dead_lettered.get(), 1);
        // A deleted subscription keeps nothing.
        o.retired.store(true, Ordering::SeqCst);
        write(
            &o,
            Write::KeepLetters {
                letters: vec![],
                events: vec![],
            },
            &t,
        );
    }

    /// A store whose every write fails.
    struct Broken;

    impl Store for Broken {
        fn load(&self) -> Result<crate::store::Snapshot, StoreError> {
            Ok(Default::default())
        }
        fn pending_runs(&self, _: QueueId) -> Result<crate::store::PendingRuns, StoreError> {
            Ok(Default::default())
        }
        fn get(&self, _: QueueId, seqs: &[u64]) -> Result<Vec<Option<StoredEvent>>, StoreError> {
            Ok(vec![None; seqs.len()])
        }
        fn put_topic(
            &self,
            _: &str,
            _: &crate::model::record::TopicRecord,
        ) -> Result<(), StoreError> {
            Err(StoreError::Io("disk gone".into()))
        }
        fn delete_topic(&self, _: &str) -> Result<(), StoreError> {
            Err(StoreError::Io("disk gone".into()))
        }
        fn put_subscription(
            &self,
            _: QueueId,
            _: &crate::model::record::SubscriptionRecord,
        ) -> Result<(), StoreError> {
            Err(StoreError::Io("disk gone".into()))
        }
        fn delete_subscription(&self, _: QueueId) -> Result<(), StoreError> {
            Err(StoreError::Io("disk gone".into()))
        }
        fn next_queue_id(&self) -> Result<QueueId, StoreError> {
            Err(StoreError::Io("disk gone".into()))
        }
        fn stage(&self, _: Writes<'_>, _: Answer) -> Result<crate::store::Commit, StoreError> {
            Err(StoreError::Io("disk gone".into()))
        }
    }

    /// Log lines written as `log__format=json` writes them, into a buffer.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            crate::sync::lock(&self.0).extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_writers_error_lines_name_the_trace_of_their_events() {
        let lines = Lines::default();
        let out = lines.clone();
        let json = tracing_subscriber::fmt()
            .with_target(false)
            .json()
            .with_writer(move || out.clone())
            .finish();
        let t = Targets {
            store: Arc::new(Broken),
            ..targets()
        };
        let ctx = TraceContext::parse(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            None,
        );
        let mut o = owner(1);
        o.trace = ctx;
        let state = RetryState {
            attempts: 1,
            first_enqueued_ms: 1,
            due_ms: 2,
        };
        tracing::subscriber::with_default(json, || {
            execute(
                Job::Writes(
                    o.clone(),
                    vec![
                        Write::Remove {
                            events: Settled::all([7], 0),
                        },
                        Write::RetryState {
                            seqs: vec![7],
                            state,
                        },
                        Write::KeepLetters {
                            letters: vec![],
                            events: Settled::all([7], 0),
                        },
                    ],
                ),
                &t,
            );
            // Events that travel in no context: no ids.
            execute(
                Job::Writes(
                    owner(1),
                    vec![Write::Remove {
                        events: Settled::all([8], 0),
                    }],
                ),
                &t,
            );
        });
        let text = String::from_utf8(crate::sync::lock(&lines.0).clone()).unwrap();
        let records: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(records.len(), 4, "{text}");
        for r in &records[..3] {
            assert_eq!(r["level"], "ERROR", "{r}");
            assert_eq!(
                r["fields"]["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736",
                "{r}"
            );
            assert_eq!(r["fields"]["span_id"], "00f067aa0ba902b7", "{r}");
        }
        assert!(
            records[3]["fields"].get("trace_id").is_none(),
            "{}",
            records[3]
        );
    }

    #[test]
    fn a_full_queue_makes_the_submitter_wait_not_grow() {
        let w = Arc::new(StoreWriter::start(targets()).unwrap());
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let g = gate.clone();
        w.probe(move || {
            let mut open = crate::sync::lock(&g.0);
            while !*open {
                open = g.1.wait(open).unwrap_or_else(|p| p.into_inner());
            }
        });
        for _ in 0..QUEUE_BOUND {
            w.probe(|| {});
        }
        let w2 = w.clone();
        let blocked = std::thread::spawn(move || w2.probe(|| {}));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!blocked.is_finished(), "the submitter waits for room");
        *crate::sync::lock(&gate.0) = true;
        gate.1.notify_all();
        blocked.join().unwrap();
        w.wait_for(w.mark());
        assert_eq!(*crate::sync::lock(&w.progress.done), QUEUE_BOUND as u64 + 2);
    }
}
