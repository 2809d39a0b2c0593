//! One advanced filter: an operator, a key and its values, parsed once when the subscription is
//! created and evaluated per event.
//!
//! The operators are Event Grid's nineteen: the edge module's twelve, and the seven that Event
//! Grid (basic topics and namespaces) added since (`NumberInRange`, `NumberNotInRange`,
//! `StringNotBeginsWith`, `StringNotEndsWith`, `StringNotContains`, `IsNullOrUndefined`,
//! `IsNotNull`). Their rules, as Microsoft documents them ("Event filters for subscriptions to
//! Azure Event Grid namespace topics"):
//!
//! * Values inside one filter are OR-ed; a negated operator (`…Not…`) matches only when **no**
//!   value holds.
//! * Strings compare case-insensitively; numbers as decimals.
//! * A key that is missing (or `null`) matches `NumberNotIn`, `StringNotIn` and
//!   `IsNullOrUndefined`, and no other operator.
//! * A key of another JSON type than the operator's fails the filter.
//! * An array key, where arrays are on ([`super::Filter`]'s `enableAdvancedFilteringOnArrays`,
//!   always on for namespace subscriptions): every element of the operator's type is compared,
//!   elements of other types are ignored; a positive operator matches when any element matches
//!   any value, a negated one when none does. Where arrays are off (the edge module's rule), an
//!   array key fails the filter.

use super::fold;
use super::{array_or_encoded, bad_filter, check_len, MAX_VALUES};
use crate::model::json::{loose_bool, Obj};
use crate::model::Invalid;
use rust_decimal::Decimal;
use serde_json::{json, Map, Value};
use std::cmp::Ordering;
use std::str::FromStr;

/// The advanced operators.
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
    /// Value lies in one of the ranges (bounds included).
    NumberInRange,
    /// Value lies in none of the ranges.
    NumberNotInRange,
    /// Boolean equality.
    BoolEquals,
    /// Value is one of the strings.
    StringIn,
    /// Value is none of the strings.
    StringNotIn,
    /// Value begins with one of the strings.
    StringBeginsWith,
    /// Value begins with none of the strings.
    StringNotBeginsWith,
    /// Value ends with one of the strings.
    StringEndsWith,
    /// Value ends with none of the strings.
    StringNotEndsWith,
    /// Value contains one of the strings.
    StringContains,
    /// Value contains none of the strings.
    StringNotContains,
    /// The key is missing or `null`.
    IsNullOrUndefined,
    /// The key is present and not `null`.
    IsNotNull,
}

