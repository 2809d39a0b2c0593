//! Delivery resilience (issue 5): status-code table, schedules, Retry-After, dead letters,
//! endpoint health, isolation, signing, and the accounting invariant.
//!
//! Two kinds of tests:
//! * schedules, health transitions over hours and the chaos test run in the in-process harness
//!   (`harness.rs`) with scripted sinks on tokio's **paused clock** (no sockets, no real waiting);
//! * everything about real HTTP (status classes, hangs, resets, `Retry-After` parsing,
//!   signing, the API routes) uses real receivers and a real gridlet.

use crate::harness::{fail, offsets, Attempt, InProcess};
use crate::util::*;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use gridlet::delivery::sink::{DeliveryRequest, FailureKind, Outcome, Sink};
use gridlet::model::topic::EventSchema;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// Schedules on the paused clock
// ---------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn default_schedule_is_the_original_then_ttl_dead_letters() {
    let mut h = InProcess::open(&[]);
    h.subs(&[("s", json!({}))]);
    h.script("s", |_| fail(500));
    h.publish(0, 1, "a").await;
    let v = h.until_quiet(Duration::from_secs(3 * 3600)).await;
    // Immediate, 1-minute queue, then the 10-minute queue until the 2 h TTL: 13 attempts.
    let mut expect = vec![0, 60];
    for k in 1..=11 {
        expect.push(60 + 600 * k);
    }
    assert_eq!(offsets(&v), expect);
    assert_eq!(
        v.iter().map(|a| a.attempt).collect::<Vec<_>>(),
        (1..=13).collect::<Vec<u32>>()
    );
    let dl = h.broker.dead_letters("t", "s", 0, 10).unwrap();
    assert_eq!(dl.len(), 1);
    assert_eq!(dl[0].reason.as_str(), "TimeToLiveExceeded");
    assert_eq!(dl[0].last_status, Some(500));
    assert_eq!(dl[0].attempts, 13);
}

#[tokio::test(start_paused = true)]
async fn event_grid_cloud_schedule_by_subscription() {
    let mut h = InProcess::open(&[("broker__retryJitterPercent", "0")]);
    h.subs(&[(
        "s",
        json!({"retryPolicy": {"schedule": "tenSecondsToHourly", "statusCodePolicy": "standard",
                   "eventExpiryInMinutes": 1440, "maxDeliveryAttempts": 10}}),
    )]);
    h.script("s", |_| fail(502));
    h.publish(0, 1, "a").await;
    let v = h.until_quiet(Duration::from_secs(5 * 3600)).await;
    assert_eq!(
        offsets(&v),
        vec![0, 10, 40, 100, 400, 1000, 2800, 6400, 10000, 13600]
    );
    let dl = h.broker.dead_letters("t", "s", 0, 10).unwrap();
    assert_eq!(dl[0].reason.as_str(), "MaxDeliveryAttemptsExceeded");
    assert_eq!(dl[0].attempts, 10);
}

