//! One prepared destination ([`Endpoint`]): sending a request on a pooled connection or a new
//! one within the client's deadline, and making connections (gridlet's own listeners and the
//! denied address ranges refused, TLS, the HTTP/1.1 handshake).

use super::pool::{HostPool, Inner};
use super::{error_chain, HttpError, HttpResponse, Sender, ERROR_BODY_BYTES, MAX_RESPONSE_BYTES};
use crate::config::Key;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper::header::{HeaderMap, HeaderValue, ACCEPT, AUTHORIZATION, HOST, USER_AGENT};
use hyper::{Method, Request, Response, Uri};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::Instant;

static USER_AGENT_VALUE: HeaderValue =
    HeaderValue::from_static(concat!("gridlet/", env!("CARGO_PKG_VERSION")));
static ACCEPT_ANY: HeaderValue = HeaderValue::from_static("*/*");

#[derive(Debug, Clone)]
pub(super) enum Connect {
    Addr(SocketAddr),
    Name(String, u16),
}

/// One destination URL, prepared: connect target, TLS server name, request target, `Host`.
pub struct Endpoint {
    pub(super) inner: Arc<Inner>,
    pub(super) pool: Arc<HostPool>,
    pub(super) addr: Connect,
    pub(super) tls_name: Option<ServerName<'static>>,
    /// Origin-form request target (`/path?query`).
    pub(super) path: Uri,
    pub(super) host: HeaderValue,
    pub(super) auth: Option<HeaderValue>,
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
