//! Azure Storage: queue messages ([`StorageQueueSink`]) and dead letters as blobs
//! ([`BlobDeadLetterSink`]), authorised with Shared Key ([`super::sharedkey`]).
//!
//! * **Put Message**: `POST {queueEndpoint}/{queue}/messages` with
//!   `<QueueMessage><MessageText>…</MessageText></QueueMessage>`; one message per event (a
//!   message holds at most [`MAX_MESSAGE_BYTES`] of text, so events are never packed together).
//!   The text is the event's JSON, base64-encoded by default (what Azure Functions' queue
//!   trigger and the SDKs' base64 policy read) or XML-escaped plain text. An event whose text
//!   would exceed the limit is [`FailureKind::TooLarge`] (dead-lettered at once, alone: the
//!   batch's other events are sent). A batch's messages go out at most [`PARALLEL_PUTS`] at a
//!   time; each event reports its own outcome ([`Outcome::PerEvent`]). With
//!   `queueMessageTimeToLiveInSeconds` the request carries `?messagettl=` (seconds, -1 = never
//!   expires; Put Message, version 2017-07-29 and later).
//! * **Put Blob** (`x-ms-blob-type: BlockBlob`, `application/json`): by default Event Grid's
//!   layout and content ([`blobletters`]: `{SUBSCRIPTION}/{y}/{m}/{d}/{h}/{guid}.json`, a JSON
//!   array of the dead-lettered events with Event Grid's fields); with `deadLetterFormat:
//!   gridlet`, one blob per letter, `{topic}/{subscription}/{time}-{batch}-{n}-{eventId}.json`,
//!   holding the dead letter's JSON (event, reason, last status and error, attempts, times),
//!   names starting with the dead-letter time in fixed width (`20261124T120000123Z`) so a
//!   listing sorts by time. The container must exist (as with Event Grid in the cloud).

use super::blobletters::{self, BlobFormat};
use super::sharedkey::{SharedKey, Signed, VERSION};
use crate::delivery::sink::{DeliveryRequest, FailureKind, Outcome, Sink};
use crate::model::azure::{MessageEncoding, StorageConn};
use crate::model::sas::expiry as sas_expiry;
use crate::outbound::http::{Endpoint, HttpClient, HttpError};
use base64::Engine as _;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use hyper::Method;

/// Largest message text Azure Storage queues accept (64 KiB).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// Put Message requests of one batch in flight at once.
pub const PARALLEL_PUTS: usize = 16;

static X_MS_DATE: HeaderName = HeaderName::from_static("x-ms-date");
static X_MS_VERSION: HeaderName = HeaderName::from_static("x-ms-version");
static X_MS_BLOB_TYPE: HeaderName = HeaderName::from_static("x-ms-blob-type");
const XML: &str = "application/xml";
const JSON: &str = "application/json";

/// The message text of `event` in `encoding`.
pub fn message_text(encoding: MessageEncoding, event: &[u8]) -> String {
    match encoding {
        MessageEncoding::Base64 => base64::engine::general_purpose::STANDARD.encode(event),
        MessageEncoding::Text => xml_escape(&String::from_utf8_lossy(event)),
    }
}

fn xml_escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            c => o.push(c),
        }
    }
    o
}

/// A signed storage request's fixed parts.
struct Signer {
    key: Option<SharedKey>,
}

impl Signer {
    /// Headers for `method` on `url_path` (with `query`) with a body of `len` bytes of
    /// `content_type`.
    fn headers(
        &self,
        method: &str,
        url_path: &str,
        query: &[(&str, &str)],
        len: usize,
        content_type: &'static str,
        blob: bool,
    ) -> HeaderMap {
        let date = httpdate::fmt_http_date(super::wall_now());
        let mut ms: Vec<(&str, &str)> = vec![("x-ms-date", &date), ("x-ms-version", VERSION)];
        if blob {
            ms.push(("x-ms-blob-type", "BlockBlob"));
        }
        let mut h = HeaderMap::with_capacity(6);
        h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        if let Ok(v) = HeaderValue::from_str(&date) {
            h.insert(X_MS_DATE.clone(), v);
        }
        h.insert(X_MS_VERSION.clone(), HeaderValue::from_static(VERSION));
        if blob {
            h.insert(
                X_MS_BLOB_TYPE.clone(),
                HeaderValue::from_static("BlockBlob"),
            );
        }
        if let Some(k) = &self.key {
            let signed = Signed {
                method,
                path: url_path,
                query,
                content_length: len,
                content_type,
                ms_headers: &ms,
            };
            if let Some(a) = k.authorization(&signed) {
                h.insert(AUTHORIZATION, a);
            }
        }
        h
    }
}

fn url_path(url: &str) -> String {
    url::Url::parse(url).map_or_else(|_| "/".into(), |u| u.path().to_string())
}

/// One Storage queue.
pub struct StorageQueueSink {
    endpoint: Result<Endpoint, HttpError>,
    path: String,
    signer: Signer,
    encoding: MessageEncoding,
    /// `messagettl` (seconds, -1 = never expires), when set.
    ttl: Option<String>,
    /// When the connection string's SAS expires (Unix seconds).
    sas_expiry: Option<u64>,
    what: String,
}

