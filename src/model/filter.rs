//! Subscription filters, compiled once when the subscription is created and evaluated per event.
//!
//! Semantics (docs/COMPATIBILITY.md §3.2):
//! * `subjectBeginsWith` / `subjectEndsWith`: plain prefix/suffix; case-insensitive unless
//!   `isSubjectCaseSensitive`.
//! * `includedEventTypes`: the event type must be one of them (case-insensitive); absent, empty or
//!   the legacy `"all"` = every type.
//! * Advanced filters are AND-ed; the values inside one filter are OR-ed, except `NumberNotIn` and
//!   `StringNotIn`, which require the value to differ from **all** of them.
//! * Numbers compare as decimals (no float rounding), strings case-insensitively. A key that is
//!   missing, of another JSON type, or an **array** makes the filter fail.
//! * Keys are dotted paths resolved case-insensitively (`Data.Key1` finds `data.key1`).
//!
//! Filters are pure: no I/O, no clock. Property tests below check the algebra.

use super::Invalid;
use crate::config::Key;
use crate::model::json::{loose_bool, Obj};
use rust_decimal::Decimal;
use serde_json::{json, Map, Value};
use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::HashSet;
use std::str::FromStr;

/// Most advanced filters per subscription.
pub const MAX_ADVANCED_FILTERS: usize = 25;
/// Most values in one advanced filter.
pub const MAX_VALUES: usize = 25;
/// Longest string value or key.
pub const MAX_STRING_LEN: usize = 512;

/// The 12 advanced operators of Event Grid on IoT Edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    /// Value is one of the numbers.
    NumberIn,
    /// Value is none of the numbers.
    NumberNotIn,
    /// `<`.
    NumberLessThan,
    /// `>`.
    NumberGreaterThan,
    /// `<=`.
    NumberLessThanOrEquals,
    /// `>=`.
    NumberGreaterThanOrEquals,
    /// Boolean equality.
    BoolEquals,
    /// Value is one of the strings.
    StringIn,
    /// Value is none of the strings.
    StringNotIn,
    /// Value begins with one of the strings.
    StringBeginsWith,
    /// Value ends with one of the strings.
    StringEndsWith,
    /// Value contains one of the strings.
    StringContains,
}

const OPERATORS: &[(&str, Operator)] = &[
    ("NumberIn", Operator::NumberIn),
    ("NumberNotIn", Operator::NumberNotIn),
    ("NumberLessThan", Operator::NumberLessThan),
    ("NumberGreaterThan", Operator::NumberGreaterThan),
    ("NumberLessThanOrEquals", Operator::NumberLessThanOrEquals),
    (
        "NumberGreaterThanOrEquals",
        Operator::NumberGreaterThanOrEquals,
    ),
    ("BoolEquals", Operator::BoolEquals),
    ("StringIn", Operator::StringIn),
    ("StringNotIn", Operator::StringNotIn),
    ("StringBeginsWith", Operator::StringBeginsWith),
    ("StringEndsWith", Operator::StringEndsWith),
    ("StringContains", Operator::StringContains),
];

impl Operator {
    fn name(self) -> &'static str {
        OPERATORS
            .iter()
            .find(|(_, o)| *o == self)
            .map(|(n, _)| *n)
            .unwrap_or("Unknown")
    }
    fn parse(s: &str) -> Option<Self> {
        OPERATORS
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(s.trim()))
            .map(|(_, o)| *o)
    }
    fn is_multi(self) -> bool {
        use Operator::*;
        matches!(
            self,
            NumberIn
                | NumberNotIn
                | StringIn
                | StringNotIn
                | StringBeginsWith
                | StringEndsWith
                | StringContains
        )
    }
}

/// A number compared as a decimal; values outside `Decimal`'s range (±7.9e28) fall back to `f64`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    /// Exact.
    Dec(Decimal),
    /// Out of decimal range.
    Float(f64),
}

impl Num {
    /// Parse a JSON number (its original text, thanks to `arbitrary_precision`).
    pub fn from_json(n: &serde_json::Number) -> Option<Self> {
        let text = n.to_string();
        Decimal::from_str(&text)
            .or_else(|_| Decimal::from_scientific(&text))
            .map(Num::Dec)
            .ok()
            .or_else(|| n.as_f64().filter(|f| f.is_finite()).map(Num::Float))
    }

