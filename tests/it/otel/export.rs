//! The exporter's bounds (a failing, closed or slow collector), metrics over OTLP, log lines,
//! dead letters without an attempt, and the Service Bus / Event Hubs properties.

use super::*;
use std::io::BufReader;
use std::process::{Command, Stdio};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_collector_costs_a_counter_never_a_delivery() {
    let mut c = Collector::start();
    c.respond_with(500).await;
    let mut env = otel_env(&c);
    env.push(("OTEL_BSP_MAX_QUEUE_SIZE", "4".into()));
    env.push(("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "2".into()));
    let t = start_traced(&env).await;
    let mut rx = Receiver::start().await;
    t.topic("t1").await;
    t.webhook_sub("t1", "s1", &rx.url("/s1"), json!({})).await;
    for i in 0..30 {
        t.publish("t1", json!([eg_event(&i.to_string(), "s", "t", json!({}))]))
            .await;
    }
    let mut n = 0;
    while n < 30 {
        n += rx.next().await.json().as_array().unwrap().len();
    }
    // 120 spans (publish, route, deliver, settle): every one dropped (queue full, or refused
    // by the collector), none exported.
    let m = t
        .wait_metrics("every span dropped", |m| {
            metric(m, "gridlet_telemetry_spans_total", "result=\"dropped\"") == Some(120)
        })
        .await;
    assert_eq!(
        metric(&m, "gridlet_telemetry_spans_total", "result=\"exported\""),
        Some(0)
    );
    assert_eq!(
        metric(
            &m,
            "DeliverySuccessCounts",
            "topic=\"t1\",subscription=\"s1\""
        ),
        Some(30)
    );

    // The collector recovers: new spans get through.
    c.respond_with(200).await;
    t.publish("t1", json!([eg_event("late", "s", "t", json!({}))]))
        .await;
    rx.next().await;
    c.until("the late publish", |s| count(s, "settle") >= 1)
        .await;

    // A collector nobody answers at (port closed): the same, deliveries unaffected.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let t = start(&[
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            &format!("http://127.0.0.1:{closed}"),
        ),
        ("OTEL_BSP_SCHEDULE_DELAY", "20"),
    ])
    .await;
    t.topic("t1").await;
    t.webhook_sub("t1", "s1", &rx.url("/s2"), json!({})).await;
    t.publish("t1", json!([eg_event("x", "s", "t", json!({}))]))
        .await;
    rx.next().await;
    t.wait_metrics("spans dropped at a closed port", |m| {
        metric(m, "gridlet_telemetry_spans_total", "result=\"dropped\"") == Some(4)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_bus_and_event_hubs_messages_carry_diagnostic_id_and_traceparent() {
    use crate::azure::{StrictBus, BUS_KEY};
    let mut c = Collector::start();
    let mut bus = StrictBus::start().await;
    let mut env = otel_env(&c);
    let (k, v) = bus.trust();
    env.push((k, v.to_string()));
    let t = start_traced(&env).await;
    t.topic("t").await;
    for (kind, entity) in [("EventHub", "hub1"), ("ServiceBusQueue", "queue1")] {
        let (s, b) = t
            .put(
                &format!("/topics/t/eventSubscriptions/{entity}"),
                json!({"properties": {"destination": {"endpointType": kind, "properties": {
                    "connectionString": bus.connection_string(entity, BUS_KEY)}}}}),
            )
            .await;
        assert_eq!(s, 200, "{b}");
    }
    let r = t
        .client
        .post(t.url("/topics/t/events"))
        .header("traceparent", traceparent())
        .json(&json!([eg_event("m1", "s", "t", json!({}))]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut props = std::collections::HashMap::new();
    while props.len() < 2 {
        let (entity, _) = bus.next().await;
        // The messages as sent (`{"Body", "BrokerProperties", "UserProperties"}`).
        let sent = bus
            .log()
            .into_iter()
            .filter(|l| l.entity == entity && l.status == 201)
            .flat_map(|l| l.messages)
            .next()
            .unwrap();
        props.insert(entity, sent["UserProperties"].clone());
    }
    let spans = c
        .until("two deliveries", |s| count(s, "deliver") == 2)
        .await;
    for (entity, p) in props {
        let deliver = named(&spans, "deliver")
            .into_iter()
            .find(|d| d["attributes"]["messaging.destination.subscription.name"] == entity.as_str())
            .unwrap();
        let want = format!("00-{TRACE}-{}-01", deliver["span_id"].as_str().unwrap());
        assert_eq!(p["Diagnostic-Id"], want, "{entity}: {p}");
        assert_eq!(p["traceparent"], want, "{entity}: {p}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_log_lines_of_a_traced_event_carry_its_trace_and_span_ids() {
    use std::io::BufRead;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gridlet"))
        .current_dir(dir.path())
        .env("inbound__serverAuth__tlsPolicy", "disabled")
        .env("inbound__clientAuth__clientCert__enabled", "false")
        .env("inbound__bindAddress", "127.0.0.1")
        .env("inbound__httpPort", port.to_string())
        .env("outbound__webhook__httpsOnly", "false")
        .env("log__format", "json")
        .env("broker__logDeliverySuccess", "true")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, mut lines) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    gridlet::tls::install_default_provider();
    let client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let url = |p: &str| format!("{base}{p}?{V}");
    let up = poll_within(WAIT, || client.get(format!("{base}/healthz")).send()).await;
    assert!(up.is_ok_and(|r| r.status() == 200));
    let ok = Receiver::start().await;
    let bad = Receiver::start().await;
    bad.respond_with(500);
    let put = |p: String, body: Value| client.put(url(&p)).json(&body).send();
    assert_eq!(
        put("/topics/t1".into(), json!({})).await.unwrap().status(),
        200
    );
    for (name, rx) in [("ok", &ok), ("bad", &bad)] {
        let body = json!({"properties": {
            "destination": {"endpointType": "WebHook", "properties": {"endpointUrl": rx.url("/h")}},
            "retryPolicy": {"maxDeliveryAttempts": 1}}});
        let r = put(format!("/topics/t1/eventSubscriptions/{name}"), body)
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let r = client
        .post(url("/topics/t1/events"))
        .header("traceparent", traceparent())
        .json(&json!([eg_event("e-1", "s", "t", json!({}))]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // Export is off: the ids are the publisher's (the context the event travels in).
    let mut want = vec!["delivered", "events dead-lettered"];
    let deadline = tokio::time::Instant::now() + WAIT;
    while !want.is_empty() {
        let line = tokio::time::timeout_at(deadline, lines.recv())
            .await
            .expect("the delivered and dead-lettered lines")
            .unwrap();
        let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
        let msg = v["fields"]["message"].as_str().unwrap_or("");
        if let Some(i) = want.iter().position(|w| *w == msg) {
            assert_eq!(v["fields"]["trace_id"], TRACE, "{line}");
            assert_eq!(v["fields"]["span_id"], PARENT, "{line}");
            want.remove(i);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_dead_lettered_without_an_attempt_gets_a_settle_span_in_its_trace() {
    let mut c = Collector::start();
    let mut env = otel_env(&c);
    env.push(("broker__queueFullPolicy", "deadLetter".into()));
    env.push(("broker__maxPendingEventsPerSubscription", "1".into()));
    let t = start_traced(&env).await;
    let mut rx = Receiver::start().await;
    rx.respond_with(500); // the first event stays pending, retrying
    t.topic("t1").await;
    t.webhook_sub("t1", "s1", &rx.url("/s1"), json!({})).await;
    t.publish("t1", json!([eg_event("first", "s", "t", json!({}))]))
        .await;
    rx.next().await;
    let r = t
        .client
        .post(t.url("/topics/t1/events"))
        .header("traceparent", traceparent())
        .json(&json!([eg_event("overflow", "s", "t", json!({}))]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let spans = c
        .until("the overflow's publish and settle", |s| {
            ["publish", "settle"]
                .iter()
                .all(|n| named(s, n).iter().any(|x| x["trace_id"] == TRACE))
        })
        .await;
    let publish = named(&spans, "publish")
        .into_iter()
        .find(|p| p["trace_id"] == TRACE)
        .unwrap();
    let settle = named(&spans, "settle")
        .into_iter()
        .find(|x| x["trace_id"] == TRACE)
        .unwrap();
    assert_eq!(settle["parent_span_id"], publish["span_id"]);
    assert_eq!(
        settle["attributes"]["gridlet.settle.outcome"],
        "dead_letter"
    );
    assert_eq!(
        settle["attributes"]["gridlet.dead_letter.reason"],
        json!(["QueueFull"])
    );
    assert_eq!(settle["status_code"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_collector_is_cut_off_at_the_export_timeout() {
    let c = Collector::start();
    let r = reqwest::Client::new()
        .post(format!("{}/control/delay/5", c.endpoint()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let mut env = otel_env(&c);
    env.push(("OTEL_EXPORTER_OTLP_TIMEOUT", "200".into()));
    let t = start_traced(&env).await;
    let mut rx = Receiver::start().await;
    t.topic("t1").await;
    t.webhook_sub("t1", "s1", &rx.url("/s1"), json!({})).await;
    // Each export would take 5 s; deliveries never wait for one.
    for i in 0..5 {
        t.publish("t1", json!([eg_event(&i.to_string(), "s", "t", json!({}))]))
            .await;
        rx.next().await;
    }
    t.wait_metrics("20 spans dropped", |m| {
        metric(m, "gridlet_telemetry_spans_total", "result=\"dropped\"") == Some(20)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_families_are_exported_over_otlp_too() {
    let mut c = Collector::start();
    let t = start(&[
        (
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            &format!("{}/v1/metrics", c.endpoint()),
        ),
        ("OTEL_METRIC_EXPORT_INTERVAL", "100"),
    ])
    .await;
    let mut rx = Receiver::start().await;
    t.topic("t1").await;
    t.webhook_sub("t1", "s1", &rx.url("/s1"), json!({})).await;
    t.publish(
        "t1",
        json!([
            eg_event("1", "s", "t", json!({})),
            eg_event("2", "s", "t", json!({}))
        ]),
    )
    .await;
    rx.next().await;
    let point = |m: &Value, want: &str| -> Option<Value> {
        m["points"]
            .as_array()?
            .iter()
            .find(|p| p["attributes"]["subscription"] == want || p["attributes"]["topic"] == want)
            .cloned()
    };
    let seen = c
        .until("EventsReceived 2 and a latency histogram", |s| {
            let received = s.iter().any(|m| {
                m["metric"] == "EventsReceived" && point(m, "t1").is_some_and(|p| p["value"] == 2)
            });
            let latency = s.iter().any(|m| {
                m["kind"] == "histogram"
                    && point(m, "s1").is_some_and(|p| p["count"].as_u64() >= Some(1))
            });
            received && latency
        })
        .await;
    let received = seen
        .iter()
        .rev()
        .find(|m| m["metric"] == "EventsReceived")
        .unwrap();
    assert_eq!(received["kind"], "sum");
    assert_eq!(received["monotonic"], true);
    assert_eq!(received["temporality"], 2, "cumulative");
    assert_eq!(received["resource"]["service.name"], "gridlet");
    let h = seen
        .iter()
        .rev()
        .find(|m| {
            m["kind"] == "histogram"
                && point(m, "s1").is_some_and(|p| p["count"].as_u64() >= Some(1))
        })
        .unwrap();
    assert_eq!(h["unit"], "ms");
    let p = point(h, "s1").unwrap();
    let buckets: Vec<u64> = serde_json::from_value(p["buckets"].clone()).unwrap();
    assert_eq!(buckets.len(), p["bounds"].as_array().unwrap().len() + 1);
    assert_eq!(buckets.iter().sum::<u64>(), p["count"].as_u64().unwrap());
    assert_eq!(p["attributes"]["topic"], "t1");
    // No traces endpoint: no spans.
    assert!(seen.iter().all(|m| m.get("name").is_none()), "{seen:#?}");
}
