//! Crash test (issue 3's acceptance): the real gridlet binary is SIGKILLed at random moments while
//! publishers run and a webhook fails part of the time; after every restart it must still deliver
//! every event it acknowledged.
//!
//! * `acknowledged_events_survive_sigkill`: persisted subscription; asserts every event answered
//!   200 is delivered at least once, and that every duplicate is one that was in flight at a kill:
//!   its first delivery happened just before a SIGKILL (delivered, but its removal from the store
//!   not yet settled and flushed), never long before.
//!
//! That a non-persisted subscription loses its events across a restart (the original's
//! behaviour, which persistence fixes) is asserted deterministically by
//! `persistence::persisted_events_survive_restart_non_persisted_do_not`.
//!
//! The receiver fails a quarter of the requests during the first cycle only. The child runs the
//! Event Grid cloud schedule (first retry after 10 s) instead of the original 1-minute queue: a
//! real process cannot use tokio's paused clock, and the schedules themselves are proven on the
//! paused clock elsewhere; here only "retried after a restart" matters.

use crate::child::Gridlet;
use crate::util::poll_within;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const V: &str = "api-version=2019-01-01-preview";
const CYCLES: usize = 12;
const PUBLISHERS: usize = 4;
const EVENTS_PER_REQUEST: usize = 5;
const MAX_IN_FLIGHT: usize = 8;

/// Small deterministic PRNG (xorshift); the seed is printed so a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
}

/// What the receiver saw.
#[derive(Default)]
struct Seen {
    /// Event id → successful deliveries (answered 200).
    delivered: HashMap<String, u32>,
    /// Event id → when it was first delivered.
    first_at: HashMap<String, Instant>,
    requests: u64,
}

struct Hook {
    addr: std::net::SocketAddr,
    seen: Arc<Mutex<Seen>>,
    failing: Arc<AtomicBool>,
    _task: tokio::task::JoinHandle<()>,
}

async fn hook() -> Hook {
    use axum::extract::State;
    use axum::http::StatusCode;
    type S = (Arc<Mutex<Seen>>, Arc<AtomicBool>, Arc<AtomicU64>);
    async fn handle(State((seen, failing, n)): State<S>, body: axum::body::Bytes) -> StatusCode {
        let i = n.fetch_add(1, Ordering::Relaxed);
        let mut g = seen.lock().unwrap();
        g.requests += 1;
        if failing.load(Ordering::Relaxed) && i % 4 == 0 {
            return StatusCode::INTERNAL_SERVER_ERROR;
        }
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        for e in v.as_array().into_iter().flatten() {
            if let Some(id) = e["id"].as_str() {
                *g.delivered.entry(id.to_string()).or_default() += 1;
                g.first_at
                    .entry(id.to_string())
                    .or_insert_with(Instant::now);
            }
        }
        StatusCode::OK
    }
    let seen = Arc::new(Mutex::new(Seen::default()));
    let failing = Arc::new(AtomicBool::new(false));
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(handle))
        .with_state((seen.clone(), failing.clone(), Arc::new(AtomicU64::new(0))));
    let (addr, task) = crate::util::serve_http(app).await;
    Hook {
        addr,
        seen,
        failing,
        _task: task,
    }
}

async fn spawn_gridlet(dir: &Path, cycle: usize) -> (Gridlet, Duration) {
    let inflight = MAX_IN_FLIGHT.to_string();
    let extra = [
        ("broker__maxInFlightPerSubscription", inflight.as_str()),
        ("broker__retrySchedule", "eventGridCloud"),
    ];
    spawn_with(dir, cycle, &extra).await
}

/// Start the real binary on `dir` (HTTPS on too, plain-HTTP webhooks allowed) with `extra`
/// settings; wait until it is ready. Answers it and how long the start took.
pub(crate) async fn spawn_with(
    dir: &Path,
    cycle: usize,
    extra: &[(&str, &str)],
) -> (Gridlet, Duration) {
    let base = [
        ("inbound__serverAuth__tlsPolicy", "enabled"),
        ("outbound__webhook__httpsOnly", "false"),
    ];
    let env: Vec<(&str, &str)> = base.iter().chain(extra).copied().collect();
    let started = Instant::now();
    let g = Gridlet::start(dir, cycle, &env).await;
    (g, started.elapsed())
}

/// Publish until the process dies; returns the ids of every request answered 200.
async fn publisher(client: reqwest::Client, url: String, tag: String) -> Vec<String> {
    let mut acked = Vec::new();
    for n in 0.. {
        let ids: Vec<String> = (0..EVENTS_PER_REQUEST)
            .map(|k| format!("{tag}-{n}-{k}"))
            .collect();
        let body: Vec<Value> = ids
            .iter()
            .map(|id| {
                json!({"id": id, "subject": "s", "eventType": "t",
                       "eventTime": "2017-08-10T21:03:07+00:00", "dataVersion": "1.0",
                       "data": {"pad": "x".repeat(200)}})
            })
            .collect();
        match client.post(&url).json(&body).send().await {
            Ok(r) if r.status().as_u16() == 200 => acked.extend(ids),
            Ok(r) => panic!("publish answered {}", r.status()),
            Err(_) => break, // killed
        }
    }
    acked
}

