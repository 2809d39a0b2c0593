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
