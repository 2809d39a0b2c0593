//! Durability benchmark (not a test). Prints the numbers behind `docs/BENCHMARKS.md` §Durability.
//!
//! ```text
//! cargo build --release --bin gridlet
//! cargo run --release --example persist_bench            # full run (1,000,000-event start-up)
//! cargo run --release --example persist_bench -- quick   # smaller sizes
//! ```
//!
//! 1. publish→delivery through a real gridlet (HTTP in, HTTP webhook out, sled store) with the
//!    subscription persisted and not: events/s, publish (ack) latency, publish→delivery latency,
//!    and how many commits shared each journal sync;
//! 2. bytes on disk per queued event (sled store), after draining, and after refilling;
//! 3. start-up time with N queued persisted events, and the RSS that costs;
//! 4. RSS of the release binary, idle and with queued persisted events; then (4b, issue 6
//!    scenario (e)) N events queued behind a down subscriber (release binary as a child
//!    process): RSS, bytes on disk per event, restart to serving, then the subscriber comes back:
//!    drain rate and RSS while draining.
//!
//! ```text
//! cargo run --release --example persist_bench -- backlog [N]   # only (4b), N defaults to 1,000,000
//! cargo run --release --example persist_bench -- memory        # only (3) and (4)
//! GRIDLET_BIN=/path/to/gridlet cargo run --release --example persist_bench -- backlog
//!                                                           # (4b) against another build
//! ```

use gridlet::clock::Clock;
use gridlet::store::log::{LogStore as SledStore, LogStoreOptions as SledOptions};
use gridlet::store::{RetryState, Settled, Store, StoredEvent};
use gridlet::{Config, Gridlet, Parts};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

const V: &str = "api-version=2019-01-01-preview";

fn env(dir: &Path, extra: &[(&str, String)]) -> Config {
    let mut vars: Vec<(String, String)> = [
        ("inbound__serverAuth__tlsPolicy", "disabled"),
        ("inbound__clientAuth__clientCert__enabled", "false"),
        ("outbound__webhook__httpsOnly", "false"),
        ("inbound__httpPort", "0"),
        ("inbound__bindAddress", "127.0.0.1"),
        ("broker__maxEventsPerRequest", "100000"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    vars.push((
        "persistence__metadataPath".into(),
        dir.join("m").display().to_string(),
    ));
    vars.push((
        "persistence__eventsPath".into(),
        dir.join("e").display().to_string(),
    ));
    vars.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
    Config::from_vars(vars).expect("bench config")
}

fn opts(dir: &Path, max: u64) -> SledOptions {
    SledOptions {
        metadata_path: dir.join("m"),
        events_path: dir.join("e"),
        max_disk_bytes: max,
        cache_bytes: 8 << 20,
        flush_every_ms: 1000,
        segment_bytes: gridlet::store::log::SEGMENT_BYTES,
        compact_idle_ms: gridlet::store::log::engine::COMPACT_IDLE_MS,
        refuse_damage: false,
    }
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

fn rss_kib(pid: &str, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

fn event(id: &str, t_us: u64, pad: usize) -> Value {
    json!({"id": id, "subject": "devices/d1", "eventType": "reading",
           "eventTime": "2026-11-21T00:00:00Z", "dataVersion": "1.0",
           "data": {"t": t_us, "pad": "x".repeat(pad)}})
}

/// A webhook that records publish→delivery latency from `data.t` (µs since `epoch`).
struct Sink {
    addr: std::net::SocketAddr,
    lat_ms: Arc<Mutex<Vec<f64>>>,
    count: Arc<AtomicU64>,
    done: Arc<Notify>,
}

async fn sink(epoch: Instant, want: u64) -> Sink {
    type S = (
        Instant,
        u64,
        Arc<Mutex<Vec<f64>>>,
        Arc<AtomicU64>,
        Arc<Notify>,
    );
    async fn h(
        axum::extract::State((epoch, want, lat, count, done)): axum::extract::State<S>,
        body: axum::body::Bytes,
    ) -> axum::http::StatusCode {
        let now = epoch.elapsed().as_micros() as u64;
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let mut n = 0;
        {
            let mut l = lat.lock().unwrap();
            for e in v.as_array().into_iter().flatten() {
                let t = e["data"]["t"].as_u64().unwrap_or(now);
                l.push(now.saturating_sub(t) as f64 / 1000.0);
                n += 1;
            }
        }
        if count.fetch_add(n, Ordering::Relaxed) + n >= want {
            done.notify_one();
        }
        axum::http::StatusCode::OK
    }
    let lat = Arc::new(Mutex::new(Vec::new()));
    let count = Arc::new(AtomicU64::new(0));
    let done = Arc::new(Notify::new());
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(h))
        .with_state((epoch, want, lat.clone(), count.clone(), done.clone()));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    Sink {
        addr,
        lat_ms: lat,
        count,
        done,
    }
}

/// Accepts connections and never answers: keeps queued events queued.
fn black_hole() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming().flatten() {
            held.push(s);
        }
    });
    addr
}

