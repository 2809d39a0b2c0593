//! Uplink outages of days (issue 34, part B) on tokio's paused clock: an unreachable endpoint
//! (no connection, 503) is never disabled or frozen, gets one probe per
//! `outbound__outageProbeSeconds` across the subscriptions delivering there, its events are not
//! charged attempts and wait within their TTL, and the first success makes them all due at
//! once, drained oldest first, while a subscription to another endpoint keeps delivering.

use crate::harness::{InProcess, ENDPOINT};
use gridlet::delivery::sink::{FailureKind, Outcome};
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const HOUR: Duration = Duration::from_secs(3600);

/// A day of outage (the tracker's own test runs five, `delivery/health/tests.rs`): about 10 s of real time,
/// spent in the held-back tasks' once-a-second expiry sweeps.
#[tokio::test(start_paused = true)]
async fn a_day_down_then_one_probe_gets_through_and_everything_drains_at_once() {
    let mut g = InProcess::open(&[
        // Two days of time to live; the default 30 attempts stay in force.
        ("broker__defaultEventTimeToLiveInSeconds", "172800"),
    ]);
    g.subs(&[("a", json!({})), ("b", json!({}))]);
    // A third subscription delivers to another URL the whole time.
    g.broker
        .put_subscription(
            "t",
            "other",
            json!({"properties": {"destination": {"endpointType": "WebHook",
                "properties": {"endpointUrl": "http://127.0.0.1:9/elsewhere"}},
                "filter": {"subjectBeginsWith": "live"}}}),
        )
        .unwrap();
    let down = Arc::new(AtomicBool::new(true));
    for (sub, kind) in [("a", FailureKind::Connect), ("b", FailureKind::Status(503))] {
        let down = down.clone();
        g.script(sub, move |_| {
            if down.load(Ordering::SeqCst) {
                Outcome::failed(kind.clone())
            } else {
                Outcome::Delivered
            }
        });
    }
    g.script("other", |_| Outcome::Delivered);
    g.publish(0, 5, "backlog").await;

    // A day: the first attempts (the events' batches, in flight together before the outage
    // is known), then one probe per 30 s for the URL, whichever subscription sends it.
    let during = g.within(24 * HOUR).await;
    let (burst, probes): (Vec<_>, Vec<_>) = during
        .iter()
        .filter(|a| a.sub != "other")
        .partition(|a| a.at.is_zero());
    assert!(burst.len() <= 10, "{}", burst.len());
    assert!(
        (24 * 120 - 1..=24 * 120).contains(&probes.len()),
        "one probe per 30 s for the URL: {}",
        probes.len()
    );
    for w in probes.windows(2) {
        let gap = w[1].at - w[0].at;
        assert!(gap >= Duration::from_secs(30), "probes {gap:?} apart");
    }
    assert!(
        probes.iter().all(|a| a.attempt == 1),
        "an outage charges no attempt"
    );
    let dropped = |s: &str| {
        g.metric("gridlet_dead_lettered_events_total", s)
            .unwrap_or(0)
    };
    assert_eq!((dropped("a"), dropped("b")), (0, 0), "nothing dropped");
    assert_eq!(g.metric("gridlet_endpoint_health_state", "a"), Some(0));
    assert_eq!(g.metric("gridlet_endpoint_outage", "a"), Some(1));
    assert_eq!(g.metric("gridlet_pending_events", "a"), Some(5));
    let silent = g
        .metric("gridlet_endpoint_seconds_since_success", "a")
        .unwrap();
    assert!(silent >= 24 * 3600, "{silent}");

    // Meanwhile another endpoint's subscription is served at once.
    let t = g.next().await.at; // the probe due at the day's edge, if it was not taken yet
    g.publish(100, 1, "live").await;
    let a = g.next().await;
    assert_eq!((a.sub.as_str(), a.ids[0].as_str()), ("other", "e100"));
    assert!(a.at - t < Duration::from_secs(30), "served at once");

    // The link returns: the next probe succeeds, and every waiting event goes within the same
    // instant, not at the next 10-minute slot.
    down.store(false, Ordering::SeqCst);
    let first = g.next().await;
    assert!(first.delivered());
    let rest = g.within(Duration::from_secs(1)).await;
    let mut delivered: Vec<(String, String)> = std::iter::once(&first)
        .chain(&rest)
        .filter(|a| a.delivered())
        .flat_map(|a| a.ids.iter().map(|id| (a.sub.clone(), id.clone())))
        .collect();
    delivered.sort();
    let want: Vec<(String, String)> = ["a", "b"]
        .iter()
        .flat_map(|s| {
            ["e0", "e1", "e100", "e2", "e3", "e4"].map(|id| (s.to_string(), id.to_string()))
        })
        .collect();
    assert_eq!(
        delivered, want,
        "all of both subscriptions' events (the live one too), once"
    );
    assert!(
        rest.iter().all(|a| a.at == first.at),
        "drained in the same instant"
    );
    assert_eq!(g.metric("gridlet_endpoint_outage", "a"), Some(0));
    assert_eq!(g.metric("gridlet_pending_events", "b"), Some(0));
}

#[tokio::test(start_paused = true)]
async fn an_endpoint_that_answers_errors_is_still_disabled_as_before() {
    let mut g = InProcess::open(&[
        ("broker__endpointHealth__disableConsecutiveFailures", "3"),
        ("broker__defaultEventTimeToLiveInSeconds", "86400"),
    ]);
    g.sub("a", json!({}));
    g.script("a", |_| Outcome::failed(FailureKind::Status(500)));
    g.publish(0, 3, "s").await;
    // Three failures (one per event: batches of one) disable it; the events are charged.
    let first = g.within(Duration::from_secs(5)).await;
    assert_eq!(first.len(), 3);
    assert_eq!(g.metric("gridlet_endpoint_health_state", "a"), Some(1));
    assert_eq!(g.metric("gridlet_endpoint_outage", "a"), Some(0));
    let _ = ENDPOINT;
}
