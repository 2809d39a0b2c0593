//! Publish requests: parsing and validating events of the three schemas.
//!
//! A request is accepted whole or rejected whole. Each event keeps its **original bytes**
//! (`RawValue` slices); for EventGridSchema the missing `topic` / `metadataVersion` are spliced in
//! after the opening brace instead of re-serialising, so numbers, key order and whitespace inside
//! the event reach the subscriber exactly as published.
//!
//! Events are validated and routed from **one** borrowed pass over their top-level members
//! (`fast`); the object that advanced filters read is parsed from the event's bytes only when one
//! first needs it. Events the one pass leaves alone (escapes, nulls, keys in another case, invalid
//! events) take the full parse into a `serde_json::Value`, which words every error.

mod binary;
mod keys;
mod onepass;

use super::topic::EventSchema;
use super::{media, Invalid};
use crate::model::filter::{EventView, LazyObject};
use crate::telemetry::TraceContext;
use axum::http::HeaderMap;
use binary::binary_cloud_event;
use bytes::Bytes;
use keys::{repeated_key_under, Repeated};
use onepass::fast;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::sync::Arc;

/// One validated event, ready to route.
#[derive(Debug)]
pub struct IncomingEvent {
    /// The bytes delivered to subscribers (one element of the delivered JSON array).
    pub body: Bytes,
    /// Event id (for logs and dead letters).
    pub id: String,
    /// The event object, used by advanced filters (parsed on first use; dropped after routing).
    object: LazyObject,
    /// Where the view finds subject and type.
    keys: ViewKeys,
    /// The trace context the event carries: its CloudEvents `traceparent` / `tracestate`
    /// attributes (structured mode, or `ce-traceparent` in binary mode); the publish handler
    /// then puts the publish span's context on the others (see [`crate::telemetry`]).
    pub trace: Option<Arc<TraceContext>>,
}

/// Where [`IncomingEvent::view`] finds the subject and the type.
#[derive(Debug)]
enum ViewKeys {
    /// Looked up in the parsed object.
    Object {
        subject: Option<&'static str>,
        event_type: &'static str,
    },
    /// Byte ranges of the string values inside the event's text (the object's source; the
    /// one-pass parse).
    Text {
        subject: Option<(usize, usize)>,
        event_type: Option<(usize, usize)>,
    },
}

impl IncomingEvent {
    /// The view filters evaluate.
    pub fn view(&self) -> EventView<'_> {
        match &self.keys {
            ViewKeys::Object {
                subject,
                event_type,
            } => {
                let m = self.object.get();
                EventView {
                    object: &self.object,
                    subject: subject.and_then(|k| get_ci(m, k)).and_then(Value::as_str),
                    event_type: get_ci(m, event_type).and_then(Value::as_str),
                    lowered: Default::default(),
                }
            }
            ViewKeys::Text {
                subject,
                event_type,
            } => {
                let text = |r: Option<(usize, usize)>| {
                    r.and_then(|(a, b)| self.object.source().get(a..b))
                        .and_then(|b| std::str::from_utf8(b).ok())
                };
                EventView {
                    object: &self.object,
                    subject: text(*subject),
                    event_type: text(*event_type),
                    lowered: Default::default(),
                }
            }
        }
    }

    /// An event validated and parsed the old way (its object is already parsed).
    fn parsed(
        body: Bytes,
        id: String,
        object: Map<String, Value>,
        event_type: &'static str,
    ) -> Self {
        IncomingEvent {
            body,
            id,
            object: LazyObject::parsed(object),
            keys: ViewKeys::Object {
                subject: Some("subject"),
                event_type,
            },
            trace: None,
        }
    }
}

fn get_ci<'a>(m: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    m.get(key)
        .or_else(|| {
            m.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(key))
                .map(|(_, v)| v)
        })
        .filter(|v| !v.is_null())
}

/// Why a publish request is rejected (nothing of it is accepted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// The request or one of its events is invalid.
    #[error(transparent)]
    Invalid(#[from] Invalid),
    /// A content type the topic's schema does not take.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// An accepted event could not be written back as JSON (a bug, not the client's fault).
    #[error("an event could not be serialised: {0}")]
    Serialize(String),
}

impl PublishError {
    /// The client's fault (everything but [`PublishError::Serialize`]).
    pub fn is_client_error(&self) -> bool {
        !matches!(self, Self::Serialize(_))
    }
}

