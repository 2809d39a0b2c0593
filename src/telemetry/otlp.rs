//! The OTLP/HTTP protobuf body for traces: the small subset of `opentelemetry-proto` gridlet
//! sends (`ExportTraceServiceRequest` → `ResourceSpans` → `ScopeSpans` → `Span`), encoded by
//! hand. Field numbers are those of `opentelemetry/proto/trace/v1/trace.proto`,
//! `common/v1/common.proto` and `resource/v1/resource.proto` (stable since OTLP 1.0); the tests
//! decode what this writes with the official definitions (`tests/it/otel.rs`).

use super::metrics::{MetricFamily, MetricKind, PointValue};
use super::span::{SpanData, Status, Value};

/// Protobuf wire types.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

fn key(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, u64::from(field << 3 | u32::from(wire)));
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    key(out, field, LEN);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn string(out: &mut Vec<u8>, field: u32, s: &str) {
    if !s.is_empty() {
        bytes(out, field, s.as_bytes());
    }
}

fn fixed64(out: &mut Vec<u8>, field: u32, v: u64) {
    key(out, field, FIXED64);
    out.extend_from_slice(&v.to_le_bytes());
}

fn fixed32(out: &mut Vec<u8>, field: u32, v: u32) {
    key(out, field, FIXED32);
    out.extend_from_slice(&v.to_le_bytes());
}

/// A nested message: written by `f` into a scratch buffer, then length-prefixed.
fn message(out: &mut Vec<u8>, field: u32, f: impl FnOnce(&mut Vec<u8>)) {
    let mut inner = Vec::new();
    f(&mut inner);
    bytes(out, field, &inner);
}

/// `AnyValue`.
fn any_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Str(s) => bytes(out, 1, s.as_bytes()),
        Value::Bool(b) => {
            key(out, 2, VARINT);
            varint(out, u64::from(*b));
        }
        Value::Int(n) => {
            key(out, 3, VARINT);
            varint(out, *n as u64);
        }
        Value::StrList(items) => message(out, 5, |arr| {
            for s in items {
                message(arr, 1, |av| bytes(av, 1, s.as_bytes()));
            }
        }),
    }
}

/// `KeyValue`.
fn key_value(out: &mut Vec<u8>, field: u32, k: &str, v: &Value) {
    message(out, field, |kv| {
        string(kv, 1, k);
        message(kv, 2, |av| any_value(av, v));
    });
}

fn span(out: &mut Vec<u8>, s: &SpanData) {
    bytes(out, 1, &s.trace_id.to_be_bytes());
    bytes(out, 2, &s.span_id.to_be_bytes());
    if let Some(state) = &s.trace_state {
        string(out, 3, state);
    }
    if s.parent_span_id != 0 {
        bytes(out, 4, &s.parent_span_id.to_be_bytes());
    }
    string(out, 5, s.name);
    key(out, 6, VARINT);
    varint(out, s.kind as u64);
    fixed64(out, 7, s.start_ns);
    fixed64(out, 8, s.end_ns);
    for (k, v) in &s.attributes {
        key_value(out, 9, k, v);
    }
    for l in &s.links {
        message(out, 13, |m| {
            bytes(m, 1, &l.trace_id.to_be_bytes());
            bytes(m, 2, &l.span_id.to_be_bytes());
        });
    }
    if let Status::Error(msg) = &s.status {
        message(out, 15, |m| {
            string(m, 2, msg);
            key(m, 3, VARINT);
            varint(m, 2); // STATUS_CODE_ERROR
        });
    }
    // Span flags: the W3C trace flags in the low byte; only sampled spans are exported.
    fixed32(out, 16, 1);
}

/// The `ExportTraceServiceRequest` body for `spans` from one resource.
pub fn export_trace_request(
    resource: &[(String, String)],
    scope_version: &str,
    spans: &[SpanData],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + spans.len() * 256);
    message(&mut out, 1, |rs| {
        message(rs, 1, |r| {
            for (k, v) in resource {
                key_value(r, 1, k, &Value::Str(v.as_str().into()));
            }
        });
        message(rs, 2, |ss| {
            message(ss, 1, |scope| {
                string(scope, 1, "gridlet");
                string(scope, 2, scope_version);
            });
            for s in spans {
                message(ss, 2, |m| span(m, s));
            }
        });
    });
    out
}

