//! Scenario `pull` (issue 21, opt-in): pull delivery's receive + acknowledge throughput with
//! batches of 1 and 100 (`maxEvents`), against the raw limit of the same client loop measured in
//! the same run, and gridlet's memory with 1,000,000 events waiting in a queue subscription.
//!
//! * **raw**: 4 keep-alive connections, each looping `POST …:receive` then `POST …:acknowledge`
//!   with the tokens it got, against a server in this process that answers both from canned
//!   bodies (no broker): the loopback limit of the request pattern, the client's JSON work
//!   included.
//! * **gridlet**: the same loop against a queue subscription preloaded with 256-byte CloudEvents,
//!   until it is drained: events/s and the ratio to raw; persisted (the default for queue
//!   subscriptions: each acknowledgement waits for the frame holding it, a receive for nothing)
//!   and not persisted, in pairs run one right after the other (two pairs, in both orders;
//!   one with `--quick`), each pair's persisted ÷ not persisted printed (the commits' share).
//! * **rss**: 1,000,000 events (100,000 with `--quick`) published to a queue subscription and
//!   waiting; gridlet's RSS then, and after one receive + acknowledge.

use super::*;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use net::Conn;
use serde_json::Value;
use std::net::SocketAddr;

const NS_API: &str = "api-version=2024-06-01";
const SUB: &str = "/topics/bench/eventsubscriptions/q";
const RECEIVERS: usize = 4;

/// One CloudEvent of about [`net::EVENT_BYTES`] bytes.
fn cloud_event(id: u64) -> String {
    let pad = "x".repeat(net::EVENT_BYTES.saturating_sub(80));
    format!(
        r#"{{"specversion":"1.0","id":"{id}","source":"/bench","type":"bench","data":"{pad}"}}"#
    )
}

/// A canned `:receive` answer of `n` events.
fn canned_receive(n: usize) -> Bytes {
    let items: Vec<String> = (0..n as u64)
        .map(|i| {
            format!(
                r#"{{"brokerProperties":{{"lockToken":"AAAAAQAAAAAAAAABAAAAAcanned-token-{i:06}","deliveryCount":1}},"event":{}}}"#,
                cloud_event(i)
            )
        })
        .collect();
    Bytes::from(format!(r#"{{"value":[{}]}}"#, items.join(",")))
}

/// The raw end: answers `:receive?maxEvents=N` with N canned events and `:acknowledge` with an
/// empty settlement.
async fn canned_server() -> Result<SocketAddr, String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("bind: {e}"))?;
    let addr = listener.local_addr().map_err(|e| format!("addr: {e}"))?;
    let one = canned_receive(1);
    let hundred = canned_receive(100);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            let (one, hundred) = (one.clone(), hundred.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                    let (one, hundred) = (one.clone(), hundred.clone());
                    async move {
                        let q = req.uri().query().unwrap_or("").to_string();
                        let path = req.uri().path().to_string();
                        let _ = http_body_util::BodyExt::collect(req.into_body()).await;
                        let body = if path.ends_with(":receive") {
                            if q.contains("maxEvents=100") {
                                hundred
                            } else {
                                one
                            }
                        } else {
                            Bytes::from_static(
                                br#"{"failedLockTokens":[],"succeededLockTokens":[]}"#,
                            )
                        };
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(body)))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok(addr)
}

