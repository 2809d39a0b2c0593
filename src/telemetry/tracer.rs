//! The tracer: whether spans are recorded at all, new ids, the sampler, and the bounded queue
//! the exporter drains.

use super::context::TraceContext;
use super::span::SpanData;
use crate::config::{EdgeEnv, Sampler, Telemetry};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Spans exported and dropped (the `gridlet_telemetry_spans_total` series).
#[derive(Debug, Default)]
pub struct SpanStats {
    /// Accepted by the collector.
    pub exported: AtomicU64,
    /// Lost: the queue was full, or the collector failed or timed out.
    pub dropped: AtomicU64,
}

/// Records spans when an OTLP endpoint is configured; otherwise every call returns at once
/// (cloning it is an `Option<Arc>` copy).
#[derive(Clone, Default)]
pub struct Tracer(Option<Arc<Inner>>);

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("enabled", &self.0.is_some())
            .finish()
    }
}

pub(super) struct Inner {
    sampler: Sampler,
    event_ids: bool,
    seed: u64,
    counter: AtomicU64,
    pub(super) queue: Mutex<VecDeque<SpanData>>,
    pub(super) max_queue: usize,
    pub(super) max_batch: usize,
    pub(super) schedule_delay: Duration,
    pub(super) timeout: Duration,
    pub(super) wake: tokio::sync::Notify,
    pub(super) resource: Vec<(String, String)>,
    pub(super) stats: SpanStats,
}

impl Tracer {
    /// A tracer that records nothing.
    pub fn off() -> Self {
        Self(None)
    }

    /// The tracer `cfg` asks for: off unless a traces endpoint is set. The resource names the
    /// service (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`) and, under IoT Edge, the device
    /// and module.
    pub fn new(cfg: &Telemetry, edge: &EdgeEnv) -> Self {
        if cfg.traces_endpoint.is_none() {
            return Self(None);
        }
        let mut seed = [0u8; 8];
        // A failing system RNG leaves a fixed seed: ids stay unique, only less random.
        let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut seed);
        Self(Some(Arc::new(Inner {
            sampler: cfg.sampler,
            event_ids: cfg.event_ids_on_spans,
            seed: u64::from_le_bytes(seed),
            counter: AtomicU64::new(1),
            queue: Mutex::new(VecDeque::new()),
            max_queue: cfg.max_queue_size,
            max_batch: cfg.max_export_batch_size,
            schedule_delay: cfg.schedule_delay,
            timeout: cfg.timeout,
            wake: tokio::sync::Notify::new(),
            resource: resource(cfg, edge),
            stats: SpanStats::default(),
        })))
    }

    /// Whether spans are recorded.
    pub fn enabled(&self) -> bool {
        self.0.is_some()
    }

    /// Whether event ids go on spans (`telemetry__eventIdsOnSpans`).
    pub fn event_ids(&self) -> bool {
        self.0.as_ref().is_some_and(|i| i.event_ids)
    }

    /// The context of a new span: a child of `parent` (same trace, its sampling decision under
    /// a parent-based sampler), or the root of a new trace. `None` when the tracer is off.
    pub fn start(&self, parent: Option<&TraceContext>) -> Option<TraceContext> {
        let inner = self.0.as_ref()?;
        let span_id = inner.id();
        Some(match parent {
            Some(p) => {
                let sampled = if inner.sampler.parent_based {
                    p.sampled()
                } else {
                    inner.sampler.samples(p.trace_id)
                };
                TraceContext {
                    trace_id: p.trace_id,
                    span_id,
                    flags: (p.flags & !1) | u8::from(sampled),
                    state: p.state.clone(),
                }
            }
            None => {
                let trace_id = (u128::from(inner.id()) << 64) | u128::from(inner.id());
                TraceContext {
                    trace_id,
                    span_id,
                    flags: u8::from(inner.sampler.samples(trace_id)),
                    state: None,
                }
            }
        })
    }

    /// Queue a finished span for export (sampled spans only). Never waits: past
    /// `OTEL_BSP_MAX_QUEUE_SIZE` queued spans it is dropped and counted.
    pub fn record(&self, span: SpanData, sampled: bool) {
        let Some(inner) = &self.0 else { return };
        if !sampled {
            return;
        }
        let len = {
            let mut q = match inner.queue.lock() {
                Ok(q) => q,
                Err(p) => p.into_inner(),
            };
            if q.len() >= inner.max_queue {
                drop(q);
                inner.stats.dropped.fetch_add(1, Relaxed);
                return;
            }
            q.push_back(span);
            q.len()
        };
        if len == inner.max_batch {
            inner.wake.notify_one();
        }
    }

    /// Spans exported and dropped so far (`None`: the tracer is off).
    pub fn stats(&self) -> Option<(u64, u64)> {
        self.0.as_ref().map(|i| {
            (
                i.stats.exported.load(Relaxed),
                i.stats.dropped.load(Relaxed),
            )
        })
    }

    pub(super) fn inner(&self) -> Option<&Arc<Inner>> {
        self.0.as_ref()
    }
}

