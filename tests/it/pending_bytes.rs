//! Bytes waiting per subscription (issue 34, `gridlet_pending_bytes`): exact while the endpoint
//! is down, after a SIGKILL and a clean stop of the real binary (a persisted subscription), and
//! back to 0 once delivered. "Exact" is checked against what the receiver gets: each event's
//! body is its request's body less the array's brackets (one event per request).

use crate::node::*;
use crate::process::{start_serving, terminate};
use crate::util::*;
use crate::wait::eventually;
use serde_json::{json, Value};
use std::collections::HashMap;

/// `n` events whose bodies differ in size, from `first`.
fn events(first: usize, n: usize) -> Value {
    (first..first + n)
        .map(|i| {
            eg_event(
                &format!("e{i}"),
                "s",
                "t",
                json!({"pad": "x".repeat(i * 7)}),
            )
        })
        .collect()
}

/// Take deliveries until `n` distinct events arrived: each event's body bytes, by id (a
/// redelivery or a refused probe carries the same bytes).
async fn bodies_by_id(rx: &mut Receiver, n: usize) -> HashMap<String, u64> {
    let mut seen = HashMap::new();
    while seen.len() < n {
        let r = rx.next().await;
        let batch = r.json();
        assert_eq!(
            batch.as_array().map(Vec::len),
            Some(1),
            "one event per request"
        );
        let id = batch[0]["id"].as_str().unwrap_or_default().to_string();
        // `[` body `]`
        seen.insert(id, r.body.len() as u64 - 2);
    }
    seen
}

fn webhook(url: &str, persisted: bool) -> Value {
    json!({"properties": {
        "destination": {"endpointType": "WebHook",
            "properties": {"endpointUrl": url, "maxEventsPerBatch": 1}},
        "persistencePolicy": {"isPersisted": persisted}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persisted_backlog_counts_its_exact_bytes_across_sigkill_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut hook = Receiver::start().await;
    // The uplink is down: the events wait in the log.
    hook.respond_with(503);
    let env = [
        ("outbound__webhook__httpsOnly", "false"),
        ("metrics__reporterType", "prometheus"),
        ("outbound__outageProbeSeconds", "1"),
    ];
    let (child, base) = start_serving(dir.path(), &env).await;
    let c = reqwest::Client::new();
    let put =
        |base: &str, path: &str, body: Value| c.put(format!("{base}{path}?{V}")).json(&body).send();
    assert_eq!(
        put(&base, "/topics/t1", json!({})).await.unwrap().status(),
        200
    );
    let sub = webhook(&hook.url("/p"), true);
    let r = put(&base, "/topics/t1/eventSubscriptions/s1", sub)
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    const N: usize = 40;
    for k in 0..4 {
        let r = c
            .post(format!("{base}/topics/t1/events?{V}"))
            .json(&events(k * 10, 10))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let read = |base: String| {
        let c = c.clone();
        async move {
            let text = c
                .get(format!("{base}/metrics?{V}"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            (
                metric(&text, "gridlet_pending_events", SUB),
                metric(&text, "gridlet_pending_bytes", SUB),
            )
        }
    };
    let (events_waiting, bytes) = read(base.clone()).await;
    assert_eq!(events_waiting, Some(N as u64));
    let bytes = bytes.expect("gridlet_pending_bytes is exposed");
    assert!(bytes > (N * 100) as u64, "{bytes}");

    // SIGKILL: the store counts the same bytes from its checkpoint and log.
    let mut child = child;
    child.kill().unwrap();
    child.wait().unwrap();
    let (child, base) = start_serving(dir.path(), &env).await;
    assert_eq!(read(base.clone()).await, (Some(N as u64), Some(bytes)));
    // A clean stop.
    assert!(terminate(child).await.success());
    let (child, base) = start_serving(dir.path(), &env).await;
    assert_eq!(read(base.clone()).await, (Some(N as u64), Some(bytes)));

    // The link is back: what arrives is what was counted, and nothing is left.
    hook.respond_with(200);
    let seen = bodies_by_id(&mut hook, N).await;
    assert_eq!(seen.values().sum::<u64>(), bytes, "the bytes delivered");
    eventually("everything settled", || async {
        match read(base.clone()).await {
            (Some(0), Some(0)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(terminate(child).await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_memory_subscription_counts_the_bytes_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    let mut hook = Receiver::start().await;
    hook.respond_with(503);
    let n = node(dir.path(), &[("outbound__outageProbeSeconds", "1")], None).await;
    assert_eq!(n.put("/topics/t1", json!({})).await.0, 200);
    let (s, b) = n
        .put(
            "/topics/t1/eventSubscriptions/s1",
            webhook(&hook.url("/m"), false),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    const N: usize = 25;
    let r = n
        .client
        .post(n.url("/topics/t1/events"))
        .json(&events(3, N))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(n.metric("gridlet_pending_events", SUB).await, N as u64);
    let bytes = n.metric("gridlet_pending_bytes", SUB).await;
    hook.respond_with(200);
    let seen = bodies_by_id(&mut hook, N).await;
    assert_eq!(seen.values().sum::<u64>(), bytes, "the bytes delivered");
    eventually("everything settled", || async {
        match n.metric("gridlet_pending_bytes", SUB).await {
            0 => Ok(()),
            v => Err(format!("{v}")),
        }
    })
    .await;
    assert_eq!(n.metric("gridlet_pending_events", SUB).await, 0);
    n.stop().await;
}
