//! From an MQTT message to the event gridlet publishes: the CloudEvent Event Grid namespaces
//! make of a routed MQTT message, or the EventGridSchema equivalent (docs/MQTT.md).
//!
//! The event is written as JSON and handed to the same parser an HTTP publish goes through
//! ([`crate::model::event::parse`]), so what reaches routing is exactly what a publish of that
//! JSON would give, and the same validation applies.

use super::route::Value;
use crate::model::event::{self, IncomingEvent, PublishError, PublishInput};
use crate::model::media;
use crate::model::topic::EventSchema;
use axum::http::{header, HeaderMap, HeaderValue};
use base64::Engine;
use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::{Map, Value as Json};

/// The `type` of every enveloped message (Event Grid namespaces' value).
pub const EVENT_TYPE: &str = "MQTT.EventPublished";

/// An MQTT message as received, whichever protocol version carried it.
#[derive(Debug, Clone, Default)]
pub struct Message {
    /// Topic name.
    pub topic: String,
    /// Payload.
    pub payload: Bytes,
    /// Content type (MQTT 5).
    pub content_type: Option<String>,
    /// Payload format indicator (MQTT 5): 1 = UTF-8 text.
    pub pfi: Option<u8>,
    /// User properties (MQTT 5), in order.
    pub user_properties: Vec<(String, String)>,
    /// Response topic (MQTT 5).
    pub response_topic: Option<String>,
    /// The subscription identifiers the broker matched (MQTT 5).
    pub subscription_ids: Vec<usize>,
}

/// What the event of one message is made with besides the message.
pub struct Envelope<'a> {
    /// The gridlet topic's schema.
    pub schema: EventSchema,
    /// The gridlet topic's name.
    pub topic: &'a str,
    /// `source`: the connection's name.
    pub source: &'a str,
    /// The event id to use.
    pub id: String,
    /// Time of receipt, RFC 3339.
    pub time: &'a str,
    /// The route's enrichments.
    pub enrichments: &'a [(String, Value)],
}

/// How the payload travels in the event.
enum Data<'a> {
    /// As JSON (`data`), the payload's own text.
    Json(&'a RawValue),
    /// As a JSON string (`data`).
    Text(&'a str),
    /// Base64 (`data_base64`, or a base64 string in EventGridSchema's `data`).
    Binary,
}

/// Event Grid namespaces' rule: a payload marked as UTF-8 (payload format indicator 1, or a
/// JSON or text content type) is `data`, as JSON when it parses, else as a string; anything
/// else (MQTT 3.1.1, no marking) is `data_base64`.
fn data(m: &Message) -> Data<'_> {
    let essence = m.content_type.as_deref().map(media::essence);
    let marked = m.pfi == Some(1)
        || essence
            .as_deref()
            .is_some_and(|e| media::is_json(e) || e.starts_with("text/"));
    if !marked {
        return Data::Binary;
    }
    let Ok(text) = std::str::from_utf8(&m.payload) else {
        return Data::Binary;
    };
    match serde_json::from_str::<&RawValue>(text) {
        Ok(raw) => Data::Json(raw),
        Err(_) => Data::Text(text),
    }
}

fn b64(payload: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(payload)
}

