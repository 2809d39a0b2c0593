//! Event Hubs and Service Bus (queues and topics): batch send over REST.
//!
//! `POST {scheme}://{namespace}/{entity}/messages?timeout=60&api-version=2014-01` with
//! `Authorization: SharedAccessSignature …` ([`super::sas`]) and
//! `Content-Type: application/vnd.microsoft.servicebus.json`; the body is a JSON array with one
//! message per event (Microsoft's "Send Message Batch" / "Send batch events"):
//!
//! ```json
//! [{"Body": "<the event's JSON>",            (Event Hubs: "[<the event's JSON>]")
//!   "BrokerProperties": {"MessageId": "<stable per event>"},
//!   "UserProperties": {"aeg-subscription-name": "SUB", "aeg-delivery-count": "0",
//!                      "aeg-event-type": "Notification", "aeg-metadata-version": "1",
//!                      "aeg-data-version": "1.0", "aeg-output-event-id": "<event id>"}}]
//! ```
//!
//! One message per event, framed as Event Grid frames it, which Microsoft's Azure SDK decides
//! (its shared `_get_json_content`, used by `EventGridEvent.from_json` / `CloudEvent.from_json`,
//! reads an Event Hubs message body as `json.loads(body)[0]` and a Service Bus one as
//! `json.loads(body)`; the Event Hubs consuming sample does the same): an **Event Hubs**
//! message's body is a JSON array holding the one event, a **Service Bus** message's body is the
//! event object, each exactly as a webhook would get it. The `aeg-*` application properties
//! are the ones Microsoft's
//! "Service Bus queues and topics as event handlers" and "Event Hubs as an event handler"
//! pages list; in a batch they go in `UserProperties` (headers would not reach the messages).
//! `MessageId` (Service Bus only) is stable per event and subscription ([`message_id`]), so a
//! retried batch carries the same ids and a queue with duplicate detection absorbs repeats.
//! Success is 201.
//!
//! A request stays under the destination's batch limit ([`MessagingLimits`]; Service Bus
//! Standard 256 KB, Event Hubs 1 MB, less 8 KiB for headers): a larger delivery batch goes out
//! as several requests. A 413, or Service Bus's 403 "message too large", splits the request in
//! halves; a single message still refused, or one alone over the limit, is
//! [`FailureKind::TooLarge`] for that event only: the batch's other events are delivered
//! ([`Outcome::PerEvent`]). A request that fails otherwise fails its events and every event
//! not yet sent; events already accepted stay delivered.

use super::sas::TokenSource;
use crate::delivery::sink::{DeliveryRequest, FailureKind, Outcome, Sink};
use crate::model::attributes::{AttributeTarget, DeliveryAttribute};
use crate::model::azure::{MessagingAuth, MessagingConn};
use crate::model::sas::expiry as sas_expiry;
use crate::model::topic::EventSchema;
use crate::outbound::http::{Endpoint, HttpClient, HttpError};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use serde_json::{Map, Value};

/// Room left in each request for the HTTP headers and framing (bytes).
pub const HEADROOM_BYTES: usize = 8 * 1024;

static BATCH_CONTENT_TYPE: HeaderValue =
    HeaderValue::from_static("application/vnd.microsoft.servicebus.json");

/// Which service an entity belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// Azure Event Hubs.
    EventHubs,
    /// Azure Service Bus (queue or topic).
    ServiceBus,
}

impl Service {
    /// The batch limit of the service's Standard tier, in KiB (Service Bus: 256 KB per
    /// message and batch; Event Hubs: 1 MB).
    pub fn default_batch_kib(self) -> u64 {
        match self {
            Self::EventHubs => 1024,
            Self::ServiceBus => 256,
        }
    }
}

/// How large a request may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessagingLimits {
    /// Largest request body sent (the batch limit less [`HEADROOM_BYTES`]).
    pub max_request_bytes: usize,
}

impl MessagingLimits {
    /// The limits for a batch limit of `kib` KiB.
    pub fn from_kib(kib: u64) -> Self {
        let bytes = usize::try_from(kib.saturating_mul(1024)).unwrap_or(usize::MAX);
        Self {
            max_request_bytes: bytes.saturating_sub(HEADROOM_BYTES).max(1024),
        }
    }
}

/// One Event Hubs / Service Bus entity.
pub struct MessagingSink {
    endpoint: Result<Endpoint, HttpError>,
    tokens: TokenSource,
    service: Service,
    limits: MessagingLimits,
    /// The subscription's `deliveryAttributeMappings`.
    attributes: Vec<DeliveryAttribute>,
    /// When a ready-made `SharedAccessSignature` expires (Unix seconds).
    token_expiry: Option<u64>,
    /// For logs: `EventHub hub1`.
    what: String,
}

