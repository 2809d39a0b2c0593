//! Module twin management (docs/COMPATIBILITY.md §3.6): topics and subscriptions from desired properties,
//! the broker's state and errors as reported properties, over the edgeHub connection.
//!
//! * On every new MQTT session the full twin is requested (`$iothub/twin/GET/?$rid=`), answered
//!   on `$iothub/twin/res/{status}/?$rid=…`; desired patches arrive on
//!   `$iothub/twin/PATCH/properties/desired/?$version=…`.
//! * `desired.topics.{name}`: topic properties (`{}` or `{"inputSchema": …}`); `null` deletes the
//!   topic. `desired.eventSubscriptions.{name}`: subscription properties including `topic`;
//!   arrays may be JSON strings (twins have no arrays). Deleting a subscription through the twin
//!   is not supported (as in the original): it is reported as an error.
//! * `desired.mqtt.connections.{name}` / `desired.mqtt.routes.{name}`: the `properties` of the
//!   management API's MQTT resources; `null` deletes (docs/IOT_EDGE.md).
//! * Everything goes through the broker's own `put_topic`/`put_subscription` and the management
//!   API's `ingress::manage` operations, so validation and persistence are exactly the REST API's.
//! * Reported: `topics`, `eventSubscriptions` (every topic/subscription the broker holds, arrays
//!   as JSON strings, every secret a destination declares masked), `mqtt` (connections and
//!   routes, the password masked) and `errors` (`bootupMessage`, `bootupException`, `topics`,
//!   `eventSubscriptions`, `mqtt.connections`, `mqtt.routes`:
//!   `HttpStatusCode='…' ErrorCode='…' Message='…'`). Only the difference
//!   to what was last reported is sent; removed entries are sent as `null`.

use super::edgehub::{EdgeHub, HubMessage};
use crate::broker::{Broker, BrokerError};
use crate::error::ApiError;
use crate::ingress::manage::{ManageError, Mqtt, View};
use crate::model::topic::Topic;
use crate::model::Invalid;
use bytes::Bytes;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::mpsc;

const TWIN_RES: &str = "$iothub/twin/res/";
const DESIRED_PATCH: &str = "$iothub/twin/PATCH/properties/desired/";

/// Errors from applying desired properties, by name.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct TwinErrors {
    /// Topic name → error text.
    pub topics: BTreeMap<String, String>,
    /// Subscription name → error text.
    pub subscriptions: BTreeMap<String, String>,
    /// MQTT connection name → error text.
    pub mqtt_connections: BTreeMap<String, String>,
    /// MQTT route name → error text.
    pub mqtt_routes: BTreeMap<String, String>,
    /// Set when the desired document itself is unusable.
    pub bootup_exception: String,
}

/// The original's error text: `HttpStatusCode='BadRequest' ErrorCode='…' Message='…'`, with the
/// status and code the REST API would answer (the API's error table).
pub fn error_text(e: &BrokerError) -> String {
    api_error_text(&ApiError::from_broker(e))
}

/// [`error_text`] for an MQTT connection or route: what the management API would answer.
pub fn manage_error_text(e: ManageError) -> String {
    api_error_text(&ApiError::from(e))
}

fn api_error_text(e: &ApiError) -> String {
    let body = e.body();
    let status = body
        .pointer("/error/code")
        .and_then(Value::as_str)
        .unwrap_or("Error")
        .to_string();
    format!(
        "HttpStatusCode='{status}' ErrorCode='{}' Message='{}'",
        e.detail, e.message
    )
}

fn get_ci<'a>(m: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    m.iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(key))
        .map(|(_, v)| v)
}

