//! MQTT connections and routes at runtime: those of the settings and those made through the
//! management API (`/mqtt/connections/{name}`, `/mqtt/routes/{name}`, docs/MQTT.md), each
//! connection's source task, and the API's operations on them.
//!
//! * **Settings win.** A name the settings define is read-only through the API (a PUT or DELETE
//!   of it is a 400 naming the setting); a stored record whose name a setting now takes is not
//!   used (logged at start, kept in the store).
//! * **Validated first, nothing changes on a 400**: the same parsers as the settings
//!   (`ConnectionSpec::parse`, `Route::parse`), then what only the running broker knows: the
//!   files (CA, client certificate, token), the IoT Edge identity, a denied address, a client id
//!   another connection to the same broker uses, the route's connection and gridlet topic.
//! * **Stored, then applied**: the record is written to the metadata store (flushed) before the
//!   live connection changes, so an answered PUT or DELETE survives a crash.
//! * **A change restarts the connection** it touches: the old task is stopped (aborted and
//!   awaited) before the new one connects with the same client id. Messages it had not
//!   acknowledged stay with the broker's session, which the new connection resumes: the broker
//!   sends them again (at least once; nothing it took is lost). A route's filter removed from a
//!   connection is unsubscribed at its next connects.
//! * Management operations ([`ops`]: PUT and DELETE) run one at a time; the state lock is never
//!   held across an await.

use super::resource::{self, Fields};
use super::route::{self, Route};
use super::source::Source;
use super::{Plan, SettingError};
use crate::broker::{Broker, BrokerError};
use crate::metrics::MqttConnectionMetrics;
use crate::model::record::{MqttKind, MqttRecord};
use crate::outbound::mqtt::connection::{ConnectionSpec, EdgeTls, SpecError, FIELDS};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::task::JoinHandle;

pub use crate::outbound::mqtt::connection::SECRET_FIELDS;

mod ops;

/// Who defines a connection or route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Settings (`mqtt__connections__{name}__*`): read-only through the API.
    Settings,
    /// The management API (stored in the metadata store).
    Api,
}

impl Origin {
    /// `settings` or `api`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Settings => "settings",
            Self::Api => "api",
        }
    }
}

