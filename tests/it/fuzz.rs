//! Random and mutated bodies against the publish and subscription routes of a live gridlet.
//! Every answer must be 200 or a 4xx carrying the documented error body — never a 5xx, a hang or a
//! crash — and the broker must keep delivering afterwards. Deterministic (seeded) so failures
//! reproduce.

use crate::util::*;
use serde_json::{json, Value};

fn random_json(r: &mut Rng, depth: u32) -> Value {
    let keys = [
        "id",
        "subject",
        "eventType",
        "eventTime",
        "dataVersion",
        "data",
        "topic",
        "metadataVersion",
        "properties",
        "destination",
        "endpointType",
        "endpointUrl",
        "filter",
        "advancedFilters",
        "operatorType",
        "key",
        "value",
        "values",
        "retryPolicy",
        "maxEventsPerBatch",
        "persistencePolicy",
        "isPersisted",
        "ZZ",
    ];
    match if depth > 4 { r.below(5) } else { r.below(8) } {
        0 => Value::Null,
        1 => json!(r.below(2) == 0),
        2 => json!(r.next() as i64),
        3 => json!((r.next() % 10_000) as f64 / 7.0),
        4 => json!(
            [
                "WebHook",
                "EdgeHub",
                "EventGrid",
                "http://127.0.0.1:9/x",
                "https://x",
                "",
                "NumberIn",
                "data.a",
                "1"
            ][r.below(9) as usize]
        ),
        5 | 6 => {
            let mut m = serde_json::Map::new();
            for _ in 0..r.below(6) {
                m.insert(
                    keys[r.below(keys.len() as u64) as usize].to_string(),
                    random_json(r, depth + 1),
                );
            }
            Value::Object(m)
        }
        _ => Value::Array((0..r.below(4)).map(|_| random_json(r, depth + 1)).collect()),
    }
}

fn mutate(r: &mut Rng, mut bytes: Vec<u8>) -> Vec<u8> {
    for _ in 0..1 + r.below(4) {
        if bytes.is_empty() {
            break;
        }
        let i = r.below(bytes.len() as u64) as usize;
        match r.below(4) {
            0 => bytes[i] = r.next() as u8,
            1 => bytes.truncate(i),
            2 => bytes.insert(i, b"{[\",:}]\\"[r.below(8) as usize]),
            _ => {
                bytes.remove(i);
            }
        }
    }
    bytes
}

async fn check(t: &TestGridlet, method: reqwest::Method, path: &str, body: Vec<u8>, what: &str) {
    let r = t
        .client
        .request(method, t.url(path))
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{what}: request failed ({e}); body {:?}",
                String::from_utf8_lossy(&body)
            )
        });
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    if status == 200 {
        return;
    }
    assert!(
        (400..500).contains(&status),
        "{what}: status {status} for {:?}: {text}",
        String::from_utf8_lossy(&body)
    );
    let v: Value = serde_json::from_str(&text)
        .unwrap_or_else(|_| panic!("{what}: error body not JSON: {text}"));
    assert!(v["error"]["details"]["code"].is_string(), "{what}: {text}");
}

#[tokio::test]
async fn random_bodies_never_break_the_broker() {
    let t = start(&[]).await;
    let mut rx = Receiver::start().await;
    t.topic("f").await;
    t.put(
        "/topics/c",
        json!({"properties":{"inputSchema":"CustomEventSchema"}}),
    )
    .await;
    t.put(
        "/topics/ce",
        json!({"properties":{"inputSchema":"CloudEventSchemaV1_0"}}),
    )
    .await;
    let valid_event = serde_json::to_vec(&json!([eg_event(
        "1",
        "s",
        "e",
        json!({"a":[1,{"b":null}]})
    )]))
    .unwrap();
    let valid_sub = serde_json::to_vec(&json!({"properties":{"destination":{"endpointType":"WebHook","properties":{"endpointUrl":"http://127.0.0.1:9/x","maxEventsPerBatch":5}},
        "filter":{"subjectBeginsWith":"a","advancedFilters":[{"operatorType":"NumberIn","key":"data.a","values":[1,2]}]},
        "retryPolicy":{"maxDeliveryAttempts":3}}}))
    .unwrap();
    let mut r = Rng(0x9E37_79B9_7F4A_7C15);
    for i in 0..400 {
        let topic = ["f", "c", "ce"][i % 3];
        let body = match i % 4 {
            0 => serde_json::to_vec(&random_json(&mut r, 0)).unwrap(),
            1 => serde_json::to_vec(&Value::Array(
                (0..r.below(5)).map(|_| random_json(&mut r, 1)).collect(),
            ))
            .unwrap(),
            _ => mutate(&mut r, valid_event.clone()),
        };
        check(
            &t,
            reqwest::Method::POST,
            &format!("/topics/{topic}/events"),
            body,
            "publish",
        )
        .await;
        let body = if i % 2 == 0 {
            serde_json::to_vec(&random_json(&mut r, 0)).unwrap()
        } else {
            mutate(&mut r, valid_sub.clone())
        };
        check(
            &t,
            reqwest::Method::PUT,
            &format!("/topics/{topic}/eventSubscriptions/fz{}", i % 7),
            body,
            "subscription",
        )
        .await;
    }
    // Still delivering.
    for sub in 0..7 {
        t.delete(&format!("/topics/f/eventSubscriptions/fz{sub}"))
            .await;
    }
    t.webhook_sub("f", "alive", &rx.url("/alive"), json!({}))
        .await;
    t.publish("f", json!([eg_event("after", "s", "e", json!(null))]))
        .await;
    assert_eq!(rx.next().await.json()[0]["id"], "after");
}
