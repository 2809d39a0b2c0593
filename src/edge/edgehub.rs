//! The module's MQTT 3.1.1 connection to edgeHub: output messages (the `EdgeHub` destination) and
//! the module twin share it.
//!
//! * Connect: TLS to `IOTEDGE_GATEWAYHOSTNAME:8883` trusting only the IoT Edge trust bundle;
//!   client id `{device}/{module}`; username `{hub}/{device}/{module}/?api-version=2018-06-30`;
//!   password a SAS token signed by the workload API ([`super::sas`]). MQTT 3.1.1 cannot
//!   re-authenticate, so before the token expires the connection is re-made with a fresh one
//!   (when nothing is in flight, or at the latest shortly before expiry). Publishes still queued
//!   at that moment fail as disconnected and are retried like any failed delivery.
//! * Publish: `devices/{dev}/modules/{mod}/messages/events/%24.on={output}&%24.ct=…&%24.ce=utf-8`,
//!   QoS 1; success is edgeHub's PUBACK (it acknowledges once the message is stored).
//!
//! ## Matching PUBACKs to publishes
//! As for the MQTT destination: callers queue a waiter under the tracker's lock with their
//! request, the owner task files it under its packet id and a PUBACK answers it
//! ([`crate::outbound::mqtt::acks`] says how). When the connection fails, the owner takes the
//! lock, drains rumqttc's channel and pending list (a clean session would drop them anyway) and
//! fails every waiter. Failed deliveries follow the normal retry rules; a message whose PUBACK
//! was lost may arrive twice (at least once).

use super::sas::{self, SasToken};
use super::workload::{encode, WorkloadClient};
use crate::clock::Clock;
use crate::delivery::sink::{DeliveryRequest, FailureKind, Outcome, Sink};
use crate::outbound::mqtt::acks::{PubackWaiter, Tracker};
use crate::outbound::sinks::edgehub::ModuleOutputs;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use rumqttc::{
    AsyncClient, ConnectionError, Event, EventLoop, MqttOptions, Outgoing, Packet, QoS,
    TlsConfiguration, Transport,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Requests rumqttc's channel holds before publishes fail with "queue full".
const REQUEST_CAPACITY: usize = 1024;
/// Default SAS token lifetime (the SDKs' default).
pub const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(3600);
/// MQTT keep-alive; also bounds how late a token renewal is noticed.
const KEEP_ALIVE: Duration = Duration::from_secs(30);
/// Largest reconnect back-off.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Why a publish did not get its acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// The connection dropped before the PUBACK.
    #[error("edgeHub connection lost before the acknowledgement")]
    Disconnected,
    /// Too many requests are queued for the connection.
    #[error("edgeHub request queue is full")]
    QueueFull,
    /// The connection task has stopped.
    #[error("edgeHub client stopped")]
    Closed,
}

/// A publish's waiter: `None` for a request nobody waits for (a QoS 0 twin request).
type Waiter = Option<oneshot::Sender<Result<(), PublishError>>>;

impl PubackWaiter for Waiter {
    type Error = PublishError;
    fn answer(self, outcome: Result<(), PublishError>) {
        if let Some(tx) = self {
            let _ = tx.send(outcome);
        }
    }
}

/// A message edgeHub sent the module, or a connection change (for the twin).
#[derive(Debug, Clone)]
pub enum HubMessage {
    /// A new MQTT session is up (subscriptions are in place).
    Connected,
    /// A publish from edgeHub.
    Publish {
        /// Topic.
        topic: String,
        /// Payload.
        payload: Bytes,
    },
}

/// How to reach edgeHub.
#[derive(Clone)]
pub struct HubSettings {
    /// TLS host name (`IOTEDGE_GATEWAYHOSTNAME`).
    pub host: String,
    /// MQTT port (8883).
    pub port: u16,
    /// `IOTEDGE_IOTHUBHOSTNAME`.
    pub hub_hostname: String,
    /// `IOTEDGE_DEVICEID`.
    pub device_id: String,
    /// `IOTEDGE_MODULEID`.
    pub module_id: String,
    /// TLS client configuration (roots = trust bundle); `None` = plain TCP (tests only).
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// SAS token lifetime.
    pub token_ttl: Duration,
}

