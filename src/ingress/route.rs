//! A route: messages matching an MQTT topic filter on one connection go to one gridlet topic,
//! with the enrichments the route adds. Parsing checks what can be checked without the broker:
//! the filter's syntax, the QoS, the enrichments (Event Grid namespaces' rules).

use std::fmt;

/// Most enrichments per route (Event Grid namespaces' limit).
pub const MAX_ENRICHMENTS: usize = 20;
/// Longest enrichment key.
const MAX_KEY_LEN: usize = 20;
/// Longest enrichment value.
const MAX_VALUE_LEN: usize = 128;
/// Attribute names an enrichment cannot take.
const RESERVED: &[&str] = &[
    "specversion",
    "id",
    "time",
    "type",
    "source",
    "subject",
    "datacontenttype",
    "dataschema",
    "data",
    "data_base64",
];

/// A route's field that does not parse: which field (`topicFilter`, `qos`, ...) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteError {
    /// The field.
    pub field: &'static str,
    /// Why.
    pub message: String,
}

impl fmt::Display for RouteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

fn bad(field: &'static str, message: impl Into<String>) -> RouteError {
    RouteError {
        field,
        message: message.into(),
    }
}

/// Where an enrichment's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A fixed string.
    Static(String),
    /// `${mqtt.message.userProperties.x}`: the first user property named `x`.
    UserProperty(String),
    /// `${mqtt.message.topicName}`.
    TopicName,
    /// `${mqtt.message.contentType}`.
    ContentType,
    /// `${mqtt.message.pfi}`: the payload format indicator (`0` or `1`).
    Pfi,
    /// `${mqtt.message.responseTopic}`.
    ResponseTopic,
}

impl Value {
    fn parse(v: &str) -> Result<Self, String> {
        let Some(inner) = v.strip_prefix("${").and_then(|r| r.strip_suffix('}')) else {
            return Ok(Self::Static(v.to_string()));
        };
        Ok(match inner {
            "mqtt.message.topicName" => Self::TopicName,
            "mqtt.message.contentType" => Self::ContentType,
            "mqtt.message.pfi" => Self::Pfi,
            "mqtt.message.responseTopic" => Self::ResponseTopic,
            _ => match inner.strip_prefix("mqtt.message.userProperties.") {
                Some(name) if !name.is_empty() => Self::UserProperty(name.to_string()),
                _ => {
                    return Err(format!(
                        "`{v}` is not a supported value: use a static value, \
                         ${{mqtt.message.userProperties.x}}, ${{mqtt.message.topicName}}, \
                         ${{mqtt.message.contentType}}, ${{mqtt.message.pfi}} or \
                         ${{mqtt.message.responseTopic}} (gridlet does not know the publishing \
                         client, so ${{client.*}} values are not available)"
                    ))
                }
            },
        })
    }
}

/// Every field [`Route::parse`] reads.
pub const FIELDS: &[&str] = &["connection", "topicFilter", "topic", "qos", "enrichments"];

/// The `key`/`value` pairs of enrichments as given: `key=value,key=value` (settings), or a JSON
/// object of strings (the management API; a value may then hold a comma).
///
/// # Errors
/// An item that is not `key=value`, or a JSON object with a value that is not a string.
pub fn enrichment_pairs(text: &str) -> Result<Vec<(String, String)>, RouteError> {
    let field = "enrichments";
    if text.trim_start().starts_with('{') {
        let map: serde_json::Map<String, serde_json::Value> = serde_json::from_str(text)
            .map_err(|e| bad(field, format!("not a JSON object: {e}")))?;
        return map
            .into_iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => Ok((k, s)),
                _ => Err(bad(field, format!("the value of `{k}` must be a string"))),
            })
            .collect();
    }
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|item| {
            item.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .ok_or_else(|| bad(field, format!("`{item}` is not key=value")))
        })
        .collect()
}

