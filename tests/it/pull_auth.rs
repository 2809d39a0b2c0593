//! Who may use pull delivery (issue 21): a receive key (`inbound__clientAuth__sasKeys__receiveKeys`)
//! reaches its one queue subscription's operations and nothing else; `Authorization:
//! SharedAccessKey`, `aeg-sas-token` and `Authorization: SharedAccessSignature` authenticate on
//! the data plane. The decisions themselves are unit-tested in `src/api/auth/tests.rs`.

use crate::pull::NS;
use crate::util::start;
use serde_json::json;

#[tokio::test]
async fn a_receive_key_pulls_from_its_subscription_only_and_sas_tokens_authenticate() {
    let g = start(&[
        ("inbound__clientAuth__sasKeys__enabled", "true"),
        ("inbound__clientAuth__sasKeys__key1", "admin-key"),
        (
            "inbound__clientAuth__sasKeys__receiveKeys",
            "q/s=receive-key",
        ),
    ])
    .await;
    let call = |path: String, auth: (&'static str, String)| {
        let c = g.client.clone();
        let url = format!("{}{path}", g.base);
        async move {
            let r = c
                .post(url)
                .header(auth.0, auth.1)
                .header("content-type", "application/cloudevents-batch+json")
                .body("[]")
                .send()
                .await
                .unwrap();
            r.status().as_u16()
        }
    };
    let admin = || ("authorization", "SharedAccessKey admin-key".to_string());
    let receiver = || ("authorization", "SharedAccessKey receive-key".to_string());
    for (path, body) in [
        (
            "/topics/q",
            json!({"properties":{"inputSchema":"CloudEventSchemaV1_0"}}),
        ),
        (
            "/topics/q/eventSubscriptions/s",
            json!({"properties":{"deliveryConfiguration":{"deliveryMode":"Queue"}}}),
        ),
        (
            "/topics/q/eventSubscriptions/other",
            json!({"properties":{"deliveryConfiguration":{"deliveryMode":"Queue"}}}),
        ),
    ] {
        let r = g
            .client
            .put(g.url(path))
            .header("aeg-sas-key", "admin-key")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let receive =
        |sub: &str| format!("/topics/q/eventsubscriptions/{sub}:receive?maxWaitTime=0&{NS}");
    assert_eq!(call(receive("s"), receiver()).await, 200);
    assert_eq!(call(receive("other"), receiver()).await, 403);
    assert_eq!(
        call(format!("/topics/q:publish?{NS}"), receiver()).await,
        403
    );
    assert_eq!(call(format!("/topics/q:publish?{NS}"), admin()).await, 200);
    assert_eq!(
        call(
            receive("other"),
            ("authorization", "SharedAccessKey nope".into())
        )
        .await,
        401
    );
    // A shared access signature made from the admin key (Event Grid's r/e/s form).
    // Within the maximum lifetime (a day by default): an hour from now.
    let e = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600;
    let unsigned = format!("r=https%3A%2F%2Fgridlet&e={e}");
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"admin-key");
    use base64::Engine;
    let sig = base64::engine::general_purpose::STANDARD
        .encode(ring::hmac::sign(&key, unsigned.as_bytes()));
    let token = format!(
        "{unsigned}&s={}",
        sig.replace('+', "%2B")
            .replace('/', "%2F")
            .replace('=', "%3D")
    );
    assert_eq!(
        call(receive("other"), ("aeg-sas-token", token.clone())).await,
        200
    );
    assert_eq!(
        call(
            receive("other"),
            ("authorization", format!("SharedAccessSignature {token}"))
        )
        .await,
        200
    );
    assert_eq!(
        call(
            receive("other"),
            (
                "aeg-sas-token",
                token.replace(&format!("e={e}"), &format!("e={}", e + 1))
            )
        )
        .await,
        401
    );
}