impl HubSettings {
    /// `{hub}/{device}/{module}/?api-version=2018-06-30`.
    pub fn username(&self) -> String {
        format!(
            "{}/{}/{}/?api-version=2018-06-30",
            self.hub_hostname, self.device_id, self.module_id
        )
    }

    /// `{device}/{module}`.
    pub fn client_id(&self) -> String {
        format!("{}/{}", self.device_id, self.module_id)
    }
}

/// The topic a message to module output `output` is published on.
pub fn output_topic(device_id: &str, module_id: &str, output: &str) -> String {
    format!(
        "devices/{device_id}/modules/{module_id}/messages/events/%24.on={}&%24.ct={}&%24.ce=utf-8",
        encode(output),
        encode("application/json")
    )
}

struct Shared {
    client: AsyncClient,
    tracker: Mutex<Tracker<Waiter>>,
    connected: AtomicBool,
    device_id: String,
    module_id: String,
}

/// Handle to the edgeHub connection, shared by sinks and the twin. Cheap to clone.
#[derive(Clone)]
pub struct EdgeHub {
    shared: Arc<Shared>,
}

/// The connection's owner: drives rumqttc's event loop. Run it with [`HubConnection::run`].
pub struct HubConnection {
    eventloop: EventLoop,
    shared: Arc<Shared>,
    settings: HubSettings,
    workload: WorkloadClient,
    clock: Clock,
    to_twin: mpsc::Sender<HubMessage>,
    token: Option<SasToken>,
}

impl EdgeHub {
    /// Prepare a connection (nothing is dialled until [`HubConnection::run`]). Messages for the
    /// twin arrive on the returned receiver.
    pub fn new(
        settings: HubSettings,
        workload: WorkloadClient,
        clock: Clock,
    ) -> (Self, HubConnection, mpsc::Receiver<HubMessage>) {
        let mut opts = MqttOptions::new(settings.client_id(), settings.host.clone(), settings.port);
        opts.set_keep_alive(KEEP_ALIVE);
        opts.set_clean_session(true);
        opts.set_max_packet_size(1 << 20, 1 << 20);
        if let Some(tls) = &settings.tls {
            opts.set_transport(Transport::tls_with_config(TlsConfiguration::Rustls(
                tls.clone(),
            )));
        }
        let (client, eventloop) = AsyncClient::new(opts, REQUEST_CAPACITY);
        let shared = Arc::new(Shared {
            client,
            tracker: Mutex::new(Tracker::default()),
            connected: AtomicBool::new(false),
            device_id: settings.device_id.clone(),
            module_id: settings.module_id.clone(),
        });
        let (to_twin, from_hub) = mpsc::channel(256);
        let conn = HubConnection {
            eventloop,
            shared: shared.clone(),
            settings,
            workload,
            clock,
            to_twin,
            token: None,
        };
        (Self { shared }, conn, from_hub)
    }

    /// Whether an MQTT session is up.
    pub fn is_connected(&self) -> bool {
        self.shared.connected.load(Ordering::Relaxed)
    }

    fn tracker(&self) -> std::sync::MutexGuard<'_, Tracker<Waiter>> {
        self.shared
            .tracker
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Queue a publish; the receiver resolves on PUBACK (QoS 1) or once written (QoS 0).
    ///
    /// # Errors
    /// The request queue is full or the connection task has stopped.
    pub fn publish(
        &self,
        topic: String,
        payload: Bytes,
        qos: QoS,
    ) -> Result<oneshot::Receiver<Result<(), PublishError>>, PublishError> {
        let (tx, rx) = oneshot::channel();
        self.enqueue(topic, payload, qos, Some(tx))?;
        Ok(rx)
    }

    /// Queue a publish nobody waits for (twin requests; their answers come as messages).
    ///
    /// # Errors
    /// The request queue is full or the connection task has stopped.
    pub fn publish_nowait(&self, topic: String, payload: Bytes) -> Result<(), PublishError> {
        self.enqueue(topic, payload, QoS::AtMostOnce, None)
    }

