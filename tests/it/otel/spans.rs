//! The `route` spans (one per subscription a publish matched, children of `publish`) and the
//! store's `commit` spans (one per group-commit frame: a child of the publish it made durable,
//! or the root of its own trace for a frame of settlements).

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_matched_subscription_gets_a_route_span_and_each_frame_a_commit_span() {
    let mut c = Collector::start();
    let t = start_traced(&otel_env(&c)).await;
    let mut all = Receiver::start().await;
    let mut some = Receiver::start().await;
    let none = Receiver::start().await;
    t.topic("t1").await;
    let persisted = json!({"persistencePolicy": {"isPersisted": true}});
    t.webhook_sub("t1", "all", &all.url("/all"), persisted)
        .await;
    let only_a = json!({"filter": {"subjectBeginsWith": "/a"}});
    t.webhook_sub("t1", "some", &some.url("/some"), only_a)
        .await;
    let only_z = json!({"filter": {"subjectBeginsWith": "/z"}});
    t.webhook_sub("t1", "none", &none.url("/none"), only_z)
        .await;
    let r = t
        .client
        .post(t.url("/topics/t1/events"))
        .header("traceparent", traceparent())
        .json(&json!([
            eg_event("e-1", "/a/1", "t", json!({})),
            eg_event("e-2", "/b/2", "t", json!({}))
        ]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    all.next().await;
    some.next().await;

    let spans = c
        .until(
            "publish, two routes, the publish's commit and a settlement's",
            |s| {
                let commits = named(s, "commit");
                count(s, "publish") == 1
                    && count(s, "route") == 2
                    && commits
                        .iter()
                        .any(|c| c["attributes"]["gridlet.store.publishes"] == 1)
                    && commits
                        .iter()
                        .any(|c| c["attributes"]["gridlet.store.publishes"] == 0)
            },
        )
        .await;
    let publish = named(&spans, "publish")[0];
    let route = |sub: &str| {
        *named(&spans, "route")
            .iter()
            .find(|r| r["attributes"]["messaging.destination.subscription.name"] == sub)
            .unwrap_or_else(|| panic!("a route span for {sub}: {spans:#?}"))
    };
    for (sub, matched, filtered, persisted) in [("all", 2, false, true), ("some", 1, true, false)] {
        let r = route(sub);
        assert_eq!(r["trace_id"], TRACE, "{r}");
        assert_eq!(r["parent_span_id"], publish["span_id"], "{r}");
        assert_eq!(r["kind"], 1, "INTERNAL");
        let a = &r["attributes"];
        assert_eq!(a["messaging.system"], "eventgrid");
        assert_eq!(a["messaging.operation.name"], "route");
        assert_eq!(a["messaging.destination.name"], "t1");
        assert_eq!(a["messaging.batch.message_count"], matched);
        assert_eq!(a["gridlet.route.matched"], matched);
        assert_eq!(a["gridlet.route.unmatched"], 2 - matched);
        assert_eq!(a["gridlet.route.filtered"], filtered);
        assert_eq!(a["gridlet.route.admission"], "queued");
        assert_eq!(a["gridlet.persisted"], persisted);
        assert_eq!(a["gridlet.destination.type"], "WebHook");
        assert_eq!(r["status_code"], 0);
    }

    // The frame that made the publish durable: in its trace, under the publish span.
    let commits = named(&spans, "commit");
    let commit = commits
        .iter()
        .find(|c| c["attributes"]["gridlet.store.publishes"] == 1)
        .unwrap();
    assert_eq!(commit["trace_id"], TRACE);
    assert_eq!(commit["parent_span_id"], publish["span_id"]);
    let a = &commit["attributes"];
    assert_eq!(a["gridlet.store.events"], 2, "each event once: {a}");
    assert!(a["gridlet.store.bytes"].as_i64().unwrap() > 100, "{a}");
    assert!(a["gridlet.store.fsync_us"].as_i64().is_some(), "{a}");
    // The delivery's removal rides a frame of its own: a root span.
    let settled = commits
        .iter()
        .find(|c| c["attributes"]["gridlet.store.publishes"] == 0)
        .unwrap();
    assert_eq!(settled["parent_span_id"], "");
    assert_eq!(settled["attributes"]["gridlet.store.events"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_subscription_refuses_with_an_error_route_span() {
    let mut c = Collector::start();
    let mut env = otel_env(&c);
    env.push(("broker__maxPendingEventsPerSubscription", "1".into()));
    let t = start_traced(&env).await;
    let mut rx = Receiver::start().await;
    rx.respond_with(500);
    t.topic("t1").await;
    t.webhook_sub("t1", "s1", &rx.url("/s1"), json!({})).await;
    t.publish("t1", json!([eg_event("e-1", "s", "t", json!({}))]))
        .await;
    rx.next().await; // failed: it waits for its retry, holding the one place
    let r = t
        .client
        .post(t.url("/topics/t1/events"))
        .header("traceparent", traceparent())
        .json(&json!([eg_event("e-2", "s", "t", json!({}))]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let spans = c
        .until("the refused publish's route span", |s| {
            named(s, "route").iter().any(|r| r["trace_id"] == TRACE)
        })
        .await;
    let route = named(&spans, "route")
        .into_iter()
        .find(|r| r["trace_id"] == TRACE)
        .unwrap();
    assert_eq!(route["attributes"]["gridlet.route.admission"], "refused");
    assert_eq!(route["status_code"], 2, "ERROR");
    assert!(
        route["status_message"].as_str().unwrap().contains("s1"),
        "{route}"
    );
}