/// Parse enrichments: `key=value,key=value`, or a JSON object of strings
/// ([`enrichment_pairs`]).
///
/// # Errors
/// A key or value outside the rules (see the module docs), named in the message.
pub fn parse_enrichments(text: &str) -> Result<Vec<(String, Value)>, RouteError> {
    let field = "enrichments";
    let mut out: Vec<(String, Value)> = Vec::new();
    for (k, v) in enrichment_pairs(text)? {
        let (k, v) = (k.as_str(), v.as_str());
        if k.is_empty()
            || k.len() > MAX_KEY_LEN
            || !k
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        {
            return Err(bad(
                field,
                format!("key `{k}`: 1 to {MAX_KEY_LEN} lower-case letters and digits"),
            ));
        }
        if RESERVED.contains(&k) || k.starts_with("azsp") {
            return Err(bad(field, format!("key `{k}` is reserved")));
        }
        if out.iter().any(|(o, _)| o == k) {
            return Err(bad(field, format!("key `{k}` is given twice")));
        }
        if v.chars().count() > MAX_VALUE_LEN {
            return Err(bad(
                field,
                format!("the value of `{k}` is longer than {MAX_VALUE_LEN} characters"),
            ));
        }
        let value = Value::parse(v).map_err(|e| bad(field, format!("key `{k}`: {e}")))?;
        out.push((k.to_string(), value));
    }
    if out.len() > MAX_ENRICHMENTS {
        return Err(bad(
            field,
            format!("at most {MAX_ENRICHMENTS} enrichments per route"),
        ));
    }
    Ok(out)
}

/// Check an MQTT topic filter (MQTT 5 §4.7): non-empty UTF-8 of at most 65,535 bytes, no NUL,
/// `#` only as the whole last level, `+` only as a whole level; `$share/{group}/{filter}` for
/// a shared subscription.
///
/// # Errors
/// The rule broken.
pub fn check_filter(filter: &str) -> Result<(), String> {
    if filter.is_empty() {
        return Err("empty".into());
    }
    if filter.len() > 65_535 {
        return Err("longer than 65535 bytes".into());
    }
    if filter.contains('\0') {
        return Err("contains NUL".into());
    }
    let inner = match filter.strip_prefix("$share/") {
        Some(rest) => {
            let (group, f) = rest
                .split_once('/')
                .ok_or("a shared subscription is $share/{group}/{filter}")?;
            if group.is_empty() || group.contains(['+', '#']) {
                return Err("the share group name must be non-empty, without + or #".into());
            }
            if f.is_empty() {
                return Err("a shared subscription is $share/{group}/{filter}".into());
            }
            f
        }
        None => filter,
    };
    let levels: Vec<&str> = inner.split('/').collect();
    for (i, level) in levels.iter().enumerate() {
        if level.contains('#') && (*level != "#" || i + 1 != levels.len()) {
            return Err("`#` must be the whole last level".into());
        }
        if level.contains('+') && *level != "+" {
            return Err("`+` must be a whole level".into());
        }
    }
    Ok(())
}

