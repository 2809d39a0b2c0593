//! Pull delivery's timing on tokio's paused clock (no sleeps in real time): lock expiry and
//! redelivery with `deliveryCount` 2, renewal, release delays, `maxDeliveryCount` and the
//! time to live ending in dead letters, and the bound on locks. The broker runs in process with
//! the memory store; the wire is covered in `pull.rs`.

use gridlet::broker::Broker;
use gridlet::clock::Clock;
use gridlet::delivery::sink::{DeliveryRequest, Outcome, Sink, SinkFactory};
use gridlet::model::event::{parse, PublishInput};
use gridlet::model::subscription::Subscription;
use gridlet::model::topic::{EventSchema, Topic};
use gridlet::store::memory::MemoryStore;
use gridlet::Config;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// No push subscription here: a sink that is never used.
pub(crate) struct NoSinks;

struct Never;

impl Sink for Never {
    fn send<'a>(&'a self, _: &'a DeliveryRequest) -> futures_util::future::BoxFuture<'a, Outcome> {
        Box::pin(std::future::pending())
    }
}

impl SinkFactory for NoSinks {
    fn create(&self, _: &Subscription) -> Arc<dyn Sink> {
        Arc::new(Never)
    }
}

/// The wall time the tests start at.
pub(crate) const T0: u64 = 1_700_000_000_000;

fn open(extra: &[(&str, &str)], queue: Value) -> Broker {
    let vars = extra.iter().map(|(k, v)| (k.to_string(), v.to_string()));
    let broker = Broker::open(
        Arc::new(Config::from_vars(vars).unwrap()),
        Arc::new(MemoryStore::new()),
        Arc::new(NoSinks),
        Clock::anchored_at(T0),
    )
    .unwrap();
    create(&broker, queue);
    broker
}

/// A CloudEvents topic `q` with a queue subscription `s` (persisted: the default).
pub(crate) fn create(broker: &Broker, queue: Value) {
    broker
        .put_topic(
            Topic::from_put(
                "q",
                json!({"properties":{"inputSchema":"CloudEventSchemaV1_0"}}),
            )
            .unwrap(),
        )
        .unwrap();
    broker
        .put_subscription(
            "q",
            "s",
            json!({"properties":{"deliveryConfiguration":{"deliveryMode":"Queue","queue":queue}}}),
        )
        .unwrap();
}

pub(crate) async fn publish(b: &Broker, ids: &[&str]) {
    let events: Vec<Value> = ids
        .iter()
        .map(|id| json!({"specversion":"1.0","id":id,"source":"/t","type":"t"}))
        .collect();
    let body = bytes::Bytes::from(serde_json::to_vec(&events).unwrap());
    let headers = Default::default();
    let parsed = parse(&PublishInput {
        schema: EventSchema::CloudEventV1_0,
        topic: "q",
        headers: &headers,
        body: &body,
        single_id: None,
        max_events: 1000,
    })
    .unwrap();
    b.publish(&b.topic("q").unwrap(), parsed, None)
        .await
        .unwrap();
}

/// Receive up to `max` (no wait): `(id, deliveryCount, token)`.
pub(crate) async fn receive(b: &Broker, max: usize) -> Vec<(String, u32, String)> {
    let h = b.find_subscription("q", "s").unwrap();
    let got = h
        .pull()
        .unwrap()
        .receive(max, Duration::ZERO)
        .await
        .unwrap();
    got.into_iter()
        .map(|r| {
            let v: Value = serde_json::from_slice(&r.body).unwrap();
            (
                v["id"].as_str().unwrap().to_string(),
                r.delivery_count,
                r.lock_token,
            )
        })
        .collect()
}

fn dead_letters(b: &Broker) -> u64 {
    b.find_subscription("q", "s")
        .unwrap()
        .metrics()
        .dead_lettered
        .get()
}

async fn advance(d: Duration) {
    tokio::time::sleep(d).await;
}

const MIN: Duration = Duration::from_secs(60);

