//! Issue 20, "Trust, second pass": availability under floods and the bounds that go with it
//! (the credential and protocol items are in `trust.rs`). Each test failed on the code before
//! its fix, except the measurement.

use crate::util::{eg_event, start, Receiver};
use serde_json::{json, Value};
use std::time::Duration;

/// Medium 5: 3,000 sockets that connect and send nothing, against the default cap (1,024) and
/// idle timeout (30 s): at the cap the oldest idle connections make room, so `/healthz` and a
/// publish on fresh connections are answered within 2 s, and the event is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_sockets_leaves_health_and_publishing_answered_within_2_s() {
    let t = start(&[]).await;
    let mut rx = Receiver::start().await;
    t.topic("t").await;
    t.webhook_sub("t", "s", &rx.url("/s"), json!({})).await;
    let addr = t.g.http_addr.unwrap();
    let mut idle = Vec::with_capacity(3_000);
    for _ in 0..3_000 {
        let s = tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
            .await
            .expect("connects within 5 s (the listener keeps accepting)")
            .unwrap();
        idle.push(s);
    }
    let fresh = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let within = Duration::from_secs(2);
    let r = tokio::time::timeout(within, fresh.get(format!("{}/healthz", t.base)).send())
        .await
        .expect("/healthz answers within 2 s")
        .unwrap();
    assert_eq!(r.status(), 200);
    let events = json!([eg_event("e1", "s", "t", json!({}))]);
    let r = tokio::time::timeout(
        within,
        fresh.post(t.url("/topics/t/events")).json(&events).send(),
    )
    .await
    .expect("a publish is answered within 2 s")
    .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(rx.next().await.json()[0]["id"], "e1");
    drop(idle);
}

/// Medium 6: request bodies being read share one budget (`inbound__maxBodyBytesInFlight`):
/// while a slow client holds it, another publish waits briefly, then gets 503 + `Retry-After`;
/// once the slow body completes, publishing goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_in_flight_share_one_budget() {
    use tokio::io::AsyncWriteExt;
    let t = start(&[
        ("inbound__maxBodyBytesInFlight", "4096"),
        ("broker__maxRequestBodyBytes", "4096"),
    ])
    .await;
    t.topic("t").await;
    let mut slow = tokio::net::TcpStream::connect(t.g.http_addr.unwrap())
        .await
        .unwrap();
    let head = format!(
        "POST /topics/t/events?{} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n[",
        crate::util::V
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    let events = json!([eg_event("e1", "s", "e", json!({}))]);
    let refused =
        crate::util::eventually("a publish refused while the budget is taken", || async {
            let r = t
                .client
                .post(t.url("/topics/t/events"))
                .json(&events)
                .send()
                .await
                .unwrap();
            match r.status().as_u16() {
                503 => Ok(r),
                s => Err(format!("{s}")),
            }
        })
        .await;
    assert!(refused.headers().contains_key("retry-after"));
    let text = refused.text().await.unwrap();
    assert!(text.contains("maxBodyBytesInFlight"), "{text}");
    // The slow body completes (its 400 does not matter): the budget is free again.
    slow.write_all(&vec![b' '; 3999]).await.unwrap();
    let mut answer = Vec::new();
    use tokio::io::AsyncReadExt;
    let _ = tokio::time::timeout(Duration::from_secs(5), slow.read_buf(&mut answer)).await;
    let (s, b) = t.post_json("/topics/t/events", &events).await;
    assert_eq!(s, 200, "{b}");
}

/// Low 9: a page asked for more than the page limit (1,000) is cut to it and says where the
/// next one starts (it answered 1,000 letters and `nextAfter: null` with 1,500 kept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_page_over_the_limit_still_points_to_the_next() {
    let t = start(&[]).await;
    t.topic("t").await;
    let failing = crate::util::failing_endpoint("/refused").await;
    t.webhook_sub(
        "t",
        "s",
        &failing,
        json!({"retryPolicy": {"maxDeliveryAttempts": 1}, "deliveryPolicy": {"maxEventsPerBatch": 50}}),
    )
    .await;
    for chunk in 0..3 {
        let evs: Vec<Value> = (0..500)
            .map(|i| eg_event(&format!("{chunk}-{i}"), "s", "e", json!({})))
            .collect();
        t.publish("t", Value::Array(evs)).await;
    }
    t.wait_metric(
        "gridlet_dead_letters",
        "topic=\"t\",subscription=\"s\"",
        1500,
    )
    .await;
    let (s, page) = t
        .get("/topics/t/eventSubscriptions/s/deadLetters?top=5000")
        .await;
    assert_eq!(s, 200, "{page}");
    assert_eq!(page["value"].as_array().unwrap().len(), 1000);
    let next = page["nextAfter"].as_str().expect("a next page").to_string();
    let (_, rest) = t
        .get(&format!(
            "/topics/t/eventSubscriptions/s/deadLetters?top=5000&after={next}"
        ))
        .await;
    assert_eq!(rest["value"].as_array().unwrap().len(), 500);
    assert_eq!(rest["nextAfter"], Value::Null);
}