#[tokio::test(start_paused = true)]
async fn workfront_schedule_from_module_config() {
    let mut h = InProcess::open(&[
        ("broker__retrySchedule", "workfront"),
        ("broker__defaultEventTimeToLiveInSeconds", "4000000"),
    ]);
    h.subs(&[("s", json!({}))]);
    h.script("s", |_| Outcome::failed(FailureKind::Timeout));
    h.publish(0, 1, "a").await;
    let v = h.until_quiet(Duration::from_secs(60 * 3600)).await;
    let ms: Vec<u64> = v
        .windows(2)
        .map(|w| (w[1].at - w[0].at).as_millis() as u64)
        .collect();
    let expect: Vec<u64> = (1..=11).map(|n| ((1u64 << n) - 1) * 84_800).collect();
    assert_eq!(ms, expect, "((2^n) - 1) * 84800 ms, 11 retries");
    assert_eq!(
        h.broker.dead_letters("t", "s", 0, 10).unwrap()[0]
            .reason
            .as_str(),
        "MaxDeliveryAttemptsExceeded"
    );
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_honoured_on_429_and_503_with_a_cap() {
    let mut h = InProcess::open(&[
        ("broker__statusCodePolicy", "standard"),
        ("broker__retryJitterPercent", "0"),
        ("broker__retryAfterMaxSeconds", "300"),
    ]);
    h.subs(&[("a", json!({})), ("c", json!({}))]);
    h.script("a", |r| {
        if r.attempt == 1 {
            Outcome::Failed {
                kind: FailureKind::Status(429),
                retry_after: Some(Duration::from_secs(150)),
            }
        } else {
            Outcome::Delivered
        }
    });
    h.script("c", |r| {
        if r.attempt == 1 {
            Outcome::Failed {
                kind: FailureKind::Status(503),
                retry_after: Some(Duration::from_secs(86_400)),
            }
        } else {
            Outcome::Delivered
        }
    });
    h.publish(0, 1, "x").await;
    let v = h.until_quiet(Duration::from_secs(3600)).await;
    let by = |s: &str| offsets(v.iter().filter(|a| a.sub == s));
    assert_eq!(
        by("a"),
        vec![0, 150],
        "Retry-After beyond the 1-minute queue"
    );
    assert_eq!(
        by("c"),
        vec![0, 300],
        "capped at broker__retryAfterMaxSeconds"
    );
}

#[tokio::test(start_paused = true)]
async fn status_code_policy_per_subscription_400_refused_or_retried() {
    let mut h = InProcess::open(&[]);
    h.subs(&[
        (
            "std",
            json!({"retryPolicy": {"statusCodePolicy": "standard"}}),
        ),
        ("orig", json!({"retryPolicy": {"maxDeliveryAttempts": 3}})),
    ]);
    h.script("std", |_| fail(400));
    h.script("orig", |_| fail(400));
    h.publish(0, 1, "x").await;
    let v = h.until_quiet(Duration::from_secs(3600)).await;
    assert_eq!(v.iter().filter(|a| a.sub == "std").count(), 1);
    assert_eq!(v.iter().filter(|a| a.sub == "orig").count(), 3);
    let std = h.broker.dead_letters("t", "std", 0, 10).unwrap();
    assert_eq!(std[0].reason.as_str(), "DeliveryRefused");
    assert_eq!(std[0].last_status, Some(400));
    let orig = h.broker.dead_letters("t", "orig", 0, 10).unwrap();
    assert_eq!(orig[0].reason.as_str(), "MaxDeliveryAttemptsExceeded");
}

// ---------------------------------------------------------------------------------------------
// Endpoint health: closed → disabled → frozen → re-enabled, over hours of paused time
// ---------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn endpoint_health_closed_disabled_frozen_reenabled() {
    let mut h = InProcess::open(&[
        ("broker__endpointHealth__disableConsecutiveFailures", "5"),
        ("broker__endpointHealth__freezeConsecutiveFailures", "8"),
        ("broker__endpointHealth__freezeNoSuccessInHours", "1"),
        ("broker__defaultEventTimeToLiveInSeconds", "36000"),
        ("broker__defaultMaxDeliveryAttempts", "1"),
    ]);
    h.subs(&[("s", json!({}))]);
    h.script("s", |_| fail(500));
    let state = |h: &InProcess| {
        let e = h.broker.subscription("t", "s").unwrap();
        e.endpoint_health().unwrap()
    };
    // Five failing events (one attempt each): disabled.
    h.publish(0, 5, "x").await;
    let v = h.until_quiet(Duration::from_secs(1)).await;
    assert_eq!(v.len(), 5);
    assert_eq!(state(&h).state.as_str(), "Disabled");
    // New events wait; exactly one probe every 10 minutes.
    h.publish(5, 20, "x").await;
    let v = h.within(Duration::from_secs(2 * 600 + 1)).await;
    assert_eq!(offsets(&v), vec![0, 600], "one probe per interval");
    assert!(v.iter().all(|a| a.events() == 1));
    assert_eq!(state(&h).state.as_str(), "Disabled");
    // Probes keep failing; more than 8 consecutive failures and no success for over 1 h: frozen.
    let v = h.until_quiet(Duration::from_secs(3600)).await;
    assert!(!v.is_empty());
    assert_eq!(state(&h).state.as_str(), "Frozen");
    let frozen_pending = h.broker.subscription("t", "s").unwrap().pending();
    // Frozen: no attempts for hours, but TTL still applies and events become dead letters.
    let v = h.until_quiet(Duration::from_secs(11 * 3600)).await;
    assert!(v.is_empty(), "no attempts while frozen: {v:?}");
    assert_eq!(h.broker.subscription("t", "s").unwrap().pending(), 0);
    let dl = h.broker.dead_letters("t", "s", 0, 1000).unwrap();
    let expired = dl
        .iter()
        .filter(|l| l.reason.as_str() == "TimeToLiveExceeded")
        .count();
    assert_eq!(expired, frozen_pending);
    assert_eq!(dl.len(), 25, "every event accounted for");
    // Re-enabled through the API (the endpoint is fixed meanwhile): deliveries flow again.
    h.script("s", |_| Outcome::Delivered);
    assert_eq!(
        h.broker.enable_endpoint("t", "s").unwrap().state.as_str(),
        "Enabled"
    );
    h.publish(100, 3, "x").await;
    let v = h.until_quiet(Duration::from_secs(1)).await;
    assert_eq!(v.len(), 3);
    assert!(v.iter().all(|a| a.delivered()));
}

#[tokio::test(start_paused = true)]
async fn disabled_endpoint_reenabled_by_a_successful_probe() {
    let mut h = InProcess::open(&[
        ("broker__endpointHealth__disableFailureRatePercent", "70"),
        ("broker__endpointHealth__disableMinAttempts", "10"),
        ("broker__defaultMaxDeliveryAttempts", "1"),
    ]);
    h.subs(&[("s", json!({}))]);
    let n = Arc::new(AtomicU64::new(0));
    let n2 = n.clone();
    // 80 % failures.
    h.script("s", move |_| {
        if n2.fetch_add(1, Ordering::Relaxed).is_multiple_of(5) {
            Outcome::Delivered
        } else {
            fail(500)
        }
    });
    // 12 attempts, 9 failed (75 %): more than 10 attempts above 70 %.
    h.publish(0, 12, "x").await;
    h.until_quiet(Duration::from_secs(1)).await;
    let e = h.broker.subscription("t", "s").unwrap();
    assert_eq!(e.endpoint_health().unwrap().state.as_str(), "Disabled");
    h.script("s", |_| Outcome::Delivered);
    h.publish(11, 5, "x").await;
    let v = h.within(Duration::from_secs(601)).await;
    // The probe (one event) at 10 min succeeds; the rest follow at once.
    assert_eq!(v.len(), 5);
    assert_eq!(v[0].events(), 1);
    assert!(v.iter().all(|a| a.at == v[0].at));
    assert_eq!(e.endpoint_health().unwrap().state.as_str(), "Enabled");
}

// ---------------------------------------------------------------------------------------------
// Chaos: the accounting invariant
// ---------------------------------------------------------------------------------------------

/// Add the events each subscription's sink was told were delivered.
fn count_delivered(counts: &mut HashMap<String, u64>, attempts: Vec<Attempt>) {
    for a in attempts.into_iter().filter(Attempt::delivered) {
        *counts.entry(a.sub.clone()).or_default() += a.events() as u64;
    }
}

