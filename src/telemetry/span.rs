//! A finished span as gridlet records it: plain data, encoded for the collector only on the
//! exporter's task ([`super::otlp`]).

use std::sync::Arc;

/// What a span is, in OpenTelemetry's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// Work inside gridlet (`settle`).
    Internal = 1,
    /// Serving a request (`publish`).
    Server = 2,
    /// A request gridlet makes (`deliver`).
    Client = 3,
    /// Taking messages from a broker (`publish` of an MQTT source's batch).
    Consumer = 5,
}

/// An attribute value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Text.
    Str(Arc<str>),
    /// A whole number.
    Int(i64),
    /// A flag.
    Bool(bool),
    /// A list of texts (event ids).
    StrList(Vec<Arc<str>>),
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Self::Str(Arc::from(s))
    }
}

impl From<Arc<str>> for Value {
    fn from(s: Arc<str>) -> Self {
        Self::Str(s)
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Self::Str(Arc::from(s))
    }
}

impl From<i64> for Value {
    fn from(n: i64) -> Self {
        Self::Int(n)
    }
}

impl From<u64> for Value {
    fn from(n: u64) -> Self {
        Self::Int(i64::try_from(n).unwrap_or(i64::MAX))
    }
}

impl From<u32> for Value {
    fn from(n: u32) -> Self {
        Self::Int(i64::from(n))
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Self::Bool(b)
    }
}

/// How the operation ended.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Status {
    /// Not set (success, by OpenTelemetry's convention).
    #[default]
    Unset,
    /// Failed, and why.
    Error(String),
}

/// Another trace a span relates to (a batch that mixes traces links the others).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// Its trace id.
    pub trace_id: u128,
    /// Its span id.
    pub span_id: u64,
}

/// Links on one span at most: a batch that mixes more traces links the first ones.
pub const MAX_LINKS: usize = 32;

impl Link {
    /// Link to `to`'s trace, unless it is the span's own trace (`own`), is linked already, or
    /// [`MAX_LINKS`] are kept. One link per trace: the first context seen of it.
    pub fn add(links: &mut Vec<Link>, own: u128, to: &super::TraceContext) {
        if to.trace_id != own
            && links.len() < MAX_LINKS
            && !links.iter().any(|l| l.trace_id == to.trace_id)
        {
            links.push(Link {
                trace_id: to.trace_id,
                span_id: to.span_id,
            });
        }
    }
}

/// A finished span.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanData {
    /// Trace id.
    pub trace_id: u128,
    /// This span's id.
    pub span_id: u64,
    /// The parent span's id (0: a root span).
    pub parent_span_id: u64,
    /// `tracestate` carried along.
    pub trace_state: Option<Arc<str>>,
    /// `publish`, `deliver`, `settle`.
    pub name: &'static str,
    /// Kind.
    pub kind: SpanKind,
    /// Start, Unix time in nanoseconds.
    pub start_ns: u64,
    /// End, Unix time in nanoseconds.
    pub end_ns: u64,
    /// Attributes (OpenTelemetry semantic-convention names where one exists).
    pub attributes: Vec<(&'static str, Value)>,
    /// Links to other traces.
    pub links: Vec<Link>,
    /// Outcome.
    pub status: Status,
}

impl SpanData {
    /// Add an attribute.
    pub fn attr(&mut self, key: &'static str, value: impl Into<Value>) {
        self.attributes.push((key, value.into()));
    }
}
