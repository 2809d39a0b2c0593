//! The operator console (issue 38, docs/CONSOLE.md): its files and their headers, who may read
//! what through it, and the whole console in a real browser (headless Chromium driven by
//! Playwright for Python, `tests/console/ui.py`) against a real gridlet.

use crate::util::{start, TestGridlet};
use serde_json::{json, Value};
use std::process::Command;

const KEY: &str = "console-admin-key";
const PUBLISH_KEY: &str = "console-publish-only-key";
const RECEIVE_KEY: &str = "console-receive-key";
const METRICS_KEY: &str = "console-metrics-key";

fn keys() -> Vec<(&'static str, &'static str)> {
    vec![
        ("inbound__clientAuth__sasKeys__enabled", "true"),
        ("inbound__clientAuth__sasKeys__key1", KEY),
        ("inbound__clientAuth__sasKeys__publishOnlyKeys", PUBLISH_KEY),
        (
            "inbound__clientAuth__sasKeys__receiveKeys",
            "t/q=console-receive-key",
        ),
        ("inbound__clientAuth__sasKeys__metricsKeys", METRICS_KEY),
    ]
}

async fn put_with(g: &TestGridlet, key: &str, path: &str, body: Value) {
    let r = g
        .client
        .put(g.url(path))
        .header("aeg-sas-key", key)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "PUT {path}");
}

