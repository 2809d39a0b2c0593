//! A publishing connection's acknowledgements: why a publish failed ([`PublishError`], the
//! PUBACK reason codes), and which publish each PUBACK answers ([`Tracker`], for the MQTT
//! destination's connections and edgeHub's alike).
//!
//! ## Matching PUBACKs to publishes
//! rumqttc assigns packet ids inside its event loop, so a caller cannot know its id. The loop
//! takes requests from its channel strictly in order and reports each with
//! `Outgoing::Publish(pkid)` (or `Outgoing::AwaitAck(pkid)` on an id collision, followed by one
//! more `Outgoing::Publish(pkid)` for the same message once that id is free). So callers enqueue
//! under the [`Tracker`] lock (a waiter is pushed in the same order as the request), the owner
//! task files the oldest waiter under its packet id on each outgoing report, and a PUBACK
//! resolves the oldest waiter filed under that id with its reason code. When the connection
//! fails, the owner takes the lock, drains rumqttc's channel and pending list and fails every
//! waiter, so order and waiters stay in step. (rumqttc does not re-send a collided publish after
//! a failed PUBACK for its id; collisions need a broker that acknowledges out of order, and such
//! a publish ends in the delivery timeout and is retried.)

use rumqttc::v5::mqttbytes::v5::PubAckReason;
use std::collections::{HashMap, VecDeque};
use tokio::sync::{oneshot, OwnedSemaphorePermit};

/// Why a publish was not acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// No connection, or it dropped before the PUBACK.
    #[error("not connected to the MQTT broker")]
    Disconnected,
    /// Too many requests are queued for the connection.
    #[error("the MQTT connection's request queue is full")]
    QueueFull,
    /// The broker answered with a failure reason code (0x80 or more).
    #[error("the MQTT broker refused the message: PUBACK reason {:#04x} ({})", reason_code(*.0), reason_text(*.0))]
    Refused(PubAckReason),
    /// The connection could not be set up (its TLS files, its token file).
    #[error("{0}")]
    Setup(String),
}

/// The MQTT 5 reason code of a PUBACK reason.
pub fn reason_code(r: PubAckReason) -> u8 {
    match r {
        PubAckReason::Success => 0x00,
        PubAckReason::NoMatchingSubscribers => 0x10,
        PubAckReason::UnspecifiedError => 0x80,
        PubAckReason::ImplementationSpecificError => 0x83,
        PubAckReason::NotAuthorized => 0x87,
        PubAckReason::TopicNameInvalid => 0x90,
        PubAckReason::PacketIdentifierInUse => 0x91,
        PubAckReason::QuotaExceeded => 0x97,
        PubAckReason::PayloadFormatInvalid => 0x99,
    }
}

/// The reason's name in the MQTT 5 specification.
pub fn reason_text(r: PubAckReason) -> &'static str {
    match r {
        PubAckReason::Success => "success",
        PubAckReason::NoMatchingSubscribers => "no matching subscribers",
        PubAckReason::UnspecifiedError => "unspecified error",
        PubAckReason::ImplementationSpecificError => "implementation specific error",
        PubAckReason::NotAuthorized => "not authorized",
        PubAckReason::TopicNameInvalid => "topic name invalid",
        PubAckReason::PacketIdentifierInUse => "packet identifier in use",
        PubAckReason::QuotaExceeded => "quota exceeded",
        PubAckReason::PayloadFormatInvalid => "payload format invalid",
    }
}

pub(super) type Ack = Result<(), PublishError>;

/// What the outcome of a PUBACK with `reason` is for its publish (0x80 and above: refused).
pub fn outcome(reason: PubAckReason) -> Ack {
    match reason_code(reason) {
        c if c < 0x80 => Ok(()),
        _ => Err(PublishError::Refused(reason)),
    }
}

/// Whoever waits for a publish's acknowledgement: answered once, with `Ok` or the error.
pub trait PubackWaiter {
    /// What a failed publish is answered with.
    type Error: Clone;
    /// Answer the publish.
    fn answer(self, outcome: Result<(), Self::Error>);
}

/// A publish of the MQTT destination, holding one of the connection's request slots until it
/// is answered.
pub(super) struct Waiter {
    pub(super) tx: oneshot::Sender<Ack>,
    pub(super) _slot: Option<OwnedSemaphorePermit>,
}

impl PubackWaiter for Waiter {
    type Error = PublishError;
    fn answer(self, a: Ack) {
        let _ = self.tx.send(a);
    }
}

