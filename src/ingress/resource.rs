//! The management API's JSON shape of an MQTT connection or route, to and from the fields the
//! settings use (one parser for both: `ConnectionSpec::parse`, `Route::parse`).
//!
//! A resource is `{"properties": {...}}` with the fields by their canonical names; the dotted
//! ones nest (`tls.caFile` is `{"tls": {"caFile": …}}`), numbers and booleans may be JSON
//! numbers and booleans, a route's `enrichments` is an object of strings. What GET adds
//! (`managedBy`, `status`) is ignored in a PUT, so a GET's body can be sent back. Names match
//! case-insensitively; anything else is refused, naming it (a misspelt `topicfilter` would
//! otherwise be silently left out).

use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// Fields by canonical name → value as text.
pub type Fields = BTreeMap<String, String>;

/// What a GET adds, ignored in a PUT.
const OUTPUT_ONLY: &[&str] = &["managedBy", "status"];

/// Fields echoed as JSON numbers, and as booleans.
const NUMBERS: &[&str] = &[
    "qos",
    "keepAliveSeconds",
    "sessionExpirySeconds",
    "receiveMaximum",
    "maxPacketBytes",
];
const BOOLEANS: &[&str] = &["cleanStart"];

/// A body that does not give fields: the JSON path (`properties.tls.caFile`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// JSON path.
    pub path: String,
    /// Why.
    pub message: String,
}

fn bad(path: impl Into<String>, message: impl Into<String>) -> FieldError {
    FieldError {
        path: path.into(),
        message: message.into(),
    }
}

/// The fields a PUT body gives, out of `allowed` (canonical names, dotted ones nested).
///
/// # Errors
/// The body or `properties` is not an object, a property is unknown, or a value is not a
/// string, number or boolean (an `enrichments` object: not strings).
pub fn fields(body: &Value, allowed: &[&'static str]) -> Result<Fields, FieldError> {
    let body = body
        .as_object()
        .ok_or_else(|| bad("(body)", "must be a JSON object"))?;
    let props = match body.get("properties") {
        None | Some(Value::Null) => return Ok(Fields::new()),
        Some(Value::Object(p)) => p,
        Some(_) => return Err(bad("properties", "must be a JSON object")),
    };
    let mut out = Fields::new();
    collect(props, "", allowed, &mut out)?;
    Ok(out)
}

fn collect(
    obj: &Map<String, Value>,
    prefix: &str,
    allowed: &[&'static str],
    out: &mut Fields,
) -> Result<(), FieldError> {
    for (k, v) in obj {
        let path = format!("properties.{prefix}{k}");
        if prefix.is_empty() && OUTPUT_ONLY.iter().any(|o| o.eq_ignore_ascii_case(k)) {
            continue;
        }
        let name = format!("{prefix}{k}");
        let exact = allowed.iter().find(|a| a.eq_ignore_ascii_case(&name));
        let group = format!("{name}.");
        let nests = allowed
            .iter()
            .any(|a| a.len() > group.len() && a[..group.len()].eq_ignore_ascii_case(&group));
        match (exact, v) {
            (Some(&"enrichments"), Value::Object(_)) => {
                out.insert("enrichments".into(), v.to_string());
            }
            (Some(field), _) => {
                if let Some(text) = scalar(v).map_err(|m| bad(&path, m))? {
                    out.insert((*field).to_string(), text);
                }
            }
            (None, Value::Object(inner)) if nests => {
                // The group's canonical spelling, from the allowed name.
                let canonical = allowed
                    .iter()
                    .find(|a| {
                        a.len() > group.len() && a[..group.len()].eq_ignore_ascii_case(&group)
                    })
                    .map_or(group.clone(), |a| a[..group.len()].to_string());
                collect(inner, &canonical, allowed, out)?;
            }
            (None, Value::Null) if nests => {}
            (None, _) => {
                let names: Vec<String> = allowed
                    .iter()
                    .filter(|a| a.starts_with(prefix))
                    .map(|a| a[prefix.len()..].to_string())
                    .collect();
                return Err(bad(
                    path,
                    format!("unknown property; expected one of {}", names.join(", ")),
                ));
            }
        }
    }
    Ok(())
}

/// A JSON value as a field's text (`None`: null, as if not given).
fn scalar(v: &Value) -> Result<Option<String>, String> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        Value::Number(n) => Ok(Some(n.to_string())),
        Value::Bool(b) => Ok(Some(b.to_string())),
        _ => Err("must be a string, a number or a boolean".into()),
    }
}

