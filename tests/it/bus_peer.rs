//! [`StrictBus`]: an HTTPS receiver implementing the documented Event Hubs / Service Bus REST
//! batch-send contract strictly, written from Microsoft's REST pages, independently of
//! gridlet's code. It recomputes the SAS signature from the key and checks the key name, the
//! expiry, the resource URI, the query, the content type and every message of the body.
//!
//! Answers, as documented:
//! - Service Bus ("Send Message Batch"): 201 sent; 400 bad request; 401 authorization failure;
//!   403 "quota exceeded or message too large" (here: a body over `max_body`); 410 "specified
//!   queue or topic doesn't exist".
//! - Event Hubs ("Send batch events" documents only 201, 401 and 500): 404 for a hub the
//!   namespace lacks and 413 for a body over `max_body` (the gateway's general answers; not
//!   on the page).
//! - On command (`force`): any status with `force_text` as the detail; 429/503 with
//!   `Retry-After: 1`.
//!
//! Every request whose body parsed is logged with its status ([`Logged`]), so tests see
//! refused requests' messages too (retried batches' `MessageId`s).

use crate::util::WAIT;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use base64::Engine as _;
use serde_json::Value;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

pub const BUS_KEY_NAME: &str = "send";
pub const BUS_KEY: &str = "c2VjcmV0LWtleS1mb3ItdGVzdHM=";

/// Event hubs the namespace has.
const HUBS: &[&str] = &["hub1"];
/// Service Bus queues and topics the namespace has.
const BUS_ENTITIES: &[&str] = &["queue1", "topic1"];

/// `BrokerProperties` the REST batch format knows.
const BROKER_PROPERTIES: &[&str] = &[
    "MessageId",
    "SessionId",
    "CorrelationId",
    "Label",
    "PartitionKey",
    "ViaPartitionKey",
    "To",
    "ReplyTo",
    "ReplyToSessionId",
    "TimeToLive",
    "ScheduledEnqueueTimeUtc",
    "ContentType",
];

/// One request the receiver answered (its body parsed as a batch).
#[derive(Debug, Clone)]
pub struct Logged {
    pub entity: String,
    pub status: u16,
    /// The batch's messages (`{"Body": …, "BrokerProperties": …, "UserProperties": …}`).
    pub messages: Vec<Value>,
}

/// What the strict receiver answers next.
#[derive(Clone)]
pub struct BusState {
    /// `localhost:PORT`: the namespace host tokens must name.
    host: Arc<Mutex<String>>,
    /// 0 = check and accept; any other status is answered as is (429/503 with Retry-After: 1).
    pub force: Arc<AtomicU16>,
    /// The detail of a forced answer.
    pub force_text: Arc<Mutex<String>>,
    /// Bodies larger than this are too large (403 for Service Bus, 413 for Event Hubs).
    pub max_body: Arc<AtomicUsize>,
    tx: mpsc::UnboundedSender<(String, Vec<Value>)>,
    pub log: Arc<Mutex<Vec<Logged>>>,
}

fn pct_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

fn fail(status: u16, detail: &str) -> Response {
    let body = format!("<Error><Code>{status}</Code><Detail>{detail}</Detail></Error>");
    (StatusCode::from_u16(status).unwrap(), body).into_response()
}

