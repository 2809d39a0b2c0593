//! A pull receive makes a `receive` span in the trace of the event it hands out (the first
//! one's, with the others' traces and the receiver's own linked): a trace shows `publish →
//! receive`, as it shows `publish → deliver` for a push subscription. An acknowledge, release,
//! reject or renewLock that settled (or renewed) a lock makes a span the same way, from the
//! contexts its locks kept: `publish → acknowledge`.

use super::*;
use crate::pull::{queue_topic, NS};

const OTHER: &str = "0af7651916cd43dd8448eb211c80319c";
const RECEIVER: &str = "11111111111111111111111111111111";
const RECEIVER_SPAN: &str = "2222222222222222";
const THIRD: &str = "33333333333333333333333333333333";

/// `:publish` one CloudEvent (its own `traceparent` attribute when `own` is given), with the
/// request's `traceparent` header when `header` is.
async fn publish(t: &TestGridlet, id: &str, header: Option<String>, own: Option<String>) {
    let mut e = json!({"specversion": "1.0", "id": id, "source": "/x", "type": "t", "data": {}});
    if let Some(tp) = own {
        e["traceparent"] = json!(tp);
    }
    let mut req = t
        .client
        .post(t.url(&format!("/topics/q:publish?{NS}")))
        .header("content-type", "application/cloudevents+json")
        .body(e.to_string());
    if let Some(tp) = header {
        req = req.header("traceparent", tp);
    }
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), 200);
}

/// `:receive`; the ids of the events received.
async fn receive(t: &TestGridlet, query: &str, caller: Option<String>) -> Vec<String> {
    locked(t, query, caller)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

/// `:receive`; the id and lock token of each event received.
async fn locked(t: &TestGridlet, query: &str, caller: Option<String>) -> Vec<(String, String)> {
    let mut req = t.client.post(t.url(&format!(
        "/topics/q/eventsubscriptions/s:receive?{query}&{NS}"
    )));
    if let Some(tp) = caller {
        req = req.header("traceparent", tp);
    }
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), 200);
    let b: Value = r.json().await.unwrap();
    b["value"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            let token = v["brokerProperties"]["lockToken"].as_str().unwrap();
            let id = v["event"]["id"].as_str().unwrap();
            (id.to_string(), token.to_string())
        })
        .collect()
}

