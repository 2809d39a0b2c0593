//! The OTLP exporter's task and its transport: `POST` of protobuf bodies to the collector over
//! the same HTTP client deliveries use (rustls with ring; under IoT Edge it trusts the edge CA
//! bundle, so a collector module with a workload-API certificate is accepted). No denied
//! address ranges: the collector is the operator's own endpoint.

use super::StartError;
use crate::config::Config;
use crate::delivery::http::{Endpoint, HttpClient};
use crate::edge::EdgeRuntime;
use crate::telemetry::{export, Tracer, Transport};
use crate::tls::{self, OutboundTls};
use futures_util::future::BoxFuture;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use std::sync::Arc;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

struct OtlpHttp {
    endpoint: Endpoint,
    headers: HeaderMap,
}

impl Transport for OtlpHttp {
    fn post(&self, body: Vec<u8>) -> BoxFuture<'_, Result<u16, String>> {
        Box::pin(async move {
            self.endpoint
                .post(self.headers.clone(), bytes::Bytes::from(body))
                .await
                .map(|r| r.status.as_u16())
                .map_err(|e| e.to_string())
        })
    }
}

/// The running exporter: stop it with [`Exporter::stop`] (one last export of what is queued).
pub(super) struct Exporter {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Exporter {
    /// Start exporting `tracer`'s spans to the configured endpoint (`None`: tracing is off).
    ///
    /// # Errors
    /// TLS material for the client.
    pub(super) fn start(
        cfg: &Config,
        tracer: &Tracer,
        edge: Option<&EdgeRuntime>,
    ) -> Result<Option<Self>, StartError> {
        let t = &cfg.telemetry;
        let Some(url) = t.traces_endpoint.as_deref().filter(|_| tracer.enabled()) else {
            return Ok(None);
        };
        let base = OutboundTls {
            accept_any_server_cert: false,
            extra_roots_pem: None,
            identity: None,
        };
        let client = match edge {
            Some(edge) => edge.outbound_http_client(base, t.timeout)?,
            None => HttpClient::new(tls::client_config(&base)?, t.timeout),
        };
        let endpoint = match client.endpoint(url) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, "OTLP traces endpoint unusable; spans are not exported");
                return Ok(None);
            }
        };
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/x-protobuf"),
        );
        for (k, v) in &t.headers {
            match (
                HeaderName::from_bytes(k.as_bytes()),
                HeaderValue::from_str(v),
            ) {
                (Ok(name), Ok(mut value)) => {
                    value.set_sensitive(true);
                    headers.append(name, value);
                }
                _ => {
                    tracing::warn!(header = %k, "OTEL_EXPORTER_OTLP_HEADERS: header skipped (not a valid HTTP header)")
                }
            }
        }
        let transport: Arc<dyn Transport> = Arc::new(OtlpHttp { endpoint, headers });
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(export::run(tracer.clone(), transport, async move {
            let _ = stopped.await;
        }));
        tracing::info!(endpoint = %crate::model::destination::mask_url(url), "exporting traces over OTLP/HTTP");
        Ok(Some(Self { stop, task }))
    }

    /// Export what is queued once more, within the export timeout, and stop.
    pub(super) async fn stop(self, within: std::time::Duration) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(within, self.task).await;
    }
}
