//! MQTT connections and routes through the management API (`/mqtt/connections/{name}`,
//! `/mqtt/routes/{name}`, docs/MQTT.md), against a real Mosquitto: a PUT starts a live
//! connection without a restart, GET masks the password, the records survive a restart, a
//! DELETE stops it, a replaced connection keeps the messages in flight, bad input is a 400
//! naming the field with nothing changed, settings-defined ones are read-only, and only an
//! administrator manages them.

use crate::mosquitto::{publish_all, Mosquitto, Msg};
use crate::mqtt_source::{all_seqs, events_of, numbered, refs, source_env};
use crate::util::*;
use rumqttc::v5::mqttbytes::v5::PublishProperties;
use rumqttc::v5::mqttbytes::QoS;
use serde_json::{json, Value};

const SECRET: &str = "hunter2-mqtt-password";

fn connection_body(m: &Mosquitto) -> Value {
    json!({"properties": {
        "url": m.url(), "clientId": "gridlet-api", "username": "gridlet",
        "password": SECRET, "keepAliveSeconds": 30, "receiveMaximum": 20
    }})
}

fn route_body(filter: &str, topic: &str) -> Value {
    json!({"properties": {"connection": "site", "topicFilter": filter, "topic": topic,
        "enrichments": {"site": "north, plant 4"}}})
}

fn json_msg(topic: &str, body: Value) -> Msg {
    Msg {
        topic: topic.into(),
        payload: serde_json::to_vec(&body).unwrap(),
        props: Some(PublishProperties {
            content_type: Some("application/json".into()),
            ..Default::default()
        }),
    }
}

