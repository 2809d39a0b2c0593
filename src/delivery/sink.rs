//! The seam between the engine and the outside world: a [`Sink`] sends one batch and reports an
//! [`Outcome`]; it never decides about retries (that is [`super::retry`]'s job).

use crate::model::subscription::Subscription;
use crate::model::topic::EventSchema;
use crate::telemetry::TraceContext;
use bytes::{BufMut, Bytes, BytesMut};
use futures_util::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;

/// One delivery request: a batch of events for one subscription.
#[derive(Debug, Clone)]
pub struct DeliveryRequest {
    /// Topic name.
    pub topic: Arc<str>,
    /// Subscription name.
    pub subscription: Arc<str>,
    /// Delivery schema.
    pub schema: EventSchema,
    /// The events (each one JSON object's bytes).
    pub events: Vec<Bytes>,
    /// 1-based attempt number of this batch (its first event's).
    pub attempt: u32,
    /// 1-based attempt number of each event, in order (a retried batch may join events with
    /// different histories); empty means every event is at [`DeliveryRequest::attempt`].
    pub attempts_each: Vec<u32>,
    /// A stable id for this batch across its retries (first event's sequence number).
    pub batch_id: u64,
    /// The trace context the attempt carries onward, for the request and for each event.
    /// Set by the engine for every attempt: a sink reads it here and needs nothing else.
    pub trace: OnwardTrace,
    /// Each event's time to live left when the attempt started (first enqueued + TTL - now),
    /// in order (an MQTT message's expiry interval); empty when not known (dead letters being
    /// forwarded).
    pub time_left: Vec<Duration>,
}

impl DeliveryRequest {
    /// The events as one JSON array (the body webhooks always get, even for one event).
    pub fn json_array(&self) -> Bytes {
        json_array(&self.events)
    }

    /// Event `i`'s time to live left when the attempt started, if known.
    pub fn time_left_of(&self, i: usize) -> Option<Duration> {
        self.time_left.get(i).copied()
    }

    /// The attempt number of event `i` (1-based).
    pub fn attempt_of(&self, i: usize) -> u32 {
        self.attempts_each.get(i).copied().unwrap_or(self.attempt)
    }
}

/// The W3C trace context an attempt carries onward: the `deliver` span's (or, with tracing off,
/// the context the events were published in). One for the request as a whole, and one per event
/// when the batch mixes traces; a sink asks for what it sends ([`OnwardTrace::request`] for an
/// HTTP request's `traceparent` / `tracestate` headers, [`OnwardTrace::of`] for a message's
/// properties). The default carries none (dead letters being forwarded).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OnwardTrace {
    /// The request's context.
    request: Option<TraceContext>,
    /// Each event's, in order, when the batch mixes contexts; empty when every event travels in
    /// `request`'s (the usual case: nothing is built per event).
    each: Vec<Option<TraceContext>>,
}

impl OnwardTrace {
    /// Every event of the attempt in `request`'s context (none: no context at all).
    pub fn whole(request: Option<TraceContext>) -> Self {
        Self {
            request,
            each: Vec::new(),
        }
    }

    /// A batch whose events may travel in different contexts: `each` in the events' order
    /// (empty: every event in `request`'s), `request` for the request as a whole.
    pub fn per_event(request: Option<TraceContext>, each: Vec<Option<TraceContext>>) -> Self {
        Self { request, each }
    }

    /// The context of the request as a whole (`traceparent` and `tracestate` headers; the
    /// trace and span ids of a log line about the attempt).
    pub fn request(&self) -> Option<&TraceContext> {
        self.request.as_ref()
    }

    /// Event `i`'s context (per-message properties on Service Bus, Event Hubs and MQTT).
    pub fn of(&self, i: usize) -> Option<&TraceContext> {
        match self.each.is_empty() {
            true => self.request.as_ref(),
            false => self.each.get(i).and_then(Option::as_ref),
        }
    }

    /// The `trace_id` and `span_id` fields of a log line about the attempt.
    pub fn log_ids(&self) -> (Option<String>, Option<String>) {
        TraceContext::log_ids(self.request.as_ref())
    }
}

/// Join event objects into a JSON array without re-serialising them.
pub fn json_array(events: &[Bytes]) -> Bytes {
    let len: usize = events.iter().map(Bytes::len).sum::<usize>() + events.len() + 2;
    let mut out = BytesMut::with_capacity(len);
    out.put_u8(b'[');
    for (i, e) in events.iter().enumerate() {
        if i > 0 {
            out.put_u8(b',');
        }
        out.put_slice(e);
    }
    out.put_u8(b']');
    out.freeze()
}

