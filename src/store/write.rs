//! The one way into a store ([`super::Store::stage`]): what is written ([`Writes`]: a publish's
//! events, one queue's settlements, one attempt's dead letters), when the caller hears of it
//! ([`Answer`]), and the [`Commit`] that resolves then.

use super::{deadletter, QueueId, RetryState, StoreError, StoredEvent};

/// An event leaving a queue (delivered, dropped, dead-lettered): its sequence number and the
/// size of its body, which [`super::Store::pending_bytes`] counts it for. The caller has the body (it
/// delivered or dead-lettered it), so the store learns the size without reading it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Settled {
    /// Sequence number.
    pub seq: u64,
    /// Bytes of its body ([`StoredEvent::body`]).
    pub bytes: u32,
}

impl Settled {
    /// Event `seq` with a body of `len` bytes (more than `u32::MAX` counts as that: bodies
    /// are far below it).
    pub fn new(seq: u64, len: usize) -> Self {
        Self {
            seq,
            bytes: u32::try_from(len).unwrap_or(u32::MAX),
        }
    }

    /// Events `seqs`, of `bytes` each (tests, benchmarks).
    pub fn all(seqs: impl IntoIterator<Item = u64>, bytes: u32) -> Vec<Self> {
        seqs.into_iter().map(|seq| Self { seq, bytes }).collect()
    }

    /// The sequence numbers of `events`.
    pub fn seqs(events: &[Settled]) -> Vec<u64> {
        events.iter().map(|e| e.seq).collect()
    }
}

/// One settlement of a queue's events ([`Writes::Settle`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement<'a> {
    /// These events leave the store (delivered, acknowledged, dropped), each with its body's
    /// size, for [`super::Store::pending_bytes`].
    Remove(&'a [Settled]),
    /// These events' retry state becomes this one.
    Retry(&'a [u64], RetryState),
}

/// One delivery attempt's dead letters, and their events to remove after them
/// ([`Writes::Letters`]). The letters are kept (within `bound`) **before** the removal of
/// their events can become durable: after a crash each event is pending, a dead letter, or
/// both, never neither.
pub struct Letters {
    /// The letters.
    pub letters: Vec<deadletter::DeadLetter>,
    /// The bounds they are kept within.
    pub bound: deadletter::DeadLetterBound,
    /// Their events in the store, with their body sizes (empty: a subscription not persisted).
    pub events: Vec<Settled>,
    /// Told what became of the letters.
    pub report: std::sync::Arc<dyn deadletter::LetterReport>,
}

impl std::fmt::Debug for Letters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Letters")
            .field("letters", &self.letters.len())
            .field("bound", &self.bound)
            .field("events", &self.events.len())
            .finish_non_exhaustive()
    }
}

impl Letters {
    /// Bytes the letters hold ([`deadletter::DeadLetter::size`]).
    pub fn bytes(&self) -> u64 {
        self.letters.iter().map(deadletter::DeadLetter::size).sum()
    }
}

/// What [`super::Store::stage`] writes.
#[derive(Debug)]
pub enum Writes<'a> {
    /// One publish's events (one request's copies, the same event once per queue it goes to),
    /// all or none. Stores see them in the order they are staged: the broker stages in the
    /// order it numbers events, so the log's sequence numbers increase.
    Events(Vec<(QueueId, StoredEvent)>),
    /// Settlements of one queue, in order.
    Settle(QueueId, &'a [Settlement<'a>]),
    /// Dead letters of one queue, kept, then their events removed.
    Letters(QueueId, Letters),
    /// Nothing new: the commit answers for what was staged before it.
    Staged,
}

/// Which step answers a [`Commit`] of [`super::Store::stage`] (stores without a committer answer at
/// once: their writes are done when `stage` returns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Nobody waits: the writes ride the next frame (a publish's, or the committer's own within
    /// its settle interval). The commit answers at once.
    Nobody,
    /// Once the frame holding the writes (and everything staged before them) is synced, as a
    /// publish: nothing else the round does delays it. Publishes, pull acknowledgements.
    Frame,
    /// After the whole round: segments with nothing pending given back, checkpoint when due
    /// (management calls and a clean stop: the space is free when they return).
    Round,
}

/// Staged writes' durability ([`super::Store::stage`]): resolves once they are durable, at the step
/// their [`Answer`] names. Owns no borrow of the store, so it can be awaited in another task.
#[must_use = "writes are durable only once their commit resolves (drop it when nobody waits)"]
pub struct Commit(Option<tokio::sync::oneshot::Receiver<Result<(), StoreError>>>);

impl Commit {
    /// Already durable (or nothing to make durable).
    pub fn done() -> Self {
        Self(None)
    }

    /// Durable when `rx` answers.
    pub fn pending(rx: tokio::sync::oneshot::Receiver<Result<(), StoreError>>) -> Self {
        Self(Some(rx))
    }

    /// Whether there is anything to wait for. A store answers [`Answer::Nobody`] with a commit
    /// that waits when what it has staged passes its bound (backpressure).
    pub fn waits(&self) -> bool {
        self.0.is_some()
    }

    /// Wait on this thread (never on an async worker: off the runtime, inside
    /// `block_in_place`, or on a blocking-pool thread; a current-thread runtime waits on a
    /// helper thread).
    ///
    /// # Errors
    /// As [`Commit::wait`].
    pub fn wait_blocking(self) -> Result<(), StoreError> {
        let Some(rx) = self.0 else {
            return Ok(());
        };
        let stopped = |_| StoreError::Io("the event store stopped before the commit".into());
        use tokio::runtime::{Handle, RuntimeFlavor};
        match Handle::try_current().map(|h| h.runtime_flavor()) {
            Err(_) => rx.blocking_recv().map_err(stopped)?,
            Ok(RuntimeFlavor::MultiThread) => {
                tokio::task::block_in_place(|| rx.blocking_recv()).map_err(stopped)?
            }
            // A current-thread runtime (tests): its only thread may block, but not inside its
            // context.
            Ok(_) => std::thread::scope(|s| {
                s.spawn(move || rx.blocking_recv())
                    .join()
                    .unwrap_or_else(|_| Ok(Err(StoreError::Io("wait failed".into()))))
            })
            .map_err(stopped)?,
        }
    }

    /// The answer, if it has come, without waiting (`None` while the events are not yet
    /// durable). Not a future: polling one inside a runtime spends the task's budget, and a
    /// spent budget reads as "not yet" (the simulation answers its commits this way).
    pub fn ready(&mut self) -> Option<Result<(), StoreError>> {
        use tokio::sync::oneshot::error::TryRecvError;
        match self.0.as_mut().map(|rx| rx.try_recv()) {
            None => Some(Ok(())),
            Some(Ok(r)) => Some(r),
            Some(Err(TryRecvError::Empty)) => None,
            Some(Err(TryRecvError::Closed)) => Some(Err(StoreError::Io(
                "the event store stopped before the commit".into(),
            ))),
        }
    }

    /// Wait until the events are durable.
    ///
    /// # Errors
    /// The write or sync failed, or the store stopped.
    pub async fn wait(self) -> Result<(), StoreError> {
        match self.0 {
            None => Ok(()),
            Some(rx) => rx
                .await
                .map_err(|_| StoreError::Io("the event store stopped before the commit".into()))?,
        }
    }
}
