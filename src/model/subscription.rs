//! Event subscriptions: destination, retry policy, batching, persistence, filter.
//!
//! [`Subscription::from_put`] is the only parser: the API, the module twin and the metadata store
//! (which keeps [`Subscription::to_record`]) all go through it, so a stored subscription is
//! re-validated exactly like a new one.

use super::azure::{check_queue_name, MessageEncoding, MessagingConn, StorageConn};
use super::delivery_options::DeliveryOptions;
use super::json::{loose_bool, lower_keys, Obj};
use super::names;
use super::topic::{EventSchema, ResourceContext, Topic};
use crate::config::Config;
use crate::delivery::policy::{ScheduleName, StatusCodePolicy};
use crate::error::ApiError;
use crate::filter::Filter;
use serde_json::{json, Map, Value};
use std::time::Duration;
use url::Url;

/// Output batching knobs of a destination, as the subscriber set them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batching {
    /// `maxEventsPerBatch`.
    pub max_events_per_batch: Option<u32>,
    /// `preferredBatchSizeInKilobytes`.
    pub preferred_batch_size_kb: Option<u32>,
    /// `deliveryPolicy.approxBatchSizeInBytes` (older twin knob).
    pub approx_batch_size_bytes: Option<u64>,
}

impl Batching {
    fn parse(props: &Obj<'_>, cfg: &Config) -> Result<Self, ApiError> {
        let batch_err = |e: ApiError| ApiError::bad_request("InvalidDeliveryPolicy", e.message);
        Ok(Self {
            max_events_per_batch: props
                .int(
                    "maxeventsperbatch",
                    "maxEventsPerBatch",
                    1,
                    u64::from(cfg.api.max_events_per_batch),
                )
                .map_err(batch_err)?
                .map(|n| n as u32),
            preferred_batch_size_kb: props
                .int(
                    "preferredbatchsizeinkilobytes",
                    "preferredBatchSizeInKilobytes",
                    1,
                    u64::from(cfg.api.max_preferred_batch_size_kb),
                )
                .map_err(batch_err)?
                .map(|n| n as u32),
            approx_batch_size_bytes: props
                .int(
                    "approxbatchsizeinbytes",
                    "approxBatchSizeInBytes",
                    1,
                    cfg.api.max_batch_size_bytes,
                )
                .map_err(batch_err)?,
        })
    }

    fn is_on(&self) -> bool {
        self.max_events_per_batch.is_some()
            || self.preferred_batch_size_kb.is_some()
            || self.approx_batch_size_bytes.is_some()
    }

    /// Effective caps `(events, bytes)`: batching off is one event per request; with only one knob
    /// set the other comes from the module defaults (docs/COMPATIBILITY.md §4.4).
    pub fn caps(&self, cfg: &Config) -> (usize, usize) {
        if !self.is_on() {
            return (1, usize::MAX);
        }
        let events = self
            .max_events_per_batch
            .map(|n| n as usize)
            .unwrap_or(cfg.broker.default_max_events_per_batch);
        let bytes = self
            .preferred_batch_size_kb
            .map(|kb| kb as usize * 1024)
            .or(self.approx_batch_size_bytes.map(|b| b as usize))
            .unwrap_or(cfg.broker.default_max_batch_size_bytes);
        (events.max(1), bytes.max(1))
    }

    fn echo(&self, props: &mut Map<String, Value>) {
        if let Some(n) = self.max_events_per_batch {
            props.insert("maxEventsPerBatch".into(), json!(n));
        }
        if let Some(n) = self.preferred_batch_size_kb {
            props.insert("preferredBatchSizeInKilobytes".into(), json!(n));
        }
        if let Some(n) = self.approx_batch_size_bytes {
            props.insert("approxBatchSizeInBytes".into(), json!(n));
        }
    }
}

