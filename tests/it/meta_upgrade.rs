//! The metadata file with the real binary (docs/DURABILITY.md, metadata): a device upgraded
//! from a release that kept its metadata in sled starts with everything it had (topics in
//! their order, subscriptions with their queued events and dead letters, endpoint health, MQTT
//! connections), hands out no queue id twice, and keeps the old database aside, also when it is
//! SIGKILLed during that first start; a second gridlet on the same directories is refused.

use crate::child::{command, Gridlet};
use crate::util::*;
use crate::wait::eventually;
use gridlet::model::record::MqttKind;
use gridlet::store::meta::{Contents, MetaStore};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

const S1: &str = "/topics/alpha/eventSubscriptions/s1";

fn env(rust_log: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![
        ("outbound__webhook__httpsOnly", "false"),
        ("metrics__reporterType", "prometheus"),
        // Frozen after more than 2 consecutive failures: an endpoint-health record.
        ("broker__endpointHealth__disableConsecutiveFailures", "100"),
        ("broker__endpointHealth__freezeAnyConsecutiveFailures", "2"),
        ("RUST_LOG", rust_log),
    ]
}

struct Api {
    c: reqwest::Client,
    base: String,
}

impl Api {
    fn new(g: &Gridlet) -> Self {
        Self {
            c: reqwest::Client::new(),
            base: g.base.clone(),
        }
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> (u16, Value) {
        let r = req.send().await.unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    async fn put(&self, path: &str, body: Value) -> Value {
        let url = format!("{}{path}?{V}", self.base);
        let (s, b) = self.send(self.c.put(url).json(&body)).await;
        assert_eq!(s, 200, "PUT {path}: {b}");
        b
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let url = format!("{}{path}?{V}", self.base);
        self.send(self.c.post(url).json(&body)).await
    }

    async fn get(&self, path: &str) -> Value {
        let url = format!("{}{path}?{V}", self.base);
        let (s, b) = self.send(self.c.get(url)).await;
        assert_eq!(s, 200, "GET {path}: {b}");
        b
    }

    async fn delete(&self, path: &str) {
        let url = format!("{}{path}?{V}", self.base);
        assert_eq!(self.send(self.c.delete(url)).await.0, 200, "DELETE {path}");
    }

    async fn publish(&self, id: &str) {
        let body = json!([eg_event(id, "s", "t", json!({"n": id}))]);
        let (s, b) = self.post("/topics/alpha/events", body).await;
        assert_eq!(s, 200, "{b}");
    }

    /// What the test compares across the upgrade: topic names in order, every subscription,
    /// endpoint health, dead letters and MQTT connections.
    async fn state(&self) -> Value {
        let topics = self.get("/topics").await;
        let names: Vec<Value> = topics
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].clone())
            .collect();
        let mut letters: Vec<Value> = self.get(&format!("{S1}/deadLetters")).await["value"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| json!([l["id"], l["eventId"]]))
            .collect();
        letters.sort_by_key(|l| l.to_string());
        json!({
            "topics": names,
            "alpha": self.get("/topics/alpha/eventSubscriptions").await,
            "zeta": self.get("/topics/zeta/eventSubscriptions").await,
            "health": self.get(&format!("{S1}/endpointHealth")).await["state"],
            "letters": letters,
            "mqtt": self.mqtt().await,
        })
    }

    /// The MQTT connections without their live status.
    async fn mqtt(&self) -> Value {
        let mut list = self.get("/mqtt/connections").await;
        for c in list.as_array_mut().unwrap() {
            c["properties"]["status"] = Value::Null;
        }
        list
    }
}

fn meta_file(dir: &Path) -> std::path::PathBuf {
    dir.join("metadataDb/gridlet-v2/meta.json")
}

fn read_meta(dir: &Path) -> Contents {
    serde_json::from_slice(&std::fs::read(meta_file(dir)).unwrap()).unwrap()
}

