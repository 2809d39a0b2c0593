//! Secrets never leave gridlet: every secret property of every destination type (each type's own
//! example, listed through the destination registry, as a destination or a dead-letter
//! destination) is absent from GET output, the module twin's reported properties, and the log
//! output of a real gridlet process at debug level that delivered to (and dead-lettered from)
//! every one of them.

use crate::util::{self, eg_event, eventually, Receiver, V};
use gridlet::edge::twin::{reported, TwinErrors};
use gridlet::model::destination::secret_fragments;
use gridlet::model::subscription::Subscription;
use gridlet::model::topic::Topic;
use gridlet::outbound::sinks::DESTINATIONS;
use gridlet::Config;
use serde_json::{json, Value};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;

const SETTINGS: [(&str, &str); 4] = [
    ("outbound__webhook__httpsOnly", "false"),
    ("outbound__eventgrid__httpsOnly", "false"),
    ("outbound__eventgrid__allowInvalidHostnames", "true"),
    ("broker__defaultMaxDeliveryAttempts", "1"),
];

/// One subscription per destination type, and a webhook per dead-letter type with it as the
/// dead-letter destination: `(subscription name, PUT body)`.
fn cases(base: &str) -> Vec<(String, Value)> {
    let webhook = DESTINATIONS.find("WebHook").unwrap().example(base);
    let mut out = Vec::new();
    for kind in DESTINATIONS.kinds() {
        let name = kind.names()[0];
        let dest = json!({"endpointType": name, "properties": kind.example(base)});
        if kind.delivery() {
            out.push((
                format!("to-{}", name.to_ascii_lowercase()),
                json!({"properties": {"destination": dest}}),
            ));
        }
        if kind.dead_letter() {
            out.push((
                format!("dl-{}", name.to_ascii_lowercase()),
                json!({"properties": {
                    "destination": {"endpointType": "WebHook", "properties": webhook},
                    "deadLetterDestination": dest}}),
            ));
        }
    }
    out
}

/// Every secret text in the cases, by where it came from; checks each type's example sets
/// every secret property the type declares.
fn secrets(cases: &[(String, Value)]) -> Vec<(String, String)> {
    let cfg =
        Config::from_vars(SETTINGS.iter().map(|(k, v)| (k.to_string(), v.to_string()))).unwrap();
    let topic = Topic::from_put("t", json!({})).unwrap();
    let mut out = Vec::new();
    for (name, body) in cases {
        let s = Subscription::from_put(&topic, name, body.clone(), &cfg, &DESTINATIONS)
            .unwrap_or_else(|e| panic!("{name}: {}", e.message));
        let record = s.properties();
        let mut dests = vec![(&s.destination, &record["destination"]["properties"], true)];
        if let Some(dl) = &s.delivery.dead_letter {
            // A type that is also a destination has its every secret checked there (as a
            // dead-letter destination, webhook options do not apply).
            let primary = !DESTINATIONS.find(dl.endpoint_type()).unwrap().delivery();
            dests.push((dl, &record["deadLetterDestination"]["properties"], primary));
        }
        for (d, props, primary) in dests {
            let props = props.as_object().unwrap();
            for secret in d.secrets() {
                let found = secret_fragments(props, std::slice::from_ref(secret));
                assert!(
                    !primary || !found.is_empty(),
                    "{name}: the {} example sets no {}",
                    d.endpoint_type(),
                    secret.name
                );
                out.extend(
                    found
                        .into_iter()
                        .map(|f| (format!("{name} {}.{}", d.endpoint_type(), secret.name), f)),
                );
            }
        }
    }
    out
}

fn assert_hidden(what: &str, text: &str, secrets: &[(String, String)]) {
    let leaks: Vec<&(String, String)> = secrets
        .iter()
        .filter(|(_, s)| text.contains(s.as_str()))
        .collect();
    assert!(leaks.is_empty(), "{what} shows secrets: {leaks:?}");
}

#[tokio::test]
async fn no_secret_of_any_destination_type_shows_in_get_the_twin_or_the_logs() {
    let rx = Receiver::start().await;
    rx.respond_with(500);
    let base = format!("http://{}", rx.addr);
    let cases = cases(&base);
    let secrets = secrets(&cases);
    let types = DESTINATIONS.kinds().len();
    assert!(secrets.len() >= types, "{secrets:?}");

    // The module twin's reported properties (in process: the same function the twin task sends).
    let t = util::start(&SETTINGS).await;
    t.topic("t").await;
    for (name, body) in &cases {
        let (s, b) = t
            .put(
                &format!("/topics/t/eventSubscriptions/{name}"),
                body.clone(),
            )
            .await;
        assert_eq!(s, 200, "{name}: {b}");
    }
    let twin = reported(&t.g.broker, &TwinErrors::default());
    assert_hidden("the twin", &twin.to_string(), &secrets);

    // A real process at debug level: GET every subscription and the list, deliver, dead-letter.
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = dir.path().join("gridlet.log");
    let log_file = std::fs::File::create(&log).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gridlet"))
        .current_dir(dir.path())
        .envs(util::base_env(dir.path()))
        .envs(SETTINGS)
        .env("inbound__serverAuth__tlsPolicy", "disabled")
        .env("inbound__httpPort", port.to_string())
        .env("RUST_LOG", "debug")
        .stdout(Stdio::from(log_file.try_clone().unwrap()))
        .stderr(Stdio::from(log_file))
        .spawn()
        .unwrap();
    let api = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    eventually("gridlet to serve", || async {
        let r = client.get(format!("{api}/healthz")).send().await;
        r.map(drop).map_err(|e| e.to_string())
    })
    .await;
    let put = |path: String, body: Value| {
        let client = client.clone();
        async move {
            let r = client.put(path).json(&body).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let (s, b) = put(format!("{api}/topics/t?{V}"), json!({})).await;
    assert_eq!(s, 200, "{b}");
    for (name, body) in &cases {
        let (s, b) = put(
            format!("{api}/topics/t/eventSubscriptions/{name}?{V}"),
            body.clone(),
        )
        .await;
        assert_eq!(s, 200, "{name}: {b}");
        assert_hidden(&format!("PUT {name}"), &b, &secrets);
        let got = client
            .get(format!("{api}/topics/t/eventSubscriptions/{name}?{V}"))
            .send()
            .await
            .unwrap();
        assert_eq!(got.status(), 200);
        assert_hidden(&format!("GET {name}"), &got.text().await.unwrap(), &secrets);
    }
    let list = client
        .get(format!("{api}/topics/t/eventSubscriptions?{V}"))
        .send()
        .await
        .unwrap();
    assert_hidden("GET the list", &list.text().await.unwrap(), &secrets);
    let r = client
        .post(format!("{api}/topics/t/events?{V}"))
        .json(&json!([eg_event("e1", "s", "T", json!({"n": 1}))]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // Every subscription delivering over HTTP reaches the receiver (which answers 500, so each
    // event is dead-lettered after its one attempt, and the dead-letter webhook gets it too).
    let http_subs = cases.len() - 1; // all but EdgeHub
    eventually("a delivery per HTTP subscription", || async {
        let n = rx.count.load(Ordering::Relaxed);
        if n >= http_subs as u64 {
            Ok(())
        } else {
            Err(format!("{n} of {http_subs} arrived"))
        }
    })
    .await;
    assert!(Command::new("kill")
        .arg(child.id().to_string())
        .status()
        .unwrap()
        .success());
    child.wait().unwrap();
    let logs = std::fs::read_to_string(&log).unwrap();
    assert!(logs.contains("DEBUG"), "debug logs were written");
    assert_hidden("the logs", &logs, &secrets);
}
