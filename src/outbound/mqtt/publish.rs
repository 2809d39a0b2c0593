//! MQTT 5 publishing connections for the MQTT destination: one per broker and credentials
//! ([`Publishers`]), shared by every subscription that delivers there, reconnecting with
//! jittered back-off ([`Backoff`]).
//!
//! * The session is always clean (clean start, session expiry 0): a publish whose PUBACK was
//!   lost with the connection is failed and retried by the subscription's schedule, never
//!   re-sent behind the engine's back. At least once: a message may arrive twice.
//! * While the connection is down (between a failed attempt and the next), a publish fails at
//!   once ([`PublishError::Disconnected`]); while it is being made, the publish waits in
//!   rumqttc's request channel and fails with it if the attempt fails.
//! * A connection lives as long as a sink holds it: the last sink dropped (its subscriptions
//!   deleted or changed) aborts its task and closes the socket.
//!
//! Publishes are matched to their PUBACKs in `acks.rs`.

use super::acks::{outcome, Ack, Tracker, Waiter};
pub use super::acks::{reason_code, PublishError};
use super::connection::{Backoff, ConnectionSpec, EdgeTls, Scheme};
use crate::config::IpRange;
use crate::metrics::MqttDestinationMetrics;
use crate::sync::{lock, AbortOnDrop};
use bytes::Bytes;
use rumqttc::v5::mqttbytes::v5::PublishProperties;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, ClientError, Event, EventLoop, Incoming};
use rumqttc::Outgoing;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};
use tokio::sync::{oneshot, Semaphore};

/// Publishes one connection has unanswered (in rumqttc's channel or awaiting their PUBACK);
/// more wait for a slot.
const REQUEST_CAPACITY: usize = 1024;

/// Connection state, as an [`AtomicU8`].
const CONNECTING: u8 = 0;
const CONNECTED: u8 = 1;
const DOWN: u8 = 2;

struct Shared {
    client: AsyncClient,
    tracker: Mutex<Tracker<Waiter>>,
    state: AtomicU8,
    /// One per request in rumqttc's channel or awaiting its PUBACK: at most
    /// [`REQUEST_CAPACITY`], so the channel never overflows.
    slots: Arc<Semaphore>,
    /// Largest packet the broker takes (its CONNACK's maximum packet size, at most ours).
    max_packet: AtomicU32,
    /// The client id the connection uses (with the broker URL, what its metrics name it by).
    client_id: String,
    /// Connected, counts, last error: `/metrics` and the readiness detail.
    status: Arc<MqttDestinationMetrics>,
}

/// One publishing connection. Cheap to share through its `Arc`; dropping the last one closes it.
pub struct Publisher {
    shared: Arc<Shared>,
    _task: AbortOnDrop,
}

/// One message to publish.
pub struct Message {
    /// Topic name.
    pub topic: String,
    /// QoS 0 or 1.
    pub qos: QoS,
    /// Retain flag.
    pub retain: bool,
    /// Payload.
    pub payload: Bytes,
    /// MQTT 5 properties.
    pub properties: PublishProperties,
}

impl Message {
    /// The PUBLISH packet's size on the wire, for the broker's maximum packet size.
    pub fn packet_size(&self) -> usize {
        let p = &self.properties;
        let props = p.payload_format_indicator.map_or(0, |_| 2)
            + p.message_expiry_interval.map_or(0, |_| 5)
            + p.content_type.as_ref().map_or(0, |c| 3 + c.len())
            + p.user_properties
                .iter()
                .map(|(k, v)| 5 + k.len() + v.len())
                .sum::<usize>();
        let pkid = if self.qos == QoS::AtMostOnce { 0 } else { 2 };
        let remaining =
            2 + self.topic.len() + pkid + varint_len(props) + props + self.payload.len();
        1 + varint_len(remaining) + remaining
    }
}