/// `NumberDataPoint` / `HistogramDataPoint` common part: attributes and times.
fn point_head(
    out: &mut Vec<u8>,
    attrs_field: u32,
    attrs: &[(&'static str, String)],
    start_ns: u64,
    now_ns: u64,
) {
    for (k, v) in attrs {
        key_value(out, attrs_field, k, &Value::Str(v.as_str().into()));
    }
    fixed64(out, 2, start_ns);
    fixed64(out, 3, now_ns);
}

/// The `ExportMetricsServiceRequest` body for `families` from one resource: counters as
/// cumulative monotonic sums, gauges, and histograms (cumulative, explicit bounds in ms), every
/// point with `start_ns` (gridlet's start) and `now_ns`.
pub fn export_metrics_request(
    resource: &[(String, String)],
    scope_version: &str,
    start_ns: u64,
    now_ns: u64,
    families: &[MetricFamily],
) -> Vec<u8> {
    const CUMULATIVE: u64 = 2;
    let mut out = Vec::with_capacity(4096);
    message(&mut out, 1, |rm| {
        message(rm, 1, |r| {
            for (k, v) in resource {
                key_value(r, 1, k, &Value::Str(v.as_str().into()));
            }
        });
        message(rm, 2, |sm| {
            message(sm, 1, |scope| {
                string(scope, 1, "gridlet");
                string(scope, 2, scope_version);
            });
            for f in families {
                message(sm, 2, |m| {
                    string(m, 1, f.name);
                    string(m, 2, f.help);
                    if f.kind == MetricKind::Histogram {
                        string(m, 3, "ms");
                    }
                    let field = match f.kind {
                        MetricKind::Gauge => 5,
                        MetricKind::Sum => 7,
                        MetricKind::Histogram => 9,
                    };
                    message(m, field, |data| {
                        for p in &f.points {
                            match &p.value {
                                PointValue::Int(n) => message(data, 1, |dp| {
                                    point_head(dp, 7, &p.attributes, start_ns, now_ns);
                                    key(dp, 6, FIXED64); // as_int (sfixed64)
                                    dp.extend_from_slice(&(*n as i64).to_le_bytes());
                                }),
                                PointValue::Histogram {
                                    count,
                                    sum,
                                    buckets,
                                    bounds,
                                } => {
                                    message(data, 1, |dp| {
                                        point_head(dp, 9, &p.attributes, start_ns, now_ns);
                                        fixed64(dp, 4, *count);
                                        key(dp, 5, FIXED64); // sum (double)
                                        dp.extend_from_slice(&(*sum as f64).to_le_bytes());
                                        let mut packed = Vec::with_capacity(buckets.len() * 8);
                                        for b in buckets {
                                            packed.extend_from_slice(&b.to_le_bytes());
                                        }
                                        bytes(dp, 6, &packed);
                                        let mut packed = Vec::with_capacity(bounds.len() * 8);
                                        for b in bounds.iter() {
                                            packed.extend_from_slice(&(*b as f64).to_le_bytes());
                                        }
                                        bytes(dp, 7, &packed);
                                    })
                                }
                            }
                        }
                        if f.kind != MetricKind::Gauge {
                            key(data, 2, VARINT);
                            varint(data, CUMULATIVE);
                        }
                        if f.kind == MetricKind::Sum {
                            key(data, 3, VARINT);
                            varint(data, 1); // is_monotonic
                        }
                    });
                });
            }
        });
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::span::SpanKind;

    #[test]
    fn varints_and_a_span_encode_as_protobuf_does() {
        let mut v = Vec::new();
        varint(&mut v, 300);
        assert_eq!(v, [0xac, 0x02]);
        let s = SpanData {
            trace_id: 1,
            span_id: 2,
            parent_span_id: 0,
            trace_state: None,
            name: "x",
            kind: SpanKind::Internal,
            start_ns: 0,
            end_ns: 0,
            attributes: vec![],
            links: vec![],
            status: Status::Unset,
        };
        let mut out = Vec::new();
        span(&mut out, &s);
        // trace_id: field 1, 16 bytes, big-endian.
        assert_eq!(&out[..2], [0x0a, 16]);
        assert_eq!(out[17], 1);
        // span_id: field 2, 8 bytes.
        assert_eq!(&out[18..20], [0x12, 8]);
        // name "x": field 5.
        assert_eq!(&out[28..31], [0x2a, 1, b'x']);
    }
}