/// Why an attempt failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailureKind {
    /// The endpoint answered with a non-success status.
    Status(u16),
    /// An Azure service answered with a non-success status and said why (its error text, kept
    /// for the log and the dead letter; never a secret: services do not echo keys).
    Service {
        /// HTTP status.
        status: u16,
        /// The service's error text (trimmed, at most a few hundred characters).
        message: String,
    },
    /// The event can never be delivered to this destination (e.g. larger than a Storage queue
    /// message can hold): refused at once under every status-code policy.
    TooLarge(String),
    /// The connection string's ready-made shared access signature has expired (its `se` has
    /// passed): nothing was sent. A configuration fault (retried: a new connection string fixes
    /// it), reported apart in the log, `gridlet_destination_faults_total{fault="sasExpired"}`
    /// and the dead letter's `lastError`.
    CredentialExpired(String),
    /// The destination refused the event for good (a namespace topic that no longer exists:
    /// 410; an event that has no form the destination takes; an MQTT PUBACK reason code such as
    /// 0x87 not authorized or 0x90 topic name invalid): dead-lettered at once under every
    /// status-code policy. Says nothing about the endpoint's health (it answered).
    Refused {
        /// HTTP status, when a response said so.
        status: Option<u16>,
        /// Why (the service's text, or gridlet's).
        message: String,
    },
    /// The service asked to back off (an Event Grid namespace's 403 for an exceeded quota):
    /// retried under every policy, `Retry-After` honoured.
    Throttled {
        /// HTTP status.
        status: u16,
        /// The service's text.
        message: String,
    },
    /// No response within the delivery timeout.
    Timeout,
    /// The connection could not be made or broke.
    Connect,
    /// The destination type cannot be delivered to from here.
    Unsupported(String),
    /// Anything else (TLS, protocol).
    Other(String),
}

impl std::fmt::Display for FailureKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Status(s) => write!(f, "HTTP {s}"),
            Self::Service { status, message } if message.is_empty() => write!(f, "HTTP {status}"),
            Self::Service { status, message } => write!(f, "HTTP {status}: {message}"),
            Self::TooLarge(m) => write!(f, "too large: {m}"),
            Self::CredentialExpired(m) => write!(f, "credential expired: {m}"),
            Self::Refused {
                status: Some(s),
                message,
            } => write!(f, "HTTP {s}: refused for good: {message}"),
            Self::Refused {
                status: None,
                message,
            } => write!(f, "refused: {message}"),
            Self::Throttled { status, message } => {
                write!(f, "HTTP {status}: throttled: {message}")
            }
            Self::Timeout => write!(f, "timeout"),
            Self::Connect => write!(f, "connection failed"),
            Self::Unsupported(m) => write!(f, "unsupported: {m}"),
            Self::Other(m) => write!(f, "{m}"),
        }
    }
}

/// The result of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Accepted by the destination (HTTP 200–204, MQTT PUBACK).
    Delivered,
    /// Not accepted.
    Failed {
        /// Why.
        kind: FailureKind,
        /// A `Retry-After` the endpoint asked for.
        retry_after: Option<Duration>,
    },
    /// The batch's events fared differently (a sink that sends several requests per batch,
    /// or refuses one oversized event and delivers the rest): one outcome per event, in order,
    /// none of them `PerEvent`. Built by [`Outcome::per_event`].
    PerEvent(Vec<Outcome>),
}

impl Outcome {
    /// A failure without `Retry-After`.
    pub fn failed(kind: FailureKind) -> Self {
        Self::Failed {
            kind,
            retry_after: None,
        }
    }

    /// The outcome of a batch whose events had `each` outcome: the common one when they all
    /// agree (or there are none: delivered), else [`Outcome::PerEvent`].
    pub fn per_event(each: Vec<Outcome>) -> Self {
        match each.first() {
            None => Self::Delivered,
            Some(first) if each.iter().all(|o| o == first) => first.clone(),
            Some(_) => Self::PerEvent(each),
        }
    }

    /// The batch's `items` grouped by their own outcome, in first-seen order: one group when the
    /// outcome is the batch's; by event for [`Outcome::PerEvent`] (a sink that miscounted gets
    /// its summary for every event).
    pub fn group<T>(self, items: Vec<T>) -> Vec<(Outcome, Vec<T>)> {
        match self {
            Outcome::PerEvent(each) if each.len() == items.len() => {
                let mut groups: Vec<(Outcome, Vec<T>)> = Vec::new();
                for (p, o) in items.into_iter().zip(each) {
                    match groups.iter_mut().find(|(x, _)| *x == o) {
                        Some((_, v)) => v.push(p),
                        None => groups.push((o, vec![p])),
                    }
                }
                groups
            }
            o @ Outcome::PerEvent(_) => vec![(o.summary().clone(), items)],
            o => vec![(o, items)],
        }
    }

