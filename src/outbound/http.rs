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

use crate::config::{IpRange, Key};
use crate::sync::lock;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper::header::{HeaderMap, HeaderValue, ACCEPT, AUTHORIZATION, HOST, USER_AGENT};
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::Instant;
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

static USER_AGENT_VALUE: HeaderValue =
    HeaderValue::from_static(concat!("gridlet/", env!("CARGO_PKG_VERSION")));
static ACCEPT_ANY: HeaderValue = HeaderValue::from_static("*/*");

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

struct Inner {
    tls: TlsConnector,
    timeout: Duration,
    connect_timeout: Duration,
    hosts: Mutex<HashMap<HostKey, Arc<HostPool>>>,
    reaper: std::sync::atomic::AtomicBool,
    max_idle_per_host: std::sync::atomic::AtomicUsize,
    /// Address ranges no connection may reach (`outbound__deniedAddressRanges`), set once.
    denied: std::sync::OnceLock<Vec<IpRange>>,
    /// gridlet's own listeners, never a destination (a subscription to its own API), set once.
    own: std::sync::OnceLock<Vec<SocketAddr>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct HostKey {
    https: bool,
    host: String,
    port: u16,
}

#[derive(Default)]
struct HostPool {
    /// Most recently returned last.
    idle: Mutex<Vec<Idle>>,
}

struct Idle {
    tx: Sender,
    since: Instant,
}

impl HostPool {
    fn take(&self) -> Option<Sender> {
        let mut idle = lock(&self.idle);
        while let Some(i) = idle.pop() {
            if i.since.elapsed() >= IDLE_TIMEOUT {
                // Older ones are further down: all expired.
                idle.clear();
                return None;
            }
            if !i.tx.is_closed() {
                return Some(i.tx);
            }
        }
        None
    }

    fn put(&self, tx: Sender, max_idle: usize) {
        if tx.is_closed() {
            return;
        }
        let mut idle = lock(&self.idle);
        if idle.len() < max_idle {
            idle.push(Idle {
                tx,
                since: Instant::now(),
            });
        }
    }

    fn reap(&self) {
        lock(&self.idle).retain(|i| i.since.elapsed() < IDLE_TIMEOUT && !i.tx.is_closed());
    }
}

impl Inner {
    fn reap(&self) {
        let mut hosts = lock(&self.hosts);
        hosts.retain(|_, p| {
            p.reap();
            // Keep pools an endpoint still refers to or that hold connections.
            Arc::strong_count(p) > 1 || !lock(&p.idle).is_empty()
        });
    }

    /// Start the idle reaper (once, from inside the runtime).
    fn start_reaper(self: &Arc<Self>) {
        use std::sync::atomic::Ordering;
        if self.reaper.load(Ordering::Relaxed) || self.reaper.swap(true, Ordering::Relaxed) {
            return;
        }
        let weak: Weak<Inner> = Arc::downgrade(self);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                loop {
                    tokio::time::sleep(REAP_EVERY).await;
                    match weak.upgrade() {
                        Some(inner) => inner.reap(),
                        None => return,
                    }
                }
            });
        } else {
            self.reaper.store(false, Ordering::Relaxed);
        }
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

#[derive(Debug, Clone)]
enum Connect {
    Addr(SocketAddr),
    Name(String, u16),
}

/// One destination URL, prepared: connect target, TLS server name, request target, `Host`.
pub struct Endpoint {
    inner: Arc<Inner>,
    pool: Arc<HostPool>,
    addr: Connect,
    tls_name: Option<ServerName<'static>>,
    /// Origin-form request target (`/path?query`).
    path: Uri,
    host: HeaderValue,
    auth: Option<HeaderValue>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The path and query may carry keys: not shown.
        f.debug_struct("Endpoint")
            .field("host", &self.host)
            .field("tls", &self.tls_name.is_some())
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// `POST` `body` with `headers` (plus `Host`, and `User-Agent`/`Accept`/`Authorization`
    /// unless given), read the response body (up to [`MAX_RESPONSE_BYTES`]) and return the
    /// response head, all within the client's timeout.
    ///
    /// # Errors
    /// No response head before the deadline, no connection, or a broken exchange.
    pub async fn post(&self, headers: HeaderMap, body: Bytes) -> Result<HttpResponse, HttpError> {
        self.send(Method::POST, headers, body).await
    }

