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

mod export;
mod mqtt;
mod pull;
mod restart;
mod sinks;
mod spans;

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
            metric(m, "gridlet_telemetry_spans_total", "result=\"exported\"") == Some(4)
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
        // Both: under load the delivery can end (and be exported) before the publish handler
        // records its span.
        .until("publish and deliver", |s| {
            count(s, "deliver") == 1 && count(s, "publish") >= 1
        })
        .await;
    let publish = named(&spans, "publish")[0];
    assert_eq!(publish["trace_id"], http["trace_id"], "{sdk:#?}");
    assert_eq!(publish["parent_span_id"], http["span_id"], "{sdk:#?}");
    let deliver = named(&spans, "deliver")[0];
    assert_eq!(deliver["trace_id"], http["trace_id"]);
    assert!(header(&delivered, "traceparent").contains(http["trace_id"].as_str().unwrap()));
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