/// Where a subscription delivers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// HTTP(S) POST of a JSON array.
    WebHook {
        /// Absolute URL.
        endpoint_url: String,
    },
    /// A module output on edgeHub.
    EdgeHub {
        /// Output name.
        output_name: String,
    },
    /// A cloud Event Grid topic.
    EventGrid {
        /// `https://<topic>.<region>.eventgrid.azure.net/api/events?api-version=2018-01-01`.
        endpoint_url: String,
        /// `aeg-sas-key` value (secret).
        sas_key: String,
        /// Rewrites every EventGridSchema event's `topic`; `None` nulls it.
        topic_name: Option<String>,
    },
    /// Azure Event Hubs (batch send over REST).
    EventHub {
        /// Entity-level connection string (secret).
        connection_string: String,
    },
    /// Azure Service Bus queue.
    ServiceBusQueue {
        /// Entity-level connection string (secret).
        connection_string: String,
    },
    /// Azure Service Bus topic.
    ServiceBusTopic {
        /// Entity-level connection string (secret).
        connection_string: String,
    },
    /// Azure Storage queue (one Put Message per event).
    StorageQueue {
        /// Queue name (Storage naming rules, checked).
        queue_name: String,
        /// Account-level connection string (secret).
        connection_string: String,
        /// `messageEncoding`; `None` = not supplied (base64).
        message_encoding: Option<MessageEncoding>,
    },
}

impl Destination {
    /// Canonical `endpointType`.
    pub fn endpoint_type(&self) -> &'static str {
        match self {
            Self::WebHook { .. } => "WebHook",
            Self::EdgeHub { .. } => "EdgeHub",
            Self::EventGrid { .. } => "EventGrid",
            Self::EventHub { .. } => "EventHub",
            Self::ServiceBusQueue { .. } => "ServiceBusQueue",
            Self::ServiceBusTopic { .. } => "ServiceBusTopic",
            Self::StorageQueue { .. } => "StorageQueue",
        }
    }

    /// What endpoint health is tracked by: the URL for HTTP destinations, the entity's URL (no
    /// credentials) for Azure ones; `None` for EdgeHub.
    pub fn health_key(&self) -> Option<String> {
        match self {
            Self::EventHub { connection_string }
            | Self::ServiceBusQueue { connection_string }
            | Self::ServiceBusTopic { connection_string } => {
                MessagingConn::parse(connection_string)
                    .ok()
                    .map(|c| c.resource_uri())
            }
            Self::StorageQueue {
                queue_name,
                connection_string,
                ..
            } => StorageConn::parse(connection_string)
                .ok()
                .map(|c| format!("{}/{queue_name}", c.queue_endpoint)),
            _ => self.url().map(str::to_string),
        }
    }

    /// The URL deliveries go to, for HTTP destinations (used for endpoint health and logs).
    pub fn url(&self) -> Option<&str> {
        match self {
            Self::WebHook { endpoint_url } | Self::EventGrid { endpoint_url, .. } => {
                Some(endpoint_url)
            }
            _ => None,
        }
    }
}

/// `retryPolicy`, as supplied (echoed only when supplied).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetryPolicy {
    /// `eventExpiryInMinutes`.
    pub event_expiry_in_minutes: Option<u32>,
    /// `maxDeliveryAttempts`.
    pub max_delivery_attempts: Option<u32>,
    /// `schedule` (gridlet): a named retry schedule.
    pub schedule: Option<ScheduleName>,
    /// `statusCodePolicy` (gridlet): which status-code table applies.
    pub status_code_policy: Option<StatusCodePolicy>,
}

/// The limits that apply to one subscription: its `retryPolicy` over the module defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EffectivePolicy {
    /// Attempts before the event is dropped.
    pub max_attempts: u32,
    /// Age after which the event is dropped.
    pub ttl: Duration,
    /// Retry schedule.
    pub schedule: ScheduleName,
    /// Status-code table.
    pub status_codes: StatusCodePolicy,
    /// Jitter (percent either way) under the `standard` policy; 0 under `original`.
    pub jitter_percent: u8,
    /// Longest `Retry-After` honoured.
    pub retry_after_cap: Duration,
    /// A dead-letter destination exists (local store or webhook): 400/413 may be refused.
    pub dead_letter: bool,
}

impl EffectivePolicy {
    /// The original module's behaviour with these limits.
    pub fn original(max_attempts: u32, ttl: Duration) -> Self {
        Self {
            max_attempts,
            ttl,
            schedule: ScheduleName::Original,
            status_codes: StatusCodePolicy::Original,
            jitter_percent: 0,
            retry_after_cap: Duration::from_secs(3600),
            dead_letter: true,
        }
    }
}

