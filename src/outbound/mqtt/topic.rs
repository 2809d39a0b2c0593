//! The MQTT destination's topic template: literal text and `${variable}`s filled from each event.
//!
//! | variable | value |
//! |---|---|
//! | `${subject}` | the event's `subject` |
//! | `${type}`, `${eventType}` | the event's `type` (CloudEvents) or `eventType` (Event Grid schema) |
//! | `${id}` | the event's `id` |
//! | `${source}` | the event's `source` (CloudEvents) |
//! | `${topic}` | the name of the gridlet topic the event was published to |
//!
//! A template is checked when the subscription is created: no wildcard (`+`, `#`) and no NUL in
//! its text, only these variables, every `${` closed. A filled topic is checked again for each
//! event (a subject may hold a `+`): an event whose topic would be invalid, or that lacks a
//! variable's field, is refused (dead-lettered), never published somewhere else.

use serde_json::Value;

/// Longest MQTT topic name (a UTF-8 string's length prefix is two bytes).
pub const MAX_TOPIC_BYTES: usize = 65_535;

/// A value a template takes from the event or the delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Var {
    Subject,
    Type,
    Id,
    Source,
    Topic,
}

impl Var {
    const NAMES: [(&'static str, Var); 6] = [
        ("subject", Var::Subject),
        ("type", Var::Type),
        ("eventType", Var::Type),
        ("id", Var::Id),
        ("source", Var::Source),
        ("topic", Var::Topic),
    ];

    fn parse(name: &str) -> Option<Self> {
        Self::NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
    }

    /// The event field(s) it reads, for error messages.
    fn field(self) -> &'static str {
        match self {
            Var::Subject => "subject",
            Var::Type => "type (or eventType)",
            Var::Id => "id",
            Var::Source => "source",
            Var::Topic => "topic",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Var(Var),
}

/// A parsed topic template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicTemplate {
    parts: Vec<Part>,
}

/// Why a filled topic cannot be used for an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FillError {
    /// The event lacks the field a variable reads (or it is not a string).
    #[error("the event has no {0} for the topic template")]
    Missing(&'static str),
    /// The filled topic holds a wildcard or NUL, is empty, or is too long.
    #[error("the topic filled from the event is not a valid MQTT topic name: {0}")]
    Invalid(&'static str),
}

/// What makes a topic name invalid, if anything.
fn invalid(topic: &str) -> Option<&'static str> {
    if topic.is_empty() {
        Some("it is empty")
    } else if topic.contains(['+', '#']) {
        Some("it holds a wildcard (+ or #)")
    } else if topic.contains('\0') {
        Some("it holds a NUL character")
    } else if topic.len() > MAX_TOPIC_BYTES {
        Some("it is longer than 65,535 bytes")
    } else {
        None
    }
}

impl TopicTemplate {
    /// Parse a template.
    ///
    /// # Errors
    /// A message saying what is wrong (the caller names the field).
    pub fn parse(raw: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut rest = raw;
        while let Some(at) = rest.find("${") {
            if at > 0 {
                parts.push(Part::Text(rest[..at].to_string()));
            }
            let after = &rest[at + 2..];
            let end = after.find('}').ok_or_else(|| {
                format!(
                    "`${{` at byte {} is not closed",
                    raw.len() - rest.len() + at
                )
            })?;
            let name = after[..end].trim();
            let var = Var::parse(name).ok_or_else(|| {
                let known: Vec<&str> = Var::NAMES.iter().map(|(n, _)| *n).collect();
                format!(
                    "unknown variable `${{{name}}}`; use {}",
                    known
                        .iter()
                        .map(|n| format!("${{{n}}}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })?;
            parts.push(Part::Var(var));
            rest = &after[end + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_string()));
        }
        let text: String = parts
            .iter()
            .filter_map(|p| match p {
                Part::Text(t) => Some(t.as_str()),
                Part::Var(_) => None,
            })
            .collect();
        if parts.is_empty() {
            return Err("must not be empty".into());
        }
        if text.contains(['+', '#']) {
            return Err(
                "must not hold a wildcard (+ or #): a message is published to one topic".into(),
            );
        }
        if text.contains('\0') {
            return Err("must not hold a NUL character".into());
        }
        if text.len() > MAX_TOPIC_BYTES {
            return Err(format!("is longer than {MAX_TOPIC_BYTES} bytes"));
        }
        Ok(Self { parts })
    }

    /// Whether it reads nothing from the event (one topic for every event).
    pub fn is_fixed(&self) -> bool {
        self.parts.iter().all(|p| matches!(p, Part::Text(_)))
    }

    /// The topic for `event` (its parsed JSON, if it parsed) delivered from gridlet topic
    /// `topic`.
    ///
    /// # Errors
    /// The event lacks a variable's field, or the result is not a valid topic name.
    pub fn fill(&self, event: Option<&Value>, topic: &str) -> Result<String, FillError> {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Text(t) => out.push_str(t),
                Part::Var(Var::Topic) => out.push_str(topic),
                Part::Var(v) => {
                    let field =
                        |name: &str| event.and_then(|e| e.get(name)).and_then(Value::as_str);
                    let value = match v {
                        Var::Subject => field("subject"),
                        Var::Type => field("type").or_else(|| field("eventType")),
                        Var::Id => field("id"),
                        Var::Source => field("source"),
                        Var::Topic => None,
                    };
                    out.push_str(value.ok_or(FillError::Missing(v.field()))?);
                }
            }
        }
        match invalid(&out) {
            Some(why) => Err(FillError::Invalid(why)),
            None => Ok(out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn variables_are_filled_from_the_event() {
        let t = TopicTemplate::parse("devices/${subject}/${eventType}/${ topic }").unwrap();
        let e = json!({"subject": "a/b", "eventType": "T.1", "id": "1"});
        assert_eq!(
            t.fill(Some(&e), "orders").unwrap(),
            "devices/a/b/T.1/orders"
        );
        let ce = json!({"subject": "s", "type": "ce.type", "source": "src"});
        let t = TopicTemplate::parse("${source}/${type}/${subject}").unwrap();
        assert_eq!(t.fill(Some(&ce), "x").unwrap(), "src/ce.type/s");
        assert!(TopicTemplate::parse("fixed/topic").unwrap().is_fixed());
        assert!(!t.is_fixed());
    }

    #[test]
    fn bad_templates_say_why() {
        for (raw, says) in [
            ("a/+/b", "wildcard"),
            ("a/#", "wildcard"),
            ("a/${nope}", "unknown variable `${nope}`"),
            ("a/${subject", "not closed"),
            ("", "empty"),
        ] {
            let e = TopicTemplate::parse(raw).unwrap_err();
            assert!(e.contains(says), "{raw}: {e}");
        }
    }

    #[test]
    fn an_event_that_would_make_a_bad_topic_is_refused() {
        let t = TopicTemplate::parse("devices/${subject}").unwrap();
        assert_eq!(
            t.fill(Some(&json!({"subject": "a/+"})), "t"),
            Err(FillError::Invalid("it holds a wildcard (+ or #)"))
        );
        assert_eq!(
            t.fill(Some(&json!({"id": "1"})), "t"),
            Err(FillError::Missing("subject"))
        );
        assert_eq!(t.fill(None, "t"), Err(FillError::Missing("subject")));
        let t = TopicTemplate::parse("${subject}").unwrap();
        assert_eq!(
            t.fill(Some(&json!({"subject": ""})), "t"),
            Err(FillError::Invalid("it is empty"))
        );
    }
}
