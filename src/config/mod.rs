//! Module configuration: one typed [`Config`] loaded once from the environment.
//!
//! The original module read ASP.NET-Core-style settings: hierarchical keys separated by `__`
//! **or** `:`, keys and boolean/enum values case-insensitive. `envy` cannot do that (it only
//! lowercases keys, rejects `False`, knows no `:` and no nesting), so this loader normalises keys
//! against one canonical table ([`SETTINGS`], in `settings.rs`) and parses each value with a typed
//! parser whose error names the key and the accepted values (`parse.rs`, one function per
//! section, reading values through [`Key`], so every key string is written once). Secrets and
//! URLs keep their case. The sections' types are in `types.rs`.
//!
//! Nothing else in the crate reads the environment: `main` calls [`Config::from_env`] and passes
//! `Arc<Config>` down.

mod advice;
mod mqtt;
mod parse;
pub(crate) use parse::jwks;
mod settings;
mod spelling;
mod types;

pub use mqtt::{Instance, Mqtt};
pub use settings::{Key, Setting, SETTINGS};
pub use spelling::UnknownKey;
pub use types::{
    ApiLimits, Broker, Console, EdgeEnv, Entra, Inbound, IpRange, Jwk, JwksRefresh, LogFormat,
    MetricsReporter, OnDamage, Outbound, Persistence, Principal, ReceiveKey, Resilience, Resources,
    Sampler, StoreKind, Telemetry, TlsPolicy,
};

use parse::Raw;
use std::fmt;

/// One setting as a list of `KEY=value` pairs sets it: its canonical key, the value in force,
/// and whether that value was given (else it is the default).
pub struct Effective {
    /// The key as shown: the setting's, or for a named instance's setting the key with its name
    /// (`mqtt__connections__plant__url`).
    pub key: String,
    /// The setting.
    pub setting: &'static Setting,
    /// The value in force ("" = unset); `***` for a secret that is set.
    pub value: String,
    /// Given in the variables (as opposed to the default).
    pub given: bool,
}

/// Every setting with the value the variables give it (keys normalised as [`Config::from_vars`]
/// does), secrets masked: for `gridlet check-config` and the start-up log.
pub fn effective(vars: impl IntoIterator<Item = (String, String)>) -> Vec<Effective> {
    let raw = Raw::new(vars);
    let mut out: Vec<Effective> = Key::ALL
        .iter()
        .filter(|key| parse::template(**key).is_none())
        .map(|key| {
            let setting = key.setting();
            let given = raw.given(*key);
            let value = match given {
                Some(v) if setting.is_secret() && !v.is_empty() => "***".to_string(),
                Some(v) => shown(v),
                None => setting.default.to_string(),
            };
            Effective {
                key: setting.key.to_string(),
                setting,
                value,
                given: given.is_some(),
            }
        })
        .collect();
    for ((family, name), values) in &raw.instances {
        for (key, v) in values {
            let setting = key.setting();
            let field = parse::template(*key).map_or("", |(_, f)| f);
            let value = if setting.is_secret() && !v.trim().is_empty() {
                "***".to_string()
            } else {
                v.trim().to_string()
            };
            out.push(Effective {
                key: format!("{family}__{name}__{field}"),
                setting,
                value,
                given: true,
            });
        }
    }
    out
}

/// A given value as logs and `check-config` may show it: a URL with its credentials masked
/// (`OTEL_EXPORTER_OTLP_ENDPOINT=http://user:pass@host/?token=…`), [`crate::redact::mask_url`].
fn shown(v: &str) -> String {
    if v.contains("://") {
        crate::redact::mask_url(v)
    } else {
        v.to_string()
    }
}

/// The variables among `vars` that look like misspelled settings, each with the closest key
/// (what [`Config::unknown_keys`] holds, also when another setting is invalid).
pub fn unknown_keys(vars: impl IntoIterator<Item = (String, String)>) -> Vec<UnknownKey> {
    Raw::new(vars).unknown
}

/// A setting that could not be parsed. Its `Display` is the one line printed at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    key: String,
    value: String,
    expected: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid setting {}={:?}: expected {}",
            self.key, self.value, self.expected
        )
    }
}

impl std::error::Error for ConfigError {}

