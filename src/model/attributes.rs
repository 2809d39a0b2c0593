//! `deliveryAttributeMappings`: Event Grid's "custom delivery properties", static or taken from
//! each event (Microsoft's "Custom delivery properties" page):
//!
//! ```json
//! [{"name": "X-Tenant", "type": "Static", "properties": {"value": "a", "isSecret": false}},
//!  {"name": "Channel", "type": "Dynamic", "properties": {"sourceField": "data.system"}}]
//! ```
//!
//! At most [`MAX_ATTRIBUTES`]; a static value at most [`MAX_VALUE_BYTES`]; a dynamic one is
//! the event's value at `sourceField` (a dotted path, `$.` allowed in front) when it is a
//! string, number or boolean, and left out otherwise. Where they go depends on the
//! destination ([`AttributeTarget`]): HTTP headers for webhooks; for Service Bus and Event
//! Hubs, the reserved names Event Grid documents become the message's broker properties and
//! every other name an application property; for MQTT, MQTT 5 user properties. Secret values
//! (`isSecret`) are masked in GET, the twin and logs by the destination type's secret list.

use super::json::Obj;
use super::Invalid;
use serde_json::{json, Value};

/// Most mappings per subscription (Event Grid's limit).
pub const MAX_ATTRIBUTES: usize = 10;
/// Longest static value (Event Grid's limit: 4,096 bytes).
pub const MAX_VALUE_BYTES: usize = 4096;

/// Where a destination puts its delivery attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttributeTarget {
    /// HTTP headers (WebHook, Event Grid).
    Headers,
    /// Service Bus message properties.
    ServiceBus,
    /// Event Hubs message properties.
    EventHubs,
    /// MQTT 5 user properties (any UTF-8 name and value, no NUL).
    MqttUserProperties,
}

/// The Service Bus broker properties a mapping may set, as Event Grid documents them
/// (`MessageId` dynamic only; `SessionId` and `MessageId` not both).
pub const SERVICE_BUS_SYSTEM: [&str; 9] = [
    "MessageId",
    "PartitionKey",
    "SessionId",
    "CorrelationId",
    "Label",
    "ReplyTo",
    "ReplyToSessionId",
    "To",
    "ViaPartitionKey",
];

/// The Event Hubs broker property a mapping may set.
pub const EVENT_HUBS_SYSTEM: [&str; 1] = ["PartitionKey"];

impl AttributeTarget {
    /// The broker property `name` names (any case), in its canonical spelling; `None`: an
    /// application property (or a header).
    pub fn system_name(self, name: &str) -> Option<&'static str> {
        let list: &[&'static str] = match self {
            Self::Headers | Self::MqttUserProperties => &[],
            Self::ServiceBus => &SERVICE_BUS_SYSTEM,
            Self::EventHubs => &EVENT_HUBS_SYSTEM,
        };
        list.iter().copied().find(|s| s.eq_ignore_ascii_case(name))
    }
}

/// Where a value comes from (in a metadata record: `{"static": …}` or `{"dynamic": …}`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum AttributeValue {
    /// This value.
    Static(String),
    /// The event's value at this path (dot-separated segments).
    Dynamic(String),
}

/// One mapping (also its metadata record).
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryAttribute {
    /// Name as given (a header or property name).
    pub name: String,
    /// Its value.
    pub value: AttributeValue,
    /// A static value that is a secret (masked, never logged).
    pub is_secret: bool,
}

impl std::fmt::Debug for DeliveryAttribute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.value {
            AttributeValue::Static(_) if self.is_secret => write!(f, "{}: ***", self.name),
            AttributeValue::Static(v) => write!(f, "{}: {v}", self.name),
            AttributeValue::Dynamic(p) => write!(f, "{}: <{p}>", self.name),
        }
    }
}

impl DeliveryAttribute {
    /// The value for one event (`None` for a dynamic one the event does not have as a
    /// string, number or boolean).
    pub fn resolve(&self, event: Option<&Value>) -> Option<String> {
        match &self.value {
            AttributeValue::Static(v) => Some(v.clone()),
            AttributeValue::Dynamic(path) => {
                let mut v = event?;
                for seg in path.split('.') {
                    v = v.get(seg)?;
                }
                match v {
                    Value::String(s) => Some(s.clone()),
                    Value::Number(n) => Some(n.to_string()),
                    Value::Bool(b) => Some(b.to_string()),
                    _ => None,
                }
            }
        }
    }