    fn enqueue(
        &self,
        topic: String,
        payload: Bytes,
        qos: QoS,
        waiter: Waiter,
    ) -> Result<(), PublishError> {
        // Request and waiter enter their queues under one lock, so their orders agree.
        let mut t = self.tracker();
        match self.shared.client.try_publish(topic, qos, false, payload) {
            Ok(()) => {
                t.queued(waiter);
                Ok(())
            }
            Err(rumqttc::ClientError::TryRequest(_)) => Err(PublishError::QueueFull),
            Err(_) => Err(PublishError::Closed),
        }
    }

    /// The sink for subscriptions delivering to module output `output` (also reached through
    /// [`ModuleOutputs`], the seam the server plugs edgeHub into delivery with).
    pub fn sink(&self, output: &str, timeout: Duration) -> EdgeHubSink {
        EdgeHubSink {
            hub: self.clone(),
            topic: output_topic(&self.shared.device_id, &self.shared.module_id, output),
            timeout,
        }
    }
}

impl HubConnection {
    fn now_secs(&self) -> u64 {
        self.clock.now_ms() / 1000
    }

    /// Sign a fresh token and use it for the next connect.
    async fn refresh_token(&mut self) -> Result<(), String> {
        let resource = sas::resource(
            &self.settings.hub_hostname,
            &self.settings.device_id,
            &self.settings.module_id,
        );
        let expires = self.now_secs() + self.settings.token_ttl.as_secs();
        let token = sas::sign(&self.workload, &resource, expires)
            .await
            .map_err(|e| e.to_string())?;
        self.eventloop
            .mqtt_options
            .set_credentials(self.settings.username(), token.token.clone());
        self.token = Some(token);
        Ok(())
    }

    /// Seconds of validity left on the current token (0 without one).
    fn token_left(&self) -> u64 {
        self.token
            .as_ref()
            .map(|t| t.expires_at.saturating_sub(self.now_secs()))
            .unwrap_or(0)
    }

    /// Drop the session: drain rumqttc's queues and fail every waiter (see the module docs).
    fn reset(&mut self, e: &PublishError) {
        self.shared.connected.store(false, Ordering::Relaxed);
        let mut t = self
            .shared
            .tracker
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        self.eventloop.clean();
        self.eventloop.pending.clear();
        t.fail_all(e);
    }

