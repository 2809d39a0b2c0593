//! Compaction in the real binary: a subscription whose endpoint hangs keeps one event in 25 of
//! a persisted backlog that another subscription delivered whole; the segments those events pin
//! are compacted (disk falls), and a SIGKILL while that goes on loses none of them and brings
//! back none of the delivered ones.

use crate::crash::spawn_with;
use crate::util::eventually_within;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const V: &str = "api-version=2019-01-01-preview";
const EVENTS: usize = 4000;
const EVERY: usize = 25;

#[derive(Default)]
struct Seen {
    /// Path ("live", "slow") → event id → deliveries.
    by_path: HashMap<String, HashMap<String, u32>>,
}

struct Hook {
    addr: std::net::SocketAddr,
    seen: Arc<Mutex<Seen>>,
    /// While set, `/slow` holds every request unanswered (an endpoint that hangs).
    hang: Arc<AtomicBool>,
    _task: tokio::task::JoinHandle<()>,
}

async fn hook() -> Hook {
    use axum::extract::{Path, State};
    use axum::http::StatusCode;
    type S = (Arc<Mutex<Seen>>, Arc<AtomicBool>);
    async fn handle(
        State((seen, hang)): State<S>,
        Path(path): Path<String>,
        body: axum::body::Bytes,
    ) -> StatusCode {
        while path == "slow" && hang.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let mut g = seen.lock().unwrap();
        let ids = g.by_path.entry(path).or_default();
        for e in v.as_array().into_iter().flatten() {
            if let Some(id) = e["id"].as_str() {
                *ids.entry(id.to_string()).or_default() += 1;
            }
        }
        StatusCode::OK
    }
    let seen = Arc::new(Mutex::new(Seen::default()));
    let hang = Arc::new(AtomicBool::new(true));
    let app = axum::Router::new()
        .route("/{path}", axum::routing::post(handle))
        .with_state((seen.clone(), hang.clone()));
    let (addr, task) = crate::util::serve_http(app).await;
    Hook {
        addr,
        seen,
        hang,
        _task: task,
    }
}

