//! A subscription's delivery options beyond the original API (all optional, echoed only when
//! supplied):
//!
//! * `destination.properties.signingSecrets`: `whsec_` secrets (one or more, for rotation):
//!   deliveries carry Standard Webhooks `webhook-id`/`webhook-timestamp`/`webhook-signature`.
//! * `destination.properties.deliveryAttributeMappings`: Event Grid's custom delivery
//!   properties, static or dynamic, for destinations that take them (headers for webhooks,
//!   message properties for Service Bus and Event Hubs): [`super::attributes`].
//! * `properties.deadLetterDestination`: a destination whose type can take dead letters (e.g.
//!   `{"endpointType": "WebHook", "properties": {"endpointUrl": "…"}}`), parsed by the same
//!   destination registry; dead letters are kept locally and also sent there.
//!
//! Secrets never show in `Debug` output or logs.

use super::attributes::{self, DeliveryAttribute};
use super::destination::{Destination, DestinationTypes, Role};
use super::json::Obj;
use super::Invalid;
use crate::config::Config;
use crate::model::signing_secret as signing;
use serde_json::{json, Map, Value};

/// Most signing secrets per subscription.
pub const MAX_SECRETS: usize = 5;

/// The options.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct DeliveryOptions {
    /// `whsec_` secrets; empty = unsigned.
    pub signing_secrets: Vec<String>,
    /// `deliveryAttributeMappings` (headers, or message properties).
    pub attributes: Vec<DeliveryAttribute>,
    /// Where dead letters are also sent (`deadLetterDestination`).
    pub dead_letter: Option<Destination>,
}

impl std::fmt::Debug for DeliveryOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeliveryOptions")
            .field("signing_secrets", &self.signing_secrets.len())
            .field("attributes", &self.attributes)
            .field("dead_letter", &self.dead_letter)
            .finish()
    }
}

fn bad(detail: &'static str, msg: impl Into<String>) -> Invalid {
    Invalid::new(detail, msg.into())
}

impl DeliveryOptions {
    /// Parse from the subscription's `properties` and its destination's `properties`
    /// (lowercased keys) for `destination` (which says whether it takes webhook options); the
    /// dead-letter destination is parsed by `types`.
    ///
    /// # Errors
    /// [`Invalid`] naming the field.
    pub fn parse(
        props: &Obj<'_>,
        dest_props: Option<&Obj<'_>>,
        destination: &Destination,
        cfg: &Config,
        types: &dyn DestinationTypes,
    ) -> Result<Self, Invalid> {
        let mut o = Self::default();
        if let Some(dp) = dest_props {
            if let Some(v) = dp.get("signingsecrets") {
                let list: Vec<&Value> = match v {
                    Value::Array(a) => a.iter().collect(),
                    other => vec![other],
                };
                for s in list {
                    let s = s.as_str().ok_or_else(|| {
                        bad(
                            "InvalidSigningSecret",
                            "destination.properties.signingSecrets must be strings",
                        )
                    })?;
                    signing::decode_secret(s).map_err(|e| {
                        bad(
                            "InvalidSigningSecret",
                            format!("destination.properties.signingSecrets: {e}"),
                        )
                    })?;
                    o.signing_secrets.push(s.trim().to_string());
                }
                if o.signing_secrets.len() > MAX_SECRETS {
                    return Err(bad(
                        "InvalidSigningSecret",
                        format!("at most {MAX_SECRETS} signing secrets"),
                    ));
                }
            }
            if let Some(v) = dp.get("deliveryattributemappings") {
                let Some(target) = destination.attributes() else {
                    return Err(bad(
                        "InvalidDestination",
                        format!(
                            "deliveryAttributeMappings do not apply to {} destinations",
                            destination.endpoint_type()
                        ),
                    ));
                };
                o.attributes = attributes::parse(v, target)?;
            }
        }
        if !destination.webhook_options() && !o.signing_secrets.is_empty() {
            return Err(bad(
                "InvalidDestination",
                format!(
                    "signingSecrets do not apply to {} destinations",
                    destination.endpoint_type()
                ),
            ));
        }
        if let Some(dl) = props.obj("deadletterdestination", "properties.deadLetterDestination")? {
            let t = dl.req_str("endpointtype", "endpointType")?;
            let empty = Value::Object(Map::new());
            let dl_props =
                match dl.obj("properties", "properties.deadLetterDestination.properties")? {
                    Some(p) => p,
                    None => Obj::new(&empty, "properties.deadLetterDestination.properties")?,
                };
            o.dead_letter = Some(types.parse(t, &dl_props, cfg, Role::DeadLetter)?);
        }
        Ok(o)
    }