impl MessagingSink {
    /// A sink for `conn`'s entity; `kind` is the endpoint type (for logs).
    pub fn new(
        client: &HttpClient,
        conn: &MessagingConn,
        kind: &str,
        service: Service,
        limits: MessagingLimits,
        attributes: Vec<DeliveryAttribute>,
    ) -> Self {
        Self {
            endpoint: client.endpoint(&conn.messages_url()),
            tokens: TokenSource::new(conn.resource_uri(), conn.auth.clone()),
            service,
            limits,
            attributes,
            token_expiry: match &conn.auth {
                MessagingAuth::Token(t) => sas_expiry(t),
                MessagingAuth::Key { .. } => None,
            },
            what: format!("{kind} {}", conn.entity),
        }
    }

    async fn post(&self, endpoint: &Endpoint, body: Bytes, req: &DeliveryRequest) -> Outcome {
        let mut h = HeaderMap::with_capacity(2);
        h.insert(CONTENT_TYPE, BATCH_CONTENT_TYPE.clone());
        if let Some(t) = self.tokens.header(super::unix_now()) {
            h.insert(AUTHORIZATION, t);
        }
        super::outcome(endpoint.post(h, body).await, &self.what, req)
    }
}

/// The stable `MessageId` of an event delivered for `topic`/`subscription`: 32 hex digits of
/// SHA-256 over the three (the event's own id may repeat across topics, and one event
/// routed to two subscriptions is two deliveries).
pub fn message_id(topic: &str, subscription: &str, event_id: &str) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for part in [topic, subscription, event_id] {
        ctx.update(part.as_bytes());
        ctx.update(b"\n");
    }
    ctx.finish()
        .as_ref()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Event Grid's application properties for event `i` of `req` (`event` parsed, if it is an
/// object), as Microsoft's handler pages list them.
fn aeg_properties(
    req: &DeliveryRequest,
    i: usize,
    event: Option<&Map<String, Value>>,
) -> Map<String, Value> {
    let field = |k: &str| event.and_then(|e| e.get(k)).and_then(Value::as_str);
    let mut p = Map::new();
    p.insert(
        "aeg-subscription-name".into(),
        req.subscription.to_ascii_uppercase().into(),
    );
    // Attempts before this one, as the webhook header counts.
    p.insert(
        "aeg-delivery-count".into(),
        req.attempt_of(i).saturating_sub(1).to_string().into(),
    );
    p.insert("aeg-event-type".into(), "Notification".into());
    let (metadata, data) = match req.schema {
        EventSchema::EventGrid => (field("metadataVersion").or(Some("1")), field("dataVersion")),
        EventSchema::CloudEventV1_0 => (field("specversion"), None),
        EventSchema::Custom => (None, None),
    };
    if let Some(v) = metadata {
        p.insert("aeg-metadata-version".into(), v.into());
    }
    if let Some(v) = data {
        p.insert("aeg-data-version".into(), v.into());
    }
    if let Some(id) = field("id") {
        p.insert("aeg-output-event-id".into(), id.into());
    }
    p
}