async fn setup(client: &reqwest::Client, base: &str, url: &str, persisted: bool) {
    let r = client
        .put(format!("{base}/topics/t?{V}"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let sub = json!({"properties": {
        "destination": {"endpointType": "WebHook", "properties": {"endpointUrl": url}},
        "persistencePolicy": {"isPersisted": persisted}}});
    let r = client
        .put(format!("{base}/topics/t/eventSubscriptions/s?{V}"))
        .json(&sub)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
}

async fn throughput(persisted: bool, n: u64, concurrency: u64) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SledStore::open(&opts(dir.path(), 4 << 30)).unwrap());
    let cfg = env(dir.path(), &[]);
    let g = Gridlet::start(
        cfg,
        Parts {
            store: Some(store.clone()),
            ..Parts::default()
        },
    )
    .await
    .unwrap();
    let base = format!("http://{}", g.http_addr.unwrap());
    let epoch = Instant::now();
    let per = n / concurrency;
    let total = per * concurrency;
    let s = sink(epoch, total).await;
    let client = reqwest::Client::new();
    setup(
        &client,
        &base,
        &format!("http://{}/hook", s.addr),
        persisted,
    )
    .await;
    let before = store.commit_counters().unwrap_or_default();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..concurrency {
        let client = client.clone();
        let url = format!("{base}/topics/t/events?{V}");
        tasks.push(tokio::spawn(async move {
            let mut acks = Vec::with_capacity(per as usize);
            for i in 0..per {
                let t = epoch.elapsed().as_micros() as u64;
                let body = json!([event(&format!("{w}-{i}"), t, 200)]);
                let sent = Instant::now();
                let r = client.post(&url).json(&body).send().await.unwrap();
                assert_eq!(r.status(), 200);
                acks.push(sent.elapsed().as_secs_f64() * 1000.0);
            }
            acks
        }));
    }
    let mut acks = Vec::new();
    for t in tasks {
        acks.extend(t.await.unwrap());
    }
    let wait = s.done.notified();
    if s.count.load(Ordering::Relaxed) < total {
        let _ = tokio::time::timeout(Duration::from_secs(120), wait).await;
    }
    let secs = start.elapsed().as_secs_f64();
    let after = store.commit_counters().unwrap_or_default();
    let mut lat = s.lat_ms.lock().unwrap().clone();
    println!(
        "  persisted={persisted:<5} {total} events, {concurrency} publishers (1 event/request): {:>7.0} events/s end to end; ack p50 {:.2} ms p99 {:.2} ms; publish->delivery p50 {:.2} ms p99 {:.2} ms; {} commits in {} journal syncs, {} checkpoints",
        s.count.load(Ordering::Relaxed) as f64 / secs,
        pct(&mut acks, 0.5),
        pct(&mut acks, 0.99),
        pct(&mut lat, 0.5),
        pct(&mut lat, 0.99),
        after.commits - before.commits,
        after.syncs - before.syncs,
        after.checkpoints - before.checkpoints,
    );
    g.shutdown().await;
}