struct Outcome {
    acked: HashSet<String>,
    lost: Vec<String>,
    duplicates: u64,
    /// For each duplicate: time between its first delivery and the nearest kill (None: no kill
    /// at all).
    dup_gaps: Vec<Option<Duration>>,
}

async fn run(persisted: bool, failing_first_cycle: bool, cycles: usize) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("crash test seed {seed} persisted={persisted}");
    let mut rng = Rng(seed);
    let h = hook().await;
    gridlet::tls::install_default_provider();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let mut acked = HashSet::new();
    let mut restart_times = Vec::new();
    let mut kill_times: Vec<Instant> = Vec::new();
    for cycle in 0..cycles {
        h.failing
            .store(failing_first_cycle && cycle == 0, Ordering::Relaxed);
        let (p, took) = spawn_gridlet(dir.path(), cycle).await;
        restart_times.push(took);
        if cycle == 0 {
            let put = |path: &str, body: Value| {
                client
                    .put(format!("{}{path}?{V}", p.base))
                    .json(&body)
                    .send()
            };
            assert_eq!(put("/topics/t", json!({})).await.unwrap().status(), 200);
            let sub = json!({"properties": {
                "destination": {"endpointType": "WebHook",
                                "properties": {"endpointUrl": format!("http://{}/hook", h.addr)}},
                "persistencePolicy": {"isPersisted": persisted}}});
            assert_eq!(
                put("/topics/t/eventSubscriptions/s", sub)
                    .await
                    .unwrap()
                    .status(),
                200
            );
        }
        let url = format!("{}/topics/t/events?{V}", p.base);
        let tasks: Vec<_> = (0..PUBLISHERS)
            .map(|w| {
                tokio::spawn(publisher(
                    client.clone(),
                    url.clone(),
                    format!("c{cycle}w{w}"),
                ))
            })
            .collect();
        // Under test: a kill at a random moment of the traffic.
        tokio::time::sleep(Duration::from_millis(rng.between(150, 1200))).await;
        p.kill();
        kill_times.push(Instant::now());
        for t in tasks {
            acked.extend(t.await.unwrap());
        }
    }
    // Final run: no kill; wait until every acknowledged event arrived (or the time is up).
    h.failing.store(false, Ordering::Relaxed);
    let (p, took) = spawn_gridlet(dir.path(), cycles).await;
    restart_times.push(took);
    let limit = Duration::from_secs(if persisted { 90 } else { 5 });
    let _ = poll_within(limit, || async {
        let g = h.seen.lock().unwrap();
        if acked.iter().all(|id| g.delivered.contains_key(id)) {
            Ok(())
        } else {
            Err(())
        }
    })
    .await;
    drop(p);
    let g = h.seen.lock().unwrap();
    let mut lost: Vec<String> = acked
        .iter()
        .filter(|id| !g.delivered.contains_key(*id))
        .cloned()
        .collect();
    lost.sort();
    let duplicates: u64 = g
        .delivered
        .values()
        .map(|n| u64::from(n.saturating_sub(1)))
        .sum();
    let dup_gaps: Vec<Option<Duration>> = g
        .delivered
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, _)| {
            let first = g.first_at[id];
            // The receiver may handle a request the dying process had just sent a moment after
            // the kill, so the nearest kill counts, before or after.
            kill_times
                .iter()
                .map(|k| {
                    if *k >= first {
                        k.duration_since(first)
                    } else {
                        first.duration_since(*k)
                    }
                })
                .min()
        })
        .collect();
    let max_gap = dup_gaps.iter().flatten().max().copied();
    let max_restart = restart_times.iter().max().copied().unwrap_or_default();
    eprintln!(
        "persisted={persisted}: {} acknowledged, {} delivered distinct, {} lost, {} duplicates (first delivered at most {:?} from a kill), {} requests, {} kills, slowest start {:?}",
        acked.len(),
        g.delivered.len(),
        lost.len(),
        duplicates,
        max_gap,
        g.requests,
        cycles,
        max_restart
    );
    Outcome {
        acked,
        lost,
        duplicates,
        dup_gaps,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_events_survive_sigkill() {
    let o = run(true, true, CYCLES).await;
    assert!(o.acked.len() > 100, "the test published too little");
    assert!(
        o.lost.is_empty(),
        "{} acknowledged events were never delivered, e.g. {:?}",
        o.lost.len(),
        &o.lost[..o.lost.len().min(10)]
    );
    // A duplicate is an event delivered but not yet settled and flushed as removed when the
    // process died: in flight at a kill. Its first delivery must therefore lie close to a kill
    // (a delivery round trip plus one flush; the receiver may also handle the last request a
    // moment after the kill; 1 s is generous on a loaded machine). A duplicate delivered far from
    // every kill would mean a removal that never became durable.
    let window = Duration::from_secs(1);
    let unexplained: Vec<_> = o
        .dup_gaps
        .iter()
        .filter(|g| g.is_none_or(|g| g > window))
        .collect();
    assert!(
        unexplained.is_empty(),
        "{} of {} duplicates were not in flight at a kill: {:?}",
        unexplained.len(),
        o.duplicates,
        &unexplained[..unexplained.len().min(10)]
    );
}
