//! The OTLP exporter's task and its transport: `POST` of protobuf bodies to the collector over
//! the same HTTP client deliveries use (rustls with ring; under IoT Edge it trusts the edge CA
//! bundle, so a collector module with a workload-API certificate is accepted). No denied
//! address ranges: the collector is the operator's own endpoint.

use super::StartError;
use crate::broker::Broker;
use crate::config::Config;
use crate::edge::EdgeRuntime;
use crate::outbound::http::{Endpoint, HttpClient};
use crate::telemetry::{export, now_ns, otlp, Tracer, Transport};
use crate::tls::{self, OutboundTls};
use futures_util::future::BoxFuture;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use std::sync::Arc;
use std::time::Duration;
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
        let Some(url) = cfg
            .telemetry
            .traces_endpoint
            .as_deref()
            .filter(|_| tracer.enabled())
        else {
            return Ok(None);
        };
        let Some(transport) = transport(cfg, url, edge)? else {
            return Ok(None);
        };
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(export::run(tracer.clone(), transport, async move {
            let _ = stopped.await;
        }));
        tracing::info!(endpoint = %crate::redact::mask_url(url), "exporting traces over OTLP/HTTP");
        Ok(Some(Self { stop, task }))
    }

    /// Start exporting the metrics families every `OTEL_METRIC_EXPORT_INTERVAL` (`None`: no
    /// metrics endpoint).
    ///
    /// # Errors
    /// TLS material for the client.
    pub(super) fn start_metrics(
        cfg: &Config,
        broker: &Broker,
        edge: Option<&EdgeRuntime>,
    ) -> Result<Option<Self>, StartError> {
        let Some(url) = cfg.telemetry.metrics_endpoint.as_deref() else {
            return Ok(None);
        };
        let Some(transport) = transport(cfg, url, edge)? else {
            return Ok(None);
        };
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(export_metrics(
            broker.clone(),
            transport,
            crate::telemetry::resource(&cfg.telemetry, &cfg.edge),
            cfg.telemetry.metrics_interval,
            cfg.telemetry.timeout,
            stopped,
        ));
        tracing::info!(endpoint = %crate::redact::mask_url(url), "exporting metrics over OTLP/HTTP");
        Ok(Some(Self { stop, task }))
    }

    /// Export what is queued once more, within the export timeout, and stop.
    pub(super) async fn stop(self, within: std::time::Duration) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(within, self.task).await;
    }
}

/// Every `interval`, and once more when stopped: the metrics families, as cumulative points
/// since gridlet started. A failed export is skipped (the next one carries the totals).
async fn export_metrics(
    broker: Broker,
    transport: Arc<dyn Transport>,
    resource: Vec<(String, String)>,
    interval: Duration,
    timeout: Duration,
    mut stop: oneshot::Receiver<()>,
) {
    let start_ns = now_ns();
    let mut warned = false;
    loop {
        let stopping = tokio::select! {
            _ = tokio::time::sleep(interval) => false,
            _ = &mut stop => true,
        };
        let body = otlp::export_metrics_request(
            &resource,
            env!("CARGO_PKG_VERSION"),
            start_ns,
            now_ns(),
            &broker.metric_families(),
        );
        let failure = match tokio::time::timeout(timeout, transport.post(body)).await {
            Ok(Ok(status)) if (200..300).contains(&status) => None,
            Ok(Ok(status)) => Some(format!("HTTP {status}")),
            Ok(Err(e)) => Some(e),
            Err(_) => Some("timeout".to_string()),
        };
        match failure {
            None => warned = false,
            Some(why) if !warned => {
                tracing::warn!(error = %why, "OTLP metrics export failed; the next export carries the totals");
                warned = true;
            }
            Some(_) => {}
        }
        if stopping {
            return;
        }
    }
}

/// The HTTP transport to one OTLP URL (`None`: the URL is unusable, logged).
fn transport(
    cfg: &Config,
    url: &str,
    edge: Option<&EdgeRuntime>,
) -> Result<Option<Arc<dyn Transport>>, StartError> {
    let t = &cfg.telemetry;
    {
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
                tracing::warn!(error = %e, "OTLP endpoint unusable; nothing is exported to it");
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
        Ok(Some(Arc::new(OtlpHttp { endpoint, headers })))
    }
}
