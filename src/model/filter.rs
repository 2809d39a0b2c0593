//! Subscription filters, compiled once when the subscription is created and evaluated per event.
//!
//! Semantics (docs/COMPATIBILITY.md §3.2):
//! * `subjectBeginsWith` / `subjectEndsWith`: plain prefix/suffix; case-insensitive unless
//!   `isSubjectCaseSensitive`.
//! * `includedEventTypes`: the event type must be one of them (case-insensitive); absent, empty or
//!   the legacy `"all"` = every type.
//! * Advanced filters ([`advanced`]: Event Grid's nineteen operators and their rules for missing
//!   keys, types and arrays) are AND-ed.
//! * `enableAdvancedFilteringOnArrays` (Event Grid's name; always on for subscriptions created
//!   in the namespaces shape): an array key is compared element by element; off (the edge
//!   module's rule, the default), an array key fails the filter.
//! * Keys are dotted paths resolved case-insensitively (`Data.Key1` finds `data.key1`).
//!
//! Filters are pure: no I/O, no clock. Property tests below check the algebra.

use super::Invalid;
use crate::config::Key;
use crate::model::json::Obj;
use advanced::AdvancedFilter;
use serde_json::{json, Map, Value};
use std::borrow::Cow;
use std::collections::HashSet;

/// Most advanced filters per subscription.
pub const MAX_ADVANCED_FILTERS: usize = 25;
/// Most values in one advanced filter.
pub const MAX_VALUES: usize = 25;
/// Longest string value or key.
pub const MAX_STRING_LEN: usize = 512;

/// A compiled subscription filter.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    subject_begins_with: Option<String>,
    subject_ends_with: Option<String>,
    case_sensitive: bool,
    /// Lowercased; `None` = all. A hash set: routing asks it once per event and subscription,
    /// so a long list costs a hash, not a scan (the list is capped at creation too).
    included_event_types: Option<HashSet<String>>,
    /// As supplied, for the echo.
    included_echo: Option<Vec<String>>,
    advanced: Vec<AdvancedFilter>,
    /// `enableAdvancedFilteringOnArrays`: an array key is compared element by element (always
    /// on for namespace subscriptions); off, an array key fails the filter (the edge module).
    arrays: bool,
}

pub(super) fn bad_filter(msg: impl Into<String>) -> Invalid {
    Invalid::new("InvalidFilter", msg.into())
}

/// Twins encode arrays as JSON strings (`"[\"a\",\"b\"]"`): accept both.
pub(super) fn array_or_encoded(v: &Value, field: &str) -> Result<Vec<Value>, Invalid> {
    match v {
        Value::Array(a) => Ok(a.clone()),
        Value::String(s) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Array(a)) => Ok(crate::model::json::lower_keys(Value::Array(a))
                .as_array()
                .cloned()
                .unwrap_or_default()),
            _ => Err(bad_filter(format!("{field} must be an array"))),
        },
        _ => Err(bad_filter(format!("{field} must be an array"))),
    }
}

pub(super) fn check_len(s: &str, field: &str) -> Result<(), Invalid> {
    if s.len() > MAX_STRING_LEN {
        return Err(bad_filter(format!(
            "{field} is longer than {MAX_STRING_LEN} characters"
        )));
    }
    Ok(())
}

/// An event's top-level JSON object, for advanced filters.
///
/// Publishing validates and routes most events from one borrowed pass over their bytes; the
/// object is then parsed from those bytes only when an advanced filter first reads it.
#[derive(Debug)]
pub struct LazyObject {
    cell: std::cell::OnceCell<Map<String, Value>>,
    /// The event's JSON text (empty when the object was given parsed).
    source: bytes::Bytes,
}

impl LazyObject {
    /// An object that is already parsed.
    pub fn parsed(object: Map<String, Value>) -> Self {
        Self {
            cell: std::cell::OnceCell::from(object),
            source: bytes::Bytes::new(),
        }
    }

    /// An object parsed from `source` (a JSON object) on first use.
    pub fn from_json(source: bytes::Bytes) -> Self {
        Self {
            cell: std::cell::OnceCell::new(),
            source,
        }
    }

    /// The JSON text the object is parsed from (empty when it was given parsed).
    pub fn source(&self) -> &[u8] {
        &self.source
    }

    /// The object (empty if the source is not a JSON object, which the publish path rules out).
    pub fn get(&self) -> &Map<String, Value> {
        self.cell
            .get_or_init(|| serde_json::from_slice(&self.source).unwrap_or_default())
    }
}

/// What a filter sees of an event.
pub struct EventView<'a> {
    /// The event object.
    pub object: &'a LazyObject,
    /// Its subject, if the schema has one.
    pub subject: Option<&'a str>,
    /// Its type (`eventType` / CloudEvents `type`).
    pub event_type: Option<&'a str>,
    /// Its string values lowercased for `StringContains`, once per event (`filter/fold.rs`).
    pub lowered: fold::Lowered,
}

/// `s` lowercased, without a copy when it already is (the common case for event types).
fn lowercase(s: &str) -> Cow<'_, str> {
    if s.bytes().all(|b| b.is_ascii() && !b.is_ascii_uppercase()) {
        Cow::Borrowed(s)
    } else {
        Cow::Owned(s.to_lowercase())
    }
}

