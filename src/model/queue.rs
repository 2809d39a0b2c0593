//! Event Grid namespaces' subscription shape on gridlet's own subscription routes:
//! `properties.deliveryConfiguration` with `deliveryMode` `Queue` (pull delivery: clients
//! receive under a lock and settle each event) or `Push` (gridlet's existing destinations), and
//! `properties.filtersConfiguration`.
//!
//! [`normalize`] rewrites a (lowercase-keyed) PUT body of that shape into gridlet's own shape
//! before [`super::subscription::Subscription::from_put`] reads it, so one parser stays the
//! only parser:
//! * `Push`: `push.destination` (or `push.deliveryWithResourceIdentity.destination`, whose
//!   identity is not used: a `resourceId` resolves through `outbound__resources`) becomes
//!   `destination`, `push.maxDeliveryCount` and
//!   `push.eventTimeToLive` the `retryPolicy`, the dead-letter destination `deadLetterDestination`;
//! * `Queue`: the queue settings are parsed into [`QueueSettings`] (the subscription has no
//!   destination), the dead-letter destination becomes `deadLetterDestination`;
//! * `filtersConfiguration` (`includedEventTypes`, `filters`) becomes `filter`, with arrays
//!   always compared element by element (`enableAdvancedFilteringOnArrays`: namespaces have no
//!   such property) and at most 25 values across all its filters.
//!
//! Limits as Event Grid documents them: `receiveLockDurationInSeconds` 60–300 (default 60),
//! `maxDeliveryCount` 1–10 (default 10), `eventTimeToLive` an ISO 8601 duration from one minute
//! to seven days (default seven days), and no longer than the topic's `eventRetentionInDays`
//! when it has one (which is then the default when shorter).

use super::destination::{Destination, DestinationSpec, SecretProperty};
use super::Invalid;
use serde_json::{json, Map, Value};
use std::time::Duration;

/// The `endpointType` a queue subscription's placeholder destination answers (never parsed
/// from a body, never delivered to: a queue subscription is read by receivers).
pub const QUEUE_ENDPOINT_TYPE: &str = "Queue";

/// Default and bounds of `receiveLockDurationInSeconds`.
pub const LOCK_SECONDS: (u64, u64, u64) = (60, 60, 300);
/// Default and bounds of `maxDeliveryCount`.
pub const MAX_DELIVERY_COUNT: (u64, u64, u64) = (10, 1, 10);
/// Most filter values across all the filters of a namespace subscription (a range of
/// `NumberInRange` counts as one), as Event Grid documents it.
pub const MAX_FILTER_VALUES: usize = 25;

/// The values a namespace subscription's `filters` hold, all filters together (`values` counts
/// its elements, `value` one; anything malformed is the filter parser's to refuse).
fn filter_values(filters: &Value) -> usize {
    let Some(filters) = filters.as_array() else {
        return 0;
    };
    filters
        .iter()
        .filter_map(Value::as_object)
        .map(|f| match (f.get("values"), f.get("value")) {
            (Some(Value::Array(v)), _) | (None, Some(Value::Array(v))) => v.len(),
            (_, Some(_)) => 1,
            _ => 0,
        })
        .sum()
}

/// Default and longest `eventTimeToLive`.
pub const EVENT_TTL_MAX: Duration = Duration::from_secs(7 * 24 * 3600);

/// A queue subscription's settings (`deliveryConfiguration.queue`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSettings {
    /// `receiveLockDurationInSeconds`: how long a received event stays locked to its receiver.
    pub lock_duration: Duration,
    /// `maxDeliveryCount`: receives before an unsettled event is dead-lettered.
    pub max_delivery_count: u32,
    /// `eventTimeToLive`: how long an event waits, from its publication.
    pub event_ttl: Duration,
    /// `eventTimeToLive` as given (echoed as is).
    pub event_ttl_text: String,
}

