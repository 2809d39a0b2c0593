//! An OTLP/HTTP collector inside the bench (`--otlp MODE`), so that tracing's cost is measured
//! as gridlet's alone: the sink reads each export's body and answers at once, without decoding
//! it (a real collector would compete with gridlet for the machine's cores). Every gridlet child
//! is then started with `OTEL_EXPORTER_OTLP_ENDPOINT` pointing at it.
//!
//! Modes: `ok` (200), `500` (every export refused), `slow` (each export answered after
//! [`SLOW`], past gridlet's export timeout), `dead` (nothing listens: connection refused). The
//! last three are the "collector down, slow or answering 500" rows: memory stays
//! bounded (peak RSS in the table) and deliveries go on (their throughput).

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// How long a `slow` sink takes to answer (gridlet's default export timeout is 10 s).
pub const SLOW: Duration = Duration::from_secs(30);

/// How the sink answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// 200 at once.
    Ok,
    /// 500 at once.
    Error,
    /// 200 after [`SLOW`].
    Slow,
    /// No listener.
    Dead,
}

impl Mode {
    /// Parse `--otlp`'s value.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "ok" => Mode::Ok,
            "500" => Mode::Error,
            "slow" => Mode::Slow,
            "dead" => Mode::Dead,
            _ => return None,
        })
    }

    /// As written on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Ok => "ok",
            Mode::Error => "500",
            Mode::Slow => "slow",
            Mode::Dead => "dead",
        }
    }
}

/// What the sink received.
#[derive(Debug, Default)]
pub struct Stats {
    /// Export requests (traces and metrics).
    pub requests: AtomicU64,
    /// Their body bytes.
    pub bytes: AtomicU64,
}

/// The running sink.
pub struct Sink {
    /// The base URL to give gridlet (`OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub endpoint: String,
    /// How it answers.
    pub mode: Mode,
    /// What it received.
    pub stats: Arc<Stats>,
}

impl Sink {
    /// Start a sink answering as `mode` on a free loopback port.
    ///
    /// # Errors
    /// The port cannot be bound.
    pub async fn start(mode: Mode) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let stats = Arc::new(Stats::default());
        if mode == Mode::Dead {
            // The port was free a moment ago and nothing listens on it now.
            drop(listener);
            return Ok(Self {
                endpoint,
                mode,
                stats,
            });
        }
        let st = stats.clone();
        // Detached like the bench's receiver: the bench process exits when done.
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let st = st.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| answer(req, mode, st.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(true)
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok(Self {
            endpoint,
            mode,
            stats,
        })
    }

    /// One line for the report.
    pub fn summary(&self) -> String {
        format!(
            "otlp sink ({}): {} export requests, {} bytes received",
            self.mode.as_str(),
            self.stats.requests.load(Relaxed),
            self.stats.bytes.load(Relaxed)
        )
    }
}

async fn answer(
    req: Request<Incoming>,
    mode: Mode,
    st: Arc<Stats>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let body = req.into_body().collect().await?.to_bytes();
    st.requests.fetch_add(1, Relaxed);
    st.bytes.fetch_add(body.len() as u64, Relaxed);
    if mode == Mode::Slow {
        tokio::time::sleep(SLOW).await;
    }
    let mut r = Response::new(Full::new(Bytes::new()));
    if mode == Mode::Error {
        *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    }
    Ok(r)
}