async fn readiness(g: &TestGridlet) -> String {
    g.client
        .get(format!("{}/readyz", g.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// A CloudEvents topic `readings` with a webhook subscription to `rx`.
async fn readings(g: &TestGridlet, rx: &Receiver) {
    let (s, b) = g
        .put(
            "/topics/readings",
            json!({"properties": {"inputSchema": "CloudEventSchemaV1_0"}}),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    g.webhook_sub(
        "readings",
        "hook",
        &rx.url("/hook"),
        json!({"persistencePolicy": {"isPersisted": true}}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_and_route_put_at_runtime_deliver_survive_a_restart_and_stop_on_delete() {
    let mdir = tempfile::tempdir().unwrap();
    let m = Mosquitto::start(mdir.path()).await;
    let g = start(&[]).await;
    let mut rx = Receiver::start().await;
    readings(&g, &rx).await;

    let (s, c) = g.put("/mqtt/connections/Site", connection_body(&m)).await;
    assert_eq!(s, 200, "{c}");
    assert_eq!(c["name"], "site");
    assert_eq!(c["properties"]["password"], Value::Null, "masked: {c}");
    assert_eq!(c["properties"]["username"], "gridlet");
    assert_eq!(c["properties"]["keepAliveSeconds"], 30);
    assert_eq!(c["properties"]["managedBy"], "api");
    assert!(!c.to_string().contains(SECRET), "{c}");
    let (s, r) = g
        .put("/mqtt/routes/temps", route_body("plant/#", "readings"))
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["properties"]["enrichments"]["site"], "north, plant 4");
    g.wait_metric("gridlet_mqtt_connected", "connection=\"site\"", 1)
        .await;

    publish_all(
        m.port,
        "device-1",
        QoS::AtLeastOnce,
        vec![json_msg("plant/line1/temp", json!({"t": 21.5}))],
    )
    .await;
    let ev = events_of(&rx.next().await).remove(0);
    assert_eq!(ev["source"], "site");
    assert_eq!(ev["subject"], "plant/line1/temp");
    assert_eq!(ev["data"]["t"], 21.5);
    assert_eq!(ev["site"], "north, plant 4");

    // Listed, in the readiness detail and the console's overview, like a settings connection.
    let (_, list) = g.get("/mqtt/connections").await;
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(list[0]["properties"]["status"]["connected"], true, "{list}");
    assert!(!list.to_string().contains(SECRET));
    let (_, routes) = g.get("/mqtt/routes").await;
    assert_eq!(routes[0]["name"], "temps", "{routes}");
    assert!(readiness(&g)
        .await
        .contains("mqtt site: connected, received 1"));
    let (_, overview) = g.get("/broker/overview").await;
    assert_eq!(overview["mqttConnections"][0]["name"], "site", "{overview}");

    // Stored: a restart brings them back, connected.
    let TestGridlet {
        g: running, dir, ..
    } = g;
    running.shutdown().await;
    let g = start_in(dir, &[], gridlet::Parts::default()).await;
    let (s, c) = g.get("/mqtt/connections/site").await;
    assert_eq!(s, 200, "{c}");
    assert_eq!(c["properties"]["password"], Value::Null);
    g.wait_metric("gridlet_mqtt_connected", "connection=\"site\"", 1)
        .await;
    publish_all(
        m.port,
        "device-1",
        QoS::AtLeastOnce,
        vec![json_msg("plant/line2/temp", json!({"t": 22}))],
    )
    .await;
    let ev = events_of(&rx.next().await).remove(0);
    assert_eq!(ev["subject"], "plant/line2/temp");

    // A connection a route uses is not deleted; once the route is gone, it is.
    let (s, b) = g.delete("/mqtt/connections/site").await;
    assert_eq!(s, 400, "{b}");
    assert!(
        b.contains("MqttConnectionInUse") && b.contains("temps"),
        "{b}"
    );
    assert_eq!(g.delete("/mqtt/routes/temps").await.0, 200);
    let (s, b) = g.delete("/mqtt/connections/site").await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(g.get("/mqtt/connections/site").await.0, 404);
    assert_eq!(g.delete("/mqtt/connections/site").await.0, 404);
    let metrics = g.metrics().await;
    assert!(!metrics.contains("connection=\"site\""), "{metrics}");
    assert!(!readiness(&g).await.contains("mqtt site"));
    // Nothing is subscribed any more: a message now reaches no one.
    publish_all(
        m.port,
        "device-1",
        QoS::AtLeastOnce,
        vec![json_msg("plant/line3/temp", json!({"t": 0}))],
    )
    .await;
    rx.nothing_within(std::time::Duration::from_millis(500))
        .await;

    // Forgotten in the store too.
    let TestGridlet {
        g: running, dir, ..
    } = g;
    running.shutdown().await;
    let g = start_in(dir, &[], gridlet::Parts::default()).await;
    assert_eq!(g.get("/mqtt/connections").await.1, json!([]));
    assert_eq!(g.get("/mqtt/routes").await.1, json!([]));
}

/// A PUT that changes a connection or its route restarts it; the messages it held
/// unacknowledged stay with the broker's session and come again on the new connection (same
/// client id): none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replacing_a_connection_loses_none_of_the_messages_in_flight() {
    let mdir = tempfile::tempdir().unwrap();
    let m = Mosquitto::start(mdir.path()).await;
    let g = start(&[]).await;
    let mut rx = Receiver::start().await;
    g.topic("t").await;
    g.topic("t2").await;
    g.webhook_sub("t2", "s", &rx.url("/s"), json!({})).await;
    assert_eq!(
        g.put("/mqtt/connections/site", connection_body(&m)).await.0,
        200
    );
    let route = |topic: &str| json!({"properties": {"connection": "site", "topicFilter": "line/+", "topic": topic}});
    assert_eq!(g.put("/mqtt/routes/r", route("t")).await.0, 200);
    g.wait_metric("gridlet_mqtt_connected", "connection=\"site\"", 1)
        .await;
    // The topic goes: the messages are held, unacknowledged.
    assert_eq!(g.delete("/topics/t").await.0, 200);
    publish_all(
        m.port,
        "device-1",
        QoS::AtLeastOnce,
        numbered("line/a", 0..20, 0),
    )
    .await;
    let count = |result: &str| format!("connection=\"site\",result=\"{result}\"");
    let held = g
        .wait_metrics("the messages held", |t| {
            metric(t, "gridlet_mqtt_paused", "connection=\"site\"") == Some(1)
                && metric(t, "gridlet_mqtt_messages_total", &count("received")) == Some(20)
        })
        .await;
    let acked = metric(&held, "gridlet_mqtt_messages_total", &count("acknowledged"));
    assert_eq!(acked, Some(0));

    // The connection changes: the broker sends the 20 again to the new session, held again.
    let mut changed = connection_body(&m);
    changed["properties"]["keepAliveSeconds"] = json!(45);
    let (s, b) = g.put("/mqtt/connections/site", changed).await;
    assert_eq!(s, 200, "{b}");
    g.wait_metric("gridlet_mqtt_messages_total", &count("received"), 40)
        .await;
    // The route changes to a topic that exists: they come a third time, and go in.
    assert_eq!(g.put("/mqtt/routes/r", route("t2")).await.0, 200);
    all_seqs(&mut rx, 20, WAIT * 3).await;
    g.wait_metric("gridlet_mqtt_messages_total", &count("acknowledged"), 20)
        .await;
}

/// Deleting a route: its connection restarts without it and unsubscribes its filter. The
/// messages it held are sent again by the broker and, wanted by no route, acknowledged and
/// counted as refused (not handed to the route that now has its subscription identifier);
/// later messages on its filter no longer come at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_route_is_unsubscribed_and_its_held_messages_go_to_no_other_route() {
    let mdir = tempfile::tempdir().unwrap();
    let m = Mosquitto::start(mdir.path()).await;
    let g = start(&[]).await;
    let mut rx = Receiver::start().await;
    g.topic("ta").await;
    g.topic("tb").await;
    g.webhook_sub("tb", "s", &rx.url("/b"), json!({})).await;
    assert_eq!(
        g.put("/mqtt/connections/site", connection_body(&m)).await.0,
        200
    );
    for (name, filter, topic) in [("a", "a/+", "ta"), ("b", "b/+", "tb")] {
        let r =
            json!({"properties": {"connection": "site", "topicFilter": filter, "topic": topic}});
        assert_eq!(g.put(&format!("/mqtt/routes/{name}"), r).await.0, 200);
    }
    g.wait_metric("gridlet_mqtt_connected", "connection=\"site\"", 1)
        .await;
    // Route a's topic goes: its messages are held.
    assert_eq!(g.delete("/topics/ta").await.0, 200);
    publish_all(
        m.port,
        "device-1",
        QoS::AtLeastOnce,
        numbered("a/x", 0..3, 0),
    )
    .await;
    g.wait_metric("gridlet_mqtt_paused", "connection=\"site\"", 1)
        .await;

    // Route a goes (b, now the first route, takes subscription identifier 1).
    assert_eq!(g.delete("/mqtt/routes/a").await.0, 200);
    let refused = "connection=\"site\",result=\"refused\"";
    g.wait_metric("gridlet_mqtt_messages_total", refused, 3)
        .await;
    g.wait_metric("gridlet_mqtt_connected", "connection=\"site\"", 1)
        .await;
    publish_all(
        m.port,
        "device-1",
        QoS::AtLeastOnce,
        vec![
            json_msg("a/y", json!({"n": 1})),
            json_msg("b/1", json!({"n": 2})),
        ],
    )
    .await;
    let got = events_of(&rx.next().await);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["subject"], "b/1");
    let text = g
        .wait_metric(
            "gridlet_mqtt_messages_total",
            "connection=\"site\",result=\"acknowledged\"",
            4,
        )
        .await;
    assert_eq!(
        metric(&text, "gridlet_mqtt_messages_total", refused),
        Some(3),
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "gridlet_mqtt_messages_total",
            "connection=\"site\",result=\"received\""
        ),
        Some(7),
        "3 held, the same 3 again, b/1; a/y never came: {text}"
    );
    rx.nothing_within(std::time::Duration::from_millis(300))
        .await;
}

async fn refused(g: &TestGridlet, path: &str, body: Value, code: &str, field: &str) {
    let (s, b) = g.put(path, body).await;
    assert_eq!(s, 400, "{path}: {b}");
    assert_eq!(b["error"]["details"]["code"], code, "{b}");
    let msg = b["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains(field), "{field} named in: {b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_400_naming_the_field_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let g = start(&[("outbound__deniedAddressRanges", "10.0.0.0/8")]).await;
    g.topic("egs").await;
    let conn = |props: Value| json!({ "properties": props });
    let c = "/mqtt/connections/c1";
    let code = "InvalidMqttConnection";
    refused(
        &g,
        c,
        conn(json!({"url": "http://b:1883"})),
        code,
        "properties.url",
    )
    .await;
    refused(
        &g,
        c,
        conn(json!({"url": "mqtt://10.1.2.3"})),
        code,
        "properties.url",
    )
    .await;
    refused(&g, c, conn(json!({})), code, "properties.url").await;
    let missing = dir.path().join("missing-ca.pem").display().to_string();
    refused(
        &g,
        c,
        conn(json!({"url": "mqtts://b:8883", "tls": {"caFile": missing}})),
        code,
        "properties.tls.caFile",
    )
    .await;
    refused(
        &g,
        c,
        conn(
            json!({"url": "mqtt://b", "authentication": {"method": "K8S-SAT",
            "tokenFile": "/nonexistent/token"}}),
        ),
        code,
        "properties.authentication.tokenFile",
    )
    .await;
    refused(
        &g,
        c,
        conn(json!({"url": "mqtt://b", "topicfilter": "a"})),
        code,
        "properties.topicfilter",
    )
    .await;
    refused(
        &g,
        c,
        conn(json!({"url": "mqtt://b", "keepAliveSeconds": 1})),
        code,
        "properties.keepAliveSeconds",
    )
    .await;
    refused(
        &g,
        "/mqtt/connections/a__b",
        conn(json!({"url": "mqtt://b"})),
        code,
        "name",
    )
    .await;
    assert_eq!(g.get("/mqtt/connections").await.1, json!([]));

    // A good connection (its broker need not be up), then bad routes on it.
    let (s, b) = g
        .put(
            c,
            conn(json!({"url": "mqtt://127.0.0.1:9", "password": SECRET})),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    // Another connection to that broker may not take its client id.
    refused(
        &g,
        "/mqtt/connections/c2",
        conn(json!({"url": "mqtt://127.0.0.1:9", "clientId": "gridlet-c1"})),
        code,
        "properties.clientId",
    )
    .await;
    let r = "/mqtt/routes/r1";
    let code = "InvalidMqttRoute";
    let route = |filter: &str, topic: &str, extra: Value| {
        let mut p = json!({"connection": "c1", "topicFilter": filter, "topic": topic});
        for (k, v) in extra.as_object().unwrap() {
            p[k] = v.clone();
        }
        json!({ "properties": p })
    };
    refused(
        &g,
        r,
        route("a/#/b", "egs", json!({})),
        code,
        "properties.topicFilter",
    )
    .await;
    refused(
        &g,
        r,
        route("a+", "egs", json!({})),
        code,
        "properties.topicFilter",
    )
    .await;
    refused(
        &g,
        r,
        route("a/#", "nope", json!({})),
        code,
        "properties.topic",
    )
    .await;
    refused(
        &g,
        r,
        route("a/#", "egs", json!({"connection": "other"})),
        code,
        "properties.connection",
    )
    .await;
    refused(
        &g,
        r,
        route("a/#", "egs", json!({"qos": 2})),
        code,
        "properties.qos",
    )
    .await;
    refused(
        &g,
        r,
        route("a/#", "egs", json!({"enrichments": {"site": "x"}})),
        code,
        "properties.enrichments",
    )
    .await;
    refused(
        &g,
        r,
        route("a/#", "egs", json!({"enrichments": {"ID": "x"}})),
        code,
        "properties.enrichments",
    )
    .await;
    assert_eq!(g.get("/mqtt/routes").await.1, json!([]));
    let (_, list) = g.get("/mqtt/connections").await;
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(list[0]["properties"]["url"], "mqtt://127.0.0.1:9");
    assert_eq!(g.get("/mqtt/routes/r1").await.0, 404);
    assert_eq!(g.delete("/mqtt/routes/r1").await.0, 404);

    // A wildcard in a publish topic (the MQTT destination's template) is refused the same way.
    let (s, b) = g
        .put(
            "/topics/egs/eventSubscriptions/out",
            json!({"properties": {"destination": {"endpointType": "Mqtt", "properties": {
                "url": "mqtt://127.0.0.1:9", "topicTemplate": "a/+/${subject}"}}}}),
        )
        .await;
    assert_eq!(s, 400, "{b}");
    assert!(b.to_string().contains("properties.topicTemplate"), "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_connections_are_read_only_and_api_routes_may_use_them() {
    let mdir = tempfile::tempdir().unwrap();
    let m = Mosquitto::start(mdir.path()).await;
    let mut env = source_env(&m, "plant/#", "readings");
    env.push(("mqtt__connections__local__password".into(), SECRET.into()));
    env.push(("mqtt__connections__local__username".into(), "u".into()));
    let g = start(&refs(&env)).await;
    let mut rx = Receiver::start().await;
    readings(&g, &rx).await;
    g.topic("other").await;

    let (s, c) = g.get("/mqtt/connections/local").await;
    assert_eq!(s, 200, "{c}");
    assert_eq!(c["properties"]["managedBy"], "settings");
    assert_eq!(c["properties"]["password"], Value::Null);
    assert_eq!(c["properties"]["receiveMaximum"], 20);
    assert!(!c.to_string().contains(SECRET));
    let (s, r) = g.get("/mqtt/routes/r1").await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["properties"]["topicFilter"], "plant/#");

    let (s, b) = g.put("/mqtt/connections/local", connection_body(&m)).await;
    assert_eq!(s, 400, "{b}");
    assert_eq!(b["error"]["details"]["code"], "DefinedBySettings");
    assert_eq!(g.delete("/mqtt/routes/r1").await.0, 400);
    assert_eq!(g.delete("/mqtt/connections/local").await.0, 400);

    // An API route on the settings connection: the connection restarts with both routes.
    let route = json!({"properties": {"connection": "local", "topicFilter": "extra/+",
        "topic": "readings"}});
    let (s, b) = g.put("/mqtt/routes/extra", route).await;
    assert_eq!(s, 200, "{b}");
    g.wait_metric("gridlet_mqtt_connected", "connection=\"local\"", 1)
        .await;
    publish_all(
        m.port,
        "device-1",
        QoS::AtLeastOnce,
        vec![
            json_msg("extra/a", json!({"n": 1})),
            json_msg("plant/a", json!({"n": 2})),
        ],
    )
    .await;
    let mut subjects = Vec::new();
    while subjects.len() < 2 {
        for e in events_of(&rx.next().await) {
            subjects.push(e["subject"].as_str().unwrap().to_string());
        }
    }
    subjects.sort();
    assert_eq!(subjects, ["extra/a", "plant/a"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_administrator_manages_mqtt_connections() {
    let g = start(&[
        ("inbound__clientAuth__sasKeys__enabled", "true"),
        ("inbound__clientAuth__sasKeys__key1", "admin-key"),
        ("inbound__clientAuth__sasKeys__publishOnlyKeys", "pub-key"),
        ("inbound__clientAuth__sasKeys__metricsKeys", "metrics-key"),
    ])
    .await;
    let body = json!({"properties": {"url": "mqtt://127.0.0.1:9"}});
    for key in [None, Some("pub-key"), Some("metrics-key")] {
        for (method, path) in [
            (reqwest::Method::PUT, "/mqtt/connections/c"),
            (reqwest::Method::GET, "/mqtt/connections"),
            (reqwest::Method::GET, "/mqtt/routes/r"),
            (reqwest::Method::DELETE, "/mqtt/connections/c"),
        ] {
            let mut req = g.client.request(method.clone(), g.url(path)).json(&body);
            if let Some(k) = key {
                req = req.header("aeg-sas-key", k);
            }
            let s = req.send().await.unwrap().status().as_u16();
            let want = if key.is_none() { 401 } else { 403 };
            assert_eq!(s, want, "{method} {path} with {key:?}");
        }
    }
    let r = g
        .client
        .put(g.url("/mqtt/connections/c"))
        .header("aeg-sas-key", "admin-key")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let listed = g
        .client
        .get(g.url("/mqtt/connections"))
        .header("aeg-sas-key", "admin-key")
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(listed[0]["name"], "c");
}
