//! The production [`SinkFactory`]: one shared HTTP client for every HTTP destination.

use super::azure::messaging::MessagingSink;
use super::azure::storage::{BlobDeadLetterSink, StorageQueueSink};
use super::http::HttpClient;
use super::sink::{Sink, SinkFactory, UnsupportedSink};
use super::webhook::{TopicRewrite, WebhookSink};
use crate::edge::edgehub::EdgeHub;
use crate::model::azure::{MessagingConn, StorageConn};
use crate::model::subscription::{Destination, Subscription};
use std::sync::Arc;
use std::time::Duration;

/// Builds sinks for subscriptions.
pub struct DefaultSinks {
    client: HttpClient,
    boot_id: String,
    edgehub: Option<(EdgeHub, Duration)>,
}

impl DefaultSinks {
    /// Sinks sharing `client` (see [`crate::tls::outbound_http_client`]).
    pub fn new(client: HttpClient) -> Self {
        // A random per-process prefix keeps Standard Webhooks `webhook-id`s unique across
        // restarts (batch ids are sequence numbers, which restart with a memory store).
        let mut b = [0u8; 6];
        let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
        let boot_id = b.iter().map(|x| format!("{x:02x}")).collect();
        Self {
            client,
            boot_id,
            edgehub: None,
        }
    }

    /// Deliver `EdgeHub` destinations over this connection (under IoT Edge); each attempt waits
    /// up to `timeout` for edgeHub's acknowledgement.
    pub fn with_edgehub(mut self, hub: EdgeHub, timeout: Duration) -> Self {
        self.edgehub = Some((hub, timeout));
        self
    }
}

impl SinkFactory for DefaultSinks {
    fn create(&self, sub: &Subscription) -> Arc<dyn Sink> {
        match &sub.destination {
            Destination::WebHook { endpoint_url } => Arc::new(
                WebhookSink::new(
                    self.client.clone(),
                    endpoint_url.clone(),
                    None,
                    TopicRewrite::None,
                )
                .with_options(&sub.delivery, &self.boot_id),
            ),
            Destination::EventGrid {
                endpoint_url,
                sas_key,
                topic_name,
            } => Arc::new(
                WebhookSink::new(
                    self.client.clone(),
                    endpoint_url.clone(),
                    Some(sas_key),
                    TopicRewrite::Set(topic_name.clone()),
                )
                .with_options(&sub.delivery, &self.boot_id),
            ),
            Destination::EdgeHub { output_name } => match &self.edgehub {
                Some((hub, timeout)) => Arc::new(hub.sink(output_name, *timeout)),
                None => Arc::new(UnsupportedSink(
                    "EdgeHub destinations need the IoT Edge runtime (IOTEDGE_WORKLOADURI)".into(),
                )),
            },
            Destination::EventHub { connection_string }
            | Destination::ServiceBusQueue { connection_string }
            | Destination::ServiceBusTopic { connection_string } => {
                match MessagingConn::parse(connection_string) {
                    Ok(c) => Arc::new(MessagingSink::new(
                        &self.client,
                        &c,
                        sub.destination.endpoint_type(),
                    )),
                    // Refused at subscription time; kept for a store written by another build.
                    Err(e) => Arc::new(UnsupportedSink(e.to_string())),
                }
            }
            Destination::StorageQueue {
                queue_name,
                connection_string,
                message_encoding,
            } => match StorageConn::parse(connection_string) {
                Ok(c) => Arc::new(StorageQueueSink::new(
                    &self.client,
                    &c,
                    queue_name,
                    message_encoding.unwrap_or_default(),
                )),
                Err(e) => Arc::new(UnsupportedSink(e.to_string())),
            },
        }
    }

    fn dead_letter_blob(&self, sub: &Subscription) -> Option<Arc<dyn Sink>> {
        let b = sub.delivery.dead_letter_blob.as_ref()?;
        let c = StorageConn::parse(&b.connection_string).ok()?;
        Some(Arc::new(BlobDeadLetterSink::new(
            &self.client,
            &c,
            &b.container,
        )))
    }
}
