//! Azure destinations against real peers: Azurite (the Azure Storage emulator, npm package
//! `azurite`, installed by `scripts/test.sh` under `~/.cache/gridlet/azurite`) for Storage
//! queues and blob dead letters, and [`StrictBus`], an HTTPS receiver implementing the documented
//! Event Hubs / Service Bus REST batch-send contract strictly (it recomputes the SAS signature
//! and checks expiry, resource URI, key name, content type, query and body), for Event Hubs and
//! Service Bus queues and topics.
//!
//! Test-side signing (Shared Key for reading Azurite back, SAS checking) is written here
//! independently of gridlet's code.

pub use crate::bus_peer::{StrictBus, BUS_KEY};
use crate::child::Gridlet;
use crate::util::free_port;
use crate::util::{eg_event, eventually, eventually_within, poll_within, start, TestGridlet, WAIT};
use base64::Engine as _;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;

pub const DEV_ACCOUNT: &str = "devstoreaccount1";
pub const DEV_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// Where `scripts/test.sh` installs Azurite (`GRIDLET_AZURITE` overrides).
pub fn azurite_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("GRIDLET_AZURITE") {
        return Some(PathBuf::from(p));
    }
    let home = std::env::var_os("HOME")?;
    let p = PathBuf::from(home).join(".cache/gridlet/azurite/node_modules/.bin/azurite");
    p.exists().then_some(p)
}

/// A running Azurite (blob + queue) on free 127.0.0.1 ports, files in a temp dir.
pub struct Azurite {
    child: Child,
    pub queue_port: u16,
    pub blob_port: u16,
    _dir: tempfile::TempDir,
    client: reqwest::Client,
}

impl Drop for Azurite {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Azurite {
    pub async fn start() -> Self {
        gridlet::tls::install_default_provider();
        let bin = azurite_binary().expect(
            "Azurite is not installed: these tests use the real Azure Storage emulator. \
             Run scripts/test.sh (it installs `azurite@3.37.0` with npm under ~/.cache/gridlet/azurite).",
        );
        let dir = tempfile::tempdir().unwrap();
        let (queue_port, blob_port, table_port) = (free_port(), free_port(), free_port());
        let log = std::fs::File::create(dir.path().join("azurite.log")).unwrap();
        let child = Command::new(bin)
            .args(["--location"])
            .arg(dir.path())
            .args(["--skipApiVersionCheck", "--loose", "--disableTelemetry"])
            .args(["--blobHost", "127.0.0.1", "--queueHost", "127.0.0.1"])
            .args(["--tableHost", "127.0.0.1"])
            .args(["--blobPort", &blob_port.to_string()])
            .args(["--queuePort", &queue_port.to_string()])
            .args(["--tablePort", &table_port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("azurite starts");
        let a = Self {
            child,
            queue_port,
            blob_port,
            _dir: dir,
            // Azurite (Node) closes an idle keep-alive connection after 5 s, and a request sent
            // on one it is closing fails: the likely cause of one failed send of this client in
            // the SIGKILL test (2026-11-26; the error text was not kept). Idle connections are
            // dropped well before that.
            client: reqwest::Client::builder()
                .pool_idle_timeout(Duration::from_secs(2))
                .build()
                .expect("client"),
        };
        eventually_within(Duration::from_secs(20), "azurite to listen", || async {
            let q = tokio::net::TcpStream::connect(("127.0.0.1", queue_port)).await;
            let b = tokio::net::TcpStream::connect(("127.0.0.1", blob_port)).await;
            q.and(b).map(drop).map_err(|e| e.to_string())
        })
        .await;
        a
    }

    pub fn queue_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/{DEV_ACCOUNT}", self.queue_port)
    }

    pub fn blob_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/{DEV_ACCOUNT}", self.blob_port)
    }

    /// The connection string gridlet gets (explicit endpoints, the development account).
    pub fn connection_string(&self) -> String {
        format!(
            "DefaultEndpointsProtocol=http;AccountName={DEV_ACCOUNT};AccountKey={DEV_KEY};QueueEndpoint={};BlobEndpoint={};",
            self.queue_endpoint(),
            self.blob_endpoint()
        )
    }

