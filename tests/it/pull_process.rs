//! Pull delivery against the real binary: an event received and not acknowledged when gridlet
//! is SIGKILLed comes back after the restart with its `deliveryCount` kept and incremented; an
//! event whose acknowledgement was answered 200 never comes back.
//!
//! A lock lasts at least 60 s (Event Grid's minimum), and a real process cannot run on tokio's
//! paused clock. So the test uses the clock seam the binary already has: before the restart it
//! writes the clock's heartbeat file (`src/clock.rs`) two minutes ahead, and the restarted
//! gridlet's clock resumes from there, past the locks' expiry, without anyone waiting for it.

use crate::child::Gridlet;
use crate::pull::{publish_batch, receive, settle, Ns};
use crate::util::eventually_within;
use serde_json::json;
use std::path::Path;
use std::time::Duration;

/// A running gridlet and the pull client on it.
struct Proc {
    g: Gridlet,
    ns: Ns,
}

async fn spawn(dir: &Path, run: usize) -> Proc {
    spawn_with(dir, run, &[]).await
}

async fn spawn_with(dir: &Path, run: usize, extra: &[(&str, &str)]) -> Proc {
    let g = Gridlet::start(dir, run, extra).await;
    let ns = Ns {
        base: g.base.clone(),
        client: reqwest::Client::new(),
    };
    Proc { g, ns }
}

