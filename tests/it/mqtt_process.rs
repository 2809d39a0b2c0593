//! MQTT sources with the real binary: SIGKILLed mid-stream, nothing it acknowledged is lost
//! (docs/MQTT.md, "At least once").

use crate::mosquitto::{publish_all, Mosquitto};
use crate::mqtt_source::{all_seqs_after, events_of, numbered, source_env};
use crate::util::*;
use rumqttc::v5::mqttbytes::QoS;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};

fn gridlet_process(dir: &std::path::Path, port: u16, env: &[(String, String)]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_gridlet"))
        .current_dir(dir)
        .env("inbound__serverAuth__tlsPolicy", "disabled")
        .env("inbound__clientAuth__clientCert__enabled", "false")
        .env("outbound__webhook__httpsOnly", "false")
        .env("inbound__bindAddress", "127.0.0.1")
        .env("inbound__httpPort", port.to_string())
        .env("metrics__reporterType", "prometheus")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdout(Stdio::from(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join("gridlet.log"))
                .unwrap(),
        ))
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Wait until the process serves and its MQTT connection is subscribed.
async fn serving(client: &reqwest::Client, base: &str) {
    eventually("gridlet's MQTT source connected", || async {
        let text = client
            .get(format!("{base}/metrics?{V}"))
            .send()
            .await
            .map_err(|e| e.to_string())?
            .text()
            .await
            .map_err(|e| e.to_string())?;
        match metric(&text, "gridlet_mqtt_connected", "connection=\"local\"") {
            Some(1) => Ok(()),
            _ => Err(text),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_stream_loses_no_acknowledged_message() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("gridlet");
    std::fs::create_dir_all(&data).unwrap();
    let m = Mosquitto::start(dir.path()).await;
    let env = source_env(&m, "line/#", "t");
    gridlet::tls::install_default_provider();
    let client = reqwest::Client::new();
    let port = crate::util::free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut child = gridlet_process(&data, port, &env);
    serving(&client, &base).await;
    let put = |path: &str, body: Value| client.put(format!("{base}{path}?{V}")).json(&body).send();
    assert_eq!(put("/topics/t", json!({})).await.unwrap().status(), 200);
    let mut rx = Receiver::start().await;
    let sub = json!({"properties": {
        "destination": {"endpointType": "WebHook", "properties": {"endpointUrl": rx.url("/s")}},
        "persistencePolicy": {"isPersisted": true}
    }});
    assert_eq!(
        put("/topics/t/eventSubscriptions/s", sub)
            .await
            .unwrap()
            .status(),
        200
    );

    let n = 2000;
    let publisher = tokio::spawn(publish_all(
        m.port,
        "device-1",
        QoS::AtLeastOnce,
        numbered("line/a", 0..n, 0),
    ));
    // Mid-stream: batches are being accepted and acknowledged one after the other (some events
    // delivered, some accepted and not yet delivered, the rest waiting at the broker).
    let metrics_url = format!("{base}/metrics?{V}");
    eventually("gridlet acknowledging mid-stream", || async {
        let text = client
            .get(&metrics_url)
            .send()
            .await
            .map_err(|e| e.to_string())?
            .text()
            .await
            .map_err(|e| e.to_string())?;
        let acked = metric(
            &text,
            "gridlet_mqtt_messages_total",
            "connection=\"local\",result=\"acknowledged\"",
        );
        match acked {
            Some(a) if a >= 200 => Ok(()),
            other => Err(format!("{other:?} acknowledged")),
        }
    })
    .await;
    child.kill().unwrap();
    child.wait().unwrap();
    let mut seen = BTreeSet::new();
    while let Ok(r) = rx.rx.try_recv() {
        for ev in events_of(&r) {
            seen.insert(ev["data"]["seq"].as_u64().unwrap());
        }
    }

    let mut child = gridlet_process(&data, port, &env);
    serving(&client, &base).await;
    publisher.await.unwrap();
    let all = all_seqs_after(&mut rx, n, WAIT * 3, seen).await;
    assert_eq!(all.len() as u32, n);
    let _ = child.kill();
    let _ = child.wait();
}

/// A bad MQTT setting stops the binary before anything starts: exit status 2 and one line
/// naming the setting, like every other invalid setting.
#[test]
fn a_bad_mqtt_setting_stops_start_up_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gridlet"))
        .current_dir(dir.path())
        .env("mqtt__connections__plant__url", "http://broker")
        .env("mqtt__routes__r__connection", "plant")
        .env("mqtt__routes__r__topicFilter", "a/#")
        .env("mqtt__routes__r__topic", "t")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("mqtt__connections__plant__url") && err.contains("unknown scheme `http`"),
        "{err}"
    );
}
