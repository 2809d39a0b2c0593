//! Every outbound URL meets the same rules: https-only settings apply to dead-letter webhooks as
//! to destinations, and no destination reaches a denied address range
//! (`outbound__deniedAddressRanges`, link-local by default): refused at subscription time for an
//! address in the URL, and at connect time for the address a host name resolves to.

use crate::util::*;
use serde_json::{json, Value};
use std::time::Duration;

fn webhook(url: &str) -> Value {
    json!({"properties": {"destination": {"endpointType": "WebHook", "properties": {"endpointUrl": url}}}})
}

#[tokio::test]
async fn an_http_dead_letter_webhook_is_refused_under_https_only() {
    let t = start(&[("outbound__webhook__httpsOnly", "true")]).await;
    t.topic("t").await;
    let mut b = webhook("https://receiver.example/hook");
    b["properties"]["deadLetterDestination"] = json!({"endpointType": "WebHook",
        "properties": {"endpointUrl": "http://receiver.example/dead"}});
    let (s, body) = t.put("/topics/t/eventSubscriptions/s", b.clone()).await;
    assert_eq!(s, 400, "{body}");
    assert_eq!(
        body["error"]["details"]["code"],
        "InvalidDeadLetterDestination"
    );
    assert!(
        body.to_string().contains("outbound__webhook__httpsOnly"),
        "{body}"
    );
    b["properties"]["deadLetterDestination"]["properties"]["endpointUrl"] =
        json!("https://receiver.example/dead");
    let (s, body) = t.put("/topics/t/eventSubscriptions/s", b).await;
    assert_eq!(s, 200, "{body}");
}

#[tokio::test]
async fn link_local_addresses_are_refused_at_subscription_time() {
    let t = start(&[]).await;
    t.topic("t").await;
    let mut dl = webhook("http://127.0.0.1:9/hook");
    dl["properties"]["deadLetterDestination"] = json!({"endpointType": "WebHook",
        "properties": {"endpointUrl": "http://169.254.169.254/dead"}});
    let eventhub = json!({"properties": {"destination": {"endpointType": "EventHub", "properties": {
        "connectionString": "Endpoint=sb://169.254.169.254/;SharedAccessKeyName=k;SharedAccessKey=a2V5;EntityPath=h;UseDevelopmentEmulator=true"}}}});
    for (b, code, range) in [
        (
            webhook("http://169.254.169.254/latest/meta-data"),
            "InvalidDestination",
            "169.254.0.0/16",
        ),
        (
            webhook("http://[fe80::1]:8080/hook"),
            "InvalidDestination",
            "fe80::/10",
        ),
        (dl, "InvalidDeadLetterDestination", "169.254.0.0/16"),
        (eventhub, "InvalidDestination", "169.254.0.0/16"),
    ] {
        let (s, body) = t.put("/topics/t/eventSubscriptions/s", b.clone()).await;
        assert_eq!(s, 400, "{b} -> {body}");
        assert_eq!(body["error"]["details"]["code"], code, "{body}");
        assert!(body.to_string().contains(range), "{body}");
    }
    // Private ranges stay allowed (local modules live there), and an empty list denies none.
    let (s, body) = t
        .put(
            "/topics/t/eventSubscriptions/s",
            webhook("http://10.1.2.3/hook"),
        )
        .await;
    assert_eq!(s, 200, "{body}");
    let open = start(&[("outbound__deniedAddressRanges", "")]).await;
    open.topic("t").await;
    let (s, body) = open
        .put(
            "/topics/t/eventSubscriptions/s",
            webhook("http://169.254.169.254/x"),
        )
        .await;
    assert_eq!(s, 200, "{body}");
}

#[tokio::test]
async fn a_host_name_resolving_to_a_denied_address_is_refused_at_connect_time() {
    let mut rx = Receiver::start().await;
    let t = start(&[
        ("outbound__deniedAddressRanges", "127.0.0.0/8,::1/128"),
        ("broker__defaultMaxDeliveryAttempts", "1"),
    ])
    .await;
    t.topic("t").await;
    // A name, not an address: accepted at subscription time, checked when connecting.
    let url = format!("http://localhost:{}/hook", rx.addr.port());
    let (s, body) = t.put("/topics/t/eventSubscriptions/s", webhook(&url)).await;
    assert_eq!(s, 200, "{body}");
    t.publish("t", json!([eg_event("e1", "s", "T", json!({}))]))
        .await;
    let letter = eventually("a dead letter", || async {
        let (_, b) = t.get("/topics/t/eventSubscriptions/s/deadLetters").await;
        let first = b["value"].as_array().and_then(|v| v.first()).cloned();
        first.ok_or_else(|| b.to_string())
    })
    .await;
    let err = letter["lastError"].as_str().unwrap_or_default();
    assert!(err.contains("denied range"), "{letter}");
    rx.nothing_within(Duration::from_millis(100)).await;
}
