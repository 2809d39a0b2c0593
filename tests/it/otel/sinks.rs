//! The destinations that carry a trace context onward, each against a real peer: an Event Grid
//! namespace topic (`traceparent` header) and an MQTT broker (`traceparent` user property) get
//! the attempt's `deliver` span as the parent, as webhooks (`mod.rs`) and Service Bus / Event
//! Hubs (`export.rs`) do. And any sink behind the `Sink` seam gets each event's context from the
//! attempt itself (the in-process harness's channel sink, on tokio's paused clock).

use super::*;
use crate::harness::{fail, InProcess, ENDPOINT};
use crate::mqtt_out::{broker, Subscriber};
use crate::ns_peer::{StrictNamespace, NS_KEY};
use gridlet::delivery::sink::Outcome;
use gridlet::model::event::{parse, PublishInput};
use gridlet::model::topic::{EventSchema, Topic};

/// With export off each event's context goes on unchanged, in every attempt: a sink that knows
/// nothing of tracing but `DeliveryRequest::trace` gets the publisher's `traceparent` on the
/// first attempt and on the retry, and each event's own in a batch that mixes traces.
#[tokio::test(start_paused = true)]
async fn any_sink_gets_each_events_trace_from_the_attempt_retries_included() {
    let mut h = InProcess::open(&[]);
    let ce = json!({"properties": {"inputSchema": "CloudEventSchemaV1_0"}});
    h.broker
        .put_topic(Topic::from_put("ce", ce).unwrap())
        .unwrap();
    let dest = json!({"endpointType": "WebHook",
        "properties": {"endpointUrl": ENDPOINT, "maxEventsPerBatch": 10}});
    h.broker
        .put_subscription("ce", "s", json!({"properties": {"destination": dest}}))
        .unwrap();
    let a = traceparent();
    let b = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_string();
    let traces = [Some(a.clone()), Some(b.clone()), None];
    let events: Vec<Value> = traces
        .iter()
        .enumerate()
        .map(|(i, tp)| {
            let mut e = json!({"specversion": "1.0", "id": format!("c{i}"), "source": "/x",
                "type": "t", "data": {}});
            if let Some(tp) = tp {
                e["traceparent"] = json!(tp);
            }
            e
        })
        .collect();
    let body = bytes::Bytes::from(serde_json::to_vec(&events).unwrap());
    let mut headers = HeaderMap::new();
    headers.insert(
        "content-type",
        "application/cloudevents-batch+json".parse().unwrap(),
    );
    let parsed = parse(&PublishInput {
        schema: EventSchema::CloudEventV1_0,
        topic: "ce",
        headers: &headers,
        body: &body,
        single_id: None,
        max_events: 100,
    })
    .unwrap();
    let entry = h.broker.topic("ce").unwrap();
    h.broker.publish(&entry, parsed, None).await.unwrap();

    let first = h.next().await;
    assert_eq!(first.ids, ["c0", "c1", "c2"], "one batch");
    assert_eq!(first.traceparents, traces);
    first.answer(fail(500));
    let retry = h.next().await;
    assert_eq!(retry.attempt, 2);
    assert_eq!(retry.ids, ["c0", "c1", "c2"]);
    assert_eq!(retry.traceparents, traces, "the retry keeps each trace");
    retry.answer(Outcome::Delivered);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_and_mqtt_destinations_carry_the_deliver_span_onward() {
    let mut c = Collector::start();
    let mut ns = StrictNamespace::start().await;
    let mut env = otel_env(&c);
    env.extend(ns.settings().into_iter().map(|(k, v)| (k, v.to_string())));
    let t = start_traced(&env).await;
    let broker = broker(t.dir.path(), free_port(), None).await;
    let mut mqtt = Subscriber::connect(broker.port, "traced/#").await;
    t.topic("t").await;
    for (name, destination) in [
        (
            "ns",
            json!({"endpointType": "EventGrid", "properties": {
                "endpointUrl": ns.url("cloud"), "sasKey": NS_KEY}}),
        ),
        (
            "mq",
            json!({"endpointType": "Mqtt", "properties": {
                "url": broker.url(), "topicTemplate": "traced/out", "qos": 1}}),
        ),
    ] {
        let (s, b) = t
            .put(
                &format!("/topics/t/eventSubscriptions/{name}"),
                json!({"properties": {"destination": destination}}),
            )
            .await;
        assert_eq!(s, 200, "{b}");
    }
    let r = t
        .client
        .post(t.url("/topics/t/events"))
        .header("traceparent", traceparent())
        .json(&json!([eg_event("e1", "s", "t", json!({}))]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    ns.next().await;
    let sent_ns = ns.log().into_iter().find(|l| l.status == 200).unwrap();
    let message = mqtt.next(&broker).await;
    let sent_mqtt = message
        .properties
        .as_ref()
        .and_then(|p| p.user_properties.iter().find(|(k, _)| k == "traceparent"))
        .map(|(_, v)| v.clone());

    let spans = c
        .until("two deliveries", |s| count(s, "deliver") == 2)
        .await;
    let parent = |sub: &str| {
        let d = named(&spans, "deliver")
            .into_iter()
            .find(|d| d["attributes"]["messaging.destination.subscription.name"] == sub)
            .unwrap_or_else(|| panic!("a deliver span for {sub}: {spans:#?}"));
        assert_eq!(d["trace_id"], TRACE, "{d}");
        format!("00-{TRACE}-{}-01", d["span_id"].as_str().unwrap())
    };
    assert_eq!(sent_ns.traceparent, Some(parent("ns")), "namespace header");
    assert_eq!(sent_mqtt, Some(parent("mq")), "MQTT user property");
}
