//! The export task: batches finished spans into OTLP/HTTP requests, one in flight at a time.
//!
//! Memory is bounded by the queue (`OTEL_BSP_MAX_QUEUE_SIZE` spans) plus the one batch being
//! sent (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`). A collector that is down, slow or failing costs
//! nothing else: each request is bounded by `OTEL_EXPORTER_OTLP_TIMEOUT`, its spans are counted
//! as dropped, and spans recorded meanwhile are dropped at the full queue, never waited for.

use super::otlp;
use super::tracer::Tracer;
use futures_util::future::BoxFuture;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// Posts one OTLP/HTTP protobuf body to the collector's traces endpoint; answers the HTTP
/// status, or why there is none. The server implements it over its HTTP client.
pub trait Transport: Send + Sync + 'static {
    /// `POST` `body` (`Content-Type: application/x-protobuf`).
    fn post(&self, body: Vec<u8>) -> BoxFuture<'_, Result<u16, String>>;
}

/// Export `tracer`'s spans through `transport` until `stop` completes, then send what is
/// queued once more (bounded by the export timeout). Returns at once when the tracer is off.
pub async fn run(
    tracer: Tracer,
    transport: Arc<dyn Transport>,
    stop: impl std::future::Future<Output = ()>,
) {
    let Some(inner) = tracer.inner().cloned() else {
        return;
    };
    tokio::pin!(stop);
    let mut warned = false;
    loop {
        let stopping = tokio::select! {
            _ = inner.wake.notified() => false,
            _ = tokio::time::sleep(inner.schedule_delay) => false,
            _ = &mut stop => true,
        };
        loop {
            let batch: Vec<_> = {
                let mut q = match inner.queue.lock() {
                    Ok(q) => q,
                    Err(p) => p.into_inner(),
                };
                let n = q.len().min(inner.max_batch);
                q.drain(..n).collect()
            };
            if batch.is_empty() {
                break;
            }
            let n = batch.len() as u64;
            let body =
                otlp::export_trace_request(&inner.resource, env!("CARGO_PKG_VERSION"), &batch);
            drop(batch);
            let result = tokio::time::timeout(inner.timeout, transport.post(body)).await;
            let failure = match result {
                Ok(Ok(status)) if (200..300).contains(&status) => None,
                Ok(Ok(status)) => Some(format!("HTTP {status}")),
                Ok(Err(e)) => Some(e),
                Err(_) => Some("timeout".to_string()),
            };
            match failure {
                None => {
                    inner.stats.exported.fetch_add(n, Relaxed);
                    warned = false;
                }
                Some(why) => {
                    inner.stats.dropped.fetch_add(n, Relaxed);
                    // Once per outage, not once per batch.
                    if !warned {
                        tracing::warn!(error = %why, spans = n, "OTLP trace export failed; spans are dropped (counted in gridlet_telemetry_spans_total) until the collector answers");
                        warned = true;
                    }
                    break;
                }
            }
            if n < inner.max_batch as u64 {
                break;
            }
        }
        if stopping {
            return;
        }
    }
}