/// `:{op}` (`op` may carry a query) of `tokens`, with the request's `traceparent` when `caller`
/// is given; the answer's body.
async fn settle(t: &TestGridlet, op: &str, tokens: &[&str], caller: Option<String>) -> Value {
    let sep = if op.contains('?') { '&' } else { '?' };
    let mut req = t
        .client
        .post(t.url(&format!("/topics/q/eventsubscriptions/s:{op}{sep}{NS}")))
        .header("content-type", "application/json")
        .body(json!({ "lockTokens": tokens }).to_string());
    if let Some(tp) = caller {
        req = req.header("traceparent", tp);
    }
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

/// The span id of the `nth` publish span (in start order) of trace `trace`.
fn publish_span(spans: &[Value], trace: &str, nth: usize) -> String {
    let mut of: Vec<&Value> = named(spans, "publish")
        .into_iter()
        .filter(|s| s["trace_id"] == trace)
        .collect();
    of.sort_by_key(|s| s["start"].as_u64());
    of[nth]["span_id"].as_str().unwrap().to_string()
}

/// The span named `name`, the only one.
fn the<'a>(spans: &'a [Value], name: &str) -> &'a Value {
    let of = named(spans, name);
    assert_eq!(of.len(), 1, "one {name} span: {of:#?}");
    of[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_is_a_span_in_the_received_events_trace_linking_the_others_and_the_receiver() {
    let mut c = Collector::start();
    let t = start_traced(&otel_env(&c)).await;
    queue_topic(&t, "q", "s", json!({})).await;
    // e1 and e3 in the publisher's trace (the header), e2 in its own (the CloudEvent's).
    publish(&t, "e1", Some(traceparent()), None).await;
    publish(
        &t,
        "e2",
        None,
        Some(format!("00-{OTHER}-b7ad6b7169203331-01")),
    )
    .await;
    publish(&t, "e3", Some(traceparent()), None).await;
    let spans = c
        .until("three publish spans", |s| count(s, "publish") == 3)
        .await;
    let publish_of = |trace: &str, nth: usize| publish_span(&spans, trace, nth);
    let (p1, p2, p3) = (
        publish_of(TRACE, 0),
        publish_of(OTHER, 0),
        publish_of(TRACE, 1),
    );

    // One event, no receiver context: a child of its publish span.
    assert_eq!(receive(&t, "maxEvents=1&maxWaitTime=0", None).await, ["e1"]);
    // Two events of two traces, a receiver with its own (a long poll that finds them there).
    let caller = format!("00-{RECEIVER}-{RECEIVER_SPAN}-01");
    assert_eq!(
        receive(&t, "maxEvents=10&maxWaitTime=5", Some(caller)).await,
        ["e2", "e3"]
    );
    let spans = c
        .until("two receive spans", |s| count(s, "receive") == 2)
        .await;
    let mut receives = named(&spans, "receive");
    receives.sort_by_key(|s| s["start"].as_u64());
    let (one, two) = (receives[0], receives[1]);

    assert_eq!(one["trace_id"], TRACE, "{one}");
    assert_eq!(one["parent_span_id"], p1, "{one}");
    assert_eq!(one["links"], json!([]), "{one}");
    assert_eq!(one["kind"], 2, "SERVER");
    let a = &one["attributes"];
    assert_eq!(a["messaging.system"], "eventgrid");
    assert_eq!(a["messaging.operation.name"], "receive");
    assert_eq!(a["messaging.operation.type"], "receive");
    assert_eq!(a["messaging.destination.name"], "q");
    assert_eq!(a["messaging.destination.subscription.name"], "s");
    assert_eq!(a["messaging.batch.message_count"], 1);
    assert_eq!(a["gridlet.delivery.attempt"], 1);
    assert_eq!(a["gridlet.lock.duration_ms"], 60_000);
    assert!(
        a.get("messaging.message.id").is_none(),
        "ids only when on: {a}"
    );

    // The first event's trace is the parent; the receiver's and e3's trace are links.
    assert_eq!(two["trace_id"], OTHER, "{two}");
    assert_eq!(two["parent_span_id"], p2, "{two}");
    assert_eq!(
        two["links"],
        json!([
            {"trace_id": RECEIVER, "span_id": RECEIVER_SPAN},
            {"trace_id": TRACE, "span_id": p3},
        ]),
        "{two}"
    );
    assert_eq!(two["attributes"]["messaging.batch.message_count"], 2);
}

/// Persisted (the default for a queue subscription): the locks keep no body, and the contexts
/// the spans need come from the locks themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledge_release_reject_and_renew_are_spans_in_the_settled_events_traces() {
    settle_spans(true).await;
}

/// In memory: the locks keep the bodies too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_spans_of_an_in_memory_queue_subscription() {
    settle_spans(false).await;
}

