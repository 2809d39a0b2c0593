//! Event Hubs and Service Bus (queues and topics): batch send over REST.
//!
//! `POST {scheme}://{namespace}/{entity}/messages?timeout=60&api-version=2014-01` with
//! `Authorization: SharedAccessSignature …` ([`super::sas`]) and
//! `Content-Type: application/vnd.microsoft.servicebus.json`; the body is a JSON array with one
//! message per event, `[{"Body": "<the event's JSON>"}, …]`: each message's body is the event
//! exactly as a webhook would get it inside its array, as a string, so a consumer reads one event
//! per message (the original module's framing is not documented; this keeps event boundaries
//! and needs no custom properties). Success is 201.
//!
//! A request stays under [`MAX_REQUEST_BYTES`] (the Standard tier's 1 MB batch limit, less room
//! for the envelope): a larger delivery batch goes out as several requests. A 413 splits the
//! request in halves; a single message that is still refused, or that alone exceeds the limit,
//! is [`FailureKind::TooLarge`].

use super::sas::TokenSource;
use crate::delivery::http::{Endpoint, HttpClient, HttpError};
use crate::delivery::sink::{DeliveryRequest, FailureKind, Outcome, Sink};
use crate::model::azure::MessagingConn;
use crate::telemetry::TraceContext;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_TYPE};

/// Largest request body sent (1 MB Standard-tier limit less 8 KiB for headers and framing).
pub const MAX_REQUEST_BYTES: usize = 1_000_000 - 8 * 1024;

static BATCH_CONTENT_TYPE: HeaderValue =
    HeaderValue::from_static("application/vnd.microsoft.servicebus.json");

/// One Event Hubs / Service Bus entity.
pub struct MessagingSink {
    endpoint: Result<Endpoint, HttpError>,
    tokens: TokenSource,
    /// For logs: `EventHub hub1`.
    what: String,
}

impl MessagingSink {
    /// A sink for `conn`'s entity; `kind` is the endpoint type (for logs).
    pub fn new(client: &HttpClient, conn: &MessagingConn, kind: &str) -> Self {
        Self {
            endpoint: client.endpoint(&conn.messages_url()),
            tokens: TokenSource::new(conn.resource_uri(), conn.auth.clone()),
            what: format!("{kind} {}", conn.entity),
        }
    }

    async fn post(&self, endpoint: &Endpoint, body: Bytes) -> Outcome {
        let mut h = HeaderMap::with_capacity(2);
        h.insert(CONTENT_TYPE, BATCH_CONTENT_TYPE.clone());
        if let Some(t) = self.tokens.header(super::unix_now()) {
            h.insert(AUTHORIZATION, t);
        }
        super::outcome(endpoint.post(h, body).await, &self.what)
    }
}

/// `{"Body":"<event>"}` for each event; an event with a trace context also gets the
/// application properties the Azure SDKs write and read (`Diagnostic-Id` and `traceparent`,
/// both the W3C `traceparent`, and `tracestate`): `{"Body":…,"UserProperties":{…}}`.
pub fn messages(
    events: &[Bytes],
    traces: &[Option<TraceContext>],
    all: Option<&TraceContext>,
) -> Vec<Bytes> {
    events
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let text = String::from_utf8_lossy(e);
            let body = serde_json::Value::String(text.into_owned());
            let trace = match traces.is_empty() {
                true => all,
                false => traces.get(i).and_then(Option::as_ref),
            };
            match trace {
                None => Bytes::from(format!("{{\"Body\":{body}}}")),
                Some(t) => {
                    let tp = t.traceparent();
                    let mut props = serde_json::Map::new();
                    props.insert("Diagnostic-Id".into(), tp.clone().into());
                    props.insert("traceparent".into(), tp.into());
                    if let Some(state) = &t.state {
                        props.insert("tracestate".into(), state.to_string().into());
                    }
                    let props = serde_json::Value::Object(props);
                    Bytes::from(format!("{{\"Body\":{body},\"UserProperties\":{props}}}"))
                }
            }
        })
        .collect()
}

/// Group messages into request bodies of at most `max` bytes each (in order). A message
/// larger than `max` alone is its own group (the service decides).
pub fn groups(messages: &[Bytes], max: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut size = 2; // []
    for (i, m) in messages.iter().enumerate() {
        let add = m.len() + usize::from(i > start);
        if i > start && size + add > max {
            out.push(start..i);
            start = i;
            size = 2 + m.len();
        } else {
            size += add;
        }
    }
    if start < messages.len() {
        out.push(start..messages.len());
    }
    out
}

