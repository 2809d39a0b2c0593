//! Endpoint health is per URL, and only what says something about the endpoint counts toward it:
//! one subscription whose events a receiver refuses (400) must not disable the URL for another
//! subscription delivering there.

use crate::util::*;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[tokio::test]
async fn one_subscriptions_refused_events_do_not_disable_the_url_for_another() {
    // One URL; the receiver refuses subscription A's events (400) and accepts B's.
    let accepted = Arc::new(AtomicU64::new(0));
    let count = accepted.clone();
    let app = Router::new().route(
        "/hook",
        post(move |h: HeaderMap| {
            let count = count.clone();
            async move {
                match h.get("aeg-subscription-name").and_then(|v| v.to_str().ok()) {
                    Some("A") => StatusCode::BAD_REQUEST,
                    _ => {
                        count.fetch_add(1, Ordering::Relaxed);
                        StatusCode::OK
                    }
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let t = start(&[
        ("broker__endpointHealth__disableConsecutiveFailures", "5"),
        ("broker__endpointHealth__disableMinAttempts", "5"),
        ("broker__defaultMaxDeliveryAttempts", "1"),
    ])
    .await;
    t.topic("t").await;
    for (name, event_type) in [("A", "a"), ("B", "b")] {
        t.webhook_sub(
            "t",
            name,
            &url,
            json!({"filter": {"includedEventTypes": [event_type]}}),
        )
        .await;
    }
    // A: ten refusals in a row (each event dead-lettered after its one attempt).
    let a_events: Vec<_> = (0..10)
        .map(|i| eg_event(&format!("a{i}"), "s", "a", json!({})))
        .collect();
    t.publish("t", json!(a_events)).await;
    eventually("A's ten dead letters", || async {
        let (_, b) = t.get("/topics/t/eventSubscriptions/A/deadLetters").await;
        match b["value"].as_array().map_or(0, Vec::len) {
            10 => Ok(()),
            _ => Err(b.to_string()),
        }
    })
    .await;
    // B keeps delivering to the same URL, which was never disabled.
    let b_events: Vec<_> = (0..5)
        .map(|i| eg_event(&format!("b{i}"), "s", "b", json!({})))
        .collect();
    t.publish("t", json!(b_events)).await;
    eventually("B's five deliveries", || async {
        let n = accepted.load(Ordering::Relaxed);
        if n >= 5 {
            return Ok(());
        }
        let (_, h) = t.get("/topics/t/eventSubscriptions/B/endpointHealth").await;
        Err(format!("B delivered {n} of 5; health {h}"))
    })
    .await;
    for name in ["A", "B"] {
        let (s, h) = t
            .get(&format!(
                "/topics/t/eventSubscriptions/{name}/endpointHealth"
            ))
            .await;
        assert_eq!(s, 200, "{h}");
        assert_eq!(h["state"], "Enabled", "{name}: {h}");
    }
}
