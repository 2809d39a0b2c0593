//! Event subscriptions: destination, retry policy, batching, persistence, filter.
//!
//! [`Subscription::from_put`] is the only parser of subscription bodies: the API and the module
//! twin go through it, under the settings in force. The metadata store keeps a typed record of
//! its own instead (`super::record`: [`Subscription::to_record`] / `from_record`), read back
//! without the parser or the settings.

use super::delivery_options::DeliveryOptions;
use super::destination::{mask_properties, Destination, DestinationTypes, Role};
use super::json::{loose_bool, lower_keys, Obj};
use super::names;
use super::queue::{self, QueueSettings};
use super::topic::{EventSchema, ResourceContext, Topic};
use super::Invalid;
use crate::config::Config;
use crate::model::filter::Filter;
use crate::policy::{names_list, ScheduleName, StatusCodePolicy};
use serde_json::{json, Map, Value};
use std::time::Duration;

/// How a backlog drains when its endpoint's outage ends (`drainOrder`, gridlet: in the
/// destination's properties or `deliveryPolicy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum DrainOrder {
    /// The backlog first, oldest first, then what arrived since (the default).
    #[default]
    OldestFirst,
    /// Events published after the link returned first, the backlog behind them.
    LiveFirst,
}

impl DrainOrder {
    fn parse(v: &str) -> Result<Self, Invalid> {
        if v.eq_ignore_ascii_case("OldestFirst") {
            Ok(Self::OldestFirst)
        } else if v.eq_ignore_ascii_case("LiveFirst") {
            Ok(Self::LiveFirst)
        } else {
            Err(Invalid::new(
                "InvalidDeliveryPolicy",
                format!("drainOrder must be OldestFirst or LiveFirst, not '{v}'"),
            ))
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::OldestFirst => "OldestFirst",
            Self::LiveFirst => "LiveFirst",
        }
    }
}

/// Output batching knobs of a destination, and the order its backlog drains in after an
/// outage, as the subscriber set them (also their metadata record).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Batching {
    /// `maxEventsPerBatch`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_events_per_batch: Option<u32>,
    /// `preferredBatchSizeInKilobytes`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preferred_batch_size_kb: Option<u32>,
    /// `deliveryPolicy.approxBatchSizeInBytes` (older twin knob).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approx_batch_size_bytes: Option<u64>,
    /// `drainOrder` (gridlet).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain_order: Option<DrainOrder>,
}

/// What one delivery request may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchCaps {
    /// Events per request.
    pub max_events: usize,
    /// Bytes per request (a single larger event still goes alone).
    pub max_bytes: usize,
}

impl Batching {
    fn parse(props: &Obj<'_>, cfg: &Config) -> Result<Self, Invalid> {
        let knob = |key: &str, display: &str, max: u64| {
            props
                .int(key, display, 1, max)
                .map_err(|e| Invalid::new("InvalidDeliveryPolicy", e.message))
        };
        let api = &cfg.api;
        Ok(Self {
            max_events_per_batch: knob(
                "maxeventsperbatch",
                "maxEventsPerBatch",
                u64::from(api.max_events_per_batch),
            )?
            .map(|n| n as u32),
            preferred_batch_size_kb: knob(
                "preferredbatchsizeinkilobytes",
                "preferredBatchSizeInKilobytes",
                u64::from(api.max_preferred_batch_size_kb),
            )?
            .map(|n| n as u32),
            approx_batch_size_bytes: knob(
                "approxbatchsizeinbytes",
                "approxBatchSizeInBytes",
                api.max_batch_size_bytes,
            )?,
            drain_order: props
                .str("drainorder")?
                .map(DrainOrder::parse)
                .transpose()?,
        })
    }

    /// Whether events published after an outage go before its backlog (`drainOrder:
    /// LiveFirst`).
    pub fn live_first(&self) -> bool {
        self.drain_order == Some(DrainOrder::LiveFirst)
    }

    /// Each knob of `self`, else of `other`.
    fn or(self, other: Self) -> Self {
        Self {
            max_events_per_batch: self.max_events_per_batch.or(other.max_events_per_batch),
            preferred_batch_size_kb: self
                .preferred_batch_size_kb
                .or(other.preferred_batch_size_kb),
            approx_batch_size_bytes: self
                .approx_batch_size_bytes
                .or(other.approx_batch_size_bytes),
            drain_order: self.drain_order.or(other.drain_order),
        }
    }

    fn is_on(&self) -> bool {
        self.max_events_per_batch.is_some()
            || self.preferred_batch_size_kb.is_some()
            || self.approx_batch_size_bytes.is_some()
    }

