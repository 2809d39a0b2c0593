//! Start-up and listeners: configuration → TLS material → store → broker → router → sockets.
//!
//! Each listener runs its own accept loop. HTTPS connections are handshaken in their own task
//! (a slow client never stalls accepting); the listener records whether the client presented a
//! certificate the verifier accepted and attaches it to every request as [`ConnInfo`].
//! Shutdown (SIGTERM / Ctrl-C): readiness turns false, accept loops stop, in-flight requests get
//! up to 10 s to finish, then the broker's tasks are dropped.

use crate::api::{self, AppState, ConnInfo};
use crate::broker::{Broker, OpenError};
use crate::clock::Clock;
use crate::config::{Config, MetricsReporter};
use crate::delivery::sink::SinkFactory;
use crate::delivery::sinks::DefaultSinks;
use crate::edge::{EdgeError, EdgeRuntime};
use crate::store::Store;
use crate::tls::{self, CertStore, ClientCerts, OutboundTls, TlsError};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

/// Why gridlet could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// TLS material.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// Store or stored records.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The IoT Edge workload API or its material.
    #[error(transparent)]
    Edge(#[from] EdgeError),
    /// A listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
}

/// Replaceable parts (tests inject sinks, stores and clocks).
#[derive(Default)]
pub struct Parts {
    /// Storage; default: per `persistence__store` (sled on disk).
    pub store: Option<Arc<dyn Store>>,
    /// Sinks; default: HTTP client per configuration.
    pub sinks: Option<Arc<dyn SinkFactory>>,
    /// Clock; default: system.
    pub clock: Option<Clock>,
}

/// A running gridlet.
pub struct Gridlet {
    /// The broker.
    pub broker: Broker,
    /// Bound HTTP address, if that listener runs.
    pub http_addr: Option<SocketAddr>,
    /// Bound HTTPS address, if that listener runs.
    pub https_addr: Option<SocketAddr>,
    /// The HTTPS certificate (swapped on renewal).
    pub certs: Option<Arc<CertStore>>,
    ready: Arc<AtomicBool>,
    stop: watch::Sender<bool>,
    listeners: Vec<JoinHandle<()>>,
    /// Under IoT Edge: owns the edgeHub, twin and certificate-renewal tasks.
    edge: Option<EdgeRuntime>,
}

/// The outbound TLS settings from configuration (no IoT Edge identity here; see `edge`).
pub fn outbound_tls(cfg: &Config) -> OutboundTls {
    OutboundTls {
        accept_any_server_cert: cfg.outbound.webhook_skip_server_cert_validation
            || cfg.outbound.webhook_allow_unknown_ca,
        extra_roots_pem: None,
        identity: None,
    }
}

impl Gridlet {
    /// Start everything and bind the listeners.
    ///
    /// # Errors
    /// Any start-up failure, with a message naming what to fix.
    pub async fn start(cfg: Config, parts: Parts) -> Result<Self, StartError> {
        tls::install_default_provider();
        let cfg = Arc::new(cfg);
        let store = match parts.store {
            Some(s) => s,
            None => on_exiting_thread(|| crate::store::open(&cfg.persistence))
                .map_err(OpenError::from)?,
        };
        let clock = parts.clock.unwrap_or_else(Clock::system);
        let mut edge = if cfg.edge.is_iot_edge() {
            Some(EdgeRuntime::connect(&cfg, clock).await?)
        } else {
            None
        };
        let sinks = match parts.sinks {
            Some(s) => s,
            None => Arc::new(default_sinks(&cfg, edge.as_ref())?),
        };
        let broker = on_exiting_thread(|| Broker::open(cfg.clone(), store, sinks, clock))?;
        let ready = Arc::new(AtomicBool::new(true));
        let state = AppState {
            broker: broker.clone(),
            metrics_enabled: cfg.metrics == MetricsReporter::Prometheus,
            ready: ready.clone(),
        };
        let router = api::router(state);
        let (stop, stop_rx) = watch::channel(false);
        let mut listeners = Vec::new();
        let mut http_addr = None;
        let mut https_addr = None;
        let mut certs = None;
        if cfg.inbound.tls_policy.http() {
            let (l, addr) = bind(SocketAddr::new(
                cfg.inbound.bind_address,
                cfg.inbound.http_port,
            ))
            .await?;
            http_addr = Some(addr);
            listeners.push(tokio::spawn(accept_loop(
                l,
                None,
                router.clone(),
                stop_rx.clone(),
            )));
        }
        if cfg.inbound.tls_policy.https() {
            let store = server_certificate(&cfg, edge.as_ref())?;
            let client = client_cert_policy(&cfg, edge.as_ref())?;
            let server_cfg = tls::server_config(store.clone(), client)?;
            let (l, addr) = bind(SocketAddr::new(
                cfg.inbound.bind_address,
                cfg.inbound.https_port,
            ))
            .await?;
            https_addr = Some(addr);
            certs = Some(store);
            listeners.push(tokio::spawn(accept_loop(
                l,
                Some(TlsAcceptor::from(server_cfg)),
                router,
                stop_rx,
            )));
        }
        if cfg.metrics == MetricsReporter::Console {
            let b = broker.clone();
            let mut rx = stop.subscribe();
            listeners.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(60));
                loop {
                    tokio::select! {
                        _ = tick.tick() => tracing::info!(target: "gridlet::metrics", "\n{}", b.render_metrics()),
                        _ = rx.changed() => break,
                    }
                }
            }));
        }
        if let Some(e) = edge.as_mut() {
            e.start(broker.clone(), certs.clone());
        }
        tracing::info!(http = ?http_addr, https = ?https_addr, "gridlet listening");
        Ok(Self {
            broker,
            http_addr,
            https_addr,
            certs,
            ready,
            stop,
            listeners,
            edge,
        })
    }

    /// Stop accepting, let in-flight requests finish (up to 10 s), stop delivery tasks.
    pub async fn shutdown(self) {
        self.ready.store(false, Ordering::Relaxed);
        let _ = self.stop.send(true);
        for l in self.listeners {
            let _ = l.await;
        }
        drop(self.edge);
        tracing::info!("gridlet stopped");
    }
}