#[tokio::test(start_paused = true)]
async fn an_expired_lock_redelivers_with_delivery_count_two() {
    let b = open(&[], json!({})); // lock: 60 s
    publish(&b, &["a"]).await;
    let first = receive(&b, 1).await;
    assert_eq!(first[0].1, 1);
    advance(MIN - Duration::from_secs(1)).await;
    assert!(receive(&b, 1).await.is_empty(), "still locked");
    advance(Duration::from_secs(2)).await;
    let again = receive(&b, 1).await;
    assert_eq!((again[0].0.as_str(), again[0].1), ("a", 2));
    // The first receive's token is lost; the second's settles.
    let h = b.find_subscription("q", "s").unwrap();
    let p = h.pull().unwrap();
    let r = p.acknowledge(&[first[0].2.clone()]).await.unwrap();
    assert_eq!(r.failed.len(), 1);
    let r = p.acknowledge(&[again[0].2.clone()]).await.unwrap();
    assert_eq!(r.succeeded.len(), 1);
    assert_eq!(h.metrics().lock_expired.get(), 1);
    assert_eq!(h.pending(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_renewed_lock_holds_another_lock_duration() {
    let b = open(&[], json!({"receiveLockDurationInSeconds": 120}));
    publish(&b, &["a"]).await;
    let got = receive(&b, 1).await;
    advance(Duration::from_secs(100)).await;
    let h = b.find_subscription("q", "s").unwrap();
    let r = h.pull().unwrap().renew(&[got[0].2.clone()]).unwrap();
    assert_eq!(r.succeeded.len(), 1);
    advance(Duration::from_secs(100)).await; // 200 s after the receive, 100 after the renewal
    assert!(receive(&b, 1).await.is_empty(), "renewed");
    assert_eq!(h.pull().unwrap().locked(), 1);
    advance(Duration::from_secs(21)).await;
    assert_eq!(
        receive(&b, 1).await[0].1,
        2,
        "expired 120 s after the renewal"
    );
}

#[tokio::test(start_paused = true)]
async fn a_release_with_a_delay_comes_back_after_it() {
    let b = open(&[], json!({}));
    publish(&b, &["a", "b"]).await;
    let got = receive(&b, 2).await;
    let h = b.find_subscription("q", "s").unwrap();
    let p = h.pull().unwrap();
    p.release(&[got[0].2.clone()], Duration::from_secs(600))
        .await
        .unwrap();
    p.release(&[got[1].2.clone()], Duration::ZERO)
        .await
        .unwrap();
    let now = receive(&b, 10).await;
    assert_eq!(
        now.iter().map(|e| (e.0.as_str(), e.1)).collect::<Vec<_>>(),
        [("b", 2)],
        "released at once: available again, its count kept (this is its second receive)"
    );
    p.acknowledge(&[now[0].2.clone()]).await.unwrap();
    // A waiting receive is answered when the delay ends.
    let waiter = {
        let h = h.clone();
        tokio::spawn(async move {
            let t0 = tokio::time::Instant::now();
            let got = h
                .pull()
                .unwrap()
                .receive(1, Duration::from_secs(3600))
                .await
                .unwrap();
            (t0.elapsed(), got)
        })
    };
    let (waited, got) = waiter.await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].delivery_count, 2);
    let v: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(v["id"], "a");
    assert!(
        waited >= Duration::from_secs(599) && waited <= Duration::from_secs(601),
        "{waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn max_delivery_count_and_time_to_live_end_in_dead_letters() {
    let b = open(
        &[],
        json!({"maxDeliveryCount": 2, "eventTimeToLive": "PT10M"}),
    );
    publish(&b, &["a"]).await;
    assert_eq!(receive(&b, 1).await[0].1, 1);
    advance(MIN + Duration::from_secs(1)).await;
    assert_eq!(receive(&b, 1).await[0].1, 2);
    advance(MIN + Duration::from_secs(1)).await;
    // Received twice, both locks expired: a dead letter, not a third delivery.
    assert!(receive(&b, 1).await.is_empty());
    let h = b.find_subscription("q", "s").unwrap();
    assert_eq!(h.metrics().dropped_max_attempts.get(), 1);
    // The time to live: an event never received expires 10 minutes after publication.
    publish(&b, &["old"]).await;
    advance(Duration::from_secs(601)).await;
    assert!(receive(&b, 1).await.is_empty());
    assert_eq!(h.metrics().dropped_expired.get(), 1);
    assert_eq!(h.pending(), 0);
    b.drain(Duration::from_secs(1)).await;
    assert_eq!(dead_letters(&b), 2);
}

#[tokio::test(start_paused = true)]
async fn locks_are_bounded_per_subscription() {
    let b = open(&[("broker__maxLocksPerSubscription", "3")], json!({}));
    publish(&b, &["a", "b", "c", "d", "e"]).await;
    assert_eq!(receive(&b, 2).await.len(), 2);
    assert_eq!(receive(&b, 10).await.len(), 1, "one lock left");
    assert!(receive(&b, 10).await.is_empty(), "bound reached");
    let h = b.find_subscription("q", "s").unwrap();
    assert_eq!(h.pull().unwrap().locked(), 3);
    assert_eq!(h.pending(), 5);
    advance(MIN + Duration::from_secs(1)).await;
    // Expired locks free their places; the redelivered come first (they are due).
    let got = receive(&b, 10).await;
    assert_eq!(got.len(), 3);
}

/// A persisted subscription keeps a window of its backlog in memory and reads the rest back
/// from the store: a receive that drains the window waits for the read (`READ_BACK_WAIT`), even
/// with `maxWaitTime` 0, instead of answering none while thousands wait. (A receive answered
/// at once let the loop below outrun the window's refill: an empty answer at 2,048 of 5,000.)
#[tokio::test(start_paused = true)]
async fn a_receive_waits_for_the_backlog_read_back_not_answering_none() {
    let b = open(&[], json!({}));
    for k in 0..5 {
        let ids: Vec<String> = (0..1000).map(|i| format!("e{}", k * 1000 + i)).collect();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        publish(&b, &ids).await;
    }
    let h = b.find_subscription("q", "s").unwrap();
    let p = h.pull().unwrap();
    let t0 = tokio::time::Instant::now();
    let mut total = 0;
    while total < 5000 {
        let got = receive(&b, 100).await;
        assert!(!got.is_empty(), "answered none after {total} of 5,000");
        total += got.len();
        let tokens: Vec<String> = got.into_iter().map(|e| e.2).collect();
        assert_eq!(
            p.acknowledge(&tokens).await.unwrap().succeeded.len(),
            tokens.len()
        );
    }
    assert!(
        receive(&b, 100).await.is_empty(),
        "drained: answered at once"
    );
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    assert_eq!(h.pending(), 0);
}