/// Apply a desired document or patch to the broker. Entries it names have their previous errors
/// replaced; entries it does not name keep theirs.
pub fn apply_desired(broker: &Broker, desired: &Value, errors: &mut TwinErrors) {
    let Some(d) = desired.as_object() else {
        errors.bootup_exception = "desired properties are not a JSON object".into();
        return;
    };
    let mut deletions = Vec::new();
    if let Some(topics) = get_ci(d, "topics").and_then(Value::as_object) {
        for (name, props) in topics.iter().filter(|(k, _)| !k.starts_with('$')) {
            errors.topics.remove(name);
            if props.is_null() {
                deletions.push(name.clone());
                continue;
            }
            let result = Topic::from_put(name, json!({ "properties": props }))
                .map_err(BrokerError::from)
                .and_then(|t| broker.put_topic(t));
            match result {
                Ok(_) => tracing::info!(topic = %name, "topic applied from the module twin"),
                Err(e) => {
                    tracing::warn!(topic = %name, error = %e, "twin topic rejected");
                    errors.topics.insert(name.clone(), error_text(&e));
                }
            }
        }
    }
    if let Some(subs) = get_ci(d, "eventSubscriptions").and_then(Value::as_object) {
        for (name, props) in subs.iter().filter(|(k, _)| !k.starts_with('$')) {
            errors.subscriptions.remove(name);
            if let Err(e) = apply_subscription(broker, name, props) {
                tracing::warn!(subscription = %name, error = %e, "twin subscription rejected");
                errors.subscriptions.insert(name.clone(), error_text(&e));
            } else {
                tracing::info!(subscription = %name, "subscription applied from the module twin");
            }
        }
    }
    for name in deletions {
        match broker.delete_topic(&name) {
            Ok(()) => tracing::info!(topic = %name, "topic deleted through the module twin"),
            Err(BrokerError::TopicNotFound { .. }) => {}
            Err(e) => {
                errors.topics.insert(name, error_text(&e));
            }
        }
    }
}

fn apply_subscription(broker: &Broker, name: &str, props: &Value) -> Result<(), BrokerError> {
    let Some(p) = props.as_object() else {
        return Err(Invalid::new(
            "InvalidRequest",
            "deleting event subscriptions through the module twin is not supported; use the REST API",
        )
        .into());
    };
    let topic = get_ci(p, "topic")
        .or_else(|| get_ci(p, "topicName"))
        .and_then(Value::as_str)
        .ok_or_else(|| {
            Invalid::new(
                "InvalidRequest",
                "a twin event subscription needs \"topic\" naming its topic",
            )
        })?;
    broker
        .put_subscription(topic, name, json!({ "properties": props }))
        .map(|_| ())
}

/// The named entries of `desired.mqtt.{section}` (`$` metadata left out).
fn mqtt_section<'a>(desired: &'a Value, section: &str) -> Vec<(&'a String, &'a Value)> {
    desired
        .as_object()
        .and_then(|d| get_ci(d, "mqtt"))
        .and_then(Value::as_object)
        .and_then(|m| get_ci(m, section))
        .and_then(Value::as_object)
        .map(|o| o.iter().filter(|(k, _)| !k.starts_with('$')).collect())
        .unwrap_or_default()
}

