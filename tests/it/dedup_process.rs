//! Deduplication across a SIGKILL of the real binary (issue 34): a publisher whose events were
//! accepted resends them after gridlet was killed and restarted; the window, rebuilt from the
//! event log at start, answers 200 and routes none of them again. Nothing is written for the
//! window: the events' own log records are read back.

use crate::process::{start_serving, terminate};
use crate::util::*;
use crate::wait::eventually;
use serde_json::{json, Value};
use std::time::Duration;

const LABELS: &str = r#"topic="t1",subscription="s1""#;

fn cloud_event(source: &str, id: &str) -> Value {
    json!({"specversion": "1.0", "type": "reading", "source": source, "id": id,
        "data": {"id": id}})
}

/// CloudEvents topic `t1` with the persisted webhook subscription `s1` to `hook`.
async fn persisted_topic(c: &reqwest::Client, base: &str, hook: &str) {
    let put = |path: &str, body: Value| c.put(format!("{base}{path}?{V}")).json(&body).send();
    let topic = json!({"properties": {"inputSchema": "CloudEventSchemaV1_0"}});
    assert_eq!(put("/topics/t1", topic).await.unwrap().status(), 200);
    let sub = json!({"properties": {"destination": {"endpointType": "WebHook",
        "properties": {"endpointUrl": hook, "maxEventsPerBatch": 10}},
        "persistencePolicy": {"isPersisted": true}}});
    let r = put("/topics/t1/eventSubscriptions/s1", sub).await.unwrap();
    assert_eq!(r.status(), 200);
}