/// Run start-up work that allocates and frees a lot (opening the store scans every persisted
/// event; recovery indexes them) on a thread of its own that then exits, within the runtime's
/// context. mimalloc's heaps are per thread: what such work frees on a thread that then idles
/// (the one running `block_on`) stays with that thread and no runtime worker can reuse it. From
/// an exited thread the pages go to whichever thread allocates next. Measured with 1,000,000
/// persisted events restored and drained: peak RSS 173–181 MB before, 151 MB after; RSS after
/// the drain 172–181 MB before, 109–112 MB after (docs/BENCHMARKS.md).
fn on_exiting_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    let runtime = tokio::runtime::Handle::current();
    std::thread::scope(|scope| {
        let worker = scope.spawn(move || {
            let _context = runtime.enter();
            f()
        });
        match worker.join() {
            Ok(v) => v,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), StartError> {
    let l = TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, source })?;
    let local = l
        .local_addr()
        .map_err(|source| StartError::Bind { addr, source })?;
    Ok((l, local))
}

/// The production sinks: one HTTP client (under IoT Edge with the trust bundle and the module
/// identity certificate) and, under IoT Edge, the edgeHub connection.
fn default_sinks(cfg: &Config, edge: Option<&EdgeRuntime>) -> Result<DefaultSinks, StartError> {
    let timeout = cfg.broker.delivery_timeout;
    let client = match edge {
        Some(edge) => edge.outbound_http_client(outbound_tls(cfg), timeout)?,
        None => tls::outbound_http_client(&outbound_tls(cfg), timeout)?,
    };
    // Every delivery holds one of `maxInFlightTotal` permits, so no more connections than that
    // are ever in use at once: keep them all reusable (see `delivery::http`).
    let sinks = DefaultSinks::new(client.with_max_idle_per_host(cfg.broker.max_in_flight_total));
    Ok(match edge.and_then(EdgeRuntime::edgehub) {
        Some(hub) => sinks.with_module_outputs(Arc::new(hub), timeout),
        None => sinks,
    })
}

/// Under IoT Edge the workload API's certificate (renewed by the runtime); otherwise a
/// self-signed one kept in the metadata directory.
fn server_certificate(
    cfg: &Config,
    edge: Option<&EdgeRuntime>,
) -> Result<Arc<CertStore>, StartError> {
    if let Some(edge) = edge {
        return Ok(edge.server_cert_store()?);
    }
    let dir = cfg.persistence.metadata_path.join("tls");
    let names = vec![
        "localhost".to_string(),
        cfg.edge.module_id.clone(),
        "127.0.0.1".to_string(),
    ];
    let (cert, key) = tls::load_or_create_self_signed(&dir, &names)?;
    Ok(CertStore::new(tls::certified_key(&cert, &key)?))
}

fn client_cert_policy(cfg: &Config, edge: Option<&EdgeRuntime>) -> Result<ClientCerts, StartError> {
    if let Some(edge) = edge {
        return Ok(edge.client_certs(cfg)?);
    }
    Ok(if !cfg.inbound.client_cert_enabled {
        ClientCerts::Off
    } else if cfg.inbound.client_cert_allow_unknown_ca {
        ClientCerts::AnyCa
    } else {
        tracing::warn!("client certificate auth needs the IoT Edge trust bundle to validate against; without IoT Edge no certificate is accepted");
        ClientCerts::Off
    })
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    router: Router,
    mut stop: watch::Receiver<bool>,
) {
    let graceful = GracefulShutdown::new();
    let scheme = if tls.is_some() { "https" } else { "http" };
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // EMFILE and friends: back off briefly instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let router = router.clone();
                let tls = tls.clone();
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    match tls {
                        None => {
                            let info = ConnInfo { scheme, client_cert: false, client_identity: None };
                            serve(TokioIo::new(stream), router, info, watcher).await;
                        }
                        Some(acceptor) => {
                            let handshake = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream)).await;
                            match handshake {
                                Ok(Ok(tls_stream)) => {
                                    let first = tls_stream.get_ref().1.peer_certificates().and_then(|c| c.first());
                                    let info = ConnInfo {
                                        scheme,
                                        client_cert: first.is_some(),
                                        client_identity: first.and_then(|c| tls::common_name(c)).map(Arc::from),
                                    };
                                    serve(TokioIo::new(tls_stream), router, info, watcher).await;
                                }
                                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                            }
                        }
                    }
                });
            }
            _ = stop.changed() => break,
        }
    }
    drop(listener);
    if tokio::time::timeout(Duration::from_secs(10), graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("in-flight requests did not finish within 10 s");
    }
}

async fn serve<I>(
    io: TokioIo<I>,
    router: Router,
    info: ConnInfo,
    watcher: hyper_util::server::graceful::Watcher,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = router.map_request(move |mut req: axum::http::Request<Incoming>| {
        req.extensions_mut().insert(info.clone());
        req
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30))
        .keep_alive(true)
        .serve_connection(io, TowerToHyperService::new(svc));
    if let Err(e) = watcher.watch(conn).await {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}