/// Apply `desired.mqtt.connections` and `desired.mqtt.routes` through the management API's own
/// operations ([`Mqtt::put_connection`], …): the same validation, store records and restarts.
/// Puts go first (connections, then routes), then deletions (`null`: routes, then connections),
/// so one document can move routes and remove what they left. Entries it names have their
/// previous errors replaced. Error texts never hold a secret ([`ManageError`]).
pub async fn apply_mqtt(mqtt: &Mqtt, desired: &Value, errors: &mut TwinErrors) {
    let connections = mqtt_section(desired, "connections");
    let routes = mqtt_section(desired, "routes");
    for (name, props) in connections.iter().filter(|(_, p)| !p.is_null()) {
        errors.mqtt_connections.remove(*name);
        match mqtt
            .put_connection(name, &json!({ "properties": props }))
            .await
        {
            Ok(_) => {
                tracing::info!(connection = %name, "MQTT connection applied from the module twin")
            }
            Err(e) => {
                tracing::warn!(connection = %name, error = %e, "twin MQTT connection rejected");
                errors
                    .mqtt_connections
                    .insert(name.to_string(), manage_error_text(e));
            }
        }
    }
    for (name, props) in routes.iter().filter(|(_, p)| !p.is_null()) {
        errors.mqtt_routes.remove(*name);
        match mqtt.put_route(name, &json!({ "properties": props })).await {
            Ok(_) => tracing::info!(route = %name, "MQTT route applied from the module twin"),
            Err(e) => {
                tracing::warn!(route = %name, error = %e, "twin MQTT route rejected");
                errors
                    .mqtt_routes
                    .insert(name.to_string(), manage_error_text(e));
            }
        }
    }
    for (name, _) in routes.iter().filter(|(_, p)| p.is_null()) {
        errors.mqtt_routes.remove(*name);
        match mqtt.delete_route(name).await {
            Ok(()) => tracing::info!(route = %name, "MQTT route deleted through the module twin"),
            Err(ManageError::NotFound { .. }) => {}
            Err(e) => {
                errors
                    .mqtt_routes
                    .insert(name.to_string(), manage_error_text(e));
            }
        }
    }
    for (name, _) in connections.iter().filter(|(_, p)| p.is_null()) {
        errors.mqtt_connections.remove(*name);
        match mqtt.delete_connection(name).await {
            Ok(()) => {
                tracing::info!(connection = %name, "MQTT connection deleted through the module twin")
            }
            Err(ManageError::NotFound { .. }) => {}
            Err(e) => {
                errors
                    .mqtt_connections
                    .insert(name.to_string(), manage_error_text(e));
            }
        }
    }
}

/// The reported `mqtt` section: every connection and route gridlet runs (settings and API), as
/// the management API's GET shows them (secrets masked), with `managedBy`.
pub fn reported_mqtt(mqtt: &Mqtt) -> Value {
    let entries = |views: Vec<View>| -> Map<String, Value> {
        views
            .into_iter()
            .map(|v| {
                let mut p = v.properties;
                p.insert("managedBy".into(), v.origin.as_str().into());
                (v.name, twin_safe(Value::Object(p)))
            })
            .collect()
    };
    json!({
        "connections": entries(mqtt.connections()),
        "routes": entries(mqtt.routes()),
    })
}

/// Twins have no arrays: encode them as JSON strings. Apply to properties whose secrets are
/// already masked ([`crate::model::subscription::Subscription::public_properties`]): once an
/// array is a string, its secrets can no longer be found.
fn twin_safe(v: Value) -> Value {
    match v {
        Value::Array(a) => Value::String(Value::Array(a).to_string()),
        Value::Object(m) => Value::Object(m.into_iter().map(|(k, v)| (k, twin_safe(v))).collect()),
        other => other,
    }
}

/// The full reported document for the broker's current state.
pub fn reported(broker: &Broker, errors: &TwinErrors) -> Value {
    let mut topics = Map::new();
    let mut subs = Map::new();
    for t in broker.topics() {
        let topic = t.topic();
        topics.insert(
            topic.name.clone(),
            json!({ "inputSchema": topic.input_schema.as_str() }),
        );
        for s in t.subscriptions().iter() {
            let cfg = s.config();
            subs.insert(cfg.sub.name.clone(), twin_safe(cfg.sub.public_properties()));
        }
    }
    json!({
        "topics": topics,
        "eventSubscriptions": subs,
        "errors": {
            "bootupMessage": "",
            "bootupException": errors.bootup_exception,
            "topics": errors.topics,
            "eventSubscriptions": errors.subscriptions,
            "mqtt": {
                "connections": errors.mqtt_connections,
                "routes": errors.mqtt_routes,
            },
        }
    })
}

