//! Shared test harness: a real gridlet on 127.0.0.1:0 and real webhook receivers.

#![allow(dead_code)]

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::any;
use axum::Router;
use gridlet::{Config, Gridlet, Parts};
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

pub use crate::wait::{eventually, eventually_within, poll_within};

/// The api-version query.
pub const V: &str = "api-version=2019-01-01-preview";

/// How long a test waits for something that should happen promptly (generous for slow CI).
pub const WAIT: Duration = Duration::from_secs(10);

/// One request a receiver got.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Received {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("delivered body is JSON")
    }
}

#[derive(Clone)]
struct RxState {
    tx: mpsc::UnboundedSender<Received>,
    status: Arc<AtomicU16>,
    count: Arc<AtomicU64>,
}

/// A real HTTP webhook receiver forwarding every request to a channel.
pub struct Receiver {
    pub addr: SocketAddr,
    pub rx: mpsc::UnboundedReceiver<Received>,
    status: Arc<AtomicU16>,
    pub count: Arc<AtomicU64>,
    _task: tokio::task::JoinHandle<()>,
}

async fn record(
    State(s): State<RxState>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    // The answer is decided before the request can be seen (counted or received): a test that
    // waits for a request and then changes the status changes only later answers.
    let status = StatusCode::from_u16(s.status.load(Ordering::SeqCst)).unwrap_or(StatusCode::OK);
    s.count.fetch_add(1, Ordering::SeqCst);
    let _ = s.tx.send(Received {
        path: uri.path().to_string(),
        headers,
        body,
    });
    status
}

type Recording = (
    Router,
    mpsc::UnboundedReceiver<Received>,
    Arc<AtomicU16>,
    Arc<AtomicU64>,
);

/// The router both receivers serve: record every POST, answer the configured status.
fn recording_app() -> Recording {
    let (tx, rx) = mpsc::unbounded_channel();
    let status = Arc::new(AtomicU16::new(200));
    let count = Arc::new(AtomicU64::new(0));
    let state = RxState {
        tx,
        status: status.clone(),
        count: count.clone(),
    };
    let app = Router::new()
        .route("/{*path}", any(record))
        .route("/", any(record))
        .with_state(state);
    (app, rx, status, count)
}

impl Receiver {
    /// Start a receiver answering 200.
    pub async fn start() -> Self {
        let (app, rx, status, count) = recording_app();
        let (addr, task) = serve_http(app).await;
        Self {
            addr,
            rx,
            status,
            count,
            _task: task,
        }
    }

    /// Webhook URL for `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Answer every later request with `status`.
    pub fn respond_with(&self, status: u16) {
        self.status.store(status, Ordering::SeqCst);
    }

    /// Wait for the next request (panics after [`WAIT`]).
    pub async fn next(&mut self) -> Received {
        tokio::time::timeout(WAIT, self.rx.recv())
            .await
            .expect("a delivery within the wait")
            .expect("receiver open")
    }

    /// Assert nothing arrives within `d`.
    pub async fn nothing_within(&mut self, d: Duration) {
        if let Ok(Some(r)) = tokio::time::timeout(d, self.rx.recv()).await {
            panic!("unexpected delivery: {}", String::from_utf8_lossy(&r.body));
        }
    }
}

/// A running gridlet and an HTTP client for it.
pub struct TestGridlet {
    pub g: Gridlet,
    pub base: String,
    pub https_base: Option<String>,
    pub client: reqwest::Client,
    pub dir: tempfile::TempDir,
}

