//! [`StrictNamespace`]: an HTTPS receiver for Event Grid namespaces' publish operation
//! (`POST /topics/{topic}:publish?api-version=2024-06-01`), written from Microsoft's REST and
//! SDK pages, independently of gridlet's code. It checks the api-version, the content type
//! (`application/cloudevents-batch+json`), the `Authorization: SharedAccessKey` header, and
//! every CloudEvent of the batch (`specversion` 1.0, non-empty `id`, `source`, `type`; at most
//! 1,000 events), and answers as the service documents: 200 `{}`; 400 bad request; 401
//! authorization failure; 403 "quota exceeded or message is too large" (a body over `max_body`
//! or an event over `max_event`); 410 topic not found (checked first). On command (`force`): any status with
//! the given text (429/503 with `Retry-After: 1`).

use crate::util::WAIT;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

pub const NS_KEY: &str = "bmFtZXNwYWNlLWtleS1mb3ItdGVzdHM=";
/// Topics the namespace has.
const TOPICS: &[&str] = &["cloud", "other"];

/// One request the receiver answered.
#[derive(Debug, Clone)]
pub struct Logged {
    pub topic: String,
    pub status: u16,
    pub content_type: String,
    /// The request's `traceparent` header, if any.
    pub traceparent: Option<String>,
    /// The batch's events (when the body parsed as an array).
    pub events: Vec<Value>,
}

#[derive(Clone)]
pub struct NsState {
    pub force: Arc<AtomicU16>,
    pub force_text: Arc<Mutex<String>>,
    pub max_body: Arc<AtomicUsize>,
    pub max_event: Arc<AtomicUsize>,
    tx: mpsc::UnboundedSender<Vec<Value>>,
    pub log: Arc<Mutex<Vec<Logged>>>,
}

fn fail(status: u16, code: &str, message: &str) -> Response {
    let body = json!({"error": {"code": code, "message": message}});
    (StatusCode::from_u16(status).unwrap(), axum::Json(body)).into_response()
}

fn check_batch(body: &[u8], max_event: usize) -> Result<Vec<Value>, (u16, String)> {
    let Ok(Value::Array(items)) = serde_json::from_slice::<Value>(body) else {
        return Err((400, "the body must be a JSON array of CloudEvents".into()));
    };
    if items.is_empty() || items.len() > 1000 {
        return Err((
            400,
            format!("a batch holds 1 to 1000 events, not {}", items.len()),
        ));
    }
    for e in &items {
        let Some(o) = e.as_object() else {
            return Err((400, "every event must be an object".into()));
        };
        if o.get("specversion").and_then(Value::as_str) != Some("1.0") {
            return Err((400, "specversion must be 1.0".into()));
        }
        for k in ["id", "source", "type"] {
            if o.get(k).and_then(Value::as_str).is_none_or(str::is_empty) {
                return Err((400, format!("the required attribute {k} is missing")));
            }
        }
        if e.to_string().len() > max_event {
            return Err((403, "the event is too large".into()));
        }
    }
    Ok(items)
}

async fn publish(
    State(s): State<NsState>,
    Path(raw): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(topic) = raw.strip_suffix(":publish") else {
        return fail(404, "NotFound", "no such operation");
    };
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let traceparent = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let parsed = check_batch(&body, s.max_event.load(Ordering::SeqCst));
    let (status, response) = answer(&s, topic, q, &headers, &content_type, &body, &parsed);
    s.log.lock().unwrap().push(Logged {
        topic: topic.to_string(),
        status,
        content_type,
        traceparent,
        events: serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default(),
    });
    if let (200, Ok(events)) = (status, parsed) {
        let _ = s.tx.send(events);
    }
    response
}

