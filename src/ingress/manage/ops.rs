//! The management API's operations on MQTT connections and routes (see [`super`]): validate,
//! store, apply; one at a time.

use super::{
    check_name, invalid, new_connection, spec_invalid, stop, ManageError, Mqtt, Origin, RouteEntry,
    View,
};
use crate::ingress::resource::{self, Fields};
use crate::ingress::route::{self, Route};
use crate::model::record::{MqttKind, MqttRecord};
use crate::model::topic::EventSchema;
use crate::outbound::mqtt::connection::{ConnectionSpec, FIELDS};

impl Mqtt {
    /// 400 when a new `name` would pass the bound on connections or routes.
    fn within_bound(&self, kind: MqttKind, name: &str) -> Result<(), ManageError> {
        use crate::config::Key;
        let cfg = &self.broker.config().mqtt;
        let st = self.lock();
        let (exists, count, max, key) = match kind {
            MqttKind::Connection => (
                st.connections.contains_key(name),
                st.connections.len(),
                cfg.max_connections,
                Key::mqtt__maxConnections,
            ),
            MqttKind::Route => (
                st.routes.contains_key(name),
                st.routes.len(),
                cfg.max_routes,
                Key::mqtt__maxRoutes,
            ),
        };
        if !exists && count >= max {
            return Err(ManageError::LimitExceeded {
                kind,
                max,
                setting: key.name(),
            });
        }
        Ok(())
    }

    /// 400 when the settings define `name`.
    fn writable(&self, kind: MqttKind, name: &str) -> Result<(), ManageError> {
        let st = self.lock();
        let origin = match kind {
            MqttKind::Connection => st.connections.get(name).map(|c| c.origin),
            MqttKind::Route => st.routes.get(name).map(|r| r.origin),
        };
        match origin {
            Some(Origin::Settings) => Err(ManageError::DefinedBySettings {
                kind,
                name: name.to_string(),
            }),
            _ => Ok(()),
        }
    }

    async fn persist(
        &self,
        kind: MqttKind,
        name: &str,
        fields: Option<Fields>,
    ) -> Result<(), ManageError> {
        let name = name.to_string();
        self.broker
            .manage(move |b| {
                let rec = fields.map(|f| MqttRecord::new(kind, &name, f));
                b.put_mqtt_record(kind, &name, rec.as_ref())
            })
            .await?;
        Ok(())
    }

    /// `PUT /mqtt/connections/{name}`: create or replace an API connection, then (re)start it.
    ///
    /// # Errors
    /// See the module docs; nothing changes on an error.
    pub async fn put_connection(
        &self,
        name: &str,
        body: &serde_json::Value,
    ) -> Result<View, ManageError> {
        let kind = MqttKind::Connection;
        let name = check_name(kind, name)?;
        let fields =
            resource::fields(body, FIELDS).map_err(|e| invalid(kind, e.path, e.message))?;
        let _op = self.ops.lock().await;
        self.writable(kind, &name)?;
        self.within_bound(kind, &name)?;
        let spec =
            ConnectionSpec::parse(&name, &|f| fields.get(f).cloned()).map_err(spec_invalid)?;
        spec.tls_config(&self.edge).map_err(spec_invalid)?;
        spec.authentication_data().map_err(spec_invalid)?;
        self.check_address(&spec)?;
        if let Some(other) = self.lock().connections.iter().find(|(n, c)| {
            **n != name && c.spec.endpoint == spec.endpoint && c.spec.client_id == spec.client_id
        }) {
            return Err(invalid(
                kind,
                "properties.clientId",
                format!(
                    "`{}` is connection '{}''s client id on the same broker: the broker would end one session for the other",
                    spec.client_id, other.0
                ),
            ));
        }
        let unchanged = self
            .lock()
            .connections
            .get(&name)
            // One that could not start (a file missing then) is started again.
            .is_some_and(|c| c.fields == fields && c.live.is_some());
        if !unchanged {
            self.persist(kind, &name, Some(fields.clone())).await?;
            {
                let mut st = self.lock();
                match st.connections.get_mut(&name) {
                    Some(c) => {
                        c.spec = spec;
                        c.fields = fields;
                    }
                    None => {
                        let c = new_connection(spec, fields, Origin::Api);
                        self.broker
                            .register_mqtt_connection(&name, c.status.clone());
                        st.connections.insert(name.clone(), c);
                    }
                }
            }
            self.restart(&name).await;
            tracing::info!(connection = %name, "MQTT connection set through the management API");
        }
        self.connection(&name)
    }

    /// An address literal in `outbound__deniedAddressRanges` is refused, as for a destination.
    fn check_address(&self, spec: &ConnectionSpec) -> Result<(), ManageError> {
        let Ok(ip) = spec.endpoint.host.parse::<std::net::IpAddr>() else {
            return Ok(());
        };
        let denied = &self.broker.config().outbound.denied_ranges;
        match denied.iter().find(|r| r.contains(ip)) {
            Some(r) => Err(invalid(
                MqttKind::Connection,
                "properties.url",
                format!(
                    "{ip} is in the denied range {r} ({})",
                    crate::config::Key::outbound__deniedAddressRanges.name()
                ),
            )),
            None => Ok(()),
        }
    }

