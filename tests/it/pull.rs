//! Pull delivery (issue 21) over HTTP against a real gridlet: queue subscriptions on the
//! management routes, and Event Grid namespaces' data plane (`:publish`, `:receive`,
//! `:acknowledge`, `:release`, `:reject`, `:renewLock`), its bodies and its errors.
//! Lock expiry and delays run on the paused clock in `pull_clock.rs`; the real SDKs in
//! `pull_sdk.rs`.

use crate::util::{metric, start, TestGridlet};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::time::Duration;

pub const NS: &str = "api-version=2024-06-01";

/// What the data-plane helpers need of a gridlet (cheap to clone, `Send + Sync`).
#[derive(Clone)]
pub struct Ns {
    pub base: String,
    pub client: reqwest::Client,
}

impl From<&TestGridlet> for Ns {
    fn from(g: &TestGridlet) -> Self {
        Self {
            base: g.base.clone(),
            client: g.client.clone(),
        }
    }
}

/// POST a namespace operation; `(status, body)`.
pub async fn ns_post(g: &Ns, path_and_query: &str, ct: &str, body: Vec<u8>) -> (u16, Value) {
    let sep = if path_and_query.contains('?') {
        '&'
    } else {
        '?'
    };
    let r = g
        .client
        .post(format!("{}{path_and_query}{sep}{NS}", g.base))
        .header("content-type", ct)
        .body(body)
        .send()
        .await
        .unwrap();
    let s = r.status().as_u16();
    (s, r.json().await.unwrap_or(Value::Null))
}

pub fn cloud_event(id: &str) -> Value {
    json!({"specversion":"1.0","id":id,"source":"/test","type":"t.test","data":{"id":id}})
}

