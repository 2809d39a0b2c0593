//! Writes that can be slow on an SD card never hold up the async runtime: metadata writes
//! (subscriptions, endpoint-health transitions) and the store writes that follow a delivery
//! attempt (removing a delivered event, recording a retry's state, keeping a dead letter). Each
//! test holds one such write in a store under its control, on one runtime thread (as
//! `broker__workerThreads=1` runs gridlet), while another subscription publishes and delivers.

use crate::util::*;
use gridlet::model::record::{SubscriptionRecord, TopicRecord};
use gridlet::store::deadletter::DeadLetterStore;
use gridlet::store::memory::MemoryStore;
use gridlet::store::{
    Answer, Commit, PendingRuns, QueueId, Settlement, Snapshot, Store, StoreError, StoredEvent,
    Writes,
};
use gridlet::Parts;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// How long a held write waits for the test to release it before going on regardless. The
/// passing run releases it long before; a broker that blocks its only runtime thread on the write
/// cannot be released, so the write goes on after this and the test then fails on the order.
const HOLD_AT_MOST: Duration = Duration::from_secs(10);

/// Which write the store holds.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Write {
    Subscription,
    EndpointHealth,
    Remove,
    RetryState,
    DeadLetter,
}

/// The first write of one kind (mentioning `held`, for metadata writes) stops until the test
/// releases it: a slow disk, under the test's control.
struct Hold {
    kind: Write,
    held: &'static str,
    entered: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    release: Mutex<mpsc::Receiver<()>>,
    /// Set once the held write went through.
    done: AtomicBool,
}

