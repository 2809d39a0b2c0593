//! Deduplication on publish (issue 34, part C) on the paused clock: an identity accepted
//! within the window is answered 200 and not routed again; at the window's edge it is routed
//! again; a topic's `deduplicationWindowInSeconds` overrides the setting; suppressed events are
//! counted.

use crate::harness::InProcess;
use gridlet::delivery::sink::Outcome;
use gridlet::model::topic::Topic;
use serde_json::json;
use std::time::Duration;

fn suppressed(g: &InProcess, topic: &str) -> Option<u64> {
    crate::util::metric(
        &g.broker.render_metrics(),
        "gridlet_deduplicated_events_total",
        &format!("topic=\"{topic}\""),
    )
}

#[tokio::test(start_paused = true)]
async fn a_resent_event_is_routed_once_within_the_window_and_again_after_it() {
    let mut g = InProcess::open(&[("broker__deduplicationWindowSeconds", "60")]);
    g.sub("s", json!({}));
    g.script("s", |_| Outcome::Delivered);
    g.publish(0, 3, "x").await;
    assert_eq!(g.until_quiet(Duration::from_secs(1)).await.len(), 3);
    // The publisher resends after a timeout: 200, nothing routed.
    tokio::time::sleep(Duration::from_secs(58)).await;
    g.publish(0, 3, "x").await;
    g.none_within(Duration::from_millis(500)).await;
    assert_eq!(suppressed(&g, "t"), Some(3));
    // A new id in the same request still goes.
    g.publish(2, 2, "x").await;
    let a = g.until_quiet(Duration::from_millis(100)).await;
    assert_eq!(
        a.iter().flat_map(|a| a.ids.clone()).collect::<Vec<_>>(),
        ["e3"]
    );
    // 60 s after the first acceptance the window has passed: routed again.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    g.publish(0, 1, "x").await;
    let a = g.next().await;
    assert_eq!(a.ids, ["e0"]);
    assert_eq!(suppressed(&g, "t"), Some(4));
}

#[tokio::test(start_paused = true)]
async fn a_topic_overrides_the_setting_and_zero_is_off() {
    let mut g = InProcess::open(&[]);
    g.broker
        .put_topic(
            Topic::from_put(
                "t",
                json!({"properties": {"deduplicationWindowInSeconds": 30}}),
            )
            .unwrap(),
        )
        .unwrap();
    g.sub("s", json!({}));
    g.script("s", |_| Outcome::Delivered);
    g.publish(0, 1, "x").await;
    g.publish(0, 1, "x").await;
    assert_eq!(g.until_quiet(Duration::from_secs(1)).await.len(), 1);
    // Off (the default) for a topic that sets nothing.
    g.broker
        .put_topic(Topic::from_put("t", json!({})).unwrap())
        .unwrap();
    g.publish(0, 1, "x").await;
    g.publish(0, 1, "x").await;
    assert_eq!(g.until_quiet(Duration::from_secs(1)).await.len(), 2);
    assert!(Topic::from_put(
        "u",
        json!({"properties": {"deduplicationWindowInSeconds": 604_801}})
    )
    .is_err());
}

/// The window survives a crash for persisted events: rebuilt at start from the events the store
/// restored, each remembered from its first acceptance (so the window's edge does not move).
#[tokio::test(start_paused = true)]
async fn a_restart_in_the_middle_of_the_window_keeps_it_for_persisted_events() {
    let mut g = InProcess::open(&[("broker__deduplicationWindowSeconds", "60")]);
    g.sub("p", json!({"persistencePolicy": {"isPersisted": true}}));
    // The endpoint never answers: the events stay pending in the store.
    let t0 = tokio::time::Instant::now();
    g.publish(0, 3, "x").await;
    assert_eq!(g.within(Duration::from_secs(1)).await.len(), 3);
    tokio::time::sleep_until(t0 + Duration::from_secs(30)).await;
    g.restart();
    // After the restart they are delivered again (at least once)...
    g.script("p", |_| Outcome::Delivered);
    let again = g.until_quiet(Duration::from_secs(1)).await;
    assert_eq!(again.iter().map(|a| a.events()).sum::<usize>(), 3);
    // ...and a resend within the window is still suppressed, up to its edge: 60 s after the
    // first acceptance, not after the restart.
    tokio::time::sleep_until(t0 + Duration::from_millis(59_999)).await;
    g.publish(0, 3, "x").await;
    g.none_within(Duration::ZERO).await;
    assert_eq!(suppressed(&g, "t"), Some(3));
    tokio::time::sleep(Duration::from_millis(1)).await;
    g.publish(0, 1, "x").await;
    assert_eq!(g.next().await.ids, ["e0"]);
    assert_eq!(suppressed(&g, "t"), Some(3));
}