/// Every operator by its wire name (parsed case-insensitively).
pub(super) const OPERATORS: &[(&str, Operator)] = &[
    ("NumberIn", Operator::NumberIn),
    ("NumberNotIn", Operator::NumberNotIn),
    ("NumberLessThan", Operator::NumberLessThan),
    ("NumberGreaterThan", Operator::NumberGreaterThan),
    ("NumberLessThanOrEquals", Operator::NumberLessThanOrEquals),
    (
        "NumberGreaterThanOrEquals",
        Operator::NumberGreaterThanOrEquals,
    ),
    ("NumberInRange", Operator::NumberInRange),
    ("NumberNotInRange", Operator::NumberNotInRange),
    ("BoolEquals", Operator::BoolEquals),
    ("StringIn", Operator::StringIn),
    ("StringNotIn", Operator::StringNotIn),
    ("StringBeginsWith", Operator::StringBeginsWith),
    ("StringNotBeginsWith", Operator::StringNotBeginsWith),
    ("StringEndsWith", Operator::StringEndsWith),
    ("StringNotEndsWith", Operator::StringNotEndsWith),
    ("StringContains", Operator::StringContains),
    ("StringNotContains", Operator::StringNotContains),
    ("IsNullOrUndefined", Operator::IsNullOrUndefined),
    ("IsNotNull", Operator::IsNotNull),
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

    /// Takes `values` (an array); the others take one `value`, or none.
    fn is_multi(self) -> bool {
        use Operator::*;
        !matches!(
            self,
            NumberLessThan
                | NumberGreaterThan
                | NumberLessThanOrEquals
                | NumberGreaterThanOrEquals
                | BoolEquals
                | IsNullOrUndefined
                | IsNotNull
        )
    }

    /// Takes no value at all.
    fn is_nullary(self) -> bool {
        matches!(self, Operator::IsNullOrUndefined | Operator::IsNotNull)
    }

    /// Matches when its positive form holds for **no** value.
    fn is_negated(self) -> bool {
        use Operator::*;
        matches!(
            self,
            NumberNotIn
                | NumberNotInRange
                | StringNotIn
                | StringNotBeginsWith
                | StringNotEndsWith
                | StringNotContains
        )
    }

    /// What a missing (or `null`) key gives (Microsoft's documented table).
    fn matches_missing(self) -> bool {
        matches!(
            self,
            Operator::NumberNotIn | Operator::StringNotIn | Operator::IsNullOrUndefined
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

    /// A filter value: a JSON number, or a string holding one (as twins send).
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Number(n) => Num::from_json(n),
            Value::String(s) => serde_json::from_str::<serde_json::Number>(s.trim())
                .ok()
                .and_then(|n| Num::from_json(&n)),
            _ => None,
        }
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
    /// Inclusive `[low, high]` ranges.
    Ranges(Vec<(Num, Num)>),
    Bool(bool),
    /// Lowercased.
    Strings(Vec<String>),
    /// `IsNullOrUndefined`, `IsNotNull`.
    None,
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
    /// The values as supplied, for the echo (`Null` for the operators that take none).
    echo: Value,
}

/// The operand values of one advanced filter as given: `values` (an array, or a JSON string of
/// one, as twins send) for the multi-value operators, `value` for the others, none for
/// `IsNullOrUndefined` and `IsNotNull`.
fn raw_values(o: &Obj<'_>, operator: Operator, path: &str) -> Result<Vec<Value>, Invalid> {
    if operator.is_nullary() {
        Ok(Vec::new())
    } else if operator.is_multi() {
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
    let numbers_error = || {
        bad_filter(format!(
            "{path} values must be numbers for {}",
            operator.name()
        ))
    };
    Ok(match operator {
        NumberIn
        | NumberNotIn
        | NumberLessThan
        | NumberGreaterThan
        | NumberLessThanOrEquals
        | NumberGreaterThanOrEquals => Operand::Numbers(
            raw_values
                .iter()
                .map(Num::from_value)
                .collect::<Option<Vec<_>>>()
                .ok_or_else(numbers_error)?,
        ),
        NumberInRange | NumberNotInRange => {
            let mut ranges = Vec::with_capacity(raw_values.len());
            for (i, v) in raw_values.iter().enumerate() {
                let bounds = match v.as_array().map(Vec::as_slice) {
                    Some([low, high]) => Num::from_value(low).zip(Num::from_value(high)),
                    _ => None,
                };
                let Some((low, high)) = bounds else {
                    return Err(bad_filter(format!(
                        "{path}.values[{i}] must be a range of two numbers, [low, high], for {}",
                        operator.name()
                    )));
                };
                if low.compare(high) == Some(Ordering::Greater) {
                    return Err(bad_filter(format!(
                        "{path}.values[{i}]: the low bound is above the high bound"
                    )));
                }
                ranges.push((low, high));
            }
            Operand::Ranges(ranges)
        }
        BoolEquals => Operand::Bool(raw_values.first().and_then(loose_bool).ok_or_else(|| {
            bad_filter(format!("{path}.value must be true or false for BoolEquals"))
        })?),
        StringIn | StringNotIn | StringBeginsWith | StringNotBeginsWith | StringEndsWith
        | StringNotEndsWith | StringContains | StringNotContains => {
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
        IsNullOrUndefined | IsNotNull => Operand::None,
    })
}

impl AdvancedFilter {
    pub(super) fn parse(v: &Value, i: usize) -> Result<Self, Invalid> {
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

    /// Whether the event passes; `arrays`: an array key is compared element by element (else
    /// it fails the filter).
    pub(super) fn matches(
        &self,
        event: &Map<String, Value>,
        lowered: &fold::Lowered,
        arrays: bool,
    ) -> bool {
        let value = lookup(event, &self.path);
        match (self.operator, value) {
            (Operator::IsNullOrUndefined, v) => return v.is_none(),
            (Operator::IsNotNull, v) => return v.is_some(),
            (op, None) => return op.matches_missing(),
            _ => {}
        }
        let negated = self.operator.is_negated();
        match value {
            Some(Value::Array(items)) if arrays => {
                // Elements of another type than the operator's are ignored.
                let hit = items.iter().any(|x| self.holds(x, lowered) == Some(true));
                hit != negated
            }
            Some(Value::Array(_)) | None => false,
            Some(scalar) => self
                .holds(scalar, lowered)
                .is_some_and(|hit| hit != negated),
        }
    }

    /// Whether the operator's positive form holds for one value of the event: `None` when the
    /// value is not of the operator's type.
    fn holds(&self, v: &Value, lowered: &fold::Lowered) -> Option<bool> {
        use Operator::*;
        Some(match (&self.operand, v) {
            (Operand::Numbers(nums), Value::Number(n)) => {
                let x = Num::from_json(n)?;
                let any = |want: fn(Ordering) -> bool| {
                    nums.iter().any(|y| x.compare(*y).is_some_and(want))
                };
                match self.operator {
                    NumberIn | NumberNotIn => any(Ordering::is_eq),
                    NumberLessThan => any(Ordering::is_lt),
                    NumberGreaterThan => any(Ordering::is_gt),
                    NumberLessThanOrEquals => any(Ordering::is_le),
                    NumberGreaterThanOrEquals => any(Ordering::is_ge),
                    _ => return None,
                }
            }
            (Operand::Ranges(ranges), Value::Number(n)) => {
                let x = Num::from_json(n)?;
                ranges.iter().any(|(low, high)| {
                    x.compare(*low).is_some_and(Ordering::is_ge)
                        && x.compare(*high).is_some_and(Ordering::is_le)
                })
            }
            (Operand::Bool(b), Value::Bool(x)) => b == x,
            // Compared without lowercasing the value per filter (`filter/fold.rs`).
            (Operand::Strings(strs), Value::String(s)) => match self.operator {
                StringIn | StringNotIn => strs.iter().any(|y| fold::eq(s, y)),
                StringBeginsWith | StringNotBeginsWith => {
                    strs.iter().any(|y| fold::starts_with(s, y))
                }
                StringEndsWith | StringNotEndsWith => strs.iter().any(|y| fold::ends_with(s, y)),
                StringContains | StringNotContains => {
                    let s = lowered.get(s);
                    strs.iter().any(|y| s.contains(y.as_str()))
                }
                _ => return None,
            },
            _ => return None,
        })
    }

    pub(super) fn to_json(&self) -> Value {
        if self.operator.is_nullary() {
            return json!({ "operatorType": self.operator.name(), "key": self.key });
        }
        let value_key = if self.operator.is_multi() {
            "values"
        } else {
            "value"
        };
        json!({ "operatorType": self.operator.name(), "key": self.key, value_key: self.echo })
    }
}

/// Resolve a dotted path, each segment case-insensitively (exact match first); `null` is
/// missing.
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
