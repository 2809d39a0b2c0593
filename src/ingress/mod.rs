//! MQTT sources: gridlet as an MQTT client of brokers it does not run, turning their messages
//! into events published through [`Broker::publish`] (the HTTP publish path), so filters,
//! destinations, retries, dead letters, pull queues and metrics apply unchanged (docs/MQTT.md).
//!
//! * [`route`]: a route (topic filter → gridlet topic, QoS, enrichments); filter syntax.
//! * [`message`]: an MQTT message → the event (Event Grid namespaces' CloudEvent of a routed
//!   MQTT message, or the EventGridSchema equivalent).
//! * [`source`]: one connection's driver and acceptor (manual acknowledgements after the
//!   commit, back-pressure, reconnects).
//!
//! Connections are `outbound::mqtt::connection::ConnectionSpec`s, shared with the MQTT
//! destination. Configuration is settings (`mqtt__connections__{name}__*`,
//! `mqtt__routes__{name}__*`): [`plan`] validates them (errors name the setting), [`start`]
//! runs them with those made through the management API ([`manage`], [`resource`]: the JSON
//! shape; stored in the metadata store). This module sits beside `api` and `edge`: it
//! publishes through the broker; `api` calls [`manage::Mqtt`].

pub(crate) mod manage;
pub(crate) mod message;
pub(crate) mod resource;
pub(crate) mod route;
pub(crate) mod source;

use crate::broker::Broker;
use crate::config::{Config, Instance};
use crate::model::record::MqttRecord;
use crate::model::topic::EventSchema;
use crate::outbound::mqtt::connection::{ConnectionSpec, EdgeTls, SpecError};
use route::Route;
use std::sync::Arc;

/// A setting that does not validate: the key (with the instance's name) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid setting {key}: {message}")]
pub struct SettingError {
    /// The setting's key, e.g. `mqtt__connections__plant__tls__caFile`.
    pub key: String,
    /// What is wrong (never a secret).
    pub message: String,
}

/// The validated connections, each with its routes.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Connections and the routes that subscribe on them.
    pub connections: Vec<(ConnectionSpec, Vec<Route>)>,
}

fn setting_error(inst: &Instance, field: &str, message: impl Into<String>) -> SettingError {
    SettingError {
        key: inst.key(field),
        message: message.into(),
    }
}

/// Validate the MQTT settings of `cfg` (everything but the files and the topics, which
/// [`start`] and [`check_files`] check).
///
/// # Errors
/// The first setting that does not validate, by key.
pub fn plan(cfg: &Config) -> Result<Plan, SettingError> {
    use crate::config::Key;
    let bounds = [
        (
            cfg.mqtt.connections.len(),
            cfg.mqtt.max_connections,
            Key::mqtt__maxConnections,
            "connections",
        ),
        (
            cfg.mqtt.routes.len(),
            cfg.mqtt.max_routes,
            Key::mqtt__maxRoutes,
            "routes",
        ),
    ];
    for (given, max, key, what) in bounds {
        if given > max {
            return Err(SettingError {
                key: key.name().to_string(),
                message: format!("{given} MQTT {what} are set, more than {max}"),
            });
        }
    }
    let mut plan = Plan::default();
    for inst in &cfg.mqtt.connections {
        let spec = ConnectionSpec::parse(&inst.name, &|f| inst.get(f))
            .map_err(|e| setting_error(inst, e.field, e.message))?;
        plan.connections.push((spec, Vec::new()));
    }
    for inst in &cfg.mqtt.routes {
        let r = Route::parse(&inst.name, &|f| inst.get(f))
            .map_err(|e| setting_error(inst, e.field, e.message))?;
        let Some((_, routes)) = plan
            .connections
            .iter_mut()
            .find(|(c, _)| c.name == r.connection)
        else {
            return Err(setting_error(
                inst,
                "connection",
                format!(
                    "no connection `{}` (set mqtt__connections__{}__url)",
                    r.connection, r.connection
                ),
            ));
        };
        routes.push(r);
    }
    for (spec, routes) in &plan.connections {
        if routes.is_empty() {
            return Err(SettingError {
                key: format!("mqtt__connections__{}__url", spec.name),
                message: format!(
                    "no route uses connection `{}` (set mqtt__routes__{{name}}__connection)",
                    spec.name
                ),
            });
        }
    }
    Ok(plan)
}

