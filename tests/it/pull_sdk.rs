//! Pull delivery with Microsoft's own clients, unmodified: Python `azure-eventgrid` 4.22.1
//! (`EventGridPublisherClient(namespace_topic=...)`, `EventGridConsumerClient`) and npm
//! `@azure/eventgrid-namespaces` 1.0.0 (`EventGridSenderClient`, `EventGridReceiverClient`),
//! each authenticating with an `AzureKeyCredential` (`Authorization: SharedAccessKey`), over HTTP
//! (both clients allow it). `scripts/test.sh` installs them pinned: the Python package in the
//! virtualenv the OpenTelemetry tests use (`~/.cache/gridlet/otel-py`, `GRIDLET_OTEL_PYTHON`
//! overrides), the npm package from `tests/pull/js/package-lock.json` into
//! `~/.cache/gridlet/eventgrid-js` (`GRIDLET_EVENTGRID_JS` overrides).
//!
//! Each script publishes five events (a batch and a single one), receives them, acknowledges,
//! renews, releases (at once and with a 10 s delay), rejects, receives again (the released one
//! with `deliveryCount` 2), and tries a settled and a malformed token; it prints what it saw.
//! Lock expiry and the release delay's end are proven on the paused clock (`pull_clock.rs`);
//! a restart's redelivery on the real binary (`pull_process.rs`). Entra ID tokens through each
//! client's token-credential interface: the Python SDK in `entra.rs`, the npm one here (with
//! namespace filters).

use crate::util::{start, TestGridlet};
use serde_json::{json, Value};
use std::process::Command;

const KEY: &str = "pull-sdk-test-key";

fn home() -> String {
    std::env::var("HOME").unwrap_or_default()
}

pub fn python() -> String {
    std::env::var("GRIDLET_OTEL_PYTHON")
        .unwrap_or_else(|_| format!("{}/.cache/gridlet/otel-py/bin/python", home()))
}

fn js_modules() -> String {
    std::env::var("GRIDLET_EVENTGRID_JS")
        .unwrap_or_else(|_| format!("{}/.cache/gridlet/eventgrid-js", home()))
        + "/node_modules"
}

/// A gridlet that takes the SAS key [`KEY`], with each `(path, body)` PUT to it in order.
async fn keyed_gridlet(puts: &[(String, Value)]) -> TestGridlet {
    let g = start(&[
        ("inbound__clientAuth__sasKeys__enabled", "true"),
        ("inbound__clientAuth__sasKeys__key1", KEY),
    ])
    .await;
    for (path, body) in puts {
        let r = g
            .client
            .put(g.url(path))
            .header("aeg-sas-key", KEY)
            .json(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}: {}", r.text().await.unwrap());
    }
    g
}

/// A CloudEvents topic `topic` with one queue subscription `s`.
fn queue_puts(topic: &str) -> Vec<(String, Value)> {
    vec![
        (
            format!("/topics/{topic}"),
            json!({"properties":{"inputSchema":"CloudEventSchemaV1_0"}}),
        ),
        (
            format!("/topics/{topic}/eventSubscriptions/s"),
            json!({"properties":{"deliveryConfiguration":{"deliveryMode":"Queue"}}}),
        ),
    ]
}

