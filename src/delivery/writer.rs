//! The store writer: the store writes that follow a delivery attempt, done on the caller's
//! thread, in order, when it submits them. No thread of its own, no queue to wait behind.
//!
//! What it writes is data, not code: a [`Write`] says what happens (remove delivered events,
//! record a retry's state, keep dead letters and then remove their events), decided by
//! `settle` (`settle::Effects::writes`), and [`StoreWriter::submit`] is the one place that
//! hands them to the store, each as one [`Store::stage`] nobody waits for. Removals and retry
//! states are one `Writes::Settle`; each job of letters is a `Writes::Letters`, which keeps the
//! letters **before** the removal of their events can become durable (the log store's
//! committer puts and syncs them in its round, then stages the removal; the memory store keeps
//! them in its maps, then removes): after a crash each event is pending, a dead letter, or
//! both, never neither. For any event its retry state comes before its removal, because one
//! attempt's writes are staged in the order `settle` listed them and an event has one attempt
//! in flight at a time.
//!
//! No async worker waits on the disk: the log store and the memory store stage in memory
//! ([`Store::stages_in_memory`]); a store that writes on the caller's thread (none that ships:
//! the tests' slow stores) is called inside `block_in_place`, so its worker's other tasks move
//! on. Readers need nothing to wait for: what was staged is what the store answers (a
//! spilled retry's state read back, a pull lock's body); dead letters are listed after a
//! commit (`Broker::settled_writes`), which the round answers after it put the letters handed
//! over before it.
//!
//! Bounds: the store's. When what it has staged or been handed runs ahead of its disk (the log
//! store's `LETTERS_BOUND`, `STAGED_BOUND`), it answers even a write nobody waits for with a
//! commit that waits ([`crate::store::Commit::waits`]); the writer then waits for it, off the
//! async workers: a disk slower than the deliveries slows the deliveries instead of growing
//! memory.

