//! Topics: the schema enum and the topic resource.

use super::json::{lower_keys, Obj};
use super::names;
use super::Invalid;
use serde_json::Value;

/// The schema a topic accepts and its subscriptions deliver (no conversion between schemas).
/// Stored in metadata records by its canonical name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum EventSchema {
    /// `EventGridSchema` (the default).
    #[serde(rename = "EventGridSchema")]
    EventGrid,
    /// `CustomEventSchema` (alias `CustomSchema`): any JSON objects, forwarded untouched.
    #[serde(rename = "CustomEventSchema")]
    Custom,
    /// `CloudEventSchemaV1_0`.
    #[serde(rename = "CloudEventSchemaV1_0")]
    CloudEventV1_0,
}

impl EventSchema {
    /// Canonical name, as echoed.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::EventGrid => "EventGridSchema",
            Self::Custom => "CustomEventSchema",
            Self::CloudEventV1_0 => "CloudEventSchemaV1_0",
        }
    }

    /// Parse any casing of a schema name (and the `CustomSchema` alias).
    ///
    /// # Errors
    /// [`Invalid`] `InvalidSchema` listing the accepted names.
    pub fn parse(field: &str, s: &str) -> Result<Self, Invalid> {
        match s.trim().to_ascii_lowercase().as_str() {
            "eventgridschema" => Ok(Self::EventGrid),
            "customeventschema" | "customschema" => Ok(Self::Custom),
            "cloudeventschemav1_0" => Ok(Self::CloudEventV1_0),
            _ => Err(Invalid::new(
                "InvalidSchema",
                format!(
                    "{field} '{s}' is not supported; use EventGridSchema, CustomEventSchema or CloudEventSchemaV1_0"
                ),
            )),
        }
    }

    /// Content type of a delivery body in this schema.
    pub fn delivery_content_type(self) -> &'static str {
        match self {
            Self::CloudEventV1_0 => "application/cloudevents-batch+json; charset=utf-8",
            _ => "application/json; charset=utf-8",
        }
    }
}

/// A topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topic {
    /// Name as first created (case kept).
    pub name: String,
    /// Input schema.
    pub input_schema: EventSchema,
    /// `deduplicationWindowInSeconds`: overrides `broker__deduplicationWindowSeconds` (0 = off).
    pub dedup_window_secs: Option<u64>,
    /// `eventRetentionInDays` (Event Grid namespaces' topics): the longest a subscription's
    /// `eventTimeToLive` may be. `None` when not given.
    pub event_retention_days: Option<u32>,
}

/// The longest deduplication window (seven days).
pub const MAX_DEDUP_WINDOW_SECS: u64 = 604_800;

/// Bounds of a namespace topic's `eventRetentionInDays`, as Event Grid documents them.
pub const RETENTION_DAYS: (u64, u64) = (1, 7);

impl Topic {
    /// Parse a topic PUT body for the topic named in the URL.
    ///
    /// # Errors
    /// [`Invalid`] for a bad name, a `name` that differs from the URL, or an unknown schema.
    pub fn from_put(url_name: &str, body: Value) -> Result<Self, Invalid> {
        names::validate("topic", url_name)?;
        let body = lower_keys(body);
        let root = Obj::new(&body, "")?;
        if let Some(name) = root.str("name")? {
            if !name.eq_ignore_ascii_case(url_name) {
                return Err(Invalid::new(
                    "NameMismatch",
                    format!("name '{name}' does not match the topic name '{url_name}' in the URL"),
                ));
            }
        }
        let empty = Value::Object(serde_json::Map::new());
        let props = root
            .obj("properties", "properties")?
            .unwrap_or(Obj::new(&empty, "properties")?);
        let event_retention_days = props
            .int(
                "eventretentionindays",
                "properties.eventRetentionInDays",
                RETENTION_DAYS.0,
                RETENTION_DAYS.1,
            )?
            .map(|d| d as u32);
        if let Some(p) = props.str("publishertype")? {
            if !p.eq_ignore_ascii_case("custom") {
                return Err(Invalid::new(
                    "InvalidTopic",
                    format!("properties.publisherType '{p}' is not supported; use Custom"),
                ));
            }
        }
        // A body in the shape ARM writes Event Grid namespaces' topics (which take only
        // CloudEvents) defaults to CloudEvents; the edge module's shape to Event Grid's schema.
        let namespace_shape =
            props.get("eventretentionindays").is_some() || props.get("publishertype").is_some();
        let input_schema = match props.str("inputschema")? {
            Some(s) => EventSchema::parse("properties.inputSchema", s)?,
            None if namespace_shape => EventSchema::CloudEventV1_0,
            None => EventSchema::EventGrid,
        };
        let dedup_window_secs = props.int(
            "deduplicationwindowinseconds",
            "properties.deduplicationWindowInSeconds",
            0,
            MAX_DEDUP_WINDOW_SECS,
        )?;
        Ok(Self {
            name: url_name.to_string(),
            input_schema,
            dedup_window_secs,
            event_retention_days,
        })
    }
}

