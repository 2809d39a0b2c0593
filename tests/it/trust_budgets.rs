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