fn varint_len(n: usize) -> usize {
    match n {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

impl Publisher {
    /// Connect to the broker `spec` names (the session always clean; `client_id` overrides the
    /// spec's; never to an address in `denied`) and keep reconnecting until dropped. Must run
    /// inside the tokio runtime.
    ///
    /// # Errors
    /// The TLS files or the token cannot be read, or the spec is not MQTT 5.
    fn start(
        spec: &ConnectionSpec,
        client_id: &str,
        edge: &EdgeTls,
        denied: Vec<IpRange>,
    ) -> Result<Self, String> {
        let tls = spec.tls_config(edge).map_err(|e| e.to_string())?;
        let mut opts = spec.v5_options(tls).map_err(|e| e.to_string())?;
        opts.set_client_id(client_id.to_string());
        opts.set_clean_start(true);
        opts.set_session_expiry_interval(Some(0));
        // Each delivery waits for its PUBACK: no Nagle delay on the small PUBLISH packets.
        let mut net = rumqttc::NetworkOptions::new();
        net.set_tcp_nodelay(true);
        opts.set_network_options(net);
        let (client, eventloop) = AsyncClient::new(opts, REQUEST_CAPACITY);
        let shared = Arc::new(Shared {
            client,
            tracker: Mutex::new(Tracker::default()),
            state: AtomicU8::new(CONNECTING),
            slots: Arc::new(Semaphore::new(REQUEST_CAPACITY)),
            max_packet: AtomicU32::new(spec.max_packet_bytes),
            client_id: client_id.to_string(),
            status: Arc::new(MqttDestinationMetrics::default()),
        });
        let task = tokio::spawn(run(
            eventloop,
            Driver {
                shared: Arc::downgrade(&shared),
                spec: spec.clone(),
                ours: spec.max_packet_bytes,
                denied,
            },
        ));
        Ok(Self {
            shared,
            _task: AbortOnDrop(task),
        })
    }

    /// Whether a session is up.
    pub fn is_connected(&self) -> bool {
        self.shared.state.load(Ordering::Relaxed) == CONNECTED
    }

    /// Its client id.
    pub fn client_id(&self) -> &str {
        &self.shared.client_id
    }

    /// Its status (connected, counts, last error).
    pub fn status(&self) -> &Arc<MqttDestinationMetrics> {
        &self.shared.status
    }

    /// The largest packet the broker takes.
    pub fn max_packet(&self) -> usize {
        self.shared.max_packet.load(Ordering::Relaxed) as usize
    }

    /// Queue `m`; the receiver resolves on its PUBACK (QoS 1) or once written (QoS 0). Waits
    /// while [`REQUEST_CAPACITY`] publishes are unanswered (the caller bounds the wait).
    ///
    /// # Errors
    /// [`PublishError::Disconnected`] at once while the connection is down (between attempts).
    pub async fn publish(&self, m: Message) -> Result<oneshot::Receiver<Ack>, PublishError> {
        let down = || self.shared.state.load(Ordering::Relaxed) == DOWN;
        if down() {
            return Err(PublishError::Disconnected);
        }
        let slot = self
            .shared
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| PublishError::Disconnected)?;
        if down() {
            return Err(PublishError::Disconnected);
        }
        let (tx, rx) = oneshot::channel();
        // Request and waiter enter their queues under one lock, so their orders agree.
        let mut t = lock(&self.shared.tracker);
        match self.shared.client.try_publish_with_properties(
            m.topic,
            m.qos,
            m.retain,
            m.payload,
            m.properties,
        ) {
            Ok(()) => {
                t.queued(Waiter {
                    tx,
                    _slot: Some(slot),
                });
                Ok(rx)
            }
            // Not expected: every request in the channel holds a slot.
            Err(ClientError::TryRequest(_)) => Err(PublishError::QueueFull),
            Err(_) => Err(PublishError::Disconnected),
        }
    }
}

/// What a connection's task needs besides rumqttc's event loop.
struct Driver {
    shared: Weak<Shared>,
    spec: ConnectionSpec,
    /// Our own maximum packet size.
    ours: u32,
    /// `outbound__deniedAddressRanges`.
    denied: Vec<IpRange>,
}

/// Drive one connection until its [`Publisher`] is dropped.
async fn run(mut el: EventLoop, d: Driver) {
    let mut backoff = Backoff::reconnect(&d.spec.client_id);
    let broker = broker_url(&d.spec);
    let mut checked = false;
    loop {
        let event = match checked {
            true => el.poll().await.map_err(|e| e.to_string()),
            false => match d.spec.check_address(&d.denied).await {
                Ok(()) => {
                    checked = true;
                    continue;
                }
                Err(e) => Err(e),
            },
        };
        let Some(shared) = d.shared.upgrade() else {
            return;
        };
        match event {
            Ok(Event::Incoming(Incoming::ConnAck(ack))) => {
                backoff.reset();
                let theirs = ack
                    .properties
                    .as_ref()
                    .and_then(|p| p.max_packet_size)
                    .unwrap_or(u32::MAX);
                shared
                    .max_packet
                    .store(theirs.min(d.ours), Ordering::Relaxed);
                shared.state.store(CONNECTED, Ordering::Relaxed);
                shared.status.connected.store(1, Ordering::Relaxed);
                tracing::info!(broker = %broker, "MQTT destination connected");
            }
            Ok(Event::Incoming(Incoming::PubAck(ack))) => {
                if reason_code(ack.reason) < 0x80 {
                    shared.status.acknowledged.inc();
                } else {
                    shared.status.refused.inc();
                    shared
                        .status
                        .set_error(PublishError::Refused(ack.reason).to_string());
                }
                lock(&shared.tracker).acked(ack.pkid, outcome(ack.reason));
            }
            Ok(Event::Outgoing(Outgoing::Publish(pkid))) => {
                if !lock(&shared.tracker).sent(pkid) {
                    shared.status.published.inc();
                }
            }
            Ok(Event::Outgoing(Outgoing::AwaitAck(pkid))) => {
                lock(&shared.tracker).collision(pkid);
            }
            Ok(_) => {}
            Err(e) => {
                checked = false;
                shared.state.store(DOWN, Ordering::Relaxed);
                shared.status.connected.store(0, Ordering::Relaxed);
                shared.status.connection_errors.inc();
                shared.status.set_error(e.clone());
                {
                    // Drop the session: fail every waiter (see the module documentation).
                    let mut t = lock(&shared.tracker);
                    el.clean();
                    el.pending.clear();
                    t.fail_all(&PublishError::Disconnected);
                }
                // rumqttc's errors never carry the credentials.
                tracing::warn!(broker = %broker, error = %e,
                    "MQTT destination connection failed; reconnecting");
                drop(shared);
                tokio::time::sleep(backoff.next_delay()).await;
                if let Err(e) = d.spec.refresh_v5(&mut el.options) {
                    tracing::warn!(broker = %broker, error = %e,
                        "cannot refresh the MQTT destination's authentication data");
                }
                match d.shared.upgrade() {
                    Some(s) => s.state.store(CONNECTING, Ordering::Relaxed),
                    None => return,
                }
            }
        }
    }
}

/// `mqtt(s)://host:port`: what logs, metrics and endpoint health name a broker by (no
/// credentials: the URL never holds any).
pub fn broker_url(spec: &ConnectionSpec) -> String {
    let scheme = match spec.endpoint.scheme {
        Scheme::Mqtt => "mqtt",
        Scheme::Mqtts => "mqtts",
    };
    match spec.endpoint.host.contains(':') {
        true => format!("{scheme}://[{}]:{}", spec.endpoint.host, spec.endpoint.port),
        false => format!("{scheme}://{}:{}", spec.endpoint.host, spec.endpoint.port),
    }
}

/// The publishing connections of this process, one per broker and credentials (the whole
/// [`ConnectionSpec`]: two destinations share a connection only when every field agrees).
pub struct Publishers {
    open: Mutex<Vec<(ConnectionSpec, Weak<Publisher>)>>,
    edge: EdgeTls,
    denied: Vec<IpRange>,
    /// `gridlet-{prefix}-{n}`: client ids of connections whose spec names none.
    id_prefix: String,
    next: AtomicU32,
}

impl Publishers {
    /// No connection yet; `edge`: what IoT Edge adds to TLS; `id_prefix`: a per-process id
    /// (default client ids stay unique across restarts and processes sharing a broker);
    /// `denied`: address ranges no broker may resolve to (`outbound__deniedAddressRanges`).
    pub fn new(edge: EdgeTls, id_prefix: &str, denied: Vec<IpRange>) -> Self {
        Self {
            open: Mutex::new(Vec::new()),
            edge,
            denied,
            id_prefix: id_prefix.to_string(),
            next: AtomicU32::new(0),
        }
    }

    /// The open connections' statuses: `(broker URL, client id, status)`.
    pub fn statuses(&self) -> Vec<(String, String, Arc<MqttDestinationMetrics>)> {
        lock(&self.open)
            .iter()
            .filter_map(|(spec, w)| {
                let p = w.upgrade()?;
                Some((
                    broker_url(spec),
                    p.client_id().to_string(),
                    p.status().clone(),
                ))
            })
            .collect()
    }

    /// The connection for `spec`, opened now if none is (inside the tokio runtime).
    /// `own_client_id`: the spec's client id was given, use it (else one is made up: a
    /// destination's session is clean, nothing depends on its id).
    ///
    /// # Errors
    /// The connection cannot be set up ([`PublishError::Setup`]).
    pub fn get(
        &self,
        spec: &ConnectionSpec,
        own_client_id: bool,
    ) -> Result<Arc<Publisher>, PublishError> {
        let mut open = lock(&self.open);
        open.retain(|(_, w)| w.strong_count() > 0);
        if let Some(p) = open
            .iter()
            .find(|(s, _)| s == spec)
            .and_then(|(_, w)| w.upgrade())
        {
            return Ok(p);
        }
        let client_id = match own_client_id {
            true => spec.client_id.clone(),
            false => format!(
                "gridlet-{}-{}",
                self.id_prefix,
                self.next.fetch_add(1, Ordering::Relaxed)
            ),
        };
        let p = Arc::new(
            Publisher::start(spec, &client_id, &self.edge, self.denied.clone())
                .map_err(PublishError::Setup)?,
        );
        open.push((spec.clone(), Arc::downgrade(&p)));
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_packet_size_counts_every_part() {
        let m = Message {
            topic: "a/b".into(),
            qos: QoS::AtLeastOnce,
            retain: false,
            payload: Bytes::from(vec![b'x'; 100]),
            properties: PublishProperties {
                payload_format_indicator: Some(1),
                content_type: Some("application/json".into()),
                user_properties: vec![("k".into(), "v".into())],
                ..Default::default()
            },
        };
        // 2+3 topic, 2 pkid, 1+(2+19+7) properties, 100 payload = 136; 1 + 2 + 136.
        assert_eq!(m.packet_size(), 139);
        let mut buf = bytes::BytesMut::new();
        let p = rumqttc::v5::mqttbytes::v5::Publish {
            dup: false,
            qos: m.qos,
            retain: false,
            topic: Bytes::from(m.topic.clone()),
            pkid: 1,
            payload: m.payload.clone(),
            properties: Some(m.properties.clone()),
        };
        let n = p.write(&mut buf).unwrap();
        assert_eq!(n, m.packet_size(), "as rumqttc writes it");
    }
}
