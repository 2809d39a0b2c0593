//! Retry schedules on tokio's paused clock (docs/COMPATIBILITY.md behaviours 44–47, 49): no sleeping, no sockets.
//!
//! The broker runs in the in-process harness: each attempt arrives here with its virtual time,
//! and the test answers it.

use crate::harness::{fail, InProcess, ENDPOINT};
use gridlet::delivery::sink::Outcome;
use serde_json::json;
use std::time::Duration;

fn minutes(m: u64) -> Duration {
    Duration::from_secs(m * 60)
}

#[tokio::test(start_paused = true)]
async fn failure_retries_after_one_minute_then_every_ten_minutes_compat_44() {
    let mut h = InProcess::open(&[]);
    h.sub("s", json!({}));
    h.publish(0, 1, "s").await;
    let mut times = Vec::new();
    for i in 0..4 {
        let a = h.next().await;
        assert_eq!(a.attempt, i + 1);
        times.push(a.at);
        a.answer(if i < 3 { fail(500) } else { Outcome::Delivered });
    }
    assert_eq!(
        times,
        vec![Duration::ZERO, minutes(1), minutes(11), minutes(21)]
    );
    h.none_within(Duration::from_secs(24 * 3600)).await;
    assert_eq!(h.metric("DeliverySuccessCounts", "s"), Some(1));
    assert_eq!(h.metric("DeliveryFailureCounts", "s"), Some(3));
    assert_eq!(h.metric("DeliveryAttemptsCount", "s"), Some(4));
}

#[tokio::test(start_paused = true)]
async fn max_delivery_attempts_caps_the_attempts_compat_45() {
    let mut h = InProcess::open(&[]);
    h.sub("s", json!({"retryPolicy":{"maxDeliveryAttempts":2}}));
    h.publish(0, 1, "s").await;
    for _ in 0..2 {
        h.next().await.answer(fail(500));
    }
    h.none_within(Duration::from_secs(24 * 3600)).await;
    assert_eq!(h.metric("ExpiredCounts", "s"), Some(1));
    assert_eq!(h.metric("gridlet_pending_events", "s"), Some(0));
}

#[tokio::test(start_paused = true)]
async fn no_attempt_after_the_time_to_live_compat_46() {
    let mut h = InProcess::open(&[]);
    h.sub("s", json!({"retryPolicy":{"eventExpiryInMinutes":1}}));
    h.publish(0, 1, "s").await;
    let a = h.next().await;
    assert_eq!(a.at, Duration::ZERO);
    a.answer(fail(500));
    h.none_within(Duration::from_secs(24 * 3600)).await;
    assert_eq!(h.metric("ExpiredCounts", "s"), Some(1));
}

#[tokio::test(start_paused = true)]
async fn defaults_attempt_thirteen_times_over_two_hours() {
    let mut h = InProcess::open(&[]);
    h.sub("s", json!({}));
    h.publish(0, 1, "s").await;
    let mut times = Vec::new();
    while let Some(a) = h.next_within(minutes(24 * 60)).await {
        times.push(a.at.as_secs() / 60);
        a.answer(fail(500));
    }
    assert_eq!(
        times,
        vec![0, 1, 11, 21, 31, 41, 51, 61, 71, 81, 91, 101, 111]
    );
}