impl Hold {
    fn at(&self, kind: Write, text: &str) {
        if kind != self.kind || !text.contains(self.held) {
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

/// The memory store (its dead letters included) with one kind of write held, on the caller's
/// thread: a store that does not stage in memory (the default of
/// `Store::stages_in_memory`), as a slow disk would be.
struct SlowStore {
    inner: MemoryStore,
    hold: Arc<Hold>,
}

impl SlowStore {
    /// A store holding the first `kind` write (mentioning `held`), the signal that it started,
    /// and the release.
    fn new(
        kind: Write,
        held: &'static str,
    ) -> (
        Arc<Self>,
        tokio::sync::oneshot::Receiver<()>,
        mpsc::Sender<()>,
    ) {
        let (entered_tx, entered) = tokio::sync::oneshot::channel();
        let (release, release_rx) = mpsc::channel();
        let hold = Arc::new(Hold {
            kind,
            held,
            entered: Mutex::new(Some(entered_tx)),
            release: Mutex::new(release_rx),
            done: AtomicBool::new(false),
        });
        let store = Arc::new(Self {
            inner: MemoryStore::new(),
            hold,
        });
        (store, entered, release)
    }

    /// A gridlet on this store, with `extra` settings.
    async fn serve(self: &Arc<Self>, extra: &[(&str, &str)]) -> TestGridlet {
        let parts = Parts {
            store: Some(self.clone()),
            ..Parts::default()
        };
        start_with(extra, parts).await
    }

    fn done(&self) -> bool {
        self.hold.done.load(Ordering::SeqCst)
    }
}

impl Store for SlowStore {
    fn load(&self) -> Result<Snapshot, StoreError> {
        self.inner.load()
    }
    fn pending_runs(&self, queue: QueueId) -> Result<PendingRuns, StoreError> {
        self.inner.pending_runs(queue)
    }
    fn get(&self, queue: QueueId, seqs: &[u64]) -> Result<Vec<Option<StoredEvent>>, StoreError> {
        self.inner.get(queue, seqs)
    }
    fn put_topic(&self, key: &str, record: &TopicRecord) -> Result<(), StoreError> {
        self.inner.put_topic(key, record)
    }
    fn delete_topic(&self, key: &str) -> Result<(), StoreError> {
        self.inner.delete_topic(key)
    }
    fn put_subscription(&self, q: QueueId, record: &SubscriptionRecord) -> Result<(), StoreError> {
        let text = serde_json::to_string(record).unwrap_or_default();
        self.hold.at(Write::Subscription, &text);
        self.inner.put_subscription(q, record)
    }
    fn delete_subscription(&self, queue: QueueId) -> Result<(), StoreError> {
        self.inner.delete_subscription(queue)
    }
    fn next_queue_id(&self) -> Result<QueueId, StoreError> {
        self.inner.next_queue_id()
    }
    fn stage(&self, writes: Writes<'_>, answer: Answer) -> Result<Commit, StoreError> {
        match &writes {
            Writes::Settle(_, settlements) => {
                for s in settlements.iter() {
                    match s {
                        Settlement::Retry(..) => self.hold.at(Write::RetryState, ""),
                        Settlement::Remove(_) => self.hold.at(Write::Remove, ""),
                    }
                }
            }
            Writes::Letters(..) => self.hold.at(Write::DeadLetter, ""),
            _ => {}
        }
        self.inner.stage(writes, answer)
    }
    fn dead_letters(&self) -> Option<Arc<dyn DeadLetterStore>> {
        self.inner.dead_letters()
    }
    fn put_endpoint_health(&self, url: &str, record: Option<&Value>) -> Result<(), StoreError> {
        self.hold.at(Write::EndpointHealth, url);
        self.inner.put_endpoint_health(url, record)
    }
}

/// One runtime thread, as `broker__workerThreads=1` runs gridlet: a management write that
/// blocked it would stop everything else.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_slow_subscription_write_does_not_stall_publishing_or_delivery() {
    let (store, entered, release) = SlowStore::new(Write::Subscription, "held-subscriber");
    let t = store.serve(&[]).await;
    let mut rx = Receiver::start().await;
    t.topic("t").await;
    t.webhook_sub("t", "live", &rx.url("/live"), json!({}))
        .await;

    // A subscription PUT whose metadata write is held.
    let body = json!({"properties": {"destination": {"endpointType": "WebHook",
        "properties": {"endpointUrl": rx.url("/held-subscriber")}}}});
    let put = tokio::spawn(
        t.client
            .put(t.url("/topics/t/eventSubscriptions/slow"))
            .json(&body)
            .send(),
    );
    entered.await.expect("the subscription write started");

    // Meanwhile: publish, and the live subscription's event is delivered.
    t.publish("t", json!([eg_event("e1", "s", "type", json!({}))]))
        .await;
    let got = rx.next().await;
    assert_eq!(got.json()[0]["id"], "e1");
    assert!(
        !store.done() && !put.is_finished(),
        "the publish had to wait for the held subscription write"
    );

    release.send(()).unwrap();
    assert_eq!(put.await.unwrap().unwrap().status(), 200);
    let (s, _) = t.get("/topics/t/eventSubscriptions/slow").await;
    assert_eq!(s, 200);
}

/// An endpoint turning unhealthy writes its new state; on one runtime thread, that write must
/// not stop another subscription's publishes and deliveries.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_slow_endpoint_health_write_does_not_stall_other_deliveries() {
    let (store, entered, release) = SlowStore::new(Write::EndpointHealth, "held-endpoint");
    let t = store
        .serve(&[("broker__endpointHealth__disableConsecutiveFailures", "1")])
        .await;
    let mut failing = Receiver::start().await;
    failing.respond_with(500);
    let mut healthy = Receiver::start().await;
    t.topic("bad").await;
    t.topic("good").await;
    let once = json!({"retryPolicy": {"maxDeliveryAttempts": 1}});
    t.webhook_sub("bad", "s", &failing.url("/held-endpoint"), once)
        .await;
    t.webhook_sub("good", "s", &healthy.url("/ok"), json!({}))
        .await;

    // Failures until the endpoint is disabled (at the first or the second, whichever the
    // threshold counts); writing that transition is held.
    for i in 0..2 {
        t.publish(
            "bad",
            json!([eg_event(&format!("b{i}"), "s", "type", json!({}))]),
        )
        .await;
    }
    failing.next().await;
    entered.await.expect("the endpoint-health write started");

    t.publish("good", json!([eg_event("g1", "s", "type", json!({}))]))
        .await;
    assert_eq!(healthy.next().await.json()[0]["id"], "g1");
    assert!(
        !store.done(),
        "the other subscription's delivery had to wait for the held health write"
    );
    release.send(()).unwrap();
}

/// One subscription's attempt leads to a `kind` write that is held; meanwhile another
/// subscription publishes and delivers. The tests run gridlet on one runtime thread, as
/// `broker__workerThreads=1` does.
async fn a_held_write_does_not_stall_others(kind: Write) {
    let (store, entered, release) = SlowStore::new(kind, "");
    let t = store.serve(&[]).await;
    let mut slow_rx = Receiver::start().await;
    slow_rx.respond_with(if kind == Write::Remove { 200 } else { 500 });
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
        !store.done(),
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
