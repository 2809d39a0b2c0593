//! Resilience state across real restarts with the default sled store: dead letters of
//! persisted subscriptions (listed, replayed, ids increasing) and frozen endpoints.
//!
//! A restart is `Gridlet::shutdown` and a new `Gridlet::start` on the same directories; wall
//! time is moved with `Clock::anchored_at`, never by sleeping.

use crate::node::*;
use crate::util::*;
use serde_json::{json, Value};
use std::time::Duration;

const S1: &str = "/topics/t1/eventSubscriptions/s1";

impl Node {
    async fn send(&self, req: reqwest::RequestBuilder) -> (u16, Value) {
        let r = req.send().await.unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.send(self.client.post(self.url(path)).json(&body))
            .await
    }

    async fn setup(&self, url: &str, extra: Value) {
        assert_eq!(self.put("/topics/t1", json!({})).await.0, 200);
        let mut props = json!({
            "destination": {"endpointType": "WebHook", "properties": {"endpointUrl": url}}
        });
        if let (Some(p), Some(e)) = (props.as_object_mut(), extra.as_object()) {
            p.extend(e.clone());
        }
        let (s, b) = self.put(S1, json!({ "properties": props })).await;
        assert_eq!(s, 200, "{b}");
    }

    async fn publish_one(&self, id: &str) {
        let body = json!([eg_event(id, "s", "t", json!({"n": id}))]);
        let (s, b) = self.post("/topics/t1/events", body).await;
        assert_eq!(s, 200, "{b}");
    }