    /// A Shared-Key-signed request to Azurite; returns (status, body).
    pub async fn call(&self, method: &str, url: &str, body: Vec<u8>) -> (u16, String) {
        let u = url::Url::parse(url).unwrap();
        let date = httpdate::fmt_http_date(std::time::SystemTime::now());
        let len = if body.is_empty() {
            String::new()
        } else {
            body.len().to_string()
        };
        let mut query: Vec<(String, String)> = u
            .query_pairs()
            .map(|(k, v)| (k.to_ascii_lowercase(), v.into_owned()))
            .collect();
        query.sort();
        let mut sts = format!(
            "{method}\n\n\n{len}\n\n\n\n\n\n\n\n\nx-ms-date:{date}\nx-ms-version:2021-12-02\n/{DEV_ACCOUNT}{}",
            u.path()
        );
        for (k, v) in query {
            sts.push_str(&format!("\n{k}:{v}"));
        }
        let key = base64::engine::general_purpose::STANDARD
            .decode(DEV_KEY)
            .unwrap();
        let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key);
        let sig = base64::engine::general_purpose::STANDARD
            .encode(ring::hmac::sign(&k, sts.as_bytes()).as_ref());
        let r = self
            .client
            .request(method.parse().unwrap(), url)
            .header("x-ms-date", date)
            .header("x-ms-version", "2021-12-02")
            .header("Authorization", format!("SharedKey {DEV_ACCOUNT}:{sig}"))
            .body(body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    pub async fn create_queue(&self, name: &str) {
        let (s, b) = self
            .call("PUT", &format!("{}/{name}", self.queue_endpoint()), vec![])
            .await;
        assert_eq!(s, 201, "create queue: {b}");
    }

    pub async fn create_container(&self, name: &str) {
        let (s, b) = self
            .call(
                "PUT",
                &format!("{}/{name}?restype=container", self.blob_endpoint()),
                vec![],
            )
            .await;
        assert_eq!(s, 201, "create container: {b}");
    }

    /// Take every message now in `queue` (Get Messages, 32 at a time, hidden for 10 minutes);
    /// returns the raw message texts.
    pub async fn take_messages(&self, queue: &str) -> Vec<String> {
        let mut out = Vec::new();
        loop {
            let (s, b) = self
                .call(
                    "GET",
                    &format!(
                        "{}/{queue}/messages?numofmessages=32&visibilitytimeout=600",
                        self.queue_endpoint()
                    ),
                    vec![],
                )
                .await;
            assert_eq!(s, 200, "get messages: {b}");
            let texts = xml_values(&b, "MessageText");
            if texts.is_empty() {
                return out;
            }
            out.extend(texts);
        }
    }

    /// Wait until `queue` holds `n` messages in total (taking them); returns their texts.
    pub async fn wait_messages(&self, queue: &str, n: usize) -> Vec<String> {
        let all = std::cell::RefCell::new(Vec::new());
        eventually(&format!("{n} messages in {queue}"), || async {
            let got = self.take_messages(queue).await;
            let mut all = all.borrow_mut();
            all.extend(got);
            match all.len() {
                got if got >= n => Ok(()),
                got => Err(format!("{got} arrived")),
            }
        })
        .await;
        all.into_inner()
    }

    /// Names of the blobs in `container`.
    pub async fn list_blobs(&self, container: &str) -> Vec<String> {
        let (s, b) = self
            .call(
                "GET",
                &format!(
                    "{}/{container}?restype=container&comp=list",
                    self.blob_endpoint()
                ),
                vec![],
            )
            .await;
        assert_eq!(s, 200, "list blobs: {b}");
        xml_values(&b, "Name")
    }

    pub async fn get_blob(&self, container: &str, name: &str) -> String {
        let (s, b) = self
            .call(
                "GET",
                &format!("{}/{container}/{name}", self.blob_endpoint()),
                vec![],
            )
            .await;
        assert_eq!(s, 200, "get blob: {b}");
        b
    }
}

/// Every `<tag>…</tag>` text in `xml`, XML entities decoded.
fn xml_values(xml: &str, tag: &str) -> Vec<String> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    xml.split(&open)
        .skip(1)
        .filter_map(|s| s.split(&close).next())
        .map(|s| {
            s.replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&quot;", "\"")
                .replace("&apos;", "'")
                .replace("&amp;", "&")
        })
        .collect()
}