impl Sink for MessagingSink {
    fn send<'a>(&'a self, req: &'a DeliveryRequest) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            let endpoint = match &self.endpoint {
                Ok(e) => e,
                Err(e) => return Outcome::failed(FailureKind::Other(e.to_string())),
            };
            let msgs = messages(&req.events, &req.event_traces, req.trace.as_ref());
            if let Some((i, m)) = msgs
                .iter()
                .enumerate()
                .find(|(_, m)| m.len() + 2 > MAX_REQUEST_BYTES)
            {
                return Outcome::failed(FailureKind::TooLarge(format!(
                    "event {} of the batch is {} bytes as a message; {} allows {MAX_REQUEST_BYTES} per request",
                    i + 1,
                    m.len(),
                    self.what
                )));
            }
            // Ranges still to send, in order; a 413 replaces one by its halves.
            let mut todo: Vec<std::ops::Range<usize>> = groups(&msgs, MAX_REQUEST_BYTES);
            todo.reverse();
            while let Some(r) = todo.pop() {
                let part = msgs.get(r.clone()).unwrap_or_default();
                let o = self
                    .post(endpoint, crate::delivery::sink::json_array(part))
                    .await;
                match o {
                    Outcome::Delivered => {}
                    Outcome::Failed {
                        kind:
                            FailureKind::Service {
                                status: 413,
                                message,
                            },
                        ..
                    } => {
                        if r.len() <= 1 {
                            return Outcome::failed(FailureKind::TooLarge(format!(
                                "{} refused a single event's message of {} bytes (HTTP 413: {message})",
                                self.what,
                                part.iter().map(Bytes::len).sum::<usize>()
                            )));
                        }
                        let mid = r.start + r.len() / 2;
                        todo.push(mid..r.end);
                        todo.push(r.start..mid);
                    }
                    failed => return failed,
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
    fn each_event_is_one_message_whose_body_is_the_event_json() {
        let m = messages(
            &[Bytes::from_static(b"{\"id\":\"1\",\"data\":\"q\\\"\"}")],
            &[],
            None,
        );
        let v: serde_json::Value = serde_json::from_slice(&m[0]).unwrap();
        assert_eq!(v["Body"], "{\"id\":\"1\",\"data\":\"q\\\"\"}");
    }

    #[test]
    fn a_traced_event_carries_diagnostic_id_and_traceparent_as_the_azure_sdks_do() {
        let t = TraceContext::parse(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            Some("v=1"),
        );
        let m = messages(
            &[Bytes::from_static(b"{}"), Bytes::from_static(b"[]")],
            &[t.clone(), None],
            None,
        );
        let all = messages(&[Bytes::from_static(b"{}")], &[], t.as_ref());
        assert_eq!(all[0], m[0], "one context for the whole batch");
        let v: serde_json::Value = serde_json::from_slice(&m[0]).unwrap();
        let p = &v["UserProperties"];
        assert_eq!(
            p["Diagnostic-Id"],
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        );
        assert_eq!(p["traceparent"], p["Diagnostic-Id"]);
        assert_eq!(p["tracestate"], "v=1");
        assert_eq!(v["Body"], "{}");
        let v: serde_json::Value = serde_json::from_slice(&m[1]).unwrap();
        assert!(
            v.get("UserProperties").is_none(),
            "no context, no properties"
        );
    }

    #[test]
    fn groups_stay_under_the_limit_in_order() {
        let m: Vec<Bytes> = [10, 10, 10, 25, 3]
            .iter()
            .map(|n| Bytes::from(vec![b'x'; *n]))
            .collect();
        // [a,b] = 2 + 10 + 1 + 10 = 23 ≤ 24; adding c would be 34.
        assert_eq!(groups(&m, 24), vec![0..2, 2..3, 3..4, 4..5]);
        assert_eq!(groups(&m, 1000), vec![0..5]);
        assert!(groups(&[], 10).is_empty());
        for r in groups(&m, 40) {
            let body = crate::delivery::sink::json_array(&m[r.clone()]);
            assert!(body.len() <= 40 || r.len() == 1);
        }
    }
}
