//! The production [`SinkFactory`]: one shared HTTP client for every HTTP destination.

use super::http::HttpClient;
use super::sink::{Sink, SinkFactory, UnsupportedSink};
use super::webhook::{TopicRewrite, WebhookSink};
use crate::edge::edgehub::EdgeHub;
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
            other => Arc::new(UnsupportedSink(format!(
                "{} destinations are accepted for compatibility but not delivered by this build",
                other.endpoint_type()
            ))),
        }
    }
}
