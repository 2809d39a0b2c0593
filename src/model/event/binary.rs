//! CloudEvents HTTP binary mode: the attributes arrive in `ce-*` headers, the body is `data`.
//!
//! The delivered event is a structured CloudEvent built from them: `datacontenttype` is the
//! request's Content-Type when there is one, and the body becomes `data` (JSON value or text) or
//! `data_base64` (bytes), by the rules in [`binary_data`].

use super::{bad, unserializable, validate_cloud_event, IncomingEvent, PublishError, PublishInput};
use crate::model::media;
use bytes::Bytes;
use serde_json::{Map, Value};

/// CloudEvents HTTP binary mode: attributes in `ce-*` headers, the body is `data`.
pub(super) fn binary_cloud_event(
    input: &PublishInput<'_>,
    content_type: Option<&str>,
) -> Result<IncomingEvent, PublishError> {
    if !input.headers.contains_key("ce-specversion") {
        return Err(PublishError::UnsupportedMediaType(
            "a CloudEvents topic takes application/cloudevents+json, application/cloudevents-batch+json, application/json, or binary mode (ce-* headers)".into(),
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
    if !input.body.is_empty() {
        let (name, data) = binary_data(content_type, input.body)?;
        m.insert(name.into(), data);
    }
    let body = Bytes::from(serde_json::to_vec(&m).map_err(unserializable)?);
    Ok(IncomingEvent::parsed(body, id, m, "type"))
}

/// The `data` (or `data_base64`) member for a binary-mode body. A JSON content type must hold
/// JSON (`InvalidJson` otherwise). No content type at all means application/json (the CloudEvents JSON
/// format's rule, and what the CloudEvents SDKs send for a dict payload without
/// `datacontenttype`): the JSON value when the body parses, else the bytes as `data_base64`.
/// Any other type: UTF-8 text as a string, else `data_base64`.
fn binary_data(
    content_type: Option<&str>,
    body: &[u8],
) -> Result<(&'static str, Value), PublishError> {
    use base64::Engine;
    let base64 = || Value::String(base64::engine::general_purpose::STANDARD.encode(body));
    let Some(ct) = content_type else {
        return Ok(match serde_json::from_slice::<Value>(body) {
            Ok(data) => {
                unique_data_keys(body)?;
                ("data", data)
            }
            Err(_) => ("data_base64", base64()),
        });
    };
    if media::is_json(&media::essence(ct)) {
        let data = serde_json::from_slice(body).map_err(|e| {
            bad(
                "InvalidJson",
                format!("the binary-mode body is not valid JSON: {e}"),
            )
        })?;
        unique_data_keys(body)?;
        return Ok(("data", data));
    }
    Ok(match std::str::from_utf8(body) {
        Ok(text) => ("data", Value::String(text.to_string())),
        Err(_) => ("data_base64", base64()),
    })
}

/// Refuse a JSON body (it becomes `data`) whose keys repeat in any case within one object
/// (`super::unique_keys`, for structured events).
fn unique_data_keys(body: &[u8]) -> Result<(), PublishError> {
    let text = std::str::from_utf8(body).unwrap_or_default();
    match super::repeated_key_under(text, "data") {
        Ok(Some(r)) => Err(bad(
            "InvalidEvents",
            format!(
                "event [0]: duplicate key '{}' (also given as '{}'); keys must be unique in any letter case, at every level",
                r.later, r.earlier
            ),
        )),
        _ => Ok(()),
    }
}
