//! gridlet's outbound HTTP/1.1 client for webhook deliveries: hyper's `client::conn::http1`
//! under a small keep-alive pool per host, TLS by tokio-rustls.
//!
//! Built for one job, posting a body to a fixed endpoint, so it does less per request than a
//! general client: the endpoint URL is parsed once per sink ([`HttpClient::endpoint`]), the
//! `Host` header and the connect target are prepared then, redirects are never followed (a 3xx is
//! returned like any status), and the request runs on the caller's task (the connection is
//! driven by its own task, spawned once per connection).
//!
//! * Pool: idle connections per `(scheme, host, port)`, most recently used first, at most
//!   [`HttpClient::with_max_idle_per_host`] (the broker sets `broker__maxInFlightTotal`: every
//!   connection that concurrent deliveries needed stays reusable, so the pool only grows to the
//!   peak concurrency); a connection idle for [`IDLE_TIMEOUT`] is closed (checked on checkout and
//!   by a reaper task every 30 s). A connection goes back to the pool only after the whole
//!   response body was read.
//! * A request that a pooled connection did not take (it closed meanwhile) is sent again on the
//!   next connection; once written it is never repeated.
//! * Timeouts: one total deadline per request (connect, send, response head and body); connect
//!   (TCP + TLS + HTTP handshake) also at most `min(timeout, 10 s)`. A deadline that passes while
//!   the response *body* is read still returns the status (the head arrived in time).
//! * TCP_NODELAY; `User-Agent: gridlet/<version>` and `Accept: */*` unless the caller set them;
//!   user info in the URL becomes a (sensitive) `Authorization: Basic` header.
//!
//! Rooms: this file is the client and its settings ([`HttpClient`], parsing a URL into an
//! [`Endpoint`]); `pool` keeps the idle connections per host and reaps them; `endpoint` sends a
//! request and makes connections (the denied ranges, TLS, the handshake).

mod endpoint;
mod pool;

use endpoint::Connect;
pub use endpoint::Endpoint;
use pool::{HostKey, Inner};

use crate::config::IpRange;
use crate::sync::lock;
use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1;
use hyper::header::{HeaderMap, HeaderValue};
use hyper::{StatusCode, Uri};
use rustls::pki_types::ServerName;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_rustls::TlsConnector;

/// An idle connection is closed after this long.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Idle connections kept per host unless [`HttpClient::with_max_idle_per_host`] says otherwise
/// (the default of `broker__maxInFlightTotal`). A cap below the number of requests in flight to
/// one host makes the pool close connections that the next deliveries open again: measured with
/// 10 subscriptions × 32 in flight to one receiver and a cap of 64, 12,000 new TCP connections a
/// second, the local port range filled with `TIME_WAIT`, and SYNs dropped by the receiver's full
/// accept queue (1–2 s delivery latency from SYN retransmission).
pub const DEFAULT_MAX_IDLE_PER_HOST: usize = 1024;
/// Largest response body read (then the connection is closed instead of reused).
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024;
/// Upper bound of the connect timeout.
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How often idle connections are checked for [`IDLE_TIMEOUT`].
const REAP_EVERY: Duration = Duration::from_secs(30);

/// One HTTP/1.1 connection's request half.
type Sender = http1::SendRequest<Full<Bytes>>;

