//! Case-insensitive reading of management JSON.
//!
//! The original was Newtonsoft-based: property names match in any case (`inputschema`,
//! `OperatorType`), so [`lower_keys`] lowercases every object key once and [`Obj`] reads typed
//! fields by their lowercase name, producing errors that name the field's path.

use super::Invalid;
use serde_json::{Map, Value};

/// Recursively lowercase every object key (values keep their case).
pub fn lower_keys(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, v)| (k.to_ascii_lowercase(), lower_keys(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(lower_keys).collect()),
        other => other,
    }
}

fn invalid(path: &str, what: &str) -> Invalid {
    Invalid::new("InvalidRequest", format!("{path} {what}"))
}

/// A JSON object with lowercase keys and the path it was found at (for error messages).
#[derive(Clone, Copy)]
pub struct Obj<'a> {
    map: &'a Map<String, Value>,
    path: &'a str,
}

impl<'a> Obj<'a> {
    /// Wrap `v`, which must be an object.
    ///
    /// # Errors
    /// [`Invalid`] when `v` is not an object.
    pub fn new(v: &'a Value, path: &'a str) -> Result<Self, Invalid> {
        match v {
            Value::Object(map) => Ok(Self { map, path }),
            _ => Err(invalid(path, "must be a JSON object")),
        }
    }

    /// The object itself.
    pub fn map(&self) -> &'a Map<String, Value> {
        self.map
    }

    /// The path of this object.
    pub fn path(&self) -> &'a str {
        self.path
    }

    fn field_path(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// The value under `key` (lowercase); JSON `null` counts as absent.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// A string field.
    ///
    /// # Errors
    /// [`Invalid`] when present but not a string.
    pub fn str(&self, key: &str) -> Result<Option<&'a str>, Invalid> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(invalid(&self.field_path(key), "must be a string")),
        }
    }

    /// A required string field.
    ///
    /// # Errors
    /// [`Invalid`] when absent, empty or not a string.
    pub fn req_str(&self, key: &str, display: &str) -> Result<&'a str, Invalid> {
        match self.str(key)? {
            Some(s) if !s.trim().is_empty() => Ok(s),
            _ => Err(invalid(&self.field_path(display), "is required")),
        }
    }

    /// A nested object field.
    ///
    /// # Errors
    /// [`Invalid`] when present but not an object.
    pub fn obj(&self, key: &str, path: &'a str) -> Result<Option<Obj<'a>>, Invalid> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => Obj::new(v, path).map(Some),
        }
    }

    /// A positive integer field (numbers or numeric strings, as twins send them).
    ///
    /// # Errors
    /// [`Invalid`] when present but not a whole number in `min..=max`.
    pub fn int(
        &self,
        key: &str,
        display: &str,
        min: u64,
        max: u64,
    ) -> Result<Option<u64>, Invalid> {
        let n = match self.get(key) {
            None => return Ok(None),
            Some(Value::Number(n)) => n.as_u64(),
            Some(Value::String(s)) => s.trim().parse::<u64>().ok(),
            Some(_) => None,
        };
        match n {
            Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ => Err(invalid(
                &self.field_path(display),
                &format!("must be a whole number from {min} to {max}"),
            )),
        }
    }

    /// A boolean field; accepts `true`/`false` and the strings `"true"`/`"false"` in any case.
    ///
    /// # Errors
    /// [`Invalid`] when present but not a boolean.
    pub fn bool(&self, key: &str, display: &str) -> Result<Option<bool>, Invalid> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => loose_bool(v)
                .map(Some)
                .ok_or_else(|| invalid(&self.field_path(display), "must be true or false")),
        }
    }
}

/// `true`, `false`, or those words as strings in any case.
pub fn loose_bool(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::String(s) if s.trim().eq_ignore_ascii_case("true") => Some(true),
        Value::String(s) if s.trim().eq_ignore_ascii_case("false") => Some(false),
        _ => None,
    }
}

/// Parse a JSON body; an empty body is `{}` (topic PUTs may omit it).
///
/// # Errors
/// [`Invalid`] with the parser's position when the body is not JSON.
pub fn parse_body(body: &[u8]) -> Result<Value, Invalid> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Object(Map::new()));
    }
    serde_json::from_slice(body)
        .map_err(|e| Invalid::new("InvalidJson", format!("the body is not valid JSON: {e}")))
}
