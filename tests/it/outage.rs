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

/// A drain takes no more than its share. With the broker-wide budget
/// (`broker__maxInFlightTotal`) full of the drain's batches, a live event of a subscription to
/// another endpoint goes with the first permit freed, before the backlog's next batch (the
/// budget is handed out first come, first served).
#[tokio::test(start_paused = true)]
async fn a_drain_does_not_starve_other_subscriptions() {
    let mut g = InProcess::open(&[
        ("broker__maxInFlightTotal", "2"),
        ("broker__defaultEventTimeToLiveInSeconds", "86400"),
    ]);
    let persisted = json!({"persistencePolicy": {"isPersisted": true}});
    g.subs(&[("a", persisted.clone()), ("b", persisted)]);
    g.broker
        .put_subscription(
            "t",
            "other",
            json!({"properties": {"destination": {"endpointType": "WebHook",
                "properties": {"endpointUrl": "http://127.0.0.1:9/elsewhere"}},
                "filter": {"subjectBeginsWith": "live"}}}),
        )
        .unwrap();
    for sub in ["a", "b"] {
        g.script(sub, |_| Outcome::failed(FailureKind::Connect));
    }
    g.script("other", |_| Outcome::Delivered);
    g.publish(0, 100, "backlog").await;
    let _ = g.within(Duration::from_secs(45)).await; // the first attempts and a probe
    assert_eq!(g.metric("gridlet_endpoint_outage", "a"), Some(1));

    // The link is back: the next probe succeeds and the drain fills the budget.
    g.unscript("a");
    g.unscript("b");
    let probe = g
        .next_within(Duration::from_secs(60))
        .await
        .expect("a probe");
    assert_ne!(probe.sub, "other");
    probe.answer(Outcome::Delivered);
    let mut held: std::collections::VecDeque<_> = g.within(Duration::from_millis(10)).await.into();
    assert_eq!(held.len(), 2, "the budget is full: {held:?}");
    g.publish(1000, 1, "live").await;
    assert!(g.next_within(Duration::from_secs(1)).await.is_none());
    // The endpoint takes the drain's batches one at a time: the live event goes with one of
    // the first permits freed (each draining subscription may be waiting before it).
    for answered in 1.. {
        assert!(
            answered <= 3,
            "the live event waited behind {answered} batches"
        );
        held.pop_front()
            .expect("a held batch")
            .answer(Outcome::Delivered);
        let next = g
            .next_within(Duration::from_millis(10))
            .await
            .expect("an attempt");
        if next.sub == "other" {
            assert_eq!(next.ids, ["e1000"]);
            break;
        }
        held.push_back(next);
    }
}

/// `drainOrder: LiveFirst`: after an outage, an event published once the link is back goes
/// before the rest of the backlog; the default (`OldestFirst`) sends the backlog first.
#[tokio::test(start_paused = true)]
async fn drain_order_live_first_sends_new_events_before_the_backlog() {
    let mut g = InProcess::open(&[
        ("broker__maxInFlightPerSubscription", "1"),
        ("broker__defaultEventTimeToLiveInSeconds", "86400"),
    ]);
    let live_first = json!({"persistencePolicy": {"isPersisted": true},
        "deliveryPolicy": {"drainOrder": "LiveFirst"}});
    g.subs(&[
        ("old", json!({"persistencePolicy": {"isPersisted": true}})),
        ("live", live_first),
    ]);
    let bad = json!({"properties": {"destination": {"endpointType": "WebHook",
        "properties": {"endpointUrl": ENDPOINT, "drainOrder": "NewestFirst"}}}});
    let e = g.broker.put_subscription("t", "bad", bad).unwrap_err();
    assert!(e.to_string().contains("drainOrder"), "{e}");
    for sub in ["old", "live"] {
        g.script(sub, |_| Outcome::failed(FailureKind::Connect));
    }
    g.publish(0, 5, "backlog").await;
    let _ = g.within(Duration::from_secs(45)).await;
    g.unscript("old");
    g.unscript("live");
    g.next_within(Duration::from_secs(60))
        .await
        .expect("a probe")
        .answer(Outcome::Delivered);
    // Each subscription sends one backlog batch (one request in flight each).
    let held = g.within(Duration::from_millis(10)).await;
    assert_eq!(held.len(), 2, "{held:?}");
    g.publish(100, 1, "live").await;
    for a in held {
        a.answer(Outcome::Delivered);
    }
    let next = g.within(Duration::from_millis(10)).await;
    let of = |s: &str| next.iter().find(|a| a.sub == s).map(|a| a.ids.clone());
    assert_eq!(of("live"), Some(vec!["e100".to_string()]), "{next:?}");
    assert_ne!(of("old"), Some(vec!["e100".to_string()]), "{next:?}");
    assert!(of("old").is_some(), "{next:?}");
}