/// Turn the metadata this build wrote into what a release before it left: the same records in
/// a sled database (`gridlet-v1/meta`, written by the sled writer those releases used), and no
/// metadata file. The event log is the same in both.
fn as_an_earlier_release_left_it(dir: &Path) -> Contents {
    let c = read_meta(dir);
    let root = dir.join("metadataDb");
    std::fs::remove_dir_all(root.join("gridlet-v2")).unwrap();
    let m = gridlet::store::sled::SledMeta::open(&root, 0).unwrap();
    for (key, t) in &c.topics {
        m.write_topic(key, t).unwrap();
    }
    for (q, s) in &c.subs {
        m.write_subscription(*q, s).unwrap();
    }
    while m.new_queue_id().unwrap() < c.next_queue {}
    for (url, h) in &c.health {
        m.write_endpoint_health(url, Some(h)).unwrap();
    }
    for r in c.mqtt.values() {
        m.write_mqtt_record(r.kind, &r.name, Some(r)).unwrap();
    }
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_upgraded_from_sled_keeps_everything_and_reuses_no_queue_id() {
    let dir = tempfile::tempdir().unwrap();
    let mut rx = Receiver::start().await;
    rx.respond_with(500);
    let g = Gridlet::start(dir.path(), 0, &env("warn")).await;
    let api = Api::new(&g);
    // Created out of name order: the order must survive.
    api.put("/topics/zeta", json!({})).await;
    api.put("/topics/alpha", json!({})).await;
    let base = rx.url("");
    let hook = move |path: &str| json!({"endpointType": "WebHook", "properties": {"endpointUrl": format!("{base}{path}")}});
    api.put(
        S1,
        json!({"properties": {"destination": hook("/h"),
            "persistencePolicy": {"isPersisted": true},
            "retryPolicy": {"maxDeliveryAttempts": 1}}}),
    )
    .await;
    api.put(
        "/topics/zeta/eventSubscriptions/s2",
        json!({"properties": {"destination": hook("/z")}}),
    )
    .await;
    let gone = "/topics/zeta/eventSubscriptions/gone";
    api.put(gone, json!({"properties": {"destination": hook("/g")}}))
        .await;
    api.delete(gone).await;
    let mqtt = json!({"properties": {"url": format!("mqtt://127.0.0.1:{}", free_port()),
        "clientId": "gridlet-up", "username": "u", "password": "hunter2-upgrade"}});
    api.put("/mqtt/connections/site", mqtt).await;
    // Three failures dead-letter three events and freeze the endpoint; two more wait for it.
    for i in 0..3 {
        api.publish(&format!("f{i}")).await;
        rx.next().await;
    }
    eventually("the endpoint is frozen, three dead letters", || async {
        let s = api.state().await;
        match (s["health"].as_str(), s["letters"].as_array().map(Vec::len)) {
            (Some("Frozen"), Some(3)) => Ok(()),
            _ => Err(s.to_string()),
        }
    })
    .await;
    api.publish("w1").await;
    api.publish("w2").await;
    let before = api.state().await;
    g.stop();
    assert_eq!(before["letters"].as_array().unwrap().len(), 3, "{before}");

    let old = as_an_earlier_release_left_it(dir.path());
    assert_eq!(old.subs.len(), 2);
    assert_eq!(old.mqtt.len(), 1);
    assert_eq!(old.health.len(), 1);
    assert!(
        old.next_queue > *old.subs.keys().max().unwrap(),
        "a deleted one"
    );

    rx.respond_with(200);
    let g = Gridlet::start(dir.path(), 1, &env("info")).await;
    let api = Api::new(&g);
    assert_eq!(api.state().await, before);
    // The one start that opens sled (its I/O pool stays until the process ends).
    assert!(
        g.threads().iter().any(|t| t.starts_with("sled")),
        "{:?}",
        g.threads()
    );
    let log = g.log();
    let line = log
        .lines()
        .find(|l| l.contains("metadata moved from the sled database"))
        .unwrap_or_else(|| panic!("one INFO line:\n{log}"));
    for counts in ["topics=2", "subscriptions=2", "mqtt=1", "endpoint_health=1"] {
        assert!(line.contains(counts), "{counts}: {line}");
    }
    assert!(!line.contains("hunter2"), "{line}");
    let root = dir.path().join("metadataDb");
    assert!(!root.join("gridlet-v1").exists());
    assert!(
        root.join("gridlet-v1.migrated/meta").is_dir(),
        "nothing deleted"
    );
    // The waiting events go once the endpoint is enabled: the queue ids still match the log.
    let (s, h) = api
        .post(&format!("{S1}/endpointHealth/enable"), json!({}))
        .await;
    assert_eq!(s, 200, "{h}");
    let mut got: Vec<String> = Vec::new();
    while got.len() < 2 {
        got.extend(
            rx.next()
                .await
                .json()
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["id"].as_str().unwrap().to_string()),
        );
    }
    got.sort();
    assert_eq!(got, ["w1", "w2"]);
    // A new subscription takes a fresh queue id.
    api.put(
        "/topics/alpha/eventSubscriptions/s3",
        json!({"properties": {"destination": hook("/n"), "persistencePolicy": {"isPersisted": true}}}),
    )
    .await;
    let after = read_meta(dir.path());
    let (q3, _) = after.subs.iter().find(|(_, s)| s.name == "s3").unwrap();
    assert!(
        *q3 > old.next_queue,
        "queue id {q3} after {}",
        old.next_queue
    );
    g.stop();

    // The next start reads the file only.
    let g = Gridlet::start(dir.path(), 2, &env("info")).await;
    let api = Api::new(&g);
    assert_eq!(api.get("/topics").await.as_array().unwrap().len(), 2);
    assert_eq!(api.mqtt().await, before["mqtt"]);
    assert!(!g.log().contains("metadata moved"), "{}", g.log());
    let threads = g.threads();
    assert!(!threads.is_empty());
    assert!(
        !threads
            .iter()
            .any(|t| t.starts_with("sled") || t == "log flusher"),
        "sled is not opened: {threads:?}"
    );
    g.stop();
    let m = gridlet::store::meta::disk::open(&root).unwrap();
    assert_eq!(m.snapshot().unwrap().1.len(), 3);
    assert_eq!(m.mqtt_records().unwrap()[0].kind, MqttKind::Connection);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gridlet_on_the_same_directories_is_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let g = Gridlet::start(dir.path(), 0, &[]).await;
    let api = Api::new(&g);
    api.put("/topics/t1", json!({})).await;
    let mut second = command(dir.path(), 1, free_port(), &[]).spawn().unwrap();
    // It waits for the lock (an exiting instance would let go), then gives up.
    let status = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::task::spawn_blocking(move || second.wait().unwrap()),
    )
    .await
    .expect("the second gridlet exits")
    .unwrap();
    assert!(!status.success());
    let log = std::fs::read_to_string(dir.path().join("gridlet-1.log")).unwrap();
    assert!(log.contains("in use by another process"), "{log}");
    assert!(log.contains("metadataDb/gridlet-v2"), "{log}");
    // The first one is untouched.
    assert_eq!(api.get("/topics").await.as_array().unwrap().len(), 1);
    g.stop();
}

