//! Client connections: accepting under a cap, and the limits every connection lives under.
//!
//! * **Cap** (`inbound__maxConnections`, both listeners together, and
//!   `inbound__maxConnectionsPerPeer`): each connection holds a slot of one table
//!   (`server/slots.rs`) from accept to close. At the cap the least recently used connection
//!   with no request in progress is closed for the new one; only when every connection is busy
//!   do new connections wait in the kernel's listen backlog. Past half the cap, new connections
//!   get shorter handshake and idle timeouts ([`HANDSHAKE_UNDER_PRESSURE`],
//!   [`IDLE_UNDER_PRESSURE`]). With no connection idle, one whose request is a receive waiting
//!   for events has that receive ended (it answers no events and closes).
//! * **Idle** (`inbound__idleTimeoutInSeconds`): hyper's header-read timer runs whenever the
//!   connection waits for a request head: a connection that never sends one, one that sits idle
//!   between keep-alive requests, and a slow header sender are all closed after it.
//! * **Body** (`inbound__requestBodyTimeoutInSeconds`): [`DeadlineBody`] (408 past it).
//! * **Write** (`inbound__responseWriteTimeoutInSeconds`): [`StallTimeout`] closes a connection
//!   whose socket accepts none of a pending response for that long.
//! * **TLS handshake**: 10 s.
//!
//! Stopping: the accept loop ends on the stop signal; open connections are closed gracefully
//! (in-flight requests finish) within [`GRACE`].

use super::slots::{Slot, Slots};
use crate::api::body::DeadlineBody;
use crate::api::ConnInfo;
use crate::config::Inbound;
use crate::tls;
use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

/// How long in-flight requests get to finish once the listeners stop.
pub const GRACE: Duration = Duration::from_secs(10);
/// How long a TLS handshake may take.
const HANDSHAKE: Duration = Duration::from_secs(10);
/// ... when more than half the connection cap is in use.
pub const HANDSHAKE_UNDER_PRESSURE: Duration = Duration::from_secs(3);
/// The longest idle timeout of a connection accepted when more than half the cap is in use.
pub const IDLE_UNDER_PRESSURE: Duration = Duration::from_secs(5);

/// The limits of [`accept_loop`], from `inbound__*`.
#[derive(Clone)]
pub struct ConnLimits {
    /// One slot per open connection, shared by both listeners.
    pub slots: Arc<Slots>,
    /// No request in progress for this long: closed.
    pub idle: Duration,
    /// Request body deadline.
    pub body: Duration,
    /// Response write stall deadline.
    pub write: Duration,
}

impl ConnLimits {
    /// From the inbound settings.
    pub fn new(cfg: &Inbound) -> Self {
        Self {
            slots: Slots::new(cfg.max_connections, cfg.max_connections_per_peer),
            idle: cfg.idle_timeout,
            body: cfg.body_timeout,
            write: cfg.write_timeout,
        }
    }
}

/// Accept connections until `stop` fires, then close them gracefully within [`GRACE`].
pub async fn accept_loop(
    listener: TcpListener,
    tls: Option<(TlsAcceptor, tls::IdentityCheck)>,
    router: Router,
    limits: ConnLimits,
    mut stop: watch::Receiver<bool>,
) {
    let graceful = GracefulShutdown::new();
    loop {
        // Room first: at the cap the least recently used idle connection is closed; with every
        // connection busy nothing is accepted until one is released.
        tokio::select! {
            () = limits.slots.room() => {}
            _ = stop.changed() => break,
        }
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => break,
        };
        let Some(slot) = limits.slots.admit(peer.ip()) else {
            tracing::debug!(%peer, "refused: the peer's connections are all busy and at its cap");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (router, tls, mut limits) = (router.clone(), tls.clone(), limits.clone());
        let handshake = if limits.slots.under_pressure() {
            limits.idle = limits.idle.min(IDLE_UNDER_PRESSURE);
            HANDSHAKE_UNDER_PRESSURE
        } else {
            HANDSHAKE
        };
        let watcher = graceful.watcher();
        let slot = Arc::new(slot);
        tokio::spawn(async move {
            tokio::select! {
                () = connection(stream, peer, tls, router, limits, watcher, slot.clone(), handshake) => {}
                () = slot.evicted() => tracing::debug!(%peer, "idle connection closed to make room"),
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("in-flight requests did not finish within {GRACE:?}");
    }
}

/// One accepted connection: the TLS handshake (within `handshake`), then HTTP.
#[allow(clippy::too_many_arguments)]
async fn connection(
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    tls: Option<(TlsAcceptor, tls::IdentityCheck)>,
    router: Router,
    limits: ConnLimits,
    watcher: Watcher,
    slot: Arc<Slot>,
    handshake: Duration,
) {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let stream = StallTimeout::new(stream, limits.write);
    let Some((acceptor, identities)) = tls else {
        let info = ConnInfo {
            scheme,
            client_cert: false,
            client_cert_verified: false,
            client_identity: None,
        };
        return serve(stream, router, info, &limits, watcher, slot).await;
    };
    match tokio::time::timeout(handshake, acceptor.accept(stream)).await {
        Ok(Ok(tls_stream)) => {
            let chain = tls_stream.get_ref().1.peer_certificates().unwrap_or(&[]);
            // Only a verified chain names someone or manages (issues 20 and 37: a
            // self-signed certificate is anyone's).
            let peer = identities.check(chain);
            let info = ConnInfo {
                scheme,
                client_cert: peer != tls::PeerCert::None,
                client_cert_verified: matches!(peer, tls::PeerCert::Verified(_)),
                client_identity: match peer {
                    tls::PeerCert::Verified(cn) => cn.map(Arc::from),
                    _ => None,
                },
            };
            serve(tls_stream, router, info, &limits, watcher, slot).await;
        }
        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
    }
}

async fn serve<I>(
    io: I,
    router: Router,
    info: ConnInfo,
    limits: &ConnLimits,
    watcher: Watcher,
    slot: Arc<Slot>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let body_timeout = limits.body;
    let long_poll = slot.long_poll();
    // A request in progress keeps the connection from being evicted to make room (a receive
    // waiting for events may be ended instead: `api::long_poll`).
    let svc = tower::service_fn(move |req: axum::http::Request<Incoming>| {
        let busy = slot.busy();
        let mut req = req.map(|b| Body::new(DeadlineBody::new(b, body_timeout)));
        req.extensions_mut().insert(info.clone());
        req.extensions_mut().insert(long_poll.clone());
        let response = router.clone().oneshot(req);
        async move {
            let r = response.await;
            drop(busy);
            r
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.idle)
        .keep_alive(true)
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(svc));
    if let Err(e) = watcher.watch(conn).await {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// A socket whose writes fail with `TimedOut` once one has stayed pending (the client reads
/// nothing) for the deadline. The timer runs only while a write is pending.
pub struct StallTimeout<I> {
    inner: I,
    deadline: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<I> StallTimeout<I> {
    fn new(inner: I, deadline: Duration) -> Self {
        Self {
            inner,
            deadline,
            stalled: None,
        }
    }

    /// Pass `res` through; while it is pending, fail once the stall outlasts the deadline.
    fn watch<T>(&mut self, cx: &mut Context<'_>, res: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if res.is_ready() {
            self.stalled = None;
            return res;
        }
        let deadline = self.deadline;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(deadline)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing of the response in time",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for StallTimeout<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for StallTimeout<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let res = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, res)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let res = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.watch(cx, res)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let res = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, res)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
