//! A pull receive makes a `receive` span in the trace of the event it hands out (the first
//! one's, with the others' traces and the receiver's own linked): a trace shows `publish →
//! receive`, as it shows `publish → deliver` for a push subscription.

use super::*;
use crate::pull::{queue_topic, NS};

const OTHER: &str = "0af7651916cd43dd8448eb211c80319c";
const RECEIVER: &str = "11111111111111111111111111111111";
const RECEIVER_SPAN: &str = "2222222222222222";

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
        .map(|v| v["event"]["id"].as_str().unwrap().to_string())
        .collect()
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
    let publish_of = |trace: &str, nth: usize| -> String {
        let mut of: Vec<&Value> = named(&spans, "publish")
            .into_iter()
            .filter(|s| s["trace_id"] == trace)
            .collect();
        of.sort_by_key(|s| s["start"].as_u64());
        of[nth]["span_id"].as_str().unwrap().to_string()
    };
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
