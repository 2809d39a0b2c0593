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
mod onepass;

use super::topic::EventSchema;
use super::Invalid;
use crate::model::filter::{EventView, LazyObject};
use axum::http::HeaderMap;
use binary::binary_cloud_event;
use bytes::Bytes;
use onepass::fast;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

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
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let m = match essence.as_str() {
        "application/cloudevents+json" => Media::CloudEvent,
        "application/cloudevents-batch+json" => Media::CloudEventBatch,
        "application/json" | "text/json" => Media::Json,
        e if e.ends_with("+json") => Media::Json,
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

fn first_byte(b: &[u8]) -> Option<u8> {
    b.iter().copied().find(|c| !c.is_ascii_whitespace())
}

fn object_of(raw: &RawValue, i: usize) -> Result<Map<String, Value>, PublishError> {
    match serde_json::from_str::<Value>(raw.get()) {
        Ok(Value::Object(m)) => Ok(m),
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
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn run(
        schema: EventSchema,
        ct: Option<&str>,
        body: &str,
    ) -> Result<Vec<IncomingEvent>, PublishError> {
        let mut headers = HeaderMap::new();
        if let Some(ct) = ct {
            headers.insert("content-type", HeaderValue::from_str(ct).unwrap());
        }
        let body = Bytes::from(body.to_string());
        parse(&PublishInput {
            schema,
            topic: "t1",
            headers: &headers,
            body: &body,
            single_id: None,
            max_events: 100,
        })
    }

    const EV: &str = r#"{"id":"1","subject":"s","eventType":"e","eventTime":"not-a-date","dataVersion":"1.0","data":{"n":1.50}}"#;

    #[test]
    fn event_grid_gets_topic_and_metadata_version_spliced_in() {
        let evs = run(
            EventSchema::EventGrid,
            Some("application/json"),
            &format!("[{EV}]"),
        )
        .unwrap();
        let s = std::str::from_utf8(&evs[0].body).unwrap();
        assert!(
            s.starts_with(r#"{"topic":"t1","metadataVersion":"1","id":"1""#),
            "{s}"
        );
        assert!(s.contains("1.50"), "numbers keep their text: {s}");
        let v: Value = serde_json::from_slice(&evs[0].body).unwrap();
        assert_eq!(v["topic"], "t1");
    }

    #[test]
    fn event_grid_required_fields() {
        for missing in ["id", "subject", "eventType", "eventTime", "dataVersion"] {
            let mut v: Value = serde_json::from_str(EV).unwrap();
            v.as_object_mut().unwrap().remove(missing);
            let e = run(EventSchema::EventGrid, None, &format!("[{v}]")).unwrap_err();
            assert!(matches!(e, PublishError::Invalid(_)), "{missing}");
        }
        let wrong_topic = EV.replacen('{', r#"{"topic":"t2","#, 1);
        assert!(run(EventSchema::EventGrid, None, &format!("[{wrong_topic}]")).is_err());
        let mv2 = EV.replacen('{', r#"{"metadataVersion":"2","#, 1);
        assert!(run(EventSchema::EventGrid, None, &format!("[{mv2}]")).is_err());
        let mv1 = EV.replacen('{', r#"{"metadataVersion":"1","#, 1);
        assert!(run(EventSchema::EventGrid, None, &format!("[{mv1}]")).is_ok());
        assert!(
            run(EventSchema::EventGrid, None, EV).is_err(),
            "top-level object on /events"
        );
        assert!(run(EventSchema::EventGrid, None, "not json").is_err());
        assert!(run(EventSchema::EventGrid, None, "[]").unwrap().is_empty());
    }

    #[test]
    fn custom_schema_is_forwarded_untouched() {
        let evs = run(EventSchema::Custom, None, r#"[ {"a" : 1.0e2} ]"#).unwrap();
        assert_eq!(&evs[0].body[..], br#"{"a" : 1.0e2}"#);
        assert!(run(EventSchema::Custom, None, "[1]").is_err());
        assert!(run(EventSchema::Custom, None, r#"{"a":1}"#).is_err());
    }

    #[test]
    fn cloud_events_structured_and_binary() {
        let ce = r#"{"id":"1","source":"/s","type":"t","specversion":"1.0","data":{"x":1}}"#;
        assert!(run(
            EventSchema::CloudEventV1_0,
            Some("application/cloudevents-batch+json"),
            &format!("[{ce}]")
        )
        .is_ok());
        assert!(run(
            EventSchema::CloudEventV1_0,
            Some("application/cloudevents+json; charset=utf-8"),
            ce
        )
        .is_ok());
        let no_source = r#"{"id":"1","type":"t","specversion":"1.0"}"#;
        assert!(run(
            EventSchema::CloudEventV1_0,
            Some("application/cloudevents+json"),
            no_source
        )
        .is_err());
        let mut headers = HeaderMap::new();
        for (k, v) in [
            ("ce-id", "9"),
            ("ce-source", "/src"),
            ("ce-type", "x.y"),
            ("ce-specversion", "1.0"),
            ("content-type", "application/json"),
        ] {
            headers.insert(k, HeaderValue::from_static(v));
        }
        let body = Bytes::from_static(br#"{"temp":21}"#);
        let evs = parse(&PublishInput {
            schema: EventSchema::CloudEventV1_0,
            topic: "t",
            headers: &headers,
            body: &body,
            single_id: None,
            max_events: 10,
        })
        .unwrap();
        let v: Value = serde_json::from_slice(&evs[0].body).unwrap();
        assert_eq!(v["id"], "9");
        assert_eq!(v["data"]["temp"], 21);
    }

    proptest::proptest! {
        /// Any bytes, any schema: a clean result or a 4xx, never a panic.
        #[test]
        fn parse_never_panics(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400), ce in proptest::prelude::any::<bool>()) {
            let body = Bytes::from(body);
            let mut headers = HeaderMap::new();
            if ce {
                headers.insert("ce-specversion", HeaderValue::from_static("1.0"));
            }
            for schema in [EventSchema::EventGrid, EventSchema::Custom, EventSchema::CloudEventV1_0] {
                if let Err(e) = parse(&PublishInput { schema, topic: "t", headers: &headers, body: &body, single_id: Some("x"), max_events: 50 }) {
                    proptest::prop_assert!(e.is_client_error());
                }
            }
        }
    }

    /// The old two-pass path for one element, for comparison with [`fast`].
    fn full(schema: EventSchema, raw: &RawValue) -> Result<IncomingEvent, PublishError> {
        match schema {
            EventSchema::EventGrid => event_grid(raw, 0, "t1"),
            EventSchema::Custom => custom(raw, 0),
            EventSchema::CloudEventV1_0 => cloud_event(raw, 0),
        }
    }

    /// Whenever the one-pass path accepts an element, the full parse accepts it with the same
    /// body, id, subject, type and filter object. Returns whether the fast path took it.
    fn check_same(schema: EventSchema, text: &str) -> bool {
        let body = Bytes::from(format!("[{text}]"));
        let Ok(raws) = serde_json::from_slice::<Vec<&RawValue>>(&body) else {
            return false;
        };
        let headers = HeaderMap::new();
        let input = PublishInput {
            schema,
            topic: "t1",
            headers: &headers,
            body: &body,
            single_id: None,
            max_events: 10,
        };
        let Some(f) = fast(&input, raws[0]) else {
            return false;
        };
        let s = full(schema, raws[0]).unwrap_or_else(|e| panic!("{schema:?} {text}: {e:?}"));
        assert_eq!(f.body, s.body, "{schema:?} {text}");
        assert_eq!(f.id, s.id, "{schema:?} {text}");
        let (fv, sv) = (f.view(), s.view());
        assert_eq!(fv.subject, sv.subject, "{schema:?} {text}");
        assert_eq!(fv.event_type, sv.event_type, "{schema:?} {text}");
        assert_eq!(fv.object.get(), sv.object.get(), "{schema:?} {text}");
        true
    }

    const SCHEMAS: [EventSchema; 3] = [
        EventSchema::EventGrid,
        EventSchema::Custom,
        EventSchema::CloudEventV1_0,
    ];

    #[test]
    fn one_pass_matches_the_full_parse() {
        assert!(check_same(EventSchema::EventGrid, EV));
        let both = EV.replacen('{', r#"{"topic":"T1","metadataVersion":"1","#, 1);
        assert!(check_same(EventSchema::EventGrid, &both));
        let ce = r#"{"id":"1","source":"/s","type":"t","specversion":"1.0","subject":"x","data":{"x":1}}"#;
        assert!(check_same(EventSchema::CloudEventV1_0, ce));
        assert!(check_same(
            EventSchema::Custom,
            r#"{"a" : 1.0e2, "subject": "s"}"#
        ));
        assert!(check_same(EventSchema::Custom, "{ }"));
        assert!(check_same(
            EventSchema::EventGrid,
            &EV.replacen('{', "{ ", 1)
        ));
        let spaced = r#" { "id" : "1" , "x" : [ "]" , { "y" : "}," } ] , "subject" : "s" , "eventType" : "e" , "eventTime" : "t" , "dataVersion" : "1" , "n" : -1.5e3 } "#;
        assert!(check_same(EventSchema::EventGrid, spaced));
        assert!(check_same(EventSchema::Custom, r#"{"n":1,"subject":"s"}"#));
        assert!(check_same(
            EventSchema::Custom,
            r#"{"b":true,"eventType":"e","z":null}"#
        ));
        // Left to the full parse: escapes, deep nesting, nulls, other case, duplicates, errors.
        let deep = EV.replace(
            r#"{"n":1.50}"#,
            &format!("{}{}", "[".repeat(130), "]".repeat(130)),
        );
        for (schema, text) in [
            (EventSchema::EventGrid, EV.replace(r#""s""#, r#""\u00e9""#)),
            (EventSchema::EventGrid, deep.clone()),
            (EventSchema::Custom, deep),
            (
                EventSchema::EventGrid,
                EV.replacen('{', r#"{"topic":null,"#, 1),
            ),
            (EventSchema::EventGrid, EV.replace("eventType", "EventType")),
            (EventSchema::EventGrid, EV.replacen('{', r#"{"id":"0","#, 1)),
            (
                EventSchema::EventGrid,
                EV.replacen('{', r#"{"topic":"t2","#, 1),
            ),
            (EventSchema::Custom, r#"{"id":1}"#.to_string()),
            (EventSchema::Custom, "[1]".to_string()),
            (EventSchema::CloudEventV1_0, ce.replace("1.0", "0.3")),
            (
                EventSchema::CloudEventV1_0,
                ce.replace(r#""id":"1""#, r#""id":"""#),
            ),
        ] {
            assert!(!check_same(schema, &text), "{schema:?} {text}");
        }
    }

    proptest::proptest! {
        /// Events built from the keys the schemas read (in several cases, repeated) and values
        /// of every kind: the one-pass path never disagrees with the full parse.
        #[test]
        fn one_pass_never_disagrees(base in 0usize..3, ws in proptest::prelude::any::<bool>(), members in proptest::collection::vec((0usize..20, 0usize..16), 0..6)) {
            const KEYS: [&str; 20] = ["id", "ID", "subject", "Subject", "eventType", "eventtype",
                "eventTime", "dataVersion", "topic", "Topic", "metadataVersion", "metadataversion",
                "type", "source", "specversion", "SpecVersion", "data", "x", "Id", "TYPE"];
            const VALUES: [&str; 16] = [r#"" } , ] { : ""#, r#"{ "a" : [ "}" , 2, { } ] }"#,r#""1""#, r#""1.0""#, r#""t1""#, r#""T1""#, r#""""#,
                r#""s\u00e9""#, "null", "1", "1.50", r#"{"n":[1,{"m":null}]}"#, "[]", "true",
                r#""2026-01-01T00:00:00Z""#, r#""/a/b""#];
            // Start from a valid event of some schema (or nothing), then add members.
            const BASES: [&str; 3] = ["",
                r#""id":"1","subject":"s","eventType":"e","eventTime":"t","dataVersion":"1.0""#,
                r#""id":"1","source":"/s","type":"t","specversion":"1.0""#];
            let (colon, comma, brace) = if ws { (" :\t", "\r\n ,  ", " ") } else { (":", ",", "") };
            let text = format!("{brace}{{{brace}{}{brace}}}{brace}", std::iter::once(BASES[base].to_string())
                .filter(|b| !b.is_empty())
                .chain(members.iter().map(|&(k, v)| format!(r#""{}"{colon}{}"#, KEYS[k], VALUES[v])))
                .collect::<Vec<_>>()
                .join(comma));
            for schema in SCHEMAS {
                check_same(schema, &text);
            }
        }
    }

    #[test]
    fn limits_and_media_types() {
        let many = format!("[{}]", vec!["{}"; 101].join(","));
        assert!(matches!(
            run(EventSchema::Custom, None, &many).unwrap_err(),
            PublishError::Invalid(e) if e.code == "TooManyEvents"
        ));
        assert!(matches!(
            run(EventSchema::Custom, Some("text/plain"), "[{}]").unwrap_err(),
            PublishError::UnsupportedMediaType(_)
        ));
        let deep = format!("[{}{}]", "[".repeat(200), "]".repeat(200));
        assert!(run(EventSchema::Custom, None, &deep).is_err());
    }
}