/// Copy a directory tree (files and directories only).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.file_type().unwrap().is_dir() {
            copy_tree(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

/// Whether the migrating start has reached a step, from its files under `metadataDb`.
type Reached = fn(&Path) -> bool;

/// SIGKILLed during the migrating start, at each step the files show (the lock taken, the
/// file written, sled moved aside): the next start has everything, whatever the step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_during_the_migration_loses_nothing() {
    let template = tempfile::tempdir().unwrap();
    let g = Gridlet::start(template.path(), 0, &env("warn")).await;
    let api = Api::new(&g);
    api.put("/topics/zeta", json!({})).await;
    api.put("/topics/alpha", json!({})).await;
    let hook =
        json!({"endpointType": "WebHook", "properties": {"endpointUrl": "http://127.0.0.1:9/h"}});
    for s in ["s1", "s2"] {
        let path = format!("/topics/alpha/eventSubscriptions/{s}");
        api.put(&path, json!({"properties": {"destination": hook.clone()}}))
            .await;
    }
    let mqtt = json!({"properties": {"url": format!("mqtt://127.0.0.1:{}", free_port())}});
    api.put("/mqtt/connections/site", mqtt).await;
    g.stop();
    let old = as_an_earlier_release_left_it(template.path());
    let steps: [(&str, Reached); 3] = [
        ("the lock taken", |m| {
            m.join("gridlet-v2/meta.lock").exists()
        }),
        ("the file written", |m| {
            m.join("gridlet-v2/meta.json").exists()
        }),
        ("sled moved aside", |m| {
            m.join("gridlet-v1.migrated").exists()
        }),
    ];
    for (i, (step, reached)) in steps.into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        for d in ["metadataDb", "eventsDb"] {
            copy_tree(&template.path().join(d), &dir.path().join(d));
        }
        let meta = dir.path().join("metadataDb");
        let mut child = command(dir.path(), 1, free_port(), &env("warn"))
            .spawn()
            .unwrap();
        // Killed once the step shows (or after it: the promise holds wherever it lands).
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !reached(&meta) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(reached(&meta), "{step}: never reached");
        child.kill().unwrap();
        child.wait().unwrap();
        eprintln!(
            "killed at {step}: file {}, marker {}, sled moved aside {}",
            meta.join("gridlet-v2/meta.json").exists(),
            meta.join("gridlet-v2/meta.format").exists(),
            meta.join("gridlet-v1.migrated").exists()
        );
        let g = Gridlet::start(dir.path(), 2, &env("warn")).await;
        let api = Api::new(&g);
        let names: Vec<String> = api
            .get("/topics")
            .await
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(names.len(), 2, "killed at {step} ({i})");
        let subs = api.get("/topics/alpha/eventSubscriptions").await;
        assert_eq!(
            subs.as_array().unwrap().len(),
            2,
            "killed at {step}: {subs}"
        );
        assert_eq!(
            api.get("/mqtt/connections").await.as_array().unwrap().len(),
            1,
            "killed at {step}"
        );
        g.stop();
        assert!(!meta.join("gridlet-v1").exists(), "killed at {step}");
        assert!(
            meta.join("gridlet-v1.migrated/meta").is_dir(),
            "killed at {step}"
        );
        let after = read_meta(dir.path());
        assert_eq!(
            after, old,
            "killed at {step}: every record, the queue counter too"
        );
    }
}