/// Settings every test starts from: HTTP on, no client certs, http webhooks allowed, loopback.
pub fn base_env(dir: &std::path::Path) -> Vec<(String, String)> {
    [
        ("inbound__serverAuth__tlsPolicy", "enabled"),
        ("inbound__clientAuth__clientCert__enabled", "false"),
        ("outbound__webhook__httpsOnly", "false"),
        ("inbound__httpPort", "0"),
        ("inbound__httpsPort", "0"),
        ("inbound__bindAddress", "127.0.0.1"),
        ("metrics__reporterType", "prometheus"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .chain([
        (
            "persistence__metadataPath".to_string(),
            dir.join("metadataDb").display().to_string(),
        ),
        (
            "persistence__eventsPath".to_string(),
            dir.join("eventsDb").display().to_string(),
        ),
    ])
    .collect()
}

/// Start gridlet with the base settings overridden by `extra`.
pub async fn start(extra: &[(&str, &str)]) -> TestGridlet {
    start_with(extra, Parts::default()).await
}

/// Start gridlet with replaced parts.
pub async fn start_with(extra: &[(&str, &str)], parts: Parts) -> TestGridlet {
    start_in(tempfile::tempdir().unwrap(), extra, parts).await
}

/// Start gridlet with its metadata and events in `dir` (a gridlet stopped before started on
/// the same `dir` again finds what it stored).
pub async fn start_in(dir: tempfile::TempDir, extra: &[(&str, &str)], parts: Parts) -> TestGridlet {
    let mut env = base_env(dir.path());
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let cfg = Config::from_vars(env).expect("valid test config");
    let g = Gridlet::start(cfg, parts).await.expect("gridlet starts");
    let base = g
        .http_addr
        .map(|a| format!("http://{a}"))
        .unwrap_or_default();
    let https_base = g
        .https_addr
        .map(|a| format!("https://127.0.0.1:{}", a.port()));
    gridlet::tls::install_default_provider();
    let client = reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    TestGridlet {
        g,
        base,
        https_base,
        client,
        dir,
    }
}

impl TestGridlet {
    pub fn url(&self, path: &str) -> String {
        let sep = if path.contains('?') { '&' } else { '?' };
        format!("{}{}{}{}", self.base, path, sep, V)
    }

    pub async fn put(&self, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .client
            .put(self.url(path))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let r = self.client.get(self.url(path)).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn delete(&self, path: &str) -> (u16, String) {
        let r = self.client.delete(self.url(path)).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self
            .client
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Create an EventGridSchema topic.
    pub async fn topic(&self, name: &str) {
        let (s, b) = self
            .put(&format!("/topics/{name}"), serde_json::json!({}))
            .await;
        assert_eq!(s, 200, "{b}");
    }

    /// Create a webhook subscription with extra `properties` merged in.
    pub async fn webhook_sub(&self, topic: &str, name: &str, url: &str, extra: Value) -> Value {
        let mut props = serde_json::json!({
            "destination": {"endpointType": "WebHook", "properties": {"endpointUrl": url}}
        });
        if let (Some(p), Some(e)) = (props.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                p.insert(k.clone(), v.clone());
            }
        }
        let (s, b) = self
            .put(
                &format!("/topics/{topic}/eventSubscriptions/{name}"),
                serde_json::json!({"properties": props}),
            )
            .await;
        assert_eq!(s, 200, "{b}");
        b
    }

    /// Publish events to a topic, expecting 200.
    pub async fn publish(&self, topic: &str, events: Value) {
        let (s, b) = self
            .post_json(&format!("/topics/{topic}/events"), &events)
            .await;
        assert_eq!(s, 200, "{b}");
    }

    pub async fn metrics(&self) -> String {
        self.client
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Wait until the metrics text satisfies `f`, and return it.
    pub async fn wait_metrics(&self, what: &str, f: impl Fn(&str) -> bool) -> String {
        eventually(what, || async {
            let m = self.metrics().await;
            if f(&m) {
                Ok(m)
            } else {
                Err(format!("\n{m}"))
            }
        })
        .await
    }

    /// Wait until metric `name{labels}` reads `want`, and return the metrics text.
    pub async fn wait_metric(&self, name: &str, labels: &str, want: u64) -> String {
        let what = format!("{name}{{{labels}}} = {want}");
        self.wait_metrics(&what, |m| metric(m, name, labels) == Some(want))
            .await
    }
}

/// A valid EventGridSchema event.
pub fn eg_event(id: &str, subject: &str, event_type: &str, data: Value) -> Value {
    serde_json::json!({
        "id": id, "subject": subject, "eventType": event_type,
        "eventTime": "2017-08-10T21:03:07+00:00", "dataVersion": "1.0", "data": data
    })
}

/// Read a metric value with these labels from Prometheus text.
pub fn metric(text: &str, name: &str, labels: &str) -> Option<u64> {
    let prefix = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

/// A real HTTPS webhook receiver with a self-signed certificate for `localhost`/`127.0.0.1`.
pub async fn https_receiver() -> Receiver {
    let (app, rx, status, count) = recording_app();
    let (port, task) = serve_https(app).await;
    Receiver {
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        rx,
        status,
        count,
        _task: task,
    }
}

/// The URL (`path` on a plain HTTP server that lives as long as the test's runtime) of an
/// endpoint that answers every request with 500: a failing endpoint. (A closed port is an
/// outage, whose events wait instead of failing: issue 34.)
pub async fn failing_endpoint(path: &str) -> String {
    let app = Router::new().fallback(|| async { axum::http::StatusCode::INTERNAL_SERVER_ERROR });
    let (addr, _task) = serve_http(app).await;
    format!("http://{addr}{path}")
}

/// Serve `app` over plain HTTP on a free 127.0.0.1 port: its address and the serving task.
pub async fn serve_http(app: Router) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, task)
}

/// Serve `app` over HTTPS (self-signed for `localhost`/`127.0.0.1`) on a free 127.0.0.1 port.
pub async fn serve_https(app: Router) -> (u16, tokio::task::JoinHandle<()>) {
    let (port, task, _) = serve_https_as(app, &["localhost", "127.0.0.1"]).await;
    (port, task)
}

/// A recording HTTPS receiver with a self-signed certificate for `names`, and that
/// certificate's PEM (to trust it explicitly).
pub async fn https_receiver_as(names: &[&str]) -> (Receiver, String) {
    let (app, rx, status, count) = recording_app();
    let (port, task, pem) = serve_https_as(app, names).await;
    let r = Receiver {
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        rx,
        status,
        count,
        _task: task,
    };
    (r, pem)
}

/// Serve `app` over HTTPS with a self-signed certificate for `names` on a free 127.0.0.1 port;
/// also returns the certificate's PEM.
pub async fn serve_https_as(
    app: Router,
    names: &[&str],
) -> (u16, tokio::task::JoinHandle<()>, String) {
    use hyper_util::rt::TokioIo;
    gridlet::tls::install_default_provider();
    let ck =
        rcgen::generate_simple_self_signed(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap();
    let pem = ck.cert.pem();
    let key = gridlet::tls::certified_key(
        ck.cert.pem().as_bytes(),
        ck.signing_key.serialize_pem().as_bytes(),
    )
    .unwrap();
    let store = gridlet::tls::CertStore::new(key);
    let cfg = gridlet::tls::server_config(store, gridlet::tls::ClientCerts::AnyCa).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                break;
            };
            let acceptor = acceptor.clone();
            let app = app.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let svc = hyper_util::service::TowerToHyperService::new(app);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    (addr.port(), task, pem)
}

impl Receiver {
    /// HTTPS URL for `path` (for receivers from [`https_receiver`]).
    pub fn https_url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{}", self.addr.port(), path)
    }
}

/// xorshift64*: a deterministic stream from a seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A port free on 127.0.0.1 right now (for a peer or a gridlet that must know its port before
/// it starts).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
