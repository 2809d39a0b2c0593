//! Issue 20, "Trust, second pass": credentials only to verified servers, identities that cannot
//! be forged, no protocol ambiguity (the availability items are in `trust_limits.rs`). Each test
//! failed on the code before its fix.

use crate::util::{eg_event, https_receiver_as, start, Receiver, TestGridlet};
use serde_json::{json, Value};
use std::time::Duration;

async fn sub(t: &TestGridlet, topic: &str, name: &str, props: Value) {
    let (s, b) = t
        .put(
            &format!("/topics/{topic}/eventSubscriptions/{name}"),
            json!({ "properties": props }),
        )
        .await;
    assert_eq!(s, 200, "{name}: {b}");
}

/// Every credentialed Azure destination (Event Hubs, Service Bus, Storage queue, cloud Event
/// Grid, blob dead letters) aimed at `host:port` of `rx`.
async fn azure_subscriptions(t: &TestGridlet, host: &str, rx: &Receiver) -> Vec<&'static str> {
    let port = rx.addr.port();
    let key = "c2VjcmV0LWtleS1mb3ItdGVzdHM=";
    let bus = |entity: &str| {
        format!("Endpoint=sb://{host}:{port}/;SharedAccessKeyName=send;SharedAccessKey={key};EntityPath={entity}")
    };
    let account = format!(
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={key};QueueEndpoint=https://{host}:{port}/acct;BlobEndpoint=https://{host}:{port}/acct"
    );
    let dests = [
        (
            "eh",
            json!({"endpointType": "EventHub", "properties": {"connectionString": bus("hub1")}}),
        ),
        (
            "sbq",
            json!({"endpointType": "ServiceBusQueue", "properties": {"connectionString": bus("queue1")}}),
        ),
        (
            "sq",
            json!({"endpointType": "StorageQueue", "properties": {"connectionString": account, "queueName": "queue1"}}),
        ),
        (
            "eg",
            json!({"endpointType": "EventGrid", "properties": {
            "endpointUrl": format!("https://{host}:{port}/api/events?api-version=2018-01-01"),
            "sasKey": "cloud-sas-key"}}),
        ),
    ];
    let mut names = Vec::new();
    for (name, d) in dests {
        sub(t, "t", name, json!({"destination": d})).await;
        names.push(name);
    }
    // Blob dead letters: a destination that refuses, one attempt, letters to the peer.
    let failing = crate::util::failing_endpoint("/none").await;
    sub(
        t,
        "t",
        "dl",
        json!({
            "destination": {"endpointType": "WebHook", "properties": {"endpointUrl": failing}},
            "retryPolicy": {"maxDeliveryAttempts": 1},
            "deadLetterDestination": {"endpointType": "StorageBlob", "properties": {
                "connectionString": account, "blobContainerName": "letters"}}
        }),
    )
    .await;
    names
}

async fn publish_and_wait_for_failures(t: &TestGridlet, names: &[&str]) {
    t.publish("t", json!([eg_event("1", "s", "e", json!({}))]))
        .await;
    for n in names {
        let labels = format!("topic=\"t\",subscription=\"{n}\"");
        t.wait_metric("DeliveryAttemptsCount", &labels, 1).await;
    }
    let labels = "topic=\"t\",subscription=\"dl\"";
    t.wait_metrics("the dead letter", |m| {
        crate::util::metric(m, "gridlet_dead_letters", labels) == Some(1)
    })
    .await;
}

/// High 1: with the webhook settings at their permissive defaults (`allowUnknownCA=true`), a
/// server with a self-signed certificate gets no Azure credential; the webhook still may.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_destinations_send_no_credentials_to_an_unverified_server() {
    let (mut rx, _pem) = https_receiver_as(&["localhost", "127.0.0.1"]).await;
    let t = start(&[
        ("outbound__webhook__skipServerCertValidation", "true"),
        ("outbound__eventgrid__allowInvalidHostnames", "true"),
    ])
    .await;
    t.topic("t").await;
    let names = azure_subscriptions(&t, "localhost", &rx).await;
    publish_and_wait_for_failures(&t, &names).await;
    // The dead-letter forward is attempted at once; leave it time to (not) arrive.
    rx.nothing_within(Duration::from_millis(1500)).await;
    // The webhook settings still apply to webhooks.
    sub(
        &t,
        "t",
        "hook",
        json!({"destination": {"endpointType": "WebHook", "properties": {"endpointUrl": rx.https_url("/hook")}}}),
    )
    .await;
    t.publish("t", json!([eg_event("2", "s", "e", json!({}))]))
        .await;
    let got = rx.next().await;
    assert_eq!(got.path, "/hook");
}

