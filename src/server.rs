//! Start-up and listeners: configuration → TLS material → store → broker → router → sockets.
//!
//! [`run`] / [`Gridlet::start_on`] take bound [`Listeners`] (tests and embedders bind
//! `127.0.0.1:0`); [`Gridlet::start`] binds what the configuration asks for. Each listener runs
//! its own accept loop (`server/conn.rs`: the connection cap, idle, body and write timeouts, the TLS
//! handshake, and the client identity attached to every request as [`crate::api::ConnInfo`]).
//! Shutdown (SIGTERM / Ctrl-C): readiness turns false, accept loops stop, in-flight requests get
//! up to 10 s to finish, then the broker's tasks are dropped.

mod conn;
mod otlp;
mod slots;

use crate::api::{self, AppState};
use crate::broker::{Broker, OpenError};
use crate::clock::Clock;
use crate::config::{Config, MetricsReporter};
use crate::delivery::sink::SinkFactory;
use crate::edge::{EdgeError, EdgeRuntime};
use crate::outbound::http::HttpClient;
use crate::outbound::sinks::{DefaultSinks, WebhookClients};
use crate::store::Store;
use crate::tls::{self, CertStore, ClientCerts, OutboundTls, TlsError};
use conn::{accept_loop, ConnLimits};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

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
    /// An MQTT source setting (a file it names, a route's topic).
    #[error(transparent)]
    Mqtt(#[from] crate::ingress::SettingError),
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
    /// Clock, used as given (tests drive time through it); default: resumed from the wall time
    /// and the last run's heartbeat (see [`crate::clock`]).
    pub clock: Option<Clock>,
    /// The wall time read at start when `clock` is not given; default: the system's (tests
    /// simulate a clock that jumped between two runs).
    pub wall_ms: Option<crate::clock::WallMs>,
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
    /// The MQTT sources' tasks.
    mqtt: crate::ingress::Sources,
    /// The OTLP span and metrics exporters, when endpoints are configured.
    exporters: Vec<otlp::Exporter>,
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

/// The sockets gridlet serves on, bound by the caller (tests and embedders bind `127.0.0.1:0`;
/// [`Listeners::bind`] binds what the configuration asks for).
#[derive(Default)]
pub struct Listeners {
    /// Plain HTTP.
    pub http: Option<TcpListener>,
    /// HTTPS.
    pub https: Option<TcpListener>,
}

impl Listeners {
    /// Bind the listeners `inbound__serverAuth__tlsPolicy` turns on, at `inbound__bindAddress`
    /// and the configured ports.
    ///
    /// # Errors
    /// A port that cannot be bound.
    pub async fn bind(cfg: &Config) -> Result<Self, StartError> {
        let at = |port| SocketAddr::new(cfg.inbound.bind_address, port);
        Ok(Self {
            http: match cfg.inbound.tls_policy.http() {
                true => Some(bind(at(cfg.inbound.http_port)).await?),
                false => None,
            },
            https: match cfg.inbound.tls_policy.https() {
                true => Some(bind(at(cfg.inbound.https_port)).await?),
                false => None,
            },
        })
    }
}

/// Serve on `listeners` until `shutdown` completes, then stop (see [`Gridlet::shutdown`]): the
/// whole server as one call, mini-redis style.
///
/// # Errors
/// Any start-up failure.
pub async fn run(
    cfg: Config,
    parts: Parts,
    listeners: Listeners,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), StartError> {
    let gridlet = Gridlet::start_on(cfg, parts, listeners).await?;
    shutdown.await;
    gridlet.shutdown().await;
    Ok(())
}

impl Gridlet {
    /// Bind the configured listeners and start.
    ///
    /// # Errors
    /// Any start-up failure, with a message naming what to fix.
    pub async fn start(cfg: Config, parts: Parts) -> Result<Self, StartError> {
        let listeners = Listeners::bind(&cfg).await?;
        Self::start_on(cfg, parts, listeners).await
    }

    /// Start everything and serve on the given listeners (each only when the TLS policy turns
    /// it on; a listener the policy turns off is dropped).
    ///
    /// # Errors
    /// Any start-up failure, with a message naming what to fix.
    pub async fn start_on(
        cfg: Config,
        parts: Parts,
        listeners: Listeners,
    ) -> Result<Self, StartError> {
        tls::install_default_provider();
        let cfg = Arc::new(cfg);
        let store = match parts.store {
            Some(s) => s,
            None => on_exiting_thread(|| crate::store::open(&cfg.persistence))
                .map_err(OpenError::from)?,
        };
        let heartbeat = heartbeat_dir(&cfg);
        let clock = match parts.clock {
            Some(c) => c,
            None => resume_clock(&cfg, parts.wall_ms, heartbeat.as_deref()),
        };
        let mut edge = if cfg.edge.is_iot_edge() {
            Some(EdgeRuntime::connect(&cfg, clock).await?)
        } else {
            None
        };
        let own: Vec<SocketAddr> = [listeners.http.as_ref(), listeners.https.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|l| l.local_addr().ok())
            .collect();
        let sinks = match parts.sinks {
            Some(s) => s,
            None => Arc::new(default_sinks(&cfg, edge.as_ref(), &own)?),
        };
        let broker = on_exiting_thread(|| Broker::open(cfg.clone(), store, sinks, clock))?;
        let exporters: Vec<otlp::Exporter> = [
            otlp::Exporter::start(&cfg, broker.tracer(), edge.as_ref())?,
            otlp::Exporter::start_metrics(&cfg, &broker, edge.as_ref())?,
        ]
        .into_iter()
        .flatten()
        .collect();
        // Before any listener is spawned, so a bad MQTT setting stops the start cleanly.
        let plan = crate::ingress::plan(&cfg)?;
        let stored = on_exiting_thread(|| broker.mqtt_records()).map_err(|e| match e {
            crate::broker::BrokerError::Store(s) => OpenError::Store(s),
            other => OpenError::Store(crate::store::StoreError::Io(other.to_string())),
        })?;
        let mqtt = crate::ingress::start(
            plan,
            stored,
            &broker,
            &edge.as_ref().map(EdgeRuntime::mqtt_tls).unwrap_or_default(),
        )?;
        let ready = Arc::new(AtomicBool::new(true));
        let (stop, stop_rx) = watch::channel(false);
        let (entra, entra_task) = entra_keys(&cfg, edge.as_ref(), &broker, clock, &stop_rx)?;
        let router = api::router(AppState {
            stopping: stop_rx.clone(),
            broker: broker.clone(),
            mqtt: mqtt.manager(),
            metrics_enabled: cfg.metrics == MetricsReporter::Prometheus,
            ready: ready.clone(),
            bodies: Arc::new(api::body::BodyBudget::new(
                cfg.inbound.max_body_bytes_in_flight,
            )),
            long_polls: Arc::new(api::long_poll::LongPolls::new(
                cfg.inbound.max_long_polls_per_subscription,
                cfg.inbound.max_long_polls_per_credential,
                cfg.inbound.max_connections,
            )),
            entra,
        });
        let limits = ConnLimits::new(&cfg.inbound);
        let mut tasks: Vec<JoinHandle<()>> = entra_task.into_iter().collect();
        let (mut http_addr, mut https_addr, mut certs) = (None, None, None);
        if let Some(l) = listeners.http.filter(|_| cfg.inbound.tls_policy.http()) {
            http_addr = Some(local_addr(&l)?);
            let serve = accept_loop(l, None, router.clone(), limits.clone(), stop_rx.clone());
            tasks.push(tokio::spawn(serve));
        }
        if let Some(l) = listeners.https.filter(|_| cfg.inbound.tls_policy.https()) {
            let store = server_certificate(&cfg, edge.as_ref())?;
            let client = client_cert_policy(&cfg, edge.as_ref())?;
            let identities = tls::IdentityCheck::new(&client)?;
            if matches!(client, ClientCerts::AnyCa) {
                tracing::warn!("no client certificate can be verified (no IoT Edge trust bundle): every certificate may only publish; manage with a SAS key");
            }
            let acceptor = TlsAcceptor::from(tls::server_config(store.clone(), client)?);
            https_addr = Some(local_addr(&l)?);
            certs = Some(store);
            let serve = accept_loop(l, Some((acceptor, identities)), router, limits, stop_rx);
            tasks.push(tokio::spawn(serve));
        }
        if let Some(dir) = heartbeat.clone() {
            tasks.push(tokio::spawn(heartbeats(dir, clock, stop.subscribe())));
        }
        if cfg.console.enabled {
            tasks.push(tokio::spawn(samples(broker.clone(), stop.subscribe())));
        }
        if cfg.metrics == MetricsReporter::Console {
            tasks.push(tokio::spawn(console_metrics(
                broker.clone(),
                stop.subscribe(),
            )));
        }
        if let Some(e) = edge.as_mut() {
            e.start(broker.clone(), mqtt.manager(), certs.clone());
        }
        tracing::info!(http = ?http_addr, https = ?https_addr, "gridlet listening");
        Ok(Self {
            broker,
            http_addr,
            https_addr,
            certs,
            ready,
            stop,
            listeners: tasks,
            edge,
            mqtt,
            exporters,
        })
    }

    /// Stop: readiness turns false, the listeners stop accepting and in-flight requests finish
    /// (up to 10 s), then in-flight deliveries complete and are settled
    /// (`broker__shutdownDrainTimeoutInSeconds`; nothing new is sent), then every task stops.
    pub async fn shutdown(self) {
        self.ready.store(false, Ordering::Relaxed);
        // No new MQTT messages; those not yet acknowledged are resent by their brokers.
        drop(self.mqtt);
        let _ = self.stop.send(true);
        for l in self.listeners {
            let _ = l.await;
        }
        let within = self.broker.config().broker.shutdown_drain;
        let left = self.broker.drain(within).await;
        if left > 0 {
            tracing::warn!(
                subscriptions = left,
                ?within,
                "deliveries still in flight at the end of the shutdown drain were abandoned"
            );
        }
        self.broker.close_store().await;
        drop(self.edge);
        for e in self.exporters {
            // The spans of the drained deliveries and the final counts, within the timeout.
            e.stop(self.broker.config().telemetry.timeout).await;
        }
        tracing::info!("gridlet stopped");
    }
}

/// Where the clock's heartbeat lives: the metadata directory, with the log store only (the
/// memory store keeps no times across a restart).
fn heartbeat_dir(cfg: &Config) -> Option<std::path::PathBuf> {
    (cfg.persistence.store == crate::config::StoreKind::Log)
        .then(|| cfg.persistence.metadata_path.clone())
}

/// The clock of this run: the wall time clamped by the last run's heartbeat (the restart rule
/// in [`crate::clock`]), logged when the two differ.
fn resume_clock(
    cfg: &Config,
    wall_ms: Option<crate::clock::WallMs>,
    heartbeat: Option<&std::path::Path>,
) -> Clock {
    let wall = wall_ms.unwrap_or_else(crate::clock::system_wall_ms);
    let last = heartbeat.and_then(crate::clock::read_heartbeat);
    let allowance = cfg.broker.restart_clock_allowance;
    let (clock, start) = Clock::resume(wall, last, allowance);
    if start != wall {
        tracing::warn!(
            wall_ms = wall,
            last_run_ms = last,
            resumed_at_ms = start,
            allowance_s = allowance.as_secs(),
            "the wall clock is behind the last run's, or ahead of it by more than the restart allowance: event ages and retry delays continue from the last run (at most the allowance of downtime counted)"
        );
    }
    clock
}

/// Write the clock's time to the heartbeat file every [`crate::clock::HEARTBEAT_EVERY`] and
/// once more when stopping (waiting for that last write). The writes run on a thread of their
/// own (`gridlet-clock`), so the runtime never waits on the file system, and the blocking pool
/// (whose threads share the runtime workers' name) is not used for them.
async fn heartbeats(dir: std::path::PathBuf, clock: Clock, mut stop: watch::Receiver<bool>) {
    type Beat = (
        crate::clock::WallMs,
        Option<tokio::sync::oneshot::Sender<()>>,
    );
    let (tx, rx) = std::sync::mpsc::channel::<Beat>();
    let writer = std::thread::Builder::new()
        .name("gridlet-clock".into())
        .spawn(move || {
            for (ms, done) in rx {
                if let Err(e) = crate::clock::write_heartbeat(&dir, ms) {
                    tracing::warn!(error = %e, "cannot write the clock heartbeat");
                }
                if let Some(done) = done {
                    let _ = done.send(());
                }
            }
        });
    if let Err(e) = writer {
        tracing::warn!(error = %e, "cannot start the clock heartbeat thread");
        return;
    }
    let mut tick = tokio::time::interval(crate::clock::HEARTBEAT_EVERY);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let _ = tx.send((clock.now_ms(), None));
            }
            _ = stop.changed() => {
                let (done, written) = tokio::sync::oneshot::channel();
                if tx.send((clock.now_ms(), Some(done))).is_ok() {
                    let _ = written.await;
                }
                break;
            }
        }
    }
}

