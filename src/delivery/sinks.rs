//! The production [`SinkFactory`]: one shared HTTP client for every HTTP destination.

use super::sink::{Sink, SinkFactory, UnsupportedSink};
use super::webhook::{TopicRewrite, WebhookSink};
use crate::model::subscription::{Destination, Subscription};
use std::sync::Arc;

/// Builds sinks for subscriptions.
pub struct DefaultSinks {
    client: reqwest::Client,
}

impl DefaultSinks {
    /// Sinks sharing `client` (see [`crate::tls::outbound_http_client`]).
    pub fn new(client: reqwest::Client) -> Self {
        Self { client }
    }
}

impl SinkFactory for DefaultSinks {
    fn create(&self, sub: &Subscription) -> Arc<dyn Sink> {
        match &sub.destination {
            Destination::WebHook { endpoint_url } => Arc::new(WebhookSink::new(
                self.client.clone(),
                endpoint_url.clone(),
                None,
                TopicRewrite::None,
            )),
            Destination::EventGrid {
                endpoint_url,
                sas_key,
                topic_name,
            } => Arc::new(WebhookSink::new(
                self.client.clone(),
                endpoint_url.clone(),
                Some(sas_key),
                TopicRewrite::Set(topic_name.clone()),
            )),
            Destination::EdgeHub { .. } => Arc::new(UnsupportedSink(
                "EdgeHub destinations need the IoT Edge runtime (IOTEDGE_WORKLOADURI)".into(),
            )),
            other => Arc::new(UnsupportedSink(format!(
                "{} destinations are accepted for compatibility but not delivered by this build",
                other.endpoint_type()
            ))),
        }
    }
}