/// Run `program tests/pull/{script} args…` (the client runs while this runtime keeps serving
/// gridlet); it must succeed, and what it prints is one JSON object.
pub(crate) async fn run_client(
    program: String,
    script: &str,
    args: Vec<String>,
    env: Vec<(String, String)>,
) -> Value {
    let script = format!("{}/tests/pull/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = tokio::task::spawn_blocking(move || {
        Command::new(&program)
            .arg(&script)
            .args(&args)
            .envs(env)
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "{program} could not run ({e}): run scripts/test.sh once to install the SDKs"
                )
            })
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Run one SDK script against a fresh gridlet and check what it saw; `p` is its id prefix.
async fn scenario(p: &str, program: &str, script: &str, env: &[(&str, String)]) {
    let g = keyed_gridlet(&queue_puts("q")).await;
    let env = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let args = vec![g.base.clone(), KEY.into(), "q".into(), "s".into()];
    let got = run_client(program.to_string(), script, args, env).await;
    let ids = |v: &[(u32, u64)]| {
        json!(v
            .iter()
            .map(|(i, n)| json!([format!("{p}{i}"), n]))
            .collect::<Vec<_>>())
    };
    assert_eq!(
        got["received"],
        ids(&[(0, 1), (1, 1), (2, 1), (3, 1), (4, 1)]),
        "{got}"
    );
    assert_eq!(got["data"][format!("{p}2")], json!({"n": 2}), "{got}");
    for op in [
        "acknowledged",
        "renewed",
        "released",
        "released_later",
        "rejected",
    ] {
        assert_eq!(got[op], true, "{op}: {got}");
    }
    assert_eq!(
        got["again"],
        ids(&[(1, 2)]),
        "released at once, delivered again; {got}"
    );
    assert_eq!(got["bad"], json!(["BadToken", "TokenLost"]), "{got}");
    assert_eq!(got["acknowledged_rest"], 2, "{got}");
    // The rejected event is a dead letter; the one released for 10 s still waits.
    let r = g
        .client
        .get(g.url("/topics/q/eventSubscriptions/s/deadLetters"))
        .header("aeg-sas-key", KEY)
        .send()
        .await
        .unwrap();
    let letters = r.text().await.unwrap();
    assert!(
        letters.contains(&format!("{p}3")) && letters.contains("rejected by the receiver"),
        "{letters}"
    );
    let h = g.g.broker.find_subscription("q", "s").unwrap();
    assert_eq!((h.pending(), h.pull().unwrap().locked()), (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_publishes_receives_and_settles() {
    scenario("py", &python(), "sdk_pull.py", &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn javascript_sdk_publishes_receives_and_settles() {
    scenario(
        "js",
        "node",
        "js/sdk_pull.cjs",
        &[("NODE_PATH", js_modules())],
    )
    .await;
}

/// Issue 35: every filter rule Microsoft documents for namespace subscriptions, created in the
/// namespaces shape (`filtersConfiguration`), published and received with the Python SDK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_sees_every_namespace_filter_rule() {
    let ranges = json!([[3.5, 999.95], [3000, 4000]]);
    // Subscription, its one filter, and the events it must get (e1..e4: tests/pull/sdk_filters.py).
    let cases: Vec<(&str, Value, Vec<&str>)> = vec![
        (
            "range",
            json!({"operatorType":"NumberInRange","key":"data.n","values":ranges}),
            vec!["e1", "e2"],
        ),
        (
            "notrange",
            json!({"operatorType":"NumberNotInRange","key":"data.n","values":ranges}),
            vec!["e3"],
        ),
        (
            "notbegins",
            json!({"operatorType":"StringNotBeginsWith","key":"data.s","values":["event"]}),
            vec!["e2"],
        ),
        (
            "notends",
            json!({"operatorType":"StringNotEndsWith","key":"data.s","values":["png"]}),
            vec!["e1"],
        ),
        (
            "notcontains",
            json!({"operatorType":"StringNotContains","key":"data.s","values":["HUB"]}),
            vec!["e2"],
        ),
        (
            "isnull",
            json!({"operatorType":"IsNullOrUndefined","key":"data.s"}),
            vec!["e3", "e4"],
        ),
        (
            "notnull",
            json!({"operatorType":"IsNotNull","key":"data.s"}),
            vec!["e1", "e2"],
        ),
        (
            "notin",
            json!({"operatorType":"StringNotIn","key":"data.s","values":["x"]}),
            vec!["e1", "e2", "e3", "e4"],
        ),
        (
            "array",
            json!({"operatorType":"StringIn","key":"data.tags","values":["azure"]}),
            vec!["e1"],
        ),
        (
            "numberin",
            json!({"operatorType":"NumberIn","key":"data.n","values":[500]}),
            vec!["e1"],
        ),
    ];
    let mut puts = vec![(
        "/topics/f".to_string(),
        json!({"properties":{"inputSchema":"CloudEventSchemaV1_0"}}),
    )];
    for (name, filter, _) in &cases {
        puts.push((
            format!("/topics/f/eventSubscriptions/{name}"),
            json!({"properties":{"deliveryConfiguration":{"deliveryMode":"Queue"},
                   "filtersConfiguration":{"filters":[filter]}}}),
        ));
    }
    let g = keyed_gridlet(&puts).await;
    let mut args = vec![g.base.clone(), KEY.into(), "f".into()];
    args.extend(cases.iter().map(|(n, _, _)| n.to_string()));
    let got = run_client(python(), "sdk_filters.py", args, Vec::new()).await;
    for (name, _, want) in &cases {
        assert_eq!(got[name], json!(want), "{name}: {got}");
    }
}

/// Issue 35: a binary-mode publish on `:publish` (the CloudEvents HTTP binding: attributes in
/// `ce-*` headers, the body the data with its own media type) is stored and received with its
/// data intact, whether JSON, text or bytes, by the Python SDK.
///
/// The binding is sent by hand: `@azure/eventgrid-namespaces` 1.0.0 (the one version on npm)
/// exposes no binary mode in its CommonJS entry, and `azure-eventgrid` 4.22.1 has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_mode_publish_keeps_json_text_and_bytes_for_the_sdk() {
    let g = keyed_gridlet(&queue_puts("b")).await;
    let bytes: Vec<u8> = vec![0, 159, 146, 150, 255];
    for (id, ct, body) in [
        ("json", "application/json", br#"{"n":1}"#.to_vec()),
        ("text", "text/plain; charset=utf-8", b"hello, edge".to_vec()),
        ("bytes", "application/octet-stream", bytes.clone()),
    ] {
        let r = g
            .client
            .post(format!(
                "{}/topics/b:publish?api-version=2024-06-01",
                g.base
            ))
            .header("authorization", format!("SharedAccessKey {KEY}"))
            .header("content-type", ct)
            .header("ce-specversion", "1.0")
            .header("ce-id", id)
            .header("ce-source", "/binary")
            .header("ce-type", "binary.test")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = r.status();
        assert_eq!(status, 200, "{id}: {}", r.text().await.unwrap());
    }
    let args = vec![g.base.clone(), KEY.into(), "b".into(), "s".into()];
    let got = run_client(python(), "sdk_receive.py", args, Vec::new()).await;
    assert_eq!(got["json"]["data"], json!({"n": 1}), "{got}");
    assert_eq!(got["json"]["datacontenttype"], "application/json", "{got}");
    assert_eq!(got["text"]["data"], "hello, edge", "{got}");
    assert_eq!(got["bytes"]["type"], "bytes", "{got}");
    let latin1: String = bytes.iter().map(|&b| b as char).collect();
    assert_eq!(got["bytes"]["data"], latin1, "{got}");
}

/// Issue 35: the npm client, unmodified, authenticating with a `TokenCredential` (an object whose
/// `getToken` returns a token this test signed: `DefaultAzureCredential`'s interface), over
/// HTTPS (the SDK sends bearer tokens nowhere else), receiving through namespace subscriptions
/// whose `filtersConfiguration` sorts the events: an event type and a number range, a
/// case-insensitive "does not contain". The sender may not receive, the receiver may not publish,
/// an expired token gets 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn javascript_sdk_authenticates_with_a_token_credential_and_receives_through_filters() {
    use crate::entra::{claims, entra_env, with_queue, Signer, ADMIN_KEY, RECEIVER, SENDER};
    let s = Signer::new("k1");
    let dir = tempfile::tempdir().unwrap();
    let env = entra_env(&s, dir.path());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let g = with_queue(start(&env).await).await;
    let subs = [
        ("everything", json!({})),
        (
            "range",
            json!({"filtersConfiguration": {
                "includedEventTypes": ["js.entra"],
                "filters": [{"operatorType": "NumberInRange", "key": "data.n", "values": [[1, 3]]}],
            }}),
        ),
        (
            "nothub",
            json!({"filtersConfiguration": {
                "filters": [{"operatorType": "StringNotContains", "key": "data.s", "values": ["hub"]}],
            }}),
        ),
    ];
    for (name, extra) in &subs {
        let mut props = json!({"deliveryConfiguration": {"deliveryMode": "Queue"}});
        props
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let r = g
            .client
            .put(g.url(&format!("/topics/q/eventSubscriptions/{name}")))
            .header("aeg-sas-key", ADMIN_KEY)
            .json(&json!({ "properties": props }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{name}: {}", r.text().await.unwrap());
    }
    let now = gridlet::clock::system_wall_ms() / 1000;
    let sign = |c: &Value| s.sign(json!({"kid": "k1", "typ": "JWT"}), c);
    let mut expired = claims(SENDER);
    expired["exp"] = json!(now - 3600);
    let mut args = vec![
        g.https_base.clone().expect("https listener"),
        "q".into(),
        sign(&claims(SENDER)),
        sign(&claims(RECEIVER)),
        sign(&expired),
    ];
    args.extend(subs.iter().map(|(n, _)| n.to_string()));
    let ca = g.dir.path().join("metadataDb/tls/server-cert.pem");
    let env = vec![
        ("NODE_PATH".to_string(), js_modules()),
        ("NODE_EXTRA_CA_CERTS".to_string(), ca.display().to_string()),
    ];
    let got = run_client("node".into(), "js/sdk_entra.cjs", args, env).await;
    assert_eq!(
        got["scopes"],
        json!(["https://eventgrid.azure.net/.default"]),
        "{got}"
    );
    assert_eq!(got["everything"], json!(["e0", "e1", "e2", "e3"]), "{got}");
    assert_eq!(got["everything_acknowledged"], 4, "{got}");
    assert_eq!(got["range"], json!(["e1", "e2"]), "type and range: {got}");
    assert_eq!(
        got["nothub"],
        json!(["e0", "e2", "e3"]),
        "case-insensitive: {got}"
    );
    assert_eq!(got["receiver_publishes"], 403, "{got}");
    assert_eq!(got["sender_receives"], 403, "{got}");
    assert_eq!(got["expired_publishes"], 401, "{got}");
}