    /// [`Endpoint::post`] with another method (`PUT` of a blob).
    ///
    /// # Errors
    /// As [`Endpoint::post`].
    pub async fn send(
        &self,
        method: Method,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<HttpResponse, HttpError> {
        self.send_keeping(method, headers, body, 0, MAX_RESPONSE_BYTES)
            .await
    }

    /// `GET` and return the response with its whole body (at most `max` bytes) in
    /// [`HttpResponse::error_body`], whatever the status, within the client's timeout.
    ///
    /// # Errors
    /// As [`Endpoint::post`]; a body longer than `max` is [`HttpError::Other`].
    pub async fn get(&self, headers: HeaderMap, max: usize) -> Result<HttpResponse, HttpError> {
        let r = self
            .send_keeping(Method::GET, headers, Bytes::new(), max + 1, max + 1)
            .await?;
        if r.error_body.len() > max {
            return Err(HttpError::Other(format!(
                "the response body is longer than {max} bytes"
            )));
        }
        Ok(r)
    }

    /// [`Endpoint::send`], keeping the first `keep_ok` bytes of a 2xx body too, and reading at
    /// most `max` bytes of any body.
    async fn send_keeping(
        &self,
        method: Method,
        headers: HeaderMap,
        body: Bytes,
        keep_ok: usize,
        max: usize,
    ) -> Result<HttpResponse, HttpError> {
        let deadline = Instant::now() + self.inner.timeout;
        let req = self.request(method, headers, body);
        let mut head: Option<HttpResponse> = None;
        let exchange = async {
            let (resp, tx) = self.exchange(req).await?;
            let (parts, body) = resp.into_parts();
            let keep = if parts.status.as_u16() >= 300 {
                ERROR_BODY_BYTES.max(keep_ok)
            } else {
                keep_ok
            };
            head = Some(HttpResponse {
                status: parts.status,
                headers: parts.headers,
                error_body: Bytes::new(),
            });
            let (complete, kept) = read_to_end(body, keep, max).await;
            if let Some(h) = head.as_mut() {
                h.error_body = kept;
            }
            if complete {
                let max_idle = self
                    .inner
                    .max_idle_per_host
                    .load(std::sync::atomic::Ordering::Relaxed);
                self.pool.put(tx, max_idle);
                self.inner.start_reaper();
            }
            Ok::<(), HttpError>(())
        };
        let r = tokio::time::timeout_at(deadline, exchange).await;
        match (head, r) {
            (Some(h), _) => Ok(h),
            (None, Ok(Err(e))) => Err(e),
            (None, Err(_)) => Err(HttpError::Timeout),
            (None, Ok(Ok(()))) => Err(HttpError::Other("no response".into())),
        }
    }

    fn request(&self, method: Method, mut headers: HeaderMap, body: Bytes) -> Request<Full<Bytes>> {
        headers.insert(HOST, self.host.clone());
        if !headers.contains_key(USER_AGENT) {
            headers.insert(USER_AGENT, USER_AGENT_VALUE.clone());
        }
        if !headers.contains_key(ACCEPT) {
            headers.insert(ACCEPT, ACCEPT_ANY.clone());
        }
        if let Some(a) = &self.auth {
            if !headers.contains_key(AUTHORIZATION) {
                headers.insert(AUTHORIZATION, a.clone());
            }
        }
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = method;
        *req.uri_mut() = self.path.clone();
        *req.headers_mut() = headers;
        req
    }

    /// Send on a pooled connection if one takes the request, else on a new one.
    async fn exchange(
        &self,
        mut req: Request<Full<Bytes>>,
    ) -> Result<(Response<Incoming>, Sender), HttpError> {
        while let Some(mut tx) = self.pool.take() {
            if tx.ready().await.is_err() {
                continue; // closed while idle
            }
            match tx.try_send_request(req).await {
                Ok(resp) => return Ok((resp, tx)),
                Err(mut e) => match e.take_message() {
                    // Not written: the connection closed under us; try the next one.
                    Some(r) => req = r,
                    None => return Err(HttpError::Other(error_chain(e.error()))),
                },
            }
        }
        let mut tx = self.connect().await?;
        match tx.try_send_request(req).await {
            Ok(resp) => Ok((resp, tx)),
            Err(e) => Err(HttpError::Other(error_chain(e.error()))),
        }
    }

    /// A connection within the connect timeout. No connection (refused, unresolvable, no
    /// answer within the connect timeout, including a TLS handshake that never completes) is
    /// [`HttpError::Connect`]: the uplink is down, not the endpoint failing. A TLS handshake
    /// that the server completes with an error (an untrusted certificate, a wrong name) is
    /// [`HttpError::Other`]: a configuration fault.
    async fn connect(&self) -> Result<Sender, HttpError> {
        match tokio::time::timeout(self.inner.connect_timeout, self.connect_now()).await {
            Ok(r) => r,
            Err(_) => Err(HttpError::Connect(format!(
                "no connection within {} ms",
                self.inner.connect_timeout.as_millis()
            ))),
        }
    }

    async fn connect_now(&self) -> Result<Sender, HttpError> {
        let conn_err = |e: &dyn std::error::Error| HttpError::Connect(error_chain(e));
        let addrs: Vec<SocketAddr> = match &self.addr {
            Connect::Addr(a) => vec![*a],
            Connect::Name(h, p) => tokio::net::lookup_host((h.as_str(), *p))
                .await
                .map_err(|e| conn_err(&e))?
                .collect(),
        };
        let tcp = self.connect_allowed(&addrs).await?;
        tcp.set_nodelay(true).map_err(|e| conn_err(&e))?;
        match &self.tls_name {
            None => handshake(tcp).await,
            Some(name) => {
                let tls = self
                    .inner
                    .tls
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(|e| tls_err(&e))?;
                handshake(tls).await
            }
        }
    }
}

impl Endpoint {
    /// Connect to the first address of `addrs` outside the denied ranges that accepts.
    async fn connect_allowed(&self, addrs: &[SocketAddr]) -> Result<TcpStream, HttpError> {
        let denied = self.inner.denied.get().map_or(&[][..], Vec::as_slice);
        let own = self.inner.own.get().map_or(&[][..], Vec::as_slice);
        let mut last = None;
        for a in addrs {
            let ip = a.ip();
            if own.iter().any(|l| {
                l.port() == a.port() && (l.ip() == ip || ip.is_loopback() || ip.is_unspecified())
            }) {
                last.get_or_insert(HttpError::Other(format!(
                    "the destination {a} is gridlet's own listener"
                )));
                continue;
            }
            if let Some(r) = denied.iter().find(|r| r.contains(a.ip())) {
                last.get_or_insert(HttpError::Other(format!(
                    "the destination's address {} is in the denied range {r} ({})",
                    a.ip(),
                    Key::outbound__deniedAddressRanges.name()
                )));
                continue;
            }
            match TcpStream::connect(*a).await {
                Ok(tcp) => return Ok(tcp),
                Err(e) => last = Some(HttpError::Connect(error_chain(&e))),
            }
        }
        Err(last
            .unwrap_or_else(|| HttpError::Connect("the host name resolved to no address".into())))
    }
}

/// A failed TLS handshake: a connection that broke is [`HttpError::Connect`], a handshake the
/// peer answered with an error (certificate, name, protocol) [`HttpError::Other`].
fn tls_err(e: &std::io::Error) -> HttpError {
    use std::io::ErrorKind::*;
    match e.kind() {
        ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof | TimedOut => {
            HttpError::Connect(error_chain(e))
        }
        _ => HttpError::Other(format!("TLS handshake: {}", error_chain(e))),
    }
}

/// HTTP/1.1 handshake over `io`; the connection is driven by its own task until it closes.
async fn handshake<T>(io: T) -> Result<Sender, HttpError>
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (tx, conn) = http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| HttpError::Connect(error_chain(&e)))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "outbound connection closed with an error");
        }
    });
    Ok(tx)
}

/// Read a response body, keeping its first `keep` bytes; true if it ended within `max` bytes
/// without an error (then the connection can be reused).
async fn read_to_end(mut body: Incoming, keep: usize, max: usize) -> (bool, Bytes) {
    let mut read = 0usize;
    let mut kept = Vec::new();
    loop {
        match body.frame().await {
            None => return (true, kept.into()),
            Some(Ok(f)) => {
                if let Some(d) = f.data_ref() {
                    read += d.len();
                    if kept.len() < keep {
                        let n = d.len().min(keep - kept.len());
                        kept.extend_from_slice(d.get(..n).unwrap_or_default());
                    }
                    if read > max {
                        return (false, kept.into());
                    }
                }
            }
            Some(Err(_)) => return (false, kept.into()),
        }
    }
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