    /// `DELETE /mqtt/connections/{name}`: stop and forget an API connection no route uses.
    ///
    /// # Errors
    /// Not found, defined by settings, or used by routes.
    pub async fn delete_connection(&self, name: &str) -> Result<(), ManageError> {
        let kind = MqttKind::Connection;
        let name = name.to_ascii_lowercase();
        let _op = self.ops.lock().await;
        {
            let st = self.lock();
            if !st.connections.contains_key(&name) {
                return Err(ManageError::NotFound { kind, name });
            }
            let routes: Vec<String> = st
                .routes
                .iter()
                .filter(|(_, r)| r.route.connection == name)
                .map(|(n, _)| n.clone())
                .collect();
            drop(st);
            self.writable(kind, &name)?;
            if !routes.is_empty() {
                return Err(ManageError::InUse { name, routes });
            }
        }
        self.persist(kind, &name, None).await?;
        let live = self
            .lock()
            .connections
            .remove(&name)
            .and_then(|mut c| c.live.take());
        stop(live).await;
        self.broker.unregister_mqtt_connection(&name);
        tracing::info!(connection = %name, "MQTT connection deleted through the management API");
        Ok(())
    }

    /// `PUT /mqtt/routes/{name}`: create or replace an API route, then restart the
    /// connection(s) it is and was on.
    ///
    /// # Errors
    /// See the module docs; nothing changes on an error.
    pub async fn put_route(
        &self,
        name: &str,
        body: &serde_json::Value,
    ) -> Result<View, ManageError> {
        let kind = MqttKind::Route;
        let name = check_name(kind, name)?;
        let fields =
            resource::fields(body, route::FIELDS).map_err(|e| invalid(kind, e.path, e.message))?;
        let _op = self.ops.lock().await;
        self.writable(kind, &name)?;
        self.within_bound(kind, &name)?;
        let r = Route::parse(&name, &|f| fields.get(f).cloned())
            .map_err(|e| invalid(kind, format!("properties.{}", e.field), e.message))?;
        if !self.lock().connections.contains_key(&r.connection) {
            return Err(invalid(
                kind,
                "properties.connection",
                format!(
                    "no connection '{}' (PUT /mqtt/connections/{} first)",
                    r.connection, r.connection
                ),
            ));
        }
        let Some(topic) = self.broker.topic(&r.topic) else {
            return Err(invalid(
                kind,
                "properties.topic",
                format!("topic '{}' does not exist (create it first)", r.topic),
            ));
        };
        let schema = topic.topic().input_schema;
        if schema != EventSchema::CloudEventV1_0 && !r.enrichments.is_empty() {
            return Err(invalid(
                kind,
                "properties.enrichments",
                format!(
                    "topic '{}' takes {}: enrichments need a CloudEventSchemaV1_0 topic",
                    r.topic,
                    schema.as_str()
                ),
            ));
        }
        let unchanged = self
            .lock()
            .routes
            .get(&name)
            .is_some_and(|e| e.fields == fields);
        if !unchanged {
            self.persist(kind, &name, Some(fields.clone())).await?;
            let connection = r.connection.clone();
            let previous = {
                let mut st = self.lock();
                let entry = RouteEntry {
                    fields,
                    origin: Origin::Api,
                    route: r,
                };
                let old = st.routes.insert(name.clone(), entry).map(|o| o.route);
                if let Some(o) = &old {
                    if let Some(c) = st.connections.get_mut(&o.connection) {
                        c.forget.push(o.filter.clone());
                    }
                }
                old.map(|o| o.connection)
            };
            self.restart(&connection).await;
            if let Some(p) = previous.filter(|p| *p != connection) {
                self.restart(&p).await;
            }
            tracing::info!(route = %name, "MQTT route set through the management API");
        }
        self.route(&name)
    }

    /// `DELETE /mqtt/routes/{name}`: forget an API route; its connection restarts without it
    /// and unsubscribes its filter.
    ///
    /// # Errors
    /// Not found, or defined by settings.
    pub async fn delete_route(&self, name: &str) -> Result<(), ManageError> {
        let kind = MqttKind::Route;
        let name = name.to_ascii_lowercase();
        let _op = self.ops.lock().await;
        if !self.lock().routes.contains_key(&name) {
            return Err(ManageError::NotFound { kind, name });
        }
        self.writable(kind, &name)?;
        self.persist(kind, &name, None).await?;
        let connection = {
            let mut st = self.lock();
            let old = st.routes.remove(&name).map(|e| e.route);
            if let Some(o) = &old {
                if let Some(c) = st.connections.get_mut(&o.connection) {
                    c.forget.push(o.filter.clone());
                }
            }
            old.map(|o| o.connection)
        };
        if let Some(c) = connection {
            self.restart(&c).await;
        }
        tracing::info!(route = %name, "MQTT route deleted through the management API");
        Ok(())
    }
}