fn bad(code: &'static str, msg: impl Into<String>) -> PublishError {
    PublishError::Invalid(Invalid::new(code, msg))
}

fn unserializable(e: serde_json::Error) -> PublishError {
    PublishError::Serialize(e.to_string())
}

/// What the publish handler hands over.
pub struct PublishInput<'a> {
    /// The topic's schema.
    pub schema: EventSchema,
    /// Topic name as stored.
    pub topic: &'a str,
    /// Request headers (content type, CloudEvents binary-mode `ce-*`).
    pub headers: &'a HeaderMap,
    /// The body.
    pub body: &'a Bytes,
    /// `Some(id)` on the single-event route `/events/{id}`.
    pub single_id: Option<&'a str>,
    /// Limit on events per request.
    pub max_events: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Media {
    Json,
    CloudEvent,
    CloudEventBatch,
    Other,
}

fn media(headers: &HeaderMap) -> (Media, Option<String>) {
    let Some(ct) = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return (Media::Json, None);
    };
    let m = match media::essence(ct).as_str() {
        "application/cloudevents+json" => Media::CloudEvent,
        "application/cloudevents-batch+json" => Media::CloudEventBatch,
        e if media::is_json(e) => Media::Json,
        _ => Media::Other,
    };
    (m, Some(ct.to_string()))
}

/// Parse and validate a publish request.
///
/// # Errors
/// [`PublishError::Invalid`] naming the first bad event ([`PublishError::UnsupportedMediaType`]
/// for a content type the schema does not take); nothing is accepted.
pub fn parse(input: &PublishInput<'_>) -> Result<Vec<IncomingEvent>, PublishError> {
    let (media, content_type) = media(input.headers);
    // CloudEvents binary mode: attributes in ce-* headers (structured media types win).
    let binary = input.schema == EventSchema::CloudEventV1_0
        && (media == Media::Other
            || (media == Media::Json && input.headers.contains_key("ce-specversion")));
    let mut events = parse_events(input, media, content_type, binary)?;
    if input.schema == EventSchema::CloudEventV1_0 {
        for ev in &mut events {
            ev.trace = carried_trace(&ev.body).map(Arc::new);
        }
    }
    Ok(events)
}

/// The CloudEvents distributed-tracing extension's `traceparent` / `tracestate` attributes of
/// one event (top level only; an invalid `traceparent` is ignored, as W3C says). The event's
/// bytes are searched first, so an event without one costs one `memmem`.
fn carried_trace(body: &[u8]) -> Option<TraceContext> {
    #[derive(serde::Deserialize)]
    struct Attrs {
        traceparent: Option<String>,
        tracestate: Option<String>,
    }
    memchr::memmem::find(body, b"\"traceparent\"")?;
    let a: Attrs = serde_json::from_slice(body).ok()?;
    TraceContext::parse(&a.traceparent?, a.tracestate.as_deref())
}

fn parse_events(
    input: &PublishInput<'_>,
    media: Media,
    content_type: Option<String>,
    binary: bool,
) -> Result<Vec<IncomingEvent>, PublishError> {
    if binary {
        return binary_cloud_event(input, content_type.as_deref()).map(|e| vec![e]);
    }
    if media == Media::Other {
        return Err(PublishError::UnsupportedMediaType(format!(
            "Content-Type '{}' is not supported; use application/json{}",
            content_type.unwrap_or_default(),
            if input.schema == EventSchema::CloudEventV1_0 {
                ", application/cloudevents+json or application/cloudevents-batch+json"
            } else {
                ""
            }
        )));
    }
    let elements = elements(input, media)?;
    elements
        .into_iter()
        .enumerate()
        .map(|(i, raw)| {
            // One pass over the event's top-level fields; anything the fast path does not
            // accept as is (an error, a null, a key in other case, ...) takes the full parse,
            // which decides and words every error.
            if let Some(ev) = fast(input, raw) {
                return Ok(ev);
            }
            match input.schema {
                EventSchema::EventGrid => event_grid(raw, i, input.topic),
                EventSchema::Custom => custom(raw, i),
                EventSchema::CloudEventV1_0 => cloud_event(raw, i),
            }
        })
        .collect()
}

