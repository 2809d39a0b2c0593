//! W3C Trace Context: the `traceparent` / `tracestate` pair an event carries from its publisher
//! through every delivery attempt (<https://www.w3.org/TR/trace-context/>).

use std::sync::Arc;

/// Longest `tracestate` kept (the W3C limit is 32 list members; 512 bytes is the length a
/// participant must be able to propagate). A longer one is dropped, the `traceparent` kept.
pub const MAX_TRACESTATE: usize = 512;

/// One span's context: the ids of the trace and of the span, the trace flags, and the vendor
/// `tracestate` that travels with them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// 16-byte trace id (never 0).
    pub trace_id: u128,
    /// 8-byte id of the span this context names (never 0).
    pub span_id: u64,
    /// Trace flags; bit 0 = sampled.
    pub flags: u8,
    /// The `tracestate` header as received (validated for length and characters only).
    pub state: Option<Arc<str>>,
}

impl TraceContext {
    /// Parse a `traceparent` value (and the `tracestate` that came with it). `None` for anything
    /// the spec says to ignore: wrong length or case, version `ff`, an all-zero id.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<Self> {
        let t = traceparent.trim();
        let b = t.as_bytes();
        if b.len() < 55 || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let version = u8::from_str_radix(t.get(0..2)?, 16).ok()?;
        if version == 0xff || !is_lower_hex(&b[0..2]) {
            return None;
        }
        // Version 00 is exactly 55 characters; a later version may append `-…`.
        if (version == 0 && b.len() != 55) || (b.len() > 55 && b[55] != b'-') {
            return None;
        }
        if !is_lower_hex(&b[3..35]) || !is_lower_hex(&b[36..52]) || !is_lower_hex(&b[53..55]) {
            return None;
        }
        let trace_id = u128::from_str_radix(t.get(3..35)?, 16).ok()?;
        let span_id = u64::from_str_radix(t.get(36..52)?, 16).ok()?;
        let flags = u8::from_str_radix(t.get(53..55)?, 16).ok()?;
        if trace_id == 0 || span_id == 0 {
            return None;
        }
        let state = tracestate
            .map(str::trim)
            .filter(|s| !s.is_empty() && s.len() <= MAX_TRACESTATE)
            .filter(|s| s.bytes().all(|c| (0x20..0x7f).contains(&c)))
            .map(Arc::from);
        Some(Self {
            trace_id,
            span_id,
            flags,
            state,
        })
    }

    /// Whether the sampled flag is set.
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// The `traceparent` value naming this context (version 00). Written digit by digit, not
    /// through `format!`: every delivery attempt of a traced event writes one, sampled or not.
    pub fn traceparent(&self) -> String {
        let mut s = String::with_capacity(55);
        s.push_str("00-");
        push_hex(&mut s, &self.trace_id.to_be_bytes());
        s.push('-');
        push_hex(&mut s, &self.span_id.to_be_bytes());
        s.push('-');
        push_hex(&mut s, &[self.flags]);
        s
    }

    /// The trace id as 32 lower-case hex digits (as log lines and trace backends show it).
    pub fn trace_hex(&self) -> String {
        let mut s = String::with_capacity(32);
        push_hex(&mut s, &self.trace_id.to_be_bytes());
        s
    }

    /// The span id as 16 lower-case hex digits.
    pub fn span_hex(&self) -> String {
        let mut s = String::with_capacity(16);
        push_hex(&mut s, &self.span_id.to_be_bytes());
        s
    }

    /// The `trace_id` and `span_id` fields of a log line about events in `trace` (none when
    /// they travel in no context).
    pub fn log_ids(trace: Option<&Self>) -> (Option<String>, Option<String>) {
        (trace.map(Self::trace_hex), trace.map(Self::span_hex))
    }

    /// The same trace, flags and state, naming span `span_id` (a child span of this one).
    pub fn child(&self, span_id: u64) -> Self {
        Self {
            span_id,
            ..self.clone()
        }
    }
}

/// Append `bytes` as lower-case hex, two digits each.
fn push_hex(s: &mut String, bytes: &[u8]) {
    for b in bytes {
        for nibble in [b >> 4, b & 0xf] {
            s.push(char::from_digit(u32::from(nibble), 16).unwrap_or('0'));
        }
    }
}

fn is_lower_hex(b: &[u8]) -> bool {
    b.iter()
        .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn parses_and_writes_back_the_spec_example() {
        let c = TraceContext::parse(TP, Some("congo=t61rcWkgMzE")).unwrap();
        assert_eq!(c.trace_id, 0x0af7651916cd43dd8448eb211c80319c);
        assert_eq!(c.span_id, 0xb7ad6b7169203331);
        assert!(c.sampled());
        assert_eq!(c.traceparent(), TP);
        assert_eq!(c.trace_hex(), "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(c.span_hex(), "b7ad6b7169203331");
        let small = TraceContext {
            trace_id: 1,
            span_id: 2,
            flags: 0,
            state: None,
        };
        assert_eq!(
            small.traceparent(),
            "00-00000000000000000000000000000001-0000000000000002-00",
            "leading zeros kept"
        );
        assert_eq!(c.state.as_deref(), Some("congo=t61rcWkgMzE"));
        assert_eq!(
            c.child(1).traceparent(),
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000001-01"
        );
    }

    #[test]
    fn what_the_spec_says_to_ignore_is_ignored() {
        for bad in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "00-0af7651916cd43dd8448eb211c80319g-b7ad6b7169203331-01",
        ] {
            assert_eq!(TraceContext::parse(bad, None), None, "{bad}");
        }
        // A later version may carry more fields after a dash.
        let future = "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00-what";
        assert!(!TraceContext::parse(future, None).unwrap().sampled());
        // A tracestate too long or with control characters is dropped; the parent stays.
        let long = "a=".to_string() + &"b".repeat(MAX_TRACESTATE);
        assert_eq!(TraceContext::parse(TP, Some(&long)).unwrap().state, None);
        assert_eq!(
            TraceContext::parse(TP, Some("a=\u{1}")).unwrap().state,
            None
        );
    }
}