/// High 1: a certificate trusted through `outbound__azure__trustedCertificatesFile` but issued
/// for another name is refused too (the host name is checked, not only the chain); for the
/// right name it is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_destinations_check_the_host_name_of_a_trusted_certificate() {
    let (mut other, other_pem) = https_receiver_as(&["other.example"]).await;
    let (mut right, right_pem) = https_receiver_as(&["localhost"]).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("roots.pem");
    std::fs::write(&file, format!("{other_pem}{right_pem}")).unwrap();
    let t = start(&[
        ("outbound__eventgrid__allowInvalidHostnames", "true"),
        (
            "outbound__azure__trustedCertificatesFile",
            file.to_str().unwrap(),
        ),
    ])
    .await;
    t.topic("t").await;
    let names = azure_subscriptions(&t, "localhost", &other).await;
    publish_and_wait_for_failures(&t, &names).await;
    other.nothing_within(Duration::from_millis(1500)).await;

    let t = start(&[
        ("outbound__eventgrid__allowInvalidHostnames", "true"),
        (
            "outbound__azure__trustedCertificatesFile",
            file.to_str().unwrap(),
        ),
    ])
    .await;
    t.topic("t").await;
    azure_subscriptions(&t, "localhost", &right).await;
    t.publish("t", json!([eg_event("1", "s", "e", json!({}))]))
        .await;
    let mut paths = Vec::new();
    for _ in 0..5 {
        let p = right.next().await.path;
        paths.push(if p.starts_with("/acct/letters/") {
            "/acct/letters/…".to_string()
        } else {
            p
        });
    }
    paths.sort();
    assert_eq!(
        paths,
        [
            "/acct/letters/…",
            "/acct/queue1/messages",
            "/api/events",
            "/hub1/messages",
            "/queue1/messages"
        ],
        "every Azure destination reached the verified server"
    );
}

