//! The MQTT destination's sink: each event of a batch is one MQTT 5 message, published on a
//! shared connection ([`super::publish::Publishers`]).
//!
//! * Topic: the subscription's template filled from the event ([`TopicTemplate`]).
//! * Payload: the event as the subscription's delivery schema shapes it (one JSON object, not
//!   the array a webhook gets). Content type `application/cloudevents+json; charset=utf-8` for
//!   CloudEvents (the CloudEvents MQTT binding's structured mode), `application/json;
//!   charset=utf-8` otherwise; payload format indicator 1 (UTF-8).
//! * Message expiry interval: the event's time to live left (whole seconds, at least 1), so a
//!   broker does not hand a subscriber an event gridlet would already have given up on.
//! * User properties: the subscription's `deliveryAttributeMappings` (static, or dynamic from
//!   the event), then `traceparent` / `tracestate` when the delivery carries a trace context.
//!
//! Outcome per event:
//!
//! | answer | outcome |
//! |---|---|
//! | PUBACK 0x00 success, 0x10 no matching subscribers; QoS 0 written | delivered |
//! | PUBACK 0x87 not authorized, 0x90 topic name invalid, 0x99 payload format invalid | refused: dead-lettered at once |
//! | larger than the broker's maximum packet size (CONNACK; MQTT 5's 0x95 packet too large) | too large: dead-lettered at once, never sent |
//! | a topic that the template cannot fill from the event, or that is not a valid topic | refused: dead-lettered at once, never sent |
//! | PUBACK 0x80 unspecified, 0x83 implementation specific, 0x91 packet id in use, 0x97 quota exceeded | retried on the schedule |
//! | not connected, connection refused or lost before the PUBACK | connection failure: retried |
//! | no PUBACK within `broker__deliveryTimeoutInSeconds` | timeout: retried |

use super::connection::ConnectionSpec;
use super::publish::{Message, PublishError, Publisher, Publishers};
use super::topic::TopicTemplate;
use crate::delivery::sink::{DeliveryRequest, FailureKind, Outcome, Sink};
use crate::model::attributes::DeliveryAttribute;
use crate::model::topic::EventSchema;
use futures_util::future::{join_all, BoxFuture};
use rumqttc::v5::mqttbytes::v5::{PubAckReason, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What a sink publishes and where.
#[derive(Debug, Clone)]
pub struct MqttTarget {
    /// The broker connection.
    pub spec: ConnectionSpec,
    /// The spec's client id was given (else the shared connection makes one up).
    pub own_client_id: bool,
    /// Topic template.
    pub topic: TopicTemplate,
    /// QoS 0 or 1.
    pub qos: QoS,
    /// Retain flag.
    pub retain: bool,
}

/// Publishes a subscription's events to an MQTT broker.
pub struct MqttSink {
    publishers: Arc<Publishers>,
    target: MqttTarget,
    attributes: Vec<DeliveryAttribute>,
    timeout: Duration,
    /// The connection, once the first attempt opened (or found) it.
    conn: Mutex<Option<Arc<Publisher>>>,
}

/// Whether a failing PUBACK reason means the message can never be accepted as it is.
pub fn permanent(reason: PubAckReason) -> bool {
    matches!(
        reason,
        PubAckReason::NotAuthorized
            | PubAckReason::TopicNameInvalid
            | PubAckReason::PayloadFormatInvalid
    )
}

fn failure(e: PublishError) -> FailureKind {
    match e {
        PublishError::Disconnected => FailureKind::Connect,
        PublishError::Refused(r) if permanent(r) => FailureKind::Refused {
            status: None,
            message: e.to_string(),
        },
        PublishError::Refused(_) | PublishError::QueueFull | PublishError::Setup(_) => {
            FailureKind::Other(e.to_string())
        }
    }
}

/// The content type of one event in `schema`.
fn content_type(schema: EventSchema) -> &'static str {
    match schema {
        EventSchema::CloudEventV1_0 => "application/cloudevents+json; charset=utf-8",
        _ => "application/json; charset=utf-8",
    }
}

impl MqttSink {
    /// A sink for `target` over `publishers`, with the subscription's delivery `attributes`;
    /// each message waits up to `timeout` for its PUBACK.
    pub fn new(
        publishers: Arc<Publishers>,
        target: MqttTarget,
        attributes: Vec<DeliveryAttribute>,
        timeout: Duration,
    ) -> Self {
        Self {
            publishers,
            target,
            attributes,
            timeout,
            conn: Mutex::new(None),
        }
    }

    fn connection(&self) -> Result<Arc<Publisher>, PublishError> {
        let mut c = crate::sync::lock(&self.conn);
        if let Some(p) = c.as_ref() {
            return Ok(p.clone());
        }
        let p = self
            .publishers
            .get(&self.target.spec, self.target.own_client_id)?;
        *c = Some(p.clone());
        Ok(p)
    }