#[tokio::test(start_paused = true)]
async fn chaos_every_event_is_accounted_for() {
    let mut h = InProcess::open(&[
        ("broker__defaultEventTimeToLiveInSeconds", "1800"),
        ("broker__defaultMaxDeliveryAttempts", "4"),
        ("broker__deadLetter__maxEventsPerSubscription", "1000000"),
        ("broker__endpointHealth__disableMinAttempts", "50"),
        ("broker__endpointHealth__probeIntervalInSeconds", "120"),
    ]);
    let subs: Vec<(&str, Value)> = vec![
        ("all", json!({})),
        (
            "std",
            json!({"retryPolicy": {"statusCodePolicy": "standard", "schedule": "eventGridCloud"}}),
        ),
        ("a_only", json!({"filter": {"subjectBeginsWith": "a"}})),
        (
            "batched",
            json!({"destination": {"endpointType": "WebHook",
            "properties": {"endpointUrl": "http://127.0.0.1:9/b", "maxEventsPerBatch": 7}}}),
        ),
        ("dead", json!({"retryPolicy": {"maxDeliveryAttempts": 2}})),
    ];
    h.subs(&subs);
    let rng = Arc::new(Mutex::new(Rng(0x5EED_1234_ABCD_0001)));
    for (name, _) in &subs {
        let rng = rng.clone();
        let name = name.to_string();
        h.script(&name.clone(), move |_| {
            let r = rng.lock().unwrap().next() % 100;
            match name.as_str() {
                "dead" => Outcome::failed(FailureKind::Connect),
                _ if r < 45 => Outcome::Delivered,
                _ if r < 55 => fail(400),
                _ if r < 70 => Outcome::Failed {
                    kind: FailureKind::Status(429),
                    retry_after: Some(Duration::from_secs(r)),
                },
                _ if r < 85 => fail(503),
                _ => Outcome::failed(FailureKind::Timeout),
            }
        });
    }
    let mut expected: HashMap<&str, u64> = HashMap::new();
    let mut sink_delivered: HashMap<String, u64> = HashMap::new();
    let mut published = 0usize;
    let check = |h: &InProcess,
                 expected: &HashMap<&str, u64>,
                 sink_delivered: &HashMap<String, u64>,
                 final_check: bool| {
        for (name, _) in &subs {
            let e = h.broker.subscription("t", name).unwrap();
            let m = e.metrics();
            let pending = e.pending() as u64;
            let delivered = m.delivery_success_counts.get();
            let (max, exp, refused) = (
                m.dropped_max_attempts.get(),
                m.dropped_expired.get(),
                m.dropped_refused.get(),
            );
            let want = expected.get(name).copied().unwrap_or(0);
            assert_eq!(m.enqueued.get(), want, "{name}: enqueued");
            assert_eq!(
                delivered + max + exp + refused + pending,
                want,
                "{name}: delivered {delivered} + max {max} + expired {exp} + refused {refused} + pending {pending}"
            );
            assert_eq!(
                h.broker
                    .dead_letters("t", name, 0, 1_000_000)
                    .unwrap()
                    .len() as u64,
                max + exp + refused,
                "{name}: every undelivered event is a dead letter"
            );
            assert_eq!(
                sink_delivered.get(*name).copied().unwrap_or(0),
                delivered,
                "{name}: the sink saw exactly what the broker counts as delivered"
            );
            if final_check {
                assert_eq!(pending, 0, "{name}: nothing left pending");
            }
        }
    };
    for round in 0..40 {
        let n = 1 + (rng.lock().unwrap().next() % 25) as usize;
        let subject = if round % 3 == 0 { "b/x" } else { "a/x" };
        h.publish(published, n, subject).await;
        published += n;
        for (name, _) in &subs {
            if *name != "a_only" || subject.starts_with('a') {
                *expected.entry(name).or_default() += n as u64;
            }
        }
        tokio::time::sleep(Duration::from_secs(37)).await; // virtual time: the clock is paused
        count_delivered(&mut sink_delivered, h.drain());
        check(&h, &expected, &sink_delivered, false);
    }
    // Run out the TTL: everything settles.
    tokio::time::sleep(Duration::from_secs(2 * 3600)).await; // virtual time
    count_delivered(&mut sink_delivered, h.drain());
    check(&h, &expected, &sink_delivered, true);
    let e = h.broker.subscription("t", "dead").unwrap();
    assert_eq!(e.metrics().delivery_success_counts.get(), 0);
    assert!(published > 200);
}

// ---------------------------------------------------------------------------------------------
// Real receivers: status classes, hang, reset, Retry-After
// ---------------------------------------------------------------------------------------------

/// How a [`Flaky`] receiver answers.
#[derive(Clone, Copy)]
enum Mode {
    Status(u16),
    StatusRetryAfterSecs(u16, u64),
    StatusRetryAfterDate(u16, u64),
    Hang,
}

struct Flaky {
    addr: std::net::SocketAddr,
    _task: tokio::task::JoinHandle<()>,
}

async fn flaky(mode: Mode) -> Flaky {
    async fn handle(axum::extract::State(mode): axum::extract::State<Mode>) -> Response {
        match mode {
            Mode::Status(s) => StatusCode::from_u16(s).unwrap().into_response(),
            Mode::StatusRetryAfterSecs(s, secs) => {
                let mut r = StatusCode::from_u16(s).unwrap().into_response();
                r.headers_mut().insert(
                    "retry-after",
                    HeaderValue::from_str(&secs.to_string()).unwrap(),
                );
                r
            }
            Mode::StatusRetryAfterDate(s, secs) => {
                let when = std::time::SystemTime::now() + Duration::from_secs(secs);
                let mut r = StatusCode::from_u16(s).unwrap().into_response();
                r.headers_mut().insert(
                    "retry-after",
                    HeaderValue::from_str(&httpdate::fmt_http_date(when)).unwrap(),
                );
                r
            }
            Mode::Hang => {
                tokio::time::sleep(Duration::from_secs(3600)).await; // under test: a hung endpoint
                StatusCode::OK.into_response()
            }
        }
    }
    let app = Router::new().route("/{*p}", post(handle)).with_state(mode);
    let (addr, task) = crate::util::serve_http(app).await;
    Flaky { addr, _task: task }
}

/// Accepts connections and resets them at once (RST via SO_LINGER 0).
async fn resetter() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            #[allow(deprecated)] // blocking on drop is what a reset needs, and it is instant here
            let _ = s.set_linger(Some(Duration::ZERO));
            drop(s);
        }
    });
    (addr, task)
}

fn req() -> DeliveryRequest {
    DeliveryRequest {
        topic: "t".into(),
        subscription: "s".into(),
        schema: EventSchema::EventGrid,
        events: vec![bytes::Bytes::from_static(b"{\"id\":\"1\"}")],
        attempt: 1,
        attempts_each: Vec::new(),
        batch_id: 1,
        trace: Default::default(),
        time_left: Vec::new(),
    }
}