async fn get_with(g: &TestGridlet, key: Option<&str>, path: &str) -> (u16, Value) {
    let mut req = g.client.get(g.url(path));
    if let Some(k) = key {
        req = req.header("aeg-sas-key", k);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn the_console_is_served_with_a_strict_policy_and_its_data_needs_an_administrator() {
    let g = start(&keys()).await;
    // The page and its files: no credential needed (they hold no data), every answer with the
    // policy that forbids inline script and style and any other origin.
    for (path, content_type) in [
        ("/console", "text/html"),
        ("/console/", "text/html"),
        ("/console/app.js", "text/javascript"),
        ("/console/console.css", "text/css"),
    ] {
        let r = g
            .client
            .get(format!("{}{path}", g.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let h = r.headers();
        let csp = h["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("default-src 'none'"), "{csp}");
        assert!(csp.contains("script-src 'self';"), "{csp}");
        assert!(!csp.contains("unsafe"), "{csp}");
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
        assert_eq!(h["x-content-type-options"], "nosniff");
        assert!(h["content-type"]
            .to_str()
            .unwrap()
            .starts_with(content_type));
        assert!(h.get("set-cookie").is_none());
    }
    let html = g
        .client
        .get(format!("{}/console/", g.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains(r#"<script type="module" src="/console/app.js"></script>"#));
    assert!(
        !html.contains("<script>") && !html.contains("style="),
        "no inline script or style"
    );
    let r = g
        .client
        .get(format!("{}/console/../metrics", g.base))
        .send()
        .await
        .unwrap();
    assert_ne!(r.status(), 200);
    let r = g
        .client
        .get(format!("{}/console/secrets.txt", g.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);

    // The data routes the console adds are management routes: an administrator's only.
    put_with(
        &g,
        KEY,
        "/topics/t",
        serde_json::json!({"properties": {"inputSchema": "CloudEventSchemaV1_0"}}),
    )
    .await;
    put_with(
        &g,
        KEY,
        "/topics/t/eventSubscriptions/q",
        serde_json::json!({"properties": {"deliveryConfiguration": {"deliveryMode": "Queue"}}}),
    )
    .await;
    for path in [
        "/broker/overview",
        "/topics/t/tail?wait=0",
        "/topics/t/eventSubscriptions/q/status",
        "/topics",
    ] {
        assert_eq!(get_with(&g, None, path).await.0, 401, "{path}");
        for key in [PUBLISH_KEY, RECEIVE_KEY, METRICS_KEY] {
            let (status, body) = get_with(&g, Some(key), path).await;
            assert_eq!(status, 403, "{path} with {key}: {body}");
            assert_eq!(body["error"]["code"], "Forbidden");
        }
        assert_eq!(get_with(&g, Some(KEY), path).await.0, 200, "{path}");
    }
    let (_, o) = get_with(&g, Some(KEY), "/broker/overview").await;
    assert_eq!(o["version"], env!("CARGO_PKG_VERSION"));
    // Changed settings are listed with every secret masked.
    let settings = o["settings"].as_array().unwrap();
    let shown = |name: &str| {
        settings
            .iter()
            .find(|s| s["name"] == name)
            .map(|s| s["value"].clone())
    };
    assert_eq!(
        shown("inbound__clientAuth__sasKeys__key1"),
        Some(Value::from("***"))
    );
    assert_eq!(
        shown("inbound__clientAuth__sasKeys__enabled"),
        Some(Value::from("true"))
    );
    let text = o.to_string();
    for secret in [KEY, PUBLISH_KEY, RECEIVE_KEY, METRICS_KEY] {
        assert!(!text.contains(secret), "{secret} leaked: {text}");
    }
    let (_, st) = get_with(&g, Some(KEY), "/topics/t/eventSubscriptions/q/status").await;
    assert_eq!(st["locked"], 0);
    assert_eq!(st["pending"], 0);
    assert_eq!(st["retrying"], 0);
    assert_eq!(st["oldestWaitingEventTime"], Value::Null);
    assert_eq!(st["queue"]["deliveryCounts"]["5+"], 0);
}

#[tokio::test]
async fn the_tail_validates_its_query() {
    let g = start(&[]).await;
    g.topic("t").await;
    for (q, code) in [
        ("after=x", "InvalidRequest"),
        ("wait=-1", "InvalidRequest"),
        ("filter=%7B", "InvalidRequest"),
        ("filter=%7B%22subjectBeginsWith%22%3A5%7D", "InvalidRequest"),
    ] {
        let (status, body) = g.get(&format!("/topics/t/tail?{q}")).await;
        assert_eq!(status, 400, "{q}: {body}");
        assert_eq!(body["error"]["details"]["code"], code, "{q}: {body}");
    }
    let (status, _) = g.get("/topics/nope/tail?wait=0").await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn the_console_can_be_turned_off() {
    let g = start(&[("console__enabled", "false")]).await;
    for path in ["/console", "/console/", "/console/app.js"] {
        let r = g
            .client
            .get(format!("{}{path}", g.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{path}");
    }
}

fn python() -> String {
    std::env::var("GRIDLET_CONSOLE_PYTHON").unwrap_or_else(|_| {
        let home = std::env::var("HOME").unwrap_or_default();
        format!("{home}/.cache/gridlet/console-py/bin/python")
    })
}

fn chromium() -> Option<String> {
    let given = std::env::var("GRIDLET_CHROMIUM").ok();
    given
        .into_iter()
        .chain(["/usr/bin/chromium".to_string()])
        .find(|p| std::path::Path::new(p).exists())
}

/// The whole console in headless Chromium: sign-in refused for a publish-only key; a topic and
/// a webhook subscription created through the forms, a publish, the counts moving; a failing
/// endpoint's dead letters listed (a `<script>` body shown as text), the frozen endpoint
/// re-enabled, the letters replayed into the recovered receiver; the live tail; the overview's
/// charts; a phone-sized screen; keyboard focus. Screenshots of each page go to
/// `target/console-screenshots/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_a_real_browser() {
    let Some(chromium) = chromium() else {
        eprintln!(
            "SKIPPED the_console_in_a_real_browser: Chromium is not installed \
             (apt-get install chromium; scripts/test.sh does)"
        );
        return;
    };
    let mut env = keys();
    env.extend([
        // A failing endpoint freezes after its third consecutive failure.
        ("broker__endpointHealth__freezeAnyConsecutiveFailures", "2"),
        (
            "console__traceUrlTemplate",
            "http://jaeger.example:16686/trace/{traceId}",
        ),
    ]);
    let g = start(&env).await;
    let shots = concat!(env!("CARGO_MANIFEST_DIR"), "/target/console-screenshots");
    std::fs::create_dir_all(shots).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/console/ui.py");
    let base = g.base.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python())
            .arg(script)
            .env("GRIDLET_URL", base)
            .env("GRIDLET_KEY", KEY)
            .env("GRIDLET_PUBLISH_KEY", PUBLISH_KEY)
            .env("CHROMIUM", chromium)
            .env("SCREENSHOTS", shots)
            .output()
    })
    .await
    .unwrap()
    .unwrap_or_else(|e| {
        panic!(
            "{}: {e}: run scripts/test.sh once (it installs Playwright for Python)",
            python()
        )
    });
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the browser scenario failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    assert!(stdout.contains("console scenario passed"), "{stdout}");
}

#[tokio::test]
async fn the_tail_samples_a_watched_topic_and_filters_like_a_subscription() {
    let g = start(&[]).await;
    g.topic("t").await;
    let ev =
        |i: usize, subject: &str| crate::util::eg_event(&i.to_string(), subject, "k", json!({}));
    // Unwatched: nothing is kept.
    g.publish("t", json!([ev(0, "a/0")])).await;
    let (_, first) = g.get("/topics/t/tail?wait=0").await;
    assert_eq!(first["events"], json!([]));
    let next = first["next"].as_u64().unwrap();
    assert_eq!(next, 0, "the unwatched publish was not sampled");
    // Watched: at most 10 events of one request are sampled, in order.
    let events: Vec<Value> = (1..=15).map(|i| ev(i, &format!("a/{i}"))).collect();
    g.publish("t", Value::Array(events)).await;
    let (_, page) = g.get(&format!("/topics/t/tail?after={next}&wait=0")).await;
    let ids: Vec<&str> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, (1..=10).map(|i| i.to_string()).collect::<Vec<_>>());
    assert_eq!(page["events"][0]["subject"], "a/1");
    assert_eq!(page["events"][0]["eventType"], "k");
    assert_eq!(page["missed"], 0);
    // A filter, URL-encoded, as a subscription's.
    let next = page["next"].as_u64().unwrap();
    g.publish("t", json!([ev(20, "keep/1"), ev(21, "drop/1")]))
        .await;
    let filter = "%7B%22subjectBeginsWith%22%3A%22keep%2F%22%7D";
    let (_, page) = g
        .get(&format!(
            "/topics/t/tail?after={next}&wait=0&filter={filter}"
        ))
        .await;
    let subjects: Vec<&str> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["subject"].as_str().unwrap())
        .collect();
    assert_eq!(subjects, vec!["keep/1"]);
}

/// A tail poll waiting when gridlet stops is answered at once (empty), rather than holding the
/// listeners' graceful close (10 s) until its connection is cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_tail_poll_is_answered_when_gridlet_stops() {
    let g = start(&[]).await;
    g.topic("t").await;
    let url = g.url("/topics/t/tail?wait=25");
    let client = g.client.clone();
    let poll = tokio::spawn(async move { client.get(url).send().await });
    let topic = g.g.broker.topic("t").unwrap();
    crate::util::eventually("the poll to wait", || async {
        match topic.tail.polls_waiting() {
            1 => Ok(()),
            n => Err(format!("{n} waiting")),
        }
    })
    .await;
    let started = std::time::Instant::now();
    g.g.shutdown().await;
    let r = poll
        .await
        .unwrap()
        .expect("an answer, not a cut connection");
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["events"], json!([]));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "stopping took the whole grace period"
    );
}

/// Issue 38: the overview names the broker's connections: its MQTT sources (none here) and the
/// subscriptions whose endpoint cannot be reached (an outage).
#[tokio::test]
async fn the_overview_names_unreachable_endpoints_and_mqtt_sources() {
    let g = start(&[("outbound__outageProbeSeconds", "1")]).await;
    let (_, o) = g.get("/broker/overview").await;
    assert_eq!(o["mqttConnections"], json!([]), "{o}");
    assert_eq!(o["outages"], json!([]), "{o}");
    g.topic("t").await;
    // Nothing listens on port 9: no connection, an outage.
    g.webhook_sub("t", "down", "http://127.0.0.1:9/hook", json!({}))
        .await;
    g.publish(
        "t",
        json!([crate::util::eg_event("e1", "s", "T", json!({}))]),
    )
    .await;
    g.wait_metric(
        "gridlet_endpoint_outage",
        "topic=\"t\",subscription=\"down\"",
        1,
    )
    .await;
    let (_, o) = g.get("/broker/overview").await;
    let outages = o["outages"].as_array().unwrap();
    assert_eq!(outages.len(), 1, "{o}");
    assert_eq!(outages[0]["topic"], "t");
    assert_eq!(outages[0]["subscription"], "down");
    assert!(outages[0]["since"].as_str().is_some(), "{o}");
    assert!(
        !o.to_string().contains("127.0.0.1:9"),
        "no endpoint URL: {o}"
    );
}