/// High 3: an event with two top-level keys that differ only in case (or are equal) is refused
/// with 400 naming the key, whichever comes first: filters and receivers whose JSON readers
/// are case-insensitive and keep the last key would otherwise see different events.
#[tokio::test]
async fn case_variant_or_duplicate_top_level_keys_are_refused_naming_the_key() {
    let t = start(&[]).await;
    t.topic("t").await;
    for schema in ["CustomEventSchema", "CloudEventSchemaV1_0"] {
        let name = schema.to_ascii_lowercase();
        let (s, b) = t
            .put(
                &format!("/topics/{name}"),
                json!({"properties": {"inputSchema": schema}}),
            )
            .await;
        assert_eq!(s, 200, "{b}");
    }
    let eg = r#""id":"1","subject":"s","eventType":"Sensor.Read","eventTime":"2017-08-10T21:03:07+00:00","dataVersion":"1.0","data":{}"#;
    let cases: &[(&str, &str, &str)] = &[
        ("t", "eventType", r#""EVENTTYPE":"Admin.Wipe""#),
        ("t", "id", r#""ID":"2""#),
        ("t", "subject", r#""Subject":"other""#),
        ("t", "topic", r#""topic":"t","TOPIC":"t""#),
        ("t", "data", r#""data":{"x":1}"#),
        ("t", "eventType", r#""eventType":"Admin.Wipe""#),
        ("t", "subject", r#""\u0053ubject":"escaped""#),
        (
            "customeventschema",
            "eventType",
            r#""EventType":"Admin.Wipe""#,
        ),
    ];
    for (topic, key, extra) in cases {
        for extra_first in [false, true] {
            let body = if extra_first {
                format!("[{{{extra},{eg}}}]")
            } else {
                format!("[{{{eg},{extra}}}]")
            };
            let r = t
                .client
                .post(t.url(&format!("/topics/{topic}/events")))
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let text = r.text().await.unwrap();
            assert_eq!(status, 400, "{body}: {text}");
            assert!(
                text.to_ascii_lowercase()
                    .contains(&format!("'{}'", key.to_ascii_lowercase())),
                "the error names '{key}': {text}"
            );
        }
    }
    let ce = r#""id":"1","source":"s","type":"Sensor.Read","specversion":"1.0""#;
    for body in [
        format!(r#"[{{{ce},"TYPE":"Admin.Wipe"}}]"#),
        format!(r#"[{{"Type":"Admin.Wipe",{ce}}}]"#),
    ] {
        let r = t
            .client
            .post(t.url("/topics/cloudeventschemav1_0/events"))
            .header("content-type", "application/cloudevents-batch+json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        assert_eq!(status, 400, "{body}: {text}");
        assert!(text.to_ascii_lowercase().contains("'type'"), "{text}");
    }
    // Distinct keys still pass, including one that only shares a prefix.
    let ok = format!(r#"[{{{eg},"eventTypeVersion":"2"}}]"#);
    let r = t
        .client
        .post(t.url("/topics/t/events"))
        .header("content-type", "application/json")
        .body(ok)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

/// Medium 4: under `outbound__webhook__httpsOnly=true`, the endpoints an Azure connection string
/// derives follow the webhook rules: plain HTTP only to a loopback host (the emulators), and
/// never an address in a denied range.
#[tokio::test]
async fn azure_connection_strings_follow_the_webhook_address_rules() {
    let t = start(&[("outbound__webhook__httpsOnly", "true")]).await;
    t.topic("t").await;
    let key = "c2VjcmV0LWtleS1mb3ItdGVzdHM=";
    let bus = |endpoint: &str, extra: &str| {
        json!({"endpointType": "EventHub", "properties": {"connectionString": format!(
            "Endpoint={endpoint};SharedAccessKeyName=send;SharedAccessKey={key};EntityPath=hub1{extra}")}})
    };
    let queue = |cs: String| json!({"endpointType": "StorageQueue", "properties": {"connectionString": cs, "queueName": "queue1"}});
    let account = |rest: &str| format!("AccountName=acct;AccountKey={key};{rest}");
    let refused = [
        bus("sb://ns.example.com/", ";UseDevelopmentEmulator=true"),
        bus("sb://169.254.169.254/", ""),
        queue(account("DefaultEndpointsProtocol=http")),
        queue(account("QueueEndpoint=http://10.0.0.5/acct")),
        queue(account("QueueEndpoint=https://169.254.169.254/acct")),
        queue(
            "UseDevelopmentStorage=true;DevelopmentStorageProxyUri=http://proxy.example.com".into(),
        ),
    ];
    for (n, d) in refused.iter().enumerate() {
        let (s, b) = t
            .put(
                &format!("/topics/t/eventSubscriptions/r{n}"),
                json!({"properties": {"destination": d}}),
            )
            .await;
        assert_eq!(s, 400, "{d}: {b}");
    }
    let (s, b) = t
        .put(
            "/topics/t/eventSubscriptions/dl",
            json!({"properties": {
                "destination": {"endpointType": "WebHook", "properties": {"endpointUrl": "https://example.com/x"}},
                "deadLetterDestination": {"endpointType": "StorageBlob", "properties": {
                    "connectionString": account("BlobEndpoint=http://blob.example.com/acct"),
                    "blobContainerName": "letters"}}}}),
        )
        .await;
    assert_eq!(s, 400, "{b}");
    let allowed = [
        bus("sb://localhost:5672/", ";UseDevelopmentEmulator=true"),
        bus("sb://ns.servicebus.windows.net/", ""),
        queue("UseDevelopmentStorage=true".into()),
        queue(account(
            "QueueEndpoint=http://127.0.0.1:10001/devstoreaccount1",
        )),
        queue(account("DefaultEndpointsProtocol=https")),
    ];
    for (n, d) in allowed.iter().enumerate() {
        let (s, b) = t
            .put(
                &format!("/topics/t/eventSubscriptions/a{n}"),
                json!({"properties": {"destination": d}}),
            )
            .await;
        assert_eq!(s, 200, "{d}: {b}");
    }
    // httpsOnly=false: plain HTTP anywhere outside the denied ranges, as for webhooks.
    let t = start(&[("outbound__webhook__httpsOnly", "false")]).await;
    t.topic("t").await;
    let (s, b) = t
        .put(
            "/topics/t/eventSubscriptions/h",
            json!({"properties": {"destination": queue(account("QueueEndpoint=http://10.0.0.5/acct"))}}),
        )
        .await;
    assert_eq!(s, 200, "{b}");
}

/// Medium 8: with every credential off (as in the compose example), what a browser sends for a
/// hostile page is refused: a cross-site `no-cors` publish (`Origin` of another site,
/// `Sec-Fetch-Site: cross-site`, no `Content-Type`) and a DNS-rebinding page (a `Host` name
/// that resolves to gridlet but is not one of its names, same-origin to the browser). Tools,
/// modules and same-origin pages keep working.
#[tokio::test]
async fn with_auth_off_browser_cross_site_and_rebinding_requests_are_refused() {
    let t = start(&[("inbound__allowedHostNames", "edge-device.local")]).await;
    t.topic("t").await;
    let port = t.g.http_addr.unwrap().port();
    let events = json!([eg_event("e1", "s", "e", json!({}))]).to_string();
    let send = |method: reqwest::Method, path: &str, headers: &[(&str, String)]| {
        let mut r = t.client.request(method, t.url(path)).body(events.clone());
        for (k, v) in headers {
            r = r.header(*k, v.as_str());
        }
        r.send()
    };
    let post = reqwest::Method::POST;
    // A page on another site publishing with fetch(url, {mode: "no-cors", method: "POST", body: blob}).
    let r = send(
        post.clone(),
        "/topics/t/events",
        &[
            ("origin", "https://evil.example".into()),
            ("sec-fetch-site", "cross-site".into()),
            ("sec-fetch-mode", "no-cors".into()),
        ],
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 403);
    // An older browser without Sec-Fetch-*: the Origin alone.
    let r = send(
        post.clone(),
        "/topics/t/events",
        &[("origin", "http://evil.example".into())],
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 403);
    // DNS rebinding: evil.example now resolves to gridlet; to the browser it is same-origin.
    let sub = json!({"properties": {"destination": {"endpointType": "WebHook",
        "properties": {"endpointUrl": "http://evil.example/exfiltrate"}}}})
    .to_string();
    let r = t
        .client
        .put(t.url("/topics/t/eventSubscriptions/x"))
        .header("host", format!("evil.example:{port}"))
        .header("origin", format!("http://evil.example:{port}"))
        .header("sec-fetch-site", "same-origin")
        .header("content-type", "application/json")
        .body(sub)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.text().await.unwrap().contains("allowedHostNames"));
    // Tools and modules: no Origin; Host an address, localhost, the module id or a listed name.
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "gridlet:5888".to_string(),
        "edge-device.local".to_string(),
        format!("[::1]:{port}"),
    ] {
        let r = send(post.clone(), "/topics/t/events", &[("host", host.clone())])
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{host}");
    }
    // A same-origin page served by gridlet's own address.
    let r = send(
        post,
        "/topics/t/events",
        &[
            ("origin", format!("http://127.0.0.1:{port}")),
            ("sec-fetch-site", "same-origin".into()),
            ("content-type", "application/json".into()),
        ],
    )
    .await;
    assert_eq!(r.unwrap().status(), 200);
    // With a credential required, a browser cannot send it: no extra checks.
    let t = start(&[
        ("inbound__clientAuth__sasKeys__enabled", "true"),
        ("inbound__clientAuth__sasKeys__key1", "k"),
    ])
    .await;
    let r = t
        .client
        .put(t.url("/topics/t"))
        .header("aeg-sas-key", "k")
        .header("host", "any.name.example")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// Low 14: a Prometheus scraper needs no administrator key: a metrics-only key reads
/// `/metrics` and nothing else.
#[tokio::test]
async fn a_metrics_key_reads_metrics_and_nothing_else() {
    let t = start(&[
        ("inbound__clientAuth__sasKeys__enabled", "true"),
        ("inbound__clientAuth__sasKeys__key1", "admin-key"),
        ("inbound__clientAuth__sasKeys__metricsKeys", "scrape-key"),
    ])
    .await;
    let with = |path: &str, key: &str| t.client.get(t.url(path)).header("aeg-sas-key", key);
    assert_eq!(
        with("/topics", "admin-key").send().await.unwrap().status(),
        200
    );
    let r = with("/metrics", "scrape-key").send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("gridlet_"));
    assert_eq!(
        with("/topics", "scrape-key").send().await.unwrap().status(),
        403
    );
    let r = t
        .client
        .post(t.url("/topics/t/events"))
        .header("aeg-sas-key", "scrape-key")
        .json(&json!([]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
}