/// The JSON merge patch turning `old` into `new` (`null` removes); `None` when equal.
pub fn diff(old: &Value, new: &Value) -> Option<Value> {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut patch = Map::new();
            for (k, nv) in n {
                match o.get(k) {
                    Some(ov) => {
                        if let Some(p) = diff(ov, nv) {
                            patch.insert(k.clone(), p);
                        }
                    }
                    None => {
                        patch.insert(k.clone(), nv.clone());
                    }
                }
            }
            for k in o
                .keys()
                .filter(|k| !n.contains_key(*k) && !k.starts_with('$'))
            {
                patch.insert(k.clone(), Value::Null);
            }
            (!patch.is_empty()).then_some(Value::Object(patch))
        }
        (o, n) if o == n => None,
        (_, n) => Some(n.clone()),
    }
}

/// `$iothub/twin/res/{status}/?$rid={rid}&…` → (status, rid).
fn parse_response_topic(topic: &str) -> Option<(u16, String)> {
    let rest = topic.strip_prefix(TWIN_RES)?;
    let (status, query) = rest.split_once('/')?;
    let status = status.parse().ok()?;
    let rid = query
        .trim_start_matches('?')
        .split('&')
        .find_map(|kv| kv.strip_prefix("$rid="))
        .unwrap_or_default()
        .to_string();
    Some((status, rid))
}

/// The twin task's state.
pub struct TwinManager {
    broker: Broker,
    mqtt: Arc<Mqtt>,
    hub: EdgeHub,
    errors: TwinErrors,
    last_reported: Value,
    next_rid: u64,
    pending_get: Option<String>,
}

impl TwinManager {
    /// A manager applying the twin to `broker` and its MQTT sources `mqtt` through `hub`.
    pub fn new(broker: Broker, mqtt: Arc<Mqtt>, hub: EdgeHub) -> Self {
        Self {
            broker,
            mqtt,
            hub,
            errors: TwinErrors::default(),
            last_reported: json!({}),
            next_rid: 1,
            pending_get: None,
        }
    }

    fn rid(&mut self) -> String {
        let r = self.next_rid.to_string();
        self.next_rid += 1;
        r
    }

    fn request_twin(&mut self) {
        let rid = self.rid();
        let topic = format!("$iothub/twin/GET/?$rid={rid}");
        match self.hub.publish_nowait(topic, Bytes::new()) {
            Ok(()) => self.pending_get = Some(rid),
            Err(e) => tracing::warn!(error = %e, "cannot request the module twin"),
        }
    }

    fn report(&mut self) {
        let mut now = reported(&self.broker, &self.errors);
        now["mqtt"] = reported_mqtt(&self.mqtt);
        let Some(patch) = diff(&self.last_reported, &now) else {
            return;
        };
        let rid = self.rid();
        let topic = format!("$iothub/twin/PATCH/properties/reported/?$rid={rid}");
        match self
            .hub
            .publish_nowait(topic, Bytes::from(patch.to_string()))
        {
            Ok(()) => self.last_reported = now,
            Err(e) => tracing::warn!(error = %e, "cannot report twin properties"),
        }
    }

    /// Handle one message from edgeHub: the desired document or patch it brings, if any.
    fn handle(&mut self, m: HubMessage) -> Option<Value> {
        match m {
            HubMessage::Connected => {
                self.request_twin();
                None
            }
            HubMessage::Publish { topic, payload } => {
                if let Some((status, rid)) = parse_response_topic(&topic) {
                    if self.pending_get.as_deref() == Some(rid.as_str()) {
                        self.pending_get = None;
                        return self.on_full_twin(status, &payload);
                    } else if !(200..300).contains(&status) {
                        tracing::warn!(status, rid = %rid, "edgeHub refused a twin request");
                    }
                } else if topic.starts_with(DESIRED_PATCH) {
                    match serde_json::from_slice::<Value>(&payload) {
                        Ok(patch) => return Some(patch),
                        Err(e) => {
                            tracing::warn!(error = %e, "desired-properties patch is not JSON")
                        }
                    }
                }
                None
            }
        }
    }