/// `broker__metrics=console`: the metrics text in the log every 60 s.
async fn console_metrics(broker: Broker, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    loop {
        tokio::select! {
            _ = tick.tick() => tracing::info!(target: "gridlet::metrics", "\n{}", broker.render_metrics()),
            _ = stop.changed() => break,
        }
    }
}

/// The operator console's ring of samples ([`crate::metrics::ring`]): one every
/// `SAMPLE_EVERY_SECS`, the first at once.
async fn samples(broker: Broker, mut stop: watch::Receiver<bool>) {
    let every = Duration::from_secs(crate::metrics::ring::SAMPLE_EVERY_SECS);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => broker.record_sample(broker.now_ms()),
            _ = stop.changed() => break,
        }
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

async fn bind(addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, source })
}

fn local_addr(l: &TcpListener) -> Result<SocketAddr, StartError> {
    l.local_addr().map_err(|source| StartError::Bind {
        addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        source,
    })
}

/// The outbound TLS settings of credentialed Azure destinations (Event Hubs, Service Bus,
/// Storage, cloud Event Grid): the chain and host name are always verified, against Mozilla's
/// roots plus `outbound__azure__trustedCertificatesFile` (and, under IoT Edge, the trust
/// bundle). The `outbound__webhook__*` settings are the original's *webhook* settings and do
/// not apply: an Azure key must not go to whichever server answers TLS for the name.
///
/// # Errors
/// The trusted-certificates file cannot be read.
pub fn azure_tls(cfg: &Config) -> Result<OutboundTls, StartError> {
    let extra_roots_pem = match &cfg.outbound.azure_trusted_certs_file {
        Some(path) => Some(std::fs::read(path).map_err(|source| TlsError::Io {
            path: path.display().to_string(),
            source,
        })?),
        None => None,
    };
    Ok(OutboundTls {
        accept_any_server_cert: false,
        extra_roots_pem,
        identity: None,
    })
}