    fn as_f64(self) -> f64 {
        match self {
            Num::Dec(d) => d.to_string().parse().unwrap_or(f64::NAN),
            Num::Float(f) => f,
        }
    }

    fn compare(self, other: Num) -> Option<Ordering> {
        match (self, other) {
            (Num::Dec(a), Num::Dec(b)) => Some(a.cmp(&b)),
            (a, b) => a.as_f64().partial_cmp(&b.as_f64()),
        }
    }
}

#[derive(Debug, Clone)]
enum Operand {
    Numbers(Vec<Num>),
    Bool(bool),
    /// Lowercased.
    Strings(Vec<String>),
}

/// One advanced filter.
#[derive(Debug, Clone)]
pub struct AdvancedFilter {
    operator: Operator,
    /// As supplied (echoed).
    key: String,
    /// Lowercased path segments.
    path: Vec<String>,
    operand: Operand,
    /// The values as supplied, for the echo.
    echo: Value,
}

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
}

fn bad_filter(msg: impl Into<String>) -> Invalid {
    Invalid::new("InvalidFilter", msg.into())
}

/// Twins encode arrays as JSON strings (`"[\"a\",\"b\"]"`): accept both.
fn array_or_encoded(v: &Value, field: &str) -> Result<Vec<Value>, Invalid> {
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

fn check_len(s: &str, field: &str) -> Result<(), Invalid> {
    if s.len() > MAX_STRING_LEN {
        return Err(bad_filter(format!(
            "{field} is longer than {MAX_STRING_LEN} characters"
        )));
    }
    Ok(())
}

/// The operand values of one advanced filter as given: `values` (an array, or a JSON string of
/// one, as twins send) for the multi-value operators, `value` for the others.
fn raw_values(o: &Obj<'_>, operator: Operator, path: &str) -> Result<Vec<Value>, Invalid> {
    if operator.is_multi() {
        let v = o
            .get("values")
            .or_else(|| o.get("value").filter(|v| v.is_array()))
            .ok_or_else(|| {
                bad_filter(format!("{path}.values is required for {}", operator.name()))
            })?;
        let vals = array_or_encoded(v, &format!("{path}.values"))?;
        if vals.is_empty() || vals.len() > MAX_VALUES {
            return Err(bad_filter(format!(
                "{path}.values must hold 1 to {MAX_VALUES} values"
            )));
        }
        Ok(vals)
    } else {
        match o.get("value") {
            Some(v) => Ok(vec![v.clone()]),
            None => match o.get("values").and_then(Value::as_array) {
                Some(a) if a.len() == 1 => Ok(a.clone()),
                _ => Err(bad_filter(format!(
                    "{path}.value is required for {}",
                    operator.name()
                ))),
            },
        }
    }
}

/// The typed operand of `operator` from its raw values.
fn operand(operator: Operator, raw_values: &[Value], path: &str) -> Result<Operand, Invalid> {
    use Operator::*;
    Ok(match operator {
        NumberIn
        | NumberNotIn
        | NumberLessThan
        | NumberGreaterThan
        | NumberLessThanOrEquals
        | NumberGreaterThanOrEquals => {
            let nums = raw_values
                .iter()
                .map(|v| match v {
                    Value::Number(n) => Num::from_json(n),
                    Value::String(s) => serde_json::from_str::<serde_json::Number>(s.trim())
                        .ok()
                        .and_then(|n| Num::from_json(&n)),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    bad_filter(format!(
                        "{path} values must be numbers for {}",
                        operator.name()
                    ))
                })?;
            Operand::Numbers(nums)
        }
        BoolEquals => Operand::Bool(raw_values.first().and_then(loose_bool).ok_or_else(|| {
            bad_filter(format!("{path}.value must be true or false for BoolEquals"))
        })?),
        StringIn | StringNotIn | StringBeginsWith | StringEndsWith | StringContains => {
            let mut out = Vec::with_capacity(raw_values.len());
            for v in raw_values {
                let s = v.as_str().ok_or_else(|| {
                    bad_filter(format!(
                        "{path} values must be strings for {}",
                        operator.name()
                    ))
                })?;
                check_len(s, &format!("{path}.values"))?;
                out.push(fold::lower(s));
            }
            Operand::Strings(out)
        }
    })
}

impl AdvancedFilter {
    fn parse(v: &Value, i: usize) -> Result<Self, Invalid> {
        let path = format!("advancedFilters[{i}]");
        let o = Obj::new(v, "advancedFilters[]")
            .map_err(|_| bad_filter(format!("{path} must be an object")))?;
        let op_name = o
            .str("operatortype")?
            .ok_or_else(|| bad_filter(format!("{path}.operatorType is required")))?;
        let operator = Operator::parse(op_name).ok_or_else(|| {
            let names: Vec<&str> = OPERATORS.iter().map(|(n, _)| *n).collect();
            bad_filter(format!(
                "{path}.operatorType '{op_name}' is not one of {}",
                names.join(", ")
            ))
        })?;
        let key = o
            .str("key")?
            .filter(|k| !k.trim().is_empty())
            .ok_or_else(|| bad_filter(format!("{path}.key is required")))?;
        check_len(key, &format!("{path}.key"))?;
        let raw_values = raw_values(&o, operator, &path)?;
        let operand = operand(operator, &raw_values, &path)?;
        let echo = if operator.is_multi() {
            Value::Array(raw_values)
        } else {
            raw_values.into_iter().next().unwrap_or(Value::Null)
        };
        Ok(Self {
            operator,
            key: key.to_string(),
            path: key.split('.').map(str::to_ascii_lowercase).collect(),
            operand,
            echo,
        })
    }

    fn matches(&self, event: &Map<String, Value>, lowered: &fold::Lowered) -> bool {
        let Some(v) = lookup(event, &self.path) else {
            return false;
        };
        use Operator::*;
        match (&self.operand, v) {
            (Operand::Numbers(nums), Value::Number(n)) => {
                let Some(x) = Num::from_json(n) else {
                    return false;
                };
                let cmp = |y: &Num| x.compare(*y);
                match self.operator {
                    NumberIn => nums.iter().any(|y| cmp(y) == Some(Ordering::Equal)),
                    NumberNotIn => nums.iter().all(|y| cmp(y) != Some(Ordering::Equal)),
                    NumberLessThan => nums.iter().any(|y| cmp(y) == Some(Ordering::Less)),
                    NumberGreaterThan => nums.iter().any(|y| cmp(y) == Some(Ordering::Greater)),
                    NumberLessThanOrEquals => nums
                        .iter()
                        .any(|y| matches!(cmp(y), Some(Ordering::Less | Ordering::Equal))),
                    NumberGreaterThanOrEquals => nums
                        .iter()
                        .any(|y| matches!(cmp(y), Some(Ordering::Greater | Ordering::Equal))),
                    _ => false,
                }
            }
            (Operand::Bool(b), Value::Bool(x)) => b == x,
            // Compared without lowercasing the value per filter (`filter/fold.rs`).
            (Operand::Strings(strs), Value::String(s)) => match self.operator {
                StringIn => strs.iter().any(|y| fold::eq(s, y)),
                StringNotIn => strs.iter().all(|y| !fold::eq(s, y)),
                StringBeginsWith => strs.iter().any(|y| fold::starts_with(s, y)),
                StringEndsWith => strs.iter().any(|y| fold::ends_with(s, y)),
                StringContains => {
                    let s = lowered.get(s);
                    strs.iter().any(|y| s.contains(y.as_str()))
                }
                _ => false,
            },
            // Missing key, another JSON type, or an array: the filter fails.
            _ => false,
        }
    }

    fn to_json(&self) -> Value {
        let value_key = if self.operator.is_multi() {
            "values"
        } else {
            "value"
        };
        json!({ "operatorType": self.operator.name(), "key": self.key, value_key: self.echo })
    }
}

/// Resolve a dotted path, each segment case-insensitively (exact match first).
fn lookup<'a>(event: &'a Map<String, Value>, path: &[String]) -> Option<&'a Value> {
    let mut cur = event;
    let (last, parents) = path.split_last()?;
    for seg in parents {
        cur = get_ci(cur, seg)?.as_object()?;
    }
    get_ci(cur, last).filter(|v| !v.is_null())
}

fn get_ci<'a>(m: &'a Map<String, Value>, lower: &str) -> Option<&'a Value> {
    m.get(lower).or_else(|| {
        m.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(lower))
            .map(|(_, v)| v)
    })
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
            .all(|a| a.matches(ev.object.get(), &ev.lowered))
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
        if !self.advanced.is_empty() {
            m.insert(
                "advancedFilters".into(),
                Value::Array(self.advanced.iter().map(AdvancedFilter::to_json).collect()),
            );
        }
        Value::Object(m)
    }
}

pub mod fold;

#[cfg(test)]
mod tests;
