//! What the metadata store keeps of a topic and a subscription: typed, versioned records of
//! their own, not the API's JSON.
//!
//! A record is what the broker needs to run the subscription again, written by
//! [`Subscription::to_record`] and read by [`Subscription::from_record`] without the API parser
//! and without the settings: a subscription valid when it was created stays what it was when a
//! setting changes later (a lower `api__…` batching limit, `httpsOnly` turned on, a denied
//! range added: those rules are for new PUTs; the HTTP client still refuses a denied address
//! at connect time). The destination is the destination type's own record (its properties as
//! stored, read back by the type: `DestinationTypes::restore`); the filter is its canonical form,
//! compiled again.
//!
//! Encoding: JSON with a format version `v` ([`RECORD_VERSION`]). A record of another version,
//! or of the earlier development format (API JSON, no `v`), is refused at start-up with an error
//! naming the path ([`check_version`]; the store adds the path).
//!
//! **Adding a field** (e.g. a delivery mode with its queue settings): add it to
//! [`SubscriptionRecord`] with `#[serde(default)]` (what a record written before the field
//! existed means) and, if it is not the default, `skip_serializing_if`; set it in
//! [`Subscription::to_record`] and read it in [`Subscription::from_record`]. The version stays:
//! a record without the field is still read, with the default. Bump [`RECORD_VERSION`] only when
//! the meaning of an existing field changes.

use super::delivery_options::DeliveryOptions;
use super::destination::{DestinationRecord, DestinationTypes};
use super::filter::Filter;
use super::subscription::{Batching, RetryPolicy, Subscription};
use super::topic::{EventSchema, Topic};
use super::Invalid;
use crate::policy::{ScheduleName, StatusCodePolicy};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;

/// The record format this build writes and reads.
pub const RECORD_VERSION: u32 = 1;

/// Whether bytes hold a record this build reads: `Err` says why not (to be prefixed with where
/// the record is).
///
/// # Errors
/// Not JSON, no version (the earlier development format: API JSON), or another version.
pub fn check_version(bytes: &[u8]) -> Result<(), String> {
    #[derive(Deserialize)]
    struct Versioned {
        v: Option<u32>,
    }
    match serde_json::from_slice::<Versioned>(bytes) {
        Ok(Versioned {
            v: Some(RECORD_VERSION),
        }) => Ok(()),
        Ok(Versioned { v: Some(v) }) => Err(format!(
            "record format version {v} is not one this build reads (version {RECORD_VERSION}): \
             it was written by another gridlet release; run that release, or move the metadata \
             directory aside to start empty"
        )),
        Ok(Versioned { v: None }) => Err("record in an earlier development format (the API's \
             JSON, written before typed records; no release wrote it): move the metadata \
             directory aside (or delete it), with the events directory of the same build, and \
             create the topics and subscriptions again (the module twin re-creates its own)"
            .to_string()),
        Err(e) => Err(format!("unreadable record: {e}")),
    }
}

/// A topic as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopicRecord {
    /// Format version ([`RECORD_VERSION`]).
    pub v: u32,
    /// Name as first created.
    pub name: String,
    /// Input schema.
    pub input_schema: EventSchema,
    /// `deduplicationWindowInSeconds`, when the topic sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedup_window_secs: Option<u64>,
    /// `eventRetentionInDays`, when the topic was given one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_retention_days: Option<u32>,
}

/// `retryPolicy` as stored (names, as echoed).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RetryPolicyRecord {
    /// `eventExpiryInMinutes`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_expiry_in_minutes: Option<u32>,
    /// `maxDeliveryAttempts`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_delivery_attempts: Option<u32>,
    /// `schedule`, by its wire name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// `statusCodePolicy`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_code_policy: Option<String>,
}

/// A queue subscription's settings as stored (`deliveryConfiguration.queue`; pull delivery).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueRecord {
    /// `receiveLockDurationInSeconds`.
    pub lock_seconds: u64,
    /// `maxDeliveryCount`.
    pub max_delivery_count: u32,
    /// `eventTimeToLive`, in seconds.
    pub event_ttl_seconds: u64,
    /// `eventTimeToLive` as given (echoed as is).
    pub event_ttl_text: String,
}