    /// Echo into the destination's and the subscription's `properties` (the caller masks the
    /// destination's secrets; the dead-letter destination's are masked here when `masked`).
    pub fn echo(
        &self,
        dest_props: &mut Map<String, Value>,
        props: &mut Map<String, Value>,
        masked: bool,
    ) {
        if !self.signing_secrets.is_empty() {
            dest_props.insert("signingSecrets".into(), json!(self.signing_secrets));
        }
        if !self.attributes.is_empty() {
            let m: Vec<Value> = self.attributes.iter().map(|a| a.to_json()).collect();
            dest_props.insert("deliveryAttributeMappings".into(), Value::Array(m));
        }
        if let Some(d) = &self.dead_letter {
            props.insert("deadLetterDestination".into(), d.to_json(masked));
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::model::destination::testing::{cfg, topic, TestTypes};
    use crate::model::subscription::Subscription;
    use crate::policy::{ScheduleName, StatusCodePolicy};
    use serde_json::{json, Value};

    fn body(dest_extra: Value, props_extra: Value) -> Value {
        let mut dp = json!({"endpointUrl": "https://x/hook"});
        for (k, v) in dest_extra.as_object().unwrap() {
            dp[k] = v.clone();
        }
        let mut p = json!({"destination": {"endpointType": "WebHook", "properties": dp}});
        for (k, v) in props_extra.as_object().unwrap() {
            p[k] = v.clone();
        }
        json!({ "properties": p })
    }

    #[test]
    fn options_parse_echo_and_round_trip() {
        let c = cfg(&[]);
        let b = body(
            json!({"signingSecrets": ["whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"],
                   "deliveryAttributeMappings": [{"name": "X-Tenant", "type": "Static", "properties": {"value": "a", "isSecret": true}}]}),
            json!({"retryPolicy": {"schedule": "EventGridCloud", "statusCodePolicy": "standard"},
                   "deadLetterDestination": {"endpointType": "WebHook", "properties": {"endpointUrl": "http://dl/x"}}}),
        );
        let s = Subscription::from_put(&topic(), "s", b, &c, &TestTypes).unwrap();
        assert_eq!(s.delivery.signing_secrets.len(), 1);
        assert_eq!(s.delivery.attributes[0].name, "X-Tenant");
        assert_eq!(
            s.delivery.dead_letter.as_ref().and_then(|d| d.url()),
            Some("http://dl/x")
        );
        let p = s.effective_policy(&c);
        assert_eq!(p.schedule, ScheduleName::TenSecondsToHourly);
        assert_eq!(p.status_codes, StatusCodePolicy::Standard);
        assert_eq!(p.jitter_percent, 10);
        let echo = s.properties();
        assert_eq!(
            echo["retryPolicy"]["schedule"], "eventGridCloud",
            "stored by the old name, which older releases read"
        );
        assert_eq!(
            s.public_properties()["retryPolicy"]["schedule"],
            "tenSecondsToHourly",
            "shown by the name that says what it does"
        );
        assert_eq!(echo["retryPolicy"]["statusCodePolicy"], "standard");
        assert_eq!(
            echo["destination"]["properties"]["deliveryAttributeMappings"][0]["properties"]
                ["isSecret"],
            true
        );
        let again = Subscription::from_record(s.to_record(), &TestTypes).unwrap();
        assert_eq!(again.properties(), echo);
        assert!(
            !format!("{:?}", s.delivery).contains("C2FV"),
            "secrets stay out of Debug"
        );
        // Not supplied: not echoed, module defaults apply.
        let plain =
            Subscription::from_put(&topic(), "s", body(json!({}), json!({})), &c, &TestTypes)
                .unwrap();
        assert!(plain.properties().get("retryPolicy").is_none());
        assert!(plain.properties().get("deadLetterDestination").is_none());
        let m = cfg(&[
            ("broker__retrySchedule", "workfront"),
            ("broker__statusCodePolicy", "STANDARD"),
        ]);
        assert_eq!(
            plain.effective_policy(&m).schedule,
            ScheduleName::DoublingForFourDays
        );
        assert_eq!(
            plain.effective_policy(&m).status_codes,
            StatusCodePolicy::Standard
        );
        assert_eq!(
            plain.effective_policy(&c).status_codes,
            StatusCodePolicy::Original
        );
        assert_eq!(plain.effective_policy(&c).jitter_percent, 0);
    }

    #[test]
    fn invalid_options_are_refused_with_a_named_field() {
        let c = cfg(&[]);
        let cases = [
            body(json!({"signingSecrets": ["nope"]}), json!({})),
            body(
                json!({"deliveryAttributeMappings": [{"name": "aeg-sas-key", "properties": {"value": "x"}}]}),
                json!({}),
            ),
            body(
                json!({"deliveryAttributeMappings": [{"name": "X", "type": "Dynamic", "properties": {"value": "data"}}]}),
                json!({}),
            ),
            body(json!({}), json!({"retryPolicy": {"schedule": "hourly"}})),
            body(
                json!({}),
                json!({"retryPolicy": {"statusCodePolicy": "strict"}}),
            ),
            body(
                json!({}),
                json!({"deadLetterDestination": {"endpointType": "StorageBlob", "properties": {}}}),
            ),
        ];
        for b in cases {
            let e = Subscription::from_put(&topic(), "s", b.clone(), &c, &TestTypes).unwrap_err();
            let _: crate::model::Invalid = e; // always a 400 on the wire
        }
        let edge = json!({"properties": {"destination": {"endpointType": "EdgeHub", "properties": {"outputName": "o", "signingSecrets": ["whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"]}}}});
        assert!(Subscription::from_put(&topic(), "s", edge, &c, &TestTypes).is_err());
    }
}