    /// The outcome that speaks for the batch as a whole (endpoint health, logs): the first
    /// failure that is not an event's own fault (too large), else the first failure, else
    /// delivered.
    pub fn summary(&self) -> &Outcome {
        let Self::PerEvent(each) = self else {
            return self;
        };
        let failed = |o: &&Outcome| matches!(o, Self::Failed { .. });
        each.iter()
            .filter(failed)
            .find(|o| {
                !matches!(
                    o,
                    Self::Failed {
                        kind: FailureKind::TooLarge(_),
                        ..
                    }
                )
            })
            .or_else(|| each.iter().find(failed))
            .unwrap_or(&Self::Delivered)
    }
}

/// Sends batches to one destination.
pub trait Sink: Send + Sync + 'static {
    /// Send one batch; never panics, every failure is an [`Outcome::Failed`].
    fn send<'a>(&'a self, req: &'a DeliveryRequest) -> BoxFuture<'a, Outcome>;
}

/// Builds the sink for a subscription's destination.
pub trait SinkFactory: Send + Sync + 'static {
    /// The sink for `sub`. Called when a subscription is created or updated.
    fn create(&self, sub: &Subscription) -> Arc<dyn Sink>;

    /// The open MQTT destination connections' statuses, `(broker URL, client id, status)`, for
    /// `/metrics` and the readiness detail (none from a factory without MQTT).
    fn mqtt_destinations(&self) -> Vec<MqttDestinationStatus> {
        Vec::new()
    }
}

/// One MQTT destination connection: broker URL, client id, status.
pub type MqttDestinationStatus = (String, String, Arc<crate::metrics::MqttDestinationMetrics>);

/// A sink for destinations this build cannot reach (e.g. Event Hubs without the cloud): every
/// attempt fails with a clear reason, and the retry policy decides what happens next.
pub struct UnsupportedSink(pub String);

impl Sink for UnsupportedSink {
    fn send<'a>(&'a self, _req: &'a DeliveryRequest) -> BoxFuture<'a, Outcome> {
        Box::pin(async move { Outcome::failed(FailureKind::Unsupported(self.0.clone())) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_array_joins_without_reserialising() {
        let a = json_array(&[
            Bytes::from_static(b"{\"a\":1.50}"),
            Bytes::from_static(b"{}"),
        ]);
        assert_eq!(&a[..], b"[{\"a\":1.50},{}]");
        assert_eq!(&json_array(&[])[..], b"[]");
    }

    #[test]
    fn each_event_travels_in_its_own_context_or_the_requests() {
        let ctx = |span| TraceContext {
            trace_id: 7,
            span_id: span,
            flags: 1,
            state: None,
        };
        let whole = OnwardTrace::whole(Some(ctx(1)));
        assert_eq!(whole.request(), Some(&ctx(1)));
        assert_eq!((whole.of(0), whole.of(5)), (Some(&ctx(1)), Some(&ctx(1))));
        let mixed = OnwardTrace::per_event(Some(ctx(1)), vec![Some(ctx(2)), None]);
        assert_eq!(mixed.request(), Some(&ctx(1)));
        assert_eq!((mixed.of(0), mixed.of(1)), (Some(&ctx(2)), None));
        assert_eq!(mixed.of(2), None, "past the batch: none");
        let none = OnwardTrace::default();
        assert_eq!((none.request(), none.of(0)), (None, None));
        assert_eq!(none.log_ids(), (None, None));
    }

    #[test]
    fn per_event_outcomes_collapse_when_they_agree() {
        let big = Outcome::failed(FailureKind::TooLarge("e".into()));
        let busy = Outcome::failed(FailureKind::Status(503));
        assert_eq!(Outcome::per_event(vec![]), Outcome::Delivered);
        assert_eq!(
            Outcome::per_event(vec![busy.clone(), busy.clone()]),
            busy.clone()
        );
        let mixed = Outcome::per_event(vec![Outcome::Delivered, big.clone(), busy.clone()]);
        assert!(matches!(mixed, Outcome::PerEvent(ref v) if v.len() == 3));
        assert_eq!(
            mixed.summary(),
            &busy,
            "the endpoint's failure speaks for the batch"
        );
        let only_big = Outcome::per_event(vec![Outcome::Delivered, big.clone()]);
        assert_eq!(only_big.summary(), &big);
    }
}
