//! What a dead-letter blob holds and what it is called.
//!
//! [`BlobFormat::EventGrid`] (the default) writes what Event Grid writes, so dead-letter
//! processors written for Event Grid work unchanged (Microsoft's "Set dead-letter location
//! and retry policy" and "Event Grid message delivery and retry", "Delivery event formats"):
//!
//! * name: `{SUBSCRIPTION NAME, UPPER CASE}/{year}/{month}/{day}/{hour}/{guid}.json`, the date
//!   and hour in UTC without zero padding (`MY-SUB/2019/8/8/5/…`); the page's example has no
//!   topic segment, so neither does gridlet (letters of two topics' same-named subscriptions
//!   share the prefix; the guid keeps them apart);
//! * content: a JSON **array** of the dead-lettered events, each the event as delivered with
//!   `deadLetterReason`, `deliveryAttempts`, `lastDeliveryOutcome`, `publishTime` and
//!   `lastDeliveryAttemptTime` added (all lowercase for CloudEvents: `deadletterreason`, …),
//!   plus `lastHttpStatusCode` when a status was received. A custom-schema event is wrapped as
//!   the page shows: an Event Grid envelope whose `data` is the event.
//!
//! [`BlobFormat::Gridlet`] writes gridlet's own record (one blob per letter, the dead-letter
//! API's JSON, named `{topic}/{subscription}/{time}-{batch}-{n}-{eventId}.json`).

use serde_json::{Map, Value};

/// The shape of the blobs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BlobFormat {
    /// Event Grid's layout and content (the default).
    #[default]
    EventGrid,
    /// gridlet's own record, one blob per letter.
    Gridlet,
}

impl BlobFormat {
    /// Parse a `deadLetterFormat` value (any case).
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "eventgrid" => Some(Self::EventGrid),
            "gridlet" => Some(Self::Gridlet),
            _ => None,
        }
    }

    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::EventGrid => "eventGrid",
            Self::Gridlet => "gridlet",
        }
    }
}

/// Event Grid's `lastDeliveryOutcome` word for a letter's last status and error text.
pub fn last_outcome(status: Option<u64>, error: Option<&str>) -> &'static str {
    match status {
        Some(400) => return "BadRequest",
        Some(401) => return "Unauthorized",
        Some(403) => return "Forbidden",
        Some(404) => return "NotFound",
        Some(408) => return "TimedOut",
        Some(410) => return "NotFound",
        Some(413) => return "RequestEntityTooLarge",
        Some(429 | 503) => return "Busy",
        Some(_) => return "GenericError",
        None => {}
    }
    match error {
        Some(e) if e.starts_with("timeout") => "TimedOut",
        Some(e) if e.starts_with("too large") => "RequestEntityTooLarge",
        Some(e) if e.starts_with("credential expired") => "Unauthorized",
        Some(_) => "GenericError",
        // Never attempted (expired waiting, or refused at publish).
        None => "None",
    }
}

/// One Event Grid dead-letter event from gridlet's letter JSON (the dead-letter API shape).
pub fn event_grid_letter(letter: &Value) -> Value {
    let s = |k: &str| letter.get(k).and_then(Value::as_str).unwrap_or("");
    let status = letter.get("lastHttpStatusCode").and_then(Value::as_u64);
    let outcome = last_outcome(status, letter.get("lastError").and_then(Value::as_str));
    let event = letter.get("event").cloned().unwrap_or(Value::Null);
    let cloud = event.get("specversion").is_some();
    let mut out: Map<String, Value> = match event {
        Value::Object(m) if cloud || m.contains_key("eventType") => m,
        // Custom schema: an Event Grid envelope around the event.
        other => {
            let mut m = Map::new();
            m.insert("id".into(), s("eventId").into());
            m.insert("eventTime".into(), s("firstEnqueuedTime").into());
            m.insert("eventType".into(), "".into());
            m.insert("dataVersion".into(), "".into());
            m.insert("metadataVersion".into(), "1".into());
            m.insert("subject".into(), "".into());
            m.insert("data".into(), other);
            m
        }
    };
    let key = |camel: &'static str| -> String {
        if cloud {
            camel.to_ascii_lowercase()
        } else {
            camel.to_string()
        }
    };
    out.insert(key("deadLetterReason"), s("reason").into());
    out.insert(
        key("deliveryAttempts"),
        letter.get("deliveryAttempts").cloned().unwrap_or(0.into()),
    );
    out.insert(key("lastDeliveryOutcome"), outcome.into());
    if let Some(st) = status {
        out.insert(key("lastHttpStatusCode"), st.into());
    }
    out.insert(key("publishTime"), s("firstEnqueuedTime").into());
    out.insert(key("lastDeliveryAttemptTime"), s("deadLetteredTime").into());
    Value::Object(out)
}