#[tokio::test]
async fn real_receivers_each_status_class_hang_reset_and_retry_after() {
    gridlet::tls::install_default_provider();
    let client = gridlet::outbound::http::HttpClient::new(
        gridlet::tls::client_config(&gridlet::tls::OutboundTls {
            accept_any_server_cert: true,
            extra_roots_pem: None,
            identity: None,
        })
        .unwrap(),
        Duration::from_millis(800),
    );
    let sink = |addr: std::net::SocketAddr| {
        gridlet::outbound::post::WebhookSink::new(
            client.clone(),
            format!("http://{addr}/hook"),
            None,
            gridlet::outbound::post::TopicRewrite::None,
        )
    };
    let policy = gridlet::delivery::classify::StatusCodePolicy::Standard;
    let classify = |o: &Outcome| gridlet::delivery::classify::classify(policy, o, true);
    use gridlet::delivery::classify::Verdict;
    for code in [200u16, 201, 202, 203, 204] {
        let r = flaky(Mode::Status(code)).await;
        assert_eq!(
            sink(r.addr).send(&req()).await,
            Outcome::Delivered,
            "{code}"
        );
    }
    for (code, verdict) in [
        (400u16, Verdict::Refuse),
        (413, Verdict::Refuse),
        (408, Verdict::Retry { retry_after: None }),
        (404, Verdict::Retry { retry_after: None }),
        (500, Verdict::Retry { retry_after: None }),
        (502, Verdict::Retry { retry_after: None }),
        (205, Verdict::Retry { retry_after: None }),
        (302, Verdict::Retry { retry_after: None }),
    ] {
        let r = flaky(Mode::Status(code)).await;
        let o = sink(r.addr).send(&req()).await;
        assert_eq!(
            o,
            Outcome::failed(FailureKind::Status(code)),
            "{code} is a failure"
        );
        assert_eq!(classify(&o), verdict, "{code}");
    }
    let r = flaky(Mode::StatusRetryAfterSecs(429, 42)).await;
    let o = sink(r.addr).send(&req()).await;
    assert_eq!(
        classify(&o),
        Verdict::Retry {
            retry_after: Some(Duration::from_secs(42))
        }
    );
    let r = flaky(Mode::StatusRetryAfterDate(503, 120)).await;
    let o = sink(r.addr).send(&req()).await;
    match classify(&o) {
        Verdict::Retry {
            retry_after: Some(d),
        } => assert!(
            d > Duration::from_secs(100) && d <= Duration::from_secs(120),
            "{d:?}"
        ),
        other => panic!("{other:?}"),
    }
    let r = flaky(Mode::Hang).await;
    assert_eq!(
        sink(r.addr).send(&req()).await,
        Outcome::failed(FailureKind::Timeout)
    );
    let (addr, _t) = resetter().await;
    let o = sink(addr).send(&req()).await;
    assert!(
        matches!(
            o,
            Outcome::Failed {
                kind: FailureKind::Connect | FailureKind::Other(_),
                ..
            }
        ),
        "{o:?}"
    );
    assert_eq!(classify(&o), Verdict::Retry { retry_after: None });
    // Nothing listening.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    assert_eq!(
        sink(closed).send(&req()).await,
        Outcome::failed(FailureKind::Connect)
    );
}

// ---------------------------------------------------------------------------------------------
// End to end over HTTP: dead letters, dead-letter webhook, health API, signing, isolation
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn dead_letters_listed_forwarded_and_replayed_end_to_end() {
    let t = start(&[("broker__statusCodePolicy", "standard")]).await;
    let mut rx = Receiver::start().await;
    let mut dl_rx = Receiver::start().await;
    t.topic("t1").await;
    t.webhook_sub(
        "t1",
        "s1",
        &rx.url("/hook"),
        json!({"retryPolicy": {"maxDeliveryAttempts": 1},
               "deadLetterDestination": {"endpointType": "WebHook", "properties": {"endpointUrl": dl_rx.url("/dl")}}}),
    )
    .await;
    let (_, sub) = t.get("/topics/t1/eventSubscriptions/s1").await;
    assert_eq!(
        sub["properties"]["deadLetterDestination"]["properties"]["endpointUrl"],
        dl_rx.url("/dl")
    );
    rx.respond_with(500);
    t.publish("t1", json!([eg_event("e1", "s", "x", json!({"n": 1}))]))
        .await;
    rx.next().await;
    rx.respond_with(400);
    t.publish("t1", json!([eg_event("e2", "s", "x", json!({"n": 2}))]))
        .await;
    rx.next().await;
    let lbl = "topic=\"t1\",subscription=\"s1\"";
    t.wait_metrics("two dead letters", |m| {
        metric(m, "gridlet_dead_lettered_events_total", lbl) == Some(2)
    })
    .await;
    // Listed, with reason, status and attempt count.
    let (s, list) = t.get("/topics/t1/eventSubscriptions/s1/deadLetters").await;
    assert_eq!(s, 200, "{list}");
    let v = list["value"].as_array().unwrap();
    assert_eq!(v.len(), 2);
    assert_eq!(v[0]["eventId"], "e1");
    assert_eq!(v[0]["reason"], "MaxDeliveryAttemptsExceeded");
    assert_eq!(v[0]["lastHttpStatusCode"], 500);
    assert_eq!(v[1]["reason"], "DeliveryRefused");
    assert_eq!(v[1]["lastHttpStatusCode"], 400);
    assert_eq!(v[1]["deliveryAttempts"], 1);
    assert_eq!(v[1]["event"]["data"]["n"], 2);
    // Forwarded to the dead-letter webhook.
    let mut forwarded = Vec::new();
    while forwarded.len() < 2 {
        let r = dl_rx.next().await;
        forwarded.extend(r.json().as_array().unwrap().clone());
    }
    assert_eq!(forwarded[0]["eventId"], "e1");
    assert_eq!(forwarded[1]["reason"], "DeliveryRefused");
    // Paging.
    let first_id = v[0]["id"].as_str().unwrap().to_string();
    let (_, page) = t
        .get(&format!(
            "/topics/t1/eventSubscriptions/s1/deadLetters?after={first_id}&top=1"
        ))
        .await;
    assert_eq!(page["value"][0]["eventId"], "e2");
    // Replay one by id, then the rest, once the endpoint works again.
    rx.respond_with(200);
    let (s, r) = t
        .post_json(
            &format!("/topics/t1/eventSubscriptions/s1/deadLetters/{first_id}/replay"),
            &json!({}),
        )
        .await;
    assert_eq!((s, r["replayed"].clone()), (200, json!(1)));
    assert_eq!(rx.next().await.json()[0]["id"], "e1");
    let (s, r) = t
        .post_json(
            "/topics/t1/eventSubscriptions/s1/deadLetters/replay",
            &json!({}),
        )
        .await;
    assert_eq!((s, r["replayed"].clone()), (200, json!(1)));
    assert_eq!(rx.next().await.json()[0]["id"], "e2");
    let (_, list) = t.get("/topics/t1/eventSubscriptions/s1/deadLetters").await;
    assert_eq!(list["value"].as_array().unwrap().len(), 0);
    let m = t
        .wait_metrics("replayed deliveries", |m| {
            metric(m, "DeliverySuccessCounts", lbl) == Some(2)
        })
        .await;
    assert_eq!(
        metric(&m, "gridlet_dead_letters_replayed_total", lbl),
        Some(2)
    );
    assert_eq!(metric(&m, "gridlet_dead_letters", lbl), Some(0));
    assert_eq!(
        metric(
            &m,
            "gridlet_dropped_events_total",
            &format!("{lbl},reason=\"DeliveryRefused\"")
        ),
        Some(1)
    );
    // Unknown ids and subscriptions.
    let (s, _) = t
        .post_json(
            "/topics/t1/eventSubscriptions/s1/deadLetters/999/replay",
            &json!({}),
        )
        .await;
    assert_eq!(s, 404);
    let (s, _) = t
        .get("/topics/t1/eventSubscriptions/nope/deadLetters")
        .await;
    assert_eq!(s, 404);
}