/// Publish `events` to `t1` as a CloudEvents batch; it must be answered 200.
async fn publish_to(c: reqwest::Client, base: String, events: Vec<Value>) {
    let r = c
        .post(format!("{base}/topics/t1/events?{V}"))
        .header("content-type", "application/cloudevents-batch+json")
        .body(serde_json::to_vec(&events).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_event_after_sigkill_is_not_delivered_twice() {
    let dir = tempfile::tempdir().unwrap();
    let mut hook = Receiver::start().await;
    // The uplink is down (503 without Retry-After: an outage): the events wait in the log.
    hook.respond_with(503);
    let env = [
        ("outbound__webhook__httpsOnly", "false"),
        ("metrics__reporterType", "prometheus"),
        ("broker__deduplicationWindowSeconds", "3600"),
        ("outbound__outageProbeSeconds", "1"),
    ];
    let (mut child, base) = start_serving(dir.path(), &env).await;
    let c = reqwest::Client::new();
    persisted_topic(&c, &base, &hook.url("/hook")).await;
    let publish = |base: String, events: Vec<Value>| publish_to(c.clone(), base, events);
    let sent: Vec<Value> = (0..3)
        .map(|i| cloud_event("/plant/7", &format!("c{i}")))
        .collect();
    publish(base.clone(), sent.clone()).await;
    let metrics = |base: String| {
        let c = c.clone();
        async move {
            c.get(format!("{base}/metrics?{V}"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    };
    eventually("the outage is noted", || async {
        let text = metrics(base.clone()).await;
        match metric(&text, "gridlet_endpoint_outage", LABELS) {
            Some(1) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    child.kill().unwrap();
    child.wait().unwrap();
    while hook.rx.try_recv().is_ok() {}

    // The link is back; the publisher, which never saw its 200 (say), sends the same events
    // again, and one whose id is taken but whose source differs: another identity.
    hook.respond_with(200);
    let (child, base) = start_serving(dir.path(), &env).await;
    let mut resend = sent;
    resend.push(cloud_event("/plant/8", "c0"));
    publish(base.clone(), resend).await;
    let mut got = Vec::new();
    while got.len() < 4 {
        for e in hook.next().await.json().as_array().unwrap() {
            got.push((
                e["source"].as_str().unwrap().to_string(),
                e["id"].as_str().unwrap().to_string(),
            ));
        }
    }
    hook.nothing_within(Duration::from_millis(500)).await;
    got.sort();
    let want = [
        ("/plant/7", "c0"),
        ("/plant/7", "c1"),
        ("/plant/7", "c2"),
        ("/plant/8", "c0"),
    ];
    assert_eq!(got, want.map(|(s, i)| (s.to_string(), i.to_string())));
    let text = metrics(base.clone()).await;
    assert_eq!(
        metric(&text, "gridlet_deduplicated_events_total", r#"topic="t1""#),
        Some(3)
    );
    assert_eq!(metric(&text, "gridlet_pending_events", LABELS), Some(0));
    assert!(terminate(child).await.success());
}

/// A delivered event resent after a SIGKILL: its segment was kept for the window, the restart
/// reads its `Event` record back (settled, not pending), and the resend is answered 200,
/// counted, and not delivered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivered_event_resent_after_sigkill_is_suppressed() {
    let dir = tempfile::tempdir().unwrap();
    let mut hook = Receiver::start().await;
    let env = [
        ("outbound__webhook__httpsOnly", "false"),
        ("metrics__reporterType", "prometheus"),
        ("broker__deduplicationWindowSeconds", "3600"),
    ];
    let (mut child, base) = start_serving(dir.path(), &env).await;
    let c = reqwest::Client::new();
    persisted_topic(&c, &base, &hook.url("/hook")).await;
    let publish = |base: String, events: Vec<Value>| publish_to(c.clone(), base, events);
    let pending = |base: String| {
        let c = c.clone();
        async move {
            let text = c
                .get(format!("{base}/metrics?{V}"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            metric(&text, "gridlet_pending_events", LABELS)
        }
    };
    let sent: Vec<Value> = (0..3)
        .map(|i| cloud_event("/plant/7", &format!("c{i}")))
        .collect();
    publish(base.clone(), sent.clone()).await;
    let mut first = 0;
    while first < 3 {
        first += hook.next().await.json().as_array().unwrap().len();
    }
    // Their settlements staged (nothing pending), then made durable by the next frame: a
    // publish's 200 means the frame that carried them was synced.
    eventually("s1 to settle its events", || async {
        match pending(base.clone()).await {
            Some(0) => Ok(()),
            other => Err(format!("{other:?} pending")),
        }
    })
    .await;
    publish(base.clone(), vec![cloud_event("/barrier", "b0")]).await;
    child.kill().unwrap();
    child.wait().unwrap();
    while hook.rx.try_recv().is_ok() {}

    let (child, base) = start_serving(dir.path(), &env).await;
    let mut resend = sent;
    resend.push(cloud_event("/plant/8", "c0"));
    publish(base.clone(), resend).await;
    // Only the new identity comes (the barrier may come again: at least once).
    let mut got = Vec::new();
    while !got.iter().any(|(s, _)| s == "/plant/8") {
        for e in hook.next().await.json().as_array().unwrap() {
            got.push((
                e["source"].as_str().unwrap().to_string(),
                e["id"].as_str().unwrap().to_string(),
            ));
        }
    }
    // Nothing more in the next half second (a barrier delivered again aside).
    while let Ok(Some(r)) = tokio::time::timeout(Duration::from_millis(500), hook.rx.recv()).await {
        for e in r.json().as_array().unwrap() {
            got.push((
                e["source"].as_str().unwrap().to_string(),
                e["id"].as_str().unwrap().to_string(),
            ));
        }
    }
    got.retain(|(s, _)| s != "/barrier");
    assert_eq!(got, [("/plant/8".to_string(), "c0".to_string())]);
    let text = c
        .get(format!("{base}/metrics?{V}"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        metric(&text, "gridlet_deduplicated_events_total", r#"topic="t1""#),
        Some(3)
    );
    assert!(terminate(child).await.success());
}

/// What rebuilding the window costs at start (docs/CLOUD.md): `Broker::open` on an event log
/// holding 100,000 events inside the window, with deduplication on and off, interleaved. The
/// events are pending (a window of 0 would let settled ones go); the read of the kept events
/// does not look at whether they are settled, so a delivered one costs the same. Run with `--ignored --nocapture`; noisy on a shared machine, and a debug build
/// unless run with `--release`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn rebuild_cost_at_start() {
    use futures_util::future::BoxFuture;
    use gridlet::broker::Broker;
    use gridlet::delivery::sink::{DeliveryRequest, Outcome, Sink, SinkFactory};
    use gridlet::model::event::{parse, PublishInput};
    use gridlet::model::subscription::Subscription;
    use gridlet::model::topic::{EventSchema, Topic};
    use std::sync::Arc;

    struct Never;
    impl Sink for Never {
        fn send<'a>(&'a self, _: &'a DeliveryRequest) -> BoxFuture<'a, Outcome> {
            Box::pin(std::future::pending())
        }
    }
    impl SinkFactory for Never {
        fn create(&self, _: &Subscription) -> Arc<dyn Sink> {
            Arc::new(Never)
        }
    }
    const N: usize = 100_000;
    let dir = tempfile::tempdir().unwrap();
    let open = |window: &str| {
        let mut vars = base_env(dir.path());
        vars.push(("broker__deduplicationWindowSeconds".into(), window.into()));
        vars.push(("persistence__maxDiskBytes".into(), "4000000000".into()));
        let cfg = Arc::new(gridlet::Config::from_vars(vars).unwrap());
        let store = gridlet::store::open(&cfg.persistence).unwrap();
        let t = std::time::Instant::now();
        let b = Broker::open(cfg, store, Arc::new(Never), gridlet::clock::Clock::system()).unwrap();
        (b, t.elapsed())
    };
    let (b, _) = open("3600");
    b.put_topic(Topic::from_put("t", json!({})).unwrap())
        .unwrap();
    let sub = json!({"properties": {"destination": {"endpointType": "WebHook",
        "properties": {"endpointUrl": "http://127.0.0.1:9/hook"}},
        "persistencePolicy": {"isPersisted": true}}});
    b.put_subscription("t", "s", sub).unwrap();
    let entry = b.topic("t").unwrap();
    for r in 0..N / 1000 {
        let events: Vec<Value> = (0..1000)
            .map(|i| {
                eg_event(
                    &format!("{r}-{i}-0123456789abcdef"),
                    "s",
                    "t",
                    json!({"i": i}),
                )
            })
            .collect();
        let body = bytes::Bytes::from(serde_json::to_vec(&events).unwrap());
        let headers = Default::default();
        let parsed = parse(&PublishInput {
            schema: EventSchema::EventGrid,
            topic: "t",
            headers: &headers,
            body: &body,
            single_id: None,
            max_events: 100_000,
        })
        .unwrap();
        b.publish(&entry, parsed, None).await.unwrap();
    }
    b.close_store().await;
    drop((b, entry));
    for window in ["0", "3600", "0", "3600", "0", "3600"] {
        let (b, took) = open(window);
        println!("window {window:>4} s: Broker::open with {N} pending events took {took:?}");
        b.close_store().await;
        drop(b);
    }
}