async fn settle_spans(persisted: bool) {
    let mut c = Collector::start();
    let t = start_traced(&otel_env(&c)).await;
    let topic = json!({"properties": {"inputSchema": "CloudEventSchemaV1_0"}});
    assert_eq!(t.put("/topics/q", topic).await.0, 200);
    let sub = json!({"properties": {
        "deliveryConfiguration": {"deliveryMode": "Queue", "queue": {}},
        "persistencePolicy": {"isPersisted": persisted},
    }});
    let (s, b) = t.put("/topics/q/eventSubscriptions/s", sub).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(
        b["properties"]["persistencePolicy"]["isPersisted"],
        persisted
    );
    // e1 and e3 in the publisher's trace (the header), e2 and e4 in their own (the CloudEvent's).
    publish(&t, "e1", Some(traceparent()), None).await;
    let own = |trace: &str| Some(format!("00-{trace}-b7ad6b7169203331-01"));
    publish(&t, "e2", None, own(OTHER)).await;
    publish(&t, "e3", Some(traceparent()), None).await;
    publish(&t, "e4", None, own(THIRD)).await;
    let spans = c
        .until("four publish spans", |s| count(s, "publish") == 4)
        .await;
    let publish_of = |trace: &str, nth: usize| publish_span(&spans, trace, nth);
    let (p1, p2, p3, p4) = (
        publish_of(TRACE, 0),
        publish_of(OTHER, 0),
        publish_of(TRACE, 1),
        publish_of(THIRD, 0),
    );
    let got = locked(&t, "maxEvents=10&maxWaitTime=0", None).await;
    let ids: Vec<&str> = got.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["e1", "e2", "e3", "e4"]);
    let token = |i: usize| got[i].1.as_str();

    // Only bad tokens: the documented answer, and no span (it is recorded before the spans
    // waited for below, and spans are exported in the order they are recorded).
    let mut altered = token(0).to_string();
    let last = if altered.ends_with('A') { "B" } else { "A" };
    altered.replace_range(altered.len() - 1.., last);
    let b = settle(&t, "acknowledge", &["bogus", &altered], None).await;
    assert_eq!(b["succeededLockTokens"], json!([]), "{b}");
    let failed = b["failedLockTokens"].as_array().unwrap();
    assert_eq!(failed.len(), 2, "{b}");
    assert_eq!(failed[0]["lockToken"], "bogus");
    assert_eq!(failed[0]["error"]["code"], "BadToken");

    let b = settle(&t, "renewLock", &[token(1)], None).await;
    assert_eq!(b["succeededLockTokens"], json!([token(1)]), "{b}");
    let caller = format!("00-{RECEIVER}-{RECEIVER_SPAN}-01");
    let b = settle(&t, "acknowledge", &[token(0), "bogus"], Some(caller)).await;
    assert_eq!(b["succeededLockTokens"], json!([token(0)]), "{b}");
    settle(&t, "release?releaseDelayInSeconds=10", &[token(1)], None).await;
    let b = settle(&t, "reject", &[token(2), token(3)], None).await;
    assert_eq!(b["failedLockTokens"], json!([]), "{b}");

    let settles = ["acknowledge", "release", "reject", "renewLock"];
    let spans = c
        .until("the four settle spans", |s| {
            settles.iter().all(|n| count(s, n) > 0)
        })
        .await;
    let common = |s: &Value, op: &str, settled: u64, failed: u64| {
        assert_eq!(s["kind"], 2, "SERVER: {s}");
        assert_eq!(s["status_code"], 0, "{s}");
        let a = &s["attributes"];
        assert_eq!(a["messaging.system"], "eventgrid");
        assert_eq!(a["messaging.operation.name"], op);
        assert_eq!(a["messaging.destination.name"], "q");
        assert_eq!(a["messaging.destination.subscription.name"], "s");
        assert_eq!(a["messaging.batch.message_count"], settled, "{s}");
        assert_eq!(a["gridlet.lock_tokens.succeeded"], settled, "{s}");
        assert_eq!(a["gridlet.lock_tokens.failed"], failed, "{s}");
    };

    // One event: a child of its publish span; the caller's context a link.
    let ack = the(&spans, "acknowledge");
    common(ack, "acknowledge", 1, 1);
    assert_eq!(ack["trace_id"], TRACE, "{ack}");
    assert_eq!(ack["parent_span_id"], p1, "{ack}");
    assert_eq!(
        ack["links"],
        json!([{"trace_id": RECEIVER, "span_id": RECEIVER_SPAN}]),
        "{ack}"
    );
    assert_eq!(ack["attributes"]["messaging.operation.type"], "settle");

    let release = the(&spans, "release");
    common(release, "release", 1, 0);
    assert_eq!(release["trace_id"], OTHER, "{release}");
    assert_eq!(release["parent_span_id"], p2, "{release}");
    assert_eq!(release["links"], json!([]), "{release}");
    assert_eq!(release["attributes"]["messaging.operation.type"], "settle");
    assert_eq!(release["attributes"]["gridlet.release.delay_ms"], 10_000);

    // Two events of two traces: the first's is the parent, the other's a link.
    let reject = the(&spans, "reject");
    common(reject, "reject", 2, 0);
    assert_eq!(reject["trace_id"], TRACE, "{reject}");
    assert_eq!(reject["parent_span_id"], p3, "{reject}");
    assert_eq!(
        reject["links"],
        json!([{"trace_id": THIRD, "span_id": p4}]),
        "{reject}"
    );
    let a = &reject["attributes"];
    assert_eq!(a["messaging.operation.type"], "settle");
    assert_eq!(a["gridlet.dead_letter.reason"], json!(["DeliveryRefused"]));

    let renew = the(&spans, "renewLock");
    common(renew, "renewLock", 1, 0);
    assert_eq!(renew["trace_id"], OTHER, "{renew}");
    assert_eq!(renew["parent_span_id"], p2, "{renew}");
    let a = &renew["attributes"];
    assert_eq!(a["gridlet.lock.duration_ms"], 60_000);
    assert!(a.get("messaging.operation.type").is_none(), "{a}");
}