/// Why a management operation on MQTT connections or routes was refused.
#[derive(Debug, thiserror::Error)]
pub enum ManageError {
    /// Bad input: the JSON path of the field (`properties.tls.caFile`) and why.
    #[error("{path}: {message}")]
    Invalid {
        /// Connection or route.
        kind: MqttKind,
        /// The field's JSON path.
        path: String,
        /// Why (never a secret).
        message: String,
    },
    /// No such connection or route.
    #[error("no MQTT {} named '{name}'", kind.as_str())]
    NotFound {
        /// Connection or route.
        kind: MqttKind,
        /// The name asked for.
        name: String,
    },
    /// The settings define it.
    #[error("MQTT {} '{name}' is defined by settings (mqtt__{}s__{name}__*): change it there", kind.as_str(), kind.as_str())]
    DefinedBySettings {
        /// Connection or route.
        kind: MqttKind,
        /// Its name.
        name: String,
    },
    /// A connection that routes still use.
    #[error("connection '{name}' is used by route(s) {}: delete them or move them to another connection first", routes.join(", "))]
    InUse {
        /// The connection.
        name: String,
        /// The routes on it.
        routes: Vec<String>,
    },
    /// A new one past `mqtt__maxConnections` or `mqtt__maxRoutes`.
    #[error("at most {max} MQTT {}s (settings and API together; {setting})", kind.as_str())]
    LimitExceeded {
        /// Connection or route.
        kind: MqttKind,
        /// The bound.
        max: usize,
        /// The setting.
        setting: &'static str,
    },
    /// The store could not keep the change (nothing changed).
    #[error(transparent)]
    Broker(#[from] BrokerError),
}

fn invalid(kind: MqttKind, path: impl Into<String>, message: impl Into<String>) -> ManageError {
    ManageError::Invalid {
        kind,
        path: path.into(),
        message: message.into(),
    }
}

fn spec_invalid(e: SpecError) -> ManageError {
    invalid(
        MqttKind::Connection,
        format!("properties.{}", e.field),
        e.message,
    )
}

/// A connection or route as the API shows it.
#[derive(Debug, Clone)]
pub struct View {
    /// Its name (lower case).
    pub name: String,
    /// Who defines it.
    pub origin: Origin,
    /// Its properties, secrets masked (`null`).
    pub properties: serde_json::Map<String, serde_json::Value>,
    /// A connection's status.
    pub status: Option<Arc<MqttConnectionMetrics>>,
}

struct Connection {
    fields: Fields,
    origin: Origin,
    spec: ConnectionSpec,
    status: Arc<MqttConnectionMetrics>,
    /// Filters of routes that left this connection: unsubscribed at its next connects.
    forget: Vec<String>,
    live: Option<JoinHandle<()>>,
}

struct RouteEntry {
    fields: Fields,
    origin: Origin,
    route: Route,
}

#[derive(Default)]
struct State {
    connections: BTreeMap<String, Connection>,
    routes: BTreeMap<String, RouteEntry>,
    /// Set when gridlet stops: nothing is started any more.
    stopped: bool,
}

/// The MQTT sources of a running gridlet and their management.
pub struct Mqtt {
    broker: Broker,
    edge: EdgeTls,
    ops: tokio::sync::Mutex<()>,
    state: Mutex<State>,
}

/// A connection or route name: what a setting's instance name may be (letters, digits, `-`,
/// single `_`; case-insensitive, kept in lower case), at most 64 characters.
fn check_name(kind: MqttKind, name: &str) -> Result<String, ManageError> {
    let ok = !name.is_empty()
        && name.len() <= crate::model::names::MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && !name.contains("__");
    if !ok {
        return Err(invalid(
            kind,
            "name",
            format!(
                "a {} name is 1 to {} letters, digits, '-' and single '_'",
                kind.as_str(),
                crate::model::names::MAX_NAME_LEN
            ),
        ));
    }
    Ok(name.to_ascii_lowercase())
}

/// Stop a source task and wait until it has stopped (its socket closed).
async fn stop(live: Option<JoinHandle<()>>) {
    if let Some(h) = live {
        h.abort();
        let _ = h.await;
    }
}

impl Mqtt {
    /// The settings' connections and routes (`plan`, validated) and the stored ones (`stored`),
    /// each connection started.
    ///
    /// # Errors
    /// A setting whose files cannot be read or whose route cannot carry its enrichments.
    pub fn start(
        plan: Plan,
        stored: Vec<MqttRecord>,
        broker: &Broker,
        edge: &EdgeTls,
    ) -> Result<Arc<Self>, SettingError> {
        super::check_topics(&plan, broker)?;
        let cfg = broker.config();
        let given = |family: &[crate::config::Instance], name: &str, names: &[&str]| -> Fields {
            family
                .iter()
                .find(|i| i.name == name)
                .map(|i| {
                    names
                        .iter()
                        .filter_map(|f| i.get(f).map(|v| (f.to_string(), v)))
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut st = State::default();
        for (spec, routes) in plan.connections {
            super::tls_of(&spec, edge)?;
            spec.authentication_data()
                .map_err(|e| super::spec_setting_error(&spec.name, &e))?;
            for r in routes {
                let fields = given(&cfg.mqtt.routes, &r.name, route::FIELDS);
                st.routes.insert(
                    r.name.clone(),
                    RouteEntry {
                        fields,
                        origin: Origin::Settings,
                        route: r,
                    },
                );
            }
            let fields = given(&cfg.mqtt.connections, &spec.name, FIELDS);
            st.connections.insert(
                spec.name.clone(),
                new_connection(spec, fields, Origin::Settings),
            );
        }
        let me = Self {
            broker: broker.clone(),
            edge: edge.clone(),
            ops: tokio::sync::Mutex::new(()),
            state: Mutex::new(State::default()),
        };
        me.restore(&mut st, stored);
        for (name, c) in &st.connections {
            broker.register_mqtt_connection(name, c.status.clone());
        }
        let names: Vec<String> = st.connections.keys().cloned().collect();
        for name in names {
            me.launch(&mut st, &name);
        }
        *me.lock() = st;
        Ok(Arc::new(me))
    }

    /// Add the stored connections and routes the settings do not shadow. One that no longer
    /// validates is logged and left out (and left in the store).
    fn restore(&self, st: &mut State, stored: Vec<MqttRecord>) {
        let (conns, routes): (Vec<_>, Vec<_>) = stored
            .into_iter()
            .partition(|r| r.kind == MqttKind::Connection);
        for rec in conns.into_iter().chain(routes) {
            let kind = rec.kind.as_str();
            let shadowed = match rec.kind {
                MqttKind::Connection => st.connections.contains_key(&rec.name),
                MqttKind::Route => st.routes.contains_key(&rec.name),
            };
            if shadowed {
                tracing::warn!(name = %rec.name, kind, "a stored MQTT {kind} is not used: the settings define one of the same name");
                continue;
            }
            let get = |f: &'static str| rec.fields.get(f).cloned();
            match rec.kind {
                MqttKind::Connection => match ConnectionSpec::parse(&rec.name, &get) {
                    Ok(spec) => {
                        let c = new_connection(spec, rec.fields.clone(), Origin::Api);
                        st.connections.insert(rec.name.clone(), c);
                    }
                    Err(e) => {
                        tracing::error!(name = %rec.name, error = %e, "a stored MQTT connection no longer validates: not started")
                    }
                },
                MqttKind::Route => match Route::parse(&rec.name, &get) {
                    Ok(r) => {
                        if !st.connections.contains_key(&r.connection) {
                            tracing::error!(name = %rec.name, connection = %r.connection, "a stored MQTT route names a connection that does not exist: not used until it does");
                        }
                        if self.broker.topic(&r.topic).is_none() {
                            tracing::error!(name = %rec.name, topic = %r.topic, "MQTT route to a topic that does not exist: its messages are held (unacknowledged) until the topic is created");
                        }
                        let e = RouteEntry {
                            fields: rec.fields.clone(),
                            origin: Origin::Api,
                            route: r,
                        };
                        st.routes.insert(rec.name.clone(), e);
                    }
                    Err(e) => {
                        tracing::error!(name = %rec.name, error = %e, "a stored MQTT route no longer validates: not used")
                    }
                },
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }

    /// Start connection `name`'s source with the routes on it (its old task must be stopped).
    /// A connection that cannot start (a file gone since) shows why as its last error.
    fn launch(&self, st: &mut State, name: &str) {
        if st.stopped {
            return;
        }
        let routes: Vec<Route> = st
            .routes
            .values()
            .filter(|r| r.route.connection == name)
            .map(|r| r.route.clone())
            .collect();
        let Some(c) = st.connections.get_mut(name) else {
            return;
        };
        c.forget.retain(|f| !routes.iter().any(|r| &r.filter == f));
        // The settings' brokers are the operator's own; one made through the API meets the
        // destinations' rule.
        let denied = match c.origin {
            Origin::Api => self.broker.config().outbound.denied_ranges.clone(),
            Origin::Settings => Vec::new(),
        };
        let started = c
            .spec
            .tls_config(&self.edge)
            .and_then(|tls| {
                Source::new(
                    c.spec.clone(),
                    tls,
                    routes,
                    c.forget.clone(),
                    denied,
                    self.broker.clone(),
                    c.status.clone(),
                )
            })
            .map(|(src, el)| tokio::spawn(src.run(el)));
        match started {
            Ok(h) => c.live = Some(h),
            Err(e) => {
                tracing::error!(connection = %name, error = %e, "MQTT connection not started");
                c.status.set_error(e.to_string());
            }
        }
    }

    /// Stop connection `name`'s task, then start it again with the current routes.
    async fn restart(&self, name: &str) {
        let old = self
            .lock()
            .connections
            .get_mut(name)
            .and_then(|c| c.live.take());
        stop(old).await;
        let mut st = self.lock();
        if let Some(c) = st.connections.get(name) {
            c.status.connected.store(0, Relaxed);
            c.status.paused.store(0, Relaxed);
        }
        self.launch(&mut st, name);
    }

    /// Stop every connection (gridlet is stopping); nothing starts afterwards.
    pub fn stop_all(&self) {
        let mut st = self.lock();
        st.stopped = true;
        for c in st.connections.values_mut() {
            if let Some(h) = c.live.take() {
                h.abort();
            }
        }
    }

    /// Connection `name` as the API shows it.
    ///
    /// # Errors
    /// Not found.
    pub fn connection(&self, name: &str) -> Result<View, ManageError> {
        let name = name.to_ascii_lowercase();
        let st = self.lock();
        let c = st.connections.get(&name).ok_or(ManageError::NotFound {
            kind: MqttKind::Connection,
            name: name.clone(),
        })?;
        Ok(connection_view(&name, c))
    }

    /// Every connection, by name.
    pub fn connections(&self) -> Vec<View> {
        let st = self.lock();
        st.connections
            .iter()
            .map(|(n, c)| connection_view(n, c))
            .collect()
    }

    /// Route `name` as the API shows it.
    ///
    /// # Errors
    /// Not found.
    pub fn route(&self, name: &str) -> Result<View, ManageError> {
        let name = name.to_ascii_lowercase();
        let st = self.lock();
        let r = st.routes.get(&name).ok_or(ManageError::NotFound {
            kind: MqttKind::Route,
            name: name.clone(),
        })?;
        Ok(route_view(&name, r))
    }

    /// Every route, by name.
    pub fn routes(&self) -> Vec<View> {
        let st = self.lock();
        st.routes.iter().map(|(n, r)| route_view(n, r)).collect()
    }
}

fn new_connection(spec: ConnectionSpec, fields: Fields, origin: Origin) -> Connection {
    Connection {
        fields,
        origin,
        spec,
        status: Arc::new(MqttConnectionMetrics::default()),
        forget: Vec::new(),
        live: None,
    }
}

fn connection_view(name: &str, c: &Connection) -> View {
    View {
        name: name.to_string(),
        origin: c.origin,
        properties: resource::properties(&c.fields, SECRET_FIELDS),
        status: Some(c.status.clone()),
    }
}

fn route_view(name: &str, r: &RouteEntry) -> View {
    View {
        name: name.to_string(),
        origin: r.origin,
        properties: resource::properties(&r.fields, &[]),
        status: None,
    }
}