#[tokio::test]
async fn endpoint_health_over_http_disabled_frozen_and_reenabled_through_the_api() {
    let t = start(&[
        ("broker__endpointHealth__disableConsecutiveFailures", "3"),
        ("broker__endpointHealth__freezeAnyConsecutiveFailures", "3"),
        ("broker__endpointHealth__probeIntervalInSeconds", "1"),
    ])
    .await;
    let mut rx = Receiver::start().await;
    rx.respond_with(500);
    t.topic("t1").await;
    t.webhook_sub(
        "t1",
        "s1",
        &rx.url("/h"),
        json!({"retryPolicy": {"maxDeliveryAttempts": 1}}),
    )
    .await;
    let (_, sub) = t.get("/topics/t1/eventSubscriptions/s1").await;
    assert!(
        sub["properties"].get("endpointHealth").is_none(),
        "healthy: GET is the PUT answer"
    );
    let (_, h) = t
        .get("/topics/t1/eventSubscriptions/s1/endpointHealth")
        .await;
    assert_eq!(h["state"], "Enabled");
    let lbl = "topic=\"t1\",subscription=\"s1\"";
    for i in 0..3 {
        t.publish(
            "t1",
            json!([eg_event(&format!("e{i}"), "s", "x", json!({}))]),
        )
        .await;
        rx.next().await;
    }
    t.wait_metrics("disabled", |m| {
        metric(m, "gridlet_endpoint_health_state", lbl) == Some(1)
    })
    .await;
    let (_, sub) = t.get("/topics/t1/eventSubscriptions/s1").await;
    assert_eq!(sub["properties"]["endpointHealth"]["state"], "Disabled");
    assert_eq!(
        sub["properties"]["endpointHealth"]["consecutiveFailures"],
        3
    );
    // The record is not polluted by live state.
    assert!(sub["properties"]["endpointHealth"]["nextProbeTime"].is_string());
    // A new event waits for the probe (≈1 s), which fails: frozen (> 3 consecutive).
    t.publish("t1", json!([eg_event("p", "s", "x", json!({}))]))
        .await;
    rx.next().await;
    t.wait_metrics("frozen", |m| {
        metric(m, "gridlet_endpoint_health_state", lbl) == Some(2)
    })
    .await;
    t.publish("t1", json!([eg_event("w", "s", "x", json!({}))]))
        .await;
    rx.nothing_within(Duration::from_millis(1500)).await;
    // Re-enabled through the API: the waiting event goes at once.
    rx.respond_with(200);
    let (s, h) = t
        .post_json(
            "/topics/t1/eventSubscriptions/s1/endpointHealth/enable",
            &json!({}),
        )
        .await;
    assert_eq!((s, h["state"].clone()), (200, json!("Enabled")));
    assert_eq!(rx.next().await.json()[0]["id"], "w");
    let (_, h) = t
        .get("/topics/t1/eventSubscriptions/s1/endpointHealth")
        .await;
    assert_eq!(h["state"], "Enabled");
}

#[tokio::test]
async fn signed_deliveries_and_static_headers() {
    let t = start(&[]).await;
    let mut rx = Receiver::start().await;
    t.topic("t1").await;
    let secret = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    let old = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    t.webhook_sub(
        "t1",
        "s1",
        &rx.url("/h"),
        json!({"destination": {"endpointType": "WebHook", "properties": {
            "endpointUrl": rx.url("/h"),
            "signingSecrets": [secret, old],
            "deliveryAttributeMappings": [
                {"name": "X-Tenant", "type": "Static", "properties": {"value": "acme"}},
                {"name": "Authorization", "type": "Static", "properties": {"value": "Bearer s3cret", "isSecret": true}}
            ]}}}),
    )
    .await;
    t.publish("t1", json!([eg_event("e1", "s", "x", json!({"a": 1}))]))
        .await;
    let r = rx.next().await;
    let h = |n: &str| r.headers.get(n).unwrap().to_str().unwrap().to_string();
    assert_eq!(h("x-tenant"), "acme");
    assert_eq!(h("authorization"), "Bearer s3cret");
    let id = h("webhook-id");
    assert!(id.starts_with("msg_") && !id.contains('.'), "{id}");
    let ts: u64 = h("webhook-timestamp").parse().unwrap();
    let expected = gridlet::outbound::signing::Signer::new(&[secret, old])
        .unwrap()
        .sign(&id, ts, &r.body);
    assert_eq!(h("webhook-signature"), expected);
    assert_eq!(
        h("webhook-signature").split(' ').count(),
        2,
        "both secrets sign"
    );
    // Unsigned subscriptions carry no signature headers.
    t.webhook_sub("t1", "s2", &rx.url("/plain"), json!({}))
        .await;
    t.publish("t1", json!([eg_event("e2", "s", "x", json!({}))]))
        .await;
    let mut got = [rx.next().await, rx.next().await];
    got.sort_by_key(|r| r.path.clone());
    assert_eq!(got[1].path, "/plain");
    assert!(got[1].headers.get("webhook-signature").is_none());
}

