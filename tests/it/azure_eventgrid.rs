//! Azure destinations behave as Event Grid does (issue 24): Event Grid's message properties,
//! stable `MessageId`s, per-event outcomes (one oversized event dead-letters only itself),
//! the status-code table for Azure resources, Storage queue message TTL. Against the strict
//! REST receiver (`bus_peer.rs`) and Azurite.

use crate::azure::{dead_letters, events, sub, Azurite};
use crate::bus_peer::{StrictBus, BUS_KEY};
use crate::util::{eg_event, eventually, metric, start};
use serde_json::{json, Value};

/// The batch messages the receiver accepted for `entity`.
fn accepted(bus: &StrictBus, entity: &str) -> Vec<Value> {
    bus.log()
        .into_iter()
        .filter(|l| l.entity == entity && l.status == 201)
        .flat_map(|l| l.messages)
        .collect()
}

fn event_id(message: &Value) -> String {
    let body: Value = serde_json::from_str(message["Body"].as_str().unwrap()).unwrap();
    let event = if body.is_array() { &body[0] } else { &body };
    event["id"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bus_messages_carry_event_grids_application_properties() {
    let mut bus = StrictBus::start().await;
    let t = start(&[bus.trust()]).await;
    t.topic("t").await;
    for (kind, entity, name) in [
        ("ServiceBusQueue", "queue1", "toQueue"),
        ("EventHub", "hub1", "toHub"),
    ] {
        let dest = json!({"endpointType": kind, "properties": {
            "connectionString": bus.connection_string(entity, BUS_KEY)}});
        let (s, b) = sub(&t, "t", name, dest, json!({})).await;
        assert_eq!(s, 200, "{b}");
    }
    let mut e = eg_event("p1", "s", "Contoso.Items.ItemReceived", json!({"x": 1}));
    e["dataVersion"] = json!("2.0");
    t.publish("t", json!([e])).await;
    bus.next().await;
    bus.next().await;
    for (entity, sub_name) in [("queue1", "TOQUEUE"), ("hub1", "TOHUB")] {
        let m = accepted(&bus, entity);
        assert_eq!(m.len(), 1, "{entity}: {m:?}");
        let p = &m[0]["UserProperties"];
        assert_eq!(p["aeg-subscription-name"], sub_name, "{p}");
        assert_eq!(p["aeg-delivery-count"], "0", "{p}");
        assert_eq!(p["aeg-event-type"], "Notification", "{p}");
        assert_eq!(p["aeg-metadata-version"], "1", "{p}");
        assert_eq!(p["aeg-data-version"], "2.0", "{p}");
        assert_eq!(p["aeg-output-event-id"], "p1", "{p}");
    }
    // Framing: a Service Bus body is the event, an Event Hubs body an array of one event.
    let body = |entity| -> Value {
        serde_json::from_str(accepted(&bus, entity)[0]["Body"].as_str().unwrap()).unwrap()
    };
    assert_eq!(body("queue1")["id"], "p1");
    assert_eq!(body("hub1").as_array().map(Vec::len), Some(1));
    assert_eq!(body("hub1")[0]["id"], "p1");
    let q = accepted(&bus, "queue1");
    let id = q[0]["BrokerProperties"]["MessageId"].as_str().unwrap();
    assert_eq!(id.len(), 32, "{id}");
    assert!(
        accepted(&bus, "hub1")[0].get("BrokerProperties").is_none(),
        "Event Hubs messages carry no MessageId"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_oversized_event_is_dead_lettered_alone_and_the_rest_delivered() {
    let bus = StrictBus::start().await;
    // The namespace takes 20 KB per request; the subscription says the tier allows 1 MB, so
    // gridlet sends the batch whole and learns the limit from Service Bus's 403.
    bus.state
        .max_body
        .store(20_000, std::sync::atomic::Ordering::SeqCst);
    let t = start(&[bus.trust()]).await;
    t.topic("t").await;
    let dest = json!({"endpointType": "ServiceBusQueue", "properties": {
        "connectionString": bus.connection_string("queue1", BUS_KEY),
        "maxBatchSizeInKilobytes": 1024}});
    let (s, b) = sub(
        &t,
        "t",
        "q",
        dest,
        json!({"deliveryPolicy": {"maxEventsPerBatch": 10}}),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(
        b["properties"]["destination"]["properties"]["maxBatchSizeInKilobytes"],
        1024
    );
    let evs: Vec<Value> = (0..10)
        .map(|i| {
            let pad = if i == 4 { 30_000 } else { 100 };
            eg_event(&format!("b{i}"), "s", "t", json!({"pad": "x".repeat(pad)}))
        })
        .collect();
    t.publish("t", Value::Array(evs)).await;
    let dl = dead_letters(&t, "t", "q", 1).await;
    assert_eq!(dl.len(), 1, "{dl:?}");
    assert_eq!(dl[0]["eventId"], "b4");
    assert_eq!(dl[0]["reason"], "DeliveryRefused");
    assert_eq!(dl[0]["deliveryAttempts"], 1);
    let err = dl[0]["lastError"].as_str().unwrap();
    assert!(err.contains("too large") && err.contains("403"), "{err}");
    eventually("the other nine delivered", || async {
        let ids: Vec<String> = accepted(&bus, "queue1").iter().map(event_id).collect();
        if ids.len() >= 9 {
            Ok(())
        } else {
            Err(format!("{ids:?}"))
        }
    })
    .await;
    let mut ids: Vec<String> = accepted(&bus, "queue1").iter().map(event_id).collect();
    ids.sort();
    let want: Vec<String> = (0..10)
        .filter(|i| *i != 4)
        .map(|i| format!("b{i}"))
        .collect();
    assert_eq!(ids, want, "each once, the oversized one never");
    let log = bus.log();
    assert_eq!(log[0].messages.len(), 10, "sent as one batch first");
    assert_eq!(log[0].status, 403);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_400_and_403_are_not_retried_under_either_policy() {
    let bus = StrictBus::start().await;
    let t = start(&[bus.trust()]).await;
    t.topic("t").await;
    for policy in ["original", "standard"] {
        let dest = json!({"endpointType": "ServiceBusQueue", "properties": {
            "connectionString": bus.connection_string("queue1", BUS_KEY)}});
        let (s, b) = sub(
            &t,
            "t",
            policy,
            dest,
            json!({"retryPolicy": {"statusCodePolicy": policy, "maxDeliveryAttempts": 30}}),
        )
        .await;
        assert_eq!(s, 200, "{b}");
    }
    for (status, text) in [
        (403, "QuotaExceeded: the entity is full"),
        (400, "BadRequest"),
    ] {
        bus.force(status, text);
        let before = bus.log().len();
        t.publish("t", events(&format!("r{status}-"), 1)).await;
        for policy in ["original", "standard"] {
            let dl = eventually(&format!("{policy}: {status} dead-lettered"), || async {
                let (_, b) = t
                    .get(&format!(
                        "/topics/t/eventSubscriptions/{policy}/deadLetters"
                    ))
                    .await;
                let v = b["value"].as_array().cloned().unwrap_or_default();
                v.into_iter()
                    .find(|l| l["lastHttpStatusCode"] == status)
                    .ok_or_else(|| b.to_string())
            })
            .await;
            assert_eq!(dl["reason"], "DeliveryRefused", "{dl}");
            assert_eq!(dl["deliveryAttempts"], 1, "{dl}");
            assert!(dl["lastError"].as_str().unwrap().contains(text), "{dl}");
        }
        assert_eq!(bus.log().len() - before, 2, "one attempt per subscription");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configuration_faults_are_retried_logged_and_counted_apart() {
    let bus = StrictBus::start().await;
    let t = start(&[bus.trust()]).await;
    t.topic("t").await;
    let one = json!({"retryPolicy": {"maxDeliveryAttempts": 1}});
    for (name, kind, entity, key) in [
        ("wrongkey", "EventHub", "hub1", "d3Jvbmc="),
        ("nohub", "EventHub", "hub9", BUS_KEY),
        ("noqueue", "ServiceBusQueue", "queue9", BUS_KEY),
    ] {
        let dest = json!({"endpointType": kind, "properties": {
            "connectionString": bus.connection_string(entity, key)}});
        assert_eq!(sub(&t, "t", name, dest, one.clone()).await.0, 200);
    }
    t.publish("t", events("c", 1)).await;
    for (name, status, fault) in [
        ("wrongkey", 401, "unauthorized"),
        ("nohub", 404, "notFound"),
        ("noqueue", 410, "gone"),
    ] {
        let dl = dead_letters(&t, "t", name, 1).await;
        assert_eq!(dl[0]["lastHttpStatusCode"], status, "{}", dl[0]);
        // Retryable: with one attempt allowed, the attempts ran out (not refused).
        assert_eq!(dl[0]["reason"], "MaxDeliveryAttemptsExceeded", "{}", dl[0]);
        let labels = format!("topic=\"t\",subscription=\"{name}\",fault=\"{fault}\"");
        let m = t.metrics().await;
        assert_eq!(
            metric(&m, "gridlet_destination_faults_total", &labels),
            Some(1),
            "{labels}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_queue_message_ttl_and_per_event_refusal() {
    let az = Azurite::start().await;
    az.create_queue("ttl").await;
    az.create_queue("forever").await;
    let t = start(&[]).await;
    t.topic("t").await;
    for (name, queue, ttl) in [
        ("ttl", "ttl", json!(3600)),
        ("forever", "forever", json!(-1)),
    ] {
        let dest = json!({"endpointType": "StorageQueue", "properties": {
            "connectionString": az.connection_string(), "queueName": queue,
            "queueMessageTimeToLiveInSeconds": ttl}});
        let (s, b) = sub(
            &t,
            "t",
            name,
            dest,
            json!({"deliveryPolicy": {"maxEventsPerBatch": 10}}),
        )
        .await;
        assert_eq!(s, 200, "{b}");
        assert_eq!(
            b["properties"]["destination"]["properties"]["queueMessageTimeToLiveInSeconds"],
            ttl
        );
    }
    for bad in [json!(0), json!(-2), json!("soon")] {
        let dest = json!({"endpointType": "StorageQueue", "properties": {
            "connectionString": az.connection_string(), "queueName": "ttl",
            "queueMessageTimeToLiveInSeconds": bad}});
        let (s, b) = sub(&t, "t", "bad", dest, json!({})).await;
        assert_eq!(s, 400, "{bad}: {b}");
        assert!(
            b.to_string().contains("queueMessageTimeToLiveInSeconds"),
            "{b}"
        );
    }
    // A batch of ten, one too large for a queue message: the nine others arrive.
    let evs: Vec<Value> = (0..10)
        .map(|i| {
            let pad = if i == 7 { 70_000 } else { 10 };
            eg_event(&format!("q{i}"), "s", "t", json!({"pad": "y".repeat(pad)}))
        })
        .collect();
    t.publish("t", Value::Array(evs)).await;
    for name in ["ttl", "forever"] {
        let dl = dead_letters(&t, "t", name, 1).await;
        assert_eq!(dl.len(), 1, "{dl:?}");
        assert_eq!(dl[0]["eventId"], "q7");
        assert_eq!(dl[0]["reason"], "DeliveryRefused");
    }
    // Peek (not take) to read each message's insertion and expiration times.
    let peek = |queue: &'static str| {
        let az = &az;
        async move {
            let url = format!(
                "{}/{queue}/messages?peekonly=true&numofmessages=32",
                az.queue_endpoint()
            );
            az.call("GET", &url, vec![]).await.1
        }
    };
    let xml = eventually("nine messages with a one-hour TTL", || async {
        let xml = peek("ttl").await;
        match xml.matches("<QueueMessage>").count() {
            9 => Ok(xml),
            n => Err(format!("{n}")),
        }
    })
    .await;
    let times = |xml: &str, tag: &str| -> Vec<std::time::SystemTime> {
        let open = format!("<{tag}>");
        xml.split(&open)
            .skip(1)
            .filter_map(|s| s.split('<').next())
            .map(|s| httpdate::parse_http_date(s).unwrap())
            .collect()
    };
    let inserted = times(&xml, "InsertionTime");
    let expires = times(&xml, "ExpirationTime");
    for (i, e) in inserted.iter().zip(&expires) {
        assert_eq!(e.duration_since(*i).unwrap().as_secs(), 3600);
    }
    let xml = eventually("nine messages that never expire", || async {
        let xml = peek("forever").await;
        match xml.matches("<QueueMessage>").count() {
            9 => Ok(xml),
            n => Err(format!("{n}")),
        }
    })
    .await;
    assert_eq!(
        xml.matches("<ExpirationTime>Fri, 31 Dec 9999 23:59:59 GMT</ExpirationTime>")
            .count(),
        9,
        "{xml}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_attributes_static_and_dynamic_for_bus_hub_and_webhook() {
    let mut bus = StrictBus::start().await;
    let mut hook = crate::util::Receiver::start().await;
    let t = start(&[bus.trust(), ("outbound__webhook__httpsOnly", "false")]).await;
    t.topic("t").await;
    let sb = json!({"endpointType": "ServiceBusQueue", "properties": {
    "connectionString": bus.connection_string("queue1", BUS_KEY),
    "deliveryAttributeMappings": [
        {"name": "SessionId", "type": "Dynamic", "properties": {"sourceField": "subject"}},
        {"name": "Label", "type": "Static", "properties": {"value": "orders", "isSecret": false}},
        {"name": "Tenant", "type": "Static", "properties": {"value": "tenant-secret-1", "isSecret": true}},
        {"name": "Channel", "type": "Dynamic", "properties": {"sourceField": "data.system"}}
    ]}});
    let eh = json!({"endpointType": "EventHub", "properties": {
    "connectionString": bus.connection_string("hub1", BUS_KEY),
    "deliveryAttributeMappings": [
        {"name": "PartitionKey", "type": "Dynamic", "properties": {"sourceField": "data.system"}},
        {"name": "Region", "type": "Static", "properties": {"value": "eu"}}
    ]}});
    let wh = json!({"endpointType": "WebHook", "properties": {
    "endpointUrl": hook.url("/h"),
    "deliveryAttributeMappings": [
        {"name": "X-Channel", "type": "Dynamic", "properties": {"sourceField": "data.system"}},
        {"name": "X-Api-Key", "type": "Static", "properties": {"value": "hook-secret-2", "isSecret": true}}
    ]}});
    for (name, dest) in [("sb", sb), ("eh", eh), ("wh", wh)] {
        let (s, b) = sub(&t, "t", name, dest, json!({})).await;
        assert_eq!(s, 200, "{b}");
        assert!(
            !b.to_string().contains("secret-"),
            "the PUT answer masks secret values: {b}"
        );
        let (_, got) = t.get(&format!("/topics/t/eventSubscriptions/{name}")).await;
        let maps = &got["properties"]["destination"]["properties"]["deliveryAttributeMappings"];
        assert!(maps.as_array().is_some_and(|a| !a.is_empty()), "{got}");
        assert!(!got.to_string().contains("secret-"), "GET masks: {got}");
    }
    // Refused: a static MessageId, aeg- names, SessionId with MessageId, Storage queues.
    for (dest, part) in [
        (
            json!({"endpointType": "ServiceBusQueue", "properties": {
            "connectionString": bus.connection_string("queue1", BUS_KEY),
            "deliveryAttributeMappings": [{"name": "MessageId", "type": "Static", "properties": {"value": "x"}}]}}),
            "MessageId",
        ),
        (
            json!({"endpointType": "EventHub", "properties": {
            "connectionString": bus.connection_string("hub1", BUS_KEY),
            "deliveryAttributeMappings": [{"name": "aeg-x", "properties": {"value": "x"}}]}}),
            "aeg-",
        ),
        (
            json!({"endpointType": "ServiceBusTopic", "properties": {
            "connectionString": bus.connection_string("topic1", BUS_KEY),
            "deliveryAttributeMappings": [
                {"name": "SessionId", "properties": {"value": "s"}},
                {"name": "MessageId", "type": "Dynamic", "properties": {"sourceField": "id"}}]}}),
            "SessionId or MessageId",
        ),
    ] {
        let (s, b) = sub(&t, "t", "bad", dest, json!({})).await;
        assert_eq!(s, 400, "{b}");
        assert!(b.to_string().contains(part), "{part}: {b}");
    }
    let mut e = eg_event("a1", "session-7", "t", json!({"system": "north"}));
    e["dataVersion"] = json!("1.0");
    t.publish("t", json!([e])).await;
    bus.next().await;
    bus.next().await;
    let m = &accepted(&bus, "queue1")[0];
    assert_eq!(m["BrokerProperties"]["SessionId"], "session-7", "{m}");
    assert_eq!(m["BrokerProperties"]["Label"], "orders", "{m}");
    assert_eq!(m["UserProperties"]["Tenant"], "tenant-secret-1", "{m}");
    assert_eq!(m["UserProperties"]["Channel"], "north", "{m}");
    assert!(m["BrokerProperties"]["MessageId"].is_string(), "{m}");
    let m = &accepted(&bus, "hub1")[0];
    assert_eq!(m["BrokerProperties"]["PartitionKey"], "north", "{m}");
    assert_eq!(m["UserProperties"]["Region"], "eu", "{m}");
    let r = hook.next().await;
    assert_eq!(r.headers["x-channel"], "north");
    assert_eq!(r.headers["x-api-key"], "hook-secret-2");
}

/// A ready-made Event Hubs / Service Bus token for `entity` of `bus`, expiring at `se`.
fn bus_token(bus: &StrictBus, entity: &str, se: u64) -> String {
    use base64::Engine as _;
    let enc = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    let sr = enc(&format!("https://localhost:{}/{entity}", bus.port));
    let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, BUS_KEY.as_bytes());
    let sig = base64::engine::general_purpose::STANDARD
        .encode(ring::hmac::sign(&k, format!("{sr}\n{se}").as_bytes()).as_ref());
    format!(
        "SharedAccessSignature sr={sr}&sig={}&se={se}&skn={}",
        enc(&sig),
        crate::bus_peer::BUS_KEY_NAME
    )
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// An account SAS for Azurite's development account (blob and queue, every resource type),
/// expiring at `se` (ISO 8601 UTC): the account-SAS string-to-sign of version 2020-12-06 on.
fn account_sas(se: &str) -> String {
    use base64::Engine as _;
    let (sp, ss, srt, spr, sv) = ("rwdlacup", "bq", "sco", "https,http", "2021-12-02");
    let sts = format!(
        "{}\n{sp}\n{ss}\n{srt}\n\n{se}\n\n{spr}\n{sv}\n\n",
        crate::azure::DEV_ACCOUNT
    );
    let key = base64::engine::general_purpose::STANDARD
        .decode(crate::azure::DEV_KEY)
        .unwrap();
    let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key);
    let sig = base64::engine::general_purpose::STANDARD
        .encode(ring::hmac::sign(&k, sts.as_bytes()).as_ref());
    let enc = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    format!(
        "sv={sv}&ss={ss}&srt={srt}&sp={sp}&se={}&spr={}&sig={}",
        enc(se),
        enc(spr),
        enc(&sig)
    )
}

fn iso(unix: u64) -> String {
    // Civil from days (Howard Hinnant).
    let (days, secs) = ((unix / 86_400) as i64, unix % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_connection_strings_with_a_sas_deliver_and_dead_letter_to_blobs() {
    let az = Azurite::start().await;
    az.create_queue("sasq").await;
    az.create_container("letters").await;
    let t = start(&[]).await;
    t.topic("t").await;
    let cs = |se: u64| {
        format!(
            "QueueEndpoint={};BlobEndpoint={};SharedAccessSignature={}",
            az.queue_endpoint(),
            az.blob_endpoint(),
            account_sas(&iso(se))
        )
    };
    let good = cs(unix_now() + 3600);
    let q = |queue: &str, c: &str| json!({"endpointType": "StorageQueue", "properties": {"connectionString": c, "queueName": queue}});
    let (s, b) = sub(&t, "t", "ok", q("sasq", &good), json!({})).await;
    assert_eq!(s, 200, "{b}");
    assert!(!b.to_string().contains("sig="), "the SAS is masked: {b}");
    // A missing queue, dead letters to a blob container, both through the SAS.
    let dl = json!({"endpointType": "StorageBlob", "properties": {"connectionString": good, "blobContainerName": "letters"}});
    let (s, b) = sub(
        &t,
        "t",
        "missing",
        q("nosuchqueue", &good),
        json!({"retryPolicy": {"maxDeliveryAttempts": 1}, "deadLetterDestination": dl}),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    // An expired SAS: nothing is sent, the letter and the metric say so.
    let (s, b) = sub(
        &t,
        "t",
        "expired",
        q("sasq", &cs(unix_now() - 60)),
        json!({"retryPolicy": {"maxDeliveryAttempts": 1}}),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    // A SAS whose signature Azurite does not accept: its 403 is not retried.
    let forged = good.replace("&sig=", "&sig=AAAA");
    let (s, b) = sub(&t, "t", "forged", q("sasq", &forged), json!({})).await;
    assert_eq!(s, 200, "{b}");
    t.publish("t", events("s", 1)).await;
    let letters = dead_letters(&t, "t", "forged", 1).await;
    assert_eq!(letters[0]["lastHttpStatusCode"], 403, "{}", letters[0]);
    assert_eq!(letters[0]["reason"], "DeliveryRefused", "{}", letters[0]);
    let texts = az.wait_messages("sasq", 1).await;
    assert_eq!(texts.len(), 1, "only the valid SAS delivered: {texts:?}");
    let letters = dead_letters(&t, "t", "missing", 1).await;
    assert_eq!(letters[0]["lastHttpStatusCode"], 404, "{}", letters[0]);
    eventually("the letter as a blob", || async {
        let n = az.list_blobs("letters").await;
        if n.is_empty() {
            Err("none".to_string())
        } else {
            Ok(())
        }
    })
    .await;
    let letters = dead_letters(&t, "t", "expired", 1).await;
    let err = letters[0]["lastError"].as_str().unwrap();
    assert!(
        err.contains("SharedAccessSignature") && err.contains("expired"),
        "{err}"
    );
    let m = t.metrics().await;
    assert_eq!(
        metric(
            &m,
            "gridlet_destination_faults_total",
            "topic=\"t\",subscription=\"expired\",fault=\"sasExpired\""
        ),
        Some(1)
    );
    // A SAS string without the endpoint a destination needs is refused at PUT.
    let only_queue = format!(
        "QueueEndpoint={};SharedAccessSignature={}",
        az.queue_endpoint(),
        account_sas(&iso(unix_now() + 60))
    );
    let dl = json!({"endpointType": "StorageBlob", "properties": {"connectionString": only_queue, "blobContainerName": "letters"}});
    let (s, b) = sub(
        &t,
        "t",
        "bad",
        q("sasq", &only_queue),
        json!({"deadLetterDestination": dl}),
    )
    .await;
    assert_eq!(s, 400, "{b}");
    assert!(b.to_string().contains("BlobEndpoint"), "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_made_bus_sas_is_used_until_it_expires_then_reported_apart() {
    let mut bus = StrictBus::start().await;
    let t = start(&[bus.trust()]).await;
    t.topic("t").await;
    let cs = |se: u64| {
        format!(
            "Endpoint=sb://localhost:{}/;SharedAccessSignature={};EntityPath=hub1",
            bus.port,
            bus_token(&bus, "hub1", se)
        )
    };
    let hub =
        |c: String| json!({"endpointType": "EventHub", "properties": {"connectionString": c}});
    let one = json!({"retryPolicy": {"maxDeliveryAttempts": 1}});
    let (s, b) = sub(&t, "t", "valid", hub(cs(unix_now() + 3600)), one.clone()).await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = sub(&t, "t", "expired", hub(cs(unix_now() - 5)), one).await;
    assert_eq!(s, 200, "{b}");
    t.publish("t", events("k", 1)).await;
    let (entity, evs) = bus.next().await;
    assert_eq!((entity.as_str(), evs.len()), ("hub1", 1));
    let letters = dead_letters(&t, "t", "expired", 1).await;
    let err = letters[0]["lastError"].as_str().unwrap();
    assert!(err.contains("credential expired"), "{err}");
    assert!(
        letters[0]["lastHttpStatusCode"].is_null(),
        "nothing was sent"
    );
    assert_eq!(
        bus.log().len(),
        1,
        "only the valid token's request reached the service"
    );
    let m = t.metrics().await;
    assert_eq!(
        metric(
            &m,
            "gridlet_destination_faults_total",
            "topic=\"t\",subscription=\"expired\",fault=\"sasExpired\""
        ),
        Some(1)
    );
}