/// A subscription as stored. Fields added after version 1 carry `#[serde(default)]` (see the
/// module docs). `Debug` leaves the secrets out.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubscriptionRecord {
    /// Format version ([`RECORD_VERSION`]).
    pub v: u32,
    /// Name (case kept).
    pub name: String,
    /// Topic name.
    pub topic: String,
    /// Delivery schema.
    pub delivery_schema: EventSchema,
    /// Events kept on disk.
    pub persisted: bool,
    /// `retryPolicy`, if supplied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_policy: Option<RetryPolicyRecord>,
    /// Where events go.
    pub destination: DestinationRecord,
    /// Output batching knobs as supplied.
    #[serde(default)]
    pub batching: Batching,
    /// The filter's canonical form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<Value>,
    /// `signingSecrets` (in clear).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signing_secrets: Vec<String>,
    /// `deliveryAttributeMappings`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attributes: Vec<super::attributes::DeliveryAttribute>,
    /// `deadLetterDestination`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<DestinationRecord>,
    /// A queue subscription's settings (added with pull delivery; absent: a push subscription).
    /// Its `destination` is then the queue placeholder, not restored through a destination type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueRecord>,
}

impl fmt::Debug for SubscriptionRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubscriptionRecord")
            .field("v", &self.v)
            .field("name", &self.name)
            .field("topic", &self.topic)
            .field("delivery_schema", &self.delivery_schema)
            .field("persisted", &self.persisted)
            .field("retry_policy", &self.retry_policy)
            .field("destination", &self.destination)
            .field("batching", &self.batching)
            .field("filter", &self.filter)
            .field("signing_secrets", &self.signing_secrets.len())
            .field("attributes", &self.attributes)
            .field("dead_letter", &self.dead_letter)
            .field("queue", &self.queue)
            .finish()
    }
}

fn bad_record(msg: impl Into<String>) -> Invalid {
    Invalid::new("InvalidRecord", msg.into())
}

impl Topic {
    /// The stored form.
    pub fn to_record(&self) -> TopicRecord {
        TopicRecord {
            v: RECORD_VERSION,
            name: self.name.clone(),
            input_schema: self.input_schema,
            dedup_window_secs: self.dedup_window_secs,
            event_retention_days: self.event_retention_days,
        }
    }

    /// The topic a record holds.
    pub fn from_record(r: TopicRecord) -> Self {
        Self {
            name: r.name,
            input_schema: r.input_schema,
            dedup_window_secs: r.dedup_window_secs,
            event_retention_days: r.event_retention_days,
        }
    }
}

impl Subscription {
    /// The stored form (secrets in clear; see the module docs).
    pub fn to_record(&self) -> SubscriptionRecord {
        SubscriptionRecord {
            v: RECORD_VERSION,
            name: self.name.clone(),
            topic: self.topic.clone(),
            delivery_schema: self.delivery_schema,
            persisted: self.persisted,
            retry_policy: self.retry_policy.as_ref().map(|rp| RetryPolicyRecord {
                event_expiry_in_minutes: rp.event_expiry_in_minutes,
                max_delivery_attempts: rp.max_delivery_attempts,
                schedule: rp.schedule.map(|s| s.as_str().to_string()),
                status_code_policy: rp.status_code_policy.map(|s| s.as_str().to_string()),
            }),
            destination: self.destination.to_record(),
            batching: self.batching.clone(),
            filter: self.filter.as_ref().map(Filter::to_json),
            signing_secrets: self.delivery.signing_secrets.clone(),
            attributes: self.delivery.attributes.clone(),
            dead_letter: self.delivery.dead_letter.as_ref().map(|d| d.to_record()),
            queue: self.queue.as_ref().map(|q| QueueRecord {
                lock_seconds: q.lock_duration.as_secs(),
                max_delivery_count: q.max_delivery_count,
                event_ttl_seconds: q.event_ttl.as_secs(),
                event_ttl_text: q.event_ttl_text.clone(),
            }),
        }
    }