#[tokio::test]
async fn hanging_and_resetting_endpoints_do_not_slow_a_healthy_subscription() {
    // Small pools make starvation visible: 3 hanging subscriptions could take 12 of 16 permits.
    let t = start(&[
        ("broker__maxInFlightPerSubscription", "4"),
        ("broker__maxInFlightTotal", "16"),
        ("broker__deliveryTimeoutInSeconds", "60"),
    ])
    .await;
    let hang: Vec<Flaky> = futures_util::future::join_all((0..3).map(|_| flaky(Mode::Hang))).await;
    let (reset_addr, _rt) = resetter().await;
    let mut rx = Receiver::start().await;
    t.topic("t1").await;
    for (i, h) in hang.iter().enumerate() {
        t.webhook_sub(
            "t1",
            &format!("hang{i}"),
            &format!("http://{}/h", h.addr),
            json!({}),
        )
        .await;
    }
    t.webhook_sub("t1", "reset", &format!("http://{reset_addr}/r"), json!({}))
        .await;
    t.webhook_sub("t1", "ok", &rx.url("/ok"), json!({})).await;
    let n = 200;
    let started = std::time::Instant::now();
    for chunk in 0..(n / 20) {
        let evs: Vec<Value> = (0..20)
            .map(|i| eg_event(&format!("e{}", chunk * 20 + i), "s", "x", json!({})))
            .collect();
        t.publish("t1", Value::Array(evs)).await;
    }
    for _ in 0..n {
        rx.next().await;
    }
    let took = started.elapsed();
    // Starved, the healthy subscription would wait for the hanging ones' 60 s delivery
    // timeout; half of it tells the two apart without depending on the machine's speed.
    assert!(
        took < Duration::from_secs(30),
        "healthy deliveries took {took:?}"
    );
    let m = t.metrics().await;
    let inflight = |s: &str| {
        metric(
            &m,
            "gridlet_in_flight_requests",
            &format!("topic=\"t1\",subscription=\"{s}\""),
        )
        .unwrap()
    };
    for i in 0..3 {
        assert!(inflight(&format!("hang{i}")) <= 4, "per-subscription bound");
    }
}

#[tokio::test]
async fn a_full_queue_behind_a_hanging_endpoint_rejects_or_dead_letters_per_policy() {
    for policy in ["reject", "deadLetter"] {
        let t = start(&[
            ("broker__maxPendingEventsPerSubscription", "5"),
            ("broker__queueFullPolicy", policy),
        ])
        .await;
        let hang = flaky(Mode::Hang).await;
        let mut rx = Receiver::start().await;
        t.topic("t1").await;
        t.webhook_sub("t1", "hang", &format!("http://{}/h", hang.addr), json!({}))
            .await;
        t.webhook_sub("t1", "ok", &rx.url("/ok"), json!({})).await;
        let mut accepted = 0;
        for i in 0..20 {
            let (s, _) = t
                .post_json(
                    "/topics/t1/events",
                    &json!([eg_event(&format!("e{i}"), "s", "x", json!({}))]),
                )
                .await;
            if s == 200 {
                accepted += 1;
                rx.next().await;
            } else {
                assert_eq!(s, 503);
            }
        }
        let (_, dl) = t
            .get("/topics/t1/eventSubscriptions/hang/deadLetters")
            .await;
        let dl = dl["value"].as_array().unwrap().clone();
        if policy == "reject" {
            assert_eq!(
                accepted, 5,
                "the original: the shared topic stops at the bound"
            );
            assert!(dl.is_empty());
        } else {
            assert_eq!(accepted, 20, "the healthy subscription keeps receiving");
            assert_eq!(dl.len(), 15);
            assert_eq!(dl[0]["reason"], "QueueFull");
            assert_eq!(dl[0]["deliveryAttempts"], 0);
            let m = t.metrics().await;
            assert_eq!(
                metric(
                    &m,
                    "gridlet_dropped_events_total",
                    "topic=\"t1\",subscription=\"hang\",reason=\"QueueFull\""
                ),
                Some(15)
            );
        }
    }
}