/// The `properties` a GET shows of `fields`: dotted names nested, numbers and booleans typed,
/// `enrichments` an object, and each of `secrets` that is set as `null`.
pub fn properties(fields: &Fields, secrets: &[&str]) -> Map<String, Value> {
    let mut out = Map::new();
    for (name, text) in fields {
        let value = if secrets.contains(&name.as_str()) {
            Value::Null
        } else if name == "enrichments" {
            match super::route::enrichment_pairs(text) {
                Ok(pairs) => Value::Object(
                    pairs
                        .into_iter()
                        .map(|(k, v)| (k, Value::String(v)))
                        .collect(),
                ),
                Err(_) => Value::String(text.clone()),
            }
        } else if NUMBERS.contains(&name.as_str()) {
            text.trim()
                .parse::<u64>()
                .map_or_else(|_| Value::String(text.clone()), Value::from)
        } else if BOOLEANS.contains(&name.as_str()) {
            match text.trim().to_ascii_lowercase().as_str() {
                "true" => Value::Bool(true),
                "false" => Value::Bool(false),
                _ => Value::String(text.clone()),
            }
        } else {
            Value::String(text.clone())
        };
        match name.split_once('.') {
            Some((group, leaf)) => {
                let g = out
                    .entry(group.to_string())
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(m) = g {
                    m.insert(leaf.to_string(), value);
                }
            }
            None => {
                out.insert(name.clone(), value);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbound::mqtt::connection::{FIELDS, SECRET_FIELDS};
    use serde_json::json;

    #[test]
    fn nested_typed_properties_become_fields_and_back() {
        let body = json!({"properties": {
            "url": "mqtts://b:8883", "TLS": {"cafile": "/ca.pem"}, "keepAliveSeconds": 30,
            "cleanStart": true, "password": "p", "username": "u", "managedBy": "api",
            "status": {"connected": true}, "authentication": null
        }});
        let f = fields(&body, FIELDS).unwrap();
        assert_eq!(
            f,
            [
                ("cleanStart", "true"),
                ("keepAliveSeconds", "30"),
                ("password", "p"),
                ("tls.caFile", "/ca.pem"),
                ("url", "mqtts://b:8883"),
                ("username", "u"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<Fields>()
        );
        assert_eq!(
            Value::Object(properties(&f, SECRET_FIELDS)),
            json!({"url": "mqtts://b:8883", "tls": {"caFile": "/ca.pem"}, "keepAliveSeconds": 30,
                   "cleanStart": true, "password": null, "username": "u"})
        );
    }

    #[test]
    fn unknown_or_malformed_properties_are_named() {
        let err = |body: Value| fields(&body, FIELDS).unwrap_err().path;
        assert_eq!(
            err(json!({"properties": {"topicfilter": "a"}})),
            "properties.topicfilter"
        );
        assert_eq!(
            err(json!({"properties": {"tls": {"caFil": "x"}}})),
            "properties.tls.caFil"
        );
        assert_eq!(
            err(json!({"properties": {"url": ["mqtt://b"]}})),
            "properties.url"
        );
        assert_eq!(err(json!({"properties": 3})), "properties");
        assert_eq!(err(json!([])), "(body)");
    }

    #[test]
    fn route_enrichments_are_an_object() {
        let body = json!({"properties": {"topic": "t", "qos": 0,
            "enrichments": {"site": "a,b"}}});
        let f = fields(&body, crate::ingress::route::FIELDS).unwrap();
        assert_eq!(f["enrichments"], r#"{"site":"a,b"}"#);
        assert_eq!(
            Value::Object(properties(&f, &[])),
            json!({"topic": "t", "qos": 0, "enrichments": {"site": "a,b"}})
        );
    }
}
