//! The MQTT destination (issue 33) against a real Mosquitto (MQTT 5) on loopback: a real gridlet
//! publishes over HTTP, the test reads the messages with its own rumqttc v5 client.
//!
//! Mosquitto comes from Debian (`apt-get install -y mosquitto`; scripts/test.sh installs it).

use crate::mosquitto::{Mosquitto, Options};
use crate::util::free_port;
use crate::util::*;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;
use tokio::sync::mpsc;

/// A Mosquitto on `port` that logs every connect, anonymous clients allowed; with `acl`,
/// anonymous clients may only do what it says (`topic write allowed/#` ...).
pub(crate) async fn broker(dir: &Path, port: u16, acl: Option<&str>) -> Mosquitto {
    let opts = Options {
        port: Some(port),
        log_connects: true,
        acl: acl.map(str::to_owned),
        ..Options::default()
    };
    Mosquitto::start_opts(dir, opts).await
}

/// Clients gridlet's destinations connected as (Mosquitto logs each connect).
fn gridlet_connects(m: &Mosquitto) -> usize {
    m.connects_as("gridlet-")
}

/// The test's own MQTT 5 subscriber.
pub(crate) struct Subscriber {
    _client: AsyncClient,
    rx: mpsc::UnboundedReceiver<Publish>,
    _task: tokio::task::JoinHandle<()>,
}

impl Subscriber {
    pub(crate) async fn connect(port: u16, filter: &str) -> Self {
        Self::connect_as("test-sub", port, filter).await
    }

    async fn connect_as(id: &str, port: u16, filter: &str) -> Self {
        let mut opts = MqttOptions::new(format!("{id}-{port}"), "127.0.0.1", port);
        opts.set_keep_alive(Duration::from_secs(5));
        let (client, mut el) = AsyncClient::new(opts, 64);
        let (tx, rx) = mpsc::unbounded_channel();
        let (sub_tx, mut sub_rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            loop {
                match el.poll().await {
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let _ = tx.send(p);
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        let _ = sub_tx.send(());
                    }
                    Ok(_) => {}
                    // Not a wait for a schedule: the subscriber's own reconnect pause.
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        });
        client.subscribe(filter, QoS::AtLeastOnce).await.unwrap();
        tokio::time::timeout(WAIT, sub_rx.recv())
            .await
            .expect("SUBACK from mosquitto")
            .unwrap();
        Self {
            _client: client,
            rx,
            _task: task,
        }
    }

    pub(crate) async fn next(&mut self, m: &Mosquitto) -> Publish {
        match tokio::time::timeout(WAIT, self.rx.recv()).await {
            Ok(Some(p)) => p,
            _ => panic!(
                "no MQTT message within {WAIT:?}; mosquitto log:\n{}",
                m.log()
            ),
        }
    }
}

fn topic_of(p: &Publish) -> String {
    String::from_utf8_lossy(&p.topic).into_owned()
}

async fn mqtt_sub(
    t: &TestGridlet,
    topic: &str,
    name: &str,
    props: Value,
    extra: Value,
) -> (u16, Value) {
    let mut p = json!({"destination": {"endpointType": "Mqtt", "properties": props}});
    for (k, v) in extra.as_object().unwrap() {
        p[k] = v.clone();
    }
    t.put(
        &format!("/topics/{topic}/eventSubscriptions/{name}"),
        json!({ "properties": p }),
    )
    .await
}