#[tokio::test]
async fn the_memory_budget_refuses_publishes_for_in_memory_subscriptions_until_bytes_are_freed() {
    let t = start(&[("broker__maxPendingBytes", "20000")]).await;
    let hang = flaky(Mode::Hang).await;
    let mut rx = Receiver::start().await;
    t.topic("t1").await;
    t.topic("t2").await;
    t.webhook_sub("t1", "hang", &format!("http://{}/h", hang.addr), json!({}))
        .await;
    t.webhook_sub(
        "t2",
        "kept",
        &format!("http://{}/h", hang.addr),
        json!({"persistencePolicy": {"isPersisted": true}}),
    )
    .await;
    let big = "x".repeat(4000);
    let event = |i: usize| json!([eg_event(&format!("e{i}"), "s", "x", json!({ "pad": big }))]);
    // Undelivered events pile up behind the hanging endpoint until about 20 KB are held.
    let mut accepted = 0;
    let mut refused = None;
    for i in 0..20 {
        let r = t
            .client
            .post(t.url("/topics/t1/events"))
            .json(&event(i))
            .send()
            .await
            .unwrap();
        if r.status() == 200 {
            accepted += 1;
        } else {
            refused = Some(r);
            break;
        }
    }
    assert!(
        (4..=5).contains(&accepted),
        "{accepted} events of ~4 KB accepted"
    );
    let r = refused.expect("a publish was refused");
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "10");
    let body: serde_json::Value = r.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("broker__maxPendingBytes"),
        "{body}"
    );
    let held: u64 = t
        .metrics()
        .await
        .lines()
        .find_map(|l| l.strip_prefix("gridlet_pending_event_bytes "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the gauge is exported");
    assert!((16_000..=20_000).contains(&held), "{held} bytes held");
    // A persisted subscription is bounded on disk instead: its publishes still go through.
    let (s, b) = t.post_json("/topics/t2/events", &event(100)).await;
    assert_eq!(s, 200, "{b}");

    // Deleting the stuck subscription frees its events; publishing works again.
    let (s, _) = t.delete("/topics/t1/eventSubscriptions/hang").await;
    assert_eq!(s, 200);
    t.webhook_sub("t1", "ok", &rx.url("/ok"), json!({})).await;
    t.publish("t1", event(200)).await;
    assert_eq!(rx.next().await.json()[0]["id"], "e200");
}

#[tokio::test]
async fn a_dead_letter_replay_into_memory_stays_within_the_memory_budget() {
    let t = start(&[("broker__maxPendingBytes", "10000")]).await;
    let mut rx = Receiver::start().await;
    rx.respond_with(500);
    t.topic("t1").await;
    t.webhook_sub(
        "t1",
        "s1",
        &rx.url("/s1"),
        json!({"retryPolicy": {"maxDeliveryAttempts": 1}}),
    )
    .await;
    let big = "x".repeat(4000);
    for i in 0..3 {
        t.publish(
            "t1",
            json!([eg_event(&format!("e{i}"), "s", "x", json!({ "pad": big }))]),
        )
        .await;
        rx.next().await;
    }
    let lbl = "topic=\"t1\",subscription=\"s1\"";
    t.wait_metrics("three dead letters", |m| {
        metric(m, "gridlet_dead_lettered_events_total", lbl) == Some(3)
    })
    .await;
    rx.respond_with(200);
    // All three (~12 KB) would pass the 10 KB bound: refused, and nothing is taken.
    let (s, r) = t
        .post_json(
            "/topics/t1/eventSubscriptions/s1/deadLetters/replay",
            &json!({}),
        )
        .await;
    assert_eq!(s, 503, "{r}");
    assert!(r.to_string().contains("broker__maxPendingBytes"), "{r}");
    let (_, list) = t.get("/topics/t1/eventSubscriptions/s1/deadLetters").await;
    let list = list["value"].as_array().unwrap().clone();
    assert_eq!(list.len(), 3, "a refused replay keeps every letter");
    // One of them fits.
    let id = list[0]["id"].as_str().unwrap();
    let (s, r) = t
        .post_json(
            &format!("/topics/t1/eventSubscriptions/s1/deadLetters/{id}/replay"),
            &json!({}),
        )
        .await;
    assert_eq!((s, r["replayed"].clone()), (200, json!(1)));
    assert_eq!(rx.next().await.json()[0]["id"], "e0");
}

/// A receiver answering from a seeded random stream: 200, 204, 400, 413, 429 (+Retry-After),
/// 500, 503, or 200 after a 300 ms stall; counts the events it acknowledged with 2xx.
async fn random_receiver(seed: u64) -> (std::net::SocketAddr, Arc<AtomicU64>) {
    let rng = Arc::new(Mutex::new(Rng(seed)));
    let acked = Arc::new(AtomicU64::new(0));
    let a = acked.clone();
    let app = Router::new().route(
        "/{*p}",
        post(move |body: bytes::Bytes| {
            let rng = rng.clone();
            let acked = a.clone();
            async move {
                let r = rng.lock().unwrap().next() % 8;
                let n = serde_json::from_slice::<Vec<Value>>(&body).map_or(0, |v| v.len()) as u64;
                let status = match r {
                    0 | 1 => 200,
                    2 => 204,
                    3 => 400,
                    4 => 413,
                    5 => {
                        let mut resp = StatusCode::TOO_MANY_REQUESTS.into_response();
                        resp.headers_mut()
                            .insert("retry-after", HeaderValue::from_static("1"));
                        return resp;
                    }
                    6 => 500 + (r as u16 % 4),
                    _ => {
                        tokio::time::sleep(Duration::from_millis(300)).await; // a stalled answer
                        200
                    }
                };
                if (200..=204).contains(&status) {
                    acked.fetch_add(n, Ordering::Relaxed);
                }
                StatusCode::from_u16(status).unwrap().into_response()
            }
        }),
    );
    let (addr, _) = crate::util::serve_http(app).await;
    (addr, acked)
}

#[tokio::test]
async fn chaos_with_real_receivers_failing_randomly() {
    // TTL 2 s: a failed event's next retry (≥ 10 s away) is past its TTL, so every event
    // settles after one attempt and the test runs in real time without waiting for schedules
    // (the paused-clock chaos test covers retries).
    let t = start(&[
        ("broker__defaultEventTimeToLiveInSeconds", "2"),
        ("broker__endpointHealth__enabled", "false"),
    ])
    .await;
    t.topic("t1").await;
    let mut receivers = Vec::new();
    let subs = [
        ("plain", json!({})),
        (
            "std",
            json!({"retryPolicy": {"statusCodePolicy": "standard"}}),
        ),
        ("a_only", json!({"filter": {"subjectBeginsWith": "a"}})),
        (
            "batched",
            json!({"retryPolicy": {"statusCodePolicy": "standard", "maxDeliveryAttempts": 1}}),
        ),
    ];
    for (i, (name, extra)) in subs.iter().enumerate() {
        let (addr, acked) = random_receiver(0xC0FFEE + i as u64).await;
        let mut extra = extra.clone();
        let url = format!("http://{addr}/{name}");
        if *name == "batched" {
            extra["destination"] = json!({"endpointType": "WebHook",
                "properties": {"endpointUrl": url, "maxEventsPerBatch": 5}});
        }
        t.webhook_sub("t1", name, &url, extra).await;
        receivers.push((*name, acked));
    }
    let mut expected: HashMap<&str, u64> = HashMap::new();
    for round in 0..30 {
        let subject = if round % 3 == 0 { "b/1" } else { "a/1" };
        let evs: Vec<Value> = (0..10)
            .map(|i| eg_event(&format!("e{round}-{i}"), subject, "x", json!({})))
            .collect();
        t.publish("t1", Value::Array(evs)).await;
        for (name, _) in &subs {
            if *name != "a_only" || subject.starts_with('a') {
                *expected.entry(name).or_default() += 10;
            }
        }
    }
    let pending_zero = |m: &str| {
        subs.iter().all(|(n, _)| {
            metric(
                m,
                "gridlet_pending_events",
                &format!("topic=\"t1\",subscription=\"{n}\""),
            ) == Some(0)
        })
    };
    let m = t.wait_metrics("every event settled", pending_zero).await;
    for (name, acked) in &receivers {
        let l = format!("topic=\"t1\",subscription=\"{name}\"");
        let get = |f: &str| metric(&m, f, &l).unwrap_or(0);
        let reason = |r: &str| {
            metric(
                &m,
                "gridlet_dropped_events_total",
                &format!("{l},reason=\"{r}\""),
            )
            .unwrap_or(0)
        };
        let delivered = get("DeliverySuccessCounts");
        let dropped = reason("MaxDeliveryAttemptsExceeded")
            + reason("TimeToLiveExceeded")
            + reason("DeliveryRefused")
            + reason("QueueFull");
        let want = expected[name];
        assert_eq!(get("gridlet_enqueued_events_total"), want, "{name}");
        assert_eq!(
            delivered + dropped,
            want,
            "{name}: delivered {delivered} + dead-lettered {dropped}"
        );
        assert_eq!(get("gridlet_dead_lettered_events_total"), dropped, "{name}");
        assert_eq!(
            acked.load(Ordering::Relaxed),
            delivered,
            "{name}: receiver acks = delivered"
        );
        assert!(
            delivered > 0 && dropped > 0,
            "{name}: a real mix ({delivered}/{dropped})"
        );
    }
    // Under `original`, 400s are retried (then expire); under `standard` they are refused.
    let refused = |n: &str| {
        metric(
            &m,
            "gridlet_dropped_events_total",
            &format!("topic=\"t1\",subscription=\"{n}\",reason=\"DeliveryRefused\""),
        )
    };
    assert_eq!(refused("plain"), Some(0));
    assert!(refused("std").unwrap() > 0);
}

/// Dead letters stay under `broker__deadLetter__maxBytes`, all subscriptions together, with
/// either store (issue 14): a subscription that floods dead letters gives up its oldest ones,
/// and a quiet subscription's letters are left alone (the one holding the most bytes pays).
#[tokio::test]
async fn dead_letters_stay_within_the_byte_bound() {
    const MAX: usize = 65_536;
    for store in ["sled", "memory"] {
        let t = start(&[
            ("broker__statusCodePolicy", "standard"),
            ("broker__maxInFlightPerSubscription", "1"),
            ("broker__deadLetter__maxBytes", "65536"),
            ("persistence__store", store),
        ])
        .await;
        let rx = Receiver::start().await;
        rx.respond_with(400); // refused: dead-lettered at the first attempt
        t.topic("quiet").await;
        t.topic("loud").await;
        t.webhook_sub("quiet", "q", &rx.url("/q"), json!({})).await;
        t.webhook_sub("loud", "l", &rx.url("/l"), json!({})).await;
        let quiet: Vec<Value> = (0..3)
            .map(|i| eg_event(&format!("q{i}"), "s", "x", json!({"pad": "q".repeat(2000)})))
            .collect();
        t.publish("quiet", json!(quiet)).await;
        let q_lbl = "topic=\"quiet\",subscription=\"q\"";
        t.wait_metrics("the quiet letters", |m| {
            metric(m, "gridlet_dead_lettered_events_total", q_lbl) == Some(3)
        })
        .await;
        // 100 letters of ≈ 4 KB: about 400 KB offered against a 64 KiB bound.
        for chunk in 0..5 {
            let events: Vec<Value> = (0..20)
                .map(|i| {
                    let n = chunk * 20 + i;
                    eg_event(&format!("l{n}"), "s", "x", json!({"pad": "l".repeat(4000)}))
                })
                .collect();
            t.publish("loud", json!(events)).await;
        }
        let l_lbl = "topic=\"loud\",subscription=\"l\"";
        let m = t
            .wait_metrics("the loud letters", |m| {
                metric(m, "gridlet_dead_lettered_events_total", l_lbl) == Some(100)
            })
            .await;
        let list = |sub: &'static str, topic: &'static str| {
            let t = &t;
            async move {
                let path = format!("/topics/{topic}/eventSubscriptions/{sub}/deadLetters?top=1000");
                let (s, body) = t.get(&path).await;
                assert_eq!(s, 200, "{body}");
                body["value"].as_array().unwrap().clone()
            }
        };
        let (q, l) = (list("q", "quiet").await, list("l", "loud").await);
        let bytes: usize = q
            .iter()
            .chain(&l)
            .map(|v| v["event"].to_string().len())
            .sum();
        let ids: Vec<&str> = l.iter().map(|v| v["eventId"].as_str().unwrap()).collect();
        eprintln!(
            "{store}: {} loud + {} quiet letters kept, {bytes} event bytes (bound {MAX})",
            l.len(),
            q.len()
        );
        assert!(bytes <= MAX, "{store}: {bytes} bytes of letters kept");
        assert_eq!(
            q.len(),
            3,
            "{store}: the quiet subscription keeps its letters"
        );
        assert!(
            l.len() >= 8,
            "{store}: the loud one keeps its newest: {ids:?}"
        );
        let newest: Vec<String> = (100 - l.len()..100).map(|n| format!("l{n}")).collect();
        assert_eq!(ids, newest, "{store}: oldest evicted first");
        assert_eq!(
            metric(&m, "gridlet_dead_letters_evicted_total", l_lbl),
            Some(100 - l.len() as u64),
            "{store}"
        );
        assert_eq!(
            metric(&m, "gridlet_dead_letters", l_lbl),
            Some(l.len() as u64)
        );
        let held: u64 = m
            .lines()
            .find_map(|l| l.strip_prefix("gridlet_dead_letter_bytes "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap();
        assert!(
            held as usize <= MAX && held as usize >= bytes,
            "{store}: {held}"
        );
    }
}