impl Default for QueueSettings {
    fn default() -> Self {
        Self {
            lock_duration: Duration::from_secs(LOCK_SECONDS.0),
            max_delivery_count: MAX_DELIVERY_COUNT.0 as u32,
            event_ttl: EVENT_TTL_MAX,
            event_ttl_text: "P7D".into(),
        }
    }
}

impl QueueSettings {
    /// `deliveryConfiguration` as echoed.
    pub fn to_json(&self) -> Value {
        json!({
            "deliveryMode": "Queue",
            "queue": {
                "receiveLockDurationInSeconds": self.lock_duration.as_secs(),
                "maxDeliveryCount": self.max_delivery_count,
                "eventTimeToLive": self.event_ttl_text,
            }
        })
    }
}

/// The destination a queue subscription holds in place of one: it delivers nowhere.
#[derive(Debug)]
struct QueueDestination;

impl DestinationSpec for QueueDestination {
    fn echo(&self, _props: &mut Map<String, Value>) {}
    fn secrets(&self) -> &'static [SecretProperty] {
        &[]
    }
}

/// The placeholder destination of a queue subscription.
pub fn destination() -> Destination {
    Destination::new(QUEUE_ENDPOINT_TYPE, QueueDestination)
}

fn bad(message: impl Into<String>) -> Invalid {
    Invalid::new("InvalidDeliveryConfiguration", message)
}

/// Rewrite `body` (keys lowercased) from the namespace shape into gridlet's (see the module
/// docs). Answers the queue settings when `deliveryMode` is `Queue`.
///
/// # Errors
/// [`Invalid`] naming the field: a missing or unknown `deliveryMode`, a setting out of range, a
/// `destination` on a queue subscription, a push configuration without a destination.
///
/// `retention_days`: the topic's `eventRetentionInDays`, which bounds `eventTimeToLive` (and
/// is a queue subscription's default when shorter than seven days).
pub fn normalize(
    body: &mut Value,
    retention_days: Option<u32>,
) -> Result<Option<QueueSettings>, Invalid> {
    let longest = longest_ttl(retention_days);
    let Some(props) = body.get_mut("properties").and_then(Value::as_object_mut) else {
        return Ok(None);
    };
    if let Some(fc) = props.remove("filtersconfiguration") {
        let Value::Object(mut fc) = fc else {
            return Err(Invalid::new(
                "InvalidFilter",
                "properties.filtersConfiguration must be a JSON object",
            ));
        };
        if !props.contains_key("filter") {
            let mut filter = Map::new();
            if let Some(t) = fc.remove("includedeventtypes") {
                filter.insert("includedeventtypes".into(), t);
            }
            if let Some(f) = fc.remove("filters") {
                let values = filter_values(&f);
                if values > MAX_FILTER_VALUES {
                    return Err(Invalid::new(
                        "InvalidFilter",
                        format!(
                            "properties.filtersConfiguration.filters hold {values} values; at most \
                             {MAX_FILTER_VALUES} are allowed across all the filters of a subscription"
                        ),
                    ));
                }
                filter.insert("advancedfilters".into(), f);
            }
            // Namespace subscriptions have no `enableAdvancedFilteringOnArrays`: arrays are
            // always compared element by element.
            filter.insert("enableadvancedfilteringonarrays".into(), Value::Bool(true));
            props.insert("filter".into(), Value::Object(filter));
        }
    }
    let Some(dc) = props.remove("deliveryconfiguration") else {
        return Ok(None);
    };
    let Value::Object(mut dc) = dc else {
        return Err(bad(
            "properties.deliveryConfiguration must be a JSON object",
        ));
    };
    let mode = match dc.get("deliverymode") {
        Some(Value::String(m)) => m.to_ascii_lowercase(),
        _ => {
            return Err(bad(
                "properties.deliveryConfiguration.deliveryMode is required: Queue or Push",
            ))
        }
    };
    match mode.as_str() {
        "queue" => {
            if props.contains_key("destination") {
                return Err(bad(
                    "a Queue subscription has no destination: its events are received (remove properties.destination, or use deliveryMode Push)",
                ));
            }
            let q = match dc.remove("queue") {
                None | Some(Value::Null) => Map::new(),
                Some(Value::Object(q)) => q,
                Some(_) => {
                    return Err(bad(
                        "properties.deliveryConfiguration.queue must be a JSON object",
                    ))
                }
            };
            move_dead_letter(&q, props);
            queue_settings(&q, longest).map(Some)
        }
        "push" => {
            let p =
                match dc.remove("push") {
                    Some(Value::Object(p)) => p,
                    _ => return Err(bad(
                        "properties.deliveryConfiguration.push is required with deliveryMode Push",
                    )),
                };
            push_settings(p, props, longest)?;
            Ok(None)
        }
        _ => Err(bad(format!(
            "properties.deliveryConfiguration.deliveryMode '{mode}' is not Queue or Push"
        ))),
    }
}