fn decode_b64_event(text: &str) -> Value {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(text)
        .expect("base64 message text");
    serde_json::from_slice(&raw).expect("an event's JSON")
}

pub async fn sub(
    t: &TestGridlet,
    topic: &str,
    name: &str,
    destination: Value,
    extra: Value,
) -> (u16, Value) {
    let mut props = json!({ "destination": destination });
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        props[k] = v;
    }
    t.put(
        &format!("/topics/{topic}/eventSubscriptions/{name}"),
        json!({ "properties": props }),
    )
    .await
}

fn storage_queue(conn: &str, queue: &str) -> Value {
    json!({"endpointType": "StorageQueue", "properties": {"connectionString": conn, "queueName": queue}})
}

pub async fn dead_letters(t: &TestGridlet, topic: &str, name: &str, n: usize) -> Vec<Value> {
    eventually(&format!("{n} dead letters"), || async {
        let (s, b) = t
            .get(&format!(
                "/topics/{topic}/eventSubscriptions/{name}/deadLetters"
            ))
            .await;
        assert_eq!(s, 200, "{b}");
        let v = b["value"].as_array().cloned().unwrap_or_default();
        if v.len() >= n {
            Ok(v)
        } else {
            Err(b.to_string())
        }
    })
    .await
}

pub fn events(prefix: &str, n: usize) -> Value {
    Value::Array(
        (0..n)
            .map(|i| eg_event(&format!("{prefix}{i}"), "s", "t", json!({"i": i})))
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_queue_gets_every_event_once_as_base64_messages() {
    let az = Azurite::start().await;
    az.create_queue("events").await;
    let t = start(&[]).await;
    t.topic("t").await;
    let (s, b) = sub(
        &t,
        "t",
        "q",
        storage_queue(&az.connection_string(), "events"),
        json!({"deliveryPolicy": {"maxEventsPerBatch": 10}}),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    // The account key is a secret: GET and the PUT answer show it masked.
    let (_, got) = t.get("/topics/t/eventSubscriptions/q").await;
    let cs = got["properties"]["destination"]["properties"]["connectionString"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        cs.contains("AccountKey=***") && !cs.contains(DEV_KEY),
        "{cs}"
    );
    assert!(!b.to_string().contains(DEV_KEY), "{b}");
    t.publish("t", events("e", 25)).await;
    t.publish("t", events("f", 15)).await;
    let texts = az.wait_messages("events", 40).await;
    let mut ids: Vec<String> = texts
        .iter()
        .map(|m| decode_b64_event(m)["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    let mut want: Vec<String> = (0..25)
        .map(|i| format!("e{i}"))
        .chain((0..15).map(|i| format!("f{i}")))
        .collect();
    want.sort();
    assert_eq!(ids, want, "every event once");
    let first = decode_b64_event(&texts[0]);
    assert_eq!(first["topic"], "t");
    assert!(az.take_messages("events").await.is_empty(), "no duplicates");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_queue_text_encoding_and_oversized_event_dead_letter() {
    let az = Azurite::start().await;
    az.create_queue("plain").await;
    let t = start(&[]).await;
    t.topic("t").await;
    let dest = json!({"endpointType": "StorageQueue", "properties": {
        "connectionString": az.connection_string(), "queueName": "plain", "messageEncoding": "text"}});
    let (s, b) = sub(&t, "t", "q", dest, json!({})).await;
    assert_eq!(s, 200, "{b}");
    t.publish(
        "t",
        json!([eg_event("small", "s", "t", json!({"x": "<&>"}))]),
    )
    .await;
    let texts = az.wait_messages("plain", 1).await;
    let v: Value = serde_json::from_str(&texts[0]).expect("plain JSON text");
    assert_eq!(v["id"], "small");
    assert_eq!(v["data"]["x"], "<&>");
    // 70 KB of data: more than one message holds; dead-lettered at once, with the reason.
    t.publish(
        "t",
        json!([eg_event("big", "s", "t", json!({"x": "y".repeat(70_000)}))]),
    )
    .await;
    let dl = dead_letters(&t, "t", "q", 1).await;
    assert_eq!(dl[0]["eventId"], "big");
    assert_eq!(dl[0]["deliveryAttempts"], 1);
    let err = dl[0]["lastError"].as_str().unwrap();
    assert!(err.contains("too large") && err.contains("65536"), "{err}");
    assert!(az.take_messages("plain").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_failures_surface_the_service_error_and_dead_letter_to_a_blob() {
    let az = Azurite::start().await;
    az.create_container("deadletters").await;
    az.create_container("ownrecord").await;
    let t = start(&[]).await;
    t.topic("t").await;
    // The queue does not exist: Azurite answers 404 QueueNotFound. One subscription writes
    // Event Grid's blobs (the default), the other gridlet's own record.
    for (name, container, format) in [
        ("My-Sub", "deadletters", None),
        ("own", "ownrecord", Some("gridlet")),
    ] {
        let mut dl = json!({"endpointType": "StorageBlob", "properties": {
            "connectionString": az.connection_string(), "blobContainerName": container}});
        if let Some(f) = format {
            dl["properties"]["deadLetterFormat"] = json!(f);
        }
        let (s, b) = sub(
            &t,
            "t",
            name,
            storage_queue(&az.connection_string(), "missing"),
            json!({"retryPolicy": {"maxDeliveryAttempts": 1}, "deadLetterDestination": dl}),
        )
        .await;
        assert_eq!(s, 200, "{b}");
        let dest = &b["properties"]["deadLetterDestination"];
        assert_eq!(dest["endpointType"], "StorageBlob", "{b}");
    }
    t.publish("t", events("d", 2)).await;
    for name in ["My-Sub", "own"] {
        let dl = dead_letters(&t, "t", name, 2).await;
        for l in &dl {
            assert_eq!(l["lastHttpStatusCode"], 404);
            let err = l["lastError"].as_str().unwrap();
            assert!(err.contains("QueueNotFound"), "{err}");
        }
    }
    let blobs = |container: &'static str, n: usize| {
        let az = &az;
        async move {
            poll_within(WAIT, || async {
                let names = az.list_blobs(container).await;
                let mut count = 0;
                for b in &names {
                    let v: Value = serde_json::from_str(&az.get_blob(container, b).await).unwrap();
                    count += v.as_array().map_or(1, Vec::len);
                }
                if count >= n {
                    Ok(names)
                } else {
                    Err(names)
                }
            })
            .await
            .unwrap_or_else(|n| n)
        }
    };
    // Event Grid's layout: SUBSCRIPTION/y/m/d/h/guid.json, each a JSON array of events with
    // Event Grid's dead-letter fields.
    let names = blobs("deadletters", 2).await;
    let mut letters = Vec::new();
    for n in &names {
        let parts: Vec<&str> = n.split('/').collect();
        assert_eq!(parts.len(), 6, "{n}");
        assert_eq!(parts[0], "MY-SUB", "{n}");
        for p in &parts[1..5] {
            // Hour 0 is "0" (between 00:00 and 01:00 UTC); anything else has no leading zero.
            assert!(
                (*p == "0" || !p.starts_with('0')) && p.parse::<u32>().is_ok(),
                "no zero padding: {n}"
            );
        }
        assert!(parts[5].ends_with(".json") && parts[5].len() == 41, "{n}");
        let v: Value = serde_json::from_str(&az.get_blob("deadletters", n).await).unwrap();
        letters.extend(v.as_array().expect("a JSON array").clone());
    }
    assert_eq!(letters.len(), 2, "{letters:?}");
    for l in &letters {
        assert!(l["id"].as_str().unwrap().starts_with('d'), "{l}");
        assert_eq!(l["eventType"], "t", "the event itself: {l}");
        assert_eq!(l["deadLetterReason"], "MaxDeliveryAttemptsExceeded", "{l}");
        assert_eq!(l["deliveryAttempts"], 1, "{l}");
        assert_eq!(l["lastDeliveryOutcome"], "NotFound", "{l}");
        assert_eq!(l["lastHttpStatusCode"], 404, "{l}");
        assert!(l["publishTime"].as_str().is_some(), "{l}");
        assert!(l["lastDeliveryAttemptTime"].as_str().is_some(), "{l}");
    }
    // gridlet's own record: one blob per letter, time-sorted names.
    let names = blobs("ownrecord", 2).await;
    assert_eq!(names.len(), 2, "{names:?}");
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(sorted, names, "listed in name order");
    assert!(names[0].starts_with("t/own/"), "{names:?}");
    let blob: Value = serde_json::from_str(&az.get_blob("ownrecord", &names[0]).await).unwrap();
    assert_eq!(blob["reason"], "MaxDeliveryAttemptsExceeded", "{blob}");
    assert_eq!(blob["lastHttpStatusCode"], 404);
    assert!(blob["event"]["id"].as_str().unwrap().starts_with('d'));
    assert!(blob["deliveryAttempts"].as_u64().is_some());
    assert!(blob["deadLetteredTime"].as_str().is_some());
}

#[tokio::test]
async fn malformed_azure_destinations_are_400_naming_the_part() {
    let t = start(&[]).await;
    t.topic("t").await;
    let acct = format!("AccountName={DEV_ACCOUNT};AccountKey={DEV_KEY}");
    let eh = |c: &str| json!({"endpointType": "EventHub", "properties": {"connectionString": c}});
    let cases = vec![
        (
            eh("Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=a;SharedAccessKey=b"),
            "EntityPath",
        ),
        (
            eh("SharedAccessKeyName=a;SharedAccessKey=b;EntityPath=e"),
            "Endpoint",
        ),
        (
            eh("Endpoint=sb://ns/;SharedAccessKeyName=a;EntityPath=e"),
            "SharedAccessKey",
        ),
        (
            json!({"endpointType": "serviceBusQueue", "properties": {"connectionString": "nonsense"}}),
            "Key=Value",
        ),
        (
            json!({"endpointType": "ServiceBusTopic", "properties": {"connectionString": "Endpoint=sb://ns/;EntityPath=e"}}),
            "SharedAccessKeyName",
        ),
        (storage_queue("AccountName=a", "queue1"), "AccountKey"),
        (storage_queue(&acct, "Bad_Queue"), "queueName"),
        (storage_queue(&acct, "ab"), "queueName"),
        (
            storage_queue("UseDevelopmentStorage=true", "a--b"),
            "queueName",
        ),
        (
            json!({"endpointType": "StorageQueue", "properties": {"connectionString": acct, "queueName": "queue1", "messageEncoding": "xml"}}),
            "messageEncoding",
        ),
    ];
    for (dest, part) in cases {
        let (s, b) = sub(&t, "t", "s", dest.clone(), json!({})).await;
        assert_eq!(s, 400, "{dest} -> {b}");
        let msg = b["error"]["details"]["message"]
            .as_str()
            .or(b["error"]["message"].as_str())
            .unwrap_or_default()
            .to_string();
        assert!(msg.contains(part), "{dest}: {part} not in {b}");
        assert!(
            !b.to_string().contains("SharedAccessKey=b"),
            "no key echoed: {b}"
        );
    }
    let webhook =
        json!({"endpointType": "WebHook", "properties": {"endpointUrl": "http://127.0.0.1:9/x"}});
    for (dl, part) in [
        (
            json!({"endpointType": "StorageBlob", "properties": {"connectionString": acct, "blobContainerName": "Bad"}}),
            "blobContainerName",
        ),
        (
            json!({"endpointType": "StorageBlob", "properties": {"connectionString": acct}}),
            "blobContainerName",
        ),
        (
            json!({"endpointType": "StorageBlob", "properties": {"connectionString": "AccountName=x", "blobContainerName": "letters"}}),
            "AccountKey",
        ),
    ] {
        let (s, b) = sub(
            &t,
            "t",
            "s",
            webhook.clone(),
            json!({"deadLetterDestination": dl}),
        )
        .await;
        assert_eq!(s, 400, "{dl} -> {b}");
        assert!(b.to_string().contains(part), "{part} not in {b}");
    }
}

// ---------------------------------------------------------------------------------------------
// Event Hubs / Service Bus against the strict REST receiver (`bus_peer.rs`).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_hub_and_service_bus_get_one_message_per_event_in_one_batch_send() {
    let mut bus = StrictBus::start().await;
    let t = start(&[bus.trust()]).await;
    t.topic("t").await;
    for (kind, entity) in [
        ("EventHub", "hub1"),
        ("ServiceBusQueue", "queue1"),
        ("serviceBusTopic", "topic1"),
    ] {
        let dest = json!({"endpointType": kind, "properties": {
            "connectionString": bus.connection_string(entity, BUS_KEY)}});
        let (s, b) = sub(
            &t,
            "t",
            entity,
            dest,
            json!({"deliveryPolicy": {"maxEventsPerBatch": 10}}),
        )
        .await;
        assert_eq!(s, 200, "{b}");
    }
    // Publish before the subscriptions' first batch: held back by nothing, so the three
    // events may go in one or more batch sends, but each arrives as one message.
    t.publish("t", events("m", 3)).await;
    let mut got: std::collections::HashMap<String, Vec<String>> = Default::default();
    while got.values().map(Vec::len).sum::<usize>() < 9 {
        let (entity, evs) = bus.next().await;
        for e in evs {
            assert_eq!(e["topic"], "t");
            got.entry(entity.clone())
                .or_default()
                .push(e["id"].as_str().unwrap().to_string());
        }
    }
    for entity in ["hub1", "queue1", "topic1"] {
        let mut ids = got.remove(entity).unwrap_or_default();
        ids.sort();
        assert_eq!(ids, ["m0", "m1", "m2"], "{entity}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bus_refusals_are_dead_lettered_with_the_service_text_and_413_splits() {
    let mut bus = StrictBus::start().await;
    let t = start(&[bus.trust()]).await;
    t.topic("t").await;
    // A wrong key: 401 from the receiver, its detail in the dead letter.
    let wrong = json!({"endpointType": "EventHub", "properties": {
        "connectionString": bus.connection_string("hub1", "d3Jvbmc=")}});
    let one = json!({"retryPolicy": {"maxDeliveryAttempts": 1}});
    assert_eq!(sub(&t, "t", "wrongkey", wrong, one.clone()).await.0, 200);
    // A queue the namespace does not have: Service Bus answers 410 (a configuration fault:
    // retried, so with one attempt allowed the letter says the attempts ran out).
    let missing = json!({"endpointType": "ServiceBusQueue", "properties": {
        "connectionString": bus.connection_string("nosuch", BUS_KEY)}});
    assert_eq!(sub(&t, "t", "missing", missing, one.clone()).await.0, 200);
    t.publish("t", events("x", 1)).await;
    let dl = dead_letters(&t, "t", "wrongkey", 1).await;
    assert_eq!(dl[0]["lastHttpStatusCode"], 401);
    assert!(
        dl[0]["lastError"]
            .as_str()
            .unwrap()
            .contains("signature mismatch"),
        "{}",
        dl[0]
    );
    let dl = dead_letters(&t, "t", "missing", 1).await;
    assert_eq!(dl[0]["lastHttpStatusCode"], 410);
    assert_eq!(dl[0]["reason"], "MaxDeliveryAttemptsExceeded", "{}", dl[0]);
    assert!(dl[0]["lastError"]
        .as_str()
        .unwrap()
        .contains("MessagingEntityNotFound"));
    t.delete("/topics/t/eventSubscriptions/wrongkey").await;
    t.delete("/topics/t/eventSubscriptions/missing").await;

    // 413: the receiver takes at most ~700 bytes; a batch of four ~300-byte events is split
    // until each request fits, and every event arrives once.
    bus.state.max_body.store(700, Ordering::SeqCst);
    let ok = json!({"endpointType": "EventHub", "properties": {
        "connectionString": bus.connection_string("hub1", BUS_KEY)}});
    assert_eq!(
        sub(&t, "t", "split", ok, json!({"deliveryPolicy": {"maxEventsPerBatch": 4}, "retryPolicy": {"maxDeliveryAttempts": 1}})).await.0,
        200
    );
    let pad = "p".repeat(120);
    let evs: Vec<Value> = (0..4)
        .map(|i| eg_event(&format!("s{i}"), "s", "t", json!({"pad": pad})))
        .collect();
    t.publish("t", Value::Array(evs)).await;
    let mut ids = Vec::new();
    while ids.len() < 4 {
        let (_, evs) = bus.next().await;
        assert!(evs.len() < 4, "split");
        ids.extend(evs.iter().map(|e| e["id"].as_str().unwrap().to_string()));
    }
    ids.sort();
    assert_eq!(ids, ["s0", "s1", "s2", "s3"]);
    // One event alone over the limit: refused at once as too large.
    t.publish(
        "t",
        json!([eg_event("huge", "s", "t", json!({"pad": "q".repeat(2000)}))]),
    )
    .await;
    let dl = dead_letters(&t, "t", "split", 1).await;
    assert_eq!(dl[0]["eventId"], "huge");
    assert!(
        dl[0]["lastError"].as_str().unwrap().contains("too large"),
        "{}",
        dl[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bus_429_is_retried_with_the_same_message_ids() {
    let mut bus = StrictBus::start().await;
    // The eventGridCloud schedule retries after 10 s; Retry-After: 1 is below it, so the
    // retry comes at the schedule's delay: the test checks that a throttled batch is retried
    // and then delivered, not dropped, and that the retry carries the same MessageIds (so a
    // Service Bus queue with duplicate detection absorbs a repeat).
    let t = start(&[bus.trust()]).await;
    t.topic("t").await;
    bus.state.force.store(429, Ordering::SeqCst);
    let dest = json!({"endpointType": "ServiceBusQueue", "properties": {
        "connectionString": bus.connection_string("queue1", BUS_KEY)}});
    assert_eq!(
        sub(
            &t,
            "t",
            "s",
            dest,
            json!({"retryPolicy": {"maxDeliveryAttempts": 3, "schedule": "eventGridCloud"},
                   "deliveryPolicy": {"maxEventsPerBatch": 10}})
        )
        .await
        .0,
        200
    );
    t.publish("t", events("r", 3)).await;
    // Wait for the refusal itself, not the request count: the count rises before the
    // receiver reads `force`, so lifting it on the count could let the first attempt in.
    eventually("a refused attempt", || async {
        match bus.log().iter().any(|l| l.status == 429) {
            false => Err("none refused yet".to_string()),
            true => Ok(()),
        }
    })
    .await;
    bus.state.force.store(0, Ordering::SeqCst);
    let (_, evs) = tokio::time::timeout(Duration::from_secs(30), bus.rx.recv())
        .await
        .expect("retried within the schedule's 10 s")
        .unwrap();
    let mut got: Vec<&str> = evs.iter().map(|e| e["id"].as_str().unwrap()).collect();
    got.sort();
    assert_eq!(got, ["r0", "r1", "r2"], "one batch, retried whole");
    let log = bus.log();
    let ids = |status: u16| -> Vec<(String, String, String)> {
        let mut v: Vec<_> = log
            .iter()
            .filter(|l| l.status == status)
            .flat_map(|l| l.messages.clone())
            .map(|m| {
                (
                    m["BrokerProperties"]["MessageId"]
                        .as_str()
                        .unwrap()
                        .to_string(),
                    m["UserProperties"]["aeg-output-event-id"]
                        .as_str()
                        .unwrap()
                        .to_string(),
                    m["UserProperties"]["aeg-delivery-count"]
                        .as_str()
                        .unwrap()
                        .to_string(),
                )
            })
            .collect();
        v.sort();
        v.dedup();
        v
    };
    let (refused, taken) = (ids(429), ids(201));
    assert_eq!(taken.len(), 3, "{taken:?}");
    let key = |v: &[(String, String, String)]| -> Vec<(String, String)> {
        v.iter().map(|(m, e, _)| (m.clone(), e.clone())).collect()
    };
    assert_eq!(
        key(&refused),
        key(&taken),
        "the retry carries the same MessageIds"
    );
    assert!(refused.iter().all(|(_, _, n)| n == "0"), "{refused:?}");
    assert!(
        taken.iter().all(|(_, _, n)| n != "0"),
        "a retry counts: {taken:?}"
    );
    let (_, b) = t.get("/topics/t/eventSubscriptions/s/deadLetters").await;
    assert_eq!(b["value"].as_array().map(Vec::len), Some(0), "{b}");
}

// ---------------------------------------------------------------------------------------------
// Crash: persisted Azure subscriptions survive SIGKILL.

/// Start the real binary on `dir` (HTTPS on too, the Event Grid retry schedule) trusting
/// `trust` (a setting naming the peer's CA), and wait until it is ready.
async fn spawn_gridlet(dir: &std::path::Path, cycle: usize, trust: (&str, &str)) -> Gridlet {
    let env = [
        ("inbound__serverAuth__tlsPolicy", "enabled"),
        ("broker__retrySchedule", "eventGridCloud"),
        trust,
    ];
    Gridlet::start(dir, cycle, &env).await
}

/// Publish 4-event requests until the process dies; the ids of every request answered 200.
async fn publish_until_killed(client: reqwest::Client, url: String, tag: String) -> Vec<String> {
    let mut acked = Vec::new();
    for n in 0.. {
        let ids: Vec<String> = (0..4).map(|k| format!("{tag}-{n}-{k}")).collect();
        let body: Vec<Value> = ids
            .iter()
            .map(|id| eg_event(id, "s", "t", json!({"pad": "x".repeat(100)})))
            .collect();
        match client.post(&url).json(&body).send().await {
            Ok(r) if r.status().as_u16() == 200 => acked.extend(ids),
            Ok(r) => panic!("publish answered {}", r.status()),
            Err(_) => break,
        }
    }
    acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persisted_azure_subscriptions_lose_no_acknowledged_event_across_sigkill() {
    let az = Azurite::start().await;
    az.create_queue("crash").await;
    let mut bus = StrictBus::start().await;
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let mut acked = std::collections::HashSet::new();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    eprintln!("azure crash test seed {seed}");
    const CYCLES: usize = 4;
    for cycle in 0..CYCLES {
        let p = spawn_gridlet(dir.path(), cycle, bus.trust()).await;
        if cycle == 0 {
            let put = |path: &str, body: Value| {
                client
                    .put(format!("{}{path}?{}", p.base, crate::util::V))
                    .json(&body)
                    .send()
            };
            assert_eq!(put("/topics/t", json!({})).await.unwrap().status(), 200);
            for (name, dest) in [
                ("queue", storage_queue(&az.connection_string(), "crash")),
                (
                    "hub",
                    json!({"endpointType": "EventHub", "properties": {
                        "connectionString": bus.connection_string("hub1", BUS_KEY)}}),
                ),
            ] {
                let sub = json!({"properties": {"destination": dest,
                    "persistencePolicy": {"isPersisted": true},
                    "deliveryPolicy": {"maxEventsPerBatch": 8}}});
                let r = put(&format!("/topics/t/eventSubscriptions/{name}"), sub)
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
            }
        }
        let url = format!("{}/topics/t/events?{}", p.base, crate::util::V);
        let tasks: Vec<_> = (0..2)
            .map(|w| {
                tokio::spawn(publish_until_killed(
                    client.clone(),
                    url.clone(),
                    format!("c{cycle}w{w}"),
                ))
            })
            .collect();
        let wait = 200 + (seed.rotate_left(cycle as u32 * 7) % 600);
        tokio::time::sleep(Duration::from_millis(wait)).await; // under test: kill mid-traffic
        p.kill();
        for t in tasks {
            acked.extend(t.await.unwrap());
        }
    }
    assert!(acked.len() > 40, "published too little: {}", acked.len());
    // A last run without a kill delivers whatever was still pending.
    let _p = spawn_gridlet(dir.path(), CYCLES, bus.trust()).await;
    let in_queue = std::cell::RefCell::new(std::collections::HashSet::new());
    let in_hub = std::cell::RefCell::new(std::collections::HashSet::new());
    let hub_rx = std::cell::RefCell::new(&mut bus.rx);
    let what = "every acknowledged event at both destinations";
    eventually_within(Duration::from_secs(60), what, || async {
        let taken = az.take_messages("crash").await;
        let (mut in_queue, mut in_hub) = (in_queue.borrow_mut(), in_hub.borrow_mut());
        for m in taken {
            in_queue.insert(decode_b64_event(&m)["id"].as_str().unwrap().to_string());
        }
        while let Ok((_, evs)) = hub_rx.borrow_mut().try_recv() {
            in_hub.extend(evs.iter().map(|e| e["id"].as_str().unwrap().to_string()));
        }
        let lost_q = acked.iter().filter(|id| !in_queue.contains(*id)).count();
        let lost_h = acked.iter().filter(|id| !in_hub.contains(*id)).count();
        if lost_q == 0 && lost_h == 0 {
            return Ok(());
        }
        Err(format!(
            "of {} acknowledged events, {lost_q} never reached the Storage queue and {lost_h} never reached the event hub",
            acked.len()
        ))
    })
    .await;
    eprintln!(
        "azure crash: {} acknowledged over {CYCLES} kills, all delivered to both destinations",
        acked.len()
    );
}