    /// The subscription a record holds, its destinations restored by `types`. No setting is
    /// consulted: what was valid when created is restored as it was.
    ///
    /// # Errors
    /// [`Invalid`] (`InvalidRecord`) when the record names what this build does not know (a
    /// destination type, a schedule) or holds a value its type cannot read back.
    pub fn from_record(
        r: SubscriptionRecord,
        types: &dyn DestinationTypes,
    ) -> Result<Self, Invalid> {
        let retry_policy = match r.retry_policy {
            None => None,
            Some(rp) => Some(RetryPolicy {
                event_expiry_in_minutes: rp.event_expiry_in_minutes,
                max_delivery_attempts: rp.max_delivery_attempts,
                schedule: match rp.schedule {
                    None => None,
                    Some(s) => Some(
                        ScheduleName::parse(&s)
                            .ok_or_else(|| bad_record(format!("unknown retry schedule '{s}'")))?,
                    ),
                },
                status_code_policy: match rp.status_code_policy {
                    None => None,
                    Some(s) => {
                        Some(StatusCodePolicy::parse(&s).ok_or_else(|| {
                            bad_record(format!("unknown status-code policy '{s}'"))
                        })?)
                    }
                },
            }),
        };
        let restore = |d: &DestinationRecord| {
            types
                .restore(d)
                .map_err(|e| bad_record(format!("{} destination: {e}", d.endpoint_type)))
        };
        let filter = match &r.filter {
            Some(f) => Some(Filter::from_record(f)?),
            None => None,
        };
        Ok(Self {
            name: r.name,
            topic: r.topic,
            delivery_schema: r.delivery_schema,
            retry_policy,
            persisted: r.persisted,
            destination: match r.queue {
                Some(_) => super::queue::destination(),
                None => restore(&r.destination)?,
            },
            queue: r.queue.map(|q| super::queue::QueueSettings {
                lock_duration: std::time::Duration::from_secs(q.lock_seconds),
                max_delivery_count: q.max_delivery_count,
                event_ttl: std::time::Duration::from_secs(q.event_ttl_seconds),
                event_ttl_text: q.event_ttl_text,
            }),
            batching: r.batching,
            filter,
            delivery: DeliveryOptions {
                signing_secrets: r.signing_secrets,
                attributes: r.attributes,
                dead_letter: r.dead_letter.as_ref().map(restore).transpose()?,
            },
        })
    }
}

/// Which kind of MQTT resource an [`MqttRecord`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum MqttKind {
    /// A broker connection (`/mqtt/connections/{name}`).
    Connection,
    /// A route (`/mqtt/routes/{name}`).
    Route,
}

impl MqttKind {
    /// `connection` or `route`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connection => "connection",
            Self::Route => "route",
        }
    }
}

/// An MQTT connection or route made through the management API, as stored: its fields as
/// given, by their canonical names (`url`, `tls.caFile`, `topicFilter`), the secrets among them
/// (a connection's `password`) included. It is parsed again at start by the same parser as the
/// settings (`crate::ingress`). `Debug` shows the field names only, never a value.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MqttRecord {
    /// Format version ([`RECORD_VERSION`]).
    pub v: u32,
    /// Connection or route.
    pub kind: MqttKind,
    /// Its name (lower case).
    pub name: String,
    /// Field → value as given (numbers and booleans as text).
    pub fields: std::collections::BTreeMap<String, String>,
}

impl MqttRecord {
    /// The record of `kind` `name` with `fields`.
    pub fn new(
        kind: MqttKind,
        name: &str,
        fields: std::collections::BTreeMap<String, String>,
    ) -> Self {
        Self {
            v: RECORD_VERSION,
            kind,
            name: name.to_string(),
            fields,
        }
    }
}

impl fmt::Debug for MqttRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MqttRecord")
            .field("kind", &self.kind)
            .field("name", &self.name)
            .field("fields", &self.fields.keys().collect::<Vec<_>>())
            .finish()
    }
}

#[cfg(test)]
mod tests;