/// The connection's TLS configuration (files read now), errors naming the setting.
fn tls_of(
    spec: &ConnectionSpec,
    edge: &EdgeTls,
) -> Result<Option<Arc<rustls::ClientConfig>>, SettingError> {
    spec.tls_config(edge).map_err(|e| SettingError {
        key: format!(
            "mqtt__connections__{}__{}",
            spec.name,
            e.field.replace('.', "__")
        ),
        message: e.message,
    })
}

/// Check the files the plan names (CA, client certificate and key, token), as `check-config`
/// can without IoT Edge (`tls__clientIdentity=IoTEdge` is checked at start).
///
/// # Errors
/// The first unreadable or unusable file, by key.
pub fn check_files(plan: &Plan) -> Result<(), SettingError> {
    for (spec, _) in &plan.connections {
        if spec.client_identity != crate::outbound::mqtt::connection::ClientIdentity::IotEdge {
            tls_of(spec, &EdgeTls::default())?;
        }
        spec.authentication_data().map_err(|e| SettingError {
            key: format!(
                "mqtt__connections__{}__{}",
                spec.name,
                e.field.replace('.', "__")
            ),
            message: e.message,
        })?;
    }
    Ok(())
}

/// Check the routes against the broker's topics: an EventGridSchema or CustomEventSchema
/// topic takes no enrichments. A topic that does not exist is logged (not an error: under IoT
/// Edge the twin creates topics after start); its messages are held until it does.
///
/// # Errors
/// A route whose enrichments its topic cannot carry.
pub fn check_topics(plan: &Plan, broker: &Broker) -> Result<(), SettingError> {
    for (_, routes) in &plan.connections {
        for r in routes {
            let key = |f: &str| format!("mqtt__routes__{}__{f}", r.name);
            match broker.topic(&r.topic) {
                None => tracing::error!(
                    setting = %key("topic"),
                    topic = %r.topic,
                    "MQTT route to a topic that does not exist: its messages are held (unacknowledged) until the topic is created"
                ),
                Some(t) => {
                    let schema = t.topic().input_schema;
                    if schema != EventSchema::CloudEventV1_0 && !r.enrichments.is_empty() {
                        return Err(SettingError {
                            key: key("enrichments"),
                            message: format!(
                                "topic '{}' takes {}: enrichments need a CloudEventSchemaV1_0 topic",
                                r.topic,
                                schema.as_str()
                            ),
                        });
                    }
                }
            }
        }
    }
    Ok(())
}

/// A connection's field error as the setting's error.
fn spec_setting_error(connection: &str, e: &SpecError) -> SettingError {
    SettingError {
        key: format!(
            "mqtt__connections__{connection}__{}",
            e.field.replace('.', "__")
        ),
        message: e.message.clone(),
    }
}

/// The running MQTT sources; dropping it stops them. [`Sources::manager`] is what the
/// management API works on.
pub struct Sources(Arc<manage::Mqtt>);

impl Sources {
    /// The connections and routes, for the management API.
    pub fn manager(&self) -> Arc<manage::Mqtt> {
        self.0.clone()
    }
}

impl Drop for Sources {
    fn drop(&mut self) {
        self.0.stop_all();
    }
}

/// Start every connection of `plan` and every stored one (`stored`: made through the
/// management API, [`manage`]), their statuses registered with the broker's metrics.
///
/// # Errors
/// A file that cannot be read, an IoT Edge identity outside IoT Edge, an unusable route (of
/// the settings; a stored one that no longer validates is logged and left out).
pub fn start(
    plan: Plan,
    stored: Vec<MqttRecord>,
    broker: &Broker,
    edge: &EdgeTls,
) -> Result<Sources, SettingError> {
    manage::Mqtt::start(plan, stored, broker, edge).map(Sources)
}