/// The request's events as raw JSON: an array (a single object on `/events/{eventId}` and for
/// `application/cloudevents+json`), within the limit of events per request.
fn elements<'a>(input: &PublishInput<'a>, media: Media) -> Result<Vec<&'a RawValue>, PublishError> {
    let elements: Vec<&RawValue> = match first_byte(input.body) {
        Some(b'[') => {
            if media == Media::CloudEvent {
                return Err(bad(
                    "InvalidEvents",
                    "application/cloudevents+json carries one event object, not an array",
                ));
            }
            serde_json::from_slice(input.body).map_err(|e| {
                bad(
                    "InvalidJson",
                    format!("the body is not a valid JSON array: {e}"),
                )
            })?
        }
        Some(b'{') => {
            let single_ok = input.single_id.is_some() || media == Media::CloudEvent;
            if !single_ok {
                return Err(bad(
                    "InvalidEvents",
                    "the body must be a JSON array of events (a single object is accepted on /events/{eventId})",
                ));
            }
            vec![serde_json::from_slice(input.body)
                .map_err(|e| bad("InvalidJson", format!("the body is not valid JSON: {e}")))?]
        }
        _ => {
            return Err(bad(
                "InvalidJson",
                "the body must be a JSON array of event objects",
            ))
        }
    };
    if media == Media::CloudEventBatch && first_byte(input.body) != Some(b'[') {
        return Err(bad(
            "InvalidEvents",
            "application/cloudevents-batch+json must be an array",
        ));
    }
    if elements.len() > input.max_events {
        return Err(bad(
            "TooManyEvents",
            format!(
                "{} events in one request; the limit is {}",
                elements.len(),
                input.max_events
            ),
        ));
    }
    Ok(elements)
}

fn first_byte(b: &[u8]) -> Option<u8> {
    b.iter().copied().find(|c| !c.is_ascii_whitespace())
}

fn object_of(raw: &RawValue, i: usize) -> Result<Map<String, Value>, PublishError> {
    match serde_json::from_str::<Value>(raw.get()) {
        Ok(Value::Object(m)) => unique_keys(raw, i).map(|()| m),
        Ok(_) => Err(bad(
            "InvalidEvents",
            format!("event [{i}] must be a JSON object"),
        )),
        Err(e) => Err(bad(
            "InvalidJson",
            format!("event [{i}] is not valid JSON: {e}"),
        )),
    }
}

/// Refuse an event whose keys repeat, exactly or in another case (`eventType` and `EVENTTYPE`,
/// or `\u0053ubject` and `subject`), at the top level or in any object under it that a filter
/// or a delivery attribute can name (`data.make` and `data.MAKE`; objects reached through
/// members, not inside arrays): filters read one, while receivers whose JSON readers match keys
/// case-insensitively and keep the last (Newtonsoft, ASP.NET Core's web defaults, Go's
/// `encoding/json`) would read the other. Case is folded as those readers fold it (Unicode
/// simple folding: `ſ` is `s`, the Kelvin sign `k`). Linear: one set of folded keys per object.
fn unique_keys(raw: &RawValue, i: usize) -> Result<(), PublishError> {
    match repeated_key(raw.get()) {
        Ok(None) => Ok(()),
        Ok(Some(r)) if !r.nested => Err(bad(
            "InvalidEvents",
            format!(
                "event [{i}]: duplicate top-level key '{}' (also given as '{}'); keys must be unique in any letter case",
                r.later, r.earlier
            ),
        )),
        Ok(Some(r)) => Err(bad(
            "InvalidEvents",
            format!(
                "event [{i}]: duplicate key '{}' (also given as '{}'); keys must be unique in any letter case, at every level",
                r.later, r.earlier
            ),
        )),
        Err(e) => Err(bad(
            "InvalidJson",
            format!("event [{i}] is not valid JSON: {e}"),
        )),
    }
}

fn repeated_key(text: &str) -> Result<Option<Repeated>, serde_json::Error> {
    repeated_key_under(text, "")
}

fn required_string<'a>(
    m: &'a Map<String, Value>,
    key: &str,
    i: usize,
) -> Result<&'a str, PublishError> {
    match get_ci(m, key) {
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(bad(
            "InvalidEvents",
            format!("event [{i}]: '{key}' must be a string"),
        )),
        None => Err(bad(
            "InvalidEvents",
            format!("event [{i}]: '{key}' is required"),
        )),
    }
}