    fn on_event(&mut self, event: Event) {
        match event {
            Event::Incoming(Packet::ConnAck(_)) => {
                self.shared.connected.store(true, Ordering::Relaxed);
                tracing::info!(host = %self.settings.host, "connected to edgeHub");
                let base = "$iothub/twin";
                let subs = [
                    format!("{base}/res/#"),
                    format!("{base}/PATCH/properties/desired/#"),
                ];
                for s in subs {
                    if let Err(e) = self.shared.client.try_subscribe(s, QoS::AtMostOnce) {
                        tracing::warn!(error = %e, "cannot subscribe to twin topics");
                    }
                }
                self.notify_twin(HubMessage::Connected);
            }
            Event::Incoming(Packet::PubAck(ack)) => self.lock().acked(ack.pkid, Ok(())),
            Event::Incoming(Packet::Publish(p)) => {
                let topic = p.topic.clone();
                self.notify_twin(HubMessage::Publish {
                    topic,
                    payload: p.payload,
                });
            }
            Event::Outgoing(Outgoing::Publish(pkid)) => {
                self.lock().sent(pkid);
            }
            Event::Outgoing(Outgoing::AwaitAck(pkid)) => self.lock().collision(pkid),
            _ => {}
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tracker<Waiter>> {
        self.shared
            .tracker
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn notify_twin(&self, m: HubMessage) {
        if let Err(e) = self.to_twin.try_send(m) {
            tracing::warn!(error = %e, "twin handler is behind; message from edgeHub dropped");
        }
    }

    /// Drive the connection until the task is aborted: connect, reconnect with back-off, renew the
    /// SAS token before it expires.
    pub async fn run(mut self) {
        let mut backoff = Duration::from_secs(1);
        let ttl = self.settings.token_ttl.as_secs().max(10);
        loop {
            if self.eventloop.network.is_none() && self.token_left() < ttl / 5 {
                if let Err(e) = self.refresh_token().await {
                    tracing::warn!(error = %e, "cannot sign an edgeHub token; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
            }
            match self.eventloop.poll().await {
                Ok(event) => {
                    if matches!(event, Event::Incoming(Packet::ConnAck(_))) {
                        backoff = Duration::from_secs(1);
                    }
                    self.on_event(event);
                }
                Err(e) => {
                    self.reset(&PublishError::Disconnected);
                    log_connection_error(&e);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
            }
            // Renew before expiry: when idle after 80 % of the lifetime, unconditionally after 95 %.
            let left = self.token_left();
            let idle = self.eventloop.state.inflight() == 0;
            if self.eventloop.network.is_some() && (left < ttl / 20 || (left < ttl / 5 && idle)) {
                tracing::info!("renewing the edgeHub SAS token (reconnecting)");
                match self.refresh_token().await {
                    Ok(()) => self.reset(&PublishError::Disconnected),
                    Err(e) => tracing::warn!(error = %e, "cannot renew the edgeHub token"),
                }
            }
        }
    }
}

fn log_connection_error(e: &ConnectionError) {
    // ConnectionError never carries the credentials.
    tracing::warn!(error = %e, "edgeHub connection failed; reconnecting");
}

impl ModuleOutputs for EdgeHub {
    fn output_sink(&self, output: &str, timeout: Duration) -> std::sync::Arc<dyn Sink> {
        std::sync::Arc::new(self.sink(output, timeout))
    }
}

/// Delivers batches to a module output (`endpointType: EdgeHub`).
pub struct EdgeHubSink {
    hub: EdgeHub,
    topic: String,
    timeout: Duration,
}

impl Sink for EdgeHubSink {
    fn send<'a>(&'a self, req: &'a DeliveryRequest) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            let rx = match self
                .hub
                .publish(self.topic.clone(), req.json_array(), QoS::AtLeastOnce)
            {
                Ok(rx) => rx,
                Err(e) => return Outcome::failed(FailureKind::Other(e.to_string())),
            };
            match tokio::time::timeout(self.timeout, rx).await {
                Ok(Ok(Ok(()))) => Outcome::Delivered,
                Ok(Ok(Err(PublishError::Disconnected))) => Outcome::failed(FailureKind::Connect),
                Ok(Ok(Err(e))) => Outcome::failed(FailureKind::Other(e.to_string())),
                Ok(Err(_)) => Outcome::failed(FailureKind::Other(PublishError::Closed.to_string())),
                Err(_) => Outcome::failed(FailureKind::Timeout),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(t: &mut Tracker<Waiter>) -> oneshot::Receiver<Result<(), PublishError>> {
        let (tx, rx) = oneshot::channel();
        t.queued(Some(tx));
        rx
    }

    #[test]
    fn output_topic_encodes_system_properties() {
        assert_eq!(
            output_topic("edge-dev-1", "gridlet", "events"),
            "devices/edge-dev-1/modules/gridlet/messages/events/%24.on=events&%24.ct=application%2Fjson&%24.ce=utf-8"
        );
        assert!(output_topic("d", "m", "a b&c").contains("%24.on=a%20b%26c&"));
    }

    #[test]
    fn pubacks_resolve_the_publish_they_belong_to_past_a_request_nobody_waits_for() {
        let mut t = Tracker::<Waiter>::default();
        let mut a = waiter(&mut t);
        let mut b = waiter(&mut t);
        t.queued(None); // a QoS 0 twin request in between
        let mut c = waiter(&mut t);
        t.sent(1);
        t.sent(2);
        t.sent(0);
        t.sent(3);
        t.acked(2, Ok(()));
        assert_eq!(b.try_recv(), Ok(Ok(())));
        assert!(a.try_recv().is_err());
        t.acked(1, Ok(()));
        assert_eq!(a.try_recv(), Ok(Ok(())));
        t.fail_all(&PublishError::Disconnected);
        assert_eq!(c.try_recv(), Ok(Err(PublishError::Disconnected)));
    }
}