/// `RECEIVERS` connections looping receive + acknowledge of `batch` events until `deadline` or
/// until a receive comes back empty; answers (events acknowledged, seconds).
async fn receive_ack(
    addr: SocketAddr,
    batch: usize,
    deadline: Instant,
    check: bool,
) -> Result<(u64, f64), String> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..RECEIVERS {
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::open(addr).await?;
            let mut n = 0u64;
            let t = Duration::from_secs(30);
            while Instant::now() < deadline {
                let path = format!("{SUB}:receive?maxEvents={batch}&maxWaitTime=0&{NS_API}");
                let (s, body) = c
                    .send("POST", &path, "application/json", Bytes::new(), t)
                    .await?;
                if s != 200 {
                    return Err(format!("receive: HTTP {s}"));
                }
                let v: Value =
                    serde_json::from_slice(&body).map_err(|e| format!("receive: {e}"))?;
                let tokens: Vec<&str> = v["value"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|e| e["brokerProperties"]["lockToken"].as_str())
                            .collect()
                    })
                    .unwrap_or_default();
                if tokens.is_empty() {
                    break;
                }
                let ack = serde_json::to_vec(&serde_json::json!({ "lockTokens": tokens }))
                    .map_err(|e| e.to_string())?;
                let path = format!("{SUB}:acknowledge?{NS_API}");
                let (s, body) = c
                    .send("POST", &path, "application/json", Bytes::from(ack), t)
                    .await?;
                if s != 200 {
                    return Err(format!("acknowledge: HTTP {s}"));
                }
                if check {
                    let v: Value =
                        serde_json::from_slice(&body).map_err(|e| format!("acknowledge: {e}"))?;
                    let ok = v["succeededLockTokens"].as_array().map_or(0, Vec::len);
                    if ok != tokens.len() {
                        return Err(format!(
                            "acknowledge: {ok} of {} succeeded: {v}",
                            tokens.len()
                        ));
                    }
                }
                n += tokens.len() as u64;
            }
            Ok::<u64, String>(n)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.map_err(|e| format!("receiver task: {e}"))??;
    }
    Ok((total, started.elapsed().as_secs_f64()))
}