use crate::metrics::SubscriptionMetrics;
use crate::store::deadletter::{DeadLetter, DeadLetterBound, LetterReport};
use crate::store::{
    Answer, Letters, QueueId, RetryState, Settled, Settlement, Store, StoreError, Writes,
};
use crate::telemetry::TraceContext;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Whose write it is: for log lines, metrics, and to drop writes of a deleted subscription.
#[derive(Clone)]
pub struct Owner {
    /// Store queue id.
    pub queue: QueueId,
    /// Subscription name.
    pub name: Arc<str>,
    /// The subscription's metrics (dead letters kept and evicted).
    pub metrics: Arc<SubscriptionMetrics>,
    /// Set when the subscription is deleted: its letters not yet kept are not kept.
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

/// The store tells the owner what became of its letters (in the committer's round, for the log
/// store).
impl LetterReport for Owner {
    fn wanted(&self) -> bool {
        !self.retired.load(Ordering::SeqCst)
    }
    fn kept(&self, kept: usize, evicted: usize) {
        self.metrics.dead_lettered.add(kept as u64);
        self.metrics.dead_letters_evicted.add(evicted as u64);
    }
    fn failed(&self, e: &StoreError) {
        tracing::error!(subscription = %self.name, error = %e, trace_id = self.trace_id(), span_id = self.span_id(), "could not keep a dead letter; its event stays in the store");
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

/// Hands the writes that follow delivery attempts to the store. See the module docs.
pub struct StoreWriter {
    store: Arc<dyn Store>,
    bound: DeadLetterBound,
}

impl StoreWriter {
    /// A writer to `store`, keeping dead letters within `bound`.
    pub fn new(store: Arc<dyn Store>, bound: DeadLetterBound) -> Self {
        Self { store, bound }
    }

    /// Stage `owner`'s `writes`, in order (see the module docs); done when this returns, unless
    /// the store asks the caller to wait for its disk (then this waits, off the async workers).
    pub fn submit(&self, owner: Owner, writes: Vec<Write>) {
        if writes.is_empty() {
            return;
        }
        if self.store.stages_in_memory() {
            self.write(owner, writes);
        } else {
            off_the_workers(|| self.write(owner, writes));
        }
    }

    fn write(&self, owner: Owner, writes: Vec<Write>) {
        let (letters, settle): (Vec<Write>, Vec<Write>) = writes
            .into_iter()
            .partition(|w| matches!(w, Write::KeepLetters { .. }));
        let settlements: Vec<Settlement<'_>> = settle
            .iter()
            .filter_map(|w| match w {
                Write::Remove { events } => Some(Settlement::Remove(events)),
                Write::RetryState { seqs, state } => Some(Settlement::Retry(seqs, *state)),
                Write::KeepLetters { .. } => None,
            })
            .collect();
        if !settlements.is_empty() {
            let w = Writes::Settle(owner.queue, &settlements);
            if let Err(e) = self.stage(w) {
                tracing::error!(subscription = %owner.name, error = %e, trace_id = owner.trace_id(), span_id = owner.span_id(), "could not settle events in the store; they may be delivered again after a restart");
            }
        }
        let mut report: Option<Arc<Owner>> = None;
        for w in letters {
            let Write::KeepLetters { letters, events } = w else {
                continue;
            };
            if !owner.wanted() {
                return; // the subscription is gone: its letters would outlive it
            }
            let report = report
                .get_or_insert_with(|| Arc::new(owner.clone()))
                .clone();
            let job = Letters {
                letters,
                bound: self.bound,
                events,
                report,
            };
            if let Err(e) = self.stage(Writes::Letters(owner.queue, job)) {
                tracing::error!(subscription = %owner.name, error = %e, trace_id = owner.trace_id(), span_id = owner.span_id(), "could not keep dead letters; their events stay in the store");
            }
        }
    }

    /// Stage `writes` nobody waits for, unless the store says its disk is behind: then wait.
    fn stage(&self, writes: Writes<'_>) -> Result<(), StoreError> {
        let commit = self.store.stage(writes, Answer::Nobody)?;
        if commit.waits() {
            commit.wait_blocking()?;
        }
        Ok(())
    }
}

/// Run `f`, which may block on a disk, without holding up the async worker's other tasks.
fn off_the_workers<R>(f: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::deadletter::DropReason;
    use crate::store::memory::MemoryStore;
    use crate::store::{Commit, StoredEvent};
    use bytes::Bytes;
    use std::sync::Mutex;

    fn bound() -> DeadLetterBound {
        DeadLetterBound {
            per_subscription: 100,
            max_bytes: 1 << 20,
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

    fn letter(seq: u64) -> DeadLetter {
        DeadLetter {
            id: 0,
            seq,
            event_id: format!("e{seq}"),
            body: Bytes::from_static(b"{}"),
            reason: DropReason::MaxDeliveryAttemptsExceeded,
            last_status: Some(500),
            last_error: None,
            attempts: 3,
            first_enqueued_ms: 1,
            dead_lettered_ms: 2,
        }
    }

    fn pending(store: &dyn Store) -> Vec<u64> {
        crate::store::contract::pending(store, 1)
            .iter()
            .map(|e| e.seq)
            .collect()
    }

    #[test]
    fn writes_are_done_when_submit_returns_letters_before_their_events_leave() {
        let store = Arc::new(MemoryStore::new());
        let items = (1..=4).map(|s| (1, stored(s))).collect();
        drop(store.submit(items).unwrap());
        let w = StoreWriter::new(store.clone(), bound());
        let o = owner(1);
        let state = RetryState {
            attempts: 1,
            first_enqueued_ms: 1,
            due_ms: 9,
        };
        w.submit(
            o.clone(),
            vec![
                Write::Remove {
                    events: Settled::all([1], 0),
                },
                Write::RetryState {
                    seqs: vec![2],
                    state,
                },
                Write::KeepLetters {
                    letters: vec![letter(3)],
                    events: Settled::all([3], 0),
                },
            ],
        );
        assert_eq!(pending(store.as_ref()), [2, 4]);
        assert_eq!(
            store.get(1, &[2]).unwrap()[0].as_ref().unwrap().state,
            state
        );
        let letters = store.dead_letters().unwrap();
        assert_eq!(letters.list(1, 0, 10).unwrap()[0].seq, 3);
        assert_eq!(o.metrics.dead_lettered.get(), 1);
        // A deleted subscription keeps no letter, and its event stays for the deletion.
        o.retired.store(true, Ordering::SeqCst);
        w.submit(
            o.clone(),
            vec![Write::KeepLetters {
                letters: vec![letter(4)],
                events: Settled::all([4], 0),
            }],
        );
        assert_eq!(letters.count(1), 1);
        assert_eq!(pending(store.as_ref()), [2, 4]);
    }

    /// The memory store behind a switch: every write fails, or a write nobody waits for is
    /// answered with a commit to wait for (a store whose disk is behind).
    #[derive(Default)]
    struct Switched {
        inner: MemoryStore,
        broken: bool,
        behind: Mutex<Option<tokio::sync::oneshot::Receiver<Result<(), StoreError>>>>,
    }

    impl Store for Switched {
        fn load(&self) -> Result<crate::store::Snapshot, StoreError> {
            self.inner.load()
        }
        fn pending_runs(&self, q: QueueId) -> Result<crate::store::PendingRuns, StoreError> {
            self.inner.pending_runs(q)
        }
        fn get(&self, q: QueueId, seqs: &[u64]) -> Result<Vec<Option<StoredEvent>>, StoreError> {
            self.inner.get(q, seqs)
        }
        fn put_topic(
            &self,
            k: &str,
            r: &crate::model::record::TopicRecord,
        ) -> Result<(), StoreError> {
            self.inner.put_topic(k, r)
        }
        fn delete_topic(&self, k: &str) -> Result<(), StoreError> {
            self.inner.delete_topic(k)
        }
        fn put_subscription(
            &self,
            q: QueueId,
            r: &crate::model::record::SubscriptionRecord,
        ) -> Result<(), StoreError> {
            self.inner.put_subscription(q, r)
        }
        fn delete_subscription(&self, q: QueueId) -> Result<(), StoreError> {
            self.inner.delete_subscription(q)
        }
        fn next_queue_id(&self) -> Result<QueueId, StoreError> {
            self.inner.next_queue_id()
        }
        fn stage(&self, w: Writes<'_>, a: Answer) -> Result<Commit, StoreError> {
            if self.broken {
                return Err(StoreError::Io("disk gone".into()));
            }
            drop(self.inner.stage(w, a)?);
            Ok(match crate::sync::lock(&self.behind).take() {
                Some(rx) => Commit::pending(rx),
                None => Commit::done(),
            })
        }
        fn stages_in_memory(&self) -> bool {
            true
        }
    }

    /// A store whose disk is behind makes the submitter wait for it, not queue more.
    #[test]
    fn a_store_behind_its_disk_makes_the_submitter_wait() {
        let store = Arc::new(Switched::default());
        drop(store.submit(vec![(1, stored(1))]).unwrap());
        let (tx, rx) = tokio::sync::oneshot::channel();
        *crate::sync::lock(&store.behind) = Some(rx);
        let w = Arc::new(StoreWriter::new(store.clone(), bound()));
        let w2 = w.clone();
        let submitter = std::thread::spawn(move || {
            w2.submit(
                owner(1),
                vec![Write::Remove {
                    events: Settled::all([1], 0),
                }],
            );
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!submitter.is_finished(), "the submitter waits for the disk");
        tx.send(Ok(())).unwrap();
        submitter.join().unwrap();
    }

    /// On the runtime, the wait for a store behind its disk leaves the worker's other tasks
    /// running: on one worker thread, the task that answers the commit runs while the
    /// submitting task waits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn the_wait_for_the_disk_leaves_the_workers_other_tasks_running() {
        let store = Arc::new(Switched::default());
        drop(store.submit(vec![(1, stored(1))]).unwrap());
        let (tx, rx) = tokio::sync::oneshot::channel();
        *crate::sync::lock(&store.behind) = Some(rx);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<()>();
        let answer = tokio::spawn(async move {
            let _ = ready_rx.await;
            tx.send(Ok(())).unwrap();
        });
        let w = StoreWriter::new(store.clone(), bound());
        let submitter = tokio::spawn(async move {
            ready_tx.send(()).unwrap();
            w.submit(
                owner(1),
                vec![Write::Remove {
                    events: Settled::all([1], 0),
                }],
            );
        });
        tokio::time::timeout(std::time::Duration::from_secs(30), submitter)
            .await
            .expect("the submitter's wait was answered by the other task")
            .unwrap();
        answer.await.unwrap();
        assert!(pending(store.as_ref()).is_empty());
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
        let store = Arc::new(Switched {
            broken: true,
            ..Default::default()
        });
        let w = StoreWriter::new(store, bound());
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
            w.submit(
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
            );
            // Events that travel in no context: no ids.
            w.submit(
                owner(1),
                vec![Write::Remove {
                    events: Settled::all([8], 0),
                }],
            );
        });
        let text = String::from_utf8(crate::sync::lock(&lines.0).clone()).unwrap();
        let records: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(records.len(), 3, "{text}");
        for r in &records[..2] {
            assert_eq!(r["level"], "ERROR", "{r}");
            assert_eq!(
                r["fields"]["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736",
                "{r}"
            );
            assert_eq!(r["fields"]["span_id"], "00f067aa0ba902b7", "{r}");
        }
        assert!(
            records[2]["fields"].get("trace_id").is_none(),
            "{}",
            records[2]
        );
    }
}
