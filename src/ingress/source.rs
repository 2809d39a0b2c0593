//! One MQTT source connection: two tasks around one rumqttc client (MQTT 5, or 3.1.1 in
//! [`v311`]).
//!
//! * The **driver** polls rumqttc's event loop for as long as gridlet runs (so keep-alive
//!   pings go out even while messages are held), subscribes to the routes' filters at every
//!   connect (subscription identifier = route index + 1, so the broker says which routes a
//!   message is for), reconnects with jittered back-off, and hands each received message to
//!   the acceptor through a bounded channel.
//! * The **acceptor** takes what the channel holds (up to the receive maximum) as one batch,
//!   makes each message's events, publishes them per gridlet topic through
//!   [`Broker::publish`] (the HTTP publish path: one commit for the batch), and only then
//!   acknowledges the QoS 1 messages, in the order they arrived (MQTT requires it).
//!
//! ## At least once
//! Acknowledgements are manual (`set_manual_acks`): a PUBACK leaves only after the batch's
//! publishes returned, i.e. after the store commit for persisted subscriptions. A refused
//! message (it makes no valid event) is acknowledged and counted; anything gridlet cannot take
//! now (503 memory bound, 507 disk bound, topic gone) is retried with back-off, unacknowledged,
//! and the acceptor reads nothing new meanwhile. The broker never has more than the receive
//! maximum unacknowledged QoS 1 messages out, so it holds the rest. QoS 0 messages are dropped
//! (and counted) when they cannot be accepted.
//!
//! ## Acknowledgements and reconnects
//! A PUBACK belongs to the connection its PUBLISH came on: after a reconnect the broker resends
//! what was not acknowledged (same packet id), and a late PUBACK for the old copy would, once
//! the id is reused, acknowledge a message gridlet never saw. So every message carries the
//! session generation it arrived in; the acceptor acknowledges under the [`Generation`] lock
//! only when it is still current, and the driver, on losing the connection, invalidates the
//! generation and clears rumqttc's queued acknowledgements under the same lock. The resent copy
//! is published again (at least once: a duplicate, never a loss).

use super::message::Message;
use super::route::{Qos, Route};
use crate::broker::Broker;
use crate::metrics::MqttConnectionMetrics;
use crate::outbound::mqtt::connection::{Backoff, ConnectionSpec, Protocol};
use rumqttc::v5::mqttbytes::v5::{Packet, Publish, SubscribeProperties};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, EventLoop};
use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

mod accept;
mod trace;
mod v311;

/// The current session's number (0: no session). See the module docs.
#[derive(Default)]
struct Generation(Mutex<u64>);