/// The Shared Key of `conn`, unless it authorises with a SAS (then on each URL instead).
fn shared_key(conn: &StorageConn) -> Option<SharedKey> {
    match conn.sas {
        Some(_) => None,
        None => SharedKey::new(&conn.account, &conn.key),
    }
}

/// `url` with `conn`'s SAS appended to its query, if it has one.
fn with_sas(url: String, conn: &StorageConn) -> String {
    match &conn.sas {
        Some(sas) if url.contains('?') => format!("{url}&{sas}"),
        Some(sas) => format!("{url}?{sas}"),
        None => url,
    }
}

impl StorageQueueSink {
    /// A sink putting messages into `queue` of `conn`'s account; `ttl_secs` is each message's
    /// time to live (`messagettl`: seconds, -1 = never; `None` = the service's 7 days).
    pub fn new(
        client: &HttpClient,
        conn: &StorageConn,
        queue: &str,
        encoding: MessageEncoding,
        ttl_secs: Option<i64>,
    ) -> Self {
        let ttl = ttl_secs.map(|t| t.to_string());
        let mut url = format!("{}/{queue}/messages", conn.queue_endpoint);
        if let Some(t) = &ttl {
            url.push_str("?messagettl=");
            url.push_str(t);
        }
        let url = with_sas(url, conn);
        Self {
            endpoint: client.endpoint(&url),
            path: url_path(&url),
            signer: Signer {
                key: shared_key(conn),
            },
            encoding,
            ttl,
            sas_expiry: conn.sas.as_deref().and_then(sas_expiry),
            what: format!("StorageQueue {queue}"),
        }
    }

    async fn put(&self, endpoint: &Endpoint, text: &str, req: &DeliveryRequest) -> Outcome {
        let body = Bytes::from(format!(
            "<QueueMessage><MessageText>{text}</MessageText></QueueMessage>"
        ));
        let query: Vec<(&str, &str)> = self
            .ttl
            .as_deref()
            .map(|t| ("messagettl", t))
            .into_iter()
            .collect();
        let h = self
            .signer
            .headers("POST", &self.path, &query, body.len(), XML, false);
        super::outcome(endpoint.send(Method::POST, h, body).await, &self.what, req)
    }
}

impl Sink for StorageQueueSink {
    fn send<'a>(&'a self, req: &'a DeliveryRequest) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            let endpoint = match &self.endpoint {
                Ok(e) => e,
                Err(e) => return Outcome::failed(FailureKind::Other(e.to_string())),
            };
            if let Some(expired) = super::expired(self.sas_expiry, &self.what, req) {
                return expired;
            }
            let texts: Vec<String> = req
                .events
                .iter()
                .map(|e| message_text(self.encoding, e))
                .collect();
            // Each event's own outcome: an oversized one is refused alone, the others go.
            let mut each: Vec<Outcome> = Vec::with_capacity(texts.len());
            let mut failed: Option<Outcome> = None;
            for chunk in texts.chunks(PARALLEL_PUTS) {
                if let Some(f) = &failed {
                    // A put of the batch failed: the rest are not tried this attempt.
                    each.extend(chunk.iter().map(|_| f.clone()));
                    continue;
                }
                let puts = chunk.iter().map(|t| async move {
                    if t.len() > MAX_MESSAGE_BYTES {
                        return Outcome::failed(FailureKind::TooLarge(format!(
                            "the event is {} bytes as {} message text; a Storage queue message holds at most {MAX_MESSAGE_BYTES}",
                            t.len(),
                            self.encoding.as_str()
                        )));
                    }
                    self.put(endpoint, t, req).await
                });
                let results = futures_util::future::join_all(puts).await;
                failed = results
                    .iter()
                    .find(|o| {
                        !matches!(
                            o,
                            Outcome::Delivered
                                | Outcome::Failed {
                                    kind: FailureKind::TooLarge(_),
                                    ..
                                }
                        )
                    })
                    .cloned();
                each.extend(results);
            }
            Outcome::per_event(each)
        })
    }
}

/// Dead letters as blobs in one container.
pub struct BlobDeadLetterSink {
    client: HttpClient,
    /// `{blobEndpoint}/{container}`.
    base: String,
    signer: Signer,
    /// The connection string's SAS (appended to each URL) and when it expires.
    sas: Option<(String, Option<u64>)>,
    /// Event Grid's layout and content, or gridlet's own record.
    format: BlobFormat,
    what: String,
}

impl BlobDeadLetterSink {
    /// A sink writing into `container` of `conn`'s account, blobs in `format`.
    pub fn new(
        client: &HttpClient,
        conn: &StorageConn,
        container: &str,
        format: BlobFormat,
    ) -> Self {
        Self {
            client: client.clone(),
            base: format!("{}/{container}", conn.blob_endpoint),
            signer: Signer {
                key: shared_key(conn),
            },
            sas: conn.sas.clone().map(|s| {
                let se = sas_expiry(&s);
                (s, se)
            }),
            format,
            what: format!("StorageBlob {container}"),
        }
    }
}

