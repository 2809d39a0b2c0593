//! The bench's keep-alive publisher: event bodies stamped with their send time, one
//! connection's requests, and a load of many connections publishing at once.

use super::now_us;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

/// A publish body: a JSON array of `n` EventGridSchema events of `size` bytes each (at least
/// the envelope, ≈ 180 bytes), stamped with the current time.
pub fn events_body(conn: usize, seq: &mut u64, n: usize, size: usize, base: Instant) -> Bytes {
    let mut out = String::with_capacity(n * (size + 1) + 2);
    out.push('[');
    for i in 0..n {
        if i > 0 {
            out.push(',');
        }
        let start = out.len();
        let _ = write!(
            out,
            r#"{{"id":"c{conn}-{seq}","subject":"/bench/{conn}","eventType":"bench.event","eventTime":"2026-01-01T00:00:00Z","dataVersion":"1.0","data":{{"bts":{},"pad":""#,
            now_us(base)
        );
        *seq += 1;
        let used = out.len() - start + 3; // the closing `"}}`
        for _ in used..size {
            out.push('x');
        }
        out.push_str("\"}}");
    }
    out.push(']');
    Bytes::from(out)
}

/// One keep-alive HTTP/1.1 connection.
pub struct Conn {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    host: String,
}

impl Conn {
    /// Connect to `addr`.
    pub async fn open(addr: SocketAddr) -> Result<Self, String> {
        let stream = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr))
            .await
            .map_err(|_| format!("connect to {addr} timed out"))?
            .map_err(|e| format!("connect to {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake with {addr}: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Self {
            sender,
            host: addr.to_string(),
        })
    }

    /// Send one request and read the whole response (bounded by `timeout`).
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        content_type: &str,
        body: Bytes,
        timeout: Duration,
    ) -> Result<(u16, Bytes), String> {
        let fut = async {
            self.sender
                .ready()
                .await
                .map_err(|e| format!("connection: {e}"))?;
            let req = Request::builder()
                .method(method)
                .uri(path)
                .header(hyper::header::HOST, &self.host)
                .header(hyper::header::CONTENT_TYPE, content_type)
                .body(Full::new(body))
                .map_err(|e| format!("request: {e}"))?;
            let resp = self
                .sender
                .send_request(req)
                .await
                .map_err(|e| format!("request: {e}"))?;
            let status = resp.status().as_u16();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| format!("response: {e}"))?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(timeout, fut)
            .await
            .map_err(|_| format!("{method} {path}: no response within {timeout:?}"))?
    }
}

/// One request on a fresh connection (management calls, health polls).
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> Result<(u16, String), String> {
    let mut c = Conn::open(addr).await?;
    let (s, b) = c
        .send(
            method,
            path,
            "application/json",
            Bytes::from(body.to_string()),
            Duration::from_secs(30),
        )
        .await?;
    Ok((s, String::from_utf8_lossy(&b).into_owned()))
}

/// What a publisher run should do.
#[derive(Debug, Clone)]
pub struct Load {
    /// Concurrent keep-alive connections.
    pub conns: usize,
    /// Events per request.
    pub batch: usize,
    /// Stop after this long…
    pub duration: Duration,
    /// …or after this many events, whichever comes first.
    pub max_events: u64,
    /// `Some(events/s)`: paced (open loop), else as fast as responses come back.
    pub rate: Option<u64>,
    /// Request path.
    pub path: String,
    /// Bytes of each event ([`EVENT_BYTES`] unless a scenario says otherwise).
    pub event_bytes: usize,
}

/// What a publisher run did.
#[derive(Debug, Default, Clone)]
pub struct Published {
    /// Events answered 200.
    pub accepted: u64,
    /// Events answered otherwise.
    pub rejected: u64,
    /// Transport errors (each ends that connection's run after a reconnect failed).
    pub errors: u64,
    /// First error message seen.
    pub first_error: Option<String>,
    /// Wall time of the run.
    pub elapsed: Duration,
}

/// Publish `load` to `addr`; every loop is bounded by the deadline and the event cap.
pub async fn publish(addr: SocketAddr, load: &Load, base: Instant) -> Published {
    let started = Instant::now();
    let deadline = started + load.duration;
    let claimed = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..load.conns.max(1) {
        let load = load.clone();
        let claimed = claimed.clone();
        tasks.push(tokio::spawn(async move {
            let mut out = Published::default();
            let mut conn = match Conn::open(addr).await {
                Ok(c) => c,
                Err(e) => {
                    out.errors += 1;
                    out.first_error = Some(e);
                    return out;
                }
            };
            let mut seq = 0u64;
            let mut tick = load.rate.map(|r| {
                let per_conn = (r as f64 / load.conns.max(1) as f64).max(0.001);
                let period = Duration::from_secs_f64(load.batch as f64 / per_conn);
                // Stagger the connections so the aggregate is evenly paced.
                let offset = period.mul_f64(c as f64 / load.conns.max(1) as f64);
                let mut i = tokio::time::interval_at(tokio::time::Instant::now() + offset, period);
                i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                i
            });
            loop {
                if let Some(t) = tick.as_mut() {
                    if tokio::time::timeout_at(deadline.into(), t.tick())
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
                if Instant::now() >= deadline {
                    break;
                }
                let n = load.batch as u64;
                if claimed.fetch_add(n, Relaxed) + n > load.max_events {
                    break;
                }
                let body = events_body(c, &mut seq, load.batch, load.event_bytes, base);
                let timeout = Duration::from_secs(30);
                match conn
                    .send("POST", &load.path, "application/json", body, timeout)
                    .await
                {
                    Ok((200, _)) => out.accepted += n,
                    Ok((status, b)) => {
                        out.rejected += n;
                        if out.first_error.is_none() {
                            out.first_error = Some(format!(
                                "HTTP {status}: {}",
                                String::from_utf8_lossy(&b)
                                    .chars()
                                    .take(200)
                                    .collect::<String>()
                            ));
                        }
                    }
                    Err(e) => {
                        out.errors += 1;
                        out.first_error.get_or_insert(e);
                        match Conn::open(addr).await {
                            Ok(c) if out.errors < 10 => conn = c,
                            _ => break,
                        }
                    }
                }
            }
            out
        }));
    }
    let mut total = Published::default();
    for t in tasks {
        if let Ok(p) = t.await {
            total.accepted += p.accepted;
            total.rejected += p.rejected;
            total.errors += p.errors;
            if total.first_error.is_none() {
                total.first_error = p.first_error;
            }
        }
    }
    total.elapsed = started.elapsed();
    total
}
