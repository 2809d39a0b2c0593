//! The MQTT sources' settings, as given: named connections (`mqtt__connections__{name}__*`) and
//! routes (`mqtt__routes__{name}__*`). Their values are validated where they are used
//! (`crate::ingress`, through `outbound::mqtt::connection` for a connection), whose errors name
//! the setting ([`Instance::key`]); `check-config` runs that validation too.

use super::parse::{template, Raw};
use super::settings::Key;
use std::collections::BTreeMap;
use std::fmt;

/// One named instance's settings.
#[derive(Clone, PartialEq, Eq)]
pub struct Instance {
    /// The family (`mqtt__connections`).
    pub family: &'static str,
    /// Its name (lower case).
    pub name: String,
    /// Field (the key's part after the name, `tls__caFile`) → value as given (trimmed).
    fields: BTreeMap<&'static str, (Key, String)>,
}

impl Instance {
    /// The value of `field`, in dotted (`tls.caFile`) or key (`tls__caFile`) spelling; `None`
    /// when not given or empty.
    pub fn get(&self, field: &str) -> Option<String> {
        let field = field.replace('.', "__");
        self.fields
            .get(field.as_str())
            .map(|(_, v)| v.clone())
            .filter(|v| !v.is_empty())
    }

    /// The setting key of `field` for this instance: `mqtt__connections__plant__tls__caFile`.
    pub fn key(&self, field: &str) -> String {
        format!(
            "{}__{}__{}",
            self.family,
            self.name,
            field.replace('.', "__")
        )
    }

    /// Every given field: its setting key (with the name), whether it is a secret, its value.
    pub fn given(&self) -> impl Iterator<Item = (String, bool, &str)> + '_ {
        self.fields
            .iter()
            .map(|(field, (k, v))| (self.key(field), k.setting().is_secret(), v.as_str()))
    }
}

impl fmt::Debug for Instance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut m = f.debug_map();
        for (key, secret, v) in self.given() {
            m.entry(&key, &if secret { "***" } else { v });
        }
        m.finish()
    }
}

/// MQTT connections and routes, in name order, and the bounds on them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mqtt {
    /// `mqtt__connections__{name}__*`.
    pub connections: Vec<Instance>,
    /// `mqtt__routes__{name}__*`.
    pub routes: Vec<Instance>,
    /// `mqtt__maxConnections`: connections of the settings and the API together.
    pub max_connections: usize,
    /// `mqtt__maxRoutes`: routes of the settings and the API together.
    pub max_routes: usize,
}

impl Mqtt {
    /// Whether any MQTT source is configured.
    pub fn is_empty(&self) -> bool {
        self.connections.is_empty() && self.routes.is_empty()
    }
}

/// The instances of `raw`, sorted into their families, and the bounds.
pub(super) fn mqtt(raw: &Raw) -> Result<Mqtt, super::ConfigError> {
    let mut out = Mqtt {
        max_connections: raw.int(Key::mqtt__maxConnections, 1, 10_000)? as usize,
        max_routes: raw.int(Key::mqtt__maxRoutes, 1, 100_000)? as usize,
        ..Mqtt::default()
    };
    for ((family, name), values) in &raw.instances {
        let fields = values
            .iter()
            .filter_map(|(k, v)| {
                let (_, field) = template(*k)?;
                Some((field, (*k, v.trim().to_string())))
            })
            .collect();
        let inst = Instance {
            family,
            name: name.clone(),
            fields,
        };
        match *family {
            "mqtt__connections" => out.connections.push(inst),
            "mqtt__routes" => out.routes.push(inst),
            _ => {}
        }
    }
    Ok(out)
}