    /// Whether it takes its value from the event.
    pub fn is_dynamic(&self) -> bool {
        matches!(self.value, AttributeValue::Dynamic(_))
    }

    /// The Event Grid shape, secret values in clear (the destination masks them).
    pub fn to_json(&self) -> Value {
        match &self.value {
            AttributeValue::Static(v) => json!({"name": self.name, "type": "Static",
                "properties": {"value": v, "isSecret": self.is_secret}}),
            AttributeValue::Dynamic(p) => json!({"name": self.name, "type": "Dynamic",
                "properties": {"sourceField": p}}),
        }
    }
}

fn bad(msg: impl Into<String>) -> Invalid {
    Invalid::new(
        "InvalidDeliveryAttributeMapping",
        format!("deliveryAttributeMappings: {}", msg.into()),
    )
}

/// Header names gridlet sets itself.
fn reserved_header(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    matches!(
        n.as_str(),
        "content-type" | "content-length" | "host" | "transfer-encoding" | "connection"
    ) || n.starts_with("aeg-")
        || n.starts_with("webhook-")
}

/// Parse the mappings for `target`.
///
/// # Errors
/// [`Invalid`] (`InvalidDeliveryAttributeMapping`) naming the mapping and the rule.
pub fn parse(v: &Value, target: AttributeTarget) -> Result<Vec<DeliveryAttribute>, Invalid> {
    // Management JSON is read in any case (the subscription parser has lowercased it already).
    let v = super::json::lower_keys(v.clone());
    let Value::Array(items) = &v else {
        return Err(bad("must be an array"));
    };
    if items.len() > MAX_ATTRIBUTES {
        return Err(bad(format!("at most {MAX_ATTRIBUTES} mappings")));
    }
    let mut out: Vec<DeliveryAttribute> = Vec::with_capacity(items.len());
    for item in items {
        let a = parse_one(item, target)?;
        if out.iter().any(|b| b.name.eq_ignore_ascii_case(&a.name)) {
            return Err(bad(format!("'{}' is mapped twice", a.name)));
        }
        out.push(a);
    }
    let has = |n: &str| out.iter().any(|a| a.name.eq_ignore_ascii_case(n));
    if target == AttributeTarget::ServiceBus && has("SessionId") && has("MessageId") {
        return Err(bad("set either SessionId or MessageId, not both"));
    }
    Ok(out)
}