fn answer(
    s: &NsState,
    topic: &str,
    q: Option<String>,
    headers: &HeaderMap,
    content_type: &str,
    body: &[u8],
    parsed: &Result<Vec<Value>, (u16, String)>,
) -> (u16, Response) {
    if !TOPICS.contains(&topic) {
        return (
            410,
            fail(410, "NotFound", &format!("topic {topic} not found")),
        );
    }
    match s.force.load(Ordering::SeqCst) {
        0 => {}
        st @ (429 | 503) => {
            let mut r = fail(st, "Busy", "busy");
            r.headers_mut()
                .insert("retry-after", axum::http::HeaderValue::from_static("1"));
            return (st, r);
        }
        st => return (st, fail(st, "Forced", &s.force_text.lock().unwrap())),
    }
    if !q
        .unwrap_or_default()
        .split('&')
        .any(|p| p == "api-version=2024-06-01")
    {
        return (
            400,
            fail(400, "BadRequest", "api-version=2024-06-01 is required"),
        );
    }
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if auth != format!("SharedAccessKey {NS_KEY}") {
        return (
            401,
            fail(401, "Unauthorized", "the access key is not valid"),
        );
    }
    let essence = content_type.split(';').next().unwrap_or("").trim();
    if essence != "application/cloudevents-batch+json" {
        return (
            400,
            fail(
                400,
                "BadRequest",
                "Content-Type must be application/cloudevents-batch+json",
            ),
        );
    }
    if body.len() > s.max_body.load(Ordering::SeqCst) {
        return (
            403,
            fail(
                403,
                "Forbidden",
                "the request is too large: quota exceeded or message is too large",
            ),
        );
    }
    match parsed {
        Ok(_) => (200, (StatusCode::OK, axum::Json(json!({}))).into_response()),
        Err((st, why)) => (*st, fail(*st, "BadRequest", why)),
    }
}

/// The strict namespace receiver (HTTPS, self-signed for `localhost`).
pub struct StrictNamespace {
    pub state: NsState,
    pub port: u16,
    pub rx: mpsc::UnboundedReceiver<Vec<Value>>,
    trust_file: tempfile::NamedTempFile,
    _task: tokio::task::JoinHandle<()>,
}

impl StrictNamespace {
    pub async fn start() -> Self {
        Self::start_as(&["localhost"]).await
    }

    /// A peer whose self-signed certificate names only `names` (gridlet still trusts it).
    pub async fn start_as(names: &[&str]) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let state = NsState {
            force: Arc::new(AtomicU16::new(0)),
            force_text: Arc::new(Mutex::new("forced".into())),
            max_body: Arc::new(AtomicUsize::new(1 << 20)),
            max_event: Arc::new(AtomicUsize::new(1 << 20)),
            tx,
            log: Arc::new(Mutex::new(Vec::new())),
        };
        let app = Router::new()
            .route("/topics/{raw}", post(publish))
            .with_state(state.clone());
        let (port, task, pem) = crate::util::serve_https_as(app, names).await;
        let trust_file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(trust_file.path(), pem).unwrap();
        Self {
            state,
            port,
            rx,
            trust_file,
            _task: task,
        }
    }

    /// Settings that make gridlet trust this peer and accept its host name.
    pub fn settings(&self) -> Vec<(&'static str, &str)> {
        vec![
            (
                "outbound__azure__trustedCertificatesFile",
                self.trust_file.path().to_str().unwrap(),
            ),
            ("outbound__eventgrid__allowInvalidHostnames", "true"),
        ]
    }

    /// The publish URL of `topic`.
    pub fn url(&self, topic: &str) -> String {
        format!(
            "https://localhost:{}/topics/{topic}:publish?api-version=2024-06-01",
            self.port
        )
    }

    pub fn force(&self, status: u16, text: &str) {
        *self.state.force_text.lock().unwrap() = text.to_string();
        self.state.force.store(status, Ordering::SeqCst);
    }

    pub fn log(&self) -> Vec<Logged> {
        self.state.log.lock().unwrap().clone()
    }

    pub async fn next(&mut self) -> Vec<Value> {
        tokio::time::timeout(WAIT, self.rx.recv())
            .await
            .expect("a batch within the wait")
            .unwrap()
    }
}