fn event_grid(raw: &RawValue, i: usize, topic: &str) -> Result<IncomingEvent, PublishError> {
    let mut m = object_of(raw, i)?;
    let id = required_string(&m, "id", i)?.to_string();
    for key in ["subject", "eventType", "eventTime", "dataVersion"] {
        required_string(&m, key, i)?;
    }
    let topic_present = match get_ci(&m, "topic") {
        None => false,
        Some(Value::String(t)) if t.eq_ignore_ascii_case(topic) => true,
        Some(other) => {
            return Err(bad(
                "InvalidEvents",
                format!(
                "event [{i}]: topic {other} does not match the topic '{topic}' it is published to"
            ),
            ))
        }
    };
    let mv_present = match get_ci(&m, "metadataVersion") {
        None => false,
        Some(Value::String(v)) if v == "1" => true,
        Some(other) => {
            return Err(bad(
                "InvalidEvents",
                format!("event [{i}]: metadataVersion {other} must be \"1\""),
            ))
        }
    };
    let body = if topic_present && mv_present {
        Bytes::copy_from_slice(raw.get().as_bytes())
    } else if has_null_key(&m, "topic") || has_null_key(&m, "metadataVersion") {
        // `"topic": null` counts as absent; splicing would duplicate the key, so re-serialise.
        m.retain(|k, v| {
            !(v.is_null()
                && (k.eq_ignore_ascii_case("topic") || k.eq_ignore_ascii_case("metadataVersion")))
        });
        if !topic_present {
            m.insert("topic".into(), Value::String(topic.to_string()));
        }
        if !mv_present {
            m.insert("metadataVersion".into(), Value::String("1".into()));
        }
        Bytes::from(serde_json::to_vec(&m).map_err(unserializable)?)
    } else {
        splice(raw.get(), (!topic_present).then_some(topic), !mv_present).map_err(unserializable)?
    };
    Ok(IncomingEvent::parsed(body, id, m, "eventType"))
}

fn has_null_key(m: &Map<String, Value>, key: &str) -> bool {
    m.iter()
        .any(|(k, v)| v.is_null() && k.eq_ignore_ascii_case(key))
}

/// Insert `"topic":<topic>` and/or `"metadataVersion":"1"` right after the object's opening
/// brace.
fn splice(raw: &str, topic: Option<&str>, metadata_version: bool) -> serde_json::Result<Bytes> {
    const MV: &[u8] = br#""metadataVersion":"1""#;
    let t = raw.trim_start();
    let rest = t.strip_prefix('{').unwrap_or(t);
    let sep: &[u8] = if rest.trim_start().starts_with('}') {
        b""
    } else {
        b","
    };
    let mut out = Vec::with_capacity(raw.len() + topic.map_or(0, |t| t.len() + 12) + MV.len() + 2);
    out.push(b'{');
    if let Some(topic) = topic {
        out.extend_from_slice(br#""topic":"#);
        serde_json::to_writer(&mut out, topic)?;
        if metadata_version {
            out.push(b',');
        }
    }
    if metadata_version {
        out.extend_from_slice(MV);
    }
    out.extend_from_slice(sep);
    out.extend_from_slice(rest.as_bytes());
    Ok(Bytes::from(out))
}

fn custom(raw: &RawValue, i: usize) -> Result<IncomingEvent, PublishError> {
    let m = object_of(raw, i)?;
    let id = get_ci(&m, "id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    Ok(IncomingEvent::parsed(
        Bytes::copy_from_slice(raw.get().as_bytes()),
        id,
        m,
        "eventType",
    ))
}

fn validate_cloud_event(m: &Map<String, Value>, i: usize) -> Result<String, PublishError> {
    let id = required_string(m, "id", i)?.to_string();
    required_string(m, "source", i)?;
    required_string(m, "type", i)?;
    match required_string(m, "specversion", i)? {
        "1.0" => {}
        v => {
            return Err(bad(
                "InvalidEvents",
                format!("event [{i}]: specversion '{v}' must be \"1.0\""),
            ))
        }
    }
    if id.is_empty() {
        return Err(bad(
            "InvalidEvents",
            format!("event [{i}]: 'id' must not be empty"),
        ));
    }
    Ok(id)
}

fn cloud_event(raw: &RawValue, i: usize) -> Result<IncomingEvent, PublishError> {
    let m = object_of(raw, i)?;
    let id = validate_cloud_event(&m, i)?;
    Ok(IncomingEvent::parsed(
        Bytes::copy_from_slice(raw.get().as_bytes()),
        id,
        m,
        "type",
    ))
}

#[cfg(test)]
mod tests;
