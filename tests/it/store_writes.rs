//! The store writes that follow a delivery attempt (removing a delivered event, recording a
//! retry's state, keeping a dead letter) run off the async runtime: on a device running one
//! runtime thread (`broker__workerThreads=1`), a write stuck on a slow disk must not stop other
//! subscriptions' publishes and deliveries.

use crate::util::*;
use futures_util::future::BoxFuture;
use gridlet::store::deadletter::{DeadLetter, DeadLetterBound, DeadLetterStore, MemoryDeadLetters};
use gridlet::store::memory::MemoryStore;
use gridlet::store::{QueueId, RetryState, Snapshot, Store, StoreError, StoredEvent};
use gridlet::Parts;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// How long a held write waits for the release before going on regardless. A broker that
/// blocks its only runtime thread on the write cannot be released by the test, so the write
/// goes on after this and the test then fails on the order of events.
const HOLD_AT_MOST: Duration = Duration::from_secs(10);

/// Which write is held.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Write {
    Remove,
    RetryState,
    DeadLetter,
}

/// The first write of one kind stops until the test releases it (a slow disk, under the test's
/// control).
struct Hold {
    kind: Write,
    entered: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    release: Mutex<mpsc::Receiver<()>>,
    done: AtomicBool,
}

impl Hold {
    fn at(&self, kind: Write) {
        if kind != self.kind {
            return;
        }
        let Some(tx) = self.entered.lock().unwrap().take() else {
            return;
        };
        let _ = tx.send(());
        let _ = self.release.lock().unwrap().recv_timeout(HOLD_AT_MOST);
        self.done.store(true, Ordering::SeqCst);
    }
}

struct SlowStore {
    inner: MemoryStore,
    letters: Arc<SlowLetters>,
    hold: Arc<Hold>,
}

struct SlowLetters {
    inner: MemoryDeadLetters,
    hold: Arc<Hold>,
}

impl Store for SlowStore {
    fn load(&self) -> Result<Snapshot, StoreError> {
        self.inner.load()
    }
    fn pending(&self, queue: QueueId) -> Result<Vec<StoredEvent>, StoreError> {
        self.inner.pending(queue)
    }
    fn get(&self, queue: QueueId, seqs: &[u64]) -> Result<Vec<Option<StoredEvent>>, StoreError> {
        self.inner.get(queue, seqs)
    }
    fn put_topic(&self, key: &str, record: &Value) -> Result<(), StoreError> {
        self.inner.put_topic(key, record)
    }
    fn delete_topic(&self, key: &str) -> Result<(), StoreError> {
        self.inner.delete_topic(key)
    }
    fn put_subscription(&self, topic: &str, q: QueueId, record: &Value) -> Result<(), StoreError> {
        self.inner.put_subscription(topic, q, record)
    }
    fn delete_subscription(&self, queue: QueueId) -> Result<(), StoreError> {
        self.inner.delete_subscription(queue)
    }
    fn next_queue_id(&self) -> Result<QueueId, StoreError> {
        self.inner.next_queue_id()
    }
    fn append(&self, items: &[(QueueId, StoredEvent)]) -> Result<(), StoreError> {
        self.inner.append(items)
    }
    fn commit(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        self.inner.commit()
    }
    fn update(&self, queue: QueueId, seqs: &[u64], state: RetryState) -> Result<(), StoreError> {
        self.hold.at(Write::RetryState);
        self.inner.update(queue, seqs, state)
    }
    fn remove(&self, queue: QueueId, seqs: &[u64]) -> Result<(), StoreError> {
        self.hold.at(Write::Remove);
        self.inner.remove(queue, seqs)
    }
    fn dead_letters(&self) -> Option<Arc<dyn DeadLetterStore>> {
        Some(self.letters.clone())
    }
}

impl DeadLetterStore for SlowLetters {
    fn put(
        &self,
        queue: QueueId,
        letter: DeadLetter,
        bound: DeadLetterBound,
    ) -> Result<usize, StoreError> {
        self.hold.at(Write::DeadLetter);
        self.inner.put(queue, letter, bound)
    }
    fn list(
        &self,
        queue: QueueId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        self.inner.list(queue, after, limit)
    }
    fn peek(&self, queue: QueueId, ids: Option<&[u64]>) -> Result<Vec<DeadLetter>, StoreError> {
        self.inner.peek(queue, ids)
    }
    fn take(&self, queue: QueueId, ids: Option<&[u64]>) -> Result<Vec<DeadLetter>, StoreError> {
        self.inner.take(queue, ids)
    }
    fn count(&self, queue: QueueId) -> usize {
        self.inner.count(queue)
    }
    fn bytes(&self) -> u64 {
        self.inner.bytes()
    }
    fn delete_queue(&self, queue: QueueId) -> Result<(), StoreError> {
        self.inner.delete_queue(queue)
    }
}

/// One subscription's attempt leads to a `kind` write that is held; meanwhile another
/// subscription publishes and delivers. The tests run gridlet on one runtime thread, as
/// `broker__workerThreads=1` does.
async fn a_held_write_does_not_stall_others(kind: Write) {
    let (entered_tx, entered) = tokio::sync::oneshot::channel();
    let (release, release_rx) = mpsc::channel();
    let hold = Arc::new(Hold {
        kind,
        entered: Mutex::new(Some(entered_tx)),
        release: Mutex::new(release_rx),
        done: AtomicBool::new(false),
    });
    let store = Arc::new(SlowStore {
        inner: MemoryStore::new(),
        letters: Arc::new(SlowLetters {
            inner: MemoryDeadLetters::new(),
            hold: hold.clone(),
        }),
        hold: hold.clone(),
    });
    let t = start_with(
        &[],
        Parts {
            store: Some(store),
            ..Parts::default()
        },
    )
    .await;
    let mut slow_rx = Receiver::start().await;
    slow_rx.respond_with(if kind == Write::Remove { 200 } else { 503 });
    let mut live_rx = Receiver::start().await;
    t.topic("slow").await;
    t.topic("live").await;
    // One attempt: a failure is dead-lettered at once.
    let attempts = if kind == Write::DeadLetter { 1 } else { 30 };
    let persisted = json!({"persistencePolicy": {"isPersisted": true},
        "retryPolicy": {"maxDeliveryAttempts": attempts}});
    t.webhook_sub("slow", "s", &slow_rx.url("/slow"), persisted)
        .await;
    t.webhook_sub("live", "s", &live_rx.url("/live"), json!({}))
        .await;

    t.publish("slow", json!([eg_event("x1", "s", "type", json!({}))]))
        .await;
    slow_rx.next().await;
    tokio::time::timeout(Duration::from_secs(5), entered)
        .await
        .expect("the held write started")
        .unwrap();

    t.publish("live", json!([eg_event("l1", "s", "type", json!({}))]))
        .await;
    assert_eq!(live_rx.next().await.json()[0]["id"], "l1");
    assert!(
        !hold.done.load(Ordering::SeqCst),
        "the other subscription's delivery had to wait for the held {kind:?} write"
    );
    release.send(()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_slow_removal_of_a_delivered_event_does_not_stall_other_deliveries() {
    a_held_write_does_not_stall_others(Write::Remove).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_slow_retry_state_write_does_not_stall_other_deliveries() {
    a_held_write_does_not_stall_others(Write::RetryState).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_slow_dead_letter_write_does_not_stall_other_deliveries() {
    a_held_write_does_not_stall_others(Write::DeadLetter).await;
}