/// `deadLetterDestinationWithResourceIdentity.deadLetterDestination` (or a bare
/// `deadLetterDestination`) becomes the subscription's `deadLetterDestination`, unless it has one.
fn move_dead_letter(from: &Map<String, Value>, props: &mut Map<String, Value>) {
    let dl = from
        .get("deadletterdestinationwithresourceidentity")
        .and_then(|d| d.get("deadletterdestination"))
        .or_else(|| from.get("deadletterdestination"))
        .filter(|d| !d.is_null());
    if let Some(dl) = dl {
        if !props.contains_key("deadletterdestination") {
            props.insert("deadletterdestination".into(), dl.clone());
        }
    }
}

fn int(
    q: &Map<String, Value>,
    key: &str,
    display: &str,
    (dflt, min, max): (u64, u64, u64),
) -> Result<u64, Invalid> {
    let n = match q.get(key) {
        None | Some(Value::Null) => return Ok(dflt),
        Some(Value::Number(n)) => n.as_u64(),
        Some(Value::String(s)) => s.trim().parse().ok(),
        Some(_) => None,
    };
    match n {
        Some(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(bad(format!(
            "properties.deliveryConfiguration.{display} must be a whole number from {min} to {max}"
        ))),
    }
}

/// The longest `eventTimeToLive` a topic with `retention_days` allows, and how it is bounded.
#[derive(Clone, Copy)]
struct Longest {
    ttl: Duration,
    /// The topic's retention, when it is the bound.
    retention_days: Option<u32>,
}

fn longest_ttl(retention_days: Option<u32>) -> Longest {
    match retention_days {
        Some(d) if Duration::from_secs(u64::from(d) * 86400) < EVENT_TTL_MAX => Longest {
            ttl: Duration::from_secs(u64::from(d) * 86400),
            retention_days: Some(d),
        },
        _ => Longest {
            ttl: EVENT_TTL_MAX,
            retention_days: None,
        },
    }
}

fn ttl(
    q: &Map<String, Value>,
    path: &str,
    longest: Longest,
) -> Result<Option<(Duration, String)>, Invalid> {
    match q.get("eventtimetolive") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => {
            let d = parse_duration(s).ok_or_else(|| {
                bad(format!(
                    "properties.deliveryConfiguration.{path}.eventTimeToLive '{s}' is not an ISO 8601 duration (e.g. P1D, PT12H)"
                ))
            })?;
            if d < Duration::from_secs(60) || d > EVENT_TTL_MAX {
                return Err(bad(format!(
                    "properties.deliveryConfiguration.{path}.eventTimeToLive must be from PT1M to P7D"
                )));
            }
            if let (Some(days), true) = (longest.retention_days, d > longest.ttl) {
                return Err(bad(format!(
                    "properties.deliveryConfiguration.{path}.eventTimeToLive '{s}' is longer than the topic's eventRetentionInDays ({days})"
                )));
            }
            Ok(Some((d, s.trim().to_ascii_uppercase())))
        }
        Some(_) => Err(bad(format!(
            "properties.deliveryConfiguration.{path}.eventTimeToLive must be a string"
        ))),
    }
}