/// Publish waiters in rumqttc's request order, and by packet id once sent (the module
/// documentation says how). The same for rumqttc's MQTT 5 client (the MQTT destination) and its
/// MQTT 3.1.1 client (edgeHub).
pub struct Tracker<W> {
    unsent: VecDeque<W>,
    awaiting: HashMap<u16, VecDeque<W>>,
    collided: Option<u16>,
}

impl<W> Default for Tracker<W> {
    fn default() -> Self {
        Self {
            unsent: VecDeque::new(),
            awaiting: HashMap::new(),
            collided: None,
        }
    }
}

impl<W: PubackWaiter> Tracker<W> {
    /// A request was put in rumqttc's channel: its waiter, in the same order, under the lock
    /// held while the request was queued.
    pub fn queued(&mut self, w: W) {
        self.unsent.push_back(w);
    }

    /// `Outgoing::Publish(pkid)`: the oldest unsent request went out. `true`: it was the
    /// re-send of a collided publish (already counted).
    pub fn sent(&mut self, pkid: u16) -> bool {
        if self.collided == Some(pkid) {
            // The re-send of a collided publish: its waiter is already filed.
            self.collided = None;
            return true;
        }
        let Some(w) = self.unsent.pop_front() else {
            return false;
        };
        if pkid == 0 {
            // QoS 0: written, nothing to wait for.
            w.answer(Ok(()));
        } else {
            self.awaiting.entry(pkid).or_default().push_back(w);
        }
        false
    }

    /// `Outgoing::AwaitAck(pkid)`: the oldest request collided with an unacknowledged id; it is
    /// sent (and reported once more) after that id's PUBACK.
    pub fn collision(&mut self, pkid: u16) {
        if let Some(w) = self.unsent.pop_front() {
            self.awaiting.entry(pkid).or_default().push_back(w);
            self.collided = Some(pkid);
        }
    }

    /// A PUBACK for `pkid`: the oldest publish filed under it gets `outcome`.
    pub fn acked(&mut self, pkid: u16, outcome: Result<(), W::Error>) {
        let w = self.awaiting.get_mut(&pkid).and_then(VecDeque::pop_front);
        if self.awaiting.get(&pkid).is_some_and(VecDeque::is_empty) {
            self.awaiting.remove(&pkid);
        }
        if let Some(w) = w {
            w.answer(outcome);
        }
    }

    /// The connection failed: every waiter gets `e`.
    pub fn fail_all(&mut self, e: &W::Error) {
        let waiters = self
            .unsent
            .drain(..)
            .chain(self.awaiting.drain().flat_map(|(_, q)| q));
        for w in waiters {
            w.answer(Err(e.clone()));
        }
        self.collided = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(t: &mut Tracker<Waiter>) -> oneshot::Receiver<Ack> {
        let (tx, rx) = oneshot::channel();
        t.queued(Waiter { tx, _slot: None });
        rx
    }

    #[test]
    fn pubacks_resolve_their_publish_with_its_reason() {
        let mut t = Tracker::<Waiter>::default();
        let mut a = waiter(&mut t);
        let mut b = waiter(&mut t);
        let mut zero = waiter(&mut t);
        let mut c = waiter(&mut t);
        t.sent(1);
        t.sent(2);
        t.sent(0);
        assert_eq!(zero.try_recv(), Ok(Ok(())), "QoS 0 is done once written");
        t.sent(3);
        t.acked(2, outcome(PubAckReason::NotAuthorized));
        assert_eq!(
            b.try_recv(),
            Ok(Err(PublishError::Refused(PubAckReason::NotAuthorized)))
        );
        assert!(a.try_recv().is_err());
        t.acked(1, outcome(PubAckReason::NoMatchingSubscribers));
        assert_eq!(a.try_recv(), Ok(Ok(())), "0x10 is a success");
        t.fail_all(&PublishError::Disconnected);
        assert_eq!(c.try_recv(), Ok(Err(PublishError::Disconnected)));
    }

    #[test]
    fn a_collided_publish_is_matched_once() {
        let mut t = Tracker::<Waiter>::default();
        let mut old = waiter(&mut t);
        t.sent(5);
        let mut new = waiter(&mut t);
        let mut next = waiter(&mut t);
        t.collision(5);
        t.acked(5, outcome(PubAckReason::Success));
        assert_eq!(old.try_recv(), Ok(Ok(())));
        assert!(t.sent(5), "the collided publish's re-send, counted once");
        t.sent(6);
        t.acked(5, outcome(PubAckReason::Success));
        assert_eq!(new.try_recv(), Ok(Ok(())));
        t.acked(6, outcome(PubAckReason::QuotaExceeded));
        assert_eq!(
            next.try_recv(),
            Ok(Err(PublishError::Refused(PubAckReason::QuotaExceeded)))
        );
    }
}
