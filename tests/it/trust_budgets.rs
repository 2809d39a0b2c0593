//! Issue 37, "Trust, third pass", findings 3, 4, 6, 7 and 9: pull delivery within the shared
//! budgets, case-variant keys inside `data`, and the default caps. Each test failed on the code
//! before its fix (the long polls' process test is in `pull_process.rs`).

use crate::pull::{ns_post, publish_batch, queue_topic, receive, Ns};
use crate::util::start;
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
            (s, b["error"]["details"]["code"].as_str()),
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