fn queue_settings(q: &Map<String, Value>, longest: Longest) -> Result<QueueSettings, Invalid> {
    let lock = int(
        q,
        "receivelockdurationinseconds",
        "queue.receiveLockDurationInSeconds",
        LOCK_SECONDS,
    )?;
    let count = int(
        q,
        "maxdeliverycount",
        "queue.maxDeliveryCount",
        MAX_DELIVERY_COUNT,
    )?;
    let mut s = QueueSettings {
        lock_duration: Duration::from_secs(lock),
        max_delivery_count: count as u32,
        ..QueueSettings::default()
    };
    if let Some(days) = longest.retention_days {
        s.event_ttl = longest.ttl;
        s.event_ttl_text = format!("P{days}D");
    }
    if let Some((d, text)) = ttl(q, "queue", longest)? {
        s.event_ttl = d;
        s.event_ttl_text = text;
    }
    Ok(s)
}

fn push_settings(
    mut p: Map<String, Value>,
    props: &mut Map<String, Value>,
    longest: Longest,
) -> Result<(), Invalid> {
    // Microsoft's shape with a managed identity: the identity is Azure's to use; on the device
    // the destination's `resourceId` resolves through `outbound__resources` instead.
    let with_identity = p
        .remove("deliverywithresourceidentity")
        .and_then(|d| match d {
            Value::Object(mut d) => d.remove("destination"),
            _ => None,
        })
        .filter(|d| !d.is_null());
    let dest = p.remove("destination").filter(|d| !d.is_null());
    if with_identity.is_some() && dest.is_some() {
        return Err(bad(
            "give push.destination or push.deliveryWithResourceIdentity.destination, not both",
        ));
    }
    let dest = with_identity.or(dest).ok_or_else(|| {
        bad("properties.deliveryConfiguration.push.destination is required with deliveryMode Push")
    })?;
    if props.contains_key("destination") {
        return Err(bad(
            "give the destination once: in properties.deliveryConfiguration.push.destination",
        ));
    }
    props.insert("destination".into(), dest);
    move_dead_letter(&p, props);
    let mut retry = Map::new();
    if p.contains_key("maxdeliverycount") {
        let n = int(
            &p,
            "maxdeliverycount",
            "push.maxDeliveryCount",
            MAX_DELIVERY_COUNT,
        )?;
        retry.insert("maxdeliveryattempts".into(), json!(n));
    }
    if let Some((d, _)) = ttl(&p, "push", longest)? {
        retry.insert(
            "eventexpiryinminutes".into(),
            json!(d.as_secs().div_ceil(60)),
        );
    }
    if !retry.is_empty() {
        match props.get_mut("retrypolicy") {
            Some(Value::Object(rp)) => {
                for (k, v) in retry {
                    rp.entry(k).or_insert(v);
                }
            }
            _ => {
                props.insert("retrypolicy".into(), Value::Object(retry));
            }
        }
    }
    Ok(())
}