impl Generation {
    fn lock(&self) -> std::sync::MutexGuard<'_, u64> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A message as the driver hands it over.
struct Received {
    generation: u64,
    /// The packet, to acknowledge (QoS 1).
    publish: Option<Ack>,
    message: Message,
}

/// A received QoS 1 packet, to acknowledge, per protocol version.
enum Ack {
    V5(Publish),
    V311(rumqttc::Publish),
}

/// The client half, per protocol version.
enum Client {
    V5(AsyncClient),
    V311(rumqttc::AsyncClient),
}

/// rumqttc's event loop of a [`Source`], per protocol version.
pub enum Connection {
    /// MQTT 5.
    V5(Box<EventLoop>),
    /// MQTT 3.1.1.
    V311(Box<rumqttc::EventLoop>),
}

/// Everything one connection's tasks share.
pub struct Source {
    spec: ConnectionSpec,
    routes: Vec<Route>,
    /// Filters of routes removed from this connection: unsubscribed at every connect (the
    /// session would otherwise keep them, and their messages would match no route).
    forget: Vec<String>,
    /// Address ranges the broker may not resolve to (a connection made through the API),
    /// checked before every connect.
    denied: Vec<crate::config::IpRange>,
    broker: Broker,
    status: Arc<MqttConnectionMetrics>,
    generation: Generation,
    client: Client,
}

impl Source {
    /// Prepare the connection (nothing is dialled until [`Source::run`]); `forget`: filters to
    /// unsubscribe at each connect (routes removed since the session began); `denied`: address
    /// ranges the broker's host may not resolve to (checked before every connect).
    ///
    /// # Errors
    /// The options cannot be made (the token file is unreadable).
    pub fn new(
        spec: ConnectionSpec,
        tls: Option<Arc<rustls::ClientConfig>>,
        routes: Vec<Route>,
        forget: Vec<String>,
        denied: Vec<crate::config::IpRange>,
        broker: Broker,
        status: Arc<MqttConnectionMetrics>,
    ) -> Result<(Arc<Self>, Connection), crate::outbound::mqtt::connection::SpecError> {
        // Acknowledgements and subscriptions go through rumqttc's request channel; room for a
        // whole window of acknowledgements and the subscriptions.
        let capacity = usize::from(spec.receive_maximum) * 2 + routes.len() + forget.len() + 16;
        let (client, eventloop) = match spec.protocol {
            Protocol::V5 => {
                let mut opts = spec.v5_options(tls)?;
                opts.set_manual_acks(true);
                let (c, el) = AsyncClient::new(opts, capacity);
                (Client::V5(c), Connection::V5(Box::new(el)))
            }
            Protocol::V311 => {
                let mut opts = spec.v311_options(tls)?;
                opts.set_manual_acks(true);
                let (c, el) = rumqttc::AsyncClient::new(opts, capacity);
                (Client::V311(c), Connection::V311(Box::new(el)))
            }
        };
        Ok((
            Arc::new(Self {
                spec,
                routes,
                forget,
                denied,
                broker,
                status,
                generation: Generation::default(),
                client,
            }),
            eventloop,
        ))
    }

    /// Run both tasks until aborted.
    pub async fn run(self: Arc<Self>, eventloop: Connection) {
        // The window (receive maximum) plus room for QoS 0 messages.
        let (tx, rx) = mpsc::channel(usize::from(self.spec.receive_maximum) + 256);
        let acceptor = tokio::spawn(self.clone().accept(rx));
        let _abort = crate::sync::AbortOnDrop(acceptor);
        match eventloop {
            Connection::V5(el) => self.drive(*el, tx).await,
            Connection::V311(el) => self.drive_v311(*el, tx).await,
        }
    }

    fn name(&self) -> &str {
        &self.spec.name
    }

