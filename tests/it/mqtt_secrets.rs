//! MQTT connection secrets (a password, a service-account token file's contents) never leave
//! gridlet: no API answer and no log line of a real process at debug level shows them.

use crate::mosquitto::{publish_all, Mosquitto, Msg};
use crate::mqtt_source::events_of;
use crate::util::*;
use rumqttc::v5::mqttbytes::v5::PublishProperties;
use rumqttc::v5::mqttbytes::QoS;
use serde_json::{json, Value};

const SECRET: &str = "hunter2-mqtt-password";

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

/// The password and the token file's contents appear in no answer and no log line of a real
/// gridlet process at debug level, through PUTs, GETs, a refused PUT, a connection the broker
/// refuses and one that delivers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_mqtt_secret_shows_in_answers_or_the_logs() {
    const TOKEN: &str = "eyJ-k8s-service-account-token-secret";
    let dir = tempfile::tempdir().unwrap();
    let m = Mosquitto::start(dir.path()).await;
    let token = dir.path().join("token");
    std::fs::write(&token, TOKEN).unwrap();
    let mut rx = Receiver::start().await;
    let port = crate::util::free_port();
    let log = dir.path().join("gridlet.log");
    let log_file = std::fs::File::create(&log).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_gridlet"))
        .current_dir(dir.path())
        .envs(base_env(dir.path()))
        .env("inbound__serverAuth__tlsPolicy", "disabled")
        .env("inbound__httpPort", port.to_string())
        .env("RUST_LOG", "debug")
        .stdout(std::process::Stdio::from(log_file.try_clone().unwrap()))
        .stderr(std::process::Stdio::from(log_file))
        .spawn()
        .unwrap();
    let api = format!("http://127.0.0.1:{port}");
    gridlet::tls::install_default_provider();
    let client = reqwest::Client::new();
    eventually("gridlet to serve", || async {
        let r = client.get(format!("{api}/healthz")).send().await;
        r.map(drop).map_err(|e| e.to_string())
    })
    .await;
    let call = |method: reqwest::Method, path: &str, body: Option<Value>| {
        let req = client.request(method, format!("{api}{path}?{V}"));
        let req = match body {
            Some(b) => req.json(&b),
            None => req,
        };
        async move {
            let r = req.send().await.unwrap();
            let s = r.status().as_u16();
            let text = r.text().await.unwrap();
            assert!(!text.contains(SECRET) && !text.contains(TOKEN), "{text}");
            (s, text)
        }
    };
    use reqwest::Method;
    let topic = json!({"properties": {"inputSchema": "CloudEventSchemaV1_0"}});
    assert_eq!(call(Method::PUT, "/topics/t", Some(topic)).await.0, 200);
    let hook = json!({"properties": {"destination": {"endpointType": "WebHook",
        "properties": {"endpointUrl": rx.url("/h")}}}});
    let (s, b) = call(Method::PUT, "/topics/t/eventSubscriptions/h", Some(hook)).await;
    assert_eq!(s, 200, "{b}");
    // The broker refuses this one (Mosquitto has no K8S-SAT): its failures are logged.
    let sat = json!({"properties": {"url": m.url(), "username": "u", "password": SECRET,
        "authentication": {"method": "K8S-SAT", "tokenFile": token}}});
    let (s, b) = call(Method::PUT, "/mqtt/connections/sat", Some(sat)).await;
    assert_eq!(s, 200, "{b}");
    let plain = json!({"properties": {"url": m.url(), "username": "u", "password": SECRET}});
    let (s, b) = call(Method::PUT, "/mqtt/connections/plain", Some(plain)).await;
    assert_eq!(s, 200, "{b}");
    let route = json!({"properties": {"connection": "plain", "topicFilter": "s/#", "topic": "t"}});
    let (s, b) = call(Method::PUT, "/mqtt/routes/r", Some(route)).await;
    assert_eq!(s, 200, "{b}");
    let bad = json!({"properties": {"url": "mqtts://b", "password": SECRET,
        "tls": {"caFile": dir.path().join("none.pem")}}});
    let (s, b) = call(Method::PUT, "/mqtt/connections/bad", Some(bad)).await;
    assert_eq!(s, 400, "{b}");
    call(Method::GET, "/mqtt/connections", None).await;
    call(Method::GET, "/mqtt/connections/sat", None).await;
    eventually("the route connected", || async {
        let (_, b) = call(Method::GET, "/mqtt/connections/plain", None).await;
        let v: Value = serde_json::from_str(&b).unwrap();
        match v["properties"]["status"]["connected"] == true {
            true => Ok(()),
            false => Err(b),
        }
    })
    .await;
    publish_all(
        m.port,
        "device-1",
        QoS::AtLeastOnce,
        vec![json_msg("s/1", json!({"n": 1}))],
    )
    .await;
    assert_eq!(events_of(&rx.next().await)[0]["subject"], "s/1");
    eventually("the K8S-SAT connection refused", || async {
        let (_, b) = call(Method::GET, "/mqtt/connections/sat", None).await;
        let v: Value = serde_json::from_str(&b).unwrap();
        match v["properties"]["status"]["connectionErrors"].as_u64() {
            Some(n) if n >= 1 => Ok(()),
            _ => Err(b),
        }
    })
    .await;
    assert!(std::process::Command::new("kill")
        .arg(child.id().to_string())
        .status()
        .unwrap()
        .success());
    child.wait().unwrap();
    let logs = std::fs::read_to_string(&log).unwrap();
    assert!(
        logs.contains("DEBUG") && logs.contains("MQTT connection set through the management API"),
        "debug logs were written"
    );
    assert!(!logs.contains(SECRET), "the password is in the logs");
    assert!(!logs.contains(TOKEN), "the token is in the logs");
}