/// Each event of `req` as one batch message (see the module documentation), with the
/// subscription's delivery `attributes`: a reserved name a broker property (a dynamic
/// `MessageId` replaces the stable one), any other an application property.
pub fn messages(
    req: &DeliveryRequest,
    service: Service,
    attributes: &[DeliveryAttribute],
) -> Vec<Bytes> {
    let target = match service {
        Service::EventHubs => AttributeTarget::EventHubs,
        Service::ServiceBus => AttributeTarget::ServiceBus,
    };
    req.events
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let parsed = serde_json::from_slice::<Value>(e).ok();
            let obj = parsed.as_ref().and_then(Value::as_object);
            let text = String::from_utf8_lossy(e);
            let body = match service {
                // An array of one event, as Event Grid frames it for Event Hubs.
                Service::EventHubs => format!("[{text}]"),
                Service::ServiceBus => text.into_owned(),
            };
            let mut m = Map::new();
            m.insert("Body".into(), Value::String(body));
            let mut broker = Map::new();
            if service == Service::ServiceBus {
                // An event without an id (custom schema) is identified by its bytes.
                let id = obj.and_then(|o| o.get("id")).and_then(Value::as_str);
                let digest;
                let id = match id {
                    Some(id) => id,
                    None => {
                        digest = message_id("", "", &String::from_utf8_lossy(e));
                        &digest
                    }
                };
                broker.insert(
                    "MessageId".into(),
                    message_id(&req.topic, &req.subscription, id).into(),
                );
            }
            let mut user = aeg_properties(req, i, obj);
            for a in attributes {
                let Some(v) = a.resolve(parsed.as_ref()) else {
                    continue;
                };
                match target.system_name(&a.name) {
                    Some(system) => broker.insert(system.into(), v.into()),
                    None => user.insert(a.name.clone(), v.into()),
                };
            }
            // The trace context, as the Azure SDKs write and read it (`Diagnostic-Id` and
            // `traceparent`, both the W3C traceparent, and `tracestate`).
            if let Some(t) = req.trace.of(i) {
                let tp = t.traceparent();
                user.insert("Diagnostic-Id".into(), tp.clone().into());
                user.insert("traceparent".into(), tp.into());
                if let Some(state) = &t.state {
                    user.insert("tracestate".into(), state.to_string().into());
                }
            }
            if !broker.is_empty() {
                m.insert("BrokerProperties".into(), Value::Object(broker));
            }
            m.insert("UserProperties".into(), Value::Object(user));
            Bytes::from(Value::Object(m).to_string())
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

/// The service's text when `o` says the request was too large: 413, or Service Bus's 403
/// "quota exceeded or message too large" when its text is about size (a 403 about a quota or
/// a claim is not).
fn too_large(o: &Outcome) -> Option<&str> {
    match o {
        Outcome::Failed {
            kind:
                FailureKind::Service {
                    status: 413,
                    message,
                },
            ..
        } => Some(message),
        Outcome::Failed {
            kind:
                FailureKind::Service {
                    status: 403,
                    message,
                },
            ..
        } => {
            let m = message.to_ascii_lowercase();
            (m.contains("size") || m.contains("too large") || m.contains("exceeds the limit"))
                .then_some(message.as_str())
        }
        _ => None,
    }
}

impl Sink for MessagingSink {
    fn send<'a>(&'a self, req: &'a DeliveryRequest) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            let endpoint = match &self.endpoint {
                Ok(e) => e,
                Err(e) => return Outcome::failed(FailureKind::Other(e.to_string())),
            };
            if let Some(expired) = super::expired(self.token_expiry, &self.what, req) {
                return expired;
            }
            let max = self.limits.max_request_bytes;
            let msgs = messages(req, self.service, &self.attributes);
            let mut each: Vec<Option<Outcome>> = vec![None; msgs.len()];
            let mut sendable = Vec::with_capacity(msgs.len());
            for (i, m) in msgs.iter().enumerate() {
                if m.len() + 2 > max {
                    each[i] = Some(Outcome::failed(FailureKind::TooLarge(format!(
                        "the event is {} bytes as a message; {} allows {max} per request",
                        m.len(),
                        self.what
                    ))));
                } else {
                    sendable.push(i);
                }
            }
            let sizes: Vec<Bytes> = sendable.iter().map(|&i| msgs[i].clone()).collect();
            let groups: Vec<Vec<usize>> = groups(&sizes, max)
                .into_iter()
                .map(|r| sendable[r].to_vec())
                .collect();
            super::send_in_groups(
                groups,
                &msgs,
                &mut each,
                |body| self.post(endpoint, body, req),
                too_large,
                |i, text| {
                    Outcome::failed(FailureKind::TooLarge(format!(
                        "{} refused the event's message of {} bytes as too large ({text})",
                        self.what,
                        msgs[i].len()
                    )))
                },
            )
            .await;
            Outcome::per_event(
                each.into_iter()
                    .map(|o| o.unwrap_or(Outcome::Delivered))
                    .collect(),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::sink::OnwardTrace;
    use std::sync::Arc;

    fn req(events: &[&str], attempts: Vec<u32>) -> DeliveryRequest {
        DeliveryRequest {
            topic: Arc::from("t"),
            subscription: Arc::from("sub1"),
            schema: EventSchema::EventGrid,
            events: events.iter().map(|e| Bytes::from(e.to_string())).collect(),
            attempt: 1,
            attempts_each: attempts,
            batch_id: 1,
            trace: Default::default(),
            time_left: Vec::new(),
        }
    }

    #[test]
    fn each_event_is_one_message_with_event_grids_properties() {
        let e = r#"{"id":"1","eventType":"a.b","dataVersion":"2.0","metadataVersion":"1","data":"q\""}"#;
        let m = messages(&req(&[e], vec![3]), Service::ServiceBus, &[]);
        let v: Value = serde_json::from_slice(&m[0]).unwrap();
        assert_eq!(v["Body"], e);
        let p = &v["UserProperties"];
        assert_eq!(p["aeg-subscription-name"], "SUB1");
        assert_eq!(p["aeg-delivery-count"], "2");
        assert_eq!(p["aeg-event-type"], "Notification");
        assert_eq!(p["aeg-metadata-version"], "1");
        assert_eq!(p["aeg-data-version"], "2.0");
        assert_eq!(p["aeg-output-event-id"], "1");
        assert_eq!(
            v["BrokerProperties"]["MessageId"],
            message_id("t", "sub1", "1")
        );
        let hub = messages(&req(&[e], vec![]), Service::EventHubs, &[]);
        let v: Value = serde_json::from_slice(&hub[0]).unwrap();
        assert_eq!(v["Body"], format!("[{e}]"), "an array of one event");
        assert!(
            v.get("BrokerProperties").is_none(),
            "no MessageId on Event Hubs"
        );
        assert_eq!(v["UserProperties"]["aeg-delivery-count"], "0");
    }

    #[test]
    fn delivery_attributes_become_broker_or_application_properties() {
        let attrs = crate::model::attributes::parse(
            &serde_json::json!([
                {"name": "sessionId", "type": "Dynamic", "properties": {"sourceField": "data.s"}},
                {"name": "Label", "properties": {"value": "L"}},
                {"name": "Tenant", "properties": {"value": "t1", "isSecret": true}},
                {"name": "Missing", "type": "Dynamic", "properties": {"sourceField": "data.nope"}}
            ]),
            AttributeTarget::ServiceBus,
        )
        .unwrap();
        let e = r#"{"id":"1","data":{"s":"sess-9"}}"#;
        let m = messages(&req(&[e], vec![]), Service::ServiceBus, &attrs);
        let v: Value = serde_json::from_slice(&m[0]).unwrap();
        assert_eq!(v["BrokerProperties"]["SessionId"], "sess-9");
        assert_eq!(v["BrokerProperties"]["Label"], "L");
        assert_eq!(
            v["BrokerProperties"]["MessageId"],
            message_id("t", "sub1", "1")
        );
        assert_eq!(v["UserProperties"]["Tenant"], "t1");
        assert!(v["UserProperties"].get("Missing").is_none());
        let over = crate::model::attributes::parse(
            &serde_json::json!([{"name": "MessageId", "type": "Dynamic", "properties": {"sourceField": "data.s"}}]),
            AttributeTarget::ServiceBus,
        )
        .unwrap();
        let m = messages(&req(&[e], vec![]), Service::ServiceBus, &over);
        let v: Value = serde_json::from_slice(&m[0]).unwrap();
        assert_eq!(
            v["BrokerProperties"]["MessageId"], "sess-9",
            "a mapping overrides"
        );
    }

    #[test]
    fn message_ids_are_stable_and_distinct() {
        let a = message_id("t", "s", "1");
        assert_eq!(a, message_id("t", "s", "1"));
        assert_eq!(a.len(), 32);
        assert_ne!(a, message_id("t", "s2", "1"));
        assert_ne!(a, message_id("t2", "s", "1"));
        assert_ne!(message_id("a", "bc", "d"), message_id("ab", "c", "d"));
    }

    #[test]
    fn limits_follow_the_tier() {
        assert_eq!(
            MessagingLimits::from_kib(Service::ServiceBus.default_batch_kib()).max_request_bytes,
            256 * 1024 - HEADROOM_BYTES
        );
        assert_eq!(
            MessagingLimits::from_kib(Service::EventHubs.default_batch_kib()).max_request_bytes,
            1024 * 1024 - HEADROOM_BYTES
        );
    }

    #[test]
    fn only_a_size_403_splits() {
        let svc = |status, m: &str| {
            Outcome::failed(FailureKind::Service {
                status,
                message: m.into(),
            })
        };
        assert!(too_large(&svc(413, "x")).is_some());
        assert!(too_large(&svc(
            403,
            "MessageSizeExceeded: the message size exceeds the limit"
        ))
        .is_some());
        assert!(too_large(&svc(403, "QuotaExceeded: the entity is full")).is_none());
        assert!(too_large(&svc(401, "size")).is_none());
    }

    #[test]
    fn a_traced_event_carries_diagnostic_id_and_traceparent_as_the_azure_sdks_do() {
        let t = crate::telemetry::TraceContext::parse(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            Some("v=1"),
        );
        let mut each = req(&[r#"{"id":"1"}"#, r#"{"id":"2"}"#], vec![]);
        each.trace = OnwardTrace::per_event(None, vec![t.clone(), None]);
        let m = messages(&each, Service::ServiceBus, &[]);
        let mut whole = req(&[r#"{"id":"1"}"#], vec![]);
        whole.trace = OnwardTrace::whole(t.clone());
        let all = messages(&whole, Service::ServiceBus, &[]);
        assert_eq!(all[0], m[0], "one context for the whole batch");
        let v: serde_json::Value = serde_json::from_slice(&m[0]).unwrap();
        let p = &v["UserProperties"];
        assert_eq!(
            p["Diagnostic-Id"],
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        );
        assert_eq!(p["traceparent"], p["Diagnostic-Id"]);
        assert_eq!(p["tracestate"], "v=1");
        let v: serde_json::Value = serde_json::from_slice(&m[1]).unwrap();
        assert!(
            v["UserProperties"].get("traceparent").is_none(),
            "no context, no trace properties"
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
