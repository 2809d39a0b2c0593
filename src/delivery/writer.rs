//! The store writer: the store writes that follow a delivery attempt (remove a delivered event,
//! record a retry's state, keep dead letters and remove their events) run on one dedicated
//! thread, `gridlet-settle`, in the order they were submitted, so no async worker ever waits
//! on the disk or on sled's internal locks.
//!
//! Order is what makes this safe. Jobs run one at a time in submission order, so for any event
//! its `update` comes before its `remove`, and a dead letter is kept before its event is
//! removed. Readers that must see earlier writes (reading a spilled retry's state back, listing
//! or replaying dead letters) first wait for the writer to reach the point at which they asked
//! ([`StoreWriter::mark`] / [`StoreWriter::wait_for`]), off the async workers too.
//!
//! Bounds: at most [`QUEUE_BOUND`] jobs wait. A dispatcher that finds the queue full waits for
//! room (on a multi-threaded runtime through `block_in_place`, so its worker's other tasks move
//! on): a disk slower than the deliveries slows the deliveries instead of growing memory.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex};

/// Jobs that may wait for the writer thread.
pub const QUEUE_BOUND: usize = 4096;

/// A store write, run on the writer thread.
pub type Job = Box<dyn FnOnce() + Send + 'static>;

/// How far the writer thread has got.
#[derive(Default)]
struct Progress {
    done: Mutex<u64>,
    advanced: Condvar,
}

/// Handle to the writer thread. The thread ends once the handle is dropped and every job
/// submitted before has run.
pub struct StoreWriter {
    tx: SyncSender<Job>,
    submitted: AtomicU64,
    progress: Arc<Progress>,
}

impl StoreWriter {
    /// Start the writer thread.
    ///
    /// # Errors
    /// The OS could not start a thread.
    pub fn start() -> std::io::Result<Self> {
        let (tx, rx) = sync_channel::<Job>(QUEUE_BOUND);
        let progress = Arc::new(Progress::default());
        let p = progress.clone();
        std::thread::Builder::new()
            .name("gridlet-settle".into())
            .spawn(move || run(rx, &p))?;
        Ok(Self {
            tx,
            submitted: AtomicU64::new(0),
            progress,
        })
    }

    /// Queue `job` behind every job submitted before it.
    pub fn submit(&self, job: Job) {
        self.submitted.fetch_add(1, Ordering::SeqCst);
        let job = match self.tx.try_send(job) {
            Ok(()) => return,
            Err(TrySendError::Full(job)) => job,
            Err(TrySendError::Disconnected(job)) => {
                // The thread is gone (it only ends when this handle drops): run it here.
                job();
                self.advance();
                return;
            }
        };
        let send = || {
            if let Err(e) = self.tx.send(job) {
                (e.0)();
                self.advance();
            }
        };
        match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(send),
            _ => send(),
        }
    }

    /// The point a reader must wait for to see every write submitted so far.
    pub fn mark(&self) -> u64 {
        self.submitted.load(Ordering::SeqCst)
    }

    /// Block until every job submitted before `mark` has run. Call it off the async workers
    /// (a blocking-pool thread).
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

    /// Wait, off the async workers, until every job submitted so far has run.
    pub async fn flush(self: &Arc<Self>) {
        let mark = self.mark();
        let me = self.clone();
        // A failed join means the wait panicked, which it cannot; nothing to add either way.
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

fn run(rx: Receiver<Job>, progress: &Progress) {
    while let Ok(job) = rx.recv() {
        // No unwind handling: release builds abort on a panic (Cargo.toml), so a panicking store
        // write stops the process and the publish journal replays at restart (docs/SECURITY.md).
        job();
        advance(progress);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_run_in_order_and_readers_wait_for_their_mark() {
        let w = StoreWriter::start().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        for i in 0..1000 {
            let seen = seen.clone();
            w.submit(Box::new(move || crate::sync::lock(&seen).push(i)));
        }
        w.wait_for(w.mark());
        assert_eq!(*crate::sync::lock(&seen), (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn a_full_queue_makes_the_submitter_wait_not_grow() {
        let w = Arc::new(StoreWriter::start().unwrap());
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let g = gate.clone();
        w.submit(Box::new(move || {
            let mut open = crate::sync::lock(&g.0);
            while !*open {
                open = g.1.wait(open).unwrap_or_else(|p| p.into_inner());
            }
        }));
        for _ in 0..QUEUE_BOUND {
            w.submit(Box::new(|| {}));
        }
        let w2 = w.clone();
        let blocked = std::thread::spawn(move || w2.submit(Box::new(|| {})));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!blocked.is_finished(), "the submitter waits for room");
        *crate::sync::lock(&gate.0) = true;
        gate.1.notify_all();
        blocked.join().unwrap();
        w.wait_for(w.mark());
        assert_eq!(*crate::sync::lock(&w.progress.done), QUEUE_BOUND as u64 + 2);
    }
}