    fn on_full_twin(&mut self, status: u16, payload: &[u8]) -> Option<Value> {
        if status != 200 {
            tracing::warn!(status, "edgeHub refused the module twin request");
            return None;
        }
        let twin: Value = match serde_json::from_slice(payload) {
            Ok(v) => v,
            Err(e) => {
                self.errors.bootup_exception = format!("module twin is not JSON: {e}");
                self.report();
                return None;
            }
        };
        self.errors.bootup_exception.clear();
        // What the cloud holds now is the base of the next patch.
        self.last_reported = twin.get("reported").cloned().unwrap_or_else(|| json!({}));
        if let Some(Value::Object(m)) = &mut Some(&mut self.last_reported) {
            m.retain(|k, _| !k.starts_with('$'));
        }
        Some(twin.get("desired").cloned().unwrap_or_else(|| json!({})))
    }

    /// Apply a desired document or patch: topics and subscriptions on tokio's blocking pool
    /// (they write and flush the metadata store, see [`Broker::manage`]), then MQTT connections
    /// and routes through the management API's operations; then report.
    async fn apply(&mut self, desired: Value) -> Result<(), tokio::task::JoinError> {
        let broker = self.broker.clone();
        let mut errors = std::mem::take(&mut self.errors);
        let (desired, mut errors) = tokio::task::spawn_blocking(move || {
            apply_desired(&broker, &desired, &mut errors);
            (desired, errors)
        })
        .await?;
        apply_mqtt(&self.mqtt, &desired, &mut errors).await;
        self.errors = errors;
        self.report();
        Ok(())
    }

    /// Serve messages until the connection side goes away.
    pub async fn run(mut self, mut rx: mpsc::Receiver<HubMessage>) {
        while let Some(m) = rx.recv().await {
            let Some(desired) = self.handle(m) else {
                continue;
            };
            if let Err(e) = self.apply(desired).await {
                tracing::error!(error = %e, "module twin handler failed; twin updates stop");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_sends_changes_and_nulls_removed_entries() {
        let old =
            json!({"topics": {"a": {"inputSchema": "EventGridSchema"}, "b": {}}, "$version": 3});
        let new = json!({"topics": {"a": {"inputSchema": "EventGridSchema"}, "c": {}}});
        assert_eq!(
            diff(&old, &new),
            Some(json!({"topics": {"b": null, "c": {}}}))
        );
        assert_eq!(diff(&new, &new), None);
    }

    #[test]
    fn arrays_become_strings() {
        // Secrets are masked before (`public_properties`; tests/it/secrets.rs checks the twin).
        let v = twin_safe(json!({"filter": {"includedEventTypes": ["a", "b"]},
            "destination": {"properties": {"sasKey": null, "topicName": "t"}}}));
        assert_eq!(v["filter"]["includedEventTypes"], "[\"a\",\"b\"]");
        assert!(v["destination"]["properties"]["sasKey"].is_null());
        assert_eq!(v["destination"]["properties"]["topicName"], "t");
    }

    #[test]
    fn response_topics_parse() {
        assert_eq!(
            parse_response_topic("$iothub/twin/res/200/?$rid=7"),
            Some((200, "7".to_string()))
        );
        assert_eq!(
            parse_response_topic("$iothub/twin/res/204/?$rid=8&$version=4"),
            Some((204, "8".to_string()))
        );
        assert_eq!(parse_response_topic("$iothub/twin/PATCH/x"), None);
    }

    #[test]
    fn error_text_has_the_original_shape() {
        let e = BrokerError::Invalid(Invalid::new("InvalidDestination", "bad url"));
        assert_eq!(
            error_text(&e),
            "HttpStatusCode='BadRequest' ErrorCode='InvalidDestination' Message='bad url'"
        );
    }
}
