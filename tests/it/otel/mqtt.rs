//! MQTT sources in traces: a batch from a broker gets a `publish` span (kind CONSUMER,
//! `messaging.system` `mqtt`) under the trace a message carries, and its events travel on in it.

use super::*;
use crate::mosquitto::{publish_all, Mosquitto, Msg};
use rumqttc::v5::mqttbytes::v5::PublishProperties;
use rumqttc::v5::mqttbytes::QoS;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mqtt_batch_gets_a_publish_span_under_the_messages_trace() {
    let mut c = Collector::start();
    let dir = tempfile::tempdir().unwrap();
    let m = Mosquitto::start(dir.path()).await;
    let mut env = otel_env(&c);
    env.extend([
        ("mqtt__connections__local__url", m.url()),
        ("mqtt__routes__r__connection", "local".into()),
        ("mqtt__routes__r__topicFilter", "line/#".into()),
        ("mqtt__routes__r__topic", "ce".into()),
    ]);
    let t = start_traced(&env).await;
    let (s, _) = t
        .put(
            "/topics/ce",
            json!({"properties":{"inputSchema":"CloudEventSchemaV1_0"}}),
        )
        .await;
    assert_eq!(s, 200);
    let mut rx = Receiver::start().await;
    t.webhook_sub("ce", "s", &rx.url("/ce"), json!({})).await;
    t.wait_metric("gridlet_mqtt_connected", "connection=\"local\"", 1)
        .await;

    let event = json!({"specversion":"1.0","id":"m1","source":"/x","type":"t",
        "traceparent": traceparent(), "data":{}});
    let msg = Msg {
        topic: "line/1".into(),
        payload: event.to_string().into_bytes(),
        props: Some(PublishProperties {
            content_type: Some("application/cloudevents+json".into()),
            ..Default::default()
        }),
    };
    publish_all(m.port, "device-1", QoS::AtLeastOnce, vec![msg]).await;
    let got = rx.next().await;
    assert!(header(&got, "traceparent").starts_with(&format!("00-{TRACE}-")));

    let spans = c
        .until("the MQTT batch's publish span", |s| {
            count(s, "publish") == 1 && count(s, "deliver") == 1
        })
        .await;
    let p = named(&spans, "publish")[0];
    assert_eq!(p["trace_id"], TRACE);
    assert_eq!(p["parent_span_id"], PARENT);
    assert_eq!(p["kind"], 5, "CONSUMER");
    let a = &p["attributes"];
    assert_eq!(a["messaging.system"], "mqtt");
    assert_eq!(a["messaging.destination.name"], "ce");
    assert_eq!(a["gridlet.mqtt.connection"], "local");
    assert_eq!(a["gridlet.outcome"], "accepted");
}