    async fn drive(&self, mut el: EventLoop, tx: mpsc::Sender<Received>) {
        let mut backoff = Backoff::reconnect(self.name());
        // SUBACKs still awaited on this session: the status says connected once they are in, when
        // messages on every route can arrive.
        let mut awaiting_subacks = 0usize;
        // QoS 1 messages the acceptor's channel had no room for (see `Handover`).
        let mut held = Handover::new(usize::from(self.spec.receive_maximum));
        let mut checked = false;
        loop {
            match held.pass_on(&tx) {
                Err(()) => return, // the acceptor ended: gridlet is stopping
                Ok(true) => {
                    tracing::warn!(connection = %self.name(), "MQTT broker sent more than the receive maximum; reconnecting so it resends what was set aside");
                    self.forget_session(&mut el);
                }
                Ok(false) => {}
            }
            if !checked {
                checked = self.address_allowed(&mut backoff).await;
                continue;
            }
            match el.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                    awaiting_subacks = self.on_connack(ack.session_present, &mut backoff);
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let message = to_message(&p);
                    let ack = (p.qos != QoS::AtMostOnce).then_some(Ack::V5(p));
                    self.on_publish(message, ack, &tx, &mut held);
                }
                Ok(Event::Incoming(Packet::SubAck(ack))) => {
                    let refused = ack.return_codes.iter().filter(|c| {
                        !matches!(
                            c,
                            rumqttc::v5::mqttbytes::v5::SubscribeReasonCode::Success(_)
                        )
                    });
                    self.on_suback(&mut awaiting_subacks, refused.map(|c| format!("{c:?}")));
                }
                Ok(Event::Incoming(Packet::UnsubAck(_))) => {
                    self.on_suback(&mut awaiting_subacks, std::iter::empty());
                }
                Ok(Event::Incoming(Packet::Disconnect(d))) => {
                    let e = format!("the broker disconnected: {:?}", d.reason_code);
                    tracing::warn!(connection = %self.name(), error = %e, "MQTT source disconnected");
                    self.status.set_error(e);
                }
                Ok(_) => {}
                Err(e) => {
                    checked = false;
                    self.forget_session(&mut el);
                    held.clear();
                    self.on_connection_error(e.to_string());
                    if let Err(e) = self.spec.refresh_v5(&mut el.options) {
                        tracing::warn!(connection = %self.name(), error = %e, "MQTT credentials");
                        self.status.set_error(e.to_string());
                    }
                    tokio::time::sleep(backoff.next_delay()).await;
                }
            }
        }
    }

    /// Before a connect: whether the broker's host resolves outside the denied ranges; if not,
    /// the failure is recorded and the back-off waited.
    async fn address_allowed(&self, backoff: &mut Backoff) -> bool {
        match self.spec.check_address(&self.denied).await {
            Ok(()) => true,
            Err(e) => {
                self.on_connection_error(e);
                tokio::time::sleep(backoff.next_delay()).await;
                false
            }
        }
    }

    /// A session is up: a new generation; subscribe (and unsubscribe the filters of removed
    /// routes). Returns the SUBACKs and UNSUBACKs to wait for.
    fn on_connack(&self, session_present: bool, backoff: &mut Backoff) -> usize {
        backoff.reset();
        *self.generation.lock() += 1;
        tracing::info!(connection = %self.name(), host = %self.spec.endpoint.host, session_present, "MQTT source connected");
        self.subscribe();
        let awaited = self.routes.len() + self.forget.len();
        if awaited == 0 {
            // Nothing to wait for: a connection without routes is up once connected.
            self.status.connected.store(1, Relaxed);
        }
        awaited
    }

    /// A message arrived: to the acceptor (QoS 1 through the handover; QoS 0 dropped when it
    /// cannot go at once).
    fn on_publish(
        &self,
        message: Message,
        ack: Option<Ack>,
        tx: &mpsc::Sender<Received>,
        held: &mut Handover,
    ) {
        self.status.received.inc();
        let r = Received {
            generation: *self.generation.lock(),
            publish: ack,
            message,
        };
        if r.publish.is_none() {
            if !held.is_empty() || tx.try_send(r).is_err() {
                self.status.dropped.inc();
            }
        } else {
            held.push(r);
        }
    }

    /// A SUBACK (or an UNSUBACK); `refused` names the reason codes of the filters the broker
    /// refused. The connection counts as up once every one is in.
    fn on_suback(&self, awaiting: &mut usize, refused: impl Iterator<Item = String>) {
        *awaiting = awaiting.saturating_sub(1);
        if *awaiting == 0 {
            self.status.connected.store(1, Relaxed);
        }
        for code in refused {
            let e = format!("the broker refused a subscription: {code}");
            tracing::warn!(connection = %self.name(), error = %e, "MQTT subscription refused");
            self.status.set_error(e);
        }
    }

    /// The connection failed (rumqttc's errors never carry the credentials).
    fn on_connection_error(&self, text: String) {
        self.status.connection_errors.inc();
        tracing::warn!(connection = %self.name(), error = %text, "MQTT source connection failed; reconnecting");
        self.status.set_error(text);
    }

    /// The connection is gone (or given up): no acknowledgement of its messages may reach the
    /// next one (see the module docs); the next poll reconnects.
    fn forget_session(&self, el: &mut EventLoop) {
        self.forget(|| {
            el.clean();
            el.pending
                .retain(|r| !matches!(r, rumqttc::v5::Request::PubAck(_)));
        });
    }

    /// [`Self::forget_session`]: `clean` drops the queued acknowledgements under the lock.
    fn forget(&self, clean: impl FnOnce()) {
        {
            let mut g = self.generation.lock();
            *g = 0;
            clean();
        }
        self.status.connected.store(0, Relaxed);
    }

    /// Subscribe to every route's filter (subscription identifier = index + 1).
    fn subscribe(&self) {
        for (i, r) in self.routes.iter().enumerate() {
            let qos = match r.qos {
                Qos::AtMostOnce => QoS::AtMostOnce,
                Qos::AtLeastOnce => QoS::AtLeastOnce,
            };
            let props = SubscribeProperties {
                id: Some(i + 1),
                user_properties: Vec::new(),
            };
            let sent = match &self.client {
                Client::V5(c) => c
                    .try_subscribe_with_properties(r.filter.clone(), qos, props)
                    .map_err(|e| e.to_string()),
                Client::V311(c) => {
                    let qos = match r.qos {
                        Qos::AtMostOnce => rumqttc::QoS::AtMostOnce,
                        Qos::AtLeastOnce => rumqttc::QoS::AtLeastOnce,
                    };
                    c.try_subscribe(r.filter.clone(), qos)
                        .map_err(|e| e.to_string())
                }
            };
            if let Err(e) = sent {
                let e = format!("cannot subscribe to {}: {e}", r.filter);
                tracing::warn!(connection = %self.name(), error = %e, "MQTT subscribe");
                self.status.set_error(e);
            }
        }
        self.unsubscribe_forgotten();
    }

    /// Unsubscribe the filters of removed routes (no UNSUBACK is awaited: a filter the session
    /// no longer has is answered 0x11, which changes nothing).
    fn unsubscribe_forgotten(&self) {
        for f in &self.forget {
            let sent = match &self.client {
                Client::V5(c) => c.try_unsubscribe(f.clone()).map_err(|e| e.to_string()),
                Client::V311(c) => c.try_unsubscribe(f.clone()).map_err(|e| e.to_string()),
            };
            if let Err(e) = sent {
                tracing::warn!(connection = %self.name(), filter = %f, error = %e, "MQTT unsubscribe");
            }
        }
    }
}