    /// Effective caps: batching off is one event per request; with only one knob set the other
    /// comes from the module defaults (docs/COMPATIBILITY.md §4.4).
    pub fn caps(&self, cfg: &Config) -> BatchCaps {
        if !self.is_on() {
            return BatchCaps {
                max_events: 1,
                max_bytes: usize::MAX,
            };
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
        BatchCaps {
            max_events: events.max(1),
            max_bytes: bytes.max(1),
        }
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
        if let Some(d) = self.drain_order {
            props.insert("drainOrder".into(), json!(d.as_str()));
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
            schedule: ScheduleName::OneThenEveryTenMinutes,
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
    /// `deliveryConfiguration.deliveryMode` `Queue`: events wait to be received (pull delivery,
    /// `delivery::pull`); the destination is a placeholder. `None`: pushed to the destination.
    pub queue: Option<QueueSettings>,
}

/// `properties.destination`: the type's own parser (through `types`), plus what every type
/// shares (batching knobs, the webhook sample's `eventDeliverySchema` inside the properties).
fn parse_destination(
    dest: &Obj<'_>,
    cfg: &Config,
    types: &dyn DestinationTypes,
) -> Result<(Destination, Batching, Option<&'static str>), Invalid> {
    let endpoint_type = dest.req_str("endpointtype", "endpointType")?;
    let props = match dest.obj("properties", "properties.destination.properties")? {
        Some(p) => p,
        None => return Err(Role::Delivery.invalid("destination.properties is required")),
    };
    let batching = Batching::parse(&props, cfg)?;
    let schema_hint = match props.str("eventdeliveryschema")? {
        Some(s) => {
            Some(EventSchema::parse("destination.properties.eventDeliverySchema", s)?.as_str())
        }
        None => None,
    };
    let d = types.parse(endpoint_type, &props, cfg, Role::Delivery)?;
    Ok((d, batching, schema_hint))
}

fn parse_persisted(v: &Value) -> Result<bool, Invalid> {
    let bad = || {
        Invalid::new(
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

/// The body's `name`, when given, must be the URL's.
fn check_name(root: &Obj<'_>, url_name: &str) -> Result<(), Invalid> {
    match root.str("name")? {
        Some(name) if !name.eq_ignore_ascii_case(url_name) => Err(Invalid::new(
            "NameMismatch",
            format!("name '{name}' does not match the subscription name '{url_name}' in the URL"),
        )),
        _ => Ok(()),
    }
}

/// `properties.topic` / `properties.topicName`, when given, must name the URL's topic.
fn check_topic(props: &Obj<'_>, topic: &Topic) -> Result<(), Invalid> {
    for key in ["topic", "topicname"] {
        if let Some(t) = props.str(key)? {
            if !t.eq_ignore_ascii_case(&topic.name) {
                return Err(Invalid::new(
                    "NameMismatch",
                    format!(
                        "properties.topic '{t}' does not match the topic '{}' in the URL",
                        topic.name
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// `properties.eventDeliverySchema` (or the destination's), which must be the topic's schema.
fn delivery_schema(
    props: &Obj<'_>,
    schema_hint: Option<&str>,
    topic: &Topic,
) -> Result<EventSchema, Invalid> {
    let delivery_schema = match props.str("eventdeliveryschema")?.or(schema_hint) {
        Some(s) => EventSchema::parse("properties.eventDeliverySchema", s)?,
        None => topic.input_schema,
    };
    if delivery_schema != topic.input_schema {
        return Err(Invalid::new(
            "InvalidSchema",
            format!(
                "eventDeliverySchema {} must equal the topic's inputSchema {} (no schema conversion)",
                delivery_schema.as_str(),
                topic.input_schema.as_str()
            ),
        ));
    }
    Ok(delivery_schema)
}

impl RetryPolicy {
    /// `properties.retryPolicy`.
    fn parse(rp: &Obj<'_>) -> Result<Self, Invalid> {
        Ok(Self {
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
                    Invalid::new(
                        "InvalidRetryPolicy",
                        format!(
                            "retryPolicy.schedule '{n}' is not one of {}",
                            names_list(&ScheduleName::ACCEPTED)
                        ),
                    )
                })?),
            },
            status_code_policy: match rp.str("statuscodepolicy")? {
                None => None,
                Some(n) => Some(StatusCodePolicy::parse(n).ok_or_else(|| {
                    Invalid::new(
                        "InvalidRetryPolicy",
                        format!(
                            "retryPolicy.statusCodePolicy '{n}' is not one of {}",
                            names_list(&StatusCodePolicy::ALL)
                        ),
                    )
                })?),
            },
        })
    }
}

impl Subscription {
    /// Parse a subscription PUT body for `topic`, named `url_name` in the URL.
    ///
    /// # Errors
    /// [`Invalid`] with a detailed code for every rule of docs/COMPATIBILITY.md §3.
    pub fn from_put(
        topic: &Topic,
        url_name: &str,
        body: Value,
        cfg: &Config,
        types: &dyn DestinationTypes,
    ) -> Result<Self, Invalid> {
        names::validate("event subscription", url_name)?;
        let mut body = lower_keys(body);
        let queue = queue::normalize(&mut body, topic.event_retention_days)?;
        let root = Obj::new(&body, "")?;
        check_name(&root, url_name)?;
        let empty = Value::Object(Map::new());
        let props = root
            .obj("properties", "properties")?
            .unwrap_or(Obj::new(&empty, "properties")?);
        check_topic(&props, topic)?;
        let dest = match &queue {
            Some(_) => None,
            None => Some(
                props
                    .obj("destination", "properties.destination")?
                    .ok_or_else(|| Role::Delivery.invalid("properties.destination is required"))?,
            ),
        };
        let (destination, mut batching, schema_hint) = match &dest {
            Some(dest) => parse_destination(dest, cfg, types)?,
            None => (queue::destination(), Batching::default(), None),
        };
        // Twin style: `deliveryPolicy` carries the batching knobs.
        if let Some(dp) = props.obj("deliverypolicy", "properties.deliveryPolicy")? {
            batching = batching.or(Batching::parse(&dp, cfg)?);
        }
        let delivery_schema = delivery_schema(&props, schema_hint, topic)?;
        if queue.is_some() && topic.input_schema != EventSchema::CloudEventV1_0 {
            return Err(Invalid::new(
                "InvalidSchema",
                format!(
                    "a Queue subscription needs a topic with inputSchema CloudEventSchemaV1_0 (this topic's is {})",
                    topic.input_schema.as_str()
                ),
            ));
        }
        let retry_policy = match props.obj("retrypolicy", "properties.retryPolicy")? {
            Some(rp) => Some(RetryPolicy::parse(&rp)?),
            None => None,
        };
        let persisted = match props.get("persistencepolicy") {
            Some(v) => parse_persisted(v)?,
            // Received events are settled one by one: a queue subscription keeps them on disk.
            None => queue.is_some() || cfg.broker.default_is_persisted,
        };
        let filter = match props.obj("filter", "properties.filter")? {
            Some(f) => Some(Filter::parse(&f, cfg.api.max_included_event_types)?),
            None => None,
        };
        let dest_props = match &dest {
            Some(d) => d.obj("properties", "properties.destination.properties")?,
            None => None,
        };
        let delivery =
            DeliveryOptions::parse(&props, dest_props.as_ref(), &destination, cfg, types)?;
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
            queue,
        })
    }

    /// Limits that apply: `retryPolicy` over the module defaults.
    pub fn effective_policy(&self, cfg: &Config) -> EffectivePolicy {
        let mut rp = self.retry_policy.clone().unwrap_or_default();
        if let Some(q) = &self.queue {
            // Receives count as attempts; the queue's own time to live.
            rp.max_delivery_attempts = Some(q.max_delivery_count);
        }
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
            dead_letter: (r.dead_letter_capacity > 0 && r.dead_letter_max_bytes > 0)
                || self.delivery.dead_letter.is_some(),
            max_attempts: rp
                .max_delivery_attempts
                .unwrap_or(cfg.broker.default_max_delivery_attempts),
            ttl: match &self.queue {
                Some(q) => q.event_ttl,
                None => rp
                    .event_expiry_in_minutes
                    .map(|m| Duration::from_secs(u64::from(m) * 60))
                    .unwrap_or(cfg.broker.default_event_ttl),
            },
        }
    }

    /// The `properties` object with secrets in clear (tests compare subscriptions by it and
    /// find the secrets to look for; a retry schedule by its old name). Never shown to anyone.
    pub fn properties(&self) -> Value {
        self.properties_with(false)
    }

    /// The `properties` object as shown to people and the cloud (GET, the module twin, logs):
    /// every secret the destinations declare is masked; a retry schedule by its wire name.
    pub fn public_properties(&self) -> Value {
        self.properties_with(true)
    }

    fn properties_with(&self, masked: bool) -> Value {
        let mut dest_props = self.destination.properties(false);
        self.batching.echo(&mut dest_props);
        let mut props = Map::new();
        self.delivery.echo(&mut dest_props, &mut props, masked);
        if masked {
            mask_properties(&mut dest_props, self.destination.secrets());
        }
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
                // Shown by its wire name; stored by the old name every release understands.
                let name = if masked { v.as_str() } else { v.old_name() };
                m.insert("schedule".into(), json!(name));
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
        match &self.queue {
            Some(q) => props.insert("deliveryConfiguration".into(), q.to_json()),
            None => props.insert(
                "destination".into(),
                json!({ "endpointType": self.destination.endpoint_type(), "properties": dest_props }),
            ),
        };
        if let Some(f) = &self.filter {
            props.insert("filter".into(), f.to_json());
        }
        Value::Object(props)
    }
}

/// The subscription resource as the API returns it.
pub fn subscription_resource(s: &Subscription, ctx: &ResourceContext) -> Value {
    json!({
        "id": format!("{}/topics/{}/eventSubscriptions/{}", ctx.id_prefix, s.topic, s.name),
        "name": s.name,
        "type": "Microsoft.EventGrid/eventSubscriptions",
        "properties": s.public_properties(),
    })
}

#[cfg(test)]
mod tests;
