//! Retry schedules on tokio's paused clock (docs/COMPATIBILITY.md behaviours 44–47, 49): no sleeping, no sockets.
//!
//! The broker runs with a channel-backed sink: each attempt arrives here with its virtual time,
//! and the test answers it. Paused time auto-advances to the next timer whenever every task is
//! idle, so a one-minute backoff takes no real time.

use bytes::Bytes;
use futures_util::future::BoxFuture;
use gridlet::broker::Broker;
use gridlet::clock::Clock;
use gridlet::delivery::sink::{DeliveryRequest, FailureKind, Outcome, Sink, SinkFactory};
use gridlet::model::event::{self, PublishInput};
use gridlet::model::subscription::Subscription;
use gridlet::model::topic::Topic;
use gridlet::store::memory::MemoryStore;
use gridlet::Config;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

struct Attempt {
    sub: String,
    at: Duration,
    ids: Vec<String>,
    attempt: u32,
    reply: oneshot::Sender<Outcome>,
}

struct ChannelSinks {
    tx: mpsc::UnboundedSender<Attempt>,
    t0: Instant,
}

struct ChannelSink {
    tx: mpsc::UnboundedSender<Attempt>,
    t0: Instant,
}

impl Sink for ChannelSink {
    fn send<'a>(&'a self, req: &'a DeliveryRequest) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            let (reply, rx) = oneshot::channel();
            let ids = req
                .events
                .iter()
                .map(|e| {
                    serde_json::from_slice::<Value>(e).unwrap()["id"]
                        .as_str()
                        .unwrap()
                        .to_string()
                })
                .collect();
            let _ = self.tx.send(Attempt {
                sub: req.subscription.to_string(),
                at: self.t0.elapsed(),
                ids,
                attempt: req.attempt,
                reply,
            });
            // A dropped reply means "hang" (the test never answers): wait forever.
            match rx.await {
                Ok(o) => o,
                Err(_) => std::future::pending().await,
            }
        })
    }
}

impl SinkFactory for ChannelSinks {
    fn create(&self, _sub: &Subscription) -> Arc<dyn Sink> {
        Arc::new(ChannelSink {
            tx: self.tx.clone(),
            t0: self.t0,
        })
    }
}

struct Harness {
    broker: Broker,
    rx: mpsc::UnboundedReceiver<Attempt>,
}

fn cfg(extra: &[(&str, &str)]) -> Arc<Config> {
    Arc::new(Config::from_vars(extra.iter().map(|(k, v)| (k.to_string(), v.to_string()))).unwrap())
}

impl Harness {
    fn new(extra: &[(&str, &str)]) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let sinks = Arc::new(ChannelSinks {
            tx,
            t0: Instant::now(),
        });
        let broker = Broker::open(
            cfg(extra),
            Arc::new(MemoryStore::new()),
            sinks,
            Clock::anchored_at(1_700_000_000_000),
        )
        .unwrap();
        broker
            .put_topic(Topic::from_put("t", json!({})).unwrap())
            .unwrap();
        Self { broker, rx }
    }

    fn sub(&self, name: &str, props: Value) {
        let mut body = json!({"properties":{"destination":{"endpointType":"WebHook","properties":{"endpointUrl":"https://x"}}}});
        for (k, v) in props.as_object().unwrap() {
            body["properties"][k] = v.clone();
        }
        self.broker.put_subscription("t", name, body).unwrap();
    }

    async fn publish(&self, n: usize) {
        let events: Vec<Value> = (0..n)
            .map(|i| json!({"id":format!("e{i}"),"subject":"s","eventType":"e","eventTime":"t","dataVersion":"1"}))
            .collect();
        let body = Bytes::from(serde_json::to_vec(&events).unwrap());
        let headers = Default::default();
        let parsed = event::parse(&PublishInput {
            schema: gridlet::model::topic::EventSchema::EventGrid,
            topic: "t",
            headers: &headers,
            body: &body,
            single_id: None,
            max_events: 10_000,
        })
        .unwrap();
        let entry = self.broker.topic("t").unwrap();
        self.broker.publish(&entry, parsed).await.unwrap();
    }

    async fn next(&mut self) -> Attempt {
        tokio::time::timeout(Duration::from_secs(24 * 3600), self.rx.recv())
            .await
            .expect("an attempt")
            .expect("open")
    }

    /// No attempt within `d` of virtual time.
    async fn none_within(&mut self, d: Duration) {
        if let Ok(Some(a)) = tokio::time::timeout(d, self.rx.recv()).await {
            panic!(
                "unexpected attempt {} of {:?} at {:?}",
                a.attempt, a.ids, a.at
            );
        }
    }

    fn metrics(&self) -> String {
        self.broker.render_metrics()
    }
}

fn fail() -> Outcome {
    Outcome::failed(FailureKind::Status(500))
}

fn minutes(m: u64) -> Duration {
    Duration::from_secs(m * 60)
}