/// A CloudEvents topic `q` with a queue subscription `s`.
async fn create(ns: &Ns) {
    for (path, body) in [
        (
            "/topics/q",
            json!({"properties":{"inputSchema":"CloudEventSchemaV1_0"}}),
        ),
        (
            "/topics/q/eventSubscriptions/s",
            json!({"properties":{"deliveryConfiguration":{"deliveryMode":"Queue"}}}),
        ),
    ] {
        let r = ns
            .client
            .put(format!("{}{path}?api-version=2019-01-01-preview", ns.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_between_receive_and_acknowledge_redelivers_and_never_an_acknowledged_event() {
    let dir = tempfile::tempdir().unwrap();
    let p = spawn(dir.path(), 0).await;
    create(&p.ns).await;
    publish_batch(&p.ns, "q", ["a", "b", "c"].map(String::from)).await;
    let got = receive(&p.ns, "q", "s", 3, 0).await;
    assert_eq!(
        got.iter().map(|e| (e.2.as_str(), e.1)).collect::<Vec<_>>(),
        [("a", 1), ("b", 1), ("c", 1)]
    );
    let r = settle(&p.ns, "q", "s", "acknowledge", &[&got[0].0]).await;
    assert_eq!(r["succeededLockTokens"].as_array().unwrap().len(), 1);
    // SIGKILL: no shutdown, no final heartbeat.
    p.g.kill();
    // The restarted gridlet's clock resumes two minutes on: the 60 s locks have expired.
    let ahead = gridlet::clock::system_wall_ms() + 120_000;
    gridlet::clock::write_heartbeat(&dir.path().join("metadataDb"), ahead).unwrap();
    let p = spawn(dir.path(), 1).await;
    let mut again = receive(&p.ns, "q", "s", 10, 5).await;
    again.sort_by(|x, y| x.2.cmp(&y.2));
    assert_eq!(
        again
            .iter()
            .map(|e| (e.2.as_str(), e.1))
            .collect::<Vec<_>>(),
        [("b", 2), ("c", 2)],
        "redelivered with their counts; the acknowledged one never"
    );
    // Tokens from before the restart are lost; the new ones settle.
    let r = settle(&p.ns, "q", "s", "acknowledge", &[&got[1].0]).await;
    assert_eq!(r["failedLockTokens"][0]["error"]["code"], "TokenLost");
    let tokens: Vec<&str> = again.iter().map(|e| e.0.as_str()).collect();
    let r = settle(&p.ns, "q", "s", "acknowledge", &tokens).await;
    assert_eq!(r["succeededLockTokens"].as_array().unwrap().len(), 2);
    assert!(receive(&p.ns, "q", "s", 10, 0).await.is_empty());
}

/// A receive is staged, not waited for (docs/PULL.md, "Guarantees"): SIGKILLed right after
/// one, gridlet gives its event back after the restart with `deliveryCount` 1 (the receive had
/// not reached the disk, so this receive counts as the first again) or 2 (it had: counted, its
/// lock held until it expired), never more; the event acknowledged before never comes back.
/// Which of the two depends on whether the committer's next frame (within 100 ms) came before
/// the kill; both are what the guarantee allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_right_after_a_receive_brings_its_event_back_counted_at_most_once() {
    let dir = tempfile::tempdir().unwrap();
    let p = spawn(dir.path(), 0).await;
    create(&p.ns).await;
    publish_batch(&p.ns, "q", ["a", "b"].map(String::from)).await;
    let a = receive(&p.ns, "q", "s", 1, 0).await;
    let r = settle(&p.ns, "q", "s", "acknowledge", &[&a[0].0]).await;
    assert_eq!(r["succeededLockTokens"].as_array().unwrap().len(), 1);
    let b = receive(&p.ns, "q", "s", 1, 0).await;
    assert_eq!((b[0].2.as_str(), b[0].1), ("b", 1));
    p.g.kill();
    let ahead = gridlet::clock::system_wall_ms() + 120_000;
    gridlet::clock::write_heartbeat(&dir.path().join("metadataDb"), ahead).unwrap();
    let p = spawn(dir.path(), 1).await;
    let again = receive(&p.ns, "q", "s", 10, 5).await;
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(again[0].2, "b", "the acknowledged event never comes back");
    assert!(
        again[0].1 == 1 || again[0].1 == 2,
        "deliveryCount counts the receives that reached the disk, plus this one: {again:?}"
    );
    let r = settle(&p.ns, "q", "s", "acknowledge", &[&again[0].0]).await;
    assert_eq!(r["succeededLockTokens"].as_array().unwrap().len(), 1);
    assert!(receive(&p.ns, "q", "s", 10, 0).await.is_empty());
}

/// Issue 37, finding 3: many long polls (`:receive?maxWaitTime=60`) from one receive key, on
/// connections of their own, against the real binary. Before, 1,024 of them held every slot (a
/// request in progress was never evicted) and `/healthz` and an administrator's publish on new
/// connections were reset. Now: with the default settings, 16 wait (`maxLongPollsPerSubscription`)
/// and the rest get 429; with 16 connections and 8 per peer (caps raised out of the way), each
/// new connection ends a waiting receive, which answers `{"value":[]}` and closes. Either way
/// `/healthz` and the publish on new connections are answered within 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_polls_from_one_key_leave_health_and_publishing_answered() {
    let keys = [
        ("inbound__clientAuth__sasKeys__enabled", "true"),
        ("inbound__clientAuth__sasKeys__key1", "admin-key-0123456789"),
        (
            "inbound__clientAuth__sasKeys__receiveKeys",
            "q/s=receive-key-0123456789",
        ),
    ];
    let small = [
        ("inbound__maxConnections", "16"),
        ("inbound__maxConnectionsPerPeer", "8"),
        ("inbound__maxLongPollsPerSubscription", "1000"),
        ("inbound__maxLongPollsPerCredential", "1000"),
    ];
    for (run, polls, extra) in [(0, 1024, &[][..]), (1, 64, &small[..])] {
        let dir = tempfile::tempdir().unwrap();
        let env: Vec<(&str, &str)> = keys.iter().chain(extra).copied().collect();
        let p = spawn_with(dir.path(), run, &env).await;
        let admin = |r: reqwest::RequestBuilder| r.header("aeg-sas-key", "admin-key-0123456789");
        for (path, body) in [
            (
                "/topics/q",
                json!({"properties":{"inputSchema":"CloudEventSchemaV1_0"}}),
            ),
            (
                "/topics/q/eventSubscriptions/s",
                json!({"properties":{"deliveryConfiguration":{"deliveryMode":"Queue"}}}),
            ),
            ("/topics/t", json!({})),
        ] {
            let url = format!("{}{path}?api-version=2019-01-01-preview", p.ns.base);
            let r = admin(p.ns.client.put(url))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
        let answers = long_polls(&p.ns.base, polls);
        // All but the receives still allowed to wait have been answered (429, an empty
        // answer, or closed to make room): gridlet has seen them all.
        let waiting_at_most = if run == 0 { 16 } else { 15 };
        let seen = eventually_within(
            Duration::from_secs(30),
            "the long polls to be answered",
            || async {
                let a = answers.lock().unwrap().clone();
                if a.len() + waiting_at_most >= polls {
                    Ok(a)
                } else {
                    Err(format!("{} of {polls} answered", a.len()))
                }
            },
        )
        .await;
        let fresh = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        let within = Duration::from_secs(2);
        let r = tokio::time::timeout(within, fresh.get(format!("{}/healthz", p.ns.base)).send())
            .await
            .expect("/healthz answers within 2 s")
            .expect("/healthz is not reset");
        assert_eq!(r.status(), 200);
        let events = json!([{"id":"e1","subject":"s","eventType":"t","eventTime":"2024-01-01T00:00:00Z","dataVersion":"1","data":{}}]);
        let url = format!(
            "{}/topics/t/events?api-version=2019-01-01-preview",
            p.ns.base
        );
        let r = tokio::time::timeout(within, admin(fresh.post(url)).json(&events).send())
            .await
            .expect("an administrator's publish answers within 2 s")
            .expect("the publish is not reset");
        assert_eq!(r.status(), 200);
        let count = |seen: &[String], what: &str| seen.iter().filter(|a| *a == what).count();
        if run == 0 {
            // Past the cap: 429 (or closed before sending, as the peer's idle connections
            // make room for its new ones).
            assert!(count(&seen, "429") >= 64, "{seen:?}");
        } else {
            // The new connections (health, publish) found the peer's slots all waiting in
            // receives: those they pushed out answered no events.
            eventually_within(Duration::from_secs(10), "an ended receive", || async {
                let seen = answers.lock().unwrap().clone();
                match count(&seen, "200 empty, close") {
                    0 => Err(format!("{seen:?}")),
                    _ => Ok(()),
                }
            })
            .await;
        }
        let seen = answers.lock().unwrap().clone();
        assert_eq!(
            count(&seen, "200 empty, close") + count(&seen, "429") + count(&seen, "closed"),
            seen.len(),
            "nothing else: {seen:?}"
        );
    }
}

/// Open `n` connections, each sending one long poll with the receive key; each answer is
/// recorded as `429`, `200 empty, close` or `closed` (no answer), or as what else it was.
fn long_polls(base: &str, n: usize) -> std::sync::Arc<std::sync::Mutex<Vec<String>>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let answers = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let addr = base.trim_start_matches("http://").to_string();
    for _ in 0..n {
        let (answers, addr) = (answers.clone(), addr.clone());
        tokio::spawn(async move {
            let request = "POST /topics/q/eventsubscriptions/s:receive?maxWaitTime=60&api-version=2024-06-01 HTTP/1.1\r\nHost: x\r\naeg-sas-key: receive-key-0123456789\r\nContent-Length: 0\r\n\r\n";
            let mut got = Vec::new();
            if let Ok(mut s) = tokio::net::TcpStream::connect(&addr).await {
                if s.write_all(request.as_bytes()).await.is_ok() {
                    let mut buf = [0u8; 4096];
                    // One response: read until its (short) body is in, or the socket closes.
                    while let Ok(k) = s.read(&mut buf).await {
                        if k == 0 {
                            break;
                        }
                        got.extend_from_slice(&buf[..k]);
                        let text = String::from_utf8_lossy(&got);
                        if text.contains("\r\n\r\n")
                            && (text.ends_with('}') || text.ends_with("]}"))
                        {
                            break;
                        }
                    }
                    // The socket stays open (a client that keeps its connection).
                    std::mem::forget(s);
                }
            }
            let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
            let what = if text.is_empty() {
                "closed".to_string()
            } else if text.starts_with("http/1.1 429") {
                "429".to_string()
            } else if text.starts_with("http/1.1 200")
                && text.contains("connection: close")
                && text.ends_with("{\"value\":[]}")
            {
                "200 empty, close".to_string()
            } else {
                text
            };
            answers.lock().unwrap().push(what);
        });
    }
    answers
}