#[tokio::test(start_paused = true)]
async fn module_default_max_attempts_applies_compat_47() {
    let mut h = InProcess::open(&[("broker__defaultMaxDeliveryAttempts", "3")]);
    h.sub("s", json!({}));
    h.publish(0, 1, "s").await;
    for _ in 0..3 {
        h.next().await.answer(fail(500));
    }
    h.none_within(Duration::from_secs(24 * 3600)).await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_batch_is_retried_as_a_unit_compat_49() {
    let mut h = InProcess::open(&[]);
    h.sub("s", json!({"destination":{"endpointType":"WebHook","properties":{"endpointUrl":ENDPOINT,"maxEventsPerBatch":3}}}));
    h.publish(0, 3, "s").await;
    let first = h.next().await;
    assert_eq!(first.ids, ["e0", "e1", "e2"]);
    first.answer(fail(500));
    let again = h.next().await;
    assert_eq!(again.ids, ["e0", "e1", "e2"]);
    assert_eq!(again.at, minutes(1));
    again.answer(Outcome::Delivered);
    h.none_within(Duration::from_secs(3600)).await;
}

#[tokio::test(start_paused = true)]
async fn a_hanging_subscriber_never_delays_a_healthy_one() {
    let mut h = InProcess::open(&[("broker__maxInFlightPerSubscription", "4")]);
    h.sub("dead", json!({}));
    h.sub("live", json!({}));
    h.publish(0, 50, "s").await;
    let mut live = 0;
    let mut dead_pending = Vec::new();
    while live < 50 {
        let a = h.next().await;
        assert_eq!(
            a.at,
            Duration::ZERO,
            "every healthy delivery happens at once"
        );
        if a.sub == "live" {
            live += 1;
            a.answer(Outcome::Delivered);
        } else {
            dead_pending.push(a); // never answered: the endpoint hangs
        }
    }
    assert_eq!(
        dead_pending.len(),
        4,
        "the dead subscriber holds only its own slots"
    );
}

#[tokio::test(start_paused = true)]
async fn retries_wait_in_their_own_lane_while_new_events_go_first() {
    let mut h = InProcess::open(&[("broker__maxInFlightPerSubscription", "4")]);
    h.sub("s", json!({}));
    h.publish(0, 8, "s").await;
    // Fail the first 8 attempts: they wait a minute; new events published meanwhile go at once.
    for _ in 0..8 {
        h.next().await.answer(fail(500));
    }
    tokio::time::sleep(Duration::from_secs(30)).await; // virtual time: the clock is paused
    h.publish(0, 1, "s").await;
    let a = h.next().await;
    assert_eq!((a.at, a.attempt), (Duration::from_secs(30), 1));
    a.answer(Outcome::Delivered);
    // The retries come at one minute, at most one in flight at a time (retry budget = 4/4 = 1).
    let r = h.next().await;
    assert_eq!((r.at, r.attempt), (minutes(1), 2));
    h.none_within(Duration::from_secs(1)).await;
    r.answer(Outcome::Delivered);
    let r2 = h.next().await;
    assert_eq!(r2.attempt, 2);
}

/// A persisted subscription whose every first attempt fails keeps the bodies of one window of
/// retries (2,048 events) in memory; the rest of its retry lane waits by sequence number, and
/// every event is retried when due and delivered once (issue 14 item 4; the 1,000,000-event
/// version is gridlet-bench (e) --down refuse). Events are published a window at a time so the
/// first attempts need no store reads (a blocking read would let the paused clock run ahead).
#[tokio::test(start_paused = true)]
async fn a_persisted_retry_lane_past_its_window_keeps_only_sequence_numbers() {
    const WINDOW: usize = 2048;
    const N: usize = 2 * WINDOW;
    // Endpoint health would hold a destination failing this often back (and the paused clock
    // would run to its probe): this test is about the retry lane.
    let mut h = InProcess::open(&[("broker__endpointHealth__enabled", "false")]);
    h.sub("s", json!({"persistencePolicy": {"isPersisted": true}}));
    h.script("s", |req| {
        if req.attempt == 1 {
            fail(503)
        } else {
            Outcome::Delivered
        }
    });
    for part in 0..N / 512 {
        h.publish(part * 512, 512, "s").await;
        for _ in 0..512 {
            let a = h.next().await;
            assert_eq!((a.attempt, a.delivered()), (1, false), "{a:?}");
        }
    }
    let sub = h.broker.subscription("t", "s").unwrap();
    assert_eq!(
        sub.pending(),
        N,
        "every event failed once and waits to retry"
    );
    assert_eq!(
        sub.spilled(),
        N - WINDOW,
        "one window of retry bodies is in memory, the rest by sequence number"
    );
    let retries = h.until_quiet(Duration::from_secs(3600)).await;
    let mut ids: Vec<&str> = retries
        .iter()
        .inspect(|a| assert!(a.delivered() && a.at >= minutes(1), "{a:?}"))
        .flat_map(|a| a.ids.iter().map(String::as_str))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), N, "every event retried and delivered once");
    assert_eq!(h.metric("DeliverySuccessCounts", "s"), Some(N as u64));
    assert_eq!((sub.pending(), sub.spilled()), (0, 0));
}
