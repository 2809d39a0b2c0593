//! Metrics: the original module's names, cheap on the hot path.
//!
//! Every counter is an `AtomicU64` owned by the topic or subscription it describes, so recording
//! costs one relaxed atomic add and no lookup or lock; deleting a subscription removes its series.
//! [`render`](crate::broker::Broker::render_metrics) walks the broker's topics and writes the
//! Prometheus text exposition. Names follow the original (`EventsReceived`,
//! `DeliverySuccessCounts`, …) with labels `topic` and `subscription`, so existing dashboards keep
//! working; gridlet's own additions are prefixed `gridlet_`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A monotonically increasing count.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Add `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }
    /// Add one.
    pub fn inc(&self) {
        self.add(1);
    }
    /// Current value.
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// Upper bounds (ms) of the latency histogram buckets.
pub const LATENCY_BUCKETS_MS: [u64; 12] = [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 5000, 60000];

/// A latency histogram in milliseconds.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS_MS.len()],
    sum: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    /// Record one observation.
    pub fn observe_ms(&self, ms: u64) {
        if let Some(i) = LATENCY_BUCKETS_MS.iter().position(|b| ms <= *b) {
            self.buckets[i].fetch_add(1, Relaxed);
        }
        self.sum.fetch_add(ms, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }
}

/// Per-topic metrics (docs/COMPATIBILITY.md §8).
#[derive(Debug, Default)]
pub struct TopicMetrics {
    /// Events accepted by publish requests.
    pub events_received: Counter,
    /// Events that matched no subscription (dropped).
    pub unmatched_events: Counter,
    /// Publish requests answered 200.
    pub success_requests: Counter,
    /// Publish requests that failed on the broker's side (5xx).
    pub system_error_requests: Counter,
    /// Publish requests rejected as the client's fault (4xx).
    pub user_error_requests: Counter,
    /// Latency of successful publish requests.
    pub success_request_latency_ms: Histogram,
}

/// Per-subscription metrics (docs/COMPATIBILITY.md §8, plus gridlet's drop accounting).
#[derive(Debug, Default)]
pub struct SubscriptionMetrics {
    /// Events delivered.
    pub delivery_success_counts: Counter,
    /// Events whose delivery attempt failed.
    pub delivery_failure_counts: Counter,
    /// Latency of successful delivery requests.
    pub delivery_success_latency_ms: Histogram,
    /// Latency of failed delivery requests.
    pub delivery_failure_latency_ms: Histogram,
    /// Time from publish to the first attempt.
    pub system_delay_for_first_attempt_ms: Histogram,
    /// Delivery attempts (per event).
    pub delivery_attempts_count: Counter,
    /// Events dropped for time-to-live or attempts (the original counted both here).
    pub expired_counts: Counter,
    /// Events dropped because `maxDeliveryAttempts` was reached.
    pub dropped_max_attempts: Counter,
    /// Events dropped because their time to live passed.
    pub dropped_expired: Counter,
    /// Events accepted into this subscription's queue.
    pub enqueued: Counter,
    /// Events refused for good by the endpoint (400/413 under the `standard` policy).
    pub dropped_refused: Counter,
    /// Events dead-lettered at publish because the queue was full.
    pub dropped_queue_full: Counter,
    /// Events kept as dead letters.
    pub dead_lettered: Counter,
    /// Dead letters evicted to stay within the bound.
    pub dead_letters_evicted: Counter,
    /// Dead letters replayed through the API.
    pub dead_letters_replayed: Counter,
}

/// One series: label pairs and a value.
pub struct Series<'a> {
    /// `(name, value)` label pairs.
    pub labels: Vec<(&'static str, &'a str)>,
    /// Value.
    pub value: SeriesValue<'a>,
}

/// A counter/gauge value or a histogram.
pub enum SeriesValue<'a> {
    /// Counter or gauge.
    Number(u64),
    /// Histogram.
    Histogram(&'a Histogram),
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn labels(out: &mut String, labels: &[(&'static str, &str)], extra: Option<(&str, &str)>) {
    if labels.is_empty() && extra.is_none() {
        return;
    }
    out.push('{');
    let mut first = true;
    for (k, v) in labels.iter().map(|(k, v)| (*k, *v)).chain(extra) {
        if !first {
            out.push(',');
        }
        first = false;
        let _ = write!(out, "{k}=\"{}\"", escape(v));
    }
    out.push('}');
}

/// Append one metric family in the Prometheus text format.
pub fn write_family(out: &mut String, name: &str, kind: &str, help: &str, series: &[Series<'_>]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for s in series {
        match &s.value {
            SeriesValue::Number(v) => {
                out.push_str(name);
                labels(out, &s.labels, None);
                let _ = writeln!(out, " {v}");
            }
            SeriesValue::Histogram(h) => {
                let mut cumulative = 0;
                for (i, bound) in LATENCY_BUCKETS_MS.iter().enumerate() {
                    cumulative += h.buckets[i].load(Relaxed);
                    let _ = write!(out, "{name}_bucket");
                    let b = bound.to_string();
                    labels(out, &s.labels, Some(("le", &b)));
                    let _ = writeln!(out, " {cumulative}");
                }
                let _ = write!(out, "{name}_bucket");
                labels(out, &s.labels, Some(("le", "+Inf")));
                let _ = writeln!(out, " {}", h.count.load(Relaxed));
                let _ = write!(out, "{name}_sum");
                labels(out, &s.labels, None);
                let _ = writeln!(out, " {}", h.sum.load(Relaxed));
                let _ = write!(out, "{name}_count");
                labels(out, &s.labels, None);
                let _ = writeln!(out, " {}", h.count.load(Relaxed));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_renders_cumulative_buckets() {
        let h = Histogram::default();
        h.observe_ms(3);
        h.observe_ms(70_000);
        let mut out = String::new();
        write_family(
            &mut out,
            "X",
            "histogram",
            "x",
            &[Series {
                labels: vec![("topic", "t\"1")],
                value: SeriesValue::Histogram(&h),
            }],
        );
        assert!(
            out.contains("X_bucket{topic=\"t\\\"1\",le=\"5\"} 1"),
            "{out}"
        );
        assert!(
            out.contains("X_bucket{topic=\"t\\\"1\",le=\"+Inf\"} 2"),
            "{out}"
        );
        assert!(out.contains("X_count{topic=\"t\\\"1\"} 2"), "{out}");
    }
}