/// Why a request got no response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpError {
    /// The deadline passed after a connection was made.
    Timeout,
    /// No connection could be made (resolution, TCP refused or unreachable, no connection
    /// within the connect timeout, a TLS or HTTP handshake that broke).
    Connect(String),
    /// Anything else: an unusable URL, the connection broke during the exchange, a protocol
    /// error. The message is the error chain (never the URL, which may carry keys).
    Other(String),
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Timeout => write!(f, "timeout"),
            Self::Connect(m) => write!(f, "connect: {m}"),
            Self::Other(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for HttpError {}

/// The head of a response; its body was read and dropped, except the start of an error body.
#[derive(Debug)]
pub struct HttpResponse {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// For a status of 300 or more, the first [`ERROR_BODY_BYTES`] of the body (the service's
    /// error text, for logs and dead letters); empty otherwise. [`Endpoint::get`]: the whole body.
    pub error_body: Bytes,
}

/// How much of an error response's body is kept ([`HttpResponse::error_body`]).
pub const ERROR_BODY_BYTES: usize = 1024;

/// The shared outbound client: TLS configuration, timeouts and the connection pools. Cheap to
/// clone.
#[derive(Clone)]
pub struct HttpClient {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

impl HttpClient {
    /// A client over `tls` (its ALPN should offer `http/1.1` only) with a per-request deadline of
    /// `timeout`.
    pub fn new(tls: rustls::ClientConfig, timeout: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                tls: TlsConnector::from(Arc::new(tls)),
                timeout,
                connect_timeout: timeout.min(MAX_CONNECT_TIMEOUT),
                hosts: Mutex::new(HashMap::new()),
                reaper: std::sync::atomic::AtomicBool::new(false),
                max_idle_per_host: std::sync::atomic::AtomicUsize::new(DEFAULT_MAX_IDLE_PER_HOST),
                denied: std::sync::OnceLock::new(),
                own: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Keep at most `n` (at least 1) idle connections per host, for this client and its clones.
    /// Set it to the most requests that can be in flight at once (`broker__maxInFlightTotal`).
    #[must_use]
    pub fn with_max_idle_per_host(self, n: usize) -> Self {
        self.inner
            .max_idle_per_host
            .store(n.max(1), std::sync::atomic::Ordering::Relaxed);
        self
    }

    /// Never connect to an address in `ranges` (for this client and its clones; set once, the
    /// first call wins). Checked on the resolved address of every connection, so a host name
    /// that resolves into a denied range is refused too.
    #[must_use]
    pub fn with_denied_ranges(self, ranges: Vec<IpRange>) -> Self {
        let _ = self.inner.denied.set(ranges);
        self
    }

    /// Never connect to these listening sockets (gridlet's own; set once): their port on the
    /// same address, a loopback or the unspecified address.
    #[must_use]
    pub fn with_own_listeners(self, listeners: Vec<SocketAddr>) -> Self {
        let _ = self.inner.own.set(listeners);
        self
    }

    /// The per-request deadline.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// Prepare posting to `url` (parsed once here).
    ///
    /// # Errors
    /// Not an absolute `http`/`https` URL with a host ([`HttpError::Other`]).
    pub fn endpoint(&self, url: &str) -> Result<Endpoint, HttpError> {
        let bad = |m: String| HttpError::Other(format!("invalid endpoint URL: {m}"));
        let u = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
        let https = match u.scheme() {
            "http" => false,
            "https" => true,
            s => return Err(bad(format!("scheme {s} is not supported"))),
        };
        let port = u
            .port_or_known_default()
            .ok_or_else(|| bad("no port".into()))?;
        let (host, addr, tls_name): (String, Connect, Option<ServerName<'static>>) = match u.host()
        {
            Some(url::Host::Domain(d)) => {
                let name = if https {
                    Some(
                        ServerName::try_from(d.to_string())
                            .map_err(|e| bad(format!("host name: {e}")))?,
                    )
                } else {
                    None
                };
                (d.to_string(), Connect::Name(d.to_string(), port), name)
            }
            Some(url::Host::Ipv4(ip)) => (
                ip.to_string(),
                Connect::Addr(SocketAddr::new(IpAddr::V4(ip), port)),
                https.then(|| ServerName::IpAddress(IpAddr::V4(ip).into())),
            ),
            Some(url::Host::Ipv6(ip)) => (
                format!("[{ip}]"),
                Connect::Addr(SocketAddr::new(IpAddr::V6(ip), port)),
                https.then(|| ServerName::IpAddress(IpAddr::V6(ip).into())),
            ),
            None => return Err(bad("no host".into())),
        };
        let host_header = match u.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.clone(),
        };
        let host_header = HeaderValue::from_str(&host_header).map_err(|e| bad(e.to_string()))?;
        let path = &u[url::Position::BeforePath..url::Position::AfterQuery];
        let path = if path.is_empty() { "/" } else { path };
        let path = Uri::try_from(path).map_err(|e| bad(e.to_string()))?;
        let auth = basic_auth(&u);
        let key = HostKey { https, host, port };
        let pool = lock(&self.inner.hosts).entry(key).or_default().clone();
        Ok(Endpoint {
            inner: self.inner.clone(),
            pool,
            addr,
            tls_name,
            path,
            host: host_header,
            auth,
        })
    }
}

/// `user:password@` of a URL as a sensitive `Authorization: Basic` value.
fn basic_auth(u: &url::Url) -> Option<HeaderValue> {
    use base64::Engine as _;
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .ok()
            .map(|c| c.into_owned())
    };
    let user = decode(u.username())?;
    let password = match u.password() {
        Some(p) => Some(decode(p)?),
        None => None,
    };
    if user.is_empty() && password.is_none() {
        return None;
    }
    let creds = format!("{user}:{}", password.unwrap_or_default());
    let encoded = base64::engine::general_purpose::STANDARD.encode(creds);
    let mut v = HeaderValue::from_str(&format!("Basic {encoded}")).ok()?;
    v.set_sensitive(true);
    Some(v)
}

/// An error and its sources, `: `-separated.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client() -> HttpClient {
        crate::tls::install_default_provider();
        let cfg = crate::tls::client_config(&crate::tls::OutboundTls {
            accept_any_server_cert: true,
            extra_roots_pem: None,
            identity: None,
        })
        .unwrap();
        HttpClient::new(cfg, Duration::from_secs(1))
    }

    #[test]
    fn endpoint_prepares_host_target_and_auth() {
        let c = client();
        let e = c.endpoint("http://example.com/a/b?x=1#frag").unwrap();
        assert_eq!(e.host, "example.com");
        assert_eq!(e.path, "/a/b?x=1");
        assert!(e.auth.is_none());
        assert!(e.tls_name.is_none());
        let e = c.endpoint("https://u:p%40ss@[::1]:8443").unwrap();
        assert_eq!(e.host, "[::1]:8443");
        assert_eq!(e.path, "/");
        assert!(e.tls_name.is_some());
        let a = e.auth.clone().unwrap();
        assert!(a.is_sensitive());
        // base64("u:p@ss")
        assert_eq!(a, "Basic dTpwQHNz");
        let e = c.endpoint("https://127.0.0.1:443/x").unwrap();
        assert_eq!(e.host, "127.0.0.1");
        assert!(matches!(
            c.endpoint("not a url"),
            Err(HttpError::Other(m)) if m.starts_with("invalid endpoint URL")
        ));
        assert!(matches!(
            c.endpoint("ftp://example.com/"),
            Err(HttpError::Other(_))
        ));
        // Endpoints of one host share a pool.
        let a = c.endpoint("http://h:81/a").unwrap();
        let b = c.endpoint("http://h:81/b").unwrap();
        assert!(Arc::ptr_eq(&a.pool, &b.pool));
        let d = c.endpoint("https://h:81/a").unwrap();
        assert!(!Arc::ptr_eq(&a.pool, &d.pool));
    }
}