/// Whether topic name `topic` matches `filter` (a checked filter; a shared subscription's
/// `$share/{group}/` prefix is ignored). Wildcards at the first level do not match topics
/// starting with `$` (MQTT 5 §4.7.2).
pub fn matches(filter: &str, topic: &str) -> bool {
    let filter = filter
        .strip_prefix("$share/")
        .and_then(|r| r.split_once('/').map(|(_, f)| f))
        .unwrap_or(filter);
    if topic.starts_with('$') && filter.starts_with(['+', '#']) {
        return false;
    }
    let mut f = filter.split('/');
    let mut t = topic.split('/');
    loop {
        match (f.next(), t.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// Subscription QoS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qos {
    /// At most once.
    AtMostOnce,
    /// At least once.
    AtLeastOnce,
}

/// One route, parsed.
#[derive(Debug, Clone)]
pub struct Route {
    /// Its name.
    pub name: String,
    /// The connection it subscribes on.
    pub connection: String,
    /// The MQTT topic filter.
    pub filter: String,
    /// The gridlet topic.
    pub topic: String,
    /// Subscription QoS.
    pub qos: Qos,
    /// Attributes added to each event.
    pub enrichments: Vec<(String, Value)>,
}

impl Route {
    /// Parse route `name`; `get(field)` answers a field's value as given.
    ///
    /// # Errors
    /// The first field that is missing or malformed.
    pub fn parse(
        name: &str,
        get: &dyn Fn(&'static str) -> Option<String>,
    ) -> Result<Self, RouteError> {
        let required = |f: &'static str| get(f).ok_or_else(|| bad(f, "required"));
        let connection = required("connection")?.to_ascii_lowercase();
        let filter = required("topicFilter")?;
        check_filter(&filter).map_err(|e| bad("topicFilter", format!("`{filter}`: {e}")))?;
        let topic = required("topic")?;
        let qos = match get("qos").as_deref() {
            None | Some("1") => Qos::AtLeastOnce,
            Some("0") => Qos::AtMostOnce,
            Some(other) => return Err(bad("qos", format!("`{other}`: expected 0 or 1"))),
        };
        let enrichments = parse_enrichments(&get("enrichments").unwrap_or_default())?;
        Ok(Self {
            name: name.to_string(),
            connection,
            filter,
            topic,
            qos,
            enrichments,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_follow_the_mqtt_rules() {
        for ok in [
            "a/b",
            "a/+/c",
            "#",
            "a/#",
            "+",
            "+/+",
            "$share/g/a/#",
            "/a",
            "a//b",
        ] {
            assert!(check_filter(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "a/#/b",
            "a#",
            "a/b+",
            "a/+b/c",
            "$share/g",
            "$share//a",
            "$share/g/",
            "a\0b",
        ] {
            assert!(check_filter(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn topics_match_filters() {
        assert!(matches("a/+/c", "a/b/c"));
        assert!(!matches("a/+/c", "a/b/d"));
        assert!(matches("a/#", "a"));
        assert!(matches("a/#", "a/b/c"));
        assert!(matches("#", "x/y"));
        assert!(!matches("#", "$SYS/x"));
        assert!(!matches("+/x", "$SYS/x"));
        assert!(matches("$SYS/#", "$SYS/x"));
        assert!(matches("$share/g/plant/+", "plant/a"));
        assert!(!matches("a/b", "a/b/c"));
        assert!(matches("a//b", "a//b"));
    }

    #[test]
    fn enrichments_follow_event_grids_rules() {
        let e = parse_enrichments(
            "site=plant4, line=${mqtt.message.userProperties.line},t=${mqtt.message.topicName}",
        )
        .unwrap();
        assert_eq!(e.len(), 3);
        assert_eq!(
            e[1],
            ("line".to_string(), Value::UserProperty("line".into()))
        );
        for bad in [
            "Site=x",
            "site-name=x",
            "id=x",
            "data_base64=x",
            "azspx=x",
            "a=1,a=2",
            "abcdefghijklmnopqrstu=x",
            "a=${client.authenticationName}",
            "a=${mqtt.message.userProperties.}",
            "novalue",
        ] {
            let err = parse_enrichments(bad).expect_err(bad);
            assert_eq!(err.field, "enrichments");
        }
        let json = parse_enrichments(r#"{"site":"a,b","t":"${mqtt.message.topicName}"}"#).unwrap();
        assert_eq!(
            json,
            vec![
                ("site".to_string(), Value::Static("a,b".into())),
                ("t".to_string(), Value::TopicName)
            ]
        );
        assert!(parse_enrichments(r#"{"a":1}"#).is_err());
        assert!(parse_enrichments(r#"{"Site":"x"}"#).is_err());
        let long = format!("a={}", "x".repeat(129));
        assert!(parse_enrichments(&long).is_err());
        let many: Vec<String> = (0..21).map(|i| format!("k{i}=v")).collect();
        assert!(parse_enrichments(&many.join(",")).is_err());
    }

    #[test]
    fn routes_name_the_bad_field() {
        let parse = |fields: &[(&'static str, &str)]| {
            let f: Vec<(&'static str, String)> =
                fields.iter().map(|(k, v)| (*k, v.to_string())).collect();
            Route::parse("r", &|k| {
                f.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
            })
        };
        let ok = parse(&[
            ("connection", "Plant"),
            ("topicFilter", "a/#"),
            ("topic", "t"),
        ])
        .unwrap();
        assert_eq!(
            (ok.connection.as_str(), ok.qos),
            ("plant", Qos::AtLeastOnce)
        );
        assert_eq!(
            parse(&[("topicFilter", "a"), ("topic", "t")])
                .unwrap_err()
                .field,
            "connection"
        );
        assert_eq!(
            parse(&[
                ("connection", "p"),
                ("topicFilter", "a/#/b"),
                ("topic", "t")
            ])
            .unwrap_err()
            .field,
            "topicFilter"
        );
        assert_eq!(
            parse(&[
                ("connection", "p"),
                ("topicFilter", "a"),
                ("topic", "t"),
                ("qos", "2")
            ])
            .unwrap_err()
            .field,
            "qos"
        );
    }
}
