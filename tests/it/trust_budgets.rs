//! Issue 37, "Trust, third pass", findings 3, 4, 6, 7 and 9: pull delivery within the shared
//! budgets, case-variant keys inside `data`, and the default caps. Each test failed on the code
//! before its fix (the long polls' process test is in `pull_process.rs`).

use crate::pull::{ns_post, publish_batch, queue_topic, receive, Ns};
use crate::util::{start, Receiver};
use serde_json::{json, Value};

/// The settle routes' body limit: 1,000 tokens of 43 characters, each quoted, followed by a
/// comma and up to 16 bytes of whitespace, in a 1 KiB envelope.
const SETTLE_LIMIT: usize = 1024 + 1000 * (43 + 2 + 1 + 16);

/// A settle body of exactly `len` bytes: 1,000 token-shaped strings, padded with spaces.
fn settle_body(len: usize) -> Vec<u8> {
    let tokens: Vec<String> = (0..1000).map(|i| format!("{i:0>43}")).collect();
    let mut b = serde_json::to_vec(&json!({ "lockTokens": tokens })).unwrap();
    let close = b.pop().unwrap();
    b.resize(len - 1, b' ');
    b.push(close);
    b
}

/// Finding 7: `:acknowledge`, `:release`, `:reject` and `:renewLock` read at most
/// [`SETTLE_LIMIT`] bytes (63,024), not `broker__maxRequestBodyBytes` (1 MiB): 1,000 tokens
/// with room for indentation pass, one byte more is 413 in the documented body, whether
/// declared (`Content-Length`) or streamed.
#[tokio::test]
async fn settle_bodies_are_limited_to_what_1000_lock_tokens_need() {
    let g = start(&[]).await;
    queue_topic(&g, "q", "s", json!({})).await;
    let ns = Ns::from(&g);
    publish_batch(&ns, "q", ["a".to_string()]).await;
    let got = receive(&ns, "q", "s", 1, 0).await;
    let sub = "/topics/q/eventsubscriptions/s";
    for op in ["acknowledge", "release", "reject", "renewLock"] {
        let (s, b) = ns_post(
            &ns,
            &format!("{sub}:{op}"),
            "application/json",
            settle_body(SETTLE_LIMIT),
        )
        .await;
        assert_eq!(s, 200, "{op} at the limit: {}", b["error"]);
        assert_eq!(b["failedLockTokens"].as_array().unwrap().len(), 1000);
        let (s, b) = ns_post(
            &ns,
            &format!("{sub}:{op}"),
            "application/json",
            settle_body(SETTLE_LIMIT + 1),
        )
        .await;
        assert_eq!(
            (s, b["error"]["details"][0]["code"].as_str()),
            (413, Some("PayloadTooLarge")),
            "{op} one byte over: {}",
            b["error"]
        );
        assert!(
            b["error"]["message"]
                .as_str()
                .unwrap()
                .contains(&SETTLE_LIMIT.to_string()),
            "{b}"
        );
    }
    // Streamed (no Content-Length): refused as soon as it passes the limit.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = settle_body(SETTLE_LIMIT + 1)
        .chunks(4096)
        .map(|c| Ok(c.to_vec()))
        .collect();
    let r = g
        .client
        .post(
            g.url(&format!("{sub}:acknowledge"))
                .replace(crate::util::V, crate::pull::NS),
        )
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 413);
    // The lock is untouched by all of it: acknowledging it works.
    let (s, b): (u16, Value) = ns_post(
        &ns,
        &format!("{sub}:acknowledge"),
        "application/json",
        serde_json::to_vec(&json!({"lockTokens": [got[0].0]})).unwrap(),
    )
    .await;
    assert_eq!((s, &b["succeededLockTokens"]), (200, &json!([got[0].0])));
}