impl Inner {
    /// A new non-zero id: a counter through splitmix64, from a random seed (unique within
    /// the process, unpredictable across processes, no lock and no system call).
    fn id(&self) -> u64 {
        let n = self.counter.fetch_add(1, Relaxed);
        let mut z = self
            .seed
            .wrapping_add(n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        match z ^ (z >> 31) {
            0 => 1,
            id => id,
        }
    }
}

/// The resource attributes: `OTEL_RESOURCE_ATTRIBUTES`, then `service.name`
/// (`OTEL_SERVICE_NAME` wins), `service.version`, and the IoT Edge identity when running under
/// IoT Edge.
pub fn resource(cfg: &Telemetry, edge: &EdgeEnv) -> Vec<(String, String)> {
    let mut attrs: Vec<(String, String)> = cfg.resource_attributes.clone();
    let mut set = |k: &str, v: String| match attrs.iter_mut().find(|(key, _)| key == k) {
        Some((_, old)) => *old = v,
        None => attrs.push((k.to_string(), v)),
    };
    if let Some(name) = &cfg.service_name {
        set("service.name", name.clone());
    }
    set("service.version", env!("CARGO_PKG_VERSION").to_string());
    if edge.is_iot_edge() || edge.iothub_hostname.is_some() {
        set(
            "service.instance.id",
            format!("{}/{}", edge.device_id, edge.module_id),
        );
        set("cloud.provider", "azure".into());
        set("azure.iot.device.id", edge.device_id.clone());
        set("azure.iot.module.id", edge.module_id.clone());
        if let Some(h) = &edge.iothub_hostname {
            set("azure.iot.hub.hostname", h.clone());
        }
        if let Some(g) = &edge.generation_id {
            set("azure.iot.module.generation.id", g.clone());
        }
    }
    if !attrs.iter().any(|(k, _)| k == "service.name") {
        attrs.push(("service.name".into(), "gridlet".into()));
    }
    attrs
}

/// Unix time in nanoseconds, for span timestamps (the collector wants wall time).
pub fn now_ns() -> u64 {
    #[allow(clippy::disallowed_methods)]
    let now = std::time::SystemTime::now();
    now.duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracer(sampler: Sampler, max_queue: usize) -> Tracer {
        let cfg = Telemetry {
            traces_endpoint: Some("http://127.0.0.1:4318/v1/traces".into()),
            sampler,
            max_queue_size: max_queue,
            ..Telemetry::default()
        };
        Tracer::new(
            &cfg,
            &crate::config::Config::from_vars(Vec::new()).unwrap().edge,
        )
    }

    fn span() -> SpanData {
        SpanData {
            trace_id: 1,
            span_id: 1,
            parent_span_id: 0,
            trace_state: None,
            name: "settle",
            kind: crate::telemetry::SpanKind::Internal,
            start_ns: 0,
            end_ns: 0,
            attributes: Vec::new(),
            links: Vec::new(),
            status: Default::default(),
        }
    }

    #[test]
    fn off_without_an_endpoint() {
        let t = Tracer::new(
            &Telemetry::default(),
            &crate::config::Config::from_vars(Vec::new()).unwrap().edge,
        );
        assert!(!t.enabled());
        assert_eq!(t.start(None), None);
    }

    #[test]
    fn children_keep_the_trace_and_the_parents_decision() {
        let t = tracer(
            Sampler {
                parent_based: true,
                ratio: 0.0,
            },
            10,
        );
        let parent = TraceContext::parse(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            Some("a=b"),
        )
        .unwrap();
        let c = t.start(Some(&parent)).unwrap();
        assert_eq!(c.trace_id, parent.trace_id);
        assert_ne!(c.span_id, parent.span_id);
        assert!(c.sampled(), "parent-based: the parent sampled it");
        assert_eq!(c.state.as_deref(), Some("a=b"));
        let root = t.start(None).unwrap();
        assert!(!root.sampled(), "ratio 0 samples no new trace");
        assert_ne!(root.trace_id, 0);
        let ids: std::collections::HashSet<u64> =
            (0..1000).map(|_| t.start(None).unwrap().span_id).collect();
        assert_eq!(ids.len(), 1000);
    }

    #[test]
    fn a_full_queue_drops_and_counts() {
        let t = tracer(
            Sampler {
                parent_based: true,
                ratio: 1.0,
            },
            2,
        );
        for _ in 0..5 {
            t.record(span(), true);
        }
        t.record(span(), false);
        assert_eq!(t.stats(), Some((0, 3)));
        assert_eq!(t.inner().unwrap().queue.lock().unwrap().len(), 2);
    }
}