/// The Entra signing keys (when Entra tokens are enabled) and the task that fetches them.
type EntraKeys = (Option<Arc<api::entra::Keys>>, Option<JoinHandle<()>>);

/// The Entra ID signing keys when Entra tokens are enabled: the JWKS file's, the cached set, and
/// the task that fetches the tenant's keys (`api::entra::refresh`) over a client that verifies
/// certificates like the Azure destinations' ([`azure_tls`]).
fn entra_keys(
    cfg: &Config,
    edge: Option<&EdgeRuntime>,
    broker: &Broker,
    clock: Clock,
    stop: &watch::Receiver<bool>,
) -> Result<EntraKeys, StartError> {
    use api::entra::{refresh, Keys};
    let Some(entra) = cfg.inbound.entra.as_ref() else {
        return Ok((None, None));
    };
    let keys = Arc::new(Keys::new(entra.keys.clone(), entra.refresh.clone()));
    broker.register_entra_keys(keys.clone());
    let Some(r) = entra.refresh.as_ref() else {
        return Ok((Some(keys), None));
    };
    refresh::restore_cache(&keys);
    let timeout = Duration::from_secs(10);
    let o = azure_tls(cfg)?;
    let client = match edge {
        Some(edge) => edge.outbound_http_client(o, timeout)?,
        None => HttpClient::new(tls::client_config(&o)?, timeout),
    };
    let source = Arc::new(refresh::Https::new(client, r.metadata_url.clone()));
    let task = tokio::spawn(refresh::run(keys.clone(), source, clock, stop.clone()));
    Ok((Some(keys), Some(task)))
}