fn stored(seq: u64, body: &[u8]) -> StoredEvent {
    StoredEvent {
        seq,
        id: format!("{seq:016x}-0000-0000-0000-000000000000"),
        body: bytes::Bytes::copy_from_slice(body),
        state: RetryState {
            attempts: 0,
            first_enqueued_ms: Clock::system().now_ms(),
            due_ms: 0,
        },
        trace: None,
    }
}

async fn fill(store: &SledStore, q: u32, from: u64, n: u64, body: &[u8]) {
    let mut seq = from;
    while seq < from + n {
        let chunk: Vec<_> = (seq..(seq + 1000).min(from + n))
            .map(|s| (q, stored(s, body)))
            .collect();
        seq += chunk.len() as u64;
        store.submit(chunk).unwrap().wait().await.unwrap();
    }
}

async fn disk_per_event(n: u64) {
    let body = serde_json::to_vec(&event("00000000-0000-0000-0000-000000000000", 0, 120)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&opts(dir.path(), 64 << 30)).unwrap();
    let q = store.next_queue_id().unwrap();
    let record = json!({"v": 1, "name": "s", "topic": "t", "deliverySchema": "EventGridSchema",
        "persisted": true,
        "destination": {"endpointType": "WebHook", "properties": {"endpointUrl": "http://x/"}}});
    store
        .put_subscription(q, &serde_json::from_value(record).unwrap())
        .unwrap();
    let base = store.size_on_disk();
    fill(&store, q, 1, n, &body).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let full = store.size_on_disk();
    let live = store.log_bytes();
    println!(
        "  {n} queued events of {} B (body) + 36 B id: {} on disk = {:.0} B/event ({:.2}x the counted live bytes {}); empty store {}",
        body.len(),
        mib(full),
        (full - base) as f64 / n as f64,
        full as f64 / live.max(1) as f64,
        mib(live),
        mib(base)
    );
    for s in (1..=n).step_by(10) {
        let seqs: Vec<u64> = (s..(s + 10).min(n + 1)).collect();
        store
            .remove(q, &Settled::all(seqs, body.len() as u32))
            .unwrap();
    }
    store.commit().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let drained = store.size_on_disk();
    println!(
        "  after delivering all: {} on disk (live {})",
        mib(drained),
        mib(store.log_bytes()),
    );
    // Steady state: queue and drain the same backlog again, several times.
    let mut next = n + 1;
    let mut sizes = Vec::new();
    for _ in 0..5 {
        fill(&store, q, next, n, &body).await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
        sizes.push(store.size_on_disk());
        for s in (next..next + n).step_by(10) {
            let seqs: Vec<u64> = (s..(s + 10).min(next + n)).collect();
            store
                .remove(q, &Settled::all(seqs, body.len() as u32))
                .unwrap();
        }
        next += n;
    }
    let peak = sizes.iter().max().copied().unwrap_or(0);
    println!(
        "  5 more fill/drain cycles of {n}: on disk at each peak {:?} MiB; highest = {:.2}x the counted live bytes of one backlog (freed space is reused, never returned to the OS)",
        sizes.iter().map(|b| b >> 20).collect::<Vec<_>>(),
        peak as f64 / live.max(1) as f64
    );
}

