//! The destinations that carry a trace context onward, each against a real peer: an Event Grid
//! namespace topic (`traceparent` header) and an MQTT broker (`traceparent` user property) get
//! the attempt's `deliver` span as the parent, as webhooks (`mod.rs`) and Service Bus / Event
//! Hubs (`export.rs`) do.

use super::*;
use crate::mqtt_out::{Mosquitto, Subscriber};
use crate::ns_peer::{StrictNamespace, NS_KEY};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_and_mqtt_destinations_carry_the_deliver_span_onward() {
    let mut c = Collector::start();
    let mut ns = StrictNamespace::start().await;
    let mut env = otel_env(&c);
    env.extend(ns.settings().into_iter().map(|(k, v)| (k, v.to_string())));
    let t = start_traced(&env).await;
    let broker = Mosquitto::start(t.dir.path(), free_port(), None).await;
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
