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
