//! The Prometheus text exposition format: one family (`# HELP`, `# TYPE`, its series) at a
//! time. Nothing here knows what a metric means.

use super::{Histogram, LATENCY_BUCKETS_MS};
use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;

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