/// A CloudEvents topic `topic` with a queue subscription `sub` (`queue` settings merged in).
pub async fn queue_topic(g: &TestGridlet, topic: &str, sub: &str, queue: Value) {
    let (s, b) = g
        .put(
            &format!("/topics/{topic}"),
            json!({"properties":{"inputSchema":"CloudEventSchemaV1_0"}}),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = g
        .put(
            &format!("/topics/{topic}/eventSubscriptions/{sub}"),
            json!({"properties":{"deliveryConfiguration":{"deliveryMode":"Queue","queue":queue}}}),
        )
        .await;
    assert_eq!(s, 200, "{b}");
}

pub async fn publish_batch(g: &Ns, topic: &str, ids: impl IntoIterator<Item = String>) {
    let events: Vec<Value> = ids.into_iter().map(|i| cloud_event(&i)).collect();
    let (s, b) = ns_post(
        g,
        &format!("/topics/{topic}:publish"),
        "application/cloudevents-batch+json; charset=utf-8",
        serde_json::to_vec(&events).unwrap(),
    )
    .await;
    assert_eq!((s, &b), (200, &json!({})));
}

/// `:receive`: `(lock token, delivery count, event id)` of each event.
pub async fn receive(
    g: &Ns,
    topic: &str,
    sub: &str,
    max: u32,
    wait: u32,
) -> Vec<(String, u64, String)> {
    let (s, b) = ns_post(
        g,
        &format!(
            "/topics/{topic}/eventsubscriptions/{sub}:receive?maxEvents={max}&maxWaitTime={wait}"
        ),
        "application/json",
        Vec::new(),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    b["value"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["brokerProperties"]["lockToken"]
                    .as_str()
                    .unwrap()
                    .to_string(),
                v["brokerProperties"]["deliveryCount"].as_u64().unwrap(),
                v["event"]["id"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// A settle operation (`acknowledge`, `release?...`, `reject`, `renewLock`) on `tokens`.
pub async fn settle(g: &Ns, topic: &str, sub: &str, op: &str, tokens: &[&str]) -> Value {
    let (s, b) = ns_post(
        g,
        &format!("/topics/{topic}/eventsubscriptions/{sub}:{op}"),
        "application/json",
        serde_json::to_vec(&json!({ "lockTokens": tokens })).unwrap(),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    b
}

fn failed_codes(b: &Value) -> Vec<String> {
    b["failedLockTokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["error"]["code"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn queue_subscriptions_are_created_validated_and_echoed() {
    let g = start(&[]).await;
    queue_topic(&g, "q", "s", json!({"receiveLockDurationInSeconds": 120, "maxDeliveryCount": 3, "eventTimeToLive": "P1D"})).await;
    let (s, b) = g.get("/topics/q/eventSubscriptions/s").await;
    assert_eq!(s, 200);
    assert_eq!(
        b["properties"]["deliveryConfiguration"],
        json!({"deliveryMode":"Queue","queue":{"receiveLockDurationInSeconds":120,"maxDeliveryCount":3,"eventTimeToLive":"P1D"}})
    );
    assert!(b["properties"].get("destination").is_none());
    assert_eq!(b["properties"]["persistencePolicy"]["isPersisted"], true);
    for (queue, field) in [
        (
            json!({"receiveLockDurationInSeconds": 30}),
            "receiveLockDurationInSeconds",
        ),
        (json!({"maxDeliveryCount": 11}), "maxDeliveryCount"),
        (json!({"eventTimeToLive": "tomorrow"}), "eventTimeToLive"),
    ] {
        let (s, b) = g
            .put(
                "/topics/q/eventSubscriptions/bad",
                json!({"properties":{"deliveryConfiguration":{"deliveryMode":"Queue","queue":queue}}}),
            )
            .await;
        assert_eq!(s, 400, "{b}");
        assert_eq!(
            b["error"]["details"]["code"],
            "InvalidDeliveryConfiguration"
        );
        assert!(
            b["error"]["message"].as_str().unwrap().contains(field),
            "{b}"
        );
    }
    // Queue and Push keep their events differently: the mode is fixed at creation.
    let (s, b) = g
        .put(
            "/topics/q/eventSubscriptions/s",
            json!({"properties":{"deliveryConfiguration":{"deliveryMode":"Push","push":{
                "destination":{"endpointType":"WebHook","properties":{"endpointUrl":"http://127.0.0.1:9/x"}}}}}}),
        )
        .await;
    assert_eq!(s, 400, "{b}");
    // Push maps to gridlet's destinations.
    let (s, b) = g
        .put(
            "/topics/q/eventSubscriptions/p",
            json!({"properties":{"deliveryConfiguration":{"deliveryMode":"Push","push":{"maxDeliveryCount":4,
                "destination":{"endpointType":"WebHook","properties":{"endpointUrl":"http://127.0.0.1:9/x"}}}}}}),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["properties"]["destination"]["endpointType"], "WebHook");
    assert_eq!(b["properties"]["retryPolicy"]["maxDeliveryAttempts"], 4);
    // A queue subscription needs a CloudEvents topic.
    g.topic("eg").await;
    let (s, b) = g
        .put(
            "/topics/eg/eventSubscriptions/s",
            json!({"properties":{"deliveryConfiguration":{"deliveryMode":"Queue"}}}),
        )
        .await;
    assert_eq!(
        (s, b["error"]["details"]["code"].as_str()),
        (400, Some("InvalidSchema"))
    );
}

#[tokio::test]
async fn publish_receive_acknowledge_release_reject_and_renew() {
    let g = start(&[]).await;
    queue_topic(&g, "q", "s", json!({})).await;
    // One event (application/cloudevents+json), then a batch.
    let (s, b) = ns_post(
        &Ns::from(&g),
        "/topics/q:publish",
        "application/cloudevents+json; charset=utf-8",
        serde_json::to_vec(&cloud_event("a")).unwrap(),
    )
    .await;
    assert_eq!((s, b), (200, json!({})));
    publish_batch(&Ns::from(&g), "q", ["b", "c", "d"].map(String::from)).await;
    let got = receive(&Ns::from(&g), "q", "s", 3, 0).await;
    assert_eq!(
        got.iter().map(|e| e.2.as_str()).collect::<Vec<_>>(),
        ["a", "b", "c"]
    );
    assert!(got.iter().all(|e| e.1 == 1), "first delivery: {got:?}");
    let (a, b_, c) = (&got[0].0, &got[1].0, &got[2].0);
    // Acknowledge a; the same token again fails as lost.
    let r = settle(&Ns::from(&g), "q", "s", "acknowledge", &[a]).await;
    assert_eq!(r["succeededLockTokens"], json!([a]));
    let r = settle(&Ns::from(&g), "q", "s", "acknowledge", &[a]).await;
    assert_eq!(failed_codes(&r), ["TokenLost"]);
    // Renew b, release it: it comes back with deliveryCount 2, after d.
    let r = settle(&Ns::from(&g), "q", "s", "renewLock", &[b_]).await;
    assert_eq!(r["succeededLockTokens"], json!([b_]));
    let r = settle(
        &Ns::from(&g),
        "q",
        "s",
        "release?releaseDelayInSeconds=0",
        &[b_],
    )
    .await;
    assert_eq!(r["succeededLockTokens"], json!([b_]));
    // Reject c: a dead letter with its reason.
    let r = settle(&Ns::from(&g), "q", "s", "reject", &[c]).await;
    assert_eq!(r["succeededLockTokens"], json!([c]));
    let mut again = receive(&Ns::from(&g), "q", "s", 10, 0).await;
    again.sort_by(|x, y| x.2.cmp(&y.2));
    assert_eq!(
        again
            .iter()
            .map(|e| (e.2.as_str(), e.1))
            .collect::<Vec<_>>(),
        [("b", 2), ("d", 1)]
    );
    // The old token of b names the first receive: lost.
    let r = settle(
        &Ns::from(&g),
        "q",
        "s",
        "acknowledge",
        &[b_, &again[0].0, &again[1].0],
    )
    .await;
    assert_eq!(failed_codes(&r), ["TokenLost"]);
    assert_eq!(r["succeededLockTokens"].as_array().unwrap().len(), 2);
    assert!(receive(&Ns::from(&g), "q", "s", 10, 0).await.is_empty());
    let (s, dl) = g.get("/topics/q/eventSubscriptions/s/deadLetters").await;
    assert_eq!(s, 200, "{dl}");
    let dl = dl.to_string();
    assert!(
        dl.contains("DeliveryRefused") && dl.contains("rejected by the receiver"),
        "{dl}"
    );
    let m = g.metrics().await;
    let op = |o: &str| {
        metric(
            &m,
            "gridlet_pull_operations_total",
            &format!("topic=\"q\",subscription=\"s\",operation=\"{o}\""),
        )
    };
    assert_eq!(
        (
            op("received"),
            op("acknowledged"),
            op("released"),
            op("rejected")
        ),
        (Some(5), Some(3), Some(1), Some(1))
    );
    assert_eq!(
        metric(
            &m,
            "gridlet_pull_locked_events",
            "topic=\"q\",subscription=\"s\""
        ),
        Some(0)
    );
    assert_eq!(
        metric(
            &m,
            "gridlet_pending_events",
            "topic=\"q\",subscription=\"s\""
        ),
        Some(0)
    );
}

#[tokio::test]
async fn a_waiting_receive_answers_as_soon_as_an_event_arrives() {
    let g = start(&[]).await;
    queue_topic(&g, "q", "s", json!({})).await;
    let waiting = {
        let g2 = (g.base.clone(), g.client.clone());
        tokio::spawn(async move {
            let r =
                g2.1.post(format!(
                    "{}/topics/q/eventsubscriptions/s:receive?maxEvents=5&maxWaitTime=60&{NS}",
                    g2.0
                ))
                .send()
                .await
                .unwrap();
            r.json::<Value>().await.unwrap()
        })
    };
    // Nothing to take yet: the receive waits; then the event is published.
    tokio::task::yield_now().await;
    publish_batch(&Ns::from(&g), "q", ["x".to_string()]).await;
    let b = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("answered well before maxWaitTime")
        .unwrap();
    assert_eq!(b["value"][0]["event"]["id"], "x");
}

#[tokio::test]
async fn bad_input_gets_the_documented_error_and_changes_nothing() {
    let g = start(&[("broker__maxRequestBodyBytes", "4096")]).await;
    queue_topic(&g, "q", "s", json!({})).await;
    queue_topic(&g, "q2", "s2", json!({})).await;
    publish_batch(&Ns::from(&g), "q", ["a".to_string()]).await;
    publish_batch(&Ns::from(&g), "q2", ["z".to_string()]).await;
    let sub = "/topics/q/eventsubscriptions/s";
    for q in [
        "maxEvents=0",
        "maxEvents=101",
        "maxEvents=x",
        "maxWaitTime=121",
    ] {
        let (s, b) = ns_post(
            &Ns::from(&g),
            &format!("{sub}:receive?{q}"),
            "application/json",
            Vec::new(),
        )
        .await;
        assert_eq!(
            (s, b["error"]["details"][0]["code"].as_str()),
            (400, Some("InvalidQueryParameter")),
            "{q}: {b}"
        );
    }
    let got = receive(&Ns::from(&g), "q", "s", 1, 0).await;
    let foreign = receive(&Ns::from(&g), "q2", "s2", 1, 0).await;
    let mut forged = got[0].0.clone().into_bytes();
    forged[5] = if forged[5] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).unwrap();
    let r = settle(
        &Ns::from(&g),
        "q",
        "s",
        "acknowledge",
        &["", "not a token", &forged, &foreign[0].0],
    )
    .await;
    assert_eq!(
        failed_codes(&r),
        ["BadToken", "BadToken", "TokenLost", "BadToken"]
    );
    assert_eq!(r["succeededLockTokens"], json!([]));
    for (op, body) in [
        ("acknowledge", json!({})),
        ("reject", json!({"lockTokens": []})),
        ("renewLock", json!({"lockTokens": [1]})),
    ] {
        let (s, b) = ns_post(
            &Ns::from(&g),
            &format!("{sub}:{op}"),
            "application/json",
            serde_json::to_vec(&body).unwrap(),
        )
        .await;
        assert_eq!(
            (s, b["error"]["details"][0]["code"].as_str()),
            (400, Some("InvalidLockTokens")),
            "{op}: {b}"
        );
    }
    let (s, b) = ns_post(
        &Ns::from(&g),
        &format!("{sub}:release?releaseDelayInSeconds=5"),
        "application/json",
        serde_json::to_vec(&json!({"lockTokens":[got[0].0]})).unwrap(),
    )
    .await;
    assert_eq!(
        (s, b["error"]["details"][0]["code"].as_str()),
        (400, Some("InvalidQueryParameter"))
    );
    let (s, _) = ns_post(
        &Ns::from(&g),
        &format!("{sub}:peek"),
        "application/json",
        Vec::new(),
    )
    .await;
    assert_eq!(s, 404);
    // Publishing: wrong media type, wrong topic schema, oversized, wrong api-version.
    let one = serde_json::to_vec(&cloud_event("b")).unwrap();
    let (s, _) = ns_post(
        &Ns::from(&g),
        "/topics/q:publish",
        "application/json",
        one.clone(),
    )
    .await;
    assert_eq!(s, 415);
    g.topic("eg").await;
    let (s, b) = ns_post(
        &Ns::from(&g),
        "/topics/eg:publish",
        "application/cloudevents+json",
        one.clone(),
    )
    .await;
    assert_eq!(
        (s, b["error"]["details"][0]["code"].as_str()),
        (400, Some("InvalidSchema"))
    );
    let big: Vec<Value> = (0..100).map(|i| cloud_event(&format!("big{i}"))).collect();
    let (s, _) = ns_post(
        &Ns::from(&g),
        "/topics/q:publish",
        "application/cloudevents-batch+json",
        serde_json::to_vec(&big).unwrap(),
    )
    .await;
    // The namespaces API's codes on :publish: 403 for too large, 410 for no such topic.
    assert_eq!(s, 403, "too large");
    let (s, b) = ns_post(
        &Ns::from(&g),
        "/topics/nosuch:publish",
        "application/cloudevents+json",
        one.clone(),
    )
    .await;
    assert_eq!(
        (s, b["error"]["details"][0]["code"].as_str()),
        (410, Some("TopicNotFound"))
    );
    let r = g
        .client
        .post(format!(
            "{}/topics/q:publish?api-version=2019-01-01-preview",
            g.base
        ))
        .header("content-type", "application/cloudevents+json")
        .body(one)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    // A push subscription cannot be received from.
    g.webhook_sub("q", "push", "http://127.0.0.1:9/x", json!({}))
        .await;
    let (s, b) = ns_post(
        &Ns::from(&g),
        "/topics/q/eventsubscriptions/push:receive",
        "application/json",
        Vec::new(),
    )
    .await;
    assert_eq!(
        (s, b["error"]["details"][0]["code"].as_str()),
        (400, Some("NotAQueueSubscription"))
    );
    // Nothing changed: the one event is still locked, and settles normally.
    let r = settle(&Ns::from(&g), "q", "s", "acknowledge", &[&got[0].0]).await;
    assert_eq!(r["succeededLockTokens"].as_array().unwrap().len(), 1);
    assert!(receive(&Ns::from(&g), "q", "s", 10, 0).await.is_empty());
}

/// Many receivers of one subscription get distinct events: each is delivered and acknowledged
/// exactly once (8 receivers; 2,000 events, and the 100,000 below: ~15 s).
async fn concurrent_receivers(events: usize) {
    let g = start(&[]).await;
    queue_topic(&g, "q", "s", json!({})).await;
    for chunk in (0..events).collect::<Vec<_>>().chunks(500) {
        publish_batch(&Ns::from(&g), "q", chunk.iter().map(|i| format!("e{i}"))).await;
    }
    let ns = Ns::from(&g);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let g = ns.clone();
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            loop {
                let got = receive(&g, "q", "s", 100, 1).await;
                if got.is_empty() {
                    return seen;
                }
                let tokens: Vec<&str> = got.iter().map(|e| e.0.as_str()).collect();
                let r = settle(&g, "q", "s", "acknowledge", &tokens).await;
                assert_eq!(
                    r["succeededLockTokens"].as_array().unwrap().len(),
                    got.len(),
                    "{r}"
                );
                seen.extend(got.into_iter().map(|e| e.2));
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let unique: HashSet<&String> = all.iter().collect();
    assert_eq!(all.len(), events, "each event delivered once");
    assert_eq!(unique.len(), events);
    let m = g.metrics().await;
    assert_eq!(
        metric(
            &m,
            "gridlet_pull_operations_total",
            "topic=\"q\",subscription=\"s\",operation=\"acknowledged\""
        ),
        Some(events as u64)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_receivers_each_get_distinct_events() {
    concurrent_receivers(2_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_receivers_one_hundred_thousand_events() {
    concurrent_receivers(100_000).await;
}