/// The production sinks: HTTP clients (webhooks per the `outbound__webhook__*` settings, webhooks
/// that carry a secret and Azure destinations always verifying; under IoT Edge all with the
/// trust bundle and the module identity certificate) and, under IoT Edge, the edgeHub connection.
fn default_sinks(
    cfg: &Config,
    edge: Option<&EdgeRuntime>,
    own: &[SocketAddr],
) -> Result<DefaultSinks, StartError> {
    let timeout = cfg.broker.delivery_timeout;
    let client = |o: OutboundTls| -> Result<HttpClient, StartError> {
        let client = match edge {
            Some(edge) => edge.outbound_http_client(o, timeout)?,
            None => HttpClient::new(tls::client_config(&o)?, timeout),
        };
        // Every delivery holds one of `maxInFlightTotal` permits, so no more connections than
        // that are ever in use at once: keep them all reusable (see `outbound::http`).
        Ok(client
            .with_max_idle_per_host(cfg.broker.max_in_flight_total)
            .with_denied_ranges(cfg.outbound.denied_ranges.clone())
            .with_own_listeners(own.to_vec()))
    };
    let configured = outbound_tls(cfg);
    let configured_accepts_any = configured.accept_any_server_cert;
    let verifying = OutboundTls {
        accept_any_server_cert: false,
        ..outbound_tls(cfg)
    };
    let configured = client(configured)?;
    let webhook = WebhookClients {
        verified: if configured_accepts_any {
            client(verifying)?
        } else {
            configured.clone()
        },
        configured,
        configured_accepts_any,
        // The module identity certificate is presented under IoT Edge when this is on.
        presents_certificate: edge.is_some() && cfg.outbound.client_cert_enabled,
    };
    let sinks = DefaultSinks::new(webhook, client(azure_tls(cfg)?)?).with_mqtt(
        edge.map(EdgeRuntime::mqtt_tls).unwrap_or_default(),
        cfg.outbound.denied_ranges.clone(),
        timeout,
    );
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