/// A CloudEvents attribute name (lower-case letters and digits, at most 20).
fn attribute_name(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 20
        && k.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Put `d` into `obj` as CloudEvents data.
fn put_data(obj: &mut Map<String, Json>, m: &Message) -> Result<(), PublishError> {
    match data(m) {
        Data::Json(raw) => {
            let v: Json = serde_json::from_str(raw.get())
                .map_err(|e| PublishError::Serialize(e.to_string()))?;
            obj.insert("data".into(), v);
        }
        Data::Text(t) => {
            obj.insert("data".into(), Json::String(t.to_string()));
        }
        Data::Binary => {
            obj.insert("data_base64".into(), Json::String(b64(&m.payload)));
        }
    }
    Ok(())
}

fn enrich(obj: &mut Map<String, Json>, m: &Message, env: &Envelope<'_>) {
    for (k, v) in env.enrichments {
        if obj.contains_key(k) {
            continue;
        }
        if let Some(value) = m.enrichment(v) {
            obj.insert(k.clone(), Json::String(value));
        }
    }
}

/// The CloudEvent of `m` (see the module docs and docs/MQTT.md).
fn cloud_event(m: &Message, env: &Envelope<'_>) -> Result<Bytes, PublishError> {
    let essence = m.content_type.as_deref().map(media::essence);
    let mut obj = if essence.as_deref() == Some("application/cloudevents+json") {
        // Structured mode: the payload is the event.
        serde_json::from_slice::<Map<String, Json>>(&m.payload).map_err(|e| {
            PublishError::Invalid(crate::model::Invalid::new(
                "InvalidCloudEvent",
                format!("the message's content type is application/cloudevents+json but its payload is not a JSON object: {e}"),
            ))
        })?
    } else if m.user_properties.iter().any(|(k, _)| k == "specversion") {
        // Binary mode (CloudEvents MQTT binding): attributes are user properties.
        let mut obj = Map::new();
        for (k, v) in &m.user_properties {
            if attribute_name(k) && !obj.contains_key(k) {
                obj.insert(k.clone(), Json::String(v.clone()));
            }
        }
        if let Some(ct) = &m.content_type {
            obj.insert("datacontenttype".into(), Json::String(ct.clone()));
        }
        put_data(&mut obj, m)?;
        obj
    } else {
        let mut obj = Map::new();
        obj.insert("specversion".into(), Json::String("1.0".into()));
        obj.insert("id".into(), Json::String(env.id.clone()));
        obj.insert("source".into(), Json::String(env.source.to_string()));
        obj.insert("type".into(), Json::String(EVENT_TYPE.into()));
        obj.insert("subject".into(), Json::String(m.topic.clone()));
        obj.insert("time".into(), Json::String(env.time.to_string()));
        if let Some(ct) = &m.content_type {
            obj.insert("datacontenttype".into(), Json::String(ct.clone()));
        }
        put_data(&mut obj, m)?;
        obj
    };
    enrich(&mut obj, m, env);
    serde_json::to_vec(&obj)
        .map(Bytes::from)
        .map_err(|e| PublishError::Serialize(e.to_string()))
}

/// The EventGridSchema event of `m`: `subject` the MQTT topic, `eventType`
/// `MQTT.EventPublished`, `data` the payload (JSON, a string, or a base64 string for a payload
/// not marked as UTF-8), `dataVersion` `1.0`.
fn event_grid(m: &Message, env: &Envelope<'_>) -> Result<Bytes, PublishError> {
    let data = match data(m) {
        Data::Json(raw) => {
            serde_json::from_str(raw.get()).map_err(|e| PublishError::Serialize(e.to_string()))?
        }
        Data::Text(t) => Json::String(t.to_string()),
        Data::Binary => Json::String(b64(&m.payload)),
    };
    let ev = serde_json::json!([{
        "id": env.id,
        "subject": m.topic,
        "eventType": EVENT_TYPE,
        "eventTime": env.time,
        "dataVersion": "1.0",
        "data": data,
    }]);
    serde_json::to_vec(&ev)
        .map(Bytes::from)
        .map_err(|e| PublishError::Serialize(e.to_string()))
}

/// The event gridlet publishes for `m`, parsed and validated as an HTTP publish of it would be.
///
/// # Errors
/// The message cannot make a valid event for the topic's schema (a structured CloudEvent that is
/// not one; a CustomEventSchema topic and a payload that is not a JSON object).
pub fn to_event(m: &Message, env: &Envelope<'_>) -> Result<IncomingEvent, PublishError> {
    let (body, content_type) = match env.schema {
        EventSchema::CloudEventV1_0 => (cloud_event(m, env)?, "application/cloudevents+json"),
        EventSchema::EventGrid => (event_grid(m, env)?, "application/json"),
        // The payload is the event, as published over HTTP (one element of the array; a
        // payload that makes more than one is refused by the limit of one event).
        EventSchema::Custom => {
            let mut b = Vec::with_capacity(m.payload.len() + 2);
            b.push(b'[');
            b.extend_from_slice(&m.payload);
            b.push(b']');
            (Bytes::from(b), "application/json")
        }
    };
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    let mut events = event::parse(&PublishInput {
        schema: env.schema,
        topic: env.topic,
        headers: &headers,
        body: &body,
        single_id: None,
        max_events: 1,
    })?;
    events.pop().ok_or_else(|| {
        PublishError::Invalid(crate::model::Invalid::new(
            "InvalidEvent",
            "the message makes no event",
        ))
    })
}

/// A new event id: a random (version 4) UUID.
pub fn new_id() -> String {
    let mut b = [0u8; 16];
    // A failing system RNG leaves zeros; the counter below keeps ids distinct in the process.
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    for (i, x) in n.to_le_bytes().iter().enumerate() {
        b[8 + i] ^= x;
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests;

impl Message {
    /// The value enrichment `v` takes for this message; `None` when the message has none (the
    /// attribute is then left out).
    pub fn enrichment(&self, v: &Value) -> Option<String> {
        match v {
            Value::Static(s) => Some(s.clone()),
            Value::UserProperty(name) => self
                .user_properties
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone()),
            Value::TopicName => Some(self.topic.clone()),
            Value::ContentType => self.content_type.clone(),
            Value::Pfi => self.pfi.map(|p| p.to_string()),
            Value::ResponseTopic => self.response_topic.clone(),
        }
    }
}