fn metric(text: &str, name: &str, sub: &str) -> u64 {
    let prefix = format!("{name}{{topic=\"t\",subscription=\"{sub}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
        .unwrap_or(u64::MAX)
}

#[tokio::test(start_paused = true)]
async fn failure_retries_after_one_minute_then_every_ten_minutes_compat_44() {
    let mut h = Harness::new(&[]);
    h.sub("s", json!({}));
    h.publish(1).await;
    let mut times = Vec::new();
    for i in 0..4 {
        let a = h.next().await;
        assert_eq!(a.attempt, i + 1);
        times.push(a.at);
        let _ = a
            .reply
            .send(if i < 3 { fail() } else { Outcome::Delivered });
    }
    assert_eq!(
        times,
        vec![Duration::ZERO, minutes(1), minutes(11), minutes(21)]
    );
    h.none_within(Duration::from_secs(24 * 3600)).await;
    let m = h.metrics();
    assert_eq!(metric(&m, "DeliverySuccessCounts", "s"), 1);
    assert_eq!(metric(&m, "DeliveryFailureCounts", "s"), 3);
    assert_eq!(metric(&m, "DeliveryAttemptsCount", "s"), 4);
}

#[tokio::test(start_paused = true)]
async fn max_delivery_attempts_caps_the_attempts_compat_45() {
    let mut h = Harness::new(&[]);
    h.sub("s", json!({"retryPolicy":{"maxDeliveryAttempts":2}}));
    h.publish(1).await;
    for _ in 0..2 {
        let _ = h.next().await.reply.send(fail());
    }
    h.none_within(Duration::from_secs(24 * 3600)).await;
    let m = h.metrics();
    assert_eq!(metric(&m, "ExpiredCounts", "s"), 1);
    assert_eq!(metric(&m, "gridlet_pending_events", "s"), 0);
}

#[tokio::test(start_paused = true)]
async fn no_attempt_after_the_time_to_live_compat_46() {
    let mut h = Harness::new(&[]);
    h.sub("s", json!({"retryPolicy":{"eventExpiryInMinutes":1}}));
    h.publish(1).await;
    let a = h.next().await;
    assert_eq!(a.at, Duration::ZERO);
    let _ = a.reply.send(fail());
    h.none_within(Duration::from_secs(24 * 3600)).await;
    assert_eq!(metric(&h.metrics(), "ExpiredCounts", "s"), 1);
}

#[tokio::test(start_paused = true)]
async fn defaults_attempt_thirteen_times_over_two_hours() {
    let mut h = Harness::new(&[]);
    h.sub("s", json!({}));
    h.publish(1).await;
    let mut times = Vec::new();
    while let Ok(Some(a)) = tokio::time::timeout(minutes(24 * 60), h.rx.recv()).await {
        times.push(a.at.as_secs() / 60);
        let _ = a.reply.send(fail());
    }
    assert_eq!(
        times,
        vec![0, 1, 11, 21, 31, 41, 51, 61, 71, 81, 91, 101, 111]
    );
}

#[tokio::test(start_paused = true)]
async fn module_default_max_attempts_applies_compat_47() {
    let mut h = Harness::new(&[("broker__defaultMaxDeliveryAttempts", "3")]);
    h.sub("s", json!({}));
    h.publish(1).await;
    for _ in 0..3 {
        let _ = h.next().await.reply.send(fail());
    }
    h.none_within(Duration::from_secs(24 * 3600)).await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_batch_is_retried_as_a_unit_compat_49() {
    let mut h = Harness::new(&[]);
    h.sub("s", json!({"destination":{"endpointType":"WebHook","properties":{"endpointUrl":"https://x","maxEventsPerBatch":3}}}));
    h.publish(3).await;
    let first = h.next().await;
    assert_eq!(first.ids, ["e0", "e1", "e2"]);
    let _ = first.reply.send(fail());
    let again = h.next().await;
    assert_eq!(again.ids, ["e0", "e1", "e2"]);
    assert_eq!(again.at, minutes(1));
    let _ = again.reply.send(Outcome::Delivered);
    h.none_within(Duration::from_secs(3600)).await;
}

#[tokio::test(start_paused = true)]
async fn a_hanging_subscriber_never_delays_a_healthy_one() {
    let mut h = Harness::new(&[("broker__maxInFlightPerSubscription", "4")]);
    h.sub("dead", json!({}));
    h.sub("live", json!({}));
    h.publish(50).await;
    let mut live = 0;
    let mut dead_pending = Vec::new();
    while live < 50 {
        let a = h.next().await;
        assert_eq!(
            a.at,
            Duration::ZERO,
            "every healthy delivery happens at once"
        );
        if a.sub == "live" {
            live += 1;
            let _ = a.reply.send(Outcome::Delivered);
        } else {
            dead_pending.push(a.reply); // never answered: the endpoint hangs
        }
    }
    assert_eq!(
        dead_pending.len(),
        4,
        "the dead subscriber holds only its own slots"
    );
}

#[tokio::test(start_paused = true)]
async fn retries_wait_in_their_own_lane_while_new_events_go_first() {
    let mut h = Harness::new(&[("broker__maxInFlightPerSubscription", "4")]);
    h.sub("s", json!({}));
    h.publish(8).await;
    // Fail the first 8 attempts: they wait a minute; new events published meanwhile go at once.
    for _ in 0..8 {
        let _ = h.next().await.reply.send(fail());
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
    h.publish(1).await;
    let a = h.next().await;
    assert_eq!((a.at, a.attempt), (Duration::from_secs(30), 1));
    let _ = a.reply.send(Outcome::Delivered);
    // The retries come at one minute, at most one in flight at a time (retry budget = 4/4 = 1).
    let r = h.next().await;
    assert_eq!((r.at, r.attempt), (minutes(1), 2));
    h.none_within(Duration::from_secs(1)).await;
    let _ = r.reply.send(Outcome::Delivered);
    let r2 = h.next().await;
    assert_eq!(r2.attempt, 2);
}