/// The whole configuration, parsed and validated.
#[derive(Clone)]
pub struct Config {
    /// Inbound settings.
    pub inbound: Inbound,
    /// Outbound settings.
    pub outbound: Outbound,
    /// Broker settings.
    pub broker: Broker,
    /// API limits.
    pub api: ApiLimits,
    /// Delivery resilience settings.
    pub resilience: Resilience,
    /// Metrics reporter.
    pub metrics: MetricsReporter,
    /// How log records are written (`log__format`).
    pub log_format: LogFormat,
    /// Storage paths.
    pub persistence: Persistence,
    /// IoT Edge identity.
    pub edge: EdgeEnv,
    /// OpenTelemetry (`OTEL_*`, `telemetry__*`).
    pub telemetry: Telemetry,
    /// MQTT sources (`mqtt__connections__*`, `mqtt__routes__*`), as given.
    pub mqtt: Mqtt,
    /// The operator console (`console__*`).
    pub console: Console,
    /// The settings given a value other than their default, secrets masked (`***`): what the
    /// console's overview shows.
    pub changed: Vec<(&'static str, String)>,
    /// Variables that look like misspelled settings, each with the closest key (a warning at
    /// start-up; `check-config` refuses them).
    pub unknown_keys: Vec<UnknownKey>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // SAS keys are secrets: show how many there are, never their values.
        let mut inbound = self.inbound.clone();
        inbound.sas_keys = inbound.sas_keys.iter().map(|_| "***".to_string()).collect();
        inbound.publish_only_sas_keys = inbound
            .publish_only_sas_keys
            .iter()
            .map(|_| "***".to_string())
            .collect();
        f.debug_struct("Config")
            .field("inbound", &inbound)
            .field("outbound", &self.outbound)
            .field("broker", &self.broker)
            .field("api", &self.api)
            .field("resilience", &self.resilience)
            .field("metrics", &self.metrics)
            .field("persistence", &self.persistence)
            .field("edge", &self.edge)
            .field("telemetry", &self.telemetry)
            .field("mqtt", &self.mqtt)
            .finish()
    }
}

impl Config {
    /// Load from the process environment.
    ///
    /// # Errors
    /// The first setting that does not parse.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_vars(std::env::vars())
    }

    /// Load from any list of `KEY=value` pairs (tests pass their own).
    ///
    /// # Errors
    /// The first setting that does not parse, or a combination that cannot work.
    pub fn from_vars(
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let raw = Raw::new(vars);
        // Sections in the order the first invalid setting is reported.
        let inbound = parse::inbound(&raw)?;
        let outbound = parse::outbound(&raw)?;
        let broker = parse::broker(&raw)?;
        let api = parse::api_limits(&raw)?;
        let resilience = parse::resilience(&raw)?;
        let metrics = parse::metrics(&raw)?;
        let persistence = parse::persistence(&raw)?;
        let edge = parse::edge(&raw);
        let log_format = parse::log_format(&raw)?;
        let telemetry = parse::telemetry(&raw)?;
        let mqtt = mqtt::mqtt(&raw)?;
        let console = parse::console(&raw)?;
        let changed = Key::ALL
            .iter()
            .filter_map(|key| {
                let s = key.setting();
                let v = raw.given(*key)?;
                if v == s.default {
                    return None;
                }
                let shown = if s.is_secret() && !v.is_empty() {
                    "***".to_string()
                } else {
                    v.to_string()
                };
                Some((s.key, shown))
            })
            .collect();
        Ok(Self {
            inbound,
            outbound,
            broker,
            api,
            resilience,
            metrics,
            log_format,
            persistence,
            edge,
            telemetry,
            mqtt,
            console,
            changed,
            unknown_keys: raw.unknown,
        })
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod readme_tests {
    /// The README's settings table is generated from [`super::SETTINGS`]
    /// (`scripts/settings-table.py`); this keeps the two from drifting apart.
    #[test]
    fn readme_lists_every_setting_with_its_default() {
        let readme = include_str!("../../README.md");
        for s in super::SETTINGS {
            let default = if s.default.is_empty() {
                "—".to_string()
            } else {
                format!("`{}`", s.default)
            };
            let row = format!("| `{}` | {} |", s.key, default);
            assert!(
                readme.contains(&row),
                "README settings table lacks or misstates {}",
                s.key
            );
        }
    }
}