impl BlobDeadLetterSink {
    /// Put Blob `name` (relative to the container) with `body`.
    async fn put_blob(&self, name: &str, body: Bytes, req: &DeliveryRequest) -> Outcome {
        let url = match &self.sas {
            Some((sas, _)) => format!("{}/{name}?{sas}", self.base),
            None => format!("{}/{name}", self.base),
        };
        let endpoint = match self.client.endpoint(&url) {
            Ok(e) => e,
            Err(e) => return Outcome::failed(FailureKind::Other(e.to_string())),
        };
        let h = self
            .signer
            .headers("PUT", &url_path(&url), &[], body.len(), JSON, true);
        super::outcome(endpoint.send(Method::PUT, h, body).await, &self.what, req)
    }
}

/// Event Grid's blobs for `letters` (dead-letter API JSON): one JSON array per UTC hour of
/// their dead-letter times, named `{SUBSCRIPTION}/{y}/{m}/{d}/{h}/{guid}.json`.
fn event_grid_blobs(subscription: &str, letters: &[Bytes]) -> Vec<(String, Bytes)> {
    let mut hours: Vec<(blobletters::UtcHour, Vec<serde_json::Value>)> = Vec::new();
    for l in letters {
        let v: serde_json::Value = serde_json::from_slice(l).unwrap_or_default();
        let hour = v
            .get("deadLetteredTime")
            .and_then(serde_json::Value::as_str)
            .and_then(blobletters::utc_hour)
            .unwrap_or((1970, 1, 1, 0));
        let e = blobletters::event_grid_letter(&v);
        match hours.iter_mut().find(|(h, _)| *h == hour) {
            Some((_, v)) => v.push(e),
            None => hours.push((hour, vec![e])),
        }
    }
    hours
        .into_iter()
        .map(|(h, events)| {
            (
                blobletters::event_grid_blob_name(subscription, h),
                Bytes::from(serde_json::Value::Array(events).to_string()),
            )
        })
        .collect()
}

/// `{topic}/{subscription}/{time}-{batch}-{n}-{eventId}.json` for a dead letter's JSON, each
/// segment URL-encoded.
pub fn blob_name(topic: &str, subscription: &str, batch: u64, n: usize, letter: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(letter).unwrap_or_default();
    let time: String = v
        .get("deadLetteredTime")
        .and_then(|t| t.as_str())
        .unwrap_or("")
        .chars()
        .filter(|c| c.is_ascii_digit())
        .collect();
    // YYYYMMDDHHMMSSmmm → YYYYMMDDTHHMMSSmmmZ.
    let time = match (time.get(..8), time.get(8..)) {
        (Some(d), Some(t)) if time.len() == 17 => format!("{d}T{t}Z"),
        _ => "00000000T000000000Z".to_string(),
    };
    let id = v.get("eventId").and_then(|t| t.as_str()).unwrap_or("");
    format!(
        "{}/{}/{time}-{batch:020}-{n:04}-{}.json",
        super::sas::encode(topic),
        super::sas::encode(subscription),
        super::sas::encode(id)
    )
}

impl Sink for BlobDeadLetterSink {
    fn send<'a>(&'a self, req: &'a DeliveryRequest) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            if let Some(expired) =
                super::expired(self.sas.as_ref().and_then(|s| s.1), &self.what, req)
            {
                return expired;
            }
            let blobs: Vec<(String, Bytes)> = match self.format {
                BlobFormat::Gridlet => req
                    .events
                    .iter()
                    .enumerate()
                    .map(|(n, letter)| {
                        let name =
                            blob_name(&req.topic, &req.subscription, req.batch_id, n, letter);
                        (name, letter.clone())
                    })
                    .collect(),
                BlobFormat::EventGrid => event_grid_blobs(&req.subscription, &req.events),
            };
            for (name, body) in blobs {
                let o = self.put_blob(&name, body, req).await;
                if o != Outcome::Delivered {
                    return o;
                }
            }
            Outcome::Delivered
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_text_is_base64_or_escaped_text() {
        assert_eq!(
            message_text(MessageEncoding::Base64, b"{\"a\":1}"),
            "eyJhIjoxfQ=="
        );
        assert_eq!(
            message_text(MessageEncoding::Text, b"{\"a\":\"<&>\"}"),
            "{\"a\":\"&lt;&amp;&gt;\"}"
        );
        assert_eq!(
            MessageEncoding::parse("BASE64"),
            Some(MessageEncoding::Base64)
        );
        assert_eq!(MessageEncoding::parse("xml"), None);
    }

    #[test]
    fn blob_names_sort_by_dead_letter_time() {
        let l = |t: &str, id: &str| {
            serde_json::json!({"deadLetteredTime": t, "eventId": id})
                .to_string()
                .into_bytes()
        };
        let a = blob_name("t", "s", 7, 0, &l("2026-11-24T09:59:59.999Z", "e/1"));
        let b = blob_name("t", "s", 3, 0, &l("2026-11-24T10:00:00.000Z", "e2"));
        assert_eq!(
            a,
            "t/s/20261124T095959999Z-00000000000000000007-0000-e%2F1.json"
        );
        assert!(a < b);
    }
}