/// Publish `n` events to `:publish` in batches of 100 over 4 connections.
async fn preload(addr: SocketAddr, n: u64) -> Result<f64, String> {
    let started = Instant::now();
    let per = n.div_ceil(4);
    let mut tasks = Vec::new();
    for conn in 0..4u64 {
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::open(addr).await?;
            let (first, last) = (conn * per, ((conn + 1) * per).min(n));
            let mut i = first;
            while i < last {
                let end = (i + 100).min(last);
                let body: Vec<String> = (i..end).map(cloud_event).collect();
                let body = Bytes::from(format!("[{}]", body.join(",")));
                let path = format!("/topics/{TOPIC}:publish?{NS_API}");
                let (s, b) = c
                    .send(
                        "POST",
                        &path,
                        "application/cloudevents-batch+json",
                        body,
                        Duration::from_secs(60),
                    )
                    .await?;
                if s != 200 {
                    return Err(format!(
                        "publish: HTTP {s}: {}",
                        String::from_utf8_lossy(&b)
                    ));
                }
                i = end;
            }
            Ok::<(), String>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| format!("publisher: {e}"))??;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Topic `bench` (CloudEvents) with queue subscription `q`, persisted or not.
async fn queue_setup(g: &Gridlet, persisted: bool) -> Result<(), String> {
    let (s, b) = net::request(
        g.addr,
        "PUT",
        &format!("/topics/{TOPIC}?{API}"),
        r#"{"properties":{"inputSchema":"CloudEventSchemaV1_0"}}"#,
    )
    .await?;
    if s != 200 {
        return Err(format!("create topic: HTTP {s}: {b}"));
    }
    let (s, b) = net::request(
        g.addr,
        "PUT",
        &format!("/topics/{TOPIC}/eventSubscriptions/q?{API}"),
        &format!(
            r#"{{"properties":{{"deliveryConfiguration":{{"deliveryMode":"Queue"}},"persistencePolicy":{{"isPersisted":{persisted}}}}}}}"#
        ),
    )
    .await?;
    if s != 200 {
        return Err(format!("create queue subscription: HTTP {s}: {b}"));
    }
    Ok(())
}

impl Bench {
    pub(super) async fn scenario_pull(&mut self) -> Result<(), String> {
        let raw = canned_server().await?;
        // Persisted and not persisted in pairs, one right after the other (persisted first in
        // the first pair, last in the second), so the machine's drift moves both alike; the
        // ratio of a pair is the persisted run's cost.
        let pairs = if self.opts.quick { 1 } else { 2 };
        for batch in [1usize, 100] {
            let mut ratios = Vec::new();
            for pair in 0..pairs {
                let order = match pair % 2 {
                    0 => [true, false],
                    _ => [false, true],
                };
                let mut eps = [0.0f64; 2]; // persisted, not persisted
                for persisted in order {
                    eps[usize::from(!persisted)] =
                        self.pull_run(raw, batch, persisted, pair).await?;
                }
                ratios.push(eps[0] / eps[1].max(1.0));
            }
            let list: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
            println!(
                "pull batch {batch:>3}: persisted ÷ not persisted, paired: {}",
                list.join(", ")
            );
            self.extras.push((
                format!("pull, maxEvents {batch}: persisted ÷ not persisted, paired"),
                list.join(", "),
            ));
        }
        // Memory with a large backlog waiting.
        let waiting: u64 = if self.opts.quick { 100_000 } else { 1_000_000 };
        let g = Gridlet::start(&self.spec("pull-rss", &[])).await?;
        queue_setup(&g, true).await?;
        let idle = Footprint::of(g.pid);
        let pub_eps = preload(g.addr, waiting).await?;
        let queued = Footprint::of(g.pid);
        let (n, _) = receive_ack(
            g.addr,
            100,
            Instant::now() + Duration::from_millis(200),
            true,
        )
        .await?;
        let later = Footprint::of(g.pid);
        let mb = |b: u64| b as f64 / 1e6;
        println!(
            "pull rss: idle {:.1} MB; {waiting} events waiting: RSS {:.1} MB (peak {:.1} MB, published at {pub_eps:.0} ev/s); after receiving + acknowledging {n}: RSS {:.1} MB",
            mb(idle.rss),
            mb(queued.rss),
            mb(queued.hwm),
            mb(later.rss)
        );
        self.extras.push((
            format!("pull, {waiting} events waiting in a queue subscription"),
            format!(
                "RSS {:.1} MB (peak {:.1} MB), idle {:.1} MB",
                mb(queued.rss),
                mb(queued.hwm),
                mb(idle.rss)
            ),
        ));
        Ok(())
    }

    /// One run of the receive + acknowledge loop against a fresh gridlet (beside a slice of the
    /// raw loop): its events/s.
    async fn pull_run(
        &mut self,
        raw: SocketAddr,
        batch: usize,
        persisted: bool,
        pair: usize,
    ) -> Result<f64, String> {
        let slice = self.opts.duration;
        let (n, secs) = receive_ack(raw, batch, Instant::now() + slice, false).await?;
        let raw_eps = n as f64 / secs.max(1e-9);
        let name = format!("pull-{batch}-{persisted}-{pair}");
        let g = Gridlet::start(&self.spec(&name, &[])).await?;
        queue_setup(&g, persisted).await?;
        // Enough that the receivers rarely run dry within the slice; they stop when drained.
        let events: u64 = match (batch, self.opts.quick) {
            (1, true) => 10_000,
            (1, false) => 100_000,
            (_, true) => 50_000,
            _ => 300_000,
        };
        let pub_eps = preload(g.addr, events).await?;
        let before = Footprint::of(g.pid);
        let (n, secs) = receive_ack(g.addr, batch, Instant::now() + slice * 3, true).await?;
        let after = Footprint::of(g.pid);
        let eps = n as f64 / secs.max(1e-9);
        println!(
            "pull batch {batch:>3}, persisted {persisted:>5}: raw {raw_eps:>9.0} ev/s | gridlet {eps:>9.0} ev/s = {:.2} × raw | {n} events in {secs:.1} s, gridlet CPU {:.1} µs/event | preload {pub_eps:.0} ev/s",
            eps / raw_eps.max(1.0),
            (after.cpu_s - before.cpu_s) * 1e6 / (n.max(1) as f64),
        );
        self.extras.push((
            format!("pull, receive + acknowledge, maxEvents {batch}, persisted {persisted}"),
            format!("{eps:.0} events/s = {:.2} × the raw loop ({raw_eps:.0} events/s), {RECEIVERS} receivers", eps / raw_eps.max(1.0)),
        ));
        Ok(eps)
    }
}