/// QoS 1 messages between the driver and the acceptor's channel. The driver must keep polling
/// rumqttc (its acknowledgements go out only then), so it never waits for room in the channel:
/// what does not fit waits here, and is passed on before each poll (each acknowledgement the
/// acceptor sends wakes the poll). A broker that keeps to the receive maximum never fills the
/// channel; one that does not is bounded here: past the bound, messages are set aside
/// unacknowledged, and once the rest has gone the connection is dropped so the broker resends
/// them on the next (a duplicate at worst, never a loss).
struct Handover {
    queue: VecDeque<Received>,
    bound: usize,
    shed: bool,
}

impl Handover {
    fn new(receive_maximum: usize) -> Self {
        Self {
            queue: VecDeque::new(),
            bound: receive_maximum * 4 + 1024,
            shed: false,
        }
    }

    fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    fn push(&mut self, r: Received) {
        if self.queue.len() < self.bound {
            self.queue.push_back(r);
        } else {
            self.shed = true;
        }
    }

    fn clear(&mut self) {
        self.queue.clear();
        self.shed = false;
    }

    /// Pass on what fits. `Ok(true)`: messages were set aside and all the others are passed
    /// on: time to reconnect. `Err`: the acceptor has ended.
    fn pass_on(&mut self, tx: &mpsc::Sender<Received>) -> Result<bool, ()> {
        while let Some(r) = self.queue.pop_front() {
            match tx.try_send(r) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(r)) => {
                    self.queue.push_front(r);
                    return Ok(false);
                }
                Err(mpsc::error::TrySendError::Closed(_)) => return Err(()),
            }
        }
        Ok(std::mem::take(&mut self.shed))
    }
}

/// The protocol-neutral message of a v5 publish.
fn to_message(p: &Publish) -> Message {
    let props = p.properties.as_ref();
    Message {
        topic: String::from_utf8_lossy(&p.topic).into_owned(),
        payload: p.payload.clone(),
        content_type: props.and_then(|p| p.content_type.clone()),
        pfi: props.and_then(|p| p.payload_format_indicator),
        user_properties: props.map(|p| p.user_properties.clone()).unwrap_or_default(),
        response_topic: props.and_then(|p| p.response_topic.clone()),
        subscription_ids: props
            .map(|p| p.subscription_identifiers.clone())
            .unwrap_or_default(),
    }
}
