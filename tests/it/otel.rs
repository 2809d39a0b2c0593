//! OpenTelemetry, end to end: a real OTLP/HTTP receiver (`tests/otel/collector.py`, decoding
//! with the official `opentelemetry-proto` definitions from PyPI; `scripts/test.sh` installs
//! them) sees gridlet's spans, and real webhook receivers see the trace context carried onward.

use crate::util::*;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

fn traceparent() -> String {
    format!("00-{TRACE}-{PARENT}-01")
}

/// The Python interpreter with `opentelemetry-proto` (`GRIDLET_OTEL_PYTHON`, else the venv
/// `scripts/test.sh` makes).
fn python() -> String {
    std::env::var("GRIDLET_OTEL_PYTHON").unwrap_or_else(|_| {
        let home = std::env::var("HOME").unwrap_or_default();
        format!("{home}/.cache/gridlet/otel-py/bin/python")
    })
}

/// The OTLP receiver process: every span it decodes, as JSON.
struct Collector {
    port: u16,
    child: Child,
    spans: mpsc::UnboundedReceiver<Value>,
    seen: Vec<Value>,
}

impl Collector {
    fn start() -> Self {
        // The control requests' client needs rustls' provider.
        gridlet::tls::install_default_provider();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/otel/collector.py");
        let mut child = Command::new(python())
            .arg(script)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "{}: {e}: run scripts/test.sh once (it installs opentelemetry-proto)",
                    python()
                )
            });
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let port: u16 = lines
            .next()
            .and_then(Result::ok)
            .and_then(|l| l.trim().parse().ok())
            .expect("the collector prints its port (is opentelemetry-proto installed? run scripts/test.sh)");
        let (tx, spans) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    let _ = tx.send(v);
                }
            }
        });
        Self {
            port,
            child,
            spans,
            seen: Vec::new(),
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Answer later exports with `status` (a failing collector).
    async fn respond_with(&self, status: u16) {
        let r = reqwest::Client::new()
            .post(format!("{}/control/status/{status}", self.endpoint()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204);
    }

    /// Wait until the spans received so far satisfy `done`; answers them all.
    async fn until(&mut self, what: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !done(&self.seen) {
            match tokio::time::timeout_at(deadline, self.spans.recv()).await {
                Ok(Some(s)) => self.seen.push(s),
                _ => panic!("{what}: spans so far: {:#?}", self.seen),
            }
        }
        self.seen.clone()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

fn count(spans: &[Value], name: &str) -> usize {
    named(spans, name).len()
}

/// Settings that export to `c` quickly.
fn otel_env(c: &Collector) -> Vec<(&'static str, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", c.endpoint()),
        ("OTEL_BSP_SCHEDULE_DELAY", "50".into()),
    ]
}

async fn start_traced(env: &[(&'static str, String)]) -> TestGridlet {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    start(&env).await
}

fn header(r: &Received, name: &str) -> String {
    r.headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publishers_traceparent_is_the_parent_of_publish_deliver_and_settle_and_reaches_the_webhook(
) {
    let mut c = Collector::start();
    let mut env = otel_env(&c);
    env.extend([
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "x-test-auth=s3cret".to_string(),
        ),
        ("OTEL_SERVICE_NAME", "edge-grid".to_string()),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment=lab".to_string(),
        ),
        (
            "IOTEDGE_IOTHUBHOSTNAME",
            "hub1.azure-devices.net".to_string(),
        ),
        ("IOTEDGE_DEVICEID", "dev1".to_string()),
        ("IOTEDGE_MODULEID", "eventgridmodule".to_string()),
    ]);
    let t = start_traced(&env).await;
    let mut rx = Receiver::start().await;
    t.topic("t1").await;
    t.webhook_sub("t1", "s1", &rx.url("/s1"), json!({})).await;
    let r = t
        .client
        .post(t.url("/topics/t1/events"))
        .header("traceparent", traceparent())
        .header("tracestate", "vendor=abc")
        .json(&json!([eg_event("e-1", "s", "t", json!({"n": 1}))]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    let got = rx.next().await;
    let spans = c
        .until("publish, deliver, settle", |s| {
            count(s, "publish") == 1 && count(s, "deliver") == 1 && count(s, "settle") == 1
        })
        .await;
    let publish = named(&spans, "publish")[0];
    let deliver = named(&spans, "deliver")[0];
    let settle = named(&spans, "settle")[0];

    // One trace, the publisher's; each span the child of the one before.
    for s in [publish, deliver, settle] {
        assert_eq!(s["trace_id"], TRACE, "{s}");
        assert_eq!(s["trace_state"], "vendor=abc", "{s}");
    }
    assert_eq!(publish["parent_span_id"], PARENT);
    assert_eq!(deliver["parent_span_id"], publish["span_id"]);
    assert_eq!(settle["parent_span_id"], deliver["span_id"]);

    // The subscriber's parent is the deliver span.
    let sent = format!("00-{TRACE}-{}-01", deliver["span_id"].as_str().unwrap());
    assert_eq!(header(&got, "traceparent"), sent);
    assert_eq!(header(&got, "tracestate"), "vendor=abc");

    // Attributes (messaging and HTTP semantic conventions).
    let a = &publish["attributes"];
    assert_eq!(publish["kind"], 2, "SERVER");
    assert_eq!(a["messaging.system"], "eventgrid");
    assert_eq!(a["messaging.destination.name"], "t1");
    assert_eq!(a["messaging.batch.message_count"], 1);
    assert_eq!(a["http.response.status_code"], 200);
    assert_eq!(a["gridlet.outcome"], "accepted");
    assert!(a["http.request.body.size"].as_i64().unwrap() > 50, "{a}");
    assert!(
        a.get("messaging.message.id").is_none(),
        "event ids only when turned on: {a}"
    );
    let a = &deliver["attributes"];
    assert_eq!(deliver["kind"], 3, "CLIENT");
    assert_eq!(a["messaging.destination.subscription.name"], "s1");
    assert_eq!(a["gridlet.destination.type"], "WebHook");
    assert_eq!(a["server.address"], "127.0.0.1");
    assert_eq!(a["gridlet.delivery.attempt"], 1);
    assert_eq!(a["gridlet.retry_lane"], false);
    assert_eq!(a["gridlet.outcome"], "delivered");
    assert_eq!(deliver["status_code"], 0);
    assert_eq!(settle["attributes"]["gridlet.settle.outcome"], "ack");
    assert!(deliver["end"].as_u64() >= deliver["start"].as_u64());
    assert!(settle["start"].as_u64() >= deliver["end"].as_u64());

    // The export itself: protobuf, the configured headers, the resource.
    assert_eq!(publish["content_type"], "application/x-protobuf");
    assert_eq!(publish["auth"], "s3cret");
    let res = &publish["resource"];
    assert_eq!(res["service.name"], "edge-grid");
    assert_eq!(res["deployment.environment"], "lab");
    assert_eq!(res["azure.iot.device.id"], "dev1");
    assert_eq!(res["azure.iot.module.id"], "eventgridmodule");
    assert_eq!(res["azure.iot.hub.hostname"], "hub1.azure-devices.net");
    assert_eq!(publish["scope"], "gridlet");

    let m = t
        .wait_metrics("spans counted as exported", |m| {
            metric(m, "gridlet_telemetry_spans_total", "result=\"exported\"") == Some(3)
        })
        .await;
    assert_eq!(
        metric(&m, "gridlet_telemetry_spans_total", "result=\"dropped\""),
        Some(0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cloud_events_traceparent_attribute_is_the_parent_structured_and_binary() {
    let mut c = Collector::start();
    let t = start_traced(&otel_env(&c)).await;
    let mut rx = Receiver::start().await;
    let (s, _) = t
        .put(
            "/topics/ce",
            json!({"properties":{"inputSchema":"CloudEventSchemaV1_0"}}),
        )
        .await;
    assert_eq!(s, 200);
    t.webhook_sub("ce", "s", &rx.url("/ce"), json!({})).await;

    // Structured mode, no header: the event's own attribute.
    let other = "0af7651916cd43dd8448eb211c80319c";
    let event = json!({"specversion":"1.0","id":"c1","source":"/x","type":"t",
        "traceparent": format!("00-{other}-b7ad6b7169203331-01"), "tracestate":"ce=1", "data":{}});
    let r = t
        .client
        .post(t.url("/topics/ce/events"))
        .header("content-type", "application/cloudevents+json")
        .body(event.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let got = rx.next().await;
    // The attribute reaches the subscriber untouched; the header names gridlet's span.
    assert_eq!(got.json()[0]["traceparent"], event["traceparent"]);
    assert!(
        header(&got, "traceparent").starts_with(&format!("00-{other}-")),
        "{:?}",
        got.headers
    );
    assert_eq!(header(&got, "tracestate"), "ce=1");

    // Binary mode: `ce-traceparent`.
    let r = t
        .client
        .post(t.url("/topics/ce/events"))
        .header("ce-specversion", "1.0")
        .header("ce-id", "c2")
        .header("ce-source", "/x")
        .header("ce-type", "t")
        .header("ce-traceparent", traceparent())
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let got = rx.next().await;
    assert!(header(&got, "traceparent").starts_with(&format!("00-{TRACE}-")));

    let spans = c
        .until("two publishes", |s| {
            count(s, "publish") == 2 && count(s, "deliver") == 2
        })
        .await;
    let publish = |trace: &str| {
        *named(&spans, "publish")
            .iter()
            .find(|s| s["trace_id"] == trace)
            .unwrap_or_else(|| panic!("a publish span in {trace}: {spans:#?}"))
    };
    assert_eq!(publish(other)["parent_span_id"], "b7ad6b7169203331");
    assert_eq!(publish(TRACE)["parent_span_id"], PARENT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_export_off_the_publishers_context_is_passed_on_unchanged() {
    let t = start(&[]).await;
    let mut rx = Receiver::start().await;
    t.topic("t1").await;
    t.webhook_sub("t1", "s1", &rx.url("/s1"), json!({})).await;
    let r = t
        .client
        .post(t.url("/topics/t1/events"))
        .header("traceparent", traceparent())
        .json(&json!([eg_event("e-1", "s", "t", json!({}))]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&rx.next().await, "traceparent"), traceparent());
    // No context in, none out.
    t.publish("t1", json!([eg_event("e-2", "s", "t", json!({}))]))
        .await;
    assert!(rx.next().await.headers.get("traceparent").is_none());
    let m = t.metrics().await;
    assert_eq!(
        metric(&m, "gridlet_telemetry_spans_total", "result=\"dropped\""),
        None
    );
}

/// A webhook that fails its first request (500) and accepts the rest, recording each.
async fn fail_once() -> (String, mpsc::UnboundedReceiver<HeaderMap>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let calls = Arc::new(AtomicU32::new(0));
    let app = Router::new().route(
        "/hook",
        post(move |headers: HeaderMap| {
            let (tx, calls) = (tx.clone(), calls.clone());
            async move {
                let _ = tx.send(headers);
                match calls.fetch_add(1, Ordering::SeqCst) {
                    0 => StatusCode::INTERNAL_SERVER_ERROR,
                    _ => StatusCode::OK,
                }
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", l.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    (url, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_event_keeps_its_trace_one_deliver_span_per_attempt() {
    let mut c = Collector::start();
    let mut env = otel_env(&c);
    // The shortest built-in schedule: the retry comes 10 s after the failure.
    env.push(("broker__retrySchedule", "tenSecondsToHourly".into()));
    env.push(("telemetry__eventIdsOnSpans", "true".into()));
    let t = start_traced(&env).await;
    let (url, mut hook) = fail_once().await;
    t.topic("t1").await;
    t.webhook_sub("t1", "s1", &url, json!({})).await;
    let r = t
        .client
        .post(t.url("/topics/t1/events"))
        .header("traceparent", traceparent())
        .json(&json!([eg_event("e-42", "s", "t", json!({}))]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    let spans = c
        .until("two attempts settled", |s| {
            count(s, "deliver") == 2 && count(s, "settle") == 2
        })
        .await;
    let mut delivers = named(&spans, "deliver");
    delivers.sort_by_key(|s| s["attributes"]["gridlet.delivery.attempt"].as_i64());
    let publish = named(&spans, "publish")[0];
    for d in &delivers {
        assert_eq!(d["trace_id"], TRACE, "the original trace: {d}");
        assert_eq!(d["parent_span_id"], publish["span_id"]);
        assert_eq!(d["attributes"]["messaging.message.id"], "e-42");
    }
    let (first, second) = (delivers[0], delivers[1]);
    assert_eq!(first["attributes"]["gridlet.delivery.attempt"], 1);
    assert_eq!(first["attributes"]["http.response.status_code"], 500);
    assert_eq!(first["attributes"]["error.type"], "500");
    assert_eq!(first["status_code"], 2, "ERROR");
    assert_eq!(second["attributes"]["gridlet.delivery.attempt"], 2);
    assert_eq!(second["attributes"]["gridlet.retry_lane"], true);
    assert_eq!(second["attributes"]["http.request.resend_count"], 1);
    assert_eq!(second["status_code"], 0);

    // One settle per attempt: the retry (with its due time), then the acknowledgement.
    let settle_of = |d: &Value| {
        (*named(&spans, "settle")
            .iter()
            .find(|s| s["parent_span_id"] == d["span_id"])
            .unwrap())
        .clone()
    };
    let retry = settle_of(first);
    assert_eq!(retry["attributes"]["gridlet.settle.outcome"], "retry");
    assert_eq!(retry["attributes"]["gridlet.retry.delay_ms"], 10_000);
    let due = retry["attributes"]["gridlet.retry.due_unix_ms"]
        .as_i64()
        .unwrap();
    assert!(due > 0);
    assert_eq!(
        settle_of(second)["attributes"]["gridlet.settle.outcome"],
        "ack"
    );
    let acks = named(&spans, "settle")
        .iter()
        .filter(|s| s["attributes"]["gridlet.settle.outcome"] == "ack")
        .count();
    assert_eq!(acks, 1);

    // Each attempt told the webhook its own deliver span, in the same trace.
    for d in [first, second] {
        let h = hook.recv().await.unwrap();
        let tp = h.get("traceparent").unwrap().to_str().unwrap();
        assert_eq!(
            tp,
            format!("00-{TRACE}-{}-01", d["span_id"].as_str().unwrap())
        );
    }
}

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
    // 90 spans: every one dropped (queue full, or refused by the collector), none exported.
    let m = t
        .wait_metrics("every span dropped", |m| {
            metric(m, "gridlet_telemetry_spans_total", "result=\"dropped\"") == Some(90)
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
        metric(m, "gridlet_telemetry_spans_total", "result=\"dropped\"") == Some(3)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_bus_and_event_hubs_messages_carry_diagnostic_id_and_traceparent() {
    use crate::azure::{StrictBus, BUS_KEY};
    let mut c = Collector::start();
    let mut bus = StrictBus::start().await;
    let t = start_traced(&otel_env(&c)).await;
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
        let (entity, evs) = bus.next().await;
        props.insert(entity, evs[0]["__UserProperties"].clone());
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
async fn the_azure_sdks_span_is_the_parent_of_gridlets() {
    let mut c = Collector::start();
    let t = start_traced(&otel_env(&c)).await;
    let mut rx = Receiver::start().await;
    let (s, _) = t
        .put(
            "/topics/ce",
            json!({"properties":{"inputSchema":"CloudEventSchemaV1_0"}}),
        )
        .await;
    assert_eq!(s, 200);
    t.webhook_sub("ce", "s", &rx.url("/ce"), json!({})).await;
    let endpoint = format!("{}/topics/ce/events", t.base);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/otel/sdk_publish.py");
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python())
            .arg(script)
            .arg(endpoint)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sdk: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    // The SDK's HTTP request span (kind CLIENT) sent the traceparent header.
    let http = sdk
        .iter()
        .find(|s| s["kind"] == "CLIENT")
        .unwrap_or_else(|| panic!("an HTTP span from the SDK: {sdk:#?}"));
    let delivered = rx.next().await;
    let e = &delivered.json()[0];
    assert_eq!(e["source"], "/sdk");
    if let Some(tp) = e.get("traceparent") {
        // The SDK's CloudEvents tracing policy wrote the extension attribute: left intact.
        assert!(
            tp.as_str()
                .unwrap()
                .contains(http["trace_id"].as_str().unwrap()),
            "{e}"
        );
    }
    let spans = c
        .until("publish and deliver", |s| count(s, "deliver") == 1)
        .await;
    let publish = named(&spans, "publish")[0];
    assert_eq!(publish["trace_id"], http["trace_id"], "{sdk:#?}");
    assert_eq!(publish["parent_span_id"], http["span_id"], "{sdk:#?}");
    let deliver = named(&spans, "deliver")[0];
    assert_eq!(deliver["trace_id"], http["trace_id"]);
    assert!(header(&delivered, "traceparent").contains(http["trace_id"].as_str().unwrap()));
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
    t.wait_metrics("15 spans dropped", |m| {
        metric(m, "gridlet_telemetry_spans_total", "result=\"dropped\"") == Some(15)
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_that_did_not_sample_gets_no_spans_but_its_trace_goes_on() {
    let c = Collector::start();
    let t = start_traced(&otel_env(&c)).await;
    let mut rx = Receiver::start().await;
    t.topic("t1").await;
    t.webhook_sub("t1", "s1", &rx.url("/s1"), json!({})).await;
    let r = t
        .client
        .post(t.url("/topics/t1/events"))
        .header("traceparent", format!("00-{TRACE}-{PARENT}-00"))
        .json(&json!([eg_event("e-1", "s", "t", json!({}))]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let tp = header(&rx.next().await, "traceparent");
    assert!(
        tp.starts_with(&format!("00-{TRACE}-")) && tp.ends_with("-00"),
        "{tp}"
    );
    assert!(
        !tp.contains(PARENT),
        "gridlet's own (unrecorded) span id: {tp}"
    );
    // Parent-based sampling: nothing recorded, nothing dropped.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let m = t.metrics().await;
    assert_eq!(
        metric(&m, "gridlet_telemetry_spans_total", "result=\"exported\""),
        Some(0)
    );
    assert_eq!(
        metric(&m, "gridlet_telemetry_spans_total", "result=\"dropped\""),
        Some(0)
    );
}
