//! [`Raw`]: the settings as given, normalised against the settings table (keys matched
//! without regard to case, templated keys of named instances split by family and name), and
//! parsed one value at a time; an error names the key and the accepted values.

use super::super::settings::Key as K;
use super::super::spelling::{self, UnknownKey};
use super::super::ConfigError;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

/// Normalised settings: key → raw value, plus the `IOTEDGE_*` variables.
pub(in crate::config) struct Raw {
    pub(in crate::config) values: HashMap<K, String>,
    /// Settings of named instances (`mqtt__connections__{name}__url`): by family
    /// (`mqtt__connections`) and name (lower case), each templated key's value.
    pub(in crate::config) instances: BTreeMap<(&'static str, String), BTreeMap<K, String>>,
    pub(in crate::config) edge: HashMap<String, String>,
    pub(in crate::config) unknown: Vec<UnknownKey>,
}

/// The placeholder segment of a templated key (`mqtt__connections__N__url`).
const INSTANCE: &str = "__N__";

/// A templated key's family and field: `mqtt__connections__N__tls__caFile` →
/// (`mqtt__connections`, `tls__caFile`).
pub(in crate::config) fn template(key: K) -> Option<(&'static str, &'static str)> {
    key.name().split_once(INSTANCE)
}

/// An instance name: letters, digits, `-` and single `_` (two are a separator).
fn instance_name(name: &str) -> bool {
    !name.is_empty()
        && !name.contains("__")
        && !name.starts_with('_')
        && !name.ends_with('_')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// The templated key and instance name `norm` (a lower-cased key) spells, if any.
fn match_template(templates: &[(String, String, K)], norm: &str) -> Option<(K, String)> {
    templates.iter().find_map(|(family, field, key)| {
        let rest = norm.strip_prefix(family.as_str())?.strip_prefix("__")?;
        let name = rest.strip_suffix(field.as_str())?.strip_suffix("__")?;
        instance_name(name).then(|| (*key, name.to_string()))
    })
}

impl Raw {
    /// Sort `vars` into known settings (`__` or `:` separators, any case), `IOTEDGE_*`
    /// variables, and misspelled settings (`spelling.rs`: unknown keys in a section the table
    /// has, `broker__…`, `inbound__…`, or a typo away from a key), each with the closest key.
    pub(in crate::config) fn new(vars: impl IntoIterator<Item = (String, String)>) -> Self {
        let canon: HashMap<String, K> = K::ALL
            .iter()
            .map(|k| (k.name().to_ascii_lowercase(), *k))
            .collect();
        let sections: HashSet<&str> = canon
            .keys()
            .filter_map(|k| k.split_once("__").map(|(section, _)| section))
            .collect();
        let templates: Vec<(String, String, K)> = K::ALL
            .iter()
            .filter_map(|k| {
                let (family, field) = template(*k)?;
                Some((family.to_ascii_lowercase(), field.to_ascii_lowercase(), *k))
            })
            .collect();
        let mut values = HashMap::new();
        let mut instances: BTreeMap<(&'static str, String), BTreeMap<K, String>> = BTreeMap::new();
        let mut edge = HashMap::new();
        let mut unknown = Vec::new();
        for (k, v) in vars {
            let norm = k.replace(':', "__").to_ascii_lowercase();
            if let Some(key) = canon.get(&norm).filter(|k| template(**k).is_none()) {
                values.insert(*key, v);
            } else if let Some((key, name)) = match_template(&templates, &norm) {
                let family = template(key).map_or("", |(f, _)| f);
                instances.entry((family, name)).or_default().insert(key, v);
            } else if norm.starts_with("iotedge_") {
                edge.insert(norm, v);
            } else {
                let in_section = norm
                    .split_once("__")
                    .is_some_and(|(section, _)| sections.contains(section));
                unknown.extend(spelling::unknown(&k, &norm, in_section));
            }
        }
        unknown.sort_by(|a, b| a.key.cmp(&b.key));
        Self {
            values,
            instances,
            edge,
            unknown,
        }
    }

    /// The value given, trimmed, if any.
    pub(in crate::config) fn given(&self, key: K) -> Option<&str> {
        self.values.get(&key).map(|v| v.trim())
    }

    /// The value in force: given, else the table's default.
    pub(in crate::config) fn text(&self, key: K) -> &str {
        self.given(key).unwrap_or(key.setting().default)
    }

    pub(in crate::config) fn err(&self, key: K, expected: &str) -> ConfigError {
        ConfigError {
            key: key.name().to_string(),
            value: crate::config::shown(self.text(key)),
            expected: expected.to_string(),
        }
    }

    pub(in crate::config) fn bool(&self, key: K) -> Result<bool, ConfigError> {
        match self.text(key).to_ascii_lowercase().as_str() {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(self.err(key, "true or false")),
        }
    }

    pub(in crate::config) fn int(&self, key: K, min: u64, max: u64) -> Result<u64, ConfigError> {
        // The docs print 1_058_576 for readability; accept underscores.
        let cleaned: String = self.text(key).chars().filter(|c| *c != '_').collect();
        match cleaned.parse::<u64>() {
            Ok(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(self.err(key, &format!("a whole number from {min} to {max}"))),
        }
    }

    /// A whole number of seconds from `min` to `max`.
    pub(in crate::config) fn secs(
        &self,
        key: K,
        min: u64,
        max: u64,
    ) -> Result<Duration, ConfigError> {
        self.int(key, min, max).map(Duration::from_secs)
    }

    pub(in crate::config) fn choice<T: Copy>(
        &self,
        key: K,
        options: &[(&str, T)],
    ) -> Result<T, ConfigError> {
        let v = self.text(key);
        options
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(v))
            .map(|(_, t)| *t)
            .ok_or_else(|| {
                let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
                self.err(key, &format!("one of {}", names.join(", ")))
            })
    }

    pub(in crate::config) fn secret(&self, key: K) -> Option<String> {
        self.given(key)
            .map(str::to_string)
            .filter(|v| !v.is_empty())
    }
}