async fn startup(n: u64) {
    let dir = tempfile::tempdir().unwrap();
    let big = [("persistence__maxDiskBytes", (64u64 << 30).to_string())];
    let hole = black_hole();
    {
        let g = Gridlet::start(env(dir.path(), &big), Parts::default())
            .await
            .unwrap();
        let base = format!("http://{}", g.http_addr.unwrap());
        setup(
            &reqwest::Client::new(),
            &base,
            &format!("http://{hole}/hook"),
            true,
        )
        .await;
        g.shutdown().await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await; // let the aborted tasks drop the store
    let body = serde_json::to_vec(&event("00000000-0000-0000-0000-000000000000", 0, 120)).unwrap();
    let filled = Instant::now();
    {
        let store = SledStore::open(&opts(dir.path(), 64 << 30)).unwrap();
        let snap = store.load().unwrap();
        let q = snap.subscriptions[0].0;
        fill(&store, q, snap.max_seq + 1, n, &body).await;
        println!(
            "  queued {n} events of {} B in {:.1} s (1000 per commit); {} on disk",
            body.len(),
            filled.elapsed().as_secs_f64(),
            mib(store.size_on_disk())
        );
    }
    let rss0 = rss_kib("self", "VmRSS:");
    let t = Instant::now();
    let g = Gridlet::start(
        env(dir.path(), &big),
        Parts {
            clock: Some(Clock::system()),
            ..Parts::default()
        },
    )
    .await
    .unwrap();
    let took = t.elapsed();
    let pending = g.broker.topic("t").unwrap().subscriptions()[0].pending();
    println!(
        "  start-up with {n} queued events: {:.2} s to listening with {pending} pending restored; RSS +{} (bench process {} -> {}, peak {})",
        took.as_secs_f64(),
        mib((rss_kib("self", "VmRSS:").saturating_sub(rss0)) * 1024),
        mib(rss0 * 1024),
        mib(rss_kib("self", "VmRSS:") * 1024),
        mib(rss_kib("self", "VmHWM:") * 1024),
    );
    g.shutdown().await;
}

async fn binary_rss(n: u64) {
    let exe = std::env::current_exe()
        .unwrap()
        .parent()
        .and_then(|p| p.parent())
        .map(|p| p.join("gridlet"))
        .unwrap();
    if !exe.exists() {
        println!("  (skipped: build the binary first: cargo build --release --bin gridlet)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = std::process::Command::new(&exe)
        .env_clear()
        .env("inbound__serverAuth__tlsPolicy", "disabled")
        .env("inbound__clientAuth__clientCert__enabled", "false")
        .env("outbound__webhook__httpsOnly", "false")
        .env("inbound__bindAddress", "127.0.0.1")
        .env("inbound__httpPort", port.to_string())
        .env("broker__maxEventsPerRequest", "100000")
        .env("persistence__metadataPath", dir.path().join("m"))
        .env("persistence__eventsPath", dir.path().join("e"))
        .env("RUST_LOG", "warn")
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    for _ in 0..500 {
        if client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let idle = rss_kib(&pid, "VmRSS:");
    let hole = black_hole();
    setup(&client, &base, &format!("http://{hole}/hook"), true).await;
    let url = format!("{base}/topics/t/events?{V}");
    for i in 0..n / 100 {
        let body: Vec<Value> = (0..100)
            .map(|k| event(&format!("{i}-{k}"), 0, 120))
            .collect();
        let r = client.post(&url).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    println!(
        "  release binary: idle RSS {}; with {n} queued persisted events {} (peak {})",
        mib(idle * 1024),
        mib(rss_kib(&pid, "VmRSS:") * 1024),
        mib(rss_kib(&pid, "VmHWM:") * 1024)
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// A webhook that holds every request while its gate is closed (a subscriber that is down),
/// then answers 200 and counts the events.
struct Gated {
    addr: std::net::SocketAddr,
    open: tokio::sync::watch::Sender<bool>,
    count: Arc<AtomicU64>,
}

async fn gated() -> Gated {
    type S = (tokio::sync::watch::Receiver<bool>, Arc<AtomicU64>);
    async fn h(
        axum::extract::State((mut gate, count)): axum::extract::State<S>,
        body: axum::body::Bytes,
    ) -> axum::http::StatusCode {
        let _ = gate.wait_for(|o| *o).await;
        let n = serde_json::from_slice::<Vec<serde::de::IgnoredAny>>(&body)
            .map(|v| v.len() as u64)
            .unwrap_or(1);
        count.fetch_add(n, Ordering::Relaxed);
        axum::http::StatusCode::OK
    }
    let (open, gate) = tokio::sync::watch::channel(false);
    let count = Arc::new(AtomicU64::new(0));
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(h))
        .with_state((gate, count.clone()));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    Gated { addr, open, count }
}

fn gridlet_bin() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("GRIDLET_BIN") {
        return Some(p.into());
    }
    std::env::current_exe()
        .ok()?
        .parent()
        .and_then(|p| p.parent())
        .map(|p| p.join("gridlet"))
        .filter(|p| p.exists())
}

fn spawn_bin(exe: &Path, dir: &Path, port: u16) -> std::process::Child {
    let mut cmd = std::process::Command::new(exe);
    cmd.env_clear();
    cmd.env("inbound__serverAuth__tlsPolicy", "disabled")
        .env("inbound__clientAuth__clientCert__enabled", "false")
        .env("outbound__webhook__httpsOnly", "false")
        .env("inbound__bindAddress", "127.0.0.1")
        .env("inbound__httpPort", port.to_string())
        .env("broker__maxEventsPerRequest", "100000")
        .env("persistence__maxDiskBytes", (16u64 << 30).to_string())
        .env("metrics__reporterType", "prometheus")
        .env("persistence__metadataPath", dir.join("m"))
        .env("persistence__eventsPath", dir.join("e"))
        .env("RUST_LOG", "warn");
    // Experiments pass through: MALLOC_ARENA_MAX=2, persistence__cacheBytes=..., etc.
    for (k, v) in std::env::vars_os() {
        let k = k.to_string_lossy().to_string();
        if k.starts_with("MALLOC_") || k.starts_with("persistence__") {
            cmd.env(k, v);
        }
    }
    cmd.spawn().unwrap()
}

async fn wait_ready(client: &reqwest::Client, base: &str) -> Duration {
    let t = Instant::now();
    loop {
        if client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return t.elapsed();
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "gridlet never ready"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn dir_bytes(p: &Path) -> u64 {
    std::fs::read_dir(p)
        .map(|rd| {
            rd.flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_bytes(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

async fn pending_metric(client: &reqwest::Client, base: &str) -> u64 {
    let text = client
        .get(format!("{base}/metrics?{V}"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find(|l| l.starts_with("gridlet_pending_events{"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Issue 6 scenario (e): `n` persisted events behind a down subscriber, restart, drain.
async fn backlog(n: u64) {
    let Some(exe) = gridlet_bin() else {
        println!("  (skipped: build the binary first: cargo build --release --bin gridlet)");
        return;
    };
    println!("  binary: {}", exe.display());
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let rx = gated().await;
    let mut child = spawn_bin(&exe, dir.path(), port);
    let first_start = wait_ready(&client, &base).await;
    let pid = child.id().to_string();
    let idle = rss_kib(&pid, "VmRSS:");
    setup(&client, &base, &format!("http://{}/hook", rx.addr), true).await;
    let disk0 = dir_bytes(dir.path());
    // Publish: 4 publishers, 500 events (≈ 290 B each) per request.
    let t = Instant::now();
    let per_req = 500u64;
    let reqs = n / per_req;
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (client, next) = (client.clone(), next.clone());
        let url = format!("{base}/topics/t/events?{V}");
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= reqs {
                    break;
                }
                let body: Vec<Value> = (0..per_req)
                    .map(|k| event(&format!("{i:08}-{k:04}-0000-0000-000000000000"), 0, 120))
                    .collect();
                let r = client.post(&url).json(&body).send().await.unwrap();
                assert_eq!(r.status(), 200, "{:?}", r.text().await);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let total = reqs * per_req;
    let publish_s = t.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let rss = rss_kib(&pid, "VmRSS:");
    let hwm = rss_kib(&pid, "VmHWM:");
    let disk = dir_bytes(dir.path());
    println!(
        "  {total} events published to a down subscriber in {publish_s:.1} s ({:.0} events/s, 500 per request, 4 publishers); first start {:.0} ms, idle RSS {}",
        total as f64 / publish_s,
        first_start.as_secs_f64() * 1000.0,
        mib(idle * 1024)
    );
    println!(
        "  with the backlog queued: RSS {} (peak while publishing {}); on disk {} = {:.0} B/event",
        mib(rss * 1024),
        mib(hwm * 1024),
        mib(disk),
        disk.saturating_sub(disk0) as f64 / total as f64
    );
    // Restart (SIGKILL: a crash, the harder case) with the backlog.
    let _ = child.kill();
    let _ = child.wait();
    let mut child = spawn_bin(&exe, dir.path(), port);
    let ready = wait_ready(&client, &base).await;
    let pid = child.id().to_string();
    let pending = pending_metric(&client, &base).await;
    let restart_rss = rss_kib(&pid, "VmRSS:");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    println!(
        "  restart (after SIGKILL) to serving: {:.2} s from spawn to /readyz answering 200, {pending} pending; RSS {} at ready, {} 1 s later (peak {})",
        ready.as_secs_f64(),
        mib(restart_rss * 1024),
        mib(rss_kib(&pid, "VmRSS:") * 1024),
        mib(rss_kib(&pid, "VmHWM:") * 1024),
    );
    // The subscriber comes back.
    let before = rx.count.load(Ordering::Relaxed);
    let t = Instant::now();
    rx.open.send_replace(true);
    let mut peak = 0;
    let mut last_report = Instant::now();
    loop {
        peak = peak.max(rss_kib(&pid, "VmRSS:"));
        let left = pending_metric(&client, &base).await;
        if left == 0 {
            break;
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            println!(
                "    … {left} pending after {:.0} s",
                t.elapsed().as_secs_f64()
            );
            last_report = Instant::now();
        }
        if t.elapsed() > Duration::from_secs(300) {
            println!("    (stopped waiting after 300 s with {left} pending)");
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let secs = t.elapsed().as_secs_f64();
    let got = rx.count.load(Ordering::Relaxed) - before;
    println!(
        "  subscriber back: {got} events received in {secs:.1} s = {:.0} events/s (1 event per delivery request, 32 in flight); RSS while draining peak {}, after {}; on disk after {}",
        got as f64 / secs,
        mib(peak * 1024),
        mib(rss_kib(&pid, "VmRSS:") * 1024),
        mib(dir_bytes(dir.path())),
    );
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    gridlet::tls::install_default_provider();
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "backlog") {
        let n = args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(1_000_000);
        println!("4b. {n} events behind a down subscriber (release binary)");
        backlog(n).await;
        return;
    }
    if args.iter().any(|a| a == "memory") {
        // Only (3) and (4), full sizes.
        println!("3. start-up with queued persisted events");
        startup(1_000_000).await;
        println!("4. memory of the release binary");
        binary_rss(200_000).await;
        return;
    }
    let quick = std::env::args().any(|a| a == "quick");
    let (n_tp, n_disk, n_start, n_rss) = if quick {
        (5_000, 20_000, 100_000, 50_000)
    } else {
        (20_000, 100_000, 1_000_000, 200_000)
    };
    println!("durability benchmark (sled 0.34.7, cache 8 MiB, flushEveryMs 1000)");
    println!("1. publish -> delivery");
    for persisted in [false, true] {
        throughput(persisted, n_tp, 32).await;
    }
    throughput(true, n_tp / 4, 1).await;
    println!("2. bytes on disk per queued event");
    disk_per_event(n_disk).await;
    println!("3. start-up with queued persisted events");
    startup(n_start).await;
    println!("4. memory of the release binary");
    binary_rss(n_rss).await;
    println!("4b. events behind a down subscriber (release binary)");
    backlog(if quick { 100_000 } else { 1_000_000 }).await;
}