    /// Event `i` of `req` as a message, or why it can never be one.
    fn message(&self, req: &DeliveryRequest, i: usize) -> Result<Message, FailureKind> {
        let body = &req.events[i];
        let needs_json =
            !self.target.topic.is_fixed() || self.attributes.iter().any(|a| a.is_dynamic());
        let parsed = match needs_json {
            true => serde_json::from_slice::<Value>(body).ok(),
            false => None,
        };
        let topic = self
            .target
            .topic
            .fill(parsed.as_ref(), &req.topic)
            .map_err(|e| FailureKind::Refused {
                status: None,
                message: e.to_string(),
            })?;
        let mut user = Vec::with_capacity(self.attributes.len() + 2);
        for a in &self.attributes {
            if let Some(v) = a.resolve(parsed.as_ref()) {
                user.push((a.name.clone(), v));
            }
        }
        if let Some(t) = req.trace.of(i) {
            user.push(("traceparent".into(), t.traceparent()));
            if let Some(s) = &t.state {
                user.push(("tracestate".into(), s.to_string()));
            }
        }
        let expiry = req.time_left_of(i).map(|d| {
            let secs = d.as_millis().div_ceil(1000).max(1);
            u32::try_from(secs).unwrap_or(u32::MAX)
        });
        Ok(Message {
            topic,
            qos: self.target.qos,
            retain: self.target.retain,
            payload: body.clone(),
            properties: PublishProperties {
                payload_format_indicator: Some(1),
                message_expiry_interval: expiry,
                content_type: Some(content_type(req.schema).to_string()),
                user_properties: user,
                ..Default::default()
            },
        })
    }
}

impl Sink for MqttSink {
    fn send<'a>(&'a self, req: &'a DeliveryRequest) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            let conn = match self.connection() {
                Ok(c) => c,
                Err(e) => return Outcome::failed(failure(e)),
            };
            let deadline = tokio::time::Instant::now() + self.timeout;
            // Published in order, one after the other; their PUBACKs are awaited together.
            let mut waits = Vec::with_capacity(req.events.len());
            for i in 0..req.events.len() {
                let sent = match self.message(req, i) {
                    Ok(m) if m.packet_size() > conn.max_packet() => {
                        Err(FailureKind::TooLarge(format!(
                            "a {}-byte MQTT packet; the broker takes at most {} bytes",
                            m.packet_size(),
                            conn.max_packet()
                        )))
                    }
                    Ok(m) => match tokio::time::timeout_at(deadline, conn.publish(m)).await {
                        Ok(r) => r.map_err(failure),
                        Err(_) => Err(FailureKind::Timeout),
                    },
                    Err(kind) => Err(kind),
                };
                waits.push(async move {
                    let rx = match sent {
                        Ok(rx) => rx,
                        Err(kind) => return Outcome::failed(kind),
                    };
                    match tokio::time::timeout_at(deadline, rx).await {
                        Ok(Ok(Ok(()))) => Outcome::Delivered,
                        Ok(Ok(Err(e))) => Outcome::failed(failure(e)),
                        Ok(Err(_)) => Outcome::failed(FailureKind::Connect),
                        Err(_) => Outcome::failed(FailureKind::Timeout),
                    }
                });
            }
            Outcome::per_event(join_all(waits).await)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbound::mqtt::publish::reason_code;

    #[test]
    fn the_reason_code_split() {
        let all = [
            PubAckReason::UnspecifiedError,
            PubAckReason::ImplementationSpecificError,
            PubAckReason::NotAuthorized,
            PubAckReason::TopicNameInvalid,
            PubAckReason::PacketIdentifierInUse,
            PubAckReason::QuotaExceeded,
            PubAckReason::PayloadFormatInvalid,
        ];
        let codes: Vec<(u8, bool)> = all
            .iter()
            .map(|r| (reason_code(*r), permanent(*r)))
            .collect();
        assert_eq!(
            codes,
            [
                (0x80, false),
                (0x83, false),
                (0x87, true),
                (0x90, true),
                (0x91, false),
                (0x97, false),
                (0x99, true)
            ]
        );
        assert!(matches!(
            failure(PublishError::Refused(PubAckReason::NotAuthorized)),
            FailureKind::Refused { message: m, .. } if m.contains("0x87") && m.contains("not authorized")
        ));
        assert!(matches!(
            failure(PublishError::Refused(PubAckReason::QuotaExceeded)),
            FailureKind::Other(m) if m.contains("0x97")
        ));
        assert_eq!(failure(PublishError::Disconnected), FailureKind::Connect);
    }
}
