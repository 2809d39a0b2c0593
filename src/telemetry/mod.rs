//! OpenTelemetry: trace context carried with every event, spans for each step of its path
//! (`publish`, `deliver` per attempt, `settle`), and their export over OTLP/HTTP (protobuf).
//! See docs/OBSERVABILITY.md.
//!
//! * [`TraceContext`]: the W3C `traceparent` / `tracestate` an event carries (parsed from the
//!   publish request's header or the CloudEvents `traceparent` attribute, written onward on
//!   every delivery).
//! * [`Tracer`]: off unless an OTLP endpoint is configured; new span ids, the sampler, and a
//!   bounded queue of finished spans ([`SpanData`]). Recording never waits: a full queue drops
//!   the span and counts it.
//! * [`export::run`]: the one task that batches the queue into `ExportTraceServiceRequest`s
//!   ([`otlp`]) and posts them through a [`Transport`] the server provides (the HTTP client
//!   lives in a higher layer).

mod context;
pub(crate) mod export;
mod metrics;
pub(crate) mod otlp;
mod span;
mod tracer;

pub use context::TraceContext;
pub use export::Transport;
pub use metrics::{MetricFamily, MetricKind, MetricPoint, PointValue};
pub use span::{Link, SpanData, SpanKind, Status, Value, MAX_LINKS};
pub use tracer::{now_ns, resource, Tracer};
