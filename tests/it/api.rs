//! Conformance checklist: topics, subscriptions, publishing, delivery.

use crate::util::*;
use serde_json::json;

#[tokio::test]
async fn smoke_create_subscribe_publish_deliver() {
    let t = start(&[]).await;
    let mut rx = Receiver::start().await;
    t.topic("t1").await;
    t.webhook_sub("t1", "s1", &rx.url("/hook"), json!({})).await;
    t.publish("t1", json!([eg_event("1", "s", "e", json!({"a":1}))]))
        .await;
    let r = rx.next().await;
    let v = r.json();
    assert_eq!(v[0]["topic"], "t1");
    assert_eq!(v[0]["metadataVersion"], "1");
}