/// Where resource ids and endpoints come from.
#[derive(Debug, Clone)]
pub struct ResourceContext {
    /// `/iotHubs/<hub>/devices/<dev>/modules/<mod>`.
    pub id_prefix: String,
    /// `<scheme>://<host[:port]>` of the request being answered.
    pub base_url: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_name_schemas_canonically() {
        for s in [
            EventSchema::EventGrid,
            EventSchema::Custom,
            EventSchema::CloudEventV1_0,
        ] {
            let v = serde_json::to_value(s).unwrap();
            assert_eq!(v, serde_json::json!(s.as_str()));
            assert_eq!(serde_json::from_value::<EventSchema>(v).unwrap(), s);
        }
    }

    #[test]
    fn schema_names_parse_in_any_case_and_alias() {
        assert_eq!(
            EventSchema::parse("x", "eventgridschema").unwrap(),
            EventSchema::EventGrid
        );
        assert_eq!(
            EventSchema::parse("x", "CustomSchema").unwrap(),
            EventSchema::Custom
        );
        assert_eq!(
            EventSchema::parse("x", "cloudEventSchemaV1_0").unwrap(),
            EventSchema::CloudEventV1_0
        );
        assert!(EventSchema::parse("x", "Foo").is_err());
    }

    #[test]
    fn topic_put_defaults_and_checks_the_name() {
        let t = Topic::from_put("t1", serde_json::json!({})).unwrap();
        assert_eq!(t.input_schema, EventSchema::EventGrid);
        let t = Topic::from_put(
            "t3",
            serde_json::json!({"NAME":"T3","properties":{"inputschema":"customEventSchema"}}),
        )
        .unwrap();
        assert_eq!(t.input_schema, EventSchema::Custom);
        assert!(Topic::from_put("t3", serde_json::json!({"name":"other"})).is_err());
        assert!(Topic::from_put("t3", serde_json::json!([])).is_err());
    }

    #[test]
    fn namespace_shaped_topics_default_to_cloudevents_and_keep_their_retention() {
        use serde_json::json;
        let t = Topic::from_put("n", json!({"properties":{"eventRetentionInDays":3}})).unwrap();
        assert_eq!(t.input_schema, EventSchema::CloudEventV1_0);
        assert_eq!(t.event_retention_days, Some(3));
        let t = Topic::from_put("n", json!({"properties":{"publisherType":"Custom"}})).unwrap();
        assert_eq!(t.input_schema, EventSchema::CloudEventV1_0);
        assert_eq!(t.event_retention_days, None);
        let t = Topic::from_put(
            "n",
            json!({"properties":{"publisherType":"Custom","inputSchema":"CloudEventSchemaV1_0","eventRetentionInDays":1}}),
        )
        .unwrap();
        assert_eq!(t.input_schema, EventSchema::CloudEventV1_0);
        for bad in [
            json!({"properties":{"eventRetentionInDays":0}}),
            json!({"properties":{"eventRetentionInDays":8}}),
            json!({"properties":{"publisherType":"Partner"}}),
        ] {
            assert!(Topic::from_put("n", bad).is_err());
        }
    }
}