impl Filter {
    /// Parse a `filter` object (keys already lowercased); `includedEventTypes` may hold at most
    /// `max_types` entries.
    ///
    /// # Errors
    /// [`Invalid`] `InvalidFilter` naming the offending part.
    pub fn parse(f: &Obj<'_>, max_types: usize) -> Result<Self, Invalid> {
        let subject_begins_with = f.str("subjectbeginswith")?.map(str::to_string);
        let subject_ends_with = f.str("subjectendswith")?.map(str::to_string);
        for s in subject_begins_with.iter().chain(subject_ends_with.iter()) {
            check_len(s, "subject filter")?;
        }
        let case_sensitive = f
            .bool("issubjectcasesensitive", "isSubjectCaseSensitive")?
            .unwrap_or(false);
        let arrays = f
            .bool(
                "enableadvancedfilteringonarrays",
                "enableAdvancedFilteringOnArrays",
            )?
            .unwrap_or(false);
        let types_value = f.get("includedeventtypes").or_else(|| f.get("eventtypes"));
        let included_echo = match types_value {
            None => None,
            Some(v) => {
                let arr = array_or_encoded(v, "includedEventTypes")?;
                if arr.len() > max_types {
                    return Err(bad_filter(format!(
                        "includedEventTypes holds {} entries; at most {max_types} are allowed ({})",
                        arr.len(),
                        Key::api__filterLimits__maxIncludedEventTypes.name()
                    )));
                }
                let mut out = Vec::with_capacity(arr.len());
                for t in arr {
                    let s = t.as_str().ok_or_else(|| {
                        bad_filter("includedEventTypes must be an array of strings")
                    })?;
                    check_len(s, "includedEventTypes")?;
                    out.push(s.to_string());
                }
                Some(out)
            }
        };
        let included_event_types = included_echo.as_ref().and_then(|types| {
            if types.is_empty() || types.iter().any(|t| t.eq_ignore_ascii_case("all")) {
                None
            } else {
                Some(types.iter().map(|t| t.to_lowercase()).collect())
            }
        });
        let advanced = match f.get("advancedfilters") {
            None => Vec::new(),
            Some(v) => {
                let arr = array_or_encoded(v, "advancedFilters")?;
                if arr.len() > MAX_ADVANCED_FILTERS {
                    return Err(bad_filter(format!(
                        "at most {MAX_ADVANCED_FILTERS} advanced filters"
                    )));
                }
                arr.iter()
                    .enumerate()
                    .map(|(i, v)| AdvancedFilter::parse(v, i))
                    .collect::<Result<Vec<_>, _>>()?
            }
        };
        Ok(Self {
            subject_begins_with,
            subject_ends_with,
            case_sensitive,
            included_event_types,
            included_echo,
            advanced,
            arrays,
        })
    }

    /// The filter of a metadata record ([`Filter::to_json`]'s canonical form), compiled again:
    /// no setting applies (`includedEventTypes` was checked against the limit when created).
    ///
    /// # Errors
    /// [`Invalid`] when the record does not hold a filter.
    pub fn from_record(v: &Value) -> Result<Self, Invalid> {
        let lowered = crate::model::json::lower_keys(v.clone());
        Self::parse(&Obj::new(&lowered, "filter")?, usize::MAX)
    }

    /// Whether the event passes.
    pub fn matches(&self, ev: &EventView<'_>) -> bool {
        if let Some(types) = &self.included_event_types {
            let Some(t) = ev.event_type else {
                return false;
            };
            if !types.contains(lowercase(t).as_ref()) {
                return false;
            }
        }
        if self.subject_begins_with.is_some() || self.subject_ends_with.is_some() {
            let Some(subject) = ev.subject else {
                return false;
            };
            let ok = if self.case_sensitive {
                self.subject_begins_with
                    .as_deref()
                    .is_none_or(|p| subject.starts_with(p))
                    && self
                        .subject_ends_with
                        .as_deref()
                        .is_none_or(|p| subject.ends_with(p))
            } else {
                let s = subject.to_lowercase();
                self.subject_begins_with
                    .as_deref()
                    .is_none_or(|p| s.starts_with(&p.to_lowercase()))
                    && self
                        .subject_ends_with
                        .as_deref()
                        .is_none_or(|p| s.ends_with(&p.to_lowercase()))
            };
            if !ok {
                return false;
            }
        }
        self.advanced
            .iter()
            .all(|a| a.matches(ev.object.get(), &ev.lowered, self.arrays))
    }

    /// The filter as echoed (canonical camelCase).
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        if let Some(s) = &self.subject_begins_with {
            m.insert("subjectBeginsWith".into(), json!(s));
        }
        if let Some(s) = &self.subject_ends_with {
            m.insert("subjectEndsWith".into(), json!(s));
        }
        m.insert("isSubjectCaseSensitive".into(), json!(self.case_sensitive));
        if let Some(t) = &self.included_echo {
            m.insert("includedEventTypes".into(), json!(t));
        }
        if self.arrays {
            m.insert("enableAdvancedFilteringOnArrays".into(), json!(true));
        }
        if !self.advanced.is_empty() {
            m.insert(
                "advancedFilters".into(),
                Value::Array(self.advanced.iter().map(AdvancedFilter::to_json).collect()),
            );
        }
        Value::Object(m)
    }
}

pub(crate) mod advanced;
pub(crate) mod fold;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod advanced_tests;