fn parse_one(item: &Value, target: AttributeTarget) -> Result<DeliveryAttribute, Invalid> {
    let o = Obj::new(item, "deliveryAttributeMappings[]")?;
    let name = o.req_str("name", "name")?.trim().to_string();
    let kind = o.str("type")?.unwrap_or("Static");
    let p = o
        .obj("properties", "deliveryAttributeMappings[].properties")?
        .ok_or_else(|| bad(format!("'{name}' needs properties")))?;
    let value = if kind.eq_ignore_ascii_case("static") {
        let v = p
            .str("value")?
            .ok_or_else(|| bad(format!("'{name}': properties.value is required")))?;
        if v.len() > MAX_VALUE_BYTES {
            return Err(bad(format!(
                "the value of '{name}' is longer than {MAX_VALUE_BYTES} bytes"
            )));
        }
        AttributeValue::Static(v.to_string())
    } else if kind.eq_ignore_ascii_case("dynamic") {
        let f = p
            .str("sourcefield")?
            .ok_or_else(|| bad(format!("'{name}': properties.sourceField is required")))?;
        let path = f.trim().strip_prefix("$.").unwrap_or(f.trim());
        if path.is_empty() || path.split('.').any(str::is_empty) {
            return Err(bad(format!(
                "'{name}': sourceField '{f}' is not a dotted path such as data.key1"
            )));
        }
        AttributeValue::Dynamic(path.to_string())
    } else {
        return Err(bad(format!("'{name}': type must be Static or Dynamic")));
    };
    let is_secret = p.bool("issecret", "isSecret")?.unwrap_or(false);
    if is_secret && matches!(value, AttributeValue::Dynamic(_)) {
        return Err(bad(format!(
            "'{name}': isSecret applies to Static mappings only"
        )));
    }
    match target {
        AttributeTarget::Headers => {
            if hyper::header::HeaderName::from_bytes(name.as_bytes()).is_err()
                || reserved_header(&name)
            {
                return Err(bad(format!("'{name}' is not an allowed header name")));
            }
            if let AttributeValue::Static(v) = &value {
                if hyper::header::HeaderValue::from_str(v).is_err() {
                    return Err(bad(format!(
                        "the value of '{name}' is not a valid header value"
                    )));
                }
            }
        }
        AttributeTarget::MqttUserProperties => {
            if name.is_empty() || name.contains('\0') {
                return Err(bad(format!(
                    "'{name}' is not an allowed MQTT user property name"
                )));
            }
            if let AttributeValue::Static(v) = &value {
                if v.contains('\0') {
                    return Err(bad(format!(
                        "the value of '{name}' is not a valid MQTT user property value"
                    )));
                }
            }
        }
        AttributeTarget::ServiceBus | AttributeTarget::EventHubs => {
            if name.is_empty() || name.to_ascii_lowercase().starts_with("aeg-") {
                return Err(bad(format!(
                    "'{name}' is not allowed: the aeg- prefix is Event Grid's own"
                )));
            }
            let system = target.system_name(&name);
            if system == Some("MessageId") && !matches!(value, AttributeValue::Dynamic(_)) {
                return Err(bad("MessageId can only be Dynamic"));
            }
            if let Some(canonical) = system {
                return Ok(DeliveryAttribute {
                    name: canonical.to_string(),
                    value,
                    is_secret,
                });
            }
        }
    }
    Ok(DeliveryAttribute {
        name,
        value,
        is_secret,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_and_dynamic_parse_and_resolve() {
        let v = json!([
            {"name": "X-Tenant", "type": "Static", "properties": {"value": "a", "isSecret": true}},
            {"name": "Channel", "type": "Dynamic", "properties": {"sourceField": "$.data.system"}},
            {"name": "N", "type": "dynamic", "properties": {"sourceField": "data.n"}},
        ]);
        let a = parse(&v, AttributeTarget::Headers).unwrap();
        let e = json!({"data": {"system": "s1", "n": 7, "o": {}}});
        assert_eq!(a[0].resolve(Some(&e)).as_deref(), Some("a"));
        assert_eq!(a[1].resolve(Some(&e)).as_deref(), Some("s1"));
        assert_eq!(a[2].resolve(Some(&e)).as_deref(), Some("7"));
        assert_eq!(a[1].resolve(Some(&json!({}))), None);
        assert_eq!(format!("{:?}", a[0]), "X-Tenant: ***");
        assert_eq!(a[1].to_json()["properties"]["sourceField"], "data.system");
    }

    #[test]
    fn reserved_names_follow_the_destination() {
        let one = |n: &str, t: &str| json!([{"name": n, "type": t, "properties": {"value": "v", "sourceField": "id"}}]);
        let sb = AttributeTarget::ServiceBus;
        let a = parse(&one("sessionid", "Static"), sb).unwrap();
        assert_eq!(a[0].name, "SessionId", "canonical spelling");
        assert!(parse(&one("MessageId", "Static"), sb).is_err());
        assert!(parse(&one("MessageId", "Dynamic"), sb).is_ok());
        assert!(parse(&one("aeg-x", "Static"), sb).is_err());
        assert!(parse(&one("aeg-x", "Static"), AttributeTarget::Headers).is_err());
        let both = json!([
            {"name": "SessionId", "properties": {"value": "s"}},
            {"name": "MessageId", "type": "Dynamic", "properties": {"sourceField": "id"}}]);
        assert!(parse(&both, sb).is_err());
        assert_eq!(
            AttributeTarget::EventHubs.system_name("partitionKey"),
            Some("PartitionKey")
        );
        assert_eq!(AttributeTarget::EventHubs.system_name("SessionId"), None);
        let dup = json!([{"name": "a", "properties": {"value": "1"}}, {"name": "A", "properties": {"value": "2"}}]);
        assert!(parse(&dup, sb).is_err());
        let secret_dynamic = json!([{"name": "a", "type": "Dynamic", "properties": {"sourceField": "id", "isSecret": true}}]);
        assert!(parse(&secret_dynamic, sb).is_err());
        let long = json!([{"name": "a", "properties": {"value": "x".repeat(MAX_VALUE_BYTES + 1)}}]);
        assert!(parse(&long, sb).is_err());
    }
}