#[tokio::test]
async fn events_become_mqtt_5_messages_with_their_properties() {
    let t = start(&[]).await;
    let broker = broker(t.dir.path(), free_port(), None).await;
    let mut sub = Subscriber::connect(broker.port, "devices/#").await;
    t.topic("t").await;
    let (s, b) = mqtt_sub(
        &t,
        "t",
        "to-mqtt",
        json!({"url": broker.url(), "topicTemplate": "devices/${subject}/${eventType}", "qos": 1,
               "deliveryAttributeMappings": [
                   {"name": "tenant", "type": "Static", "properties": {"value": "contoso", "isSecret": true}},
                   {"name": "site", "type": "Dynamic", "properties": {"sourceField": "data.site"}}]}),
        json!({"retryPolicy": {"eventExpiryInMinutes": 30}}),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(
        b["properties"]["destination"]["properties"]["topicTemplate"],
        "devices/${subject}/${eventType}"
    );
    // A second subscription to the same broker shares the connection.
    let (s, b) = mqtt_sub(
        &t,
        "t",
        "to-mqtt-2",
        json!({"url": broker.url(), "topicTemplate": "devices/all", "qos": 0}),
        json!({}),
    )
    .await;
    assert_eq!(s, 200, "{b}");

    t.publish(
        "t",
        json!([eg_event(
            "e1",
            "pump-7",
            "Telemetry",
            json!({"site": "north", "rpm": 1200})
        )]),
    )
    .await;
    let mut got = [sub.next(&broker).await, sub.next(&broker).await];
    got.sort_by_key(topic_of);
    let (all, one) = (&got[0], &got[1]);
    assert_eq!(topic_of(one), "devices/pump-7/Telemetry");
    assert_eq!(one.qos, QoS::AtLeastOnce);
    assert!(!one.retain);
    let event: Value = serde_json::from_slice(&one.payload).unwrap();
    assert_eq!(
        event["id"], "e1",
        "one event per message, not an array: {event}"
    );
    assert_eq!(event["data"]["rpm"], 1200);
    let p = one.properties.as_ref().expect("MQTT 5 properties");
    assert_eq!(
        p.content_type.as_deref(),
        Some("application/json; charset=utf-8")
    );
    assert_eq!(p.payload_format_indicator, Some(1));
    let expiry = p
        .message_expiry_interval
        .expect("a message expiry interval");
    assert!(
        (1700..=1800).contains(&expiry),
        "the 30-minute TTL left: {expiry}"
    );
    let user: Vec<(&str, &str)> = p
        .user_properties
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert!(user.contains(&("tenant", "contoso")), "{user:?}");
    assert!(user.contains(&("site", "north")), "{user:?}");

    assert_eq!(topic_of(all), "devices/all");
    assert_eq!(all.qos, QoS::AtMostOnce);
    assert_eq!(
        serde_json::from_slice::<Value>(&all.payload).unwrap()["id"],
        "e1"
    );

    let lbl = "topic=\"t\",subscription=\"to-mqtt\"";
    t.wait_metric("DeliverySuccessCounts", lbl, 1).await;
    assert_eq!(
        gridlet_connects(&broker),
        1,
        "one connection: {}",
        broker.log()
    );
    // GET masks the secret attribute value.
    let (_, got) = t.get("/topics/t/eventSubscriptions/to-mqtt").await;
    assert!(!got.to_string().contains("contoso"), "{got}");
}

#[tokio::test]
async fn a_cloud_event_goes_out_in_structured_mode() {
    let t = start(&[]).await;
    let broker = broker(t.dir.path(), free_port(), None).await;
    let mut sub = Subscriber::connect(broker.port, "ce/#").await;
    let (s, b) = t
        .put(
            "/topics/c",
            json!({"properties": {"inputSchema": "CloudEventSchemaV1_0"}}),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = mqtt_sub(
        &t,
        "c",
        "s",
        json!({"url": broker.url(), "topicTemplate": "ce/${topic}/${type}", "retain": true}),
        json!({"eventDeliverySchema": "CloudEventSchemaV1_0"}),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let ce = json!({"specversion": "1.0", "id": "c1", "source": "/pumps", "type": "pump.started",
                    "subject": "p1", "data": {"ok": true}});
    let r = t
        .client
        .post(t.url("/topics/c/events"))
        .header(
            "content-type",
            "application/cloudevents+json; charset=utf-8",
        )
        .body(ce.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    let m = sub.next(&broker).await;
    assert_eq!(topic_of(&m), "ce/c/pump.started");
    assert!(!m.retain, "a live subscriber gets it as a normal message");
    let p = m.properties.as_ref().unwrap();
    assert_eq!(
        p.content_type.as_deref(),
        Some("application/cloudevents+json; charset=utf-8")
    );
    let v: Value = serde_json::from_slice(&m.payload).unwrap();
    assert_eq!(
        (v["id"].clone(), v["source"].clone()),
        (json!("c1"), json!("/pumps"))
    );
}

#[tokio::test]
async fn a_refused_publish_is_dead_lettered_at_once_and_the_rest_delivered() {
    let t = start(&[]).await;
    // Anonymous clients may publish under allowed/ only: Mosquitto answers PUBACK 0x87 (not
    // authorized) on MQTT 5 for anything else.
    let broker = broker(
        t.dir.path(),
        free_port(),
        Some("topic readwrite allowed/#\n"),
    )
    .await;
    let mut sub = Subscriber::connect(broker.port, "allowed/#").await;
    t.topic("t").await;
    let (s, b) = mqtt_sub(
        &t,
        "t",
        "s",
        json!({"url": broker.url(), "topicTemplate": "${subject}"}),
        json!({"retryPolicy": {"maxDeliveryAttempts": 5}}),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    t.publish(
        "t",
        json!([
            eg_event("no", "denied/x", "T", json!({})),
            eg_event("yes", "allowed/x", "T", json!({})),
            eg_event("wild", "allowed/+", "T", json!({}))
        ]),
    )
    .await;
    let m = sub.next(&broker).await;
    assert_eq!(topic_of(&m), "allowed/x");
    let lbl = "topic=\"t\",subscription=\"s\"";
    t.wait_metric("gridlet_dead_lettered_events_total", lbl, 2)
        .await;
    let (_, list) = t.get("/topics/t/eventSubscriptions/s/deadLetters").await;
    let v = list["value"].as_array().unwrap();
    let by_id = |id: &str| {
        v.iter()
            .find(|l| l["eventId"] == id)
            .unwrap_or_else(|| panic!("no letter for {id}: {list}"))
    };
    let no = by_id("no");
    assert_eq!(no["reason"], "DeliveryRefused");
    assert_eq!(no["deliveryAttempts"], 1, "not retried");
    let why = no["lastError"].as_str().unwrap();
    assert!(
        why.contains("0x87") && why.contains("not authorized"),
        "{why}"
    );
    let wild = by_id("wild");
    assert_eq!(wild["reason"], "DeliveryRefused");
    assert!(
        wild["lastError"].as_str().unwrap().contains("wildcard"),
        "{wild}"
    );
    // A refusal says nothing about the broker: the good event is delivered (counted once its
    // PUBACK is settled, which may come after the subscriber has the message).
    t.wait_metric("DeliverySuccessCounts", lbl, 1).await;

    // The connection's status: in /metrics, the readiness detail and the console's overview.
    // The wildcard topic was never sent; the broker acknowledged one message and refused one.
    let series = |m: &str, family: &str, result: &str| -> Option<u64> {
        let prefix = format!("{family}{{broker=\"{}\",client_id=\"gridlet-", broker.url());
        m.lines()
            .filter(|l| l.starts_with(&prefix) && l.contains(result))
            .find_map(|l| l.rsplit(' ').next()?.parse().ok())
    };
    let family = "gridlet_mqtt_destination_messages_total";
    let m = t
        .wait_metrics("the destination's acknowledgement counted", |m| {
            series(m, family, "result=\"acknowledged\"") == Some(1)
        })
        .await;
    assert_eq!(series(&m, family, "result=\"published\""), Some(2), "{m}");
    assert_eq!(series(&m, family, "result=\"refused\""), Some(1), "{m}");
    assert_eq!(
        series(&m, "gridlet_mqtt_destination_connected", "} "),
        Some(1),
        "{m}"
    );
    let ready = t
        .client
        .get(format!("{}/readyz", t.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = ready
        .lines()
        .find(|l| l.starts_with(&format!("mqtt destination {} (gridlet-", broker.url())))
        .unwrap_or_else(|| panic!("{ready}"));
    assert!(
        line.contains("connected, published 2, acknowledged 1, refused 1")
            && line.contains("last error: the MQTT broker refused the message: PUBACK reason 0x87"),
        "{line}"
    );
    let (_, o) = t.get("/broker/overview").await;
    let d = &o["mqttDestinations"][0];
    assert_eq!(d["broker"], broker.url(), "{o}");
    assert_eq!(
        (d["refused"].as_u64(), d["connected"].as_bool()),
        (Some(1), Some(true)),
        "{o}"
    );
}

#[tokio::test]
async fn a_broker_that_is_down_is_a_transient_failure_and_delivery_resumes_when_it_is_back() {
    // A broker that cannot be reached is an outage (RESILIENCE.md): the event waits without
    // using up its one attempt, and goes at the first probe the broker answers.
    let t = start(&[("outbound__outageProbeSeconds", "1")]).await;
    let port = free_port();
    t.topic("t").await;
    let (s, b) = mqtt_sub(
        &t,
        "t",
        "s",
        json!({"url": format!("mqtt://127.0.0.1:{port}"), "topicTemplate": "out/${subject}"}),
        json!({"retryPolicy": {"maxDeliveryAttempts": 1}}),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    t.publish("t", json!([eg_event("e1", "a", "T", json!({}))]))
        .await;
    let lbl = "topic=\"t\",subscription=\"s\"";
    t.wait_metric("gridlet_endpoint_outage", lbl, 1).await;
    let (_, list) = t.get("/topics/t/eventSubscriptions/s/deadLetters").await;
    assert_eq!(
        list["value"],
        json!([]),
        "an outage charges no attempt: {list}"
    );

    // The broker comes up; the shared connection reconnects on its own back-off, and the
    // next probe delivers the waiting event.
    let broker = broker(t.dir.path(), port, None).await;
    let mut sub = Subscriber::connect(port, "out/#").await;
    let m = sub.next(&broker).await;
    assert_eq!(topic_of(&m), "out/a");
    t.wait_metric("DeliverySuccessCounts", lbl, 1).await;
    t.wait_metric("gridlet_endpoint_outage", lbl, 0).await;
}

#[tokio::test]
async fn bad_mqtt_destinations_are_a_400_naming_the_field() {
    let t = start(&[]).await;
    t.topic("t").await;
    let ok = json!({"url": "mqtt://127.0.0.1:1883", "topicTemplate": "a/${subject}"});
    let with = |k: &str, v: Value| {
        let mut p = ok.clone();
        p[k] = v;
        p
    };
    for (props, field) in [
        (with("topicTemplate", json!("a/+/b")), "topicTemplate"),
        (with("topicTemplate", json!("a/#")), "topicTemplate"),
        (with("topicTemplate", json!("a/${device}")), "topicTemplate"),
        (with("url", json!("amqp://127.0.0.1")), "url"),
        (with("qos", json!(2)), "qos"),
        (
            json!({"url": "mqtts://127.0.0.1:8883", "topicTemplate": "a",
                   "tls": {"caFile": "/nonexistent/ca.pem"}}),
            "tls.caFile",
        ),
    ] {
        let (s, b) = mqtt_sub(&t, "t", "bad", props.clone(), json!({})).await;
        assert_eq!(s, 400, "{props}: {b}");
        let msg = b.to_string();
        assert!(
            msg.contains(&format!("properties.{field}")),
            "{props}: {msg}"
        );
        assert_eq!(b["error"]["details"]["code"], "InvalidDestination", "{b}");
    }
    // Nothing was created.
    let (s, _) = t.get("/topics/t/eventSubscriptions/bad").await;
    assert_eq!(s, 404);
}

#[tokio::test]
async fn a_broker_in_a_denied_address_range_is_never_dialled() {
    let t = start(&[("outbound__deniedAddressRanges", "127.0.0.0/8,::1/128")]).await;
    let broker = broker(t.dir.path(), free_port(), None).await;
    t.topic("t").await;
    // An address literal is refused at PUT ...
    let (s, b) = mqtt_sub(
        &t,
        "t",
        "s",
        json!({"url": broker.url(), "topicTemplate": "x"}),
        json!({}),
    )
    .await;
    assert_eq!(s, 400, "{b}");
    assert!(
        b.to_string().contains("outbound__deniedAddressRanges"),
        "{b}"
    );
    // ... a host name is checked on its resolved addresses before every connect.
    let (s, b) = mqtt_sub(
        &t,
        "t",
        "s",
        json!({"url": format!("mqtt://localhost:{}", broker.port), "topicTemplate": "x"}),
        json!({"retryPolicy": {"maxDeliveryAttempts": 1}}),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    t.publish("t", json!([eg_event("e1", "a", "T", json!({}))]))
        .await;
    // The attempt fails without a connection: the broker is unreachable from here (an outage,
    // as for a webhook whose host resolves into a denied range), and was never dialled.
    t.wait_metric(
        "gridlet_endpoint_outage",
        "topic=\"t\",subscription=\"s\"",
        1,
    )
    .await;
    assert_eq!(gridlet_connects(&broker), 0, "{}", broker.log());
}

/// More events in flight than one connection's request slots (1,024): the rest wait for a slot
/// instead of failing (which would retry them a minute later).
#[tokio::test]
async fn a_burst_larger_than_the_connections_request_slots_is_delivered_without_failures() {
    // A probe a second, should a loaded machine make the first connect look like an outage.
    let t = start(&[("outbound__outageProbeSeconds", "1")]).await;
    let broker = broker(t.dir.path(), free_port(), None).await;
    let mut sub = Subscriber::connect(broker.port, "burst/#").await;
    t.topic("t").await;
    let (s, b) = mqtt_sub(
        &t,
        "t",
        "s",
        json!({"url": broker.url(), "topicTemplate": "burst/${id}", "maxEventsPerBatch": 50}),
        json!({}),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let n = 3_000;
    for chunk in 0..n / 500 {
        let events: Vec<Value> = (0..500)
            .map(|i| eg_event(&format!("e{}", chunk * 500 + i), "s", "T", json!({})))
            .collect();
        t.publish("t", Value::Array(events)).await;
    }
    let mut seen = std::collections::HashSet::new();
    while seen.len() < n {
        seen.insert(topic_of(&sub.next(&broker).await));
    }
    let lbl = "topic=\"t\",subscription=\"s\"";
    let m = t.wait_metric("DeliverySuccessCounts", lbl, n as u64).await;
    assert_eq!(metric(&m, "DeliveryFailureCounts", lbl), Some(0), "{m}");
}
