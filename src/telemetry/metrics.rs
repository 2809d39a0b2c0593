//! Metrics for OTLP: the Prometheus families as plain data (the broker fills them from the
//! same snapshot `/metrics` renders), encoded as an `ExportMetricsServiceRequest` by
//! [`super::otlp::export_metrics_request`].

/// How a family's points aggregate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// A cumulative, monotonic sum (a Prometheus counter).
    Sum,
    /// A gauge.
    Gauge,
    /// A cumulative histogram of milliseconds.
    Histogram,
}

/// One point's value.
#[derive(Debug, Clone, PartialEq)]
pub enum PointValue {
    /// A counter or gauge.
    Int(u64),
    /// A histogram: count, sum, observations per bucket (`bounds.len() + 1` of them, the last
    /// above every bound).
    Histogram {
        /// Observations.
        count: u64,
        /// Their sum.
        sum: u64,
        /// Per bucket, not cumulative.
        buckets: Vec<u64>,
        /// Upper bounds.
        bounds: &'static [u64],
    },
}

/// One series: its labels as attributes, and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricPoint {
    /// `topic`, `subscription`, `reason`, …
    pub attributes: Vec<(&'static str, String)>,
    /// Value.
    pub value: PointValue,
}

/// One family.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricFamily {
    /// Name, as in `/metrics`.
    pub name: &'static str,
    /// Help text.
    pub help: &'static str,
    /// Kind.
    pub kind: MetricKind,
    /// Its series.
    pub points: Vec<MetricPoint>,
}