/// What a restart keeps and what it does not, on the event log store: identities of
/// persisted events are remembered even once delivered (their segments are kept for the
/// window); events only in-memory subscriptions took are lost with the crash, and so are their
/// identities (a resend brings them back). docs/CLOUD.md says so.
#[tokio::test(start_paused = true)]
async fn a_restart_keeps_delivered_persisted_events_and_forgets_in_memory_ones() {
    let dir = tempfile::tempdir().unwrap();
    let mut g =
        InProcess::open_on_log(dir.path(), &[("broker__deduplicationWindowSeconds", "600")]);
    g.sub("mem", json!({}));
    g.sub(
        "p",
        json!({"persistencePolicy": {"isPersisted": true},
        "filter": {"subjectBeginsWith": "p"}}),
    );
    g.script("p", |_| Outcome::Delivered);
    g.publish(0, 1, "mem").await; // in memory only, never answered
    g.publish(1, 1, "p").await; // persisted and delivered
    assert_eq!(g.until_quiet(Duration::from_secs(1)).await.len(), 3);
    g.restart();
    g.script("mem", |_| Outcome::Delivered);
    g.publish(0, 1, "mem").await;
    g.publish(1, 1, "p").await;
    let mut ids: Vec<(String, String)> = g
        .until_quiet(Duration::from_secs(1))
        .await
        .into_iter()
        .map(|a| (a.sub, a.ids[0].clone()))
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        [("mem", "e0")].map(|(s, i)| (s.to_string(), i.to_string()))
    );
    assert_eq!(suppressed(&g, "t"), Some(1));
}

/// The window's edge for a delivered event across a restart: remembered from its acceptance
/// (read back from the log's own record, kept though delivered), not from the restart.
#[tokio::test(start_paused = true)]
async fn a_delivered_event_is_suppressed_after_a_restart_up_to_its_window_edge() {
    let dir = tempfile::tempdir().unwrap();
    let mut g = InProcess::open_on_log(dir.path(), &[("broker__deduplicationWindowSeconds", "60")]);
    g.sub("p", json!({"persistencePolicy": {"isPersisted": true}}));
    g.script("p", |_| Outcome::Delivered);
    let t0 = tokio::time::Instant::now();
    g.publish(0, 3, "x").await;
    let first = g.until_quiet(Duration::from_secs(1)).await;
    assert_eq!(first.iter().map(|a| a.events()).sum::<usize>(), 3);
    tokio::time::sleep_until(t0 + Duration::from_secs(30)).await;
    g.restart();
    g.none_within(Duration::from_secs(1)).await; // delivered: nothing comes back
    tokio::time::sleep_until(t0 + Duration::from_millis(59_999)).await;
    g.publish(0, 3, "x").await;
    g.none_within(Duration::ZERO).await;
    assert_eq!(suppressed(&g, "t"), Some(3));
    tokio::time::sleep_until(t0 + Duration::from_secs(60)).await;
    g.publish(0, 1, "x").await;
    assert_eq!(g.next().await.ids, ["e0"]);
    assert_eq!(suppressed(&g, "t"), Some(3));
}

/// The delivered events' segments are kept while the window needs them and given back once it
/// has passed them (the broker moves the store's horizon with its clock).
#[tokio::test(start_paused = true)]
async fn the_segments_kept_for_the_window_are_given_back_once_it_has_passed() {
    let dir = tempfile::tempdir().unwrap();
    let mut g = InProcess::open_on_log(dir.path(), &[("broker__deduplicationWindowSeconds", "60")]);
    g.sub("p", json!({"persistencePolicy": {"isPersisted": true}}));
    g.script("p", |_| Outcome::Delivered);
    let disk = |g: &InProcess| -> u64 {
        let text = g.broker.render_metrics();
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("gridlet_store_disk_bytes "));
        line.unwrap().trim().parse().unwrap()
    };
    let empty = disk(&g);
    // About 300 KB: several 64 KiB segments, all delivered.
    for i in 0..300 {
        g.publish(i, 1, &"x".repeat(1000)).await;
    }
    let n: usize = g
        .until_quiet(Duration::from_secs(1))
        .await
        .iter()
        .map(|a| a.events())
        .sum();
    assert_eq!(n, 300);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let kept = disk(&g);
    assert!(kept > empty + 250_000, "kept: {kept} bytes ({empty} empty)");
    // The window has passed the last of them (and one tick of the horizon, 1 s here).
    tokio::time::sleep(Duration::from_secs(32)).await;
    // What is left: the head and the spare segment (at most 64 KiB each).
    let left = disk(&g);
    assert!(
        left < empty + 140_000,
        "given back: {left} bytes, {kept} kept, {empty} empty"
    );
}

/// At the disk bound the oldest segments kept for the window go before a publish is refused,
/// and each is counted: every publish is taken, and the window a restart would rebuild is
/// shorter (the one in memory is not).
#[tokio::test(start_paused = true)]
async fn at_the_disk_bound_kept_segments_go_first_and_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let mut g = InProcess::open_on_log_within(
        dir.path(),
        512 << 10,
        &[("broker__deduplicationWindowSeconds", "3600")],
    );
    g.sub("p", json!({"persistencePolicy": {"isPersisted": true}}));
    g.script("p", |_| Outcome::Delivered);
    let evicted = |g: &InProcess| {
        let text = g.broker.render_metrics();
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("gridlet_dedup_window_evicted_segments_total "));
        line.unwrap().trim().parse::<u64>().unwrap()
    };
    assert_eq!(evicted(&g), 0);
    // About 770 KB of events, each delivered before the next: half again the bound.
    for i in 0..700 {
        g.publish(i, 1, &"x".repeat(1000)).await; // panics on a refusal (507)
        assert_eq!(g.next().await.events(), 1);
    }
    assert!(evicted(&g) >= 2, "{}", evicted(&g));
    // The window in memory is whole: the first event is still suppressed.
    g.publish(0, 1, "x").await;
    g.none_within(Duration::from_secs(1)).await;
    assert_eq!(suppressed(&g, "t"), Some(1));
}