/// An event subscription.
#[derive(Debug, Clone)]
pub struct Subscription {
    /// Name (case kept).
    pub name: String,
    /// Topic name (case as the topic's).
    pub topic: String,
    /// Delivery schema (= the topic's input schema).
    pub delivery_schema: EventSchema,
    /// Retry policy, if supplied.
    pub retry_policy: Option<RetryPolicy>,
    /// Events are kept on disk.
    pub persisted: bool,
    /// Destination.
    pub destination: Destination,
    /// Output batching.
    pub batching: Batching,
    /// Filter (`None` = every event).
    pub filter: Option<Filter>,
    /// Signing, static headers, dead-letter webhook.
    pub delivery: DeliveryOptions,
}

fn invalid_destination(msg: impl Into<String>) -> ApiError {
    ApiError::bad_request(
        "InvalidDestination",
        format!(
            "EventSubscription.Properties.Destination failed validation. Reason: {}",
            msg.into()
        ),
    )
}

fn absolute_url(raw: &str) -> Result<Url, ApiError> {
    let url =
        Url::parse(raw).map_err(|_| invalid_destination("EndpointUrl must be an absolute URL"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(invalid_destination(
            "EndpointUrl must be an absolute http(s) URL",
        ));
    }
    Ok(url)
}

fn parse_destination(
    dest: &Obj<'_>,
    cfg: &Config,
) -> Result<(Destination, Batching, Option<&'static str>), ApiError> {
    let endpoint_type = dest.req_str("endpointtype", "endpointType")?;
    let props = match dest.obj("properties", "properties.destination.properties")? {
        Some(p) => p,
        None => return Err(invalid_destination("destination.properties is required")),
    };
    let batching = Batching::parse(&props, cfg)?;
    // The webhook sample puts eventDeliverySchema inside the destination properties.
    let schema_hint = props.str("eventdeliveryschema")?;
    let schema_hint = match schema_hint {
        Some(s) => {
            Some(EventSchema::parse("destination.properties.eventDeliverySchema", s)?.as_str())
        }
        None => None,
    };
    // Connection strings are parsed here so a bad one is a 400 naming the part, never a
    // delivery-time surprise.
    let conn = |key: &str, display: &str, entity: bool| -> Result<String, ApiError> {
        let cs = props
            .str(key)?
            .filter(|s| !s.trim().is_empty())
            .ok_or_else(|| invalid_destination(format!("{display} is required")))?;
        let checked = if entity {
            MessagingConn::parse(cs).map(|_| ())
        } else {
            StorageConn::parse(cs).map(|_| ())
        };
        checked.map_err(|e| invalid_destination(format!("{display}: {e}")))?;
        Ok(cs.to_string())
    };
    let d = match endpoint_type.to_ascii_lowercase().as_str() {
        "webhook" => {
            let raw = props
                .str("endpointurl")?
                .filter(|s| !s.trim().is_empty())
                .ok_or_else(|| invalid_destination("EndpointUrl is required"))?;
            let url = absolute_url(raw)?;
            if cfg.outbound.webhook_https_only && url.scheme() != "https" {
                return Err(invalid_destination(
                    "EndpointUrl must be https while outbound__webhook__httpsOnly=true",
                ));
            }
            Destination::WebHook { endpoint_url: raw.to_string() }
        }
        "edgehub" => {
            let out = props
                .str("outputname")?
                .filter(|s| !s.trim().is_empty())
                .ok_or_else(|| invalid_destination("outputName is required for EdgeHub destinations"))?;
            Destination::EdgeHub { output_name: out.to_string() }
        }
        "eventgrid" => {
            let raw = props
                .str("endpointurl")?
                .filter(|s| !s.trim().is_empty())
                .ok_or_else(|| invalid_destination("EndpointUrl is required"))?;
            let url = absolute_url(raw)?;
            if !url.path().to_ascii_lowercase().contains("/api/events") {
                return Err(invalid_destination(
                    "EndpointUrl must target the /api/events API of Azure Event Grid in the cloud.",
                ));
            }
            let has_version = url
                .query_pairs()
                .any(|(k, v)| k.eq_ignore_ascii_case("api-version") && v == "2018-01-01");
            if !has_version {
                return Err(invalid_destination("EndpointUrl must have the query api-version=2018-01-01"));
            }
            if cfg.outbound.eventgrid_https_only && url.scheme() != "https" {
                return Err(invalid_destination(
                    "EndpointUrl must be https while outbound__eventgrid__httpsOnly=true",
                ));
            }
            let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
            let azure = ["eventgrid.azure.net", "eventgrid.azure.us", "eventgrid.azure.cn"]
                .iter()
                .any(|d| host.ends_with(&format!(".{d}")));
            if !azure && !cfg.outbound.eventgrid_allow_invalid_hostnames {
                return Err(invalid_destination(
                    "EndpointUrl host must be under eventgrid.azure.net, eventgrid.azure.us or eventgrid.azure.cn",
                ));
            }
            let sas_key = props
                .str("saskey")?
                .filter(|s| !s.trim().is_empty())
                .ok_or_else(|| invalid_destination("sasKey is required for EventGrid destinations"))?;
            Destination::EventGrid {
                endpoint_url: raw.to_string(),
                sas_key: sas_key.to_string(),
                topic_name: props.str("topicname")?.map(str::to_string),
            }
        }
        "eventhub" => Destination::EventHub { connection_string: conn("connectionstring", "connectionString", true)? },
        "servicebusqueue" => Destination::ServiceBusQueue {
            connection_string: conn("connectionstring", "connectionString", true)?,
        },
        "servicebustopic" => Destination::ServiceBusTopic {
            connection_string: conn("connectionstring", "connectionString", true)?,
        },
        "storagequeue" => {
            let queue_name = props
                .str("queuename")?
                .filter(|s| !s.trim().is_empty())
                .ok_or_else(|| invalid_destination("queueName is required for StorageQueue destinations"))?;
            check_queue_name(queue_name).map_err(|e| invalid_destination(e.to_string()))?;
            let message_encoding = match props.str("messageencoding")? {
                None => None,
                Some(v) => Some(MessageEncoding::parse(v).ok_or_else(|| {
                    invalid_destination("messageEncoding must be base64 or text")
                })?),
            };
            Destination::StorageQueue {
                queue_name: queue_name.to_string(),
                connection_string: conn("connectionstring", "connectionString", false)?,
                message_encoding,
            }
        }
        other => {
            return Err(invalid_destination(format!(
                "endpointType '{other}' is not supported; use WebHook, EdgeHub, EventGrid, EventHub, ServiceBusQueue, ServiceBusTopic or StorageQueue"
            )))
        }
    };
    Ok((d, batching, schema_hint))
}

fn parse_persisted(v: &Value) -> Result<bool, ApiError> {
    let bad = || {
        ApiError::bad_request(
            "InvalidRequest",
            "properties.persistencePolicy must be {\"isPersisted\": true|false}",
        )
    };
    match v {
        Value::Object(m) => match m.get("ispersisted") {
            None | Some(Value::Null) => Ok(false),
            Some(b) => loose_bool(b).ok_or_else(bad),
        },
        other => loose_bool(other).ok_or_else(bad),
    }
}

impl Subscription {
    /// Parse a subscription PUT body for `topic`, named `url_name` in the URL.
    ///
    /// # Errors
    /// 400 with a detailed code for every rule of docs/COMPATIBILITY.md §3.
    pub fn from_put(
        topic: &Topic,
        url_name: &str,
        body: Value,
        cfg: &Config,
    ) -> Result<Self, ApiError> {
        names::validate("event subscription", url_name)?;
        let body = lower_keys(body);
        let root = Obj::new(&body, "")?;
        if let Some(name) = root.str("name")? {
            if !name.eq_ignore_ascii_case(url_name) {
                return Err(ApiError::bad_request(
                    "NameMismatch",
                    format!("name '{name}' does not match the subscription name '{url_name}' in the URL"),
                ));
            }
        }
        let empty = Value::Object(Map::new());
        let props = root
            .obj("properties", "properties")?
            .unwrap_or(Obj::new(&empty, "properties")?);
        for key in ["topic", "topicname"] {
            if let Some(t) = props.str(key)? {
                if !t.eq_ignore_ascii_case(&topic.name) {
                    return Err(ApiError::bad_request(
                        "NameMismatch",
                        format!(
                            "properties.topic '{t}' does not match the topic '{}' in the URL",
                            topic.name
                        ),
                    ));
                }
            }
        }
        let dest = props
            .obj("destination", "properties.destination")?
            .ok_or_else(|| invalid_destination("properties.destination is required"))?;
        let (destination, mut batching, schema_hint) = parse_destination(&dest, cfg)?;
        // Twin style: `deliveryPolicy` carries the batching knobs.
        if let Some(dp) = props.obj("deliverypolicy", "properties.deliveryPolicy")? {
            let extra = Batching::parse(&dp, cfg)?;
            batching.max_events_per_batch =
                batching.max_events_per_batch.or(extra.max_events_per_batch);
            batching.preferred_batch_size_kb = batching
                .preferred_batch_size_kb
                .or(extra.preferred_batch_size_kb);
            batching.approx_batch_size_bytes = batching
                .approx_batch_size_bytes
                .or(extra.approx_batch_size_bytes);
        }
        let delivery_schema = match props.str("eventdeliveryschema")?.or(schema_hint) {
            Some(s) => EventSchema::parse("properties.eventDeliverySchema", s)?,
            None => topic.input_schema,
        };
        if delivery_schema != topic.input_schema {
            return Err(ApiError::bad_request(
                "InvalidSchema",
                format!(
                    "eventDeliverySchema {} must equal the topic's inputSchema {} (no schema conversion)",
                    delivery_schema.as_str(),
                    topic.input_schema.as_str()
                ),
            ));
        }
        let retry_policy = match props.obj("retrypolicy", "properties.retryPolicy")? {
            None => None,
            Some(rp) => Some(RetryPolicy {
                event_expiry_in_minutes: rp
                    .int(
                        "eventexpiryinminutes",
                        "eventExpiryInMinutes",
                        1,
                        7 * 24 * 60 * 52,
                    )?
                    .map(|n| n as u32),
                max_delivery_attempts: rp
                    .int("maxdeliveryattempts", "maxDeliveryAttempts", 1, 1_000_000)?
                    .map(|n| n as u32),
                schedule: match rp.str("schedule")? {
                    None => None,
                    Some(n) => Some(ScheduleName::parse(n).ok_or_else(|| {
                        ApiError::bad_request(
                            "InvalidRetryPolicy",
                            format!("retryPolicy.schedule '{n}' is not one of original, eventGridCloud, workfront"),
                        )
                    })?),
                },
                status_code_policy: match rp.str("statuscodepolicy")? {
                    None => None,
                    Some(n) => Some(StatusCodePolicy::parse(n).ok_or_else(|| {
                        ApiError::bad_request(
                            "InvalidRetryPolicy",
                            format!("retryPolicy.statusCodePolicy '{n}' is not one of original, standard"),
                        )
                    })?),
                },
            }),
        };
        let persisted = match props.get("persistencepolicy") {
            Some(v) => parse_persisted(v)?,
            None => cfg.broker.default_is_persisted,
        };
        let filter = match props.obj("filter", "properties.filter")? {
            Some(f) => Some(Filter::parse(&f, cfg.api.max_included_event_types)?),
            None => None,
        };
        let delivery = DeliveryOptions::parse(
            &props,
            dest.obj("properties", "properties.destination.properties")?
                .as_ref(),
            destination.url().is_some(),
        )?;
        Ok(Self {
            name: url_name.to_string(),
            topic: topic.name.clone(),
            delivery_schema,
            retry_policy,
            persisted,
            destination,
            batching,
            filter,
            delivery,
        })
    }

    /// Limits that apply: `retryPolicy` over the module defaults.
    pub fn effective_policy(&self, cfg: &Config) -> EffectivePolicy {
        let rp = self.retry_policy.clone().unwrap_or_default();
        let r = &cfg.resilience;
        let status_codes = rp.status_code_policy.unwrap_or(r.status_code_policy);
        EffectivePolicy {
            schedule: rp.schedule.unwrap_or(r.retry_schedule),
            status_codes,
            jitter_percent: match status_codes {
                StatusCodePolicy::Original => 0,
                StatusCodePolicy::Standard => r.jitter_percent,
            },
            retry_after_cap: r.retry_after_cap,
            dead_letter: r.dead_letter_capacity > 0
                || self.delivery.dead_letter_url.is_some()
                || self.delivery.dead_letter_blob.is_some(),
            max_attempts: rp
                .max_delivery_attempts
                .unwrap_or(cfg.broker.default_max_delivery_attempts),
            ttl: rp
                .event_expiry_in_minutes
                .map(|m| Duration::from_secs(u64::from(m) * 60))
                .unwrap_or(cfg.broker.default_event_ttl),
        }
    }

    /// The `properties` object as echoed (and stored).
    pub fn properties(&self) -> Value {
        let mut dest_props = Map::new();
        match &self.destination {
            Destination::WebHook { endpoint_url } => {
                dest_props.insert("endpointUrl".into(), json!(endpoint_url));
            }
            Destination::EdgeHub { output_name } => {
                dest_props.insert("outputName".into(), json!(output_name));
            }
            Destination::EventGrid {
                endpoint_url,
                sas_key,
                topic_name,
            } => {
                dest_props.insert("endpointUrl".into(), json!(endpoint_url));
                dest_props.insert("sasKey".into(), json!(sas_key));
                dest_props.insert("topicName".into(), json!(topic_name));
            }
            Destination::EventHub { connection_string }
            | Destination::ServiceBusQueue { connection_string }
            | Destination::ServiceBusTopic { connection_string } => {
                dest_props.insert("connectionString".into(), json!(connection_string));
            }
            Destination::StorageQueue {
                queue_name,
                connection_string,
                message_encoding,
            } => {
                dest_props.insert("queueName".into(), json!(queue_name));
                dest_props.insert("connectionString".into(), json!(connection_string));
                if let Some(e) = message_encoding {
                    dest_props.insert("messageEncoding".into(), json!(e.as_str()));
                }
            }
        }
        self.batching.echo(&mut dest_props);
        let mut props = Map::new();
        self.delivery.echo(&mut dest_props, &mut props);
        props.insert("topic".into(), json!(self.topic));
        props.insert("topicName".into(), json!(self.topic));
        props.insert(
            "eventDeliverySchema".into(),
            json!(self.delivery_schema.as_str()),
        );
        if let Some(rp) = &self.retry_policy {
            let mut m = Map::new();
            if let Some(v) = rp.event_expiry_in_minutes {
                m.insert("eventExpiryInMinutes".into(), json!(v));
            }
            if let Some(v) = rp.max_delivery_attempts {
                m.insert("maxDeliveryAttempts".into(), json!(v));
            }
            if let Some(v) = rp.schedule {
                m.insert("schedule".into(), json!(v.as_str()));
            }
            if let Some(v) = rp.status_code_policy {
                m.insert("statusCodePolicy".into(), json!(v.as_str()));
            }
            props.insert("retryPolicy".into(), Value::Object(m));
        }
        props.insert(
            "persistencePolicy".into(),
            json!({ "isPersisted": self.persisted }),
        );
        props.insert(
            "destination".into(),
            json!({ "endpointType": self.destination.endpoint_type(), "properties": dest_props }),
        );
        if let Some(f) = &self.filter {
            props.insert("filter".into(), f.to_json());
        }
        Value::Object(props)
    }

    /// The stored form, read back through [`Subscription::from_put`].
    pub fn to_record(&self) -> Value {
        json!({ "name": self.name, "properties": self.properties() })
    }
}

/// The subscription resource as the API returns it.
pub fn subscription_resource(s: &Subscription, ctx: &ResourceContext) -> Value {
    json!({
        "id": format!("{}/topics/{}/eventSubscriptions/{}", ctx.id_prefix, s.topic, s.name),
        "name": s.name,
        "type": "Microsoft.EventGrid/eventSubscriptions",
        "properties": s.properties(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(pairs: &[(&str, &str)]) -> Config {
        Config::from_vars(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string()))).unwrap()
    }

    fn topic() -> Topic {
        Topic {
            name: "t1".into(),
            input_schema: EventSchema::EventGrid,
        }
    }

    fn webhook(url: &str) -> Value {
        json!({"properties":{"destination":{"endpointType":"WebHook","properties":{"endpointUrl":url}}}})
    }

    #[test]
    fn webhook_https_only_is_enforced_by_default() {
        let c = cfg(&[]);
        assert!(
            Subscription::from_put(&topic(), "s1", webhook("https://subscriber:4430"), &c).is_ok()
        );
        let e = Subscription::from_put(&topic(), "s1", webhook("http://subscriber:8080"), &c)
            .unwrap_err();
        assert_eq!(e.detail, "InvalidDestination");
        let c = cfg(&[("outbound__webhook__httpsOnly", "false")]);
        assert!(
            Subscription::from_put(&topic(), "s1", webhook("http://subscriber:8080"), &c).is_ok()
        );
        assert!(Subscription::from_put(&topic(), "s1", webhook("/relative"), &c).is_err());
    }

    #[test]
    fn batching_limits_apply_at_creation() {
        let c = cfg(&[]);
        let with = |k: &str, v: u32| json!({"properties":{"destination":{"endpointType":"webhook","properties":{"endpointUrl":"https://x", k: v}}}});
        assert!(Subscription::from_put(&topic(), "s", with("maxEventsPerBatch", 51), &c).is_err());
        assert!(Subscription::from_put(
            &topic(),
            "s",
            with("preferredBatchSizeInKilobytes", 1034),
            &c
        )
        .is_err());
        let s = Subscription::from_put(&topic(), "s", with("maxEventsPerBatch", 10), &c).unwrap();
        assert_eq!(s.batching.caps(&c), (10, 1_058_576));
        let s =
            Subscription::from_put(&topic(), "s", with("preferredBatchSizeInKilobytes", 64), &c)
                .unwrap();
        assert_eq!(s.batching.caps(&c), (10, 64 * 1024));
    }

    #[test]
    fn eventgrid_destination_rules() {
        let c = cfg(&[]);
        let eg = |url: &str, key: Option<&str>| json!({"properties":{"destination":{"endpointType":"eventGrid","properties":{"endpointUrl":url,"sasKey":key}}}});
        let good = "https://x.westus2-1.eventgrid.azure.net/api/events?api-version=2018-01-01";
        assert!(Subscription::from_put(&topic(), "s", eg(good, Some("k")), &c).is_ok());
        assert!(Subscription::from_put(&topic(), "s", eg(good, None), &c).is_err());
        assert!(Subscription::from_put(
            &topic(),
            "s",
            eg(
                "https://x.eventgrid.azure.net/foo?api-version=2018-01-01",
                Some("k")
            ),
            &c
        )
        .is_err());
        assert!(Subscription::from_put(
            &topic(),
            "s",
            eg("https://x.eventgrid.azure.net/api/events", Some("k")),
            &c
        )
        .is_err());
        assert!(Subscription::from_put(
            &topic(),
            "s",
            eg(
                "https://example.com/api/events?api-version=2018-01-01",
                Some("k")
            ),
            &c
        )
        .is_err());
        assert!(Subscription::from_put(
            &topic(),
            "s",
            eg(
                "http://x.eventgrid.azure.net/api/events?api-version=2018-01-01",
                Some("k")
            ),
            &c
        )
        .is_err());
        let c = cfg(&[("outbound__eventgrid__allowInvalidHostnames", "true")]);
        assert!(Subscription::from_put(
            &topic(),
            "s",
            eg(
                "https://example.com/api/events?api-version=2018-01-01",
                Some("k")
            ),
            &c
        )
        .is_ok());
    }

    #[test]
    fn persistence_policy_shapes_are_all_accepted() {
        let c = cfg(&[]);
        for pp in [
            json!({"isPersisted":"true"}),
            json!({"isPersisted":true}),
            json!("true"),
            json!(true),
        ] {
            let mut b = webhook("https://x");
            b["properties"]["persistencePolicy"] = pp;
            assert!(
                Subscription::from_put(&topic(), "s", b, &c)
                    .unwrap()
                    .persisted
            );
        }
    }

    #[test]
    fn record_round_trips() {
        let c = cfg(&[]);
        let mut b = webhook("https://x");
        b["properties"]["retryPolicy"] = json!({"eventExpiryInMinutes":30,"maxDeliveryAttempts":3});
        b["properties"]["filter"] = json!({"subjectBeginsWith":"a","advancedFilters":[{"operatorType":"NumberIn","key":"data.n","values":[1,2]}]});
        let s = Subscription::from_put(&topic(), "s", b, &c).unwrap();
        let again = Subscription::from_put(&topic(), "s", s.to_record(), &c).unwrap();
        assert_eq!(s.properties(), again.properties());
        assert_eq!(
            s.effective_policy(&c),
            EffectivePolicy::original(3, Duration::from_secs(1800))
        );
    }
}