/// `(year, month, day, hour)` in UTC.
pub type UtcHour = (u32, u32, u32, u32);

/// The [`UtcHour`] of an RFC 3339 UTC time (`2026-11-24T09:59:59.999Z`).
pub fn utc_hour(time: &str) -> Option<UtcHour> {
    let n = |r: std::ops::Range<usize>| time.get(r)?.parse::<u32>().ok();
    Some((n(0..4)?, n(5..7)?, n(8..10)?, n(11..13)?))
}

/// A random (version 4) GUID.
pub fn guid() -> String {
    let mut b = [0u8; 16];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// `{SUBSCRIPTION}/{y}/{m}/{d}/{h}/{guid}.json` (the subscription segment URL-encoded).
pub fn event_grid_blob_name(subscription: &str, hour: UtcHour) -> String {
    let (y, m, d, h) = hour;
    format!(
        "{}/{y}/{m}/{d}/{h}/{}.json",
        super::sas::encode(&subscription.to_ascii_uppercase()),
        guid()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn letter(event: Value, status: Option<u16>, error: &str) -> Value {
        json!({"id": "1", "eventId": "e1", "reason": "MaxDeliveryAttemptsExceeded",
               "lastHttpStatusCode": status, "lastError": error, "deliveryAttempts": 3,
               "firstEnqueuedTime": "2019-08-08T05:01:02.000Z",
               "deadLetteredTime": "2019-08-08T05:09:00.000Z", "event": event})
    }

    #[test]
    fn event_grid_schema_letters_get_the_documented_fields() {
        let l = event_grid_letter(&letter(
            json!({"id": "e1", "eventType": "t", "data": {"a": 1}}),
            Some(404),
            "HTTP 404",
        ));
        assert_eq!(l["id"], "e1");
        assert_eq!(l["data"]["a"], 1);
        assert_eq!(l["deadLetterReason"], "MaxDeliveryAttemptsExceeded");
        assert_eq!(l["deliveryAttempts"], 3);
        assert_eq!(l["lastDeliveryOutcome"], "NotFound");
        assert_eq!(l["lastHttpStatusCode"], 404);
        assert_eq!(l["publishTime"], "2019-08-08T05:01:02.000Z");
        assert_eq!(l["lastDeliveryAttemptTime"], "2019-08-08T05:09:00.000Z");
    }

    #[test]
    fn cloud_events_use_lowercase_and_custom_events_are_wrapped() {
        let l = event_grid_letter(&letter(
            json!({"specversion": "1.0", "id": "e1", "type": "t", "source": "s"}),
            None,
            "timeout",
        ));
        assert_eq!(l["deadletterreason"], "MaxDeliveryAttemptsExceeded");
        assert_eq!(l["lastdeliveryoutcome"], "TimedOut");
        assert!(l.get("lasthttpstatuscode").is_none());
        assert!(l.get("deadLetterReason").is_none());
        let c = event_grid_letter(&letter(json!({"prop1": "x"}), Some(503), "busy"));
        assert_eq!(c["data"]["prop1"], "x");
        assert_eq!(c["id"], "e1");
        assert_eq!(c["lastDeliveryOutcome"], "Busy");
    }

    #[test]
    fn names_follow_event_grids_layout() {
        let h = utc_hour("2019-08-08T05:09:00.000Z").unwrap();
        let n = event_grid_blob_name("My-Blob-Subscription", h);
        assert!(n.starts_with("MY-BLOB-SUBSCRIPTION/2019/8/8/5/"), "{n}");
        assert!(n.ends_with(".json") && n.len() == "MY-BLOB-SUBSCRIPTION/2019/8/8/5/".len() + 41);
        assert_ne!(guid(), guid());
        assert_eq!(BlobFormat::parse("EVENTGRID"), Some(BlobFormat::EventGrid));
        assert_eq!(BlobFormat::parse("x"), None);
    }
}