/// Check a `SharedAccessSignature` header for `entity`; `Err(detail)` is a 401.
fn check_token(s: &BusState, entity: &str, auth: &str) -> Result<(), String> {
    let rest = auth
        .strip_prefix("SharedAccessSignature ")
        .ok_or("not a SharedAccessSignature")?;
    let mut sr = None;
    let mut sig = None;
    let mut se = None;
    let mut skn = None;
    for kv in rest.split('&') {
        let (k, v) = kv.split_once('=').ok_or("bad token field")?;
        match k {
            "sr" => sr = Some(v),
            "sig" => sig = Some(v),
            "se" => se = Some(v),
            "skn" => skn = Some(v),
            _ => return Err(format!("unknown token field {k}")),
        }
    }
    let (sr, sig, se, skn) = (
        sr.ok_or("no sr")?,
        sig.ok_or("no sig")?,
        se.ok_or("no se")?,
        skn.ok_or("no skn")?,
    );
    if pct_decode(skn) != BUS_KEY_NAME {
        return Err("unknown SharedAccessKeyName".into());
    }
    let expiry: u64 = se.parse().map_err(|_| "se is not a number")?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    if expiry <= now {
        return Err("ExpiredToken: the token's se has passed".into());
    }
    if expiry > now + 24 * 3600 {
        return Err("token lives longer than a day".into());
    }
    let want = format!("https://{}/{entity}", s.host.lock().unwrap());
    if !pct_decode(sr).eq_ignore_ascii_case(&want) {
        return Err(format!("token is for {}, not {want}", pct_decode(sr)));
    }
    let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, BUS_KEY.as_bytes());
    let expect = base64::engine::general_purpose::STANDARD
        .encode(ring::hmac::sign(&k, format!("{sr}\n{se}").as_bytes()).as_ref());
    if pct_decode(sig) != expect {
        return Err("signature mismatch".into());
    }
    Ok(())
}

/// The messages and events of a batch body, or why it is a 400. An Event Hubs message's body
/// is an array of one event (Event Grid's framing, as the Azure SDK reads it), a Service Bus
/// message's body the event object.
fn check_body(body: &[u8], service_bus: bool) -> Result<(Vec<Value>, Vec<Value>), String> {
    let Ok(Value::Array(items)) = serde_json::from_slice::<Value>(body) else {
        return Err("body must be a JSON array".into());
    };
    if items.is_empty() {
        return Err("empty batch".into());
    }
    let mut events = Vec::new();
    for m in &items {
        let Some(o) = m.as_object() else {
            return Err("every message must be an object".into());
        };
        for k in o.keys() {
            if !["Body", "BrokerProperties", "UserProperties", "IsBodyBase64"].contains(&k.as_str())
            {
                return Err(format!("unknown message member {k}"));
            }
        }
        let Some(b) = o.get("Body").and_then(Value::as_str) else {
            return Err("every message needs a string Body".into());
        };
        match serde_json::from_str::<Value>(b) {
            Ok(v @ Value::Object(_)) if service_bus => events.push(v),
            Ok(Value::Array(mut a))
                if !service_bus && a.len() == 1 && a.first().is_some_and(Value::is_object) =>
            {
                events.push(a.remove(0))
            }
            _ if service_bus => return Err("Body must be one event's JSON object".into()),
            _ => return Err("Body must be a JSON array of one event".into()),
        }
        if let Some(bp) = o.get("BrokerProperties") {
            let Some(bp) = bp.as_object() else {
                return Err("BrokerProperties must be an object".into());
            };
            for (k, v) in bp {
                if !BROKER_PROPERTIES.contains(&k.as_str()) {
                    return Err(format!("unknown broker property {k}"));
                }
                if k == "MessageId" && v.as_str().is_none_or(|s| s.is_empty() || s.len() > 128) {
                    return Err("MessageId must be a string of 1 to 128 characters".into());
                }
            }
        }
        if let Some(up) = o.get("UserProperties") {
            let Some(up) = up.as_object() else {
                return Err("UserProperties must be an object".into());
            };
            if up.values().any(|v| v.is_object() || v.is_array()) {
                return Err("UserProperties values must be simple values".into());
            }
        }
    }
    Ok((items, events))
}

async fn bus_messages(
    State(s): State<BusState>,
    Path(entity): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let parsed = check_body(&body, !entity.starts_with("hub"));
    let (status, response) = answer(&s, &entity, q, &headers, &body, &parsed);
    if let Ok((items, events)) = parsed {
        s.log.lock().unwrap().push(Logged {
            entity: entity.clone(),
            status,
            messages: items,
        });
        if status == 201 {
            let _ = s.tx.send((entity, events));
        }
    }
    response
}

