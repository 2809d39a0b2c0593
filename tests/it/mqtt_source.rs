//! MQTT sources against a real Mosquitto (MQTT 5): messages become events delivered to real
//! webhook receivers; at least once across gridlet SIGKILLs and broker restarts; back-pressure
//! from a full disk; bad settings refused naming the setting (docs/MQTT.md).

use crate::mosquitto::{publish_all, Mosquitto, Msg};
use crate::util::*;
use rumqttc::v5::mqttbytes::v5::PublishProperties;
use rumqttc::v5::mqttbytes::QoS;
use serde_json::{json, Value};
use std::collections::BTreeSet;

/// Settings for connection `local` to `m` and route `r1` from `filter` to gridlet topic `topic`.
pub(crate) fn source_env(m: &Mosquitto, filter: &str, topic: &str) -> Vec<(String, String)> {
    [
        ("mqtt__connections__local__url", m.url()),
        ("mqtt__connections__local__clientId", "gridlet-test".into()),
        ("mqtt__connections__local__receiveMaximum", "20".into()),
        ("mqtt__routes__r1__connection", "local".into()),
        ("mqtt__routes__r1__topicFilter", filter.into()),
        ("mqtt__routes__r1__topic", topic.into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

pub(crate) fn refs(v: &[(String, String)]) -> Vec<(&str, &str)> {
    v.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// Every event a delivery carried (an array, or one CloudEvent).
pub(crate) fn events_of(r: &Received) -> Vec<Value> {
    match r.json() {
        Value::Array(a) => a,
        v => vec![v],
    }
}

/// JSON payloads `{"seq": i}` marked as UTF-8 (payload format indicator 1).
pub(crate) fn numbered(topic: &str, range: std::ops::Range<u32>, pad: usize) -> Vec<Msg> {
    range
        .map(|i| Msg {
            topic: topic.into(),
            payload: serde_json::to_vec(&json!({"seq": i, "pad": "x".repeat(pad)})).unwrap(),
            props: Some(PublishProperties {
                payload_format_indicator: Some(1),
                ..Default::default()
            }),
        })
        .collect()
}

/// Collect deliveries until every `seq` of `0..n` has arrived (duplicates allowed).
pub(crate) async fn all_seqs(
    rx: &mut Receiver,
    n: u32,
    limit: std::time::Duration,
) -> BTreeSet<u64> {
    all_seqs_after(rx, n, limit, BTreeSet::new()).await
}

/// [`all_seqs`], counting those already `seen`.
pub(crate) async fn all_seqs_after(
    rx: &mut Receiver,
    n: u32,
    limit: std::time::Duration,
    mut seen: BTreeSet<u64>,
) -> BTreeSet<u64> {
    let deadline = tokio::time::Instant::now() + limit;
    while seen.len() < n as usize {
        let r = tokio::time::timeout_at(deadline, rx.rx.recv())
            .await
            .unwrap_or_else(|_| {
                let missing: Vec<u32> = (0..n).filter(|i| !seen.contains(&u64::from(*i))).collect();
                panic!(
                    "{} of {n} messages arrived; missing {missing:?}",
                    seen.len()
                )
            })
            .expect("receiver open");
        for ev in events_of(&r) {
            seen.insert(ev["data"]["seq"].as_u64().expect("seq in data"));
        }
    }
    seen
}

async fn wait_connected(g: &TestGridlet) {
    g.wait_metric("gridlet_mqtt_connected", "connection=\"local\"", 1)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_messages_reach_a_webhook_as_cloud_events() {
    let dir = tempfile::tempdir().unwrap();
    let m = Mosquitto::start(dir.path()).await;
    let mut env = source_env(&m, "plant/#", "readings");
    env.push((
        "mqtt__routes__r1__enrichments".into(),
        "site=plant4,line=${mqtt.message.userProperties.line}".into(),
    ));
    let g = start(&refs(&env)).await;
    let (s, b) = g
        .put(
            "/topics/readings",
            json!({"properties": {"inputSchema": "CloudEventSchemaV1_0"}}),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let mut rx = Receiver::start().await;
    g.webhook_sub("readings", "hook", &rx.url("/hook"), json!({}))
        .await;
    wait_connected(&g).await;

    let json_msg = Msg {
        topic: "plant/line1/temp".into(),
        payload: br#"{"t":21.5}"#.to_vec(),
        props: Some(PublishProperties {
            content_type: Some("application/json".into()),
            user_properties: vec![("line".into(), "L1".into()), ("secret".into(), "s".into())],
            ..Default::default()
        }),
    };
    let binary = Msg::new("plant/line2/raw", vec![0u8, 159, 146, 150]);
    let cloud_event = Msg {
        topic: "plant/line3/ce".into(),
        payload: br#"{"specversion":"1.0","id":"own-1","source":"/dev/9","type":"Reading","data":{"v":1}}"#.to_vec(),
        props: Some(PublishProperties {
            content_type: Some("application/cloudevents+json".into()),
            ..Default::default()
        }),
    };
    publish_all(
        m.port,
        "device-1",
        QoS::AtLeastOnce,
        vec![json_msg, binary, cloud_event],
    )
    .await;

    let mut got = Vec::new();
    while got.len() < 3 {
        got.extend(events_of(&rx.next().await));
    }
    let by_subject = |s: &str| got.iter().find(|e| e["subject"] == s).cloned().unwrap();
    let j = by_subject("plant/line1/temp");
    assert_eq!(j["type"], "MQTT.EventPublished");
    assert_eq!(j["source"], "local");
    assert_eq!(j["data"]["t"], 21.5);
    assert_eq!(j["site"], "plant4");
    assert_eq!(j["line"], "L1");
    assert!(
        j.get("secret").is_none(),
        "user properties only through enrichments"
    );
    assert!(j["time"].as_str().unwrap().ends_with('Z'));
    let raw = by_subject("plant/line2/raw");
    assert_eq!(raw["data_base64"], "AJ+Slg==");
    let ce = got.iter().find(|e| e["id"] == "own-1").unwrap();
    assert_eq!(ce["type"], "Reading");
    assert_eq!(ce["site"], "plant4");

    let text = g
        .wait_metric(
            "gridlet_mqtt_messages_total",
            "connection=\"local\",result=\"acknowledged\"",
            3,
        )
        .await;
    assert_eq!(
        metric(
            &text,
            "gridlet_mqtt_messages_total",
            "connection=\"local\",result=\"dropped\""
        ),
        Some(0)
    );
    let ready = g
        .client
        .get(format!("{}/readyz", g.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        ready.contains("mqtt local: connected, received 3, acknowledged 3"),
        "{ready}"
    );
}

/// A PUBACK leaves only after the store commit: with the commit held, nothing is acknowledged;
/// once it completes, everything is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_puback_leaves_only_after_the_commit() {
    let dir = tempfile::tempdir().unwrap();
    let m = Mosquitto::start(dir.path()).await;
    let (entered_tx, mut entered) = tokio::sync::watch::channel(false);
    let (open_tx, open) = tokio::sync::watch::channel(false);
    let store = std::sync::Arc::new(crate::durable_resilience::GatedCommits {
        inner: gridlet::store::memory::MemoryStore::new(),
        entered: entered_tx,
        open,
    });
    let env = source_env(&m, "line/#", "t");
    let g = start_with(
        &refs(&env),
        gridlet::Parts {
            store: Some(store),
            ..gridlet::Parts::default()
        },
    )
    .await;
    g.topic("t").await;
    let mut rx = Receiver::start().await;
    g.webhook_sub(
        "t",
        "s",
        &rx.url("/s"),
        json!({"persistencePolicy": {"isPersisted": true}}),
    )
    .await;
    wait_connected(&g).await;

    publish_all(
        m.port,
        "device-1",
        QoS::AtLeastOnce,
        numbered("line/a", 0..5, 0),
    )
    .await;
    tokio::time::timeout(WAIT, entered.wait_for(|e| *e))
        .await
        .expect("a commit starts")
        .unwrap();
    let text = g.metrics().await;
    let acked = "connection=\"local\",result=\"acknowledged\"";
    assert_eq!(
        metric(&text, "gridlet_mqtt_messages_total", acked),
        Some(0),
        "{text}"
    );

    open_tx.send(true).unwrap();
    all_seqs(&mut rx, 5, WAIT).await;
    g.wait_metric("gridlet_mqtt_messages_total", acked, 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_mid_stream_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = Mosquitto::start(dir.path()).await;
    let env = source_env(&m, "line/+", "t");
    let g = start(&refs(&env)).await;
    g.topic("t").await;
    let mut rx = Receiver::start().await;
    g.webhook_sub(
        "t",
        "s",
        &rx.url("/s"),
        json!({"persistencePolicy": {"isPersisted": true}}),
    )
    .await;
    wait_connected(&g).await;

    // Published and acknowledged by the broker; then the broker stops while gridlet takes them.
    publish_all(
        m.port,
        "device-1",
        QoS::AtLeastOnce,
        numbered("line/a", 0..150, 0),
    )
    .await;
    m.restart().await;
    publish_all(
        m.port,
        "device-1",
        QoS::AtLeastOnce,
        numbered("line/b", 150..300, 0),
    )
    .await;

    all_seqs(&mut rx, 300, WAIT * 3).await;
    let text = g.metrics().await;
    assert!(
        metric(
            &text,
            "gridlet_mqtt_connection_errors_total",
            "connection=\"local\""
        )
        .is_some_and(|n| n >= 1),
        "gridlet saw the broker go: {text}"
    );
    wait_connected(&g).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_holds_mqtt_messages_until_space_frees() {
    let dir = tempfile::tempdir().unwrap();
    let m = Mosquitto::start(dir.path()).await;
    let mut env = source_env(&m, "line/#", "t");
    env.push(("persistence__maxDiskBytes".into(), "65536".into()));
    env.push(("broker__endpointHealth__enabled".into(), "false".into()));
    let g = start(&refs(&env)).await;
    g.topic("t").await;
    let persisted = json!({"persistencePolicy": {"isPersisted": true}});
    // `blocker` keeps every event on disk (its receiver fails) until it is deleted.
    let failing = Receiver::start().await;
    failing.respond_with(500);
    g.webhook_sub("t", "blocker", &failing.url("/b"), persisted.clone())
        .await;
    let mut rx = Receiver::start().await;
    g.webhook_sub("t", "sink", &rx.url("/s"), persisted).await;
    wait_connected(&g).await;

    let n = 300;
    publish_all(
        m.port,
        "device-1",
        QoS::AtLeastOnce,
        numbered("line/a", 0..n, 300),
    )
    .await;
    let paused = g
        .wait_metric("gridlet_mqtt_paused", "connection=\"local\"", 1)
        .await;
    let acked = metric(
        &paused,
        "gridlet_mqtt_messages_total",
        "connection=\"local\",result=\"acknowledged\"",
    )
    .unwrap();
    let accepted = metric(
        &paused,
        "gridlet_enqueued_events_total",
        "topic=\"t\",subscription=\"sink\"",
    )
    .unwrap();
    // Held messages are not acknowledged: every acknowledgement is an accepted event.
    assert!(
        acked <= accepted,
        "{acked} acknowledged, {accepted} accepted"
    );
    assert!(acked < u64::from(n), "{acked} acknowledged while held");

    // Space frees: everything held goes in, nothing was dropped.
    let (s, body) = g.delete("/topics/t/eventSubscriptions/blocker").await;
    assert_eq!(s, 200, "{body}");
    all_seqs(&mut rx, n, WAIT * 3).await;
    let text = g
        .wait_metric(
            "gridlet_mqtt_messages_total",
            "connection=\"local\",result=\"acknowledged\"",
            u64::from(n),
        )
        .await;
    assert_eq!(
        metric(
            &text,
            "gridlet_mqtt_messages_total",
            "connection=\"local\",result=\"dropped\""
        ),
        Some(0)
    );
    g.wait_metric("gridlet_mqtt_paused", "connection=\"local\"", 0)
        .await;
}

#[test]
fn bad_mqtt_settings_are_refused_naming_the_setting() {
    let base = |extra: &[(&str, &str)]| {
        let mut v: Vec<(String, String)> = vec![
            (
                "mqtt__connections__plant__url".into(),
                "mqtt://broker".into(),
            ),
            ("mqtt__routes__r__connection".into(), "plant".into()),
            ("mqtt__routes__r__topicFilter".into(), "a/#".into()),
            ("mqtt__routes__r__topic".into(), "t".into()),
        ];
        for (k, val) in extra {
            v.retain(|(kk, _)| kk != k);
            v.push((k.to_string(), val.to_string()));
        }
        gridlet::cli::check_config(v)
    };
    let (out, code) = base(&[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("* mqtt__connections__plant__url = mqtt://broker"),
        "{out}"
    );
    for (key, value, says) in [
        (
            "mqtt__connections__plant__url",
            "http://broker",
            "unknown scheme",
        ),
        (
            "mqtt__routes__r__topicFilter",
            "a/#/b",
            "`#` must be the whole last level",
        ),
        (
            "mqtt__routes__r__connection",
            "nowhere",
            "no connection `nowhere`",
        ),
        ("mqtt__routes__r__qos", "2", "expected 0 or 1"),
        (
            "mqtt__connections__plant__receiveMaximum",
            "0",
            "from 1 to 65535",
        ),
        ("mqtt__routes__r__enrichments", "ID=x", "lower-case"),
    ] {
        let (out, code) = base(&[(key, value)]);
        assert_eq!(code, 2, "{key}={value}: {out}");
        assert!(
            out.contains(key) && out.contains(says),
            "{key}={value}: {out}"
        );
    }
    let (out, code) = base(&[
        ("mqtt__connections__plant__url", "mqtts://broker"),
        (
            "mqtt__connections__plant__tls__caFile",
            "/nonexistent/ca.pem",
        ),
    ]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("mqtt__connections__plant__tls__caFile")
            && out.contains("/nonexistent/ca.pem"),
        "{out}"
    );
    let (out, _) = base(&[("mqtt__connections__plant__password", "hunter2")]);
    assert!(
        !out.contains("hunter2") && out.contains("mqtt__connections__plant__password = ***"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_refuses_a_missing_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut env = base_env(dir.path());
    env.extend([
        (
            "mqtt__connections__plant__url".to_string(),
            "mqtts://127.0.0.1:1".to_string(),
        ),
        (
            "mqtt__connections__plant__tls__caFile".into(),
            "/nonexistent/ca.pem".into(),
        ),
        ("mqtt__routes__r__connection".into(), "plant".into()),
        ("mqtt__routes__r__topicFilter".into(), "a/#".into()),
        ("mqtt__routes__r__topic".into(), "t".into()),
    ]);
    let cfg = gridlet::Config::from_vars(env).unwrap();
    let e = gridlet::Gridlet::start(cfg, gridlet::Parts::default())
        .await
        .err()
        .expect("refused");
    assert!(
        e.to_string()
            .contains("mqtt__connections__plant__tls__caFile"),
        "{e}"
    );
}

/// `mqtts://` with the broker's CA from a file and a client certificate the broker requires;
/// a connection without the certificate is refused by the broker and says so in its status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtts_with_a_ca_file_and_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = crate::edge::Pki::new();
    let (m, tls_port) = Mosquitto::start_tls(dir.path(), &pki).await;
    let client = pki.issue("gridlet", &[], true);
    let w = |name: &str, data: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, data).unwrap();
        p.display().to_string()
    };
    let ca = w("ca.pem", &pki.ca_pem);
    let cert = w("client.pem", &client.chain_pem);
    let key = w("client.key", &client.key_pem);
    let url = format!("mqtts://localhost:{tls_port}");
    let env: Vec<(String, String)> = [
        ("mqtt__connections__local__url", url.clone()),
        ("mqtt__connections__local__tls__caFile", ca.clone()),
        ("mqtt__connections__local__tls__certFile", cert),
        ("mqtt__connections__local__tls__keyFile", key),
        ("mqtt__connections__nocert__url", url),
        ("mqtt__connections__nocert__tls__caFile", ca),
        ("mqtt__routes__r1__connection", "local".into()),
        ("mqtt__routes__r1__topicFilter", "line/#".into()),
        ("mqtt__routes__r1__topic", "t".into()),
        ("mqtt__routes__r2__connection", "nocert".into()),
        ("mqtt__routes__r2__topicFilter", "other/#".into()),
        ("mqtt__routes__r2__topic", "t".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let g = start(&refs(&env)).await;
    g.topic("t").await;
    let mut rx = Receiver::start().await;
    g.webhook_sub("t", "s", &rx.url("/s"), json!({})).await;
    wait_connected(&g).await;

    publish_all(
        m.port,
        "device-1",
        QoS::AtLeastOnce,
        numbered("line/a", 0..3, 0),
    )
    .await;
    all_seqs(&mut rx, 3, WAIT).await;

    let text = g
        .wait_metrics("the certificate-less connection refused", |t| {
            metric(
                t,
                "gridlet_mqtt_connection_errors_total",
                "connection=\"nocert\"",
            )
            .is_some_and(|n| n >= 1)
        })
        .await;
    assert_eq!(
        metric(&text, "gridlet_mqtt_connected", "connection=\"nocert\""),
        Some(0)
    );
    let ready = g
        .client
        .get(format!("{}/readyz", g.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(ready.contains("mqtt nocert: disconnected"), "{ready}");
    assert!(ready.contains("last error: "), "{ready}");
}

/// QoS 0 messages cannot wait at the broker: those a full disk refuses are dropped and counted,
/// and every received message is either accepted or counted as dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos0_messages_gridlet_cannot_accept_are_dropped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let m = Mosquitto::start(dir.path()).await;
    let mut env = source_env(&m, "line/#", "t");
    env.push(("mqtt__routes__r1__qos".into(), "0".into()));
    env.push(("persistence__maxDiskBytes".into(), "65536".into()));
    env.push(("broker__endpointHealth__enabled".into(), "false".into()));
    let g = start(&refs(&env)).await;
    g.topic("t").await;
    let failing = Receiver::start().await;
    failing.respond_with(500);
    let persisted = json!({"persistencePolicy": {"isPersisted": true}});
    g.webhook_sub("t", "blocker", &failing.url("/b"), persisted)
        .await;
    wait_connected(&g).await;

    let n = 300;
    publish_all(
        m.port,
        "device-1",
        QoS::AtMostOnce,
        numbered("line/a", 0..n, 300),
    )
    .await;
    let received = "connection=\"local\",result=\"received\"";
    let text = g
        .wait_metric("gridlet_mqtt_messages_total", received, u64::from(n))
        .await;
    let text = g
        .wait_metrics("every QoS 0 message accepted or dropped", |t| {
            let dropped = metric(
                t,
                "gridlet_mqtt_messages_total",
                "connection=\"local\",result=\"dropped\"",
            );
            let accepted = metric(
                t,
                "gridlet_enqueued_events_total",
                "topic=\"t\",subscription=\"blocker\"",
            );
            matches!((dropped, accepted), (Some(d), Some(a)) if d + a == u64::from(n))
        })
        .await
        + &text;
    let dropped = metric(
        &text,
        "gridlet_mqtt_messages_total",
        "connection=\"local\",result=\"dropped\"",
    )
    .unwrap();
    assert!(dropped > 0 && dropped < u64::from(n), "{dropped} dropped");
    assert_eq!(
        metric(
            &text,
            "gridlet_mqtt_messages_total",
            "connection=\"local\",result=\"acknowledged\""
        ),
        Some(0),
        "QoS 0 is never acknowledged"
    );
}

/// `protocolVersion=3.1.1`: the same path over MQTT 3.1.1 (no properties: payloads arrive as
/// `data_base64`), acknowledged after acceptance, the session kept across a broker restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_311_sources_deliver_and_acknowledge() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = Mosquitto::start(dir.path()).await;
    let mut env = source_env(&m, "line/#", "t");
    env.push((
        "mqtt__connections__local__protocolVersion".into(),
        "3.1.1".into(),
    ));
    let g = start(&refs(&env)).await;
    let (s, b) = g
        .put(
            "/topics/t",
            json!({"properties": {"inputSchema": "CloudEventSchemaV1_0"}}),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let mut rx = Receiver::start().await;
    g.webhook_sub("t", "s", &rx.url("/s"), json!({})).await;
    wait_connected(&g).await;

    publish_all(
        m.port,
        "device-1",
        QoS::AtLeastOnce,
        numbered("line/a", 0..50, 0),
    )
    .await;
    m.restart().await;
    publish_all(
        m.port,
        "device-1",
        QoS::AtLeastOnce,
        numbered("line/b", 50..100, 0),
    )
    .await;
    let mut seen = BTreeSet::new();
    while seen.len() < 100 {
        for ev in events_of(&rx.next().await) {
            assert_eq!(ev["type"], "MQTT.EventPublished");
            let data = ev["data_base64"]
                .as_str()
                .expect("3.1.1 payloads are base64");
            let bytes =
                base64::Engine::decode(&base64::engine::general_purpose::STANDARD, data).unwrap();
            let v: Value = serde_json::from_slice(&bytes).unwrap();
            seen.insert(v["seq"].as_u64().unwrap());
        }
    }
    let acked = "connection=\"local\",result=\"acknowledged\"";
    g.wait_metrics("every message acknowledged", |t| {
        metric(t, "gridlet_mqtt_messages_total", acked).is_some_and(|a| a >= 100)
    })
    .await;
}