/// Low 11: a subscription to gridlet's own API (with auth off, an event loop or a way around
/// the API's checks) is refused at connect time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gridlet_never_delivers_to_its_own_listeners() {
    let t = start(&[]).await;
    t.topic("t").await;
    let own = format!("{}/topics/t/events?{}", t.base, crate::util::V);
    let localhost = own.replace("127.0.0.1", "localhost");
    t.webhook_sub("t", "self", &own, json!({})).await;
    t.webhook_sub("t", "self2", &localhost, json!({})).await;
    t.publish("t", json!([eg_event("1", "s", "e", json!({}))]))
        .await;
    for s in ["self", "self2"] {
        let labels = format!("topic=\"t\",subscription=\"{s}\"");
        t.wait_metric("DeliveryFailureCounts", &labels, 1).await;
    }
    let m = t.metrics().await;
    assert_eq!(
        crate::util::metric(&m, "EventsReceived", "topic=\"t\""),
        Some(1)
    );
}

/// Low 17: dead-letter forwarding is isolated per subscription: letters for a dead-letter
/// webhook that accepts connections and never answers do not hold up another subscription's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_dead_letter_destination_does_not_stall_the_others() {
    let hang = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hang_addr = hang.local_addr().unwrap();
    let _hang = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = hang.accept().await {
            held.push(s);
        }
    });
    let mut letters = Receiver::start().await;
    let t = start(&[]).await;
    t.topic("a").await;
    t.topic("b").await;
    let failing = crate::util::failing_endpoint("/refused").await;
    let sub = |dl: String| {
        json!({"properties": {
            "destination": {"endpointType": "WebHook", "properties": {"endpointUrl": failing}},
            "retryPolicy": {"maxDeliveryAttempts": 1},
            "deadLetterDestination": {"endpointType": "WebHook", "properties": {"endpointUrl": dl}}}})
    };
    let (s, b) = t
        .put(
            "/topics/a/eventSubscriptions/hanging",
            sub(format!("http://{hang_addr}/letters")),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    t.publish("a", json!([eg_event("a1", "s", "e", json!({}))]))
        .await;
    t.wait_metric(
        "gridlet_dead_letters",
        "topic=\"a\",subscription=\"hanging\"",
        1,
    )
    .await;
    let (s, b) = t
        .put(
            "/topics/b/eventSubscriptions/ok",
            sub(letters.url("/letters")),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    t.publish("b", json!([eg_event("b1", "s", "e", json!({}))]))
        .await;
    let got = letters.next().await;
    assert_eq!(got.path, "/letters");
    assert!(String::from_utf8_lossy(&got.body).contains("b1"));
}

/// Low 13, measurement (run by hand with `--ignored --nocapture`; `SUBS`, default 10): one
/// publish of an event with a 1 MB string, routed to `SUBS` subscriptions with 25 advanced
/// string filters each (`StringNotIn`, `StringBeginsWith`, `StringEndsWith` that pass, the last a
/// `StringIn` that fails), so every filter reads the value. Prints how long the publish took.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
#[ignore = "measurement; prints numbers"]
async fn measure_advanced_string_filters_worst_case() {
    let subs: usize = std::env::var("SUBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let t = start(&[("broker__maxRequestBodyBytes", "2000000")]).await;
    let rx = Receiver::start().await;
    t.topic("w").await;
    let values: Vec<String> = (0..25).map(|i| format!("zz{i:03}")).collect();
    let ops = ["StringNotIn", "StringBeginsWith", "StringEndsWith"];
    // The last filter fails: every filter is read, no subscription matches (so the measure is
    // routing alone, not copies of the event for matching subscriptions).
    let filters: Vec<Value> = (0..25)
        .map(|i| {
            if i == 24 {
                return json!({"operatorType": "StringIn", "key": "data.s", "values": values});
            }
            let op = ops[i % 3];
            let values = if op == "StringNotIn" {
                values.clone()
            } else {
                vec!["A".repeat(400)]
            };
            json!({"operatorType": op, "key": "data.s", "values": values})
        })
        .collect();
    for s in 0..subs {
        t.webhook_sub(
            "w",
            &format!("s{s}"),
            &rx.url("/w"),
            json!({"filter": {"advancedFilters": filters}}),
        )
        .await;
    }
    let big = "A".repeat(1_000_000);
    let body = json!([eg_event("1", "s", "e", json!({"s": big}))]).to_string();
    let at = std::time::Instant::now();
    let r = t
        .client
        .post(t.url("/topics/w/events"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    println!(
        "subs={subs} x 25 string filters, 1 MB value: publish {} after {:?}",
        r.status(),
        at.elapsed()
    );
}
