//! Publish requests: parsing and validating events of the three schemas.
//!
//! A request is accepted whole or rejected whole. Each event keeps its **original bytes**
//! (`RawValue` slices); for EventGridSchema the missing `topic` / `metadataVersion` are spliced in
//! after the opening brace instead of re-serialising, so numbers, key order and whitespace inside
//! the event reach the subscriber exactly as published.

use super::topic::EventSchema;
use crate::error::ApiError;
use crate::filter::EventView;
use axum::http::HeaderMap;
use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// One validated event, ready to route.
#[derive(Debug)]
pub struct IncomingEvent {
    /// The bytes delivered to subscribers (one element of the delivered JSON array).
    pub body: Bytes,
    /// Event id (for logs and dead letters).
    pub id: String,
    /// The parsed object, used by filters (dropped after routing).
    pub object: Map<String, Value>,
    subject_key: Option<&'static str>,
    type_key: &'static str,
}

impl IncomingEvent {
    /// The view filters evaluate.
    pub fn view(&self) -> EventView<'_> {
        EventView {
            object: &self.object,
            subject: self
                .subject_key
                .and_then(|k| get_ci(&self.object, k))
                .and_then(Value::as_str),
            event_type: get_ci(&self.object, self.type_key).and_then(Value::as_str),
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

fn bad(detail: &'static str, msg: impl Into<String>) -> ApiError {
    ApiError::bad_request(detail, msg.into())
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
/// 400 (or 415 for an unsupported content type) naming the first bad event; nothing is accepted.
pub fn parse(input: &PublishInput<'_>) -> Result<Vec<IncomingEvent>, ApiError> {
    let (media, content_type) = media(input.headers);
    // CloudEvents binary mode: attributes in ce-* headers (structured media types win).
    let binary = input.schema == EventSchema::CloudEventV1_0
        && (media == Media::Other
            || (media == Media::Json && input.headers.contains_key("ce-specversion")));
    if binary {
        return binary_cloud_event(input, content_type.as_deref()).map(|e| vec![e]);
    }
    if media == Media::Other {
        return Err(ApiError::unsupported_media_type(format!(
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
        .map(|(i, raw)| match input.schema {
            EventSchema::EventGrid => event_grid(raw, i, input.topic),
            EventSchema::Custom => custom(raw, i),
            EventSchema::CloudEventV1_0 => cloud_event(raw, i),
        })
        .collect()
}

fn first_byte(b: &[u8]) -> Option<u8> {
    b.iter().copied().find(|c| !c.is_ascii_whitespace())
}

fn object_of(raw: &RawValue, i: usize) -> Result<Map<String, Value>, ApiError> {
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
) -> Result<&'a str, ApiError> {
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

fn event_grid(raw: &RawValue, i: usize, topic: &str) -> Result<IncomingEvent, ApiError> {
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
        Bytes::from(serde_json::to_vec(&m).map_err(|e| ApiError::internal(&e))?)
    } else {
        let mut fields = Vec::with_capacity(2);
        if !topic_present {
            fields.push(format!("\"topic\":{}", Value::String(topic.to_string())));
        }
        if !mv_present {
            fields.push("\"metadataVersion\":\"1\"".to_string());
        }
        splice(raw.get(), &fields.join(","))
    };
    Ok(IncomingEvent {
        body,
        id,
        object: m,
        subject_key: Some("subject"),
        type_key: "eventType",
    })
}

fn has_null_key(m: &Map<String, Value>, key: &str) -> bool {
    m.iter()
        .any(|(k, v)| v.is_null() && k.eq_ignore_ascii_case(key))
}

/// Insert `fields` (already `"k":v,"k2":v2`) right after the object's opening brace.
fn splice(raw: &str, fields: &str) -> Bytes {
    let t = raw.trim_start();
    let rest = t.strip_prefix('{').unwrap_or(t);
    let sep = if rest.trim_start().starts_with('}') {
        ""
    } else {
        ","
    };
    let mut out = String::with_capacity(raw.len() + fields.len() + 2);
    out.push('{');
    out.push_str(fields);
    out.push_str(sep);
    out.push_str(rest);
    Bytes::from(out)
}

fn custom(raw: &RawValue, i: usize) -> Result<IncomingEvent, ApiError> {
    let m = object_of(raw, i)?;
    let id = get_ci(&m, "id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    Ok(IncomingEvent {
        body: Bytes::copy_from_slice(raw.get().as_bytes()),
        id,
        object: m,
        subject_key: Some("subject"),
        type_key: "eventType",
    })
}

fn validate_cloud_event(m: &Map<String, Value>, i: usize) -> Result<String, ApiError> {
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

fn cloud_event(raw: &RawValue, i: usize) -> Result<IncomingEvent, ApiError> {
    let m = object_of(raw, i)?;
    let id = validate_cloud_event(&m, i)?;
    Ok(IncomingEvent {
        body: Bytes::copy_from_slice(raw.get().as_bytes()),
        id,
        object: m,
        subject_key: Some("subject"),
        type_key: "type",
    })
}

/// CloudEvents HTTP binary mode: attributes in `ce-*` headers, the body is `data`.
fn binary_cloud_event(
    input: &PublishInput<'_>,
    content_type: Option<&str>,
) -> Result<IncomingEvent, ApiError> {
    if !input.headers.contains_key("ce-specversion") {
        return Err(ApiError::unsupported_media_type(
            "a CloudEvents topic takes application/cloudevents+json, application/cloudevents-batch+json, application/json, or binary mode (ce-* headers)",
        ));
    }
    let mut m = Map::new();
    for (name, value) in input.headers {
        if let Some(attr) = name.as_str().strip_prefix("ce-") {
            let v = value
                .to_str()
                .map_err(|_| bad("InvalidEvents", format!("header {name} is not valid text")))?;
            m.insert(attr.to_string(), Value::String(v.to_string()));
        }
    }
    if !m.contains_key("id") {
        if let Some(id) = input.single_id {
            m.insert("id".into(), Value::String(id.to_string()));
        }
    }
    let id = validate_cloud_event(&m, 0)?;
    if let Some(ct) = content_type {
        m.insert("datacontenttype".into(), Value::String(ct.to_string()));
    }
    let is_json = content_type
        .map(|c| {
            let e = c
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            e == "application/json" || e == "text/json" || e.ends_with("+json")
        })
        .unwrap_or(false);
    if !input.body.is_empty() {
        if is_json {
            let data: Value = serde_json::from_slice(input.body).map_err(|e| {
                bad(
                    "InvalidJson",
                    format!("the binary-mode body is not valid JSON: {e}"),
                )
            })?;
            m.insert("data".into(), data);
        } else if let Ok(text) = std::str::from_utf8(input.body) {
            m.insert("data".into(), Value::String(text.to_string()));
        } else {
            use base64::Engine;
            m.insert(
                "data_base64".into(),
                Value::String(base64::engine::general_purpose::STANDARD.encode(input.body)),
            );
        }
    }
    let body = Bytes::from(serde_json::to_vec(&m).map_err(|e| ApiError::internal(&e))?);
    Ok(IncomingEvent {
        body,
        id,
        object: m,
        subject_key: Some("subject"),
        type_key: "type",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn run(
        schema: EventSchema,
        ct: Option<&str>,
        body: &str,
    ) -> Result<Vec<IncomingEvent>, ApiError> {
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
            assert_eq!(e.status, 400, "{missing}");
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
                    proptest::prop_assert!(e.status.is_client_error());
                }
            }
        }
    }

    #[test]
    fn limits_and_media_types() {
        let many = format!("[{}]", vec!["{}"; 101].join(","));
        assert_eq!(
            run(EventSchema::Custom, None, &many).unwrap_err().detail,
            "TooManyEvents"
        );
        assert_eq!(
            run(EventSchema::Custom, Some("text/plain"), "[{}]")
                .unwrap_err()
                .status,
            415
        );
        let deep = format!("[{}{}]", "[".repeat(200), "]".repeat(200));
        assert!(run(EventSchema::Custom, None, &deep).is_err());
    }
}