fn answer(
    s: &BusState,
    entity: &str,
    q: Option<String>,
    headers: &HeaderMap,
    body: &[u8],
    parsed: &Result<(Vec<Value>, Vec<Value>), String>,
) -> (u16, Response) {
    let service_bus = !entity.starts_with("hub");
    match s.force.load(Ordering::SeqCst) {
        0 => {}
        st @ (429 | 503) => {
            let mut r = fail(st, "busy");
            r.headers_mut()
                .insert("retry-after", axum::http::HeaderValue::from_static("1"));
            return (st, r);
        }
        st => return (st, fail(st, &s.force_text.lock().unwrap())),
    }
    let q = q.unwrap_or_default();
    if !q.split('&').any(|p| p == "api-version=2014-01") || !q.split('&').any(|p| p == "timeout=60")
    {
        return (
            400,
            fail(400, "query must carry timeout=60&api-version=2014-01"),
        );
    }
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if let Err(detail) = check_token(s, entity, auth) {
        return (401, fail(401, &format!("InvalidSignature: {detail}")));
    }
    if service_bus && !BUS_ENTITIES.contains(&entity) {
        return (
            410,
            fail(
                410,
                &format!("MessagingEntityNotFound: queue or topic {entity} does not exist"),
            ),
        );
    }
    if !service_bus && !HUBS.contains(&entity) {
        return (
            404,
            fail(404, &format!("MessagingEntityNotFound: {entity}")),
        );
    }
    if headers.get("content-type").and_then(|v| v.to_str().ok())
        != Some("application/vnd.microsoft.servicebus.json")
    {
        return (
            400,
            fail(
                400,
                "Content-Type must be application/vnd.microsoft.servicebus.json",
            ),
        );
    }
    if body.len() > s.max_body.load(Ordering::SeqCst) {
        return if service_bus {
            let limit = s.max_body.load(Ordering::SeqCst);
            (
                403,
                fail(403, &format!("MessageSizeExceeded: the batch of {} bytes exceeds the limit ({limit} bytes) currently allowed", body.len())),
            )
        } else {
            (413, fail(413, "MessageSizeExceeded"))
        };
    }
    if let Err(e) = parsed {
        return (400, fail(400, e));
    }
    (201, StatusCode::CREATED.into_response())
}

/// The strict Event Hubs / Service Bus receiver (HTTPS, self-signed).
pub struct StrictBus {
    pub state: BusState,
    pub port: u16,
    pub rx: mpsc::UnboundedReceiver<(String, Vec<Value>)>,
    /// Its certificate's PEM, for `outbound__azure__trustedCertificatesFile` (Azure
    /// destinations verify the server: [`StrictBus::trust`]).
    trust_file: tempfile::NamedTempFile,
    _task: tokio::task::JoinHandle<()>,
}

impl StrictBus {
    pub async fn start() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let state = BusState {
            host: Arc::new(Mutex::new(String::new())),
            force: Arc::new(AtomicU16::new(0)),
            force_text: Arc::new(Mutex::new("forced".into())),
            max_body: Arc::new(AtomicUsize::new(1_000_000)),
            tx,
            log: Arc::new(Mutex::new(Vec::new())),
        };
        let app = Router::new()
            .route("/{entity}/messages", post(bus_messages))
            .with_state(state.clone());
        let (port, task, pem) = crate::util::serve_https_as(app, &["localhost"]).await;
        *state.host.lock().unwrap() = format!("localhost:{port}");
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

    /// The setting that makes gridlet trust this peer's certificate.
    pub fn trust(&self) -> (&'static str, &str) {
        (
            "outbound__azure__trustedCertificatesFile",
            self.trust_file.path().to_str().unwrap(),
        )
    }

    pub fn connection_string(&self, entity: &str, key: &str) -> String {
        format!(
            "Endpoint=sb://localhost:{}/;SharedAccessKeyName={BUS_KEY_NAME};SharedAccessKey={key};EntityPath={entity}",
            self.port
        )
    }

    /// Answer every request with `status` and `text` (0: check and accept again).
    pub fn force(&self, status: u16, text: &str) {
        *self.state.force_text.lock().unwrap() = text.to_string();
        self.state.force.store(status, Ordering::SeqCst);
    }

    /// The requests answered so far.
    pub fn log(&self) -> Vec<Logged> {
        self.state.log.lock().unwrap().clone()
    }

    pub async fn next(&mut self) -> (String, Vec<Value>) {
        tokio::time::timeout(WAIT, self.rx.recv())
            .await
            .expect("a batch within the wait")
            .unwrap()
    }
}