async fn metric(client: &reqwest::Client, base: &str, name: &str) -> Option<u64> {
    let text = client
        .get(format!("{base}/metrics?{V}"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Publish `events` (a JSON array); each must be accepted.
async fn publish(client: &reqwest::Client, base: &str, events: &Value) {
    let r = client
        .post(format!("{base}/topics/t/events?{V}"))
        .json(events)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

/// An event only `live` takes, published to mark a point in its delivery order.
fn barrier(id: &str) -> Value {
    json!([{"id": id, "subject": "/other", "eventType": "t",
        "eventTime": "2026-01-01T00:00:00Z", "dataVersion": "1.0", "data": {}}])
}

fn delivered(h: &Hook, path: &str) -> HashMap<String, u32> {
    h.seen
        .lock()
        .unwrap()
        .by_path
        .get(path)
        .cloned()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_segments_are_compacted_and_a_sigkill_meanwhile_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    gridlet::tls::install_default_provider();
    let client = reqwest::Client::new();
    let h = hook().await;
    // An 8 MiB bound makes 1 MiB segments: the 4 MB backlog spans several.
    let extra = [
        ("persistence__maxDiskBytes", "8388608"),
        ("persistence__compactAfterIdleSeconds", "0"),
        ("broker__maxInFlightPerSubscription", "1"),
        ("metrics__reporterType", "prometheus"),
    ];
    let (p, _) = spawn_with(dir.path(), 0, &extra).await;
    let put = |path: String, body: Value| {
        let client = client.clone();
        async move {
            let r = client.put(path).json(&body).send().await.unwrap();
            assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
        }
    };
    put(format!("{}/topics/t?{V}", p.base), json!({})).await;
    for (name, filter) in [
        ("live", json!({})),
        ("slow", json!({"subjectBeginsWith": "/pinned"})),
    ] {
        let body = json!({"properties": {
            "destination": {"endpointType": "WebHook",
                "properties": {"endpointUrl": format!("http://{}/{name}", h.addr)}},
            "filter": filter,
            "persistencePolicy": {"isPersisted": true}}});
        put(
            format!("{}/topics/t/eventSubscriptions/{name}?{V}", p.base),
            body,
        )
        .await;
    }
    let mut pinned = Vec::new();
    for batch in 0..EVENTS / 50 {
        let events: Vec<Value> = (0..50)
            .map(|k| {
                let n = batch * 50 + k;
                let subject = if n % EVERY == 0 { "/pinned" } else { "/other" };
                if n % EVERY == 0 {
                    pinned.push(format!("e{n}"));
                }
                json!({"id": format!("e{n}"), "subject": subject, "eventType": "t",
                       "eventTime": "2026-01-01T00:00:00Z", "dataVersion": "1.0",
                       "data": {"pad": "x".repeat(900)}})
            })
            .collect();
        publish(&client, &p.base, &Value::Array(events)).await;
    }
    eventually_within(
        Duration::from_secs(60),
        "live to get every event",
        || async {
            let n = delivered(&h, "live").len();
            if n == EVENTS {
                Ok(())
            } else {
                Err(format!("{n} of {EVENTS}"))
            }
        },
    )
    .await;
    // Every settlement of `live` durable before the kill: once nothing is pending there (its
    // settlements staged), a publish's 200 means the frame that carried them was synced.
    eventually_within(
        Duration::from_secs(60),
        "live to settle everything",
        || async {
            match metric(
                &client,
                &p.base,
                "gridlet_pending_events{topic=\"t\",subscription=\"live\"}",
            )
            .await
            {
                Some(0) => Ok(()),
                other => Err(format!("{other:?} pending")),
            }
        },
    )
    .await;
    publish(&client, &p.base, &barrier("barrier")).await;
    // Compactions start as soon as `live` has passed a segment (`compactAfterIdleSeconds` 0);
    // kill once one is done, with others possibly under way.
    eventually_within(Duration::from_secs(60), "a compaction", || async {
        match metric(&client, &p.base, "gridlet_store_compactions_total").await {
            Some(n) if n >= 1 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    drop(p); // SIGKILL
    let (p, _) = spawn_with(dir.path(), 1, &extra).await;
    // The 4 MB backlog is held as the pinned events' copies plus the head (a 1 MiB segment).
    let published = (EVENTS * 1000) as u64;
    eventually_within(
        Duration::from_secs(60),
        "the disk to hold little",
        || async {
            let now = metric(&client, &p.base, "gridlet_store_disk_bytes")
                .await
                .unwrap_or(u64::MAX);
            if now * 5 / 2 < published {
                Ok(())
            } else {
                Err(format!("{now} bytes for {published} published"))
            }
        },
    )
    .await;
    let count_live = || {
        delivered(&h, "live")
            .iter()
            .filter(|(id, _)| !id.starts_with("barrier"))
            .map(|(_, n)| *n)
            .sum::<u32>()
    };
    let live_before = count_live();
    assert_eq!(
        live_before as usize, EVENTS,
        "each delivered once before the kill"
    );
    h.hang.store(false, Ordering::Relaxed);
    eventually_within(
        Duration::from_secs(60),
        "slow to get every pinned event",
        || async {
            let got = delivered(&h, "slow");
            let missing = pinned.iter().filter(|id| !got.contains_key(*id)).count();
            if missing == 0 {
                Ok(())
            } else {
                Err(format!("{missing} of {} missing", pinned.len()))
            }
        },
    )
    .await;
    let slow = delivered(&h, "slow");
    let stray: Vec<&String> = slow.keys().filter(|id| !pinned.contains(id)).collect();
    assert!(stray.is_empty(), "events slow never took: {stray:?}");
    // A settlement made durable before the kill is never undone: live gets nothing again. It
    // takes events in sequence order, one at a time, so by the time a new event reaches it,
    // any that had come back would have arrived first.
    publish(&client, &p.base, &barrier("barrier-after")).await;
    eventually_within(Duration::from_secs(60), "the second barrier", || async {
        if delivered(&h, "live").contains_key("barrier-after") {
            Ok(())
        } else {
            Err("not yet".into())
        }
    })
    .await;
    assert_eq!(
        count_live(),
        live_before,
        "delivered events came back after the restart"
    );
    drop(p);
}