/// Finding 6: `{"make":"Ducati","MAKE":"Evil"}` inside `data` passed `StringIn data.make
/// [Ducati]` and was delivered verbatim, while case-insensitive readers (.NET, Go) see `Evil`.
/// Now keys repeated in any case are refused at every depth a filter or a delivery attribute
/// can name: 400 `InvalidEvents` naming the path, for all three schemas and binary mode; nothing
/// of the request is delivered.
#[tokio::test]
async fn case_variant_keys_inside_data_are_refused_naming_the_path() {
    let t = start(&[]).await;
    let mut rx = Receiver::start().await;
    t.topic("t").await;
    let (s, b) = t
        .put(
            "/topics/ce",
            json!({"properties": {"inputSchema": "CloudEventSchemaV1_0"}}),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let filter = json!({"filter": {"advancedFilters": [
        {"operatorType": "StringIn", "key": "data.make", "values": ["Ducati"]}]}});
    t.webhook_sub("t", "s", &rx.url("/s"), filter).await;
    let eg = |id: &str, data: &str| {
        format!(
            r#"[{{"id":"{id}","subject":"s","eventType":"e","eventTime":"2017-08-10T21:03:07+00:00","dataVersion":"1.0","data":{data}}}]"#
        )
    };
    let post = |path: &str, ct: &str, body: String| {
        let mut r = t
            .client
            .post(t.url(path))
            .header("content-type", ct)
            .body(body);
        if ct == "application/octet-stream+json" {
            r = r.header("ce-specversion", "1.0");
        }
        r
    };
    let cases = [
        (
            post("/topics/t/events", "application/json", eg("1", r#"{"make":"Ducati","MAKE":"Evil"}"#)),
            "data.MAKE",
        ),
        (
            post("/topics/t/events", "application/json", eg("2", r#"{"make":"Ducati","car":{"Color":"red","color":"blue"}}"#)),
            "data.car.color",
        ),
        (
            post(
                "/topics/ce/events",
                "application/cloudevents+json",
                r#"{"specversion":"1.0","id":"3","source":"/s","type":"t","data":{"make":"a","mAkE":"b"}}"#.into(),
            ),
            "data.mAkE",
        ),
        (
            t.client
                .post(t.url("/topics/ce/events"))
                .header("content-type", "application/json")
                .header("ce-specversion", "1.0")
                .header("ce-id", "4")
                .header("ce-source", "/s")
                .header("ce-type", "t")
                .body(r#"{"make":"a","MAKE":"b"}"#),
            "data.MAKE",
        ),
    ];
    for (req, path) in cases {
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let b: Value = r.json().await.unwrap();
        assert_eq!(
            (status, b["error"]["details"]["code"].as_str()),
            (400, Some("InvalidEvents")),
            "{b}"
        );
        let msg = b["error"]["message"].as_str().unwrap();
        assert!(msg.contains(&format!("duplicate key '{path}'")), "{msg}");
    }
    // Inside arrays (no filter names them) and distinct keys: accepted and delivered.
    let r = post(
        "/topics/t/events",
        "application/json",
        eg(
            "ok",
            r#"{"make":"Ducati","list":[{"k":1,"K":2}],"model":{"make":"x"}}"#,
        ),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        rx.next().await.json()[0]["id"],
        "ok",
        "the refused were not delivered"
    );
}

/// Finding 4, the issue's probe scaled down: three persisted queue subscriptions each receive
/// 40 events of 256 KiB and settle none, under `broker__maxPendingBytes` = 8 MiB. Before, each
/// kept its own copy of every locked body outside that bound (the gauge passed 30 MB) and a
/// publish to an unrelated in-memory subscription got 503. Now a persisted lock keeps no body:
/// the gauge stays within the bound, the publish is accepted, and the locked bytes of each
/// subscription stop at `broker__maxLockedBytesPerSubscription` (here 5 MiB: 19 events of a
/// little over 256 KiB, and the one that passes it). Released, an event comes back read from the event log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locked_events_stay_within_the_memory_bound_and_a_per_subscription_bound() {
    let bound: u64 = 8 << 20;
    let g = start(&[
        ("broker__maxPendingBytes", "8388608"),
        ("broker__maxLockedBytesPerSubscription", "5242880"),
    ])
    .await;
    let ns = Ns::from(&g);
    queue_topic(&g, "q", "s0", json!({})).await;
    for sub in ["s1", "s2"] {
        let (s, b) = g
            .put(
                &format!("/topics/q/eventSubscriptions/{sub}"),
                json!({"properties":{"deliveryConfiguration":{"deliveryMode":"Queue"}}}),
            )
            .await;
        assert_eq!(s, 200, "{b}");
    }
    let (s, b) = g
        .put(
            "/topics/mem",
            json!({"properties":{"inputSchema":"CloudEventSchemaV1_0"}}),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = g
        .put(
            "/topics/mem/eventSubscriptions/m",
            json!({"properties":{"deliveryConfiguration":{"deliveryMode":"Queue"},
                   "persistencePolicy":{"isPersisted":false}}}),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let big = "x".repeat(256 << 10);
    for batch in 0..20 {
        let events: Vec<Value> = (0..2)
            .map(|i| {
                let id = format!("e{}", batch * 2 + i);
                json!({"specversion":"1.0","id":id,"source":"/t","type":"t","data":{"pad":big}})
            })
            .collect();
        let (s, b) = ns_post(
            &ns,
            "/topics/q:publish",
            "application/cloudevents-batch+json",
            serde_json::to_vec(&events).unwrap(),
        )
        .await;
        assert_eq!(s, 200, "{b}");
    }
    let gauge = |text: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix("gridlet_pending_event_bytes "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap()
    };
    let mut held = Vec::new();
    for sub in ["s0", "s1", "s2"] {
        // The window over the log holds about 1 MiB: receive as it refills.
        let got = std::sync::Mutex::new(Vec::new());
        crate::util::eventually("20 events locked", || async {
            let more = receive(&ns, "q", sub, 100, 0).await;
            let pending = gauge(&g.metrics().await);
            assert!(pending <= bound, "{pending} bytes pending past {bound}");
            let mut got = got.lock().unwrap();
            got.extend(more);
            if got.len() >= 20 {
                Ok(())
            } else {
                Err(format!("{}", got.len()))
            }
        })
        .await;
        let got = got.into_inner().unwrap();
        assert!(
            receive(&ns, "q", sub, 100, 1).await.is_empty(),
            "{sub}: at the bound"
        );
        assert_eq!(
            got.len(),
            20,
            "{sub}: 19 bodies of 256 KiB and a little fit in 5 MiB, the 20th passes it"
        );
        held.push(got);
    }
    let pending = gauge(&g.metrics().await);
    assert!(pending <= bound, "{pending} bytes pending past {bound}");
    let (s, b) = ns_post(
        &ns,
        "/topics/mem:publish",
        "application/cloudevents+json",
        serde_json::to_vec(&crate::pull::cloud_event("unrelated")).unwrap(),
    )
    .await;
    assert_eq!((s, &b), (200, &json!({})), "an unrelated in-memory publish");
    // Settling makes room under the per-subscription bound; a released event is read back.
    let tokens: Vec<&str> = held[0][..2].iter().map(|e| e.0.as_str()).collect();
    let r = crate::pull::settle(&ns, "q", "s0", "release", &tokens[..1]).await;
    assert_eq!(r["succeededLockTokens"].as_array().unwrap().len(), 1);
    crate::pull::settle(&ns, "q", "s0", "acknowledge", &tokens[1..]).await;
    let again = crate::util::eventually("the released event back", || async {
        let got = receive(&ns, "q", "s0", 1, 1).await;
        match got.first() {
            Some(e) if e.2 == held[0][0].2 => Ok(e.clone()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(again.1, 2, "deliveryCount kept and counted");
}

/// Finding 9: the original's caps (1,000 topics × 100 subscriptions) allowed 100,000
/// subscriptions, about 450 MB at the 4–5 KiB each measured. `broker__maxSubscriptions`
/// (default 10,000, about 50 MB) caps them across topics: past it a PUT is refused naming the
/// setting; deleting one makes room.
#[tokio::test]
async fn subscriptions_are_capped_across_topics() {
    let cfg = gridlet::config::Config::from_vars(Vec::<(String, String)>::new()).unwrap();
    assert_eq!(cfg.broker.max_subscriptions, 10_000, "the default");
    let g = start(&[("broker__maxSubscriptions", "3")]).await;
    for t in ["a", "b"] {
        g.topic(t).await;
    }
    let sub = json!({"properties":{"destination":{"endpointType":"WebHook",
        "properties":{"endpointUrl":"http://127.0.0.1:9/x"}}}});
    for (t, s) in [("a", "1"), ("a", "2"), ("b", "1")] {
        let (status, b) = g
            .put(&format!("/topics/{t}/eventSubscriptions/{s}"), sub.clone())
            .await;
        assert_eq!(status, 200, "{b}");
    }
    let (status, b) = g.put("/topics/b/eventSubscriptions/2", sub.clone()).await;
    assert!(status >= 400, "{status} {b}");
    assert!(b.to_string().contains("broker__maxSubscriptions"), "{b}");
    let (status, b) = g.put("/topics/a/eventSubscriptions/1", sub.clone()).await;
    assert_eq!(status, 200, "an update is not a new subscription: {b}");
    assert_eq!(g.delete("/topics/a/eventSubscriptions/2").await.0, 200);
    let (status, b) = g.put("/topics/b/eventSubscriptions/2", sub).await;
    assert_eq!(status, 200, "{b}");
}
