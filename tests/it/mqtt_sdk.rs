//! MQTT → queue subscription, read with Microsoft's namespaces SDK (issue 33): messages published
//! with `mosquitto_pub` to a real Mosquitto become CloudEvents in a queue subscription, which
//! Python `azure-eventgrid`'s `EventGridConsumerClient`, unmodified, receives and acknowledges
//! (`tests/pull/sdk_receive.py`, as `pull_sdk.rs` runs it).

use crate::mosquitto::Mosquitto;
use crate::mqtt_source::{refs, source_env};
use crate::pull_sdk::{python, run_client};
use crate::util::*;
use serde_json::{json, Value};

/// `mosquitto_pub -V 5 -q 1` one message with a content type.
async fn mosquitto_pub(m: &Mosquitto, topic: &str, content_type: &str, payload: &str) {
    let args: Vec<String> = [
        "-h",
        "127.0.0.1",
        "-p",
        &m.port.to_string(),
        "-V",
        "5",
        "-q",
        "1",
        "-i",
        "device-1",
        "-t",
        topic,
        "-D",
        "publish",
        "content-type",
        content_type,
        "-m",
        payload,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("mosquitto_pub")
            .args(&args)
            .output()
            .expect("mosquitto_pub runs (apt-get install mosquitto-clients)")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_messages_are_read_from_a_queue_subscription_with_the_python_namespaces_sdk() {
    let dir = tempfile::tempdir().unwrap();
    let m = Mosquitto::start(dir.path()).await;
    let g = start(&refs(&source_env(&m, "plant/#", "q"))).await;
    let (s, b) = g
        .put(
            "/topics/q",
            json!({"properties": {"inputSchema": "CloudEventSchemaV1_0"}}),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let queue = json!({"properties": {"deliveryConfiguration": {"deliveryMode": "Queue"},
        "persistencePolicy": {"isPersisted": true}}});
    let (s, b) = g.put("/topics/q/eventSubscriptions/s", queue).await;
    assert_eq!(s, 200, "{b}");
    g.wait_metric("gridlet_mqtt_connected", "connection=\"local\"", 1)
        .await;

    mosquitto_pub(
        &m,
        "plant/line1/temp",
        "application/json",
        r#"{"celsius":21.5}"#,
    )
    .await;
    mosquitto_pub(&m, "plant/line1/note", "text/plain", "door open").await;
    g.wait_metric(
        "gridlet_mqtt_messages_total",
        "connection=\"local\",result=\"acknowledged\"",
        2,
    )
    .await;

    // With no credential required, the SDK's key is not checked.
    let args = vec![g.base.clone(), "any-key".into(), "q".into(), "s".into()];
    let got = run_client(python(), "sdk_receive.py", args, Vec::new()).await;
    let events: Vec<&Value> = got
        .as_object()
        .map(|o| o.values().collect())
        .unwrap_or_default();
    assert_eq!(events.len(), 2, "{got}");
    let by_type = |ct: &str| {
        events
            .iter()
            .find(|e| e["datacontenttype"] == ct)
            .unwrap_or_else(|| panic!("no {ct} event: {got}"))
    };
    let j = by_type("application/json");
    assert_eq!(j["type"], "dict", "{got}");
    assert_eq!(j["data"], json!({"celsius": 21.5}), "{got}");
    let t = by_type("text/plain");
    assert_eq!(t["data"], "door open", "{got}");
    // The script acknowledged both: nothing is left in the queue.
    g.wait_metric(
        "gridlet_pending_events",
        "topic=\"q\",subscription=\"s\"",
        0,
    )
    .await;
}