/// An ISO 8601 duration (`P[nW][nY][nM][nD][T[nH][nM][n[.f]S]]`; a year counts 365 days, a
/// month 30), or `None`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim().to_ascii_uppercase();
    let rest = s.strip_prefix('P')?;
    let (date, time) = match rest.split_once('T') {
        Some((d, t)) if !t.is_empty() => (d, Some(t)),
        Some(_) => return None,
        None => (rest, None),
    };
    let mut secs = 0f64;
    let mut any = false;
    let mut walk = |part: &str, units: &[(char, f64)]| -> Option<()> {
        let mut num = String::new();
        let mut next = 0usize;
        for c in part.chars() {
            if c.is_ascii_digit() || c == '.' {
                num.push(c);
                continue;
            }
            let i = units.iter().skip(next).position(|(u, _)| *u == c)? + next;
            let n: f64 = num.parse().ok()?;
            secs += n * units[i].1;
            any = true;
            num.clear();
            next = i + 1;
        }
        num.is_empty().then_some(())
    };
    walk(
        date,
        &[
            ('Y', 365.0 * 86400.0),
            ('M', 30.0 * 86400.0),
            ('W', 7.0 * 86400.0),
            ('D', 86400.0),
        ],
    )?;
    if let Some(t) = time {
        walk(t, &[('H', 3600.0), ('M', 60.0), ('S', 1.0)])?;
    }
    (any && secs.is_finite() && secs >= 0.0).then(|| Duration::from_millis((secs * 1000.0) as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::json::lower_keys;

    #[test]
    fn iso_durations() {
        let d = |s| parse_duration(s).map(|d| d.as_secs());
        assert_eq!(d("P1D"), Some(86400));
        assert_eq!(d("PT12H"), Some(43200));
        assert_eq!(d("P1DT1H1M1S"), Some(90061));
        assert_eq!(d("pt1m"), Some(60));
        assert_eq!(d("P1W"), Some(7 * 86400));
        assert_eq!(d("PT0.5S").map(|_| ()), Some(()));
        for bad in ["", "P", "PT", "1D", "P1H", "PT1D", "P1D2", "PXD", "P1M1Y"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }

    fn norm(v: Value) -> (Value, Result<Option<QueueSettings>, Invalid>) {
        let mut v = lower_keys(v);
        let r = normalize(&mut v, None);
        (v, r)
    }

    #[test]
    fn queue_settings_take_their_defaults_and_bounds() {
        let (_, r) = norm(json!({"properties":{"deliveryConfiguration":{"deliveryMode":"Queue"}}}));
        assert_eq!(r.unwrap(), Some(QueueSettings::default()));
        let (_, r) = norm(
            json!({"properties":{"deliveryConfiguration":{"deliveryMode":"queue",
            "queue":{"receiveLockDurationInSeconds":300,"maxDeliveryCount":1,"eventTimeToLive":"PT1H"}}}}),
        );
        let s = r.unwrap().unwrap();
        assert_eq!(s.lock_duration, Duration::from_secs(300));
        assert_eq!(s.max_delivery_count, 1);
        assert_eq!(s.event_ttl, Duration::from_secs(3600));
        for q in [
            json!({"receiveLockDurationInSeconds":59}),
            json!({"receiveLockDurationInSeconds":301}),
            json!({"maxDeliveryCount":0}),
            json!({"maxDeliveryCount":11}),
            json!({"eventTimeToLive":"P8D"}),
            json!({"eventTimeToLive":"PT30S"}),
            json!({"eventTimeToLive":"one day"}),
        ] {
            let (_, r) = norm(
                json!({"properties":{"deliveryConfiguration":{"deliveryMode":"Queue","queue":q}}}),
            );
            assert_eq!(r.unwrap_err().code, "InvalidDeliveryConfiguration");
        }
        let (_, r) =
            norm(json!({"properties":{"deliveryConfiguration":{"deliveryMode":"Stream"}}}));
        assert!(r.is_err());
        let (_, r) = norm(
            json!({"properties":{"deliveryConfiguration":{"deliveryMode":"Queue"},
            "destination":{"endpointType":"WebHook"}}}),
        );
        assert!(r.is_err(), "a queue subscription has no destination");
    }

    #[test]
    fn push_and_filters_map_onto_gridlets_shape() {
        let (v, r) = norm(json!({"properties":{
            "deliveryConfiguration":{"deliveryMode":"Push","push":{
                "maxDeliveryCount":3,"eventTimeToLive":"PT90S",
                "destination":{"endpointType":"WebHook","properties":{"endpointUrl":"https://x"}},
                "deadLetterDestinationWithResourceIdentity":{"deadLetterDestination":{"endpointType":"StorageBlob"}}}},
            "filtersConfiguration":{"includedEventTypes":["a"],"filters":[{"operatorType":"BoolEquals","key":"data.b","value":true}]}}}));
        assert_eq!(r.unwrap(), None);
        let p = &v["properties"];
        assert_eq!(p["destination"]["endpointtype"], "WebHook");
        assert_eq!(
            p["retrypolicy"],
            json!({"maxdeliveryattempts":3,"eventexpiryinminutes":2})
        );
        assert_eq!(p["deadletterdestination"]["endpointtype"], "StorageBlob");
        assert_eq!(p["filter"]["includedeventtypes"], json!(["a"]));
        assert_eq!(p["filter"]["advancedfilters"][0]["key"], "data.b");
        let (_, r) = norm(json!({"properties":{"deliveryConfiguration":{"deliveryMode":"Push"}}}));
        assert!(r.is_err(), "push needs a destination");
        let (v, r) = norm(
            json!({"properties":{"deliveryConfiguration":{"deliveryMode":"Push","push":{
            "deliveryWithResourceIdentity":{"identity":{"type":"SystemAssigned"},
                "destination":{"endpointType":"EventHub","properties":{"resourceId":"/x/eventhubs/h"}}}}}}}),
        );
        assert_eq!(r.unwrap(), None);
        assert_eq!(
            v["properties"]["destination"]["properties"]["resourceid"],
            "/x/eventhubs/h"
        );
    }

    #[test]
    fn event_ttl_is_bounded_by_the_topics_retention() {
        let sub = |ttl: Option<&str>| {
            let mut q = json!({});
            if let Some(t) = ttl {
                q["eventTimeToLive"] = json!(t);
            }
            lower_keys(
                json!({"properties":{"deliveryConfiguration":{"deliveryMode":"Queue","queue":q}}}),
            )
        };
        let s = normalize(&mut sub(None), Some(2)).unwrap().unwrap();
        assert_eq!(
            s.event_ttl,
            Duration::from_secs(2 * 86400),
            "the default is the retention"
        );
        assert_eq!(s.event_ttl_text, "P2D");
        let s = normalize(&mut sub(Some("PT48H")), Some(2))
            .unwrap()
            .unwrap();
        assert_eq!(s.event_ttl, Duration::from_secs(2 * 86400));
        let e = normalize(&mut sub(Some("P3D")), Some(2)).unwrap_err();
        assert!(e.to_string().contains("eventRetentionInDays (2)"), "{e}");
        assert!(normalize(&mut sub(Some("P7D")), Some(7)).is_ok());
        assert_eq!(
            normalize(&mut sub(None), None).unwrap().unwrap(),
            QueueSettings::default()
        );
        let mut push = lower_keys(
            json!({"properties":{"deliveryConfiguration":{"deliveryMode":"Push","push":{
            "eventTimeToLive":"P2D",
            "destination":{"endpointType":"WebHook","properties":{"endpointUrl":"https://x"}}}}}}),
        );
        assert!(normalize(&mut push, Some(1)).is_err());
    }

    #[test]
    fn namespace_filters_compare_arrays_and_hold_25_values_in_all() {
        let filters = |per: usize, n: usize| {
            let fs: Vec<Value> = (0..n)
                .map(|i| json!({"operatorType":"NumberIn","key":format!("data.k{i}"),"values":vec![1; per]}))
                .collect();
            json!({"properties":{"filtersConfiguration":{"filters": fs}}})
        };
        let (v, r) = norm(filters(5, 5));
        r.unwrap();
        assert_eq!(
            v["properties"]["filter"]["enableadvancedfilteringonarrays"], true,
            "namespace subscriptions have no such property: arrays are always on"
        );
        let (_, r) = norm(filters(5, 6));
        let e = r.unwrap_err();
        assert_eq!(e.code, "InvalidFilter");
        assert!(e.to_string().contains("30 values"), "{e}");
        // A range counts as one value; `value` as one.
        let (_, r) = norm(json!({"properties":{"filtersConfiguration":{"filters":[
            {"operatorType":"NumberInRange","key":"data.a","values":vec![[1, 2]; 24]},
            {"operatorType":"BoolEquals","key":"data.b","value":true}]}}}));
        r.unwrap();
    }
}