    /// `(id, event id, reason)` of every dead letter, oldest first.
    async fn dead_letters(&self) -> Vec<(u64, String, String)> {
        let v = self.get(&format!("{S1}/deadLetters")).await;
        v["value"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                (
                    l["id"].as_str().unwrap().parse().unwrap(),
                    l["eventId"].as_str().unwrap().to_string(),
                    l["reason"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }
}

fn ids_of(v: &[Received]) -> Vec<String> {
    let mut ids: Vec<String> = v
        .iter()
        .flat_map(|r| r.json().as_array().unwrap().clone())
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

async fn receive(rx: &mut Receiver, events: usize) -> Vec<String> {
    let mut got = Vec::new();
    while ids_of(&got).len() < events {
        got.push(rx.next().await);
    }
    ids_of(&got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_of_a_persisted_subscription_survive_restarts_and_replay() {
    let dir = tempfile::tempdir().unwrap();
    let mut rx = Receiver::start().await;
    rx.respond_with(500);
    let sub = json!({"persistencePolicy": {"isPersisted": true},
                     "retryPolicy": {"maxDeliveryAttempts": 1}});

    // Two events fail their only attempt: dead letters (and gone from the event store).
    let n = node(dir.path(), &[], Some(T0)).await;
    n.setup(&rx.url("/p"), sub).await;
    n.publish_one("e1").await;
    n.publish_one("e2").await;
    receive(&mut rx, 2).await;
    n.wait_metric("gridlet_dead_lettered_events_total", SUB, 2)
        .await;
    let before = n.dead_letters().await;
    assert_eq!(before.len(), 2);
    n.stop().await;

    // After a restart: the same letters (ids, reasons), and the events are not redelivered.
    let n = node(dir.path(), &[], Some(T0 + MIN)).await;
    assert_eq!(n.dead_letters().await, before);
    assert_eq!(before[0].2, "MaxDeliveryAttemptsExceeded");
    assert_eq!(n.metric("gridlet_dead_letters", SUB).await, 2);
    rx.nothing_within(Duration::from_millis(500)).await;
    // A new dead letter gets a higher id than any before the restart.
    n.publish_one("e3").await;
    receive(&mut rx, 1).await;
    n.wait_metric("gridlet_dead_letters", SUB, 3).await;
    let all = n.dead_letters().await;
    assert_eq!(all.len(), 3);
    assert!(all[2].0 > before[1].0, "{all:?}");
    // Replay one by id: delivered, and no longer listed. (e1 and e2 fail concurrently, so
    // either can be the first letter: pick e1's by its event id.)
    rx.respond_with(200);
    let e1 = before.iter().find(|l| l.1 == "e1").expect("e1's letter").0;
    let (s, b) = n
        .post(&format!("{S1}/deadLetters/{e1}/replay"), json!({}))
        .await;
    assert_eq!((s, b["replayed"].as_u64()), (200, Some(1)), "{b}");
    assert_eq!(receive(&mut rx, 1).await, vec!["e1"]);
    n.wait_metric("DeliverySuccessCounts", SUB, 1).await;
    n.stop().await;

    // The replay's removal is durable too; replay the rest after another restart.
    let n = node(dir.path(), &[], Some(T0 + 2 * MIN)).await;
    let left = n.dead_letters().await;
    assert_eq!(
        left.iter().map(|l| l.1.as_str()).collect::<Vec<_>>(),
        vec!["e2", "e3"]
    );
    rx.nothing_within(Duration::from_millis(300)).await;
    let (s, b) = n.post(&format!("{S1}/deadLetters/replay"), json!({})).await;
    assert_eq!((s, b["replayed"].as_u64()), (200, Some(2)), "{b}");
    assert_eq!(receive(&mut rx, 2).await, vec!["e2", "e3"]);
    n.wait_metric("DeliverySuccessCounts", SUB, 2).await;
    n.stop().await;

    // Nothing left, nothing delivered twice; ids continue above every id ever used even though
    // no letter is stored any more.
    let n = node(dir.path(), &[], Some(T0 + 3 * MIN)).await;
    assert!(n.dead_letters().await.is_empty());
    rx.nothing_within(Duration::from_millis(500)).await;
    rx.respond_with(500);
    n.publish_one("e4").await;
    receive(&mut rx, 1).await;
    n.wait_metric("gridlet_dead_letters", SUB, 1).await;
    let last = n.dead_letters().await;
    assert_eq!(last.len(), 1);
    assert!(last[0].0 > all[2].0, "{last:?} after {all:?}");
    n.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_that_expire_while_stopped_become_dead_letters() {
    let dir = tempfile::tempdir().unwrap();
    let mut rx = Receiver::start().await;
    rx.respond_with(500);
    let n = node(dir.path(), &[], Some(T0)).await;
    n.setup(
        &rx.url("/p"),
        json!({"persistencePolicy": {"isPersisted": true},
               "retryPolicy": {"eventExpiryInMinutes": 30, "maxDeliveryAttempts": 30}}),
    )
    .await;
    n.publish_one("e1").await;
    rx.next().await;
    n.wait_metric("DeliveryFailureCounts", SUB, 1).await;
    n.stop().await;

    // 31 minutes later the event is past its TTL: kept as a dead letter, not delivered.
    let n = node(dir.path(), &[], Some(T0 + 31 * MIN)).await;
    let dl = n.dead_letters().await;
    assert_eq!(dl.len(), 1);
    assert_eq!(
        (dl[0].1.as_str(), dl[0].2.as_str()),
        ("e1", "TimeToLiveExceeded")
    );
    rx.nothing_within(Duration::from_millis(500)).await;
    n.stop().await;
    // And it stays one after the next restart.
    let n = node(dir.path(), &[], Some(T0 + 32 * MIN)).await;
    assert_eq!(n.dead_letters().await, dl);
    n.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_endpoint_stays_frozen_across_restarts_until_enabled() {
    let dir = tempfile::tempdir().unwrap();
    let mut rx = Receiver::start().await;
    rx.respond_with(500);
    // Frozen straight from closed after more than 2 consecutive failures.
    let health = [
        ("broker__endpointHealth__disableConsecutiveFailures", "100"),
        ("broker__endpointHealth__freezeAnyConsecutiveFailures", "2"),
    ];
    let n = node(dir.path(), &health, Some(T0)).await;
    n.setup(
        &rx.url("/h"),
        json!({"persistencePolicy": {"isPersisted": true},
               "retryPolicy": {"maxDeliveryAttempts": 1}}),
    )
    .await;
    for i in 0..3 {
        n.publish_one(&format!("f{i}")).await;
        rx.next().await;
    }
    n.wait_metric("gridlet_endpoint_health_state", SUB, 2).await;
    // A persisted event waits for the frozen endpoint.
    n.publish_one("w").await;
    rx.nothing_within(Duration::from_millis(300)).await;
    n.stop().await;

    // Restarted (the endpoint works again meanwhile): still frozen, nothing is sent.
    rx.respond_with(200);
    let n = node(dir.path(), &health, Some(T0 + 5 * MIN)).await;
    let h = n.get(&format!("{S1}/endpointHealth")).await;
    assert_eq!(h["state"], "Frozen", "{h}");
    assert_eq!(h["consecutiveFailures"], 3);
    let sub = n.get(S1).await;
    assert_eq!(sub["properties"]["endpointHealth"]["state"], "Frozen");
    assert_eq!(n.metric("gridlet_endpoint_health_state", SUB).await, 2);
    // Restored as anything but frozen, the waiting event would go at start (probes are 10 min apart).
    rx.nothing_within(Duration::from_millis(500)).await;
    n.stop().await;

    // Still frozen after a second restart; re-enabled through the API: the waiting event goes.
    let n = node(dir.path(), &health, Some(T0 + 10 * MIN)).await;
    assert_eq!(
        n.get(&format!("{S1}/endpointHealth")).await["state"],
        "Frozen"
    );
    let (s, h) = n
        .post(&format!("{S1}/endpointHealth/enable"), json!({}))
        .await;
    assert_eq!((s, h["state"].clone()), (200, json!("Enabled")), "{h}");
    assert_eq!(rx.next().await.json()[0]["id"], "w");
    n.wait_metric("DeliverySuccessCounts", SUB, 1).await;
    n.stop().await;

    // Re-enabling is durable as well.
    let n = node(dir.path(), &health, Some(T0 + 11 * MIN)).await;
    let h = n.get(&format!("{S1}/endpointHealth")).await;
    assert_eq!(h["state"], "Enabled", "{h}");
    assert_eq!(h["consecutiveFailures"], 0);
    rx.nothing_within(Duration::from_millis(300)).await;
    n.stop().await;
}

/// The memory store, except that every commit waits until the test opens the gate: a slow
/// journal flush under the test's control.
pub(crate) struct GatedCommits {
    pub(crate) inner: gridlet::store::memory::MemoryStore,
    pub(crate) entered: tokio::sync::watch::Sender<bool>,
    pub(crate) open: tokio::sync::watch::Receiver<bool>,
}

impl gridlet::store::Store for GatedCommits {
    fn load(&self) -> Result<gridlet::store::Snapshot, gridlet::store::StoreError> {
        self.inner.load()
    }
    fn pending_runs(
        &self,
        queue: gridlet::store::QueueId,
    ) -> Result<gridlet::store::PendingRuns, gridlet::store::StoreError> {
        self.inner.pending_runs(queue)
    }
    fn get(
        &self,
        queue: gridlet::store::QueueId,
        seqs: &[u64],
    ) -> Result<Vec<Option<gridlet::store::StoredEvent>>, gridlet::store::StoreError> {
        self.inner.get(queue, seqs)
    }
    fn put_topic(
        &self,
        key: &str,
        record: &gridlet::model::record::TopicRecord,
    ) -> Result<(), gridlet::store::StoreError> {
        self.inner.put_topic(key, record)
    }
    fn delete_topic(&self, key: &str) -> Result<(), gridlet::store::StoreError> {
        self.inner.delete_topic(key)
    }
    fn put_subscription(
        &self,
        queue: gridlet::store::QueueId,
        record: &gridlet::model::record::SubscriptionRecord,
    ) -> Result<(), gridlet::store::StoreError> {
        self.inner.put_subscription(queue, record)
    }
    fn delete_subscription(
        &self,
        queue: gridlet::store::QueueId,
    ) -> Result<(), gridlet::store::StoreError> {
        self.inner.delete_subscription(queue)
    }
    fn next_queue_id(&self) -> Result<gridlet::store::QueueId, gridlet::store::StoreError> {
        self.inner.next_queue_id()
    }
    fn commit(
        &self,
    ) -> futures_util::future::BoxFuture<'_, Result<(), gridlet::store::StoreError>> {
        Box::pin(async move {
            let _ = self.entered.send(true);
            let mut open = self.open.clone();
            let _ = open.wait_for(|o| *o).await;
            self.inner.commit().await
        })
    }
    fn submit(
        &self,
        items: Vec<(gridlet::store::QueueId, gridlet::store::StoredEvent)>,
    ) -> Result<gridlet::store::Commit, gridlet::store::StoreError> {
        // The memory store's commit is done at once; this one waits for the gate.
        drop(self.inner.submit(items)?);
        let _ = self.entered.send(true);
        let mut open = self.open.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let _ = open.wait_for(|o| *o).await;
            let _ = tx.send(Ok(()));
        });
        Ok(gridlet::store::Commit::pending(rx))
    }
    fn stage(
        &self,
        writes: gridlet::store::Writes<'_>,
        answer: gridlet::store::Answer,
    ) -> Result<gridlet::store::Commit, gridlet::store::StoreError> {
        match writes {
            gridlet::store::Writes::Events(items) => self.submit(items),
            other => self.inner.stage(other, answer),
        }
    }
    fn put_endpoint_health(
        &self,
        url: &str,
        record: Option<&Value>,
    ) -> Result<(), gridlet::store::StoreError> {
        self.inner.put_endpoint_health(url, record)
    }
    fn dead_letters(
        &self,
    ) -> Option<std::sync::Arc<dyn gridlet::store::deadletter::DeadLetterStore>> {
        self.inner.dead_letters()
    }
}

/// A client that gives up while its publish is being committed does not lose the event: the
/// commit finishes, and the event is queued and delivered without a restart.
#[tokio::test]
async fn a_publish_whose_client_gives_up_during_the_commit_is_still_delivered() {
    let (entered_tx, mut entered) = tokio::sync::watch::channel(false);
    let (open_tx, open) = tokio::sync::watch::channel(false);
    let store = std::sync::Arc::new(GatedCommits {
        inner: gridlet::store::memory::MemoryStore::new(),
        entered: entered_tx,
        open,
    });
    let t = start_with(
        &[],
        gridlet::Parts {
            store: Some(store),
            ..gridlet::Parts::default()
        },
    )
    .await;
    let mut rx = Receiver::start().await;
    t.topic("t1").await;
    let persisted = json!({"persistencePolicy": {"isPersisted": true}});
    t.webhook_sub("t1", "s1", &rx.url("/s1"), persisted).await;

    // The client sends its publish and hangs up once the commit has started.
    let body = json!([eg_event("gave-up", "s", "t", json!({}))]);
    let request = tokio::spawn(t.client.post(t.url("/topics/t1/events")).json(&body).send());
    entered.wait_for(|e| *e).await.unwrap();
    request.abort();
    let _ = request.await;
    // Let the server notice the closed connection before the commit ends.
    tokio::time::sleep(Duration::from_millis(200)).await;
    open_tx.send(true).unwrap();

    let got = rx.next().await;
    assert_eq!(got.json()[0]["id"], "gave-up");
}

/// A client that gives up while its dead-letter replay is being committed does not lose the
/// replayed event: it is queued and delivered without a restart (and no longer listed).
#[tokio::test]
async fn a_replay_whose_client_gives_up_during_the_commit_is_still_delivered() {
    let (entered_tx, mut entered) = tokio::sync::watch::channel(false);
    let (open_tx, open) = tokio::sync::watch::channel(true);
    let store = std::sync::Arc::new(GatedCommits {
        inner: gridlet::store::memory::MemoryStore::new(),
        entered: entered_tx,
        open,
    });
    let t = start_with(
        &[],
        gridlet::Parts {
            store: Some(store.clone()),
            ..gridlet::Parts::default()
        },
    )
    .await;
    let mut rx = Receiver::start().await;
    rx.respond_with(400);
    t.topic("t1").await;
    let sub = json!({"persistencePolicy": {"isPersisted": true},
                     "retryPolicy": {"maxDeliveryAttempts": 1}});
    t.webhook_sub("t1", "s1", &rx.url("/s1"), sub).await;
    t.publish("t1", json!([eg_event("replayed", "s", "t", json!({}))]))
        .await;
    rx.next().await;
    let letters = eventually("a dead letter", || async {
        let (_, v) = t.get(&format!("{S1}/deadLetters")).await;
        if v["value"].as_array().is_some_and(|a| !a.is_empty()) {
            Ok(v)
        } else {
            Err(v.to_string())
        }
    })
    .await;
    assert_eq!(letters["value"][0]["eventId"], "replayed");

    // Commits now wait; the client asks for the replay and hangs up once the commit started.
    rx.respond_with(200);
    open_tx.send(false).unwrap();
    store.entered.send(false).unwrap();
    let request = tokio::spawn(
        t.client
            .post(t.url(&format!("{S1}/deadLetters/replay")))
            .json(&json!({}))
            .send(),
    );
    entered.wait_for(|e| *e).await.unwrap();
    request.abort();
    let _ = request.await;
    // Let the server notice the closed connection before the commit ends.
    tokio::time::sleep(Duration::from_millis(200)).await;
    open_tx.send(true).unwrap();

    let got = rx.next().await;
    assert_eq!(got.json()[0]["id"], "replayed");
}

/// Issue 34: a restart during an uplink outage changes nothing. The outage is stored with the
/// endpoint's record: restarted before the next probe is due, nothing goes (though the endpoint
/// is back); restarted after it, the probe goes at once and every waiting event follows, each
/// once and uncharged (`aeg-delivery-count: 0`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_during_an_outage_keeps_it_and_the_events_drain_on_return() {
    use axum::http::HeaderMap;
    let dir = tempfile::tempdir().unwrap();
    // A port nothing listens on, yet.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/hook");
    let n = node(dir.path(), &[], Some(T0)).await;
    n.setup(&url, json!({"persistencePolicy": {"isPersisted": true}}))
        .await;
    for i in 0..3 {
        n.publish_one(&format!("o{i}")).await;
    }
    n.wait_metric("gridlet_endpoint_outage", SUB, 1).await;
    n.stop().await;

    // The endpoint comes back; gridlet restarts 10 s into the outage: the next probe is 20 s
    // away, and nothing goes before it.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Value, String)>();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |h: HeaderMap, body: String| {
            let tx = tx.clone();
            async move {
                let count = h
                    .get("aeg-delivery-count")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                let _ = tx.send((serde_json::from_str(&body).unwrap(), count));
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let n = node(dir.path(), &[], Some(T0 + 10_000)).await;
    assert_eq!(n.metric("gridlet_endpoint_outage", SUB).await, 1);
    assert_eq!(n.metric("gridlet_endpoint_health_state", SUB).await, 0);
    assert_eq!(n.metric("gridlet_pending_events", SUB).await, 3);
    assert!(
        tokio::time::timeout(Duration::from_millis(500), rx.recv())
            .await
            .is_err(),
        "nothing before the probe is due"
    );
    n.stop().await;

    // Restarted after it: the probe, then everything, each once.
    let n = node(dir.path(), &[], Some(T0 + 5 * MIN)).await;
    let mut ids = Vec::new();
    while ids.len() < 3 {
        let (batch, count) = tokio::time::timeout(WAIT, rx.recv())
            .await
            .expect("deliveries")
            .unwrap();
        assert_eq!(count, "0", "an outage charges no attempt");
        for e in batch.as_array().unwrap() {
            ids.push(e["id"].as_str().unwrap().to_string());
        }
    }
    ids.sort();
    assert_eq!(ids, ["o0", "o1", "o2"]);
    n.wait_metric("DeliverySuccessCounts", SUB, 3).await;
    assert_eq!(n.metric("gridlet_endpoint_outage", SUB).await, 0);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), rx.recv())
            .await
            .is_err(),
        "no duplicates"
    );
    n.stop().await;
}
