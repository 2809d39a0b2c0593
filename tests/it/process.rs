//! The real binary: start-up errors, serving, and graceful shutdown on SIGTERM.

use crate::util::*;
use std::process::{Command, Stdio};
use std::time::Duration;

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Start the binary with one invalid setting: it must exit with status 2 and print one line,
/// which is returned.
fn start_up_error(key: &str, value: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gridlet"))
        .current_dir(dir.path())
        .env(key, value)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(key), "{err}");
    err
}

#[test]
fn invalid_setting_stops_start_up_with_one_clear_line() {
    let err = start_up_error("inbound__serverAuth__tlsPolicy", "sometimes");
    assert!(err.contains("strict, enabled, disabled"), "{err}");
}

/// Start the real binary on a free loopback port with `env` on top of a plain-HTTP local setup,
/// and wait until `/healthz` answers. Returns the process and the API's base URL.
pub(crate) async fn start_serving(
    dir: &std::path::Path,
    env: &[(&str, &str)],
) -> (std::process::Child, String) {
    let port = free_port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gridlet"));
    cmd.current_dir(dir)
        .env("inbound__serverAuth__tlsPolicy", "disabled")
        .env("inbound__clientAuth__clientCert__enabled", "false")
        .env("inbound__bindAddress", "127.0.0.1")
        .env("inbound__httpPort", port.to_string())
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().unwrap();
    // Run alone, this test must not depend on another having installed rustls' provider.
    gridlet::tls::install_default_provider();
    let client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let answer = poll_within(WAIT, || client.get(format!("{base}/healthz")).send()).await;
    if !answer.is_ok_and(|r| r.status() == 200) {
        let _ = child.kill();
        let _ = child.wait();
        panic!("gridlet did not start serving");
    }
    (child, base)
}

/// Send SIGTERM and wait for the exit status.
pub(crate) async fn terminate(mut child: std::process::Child) -> std::process::ExitStatus {
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let exited = poll_within(WAIT, || {
        std::future::ready(child.try_wait().unwrap().ok_or("running"))
    })
    .await;
    exited.unwrap_or_else(|_| {
        let _ = child.kill();
        let _ = child.wait();
        panic!("gridlet did not stop on SIGTERM");
    })
}

#[tokio::test]
async fn sigterm_stops_the_process_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let (child, base) = start_serving(dir.path(), &[]).await;
    let r = reqwest::Client::new()
        .put(format!("{base}/topics/t?{V}"))
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let status = terminate(child).await;
    assert!(status.success(), "{status:?}");
}

#[test]
fn worker_threads_setting_sizes_the_async_runtime() {
    // The runtime reports its worker count at start (tokio's own metrics). Counting threads by
    // name in /proc cannot tell workers from blocking-pool threads, which share the name.
    for n in [1usize, 3] {
        let value = n.to_string();
        let lines = first_log_lines(&[("broker__workerThreads", &value)], 2);
        let line = lines
            .iter()
            .find(|l| l.contains("async runtime started"))
            .unwrap_or_else(|| panic!("no runtime line in {lines:?}"));
        assert!(line.contains(&format!("worker_threads={n}")), "{line}");
    }
    let err = start_up_error("broker__workerThreads", "5000");
    assert!(err.contains("from 0 to 1024"), "{err}");
}

/// A webhook receiver that takes `delay` to answer 200, reporting each request when it arrives
/// and counting the answers it completed.
async fn slow_receiver(
    delay: Duration,
) -> (
    String,
    tokio::sync::mpsc::UnboundedReceiver<()>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = answered.clone();
    let app = axum::Router::new().route(
        "/{*path}",
        axum::routing::post(move || {
            let (tx, counter) = (tx.clone(), counter.clone());
            async move {
                let _ = tx.send(());
                tokio::time::sleep(delay).await; // under test: a request in flight at SIGTERM
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                axum::http::StatusCode::OK
            }
        }),
    );
    let (addr, _) = crate::util::serve_http(app).await;
    let url = format!("http://{addr}/slow");
    (url, rx, answered)
}

/// SIGTERM while a delivery to a slow receiver is in flight: the delivery completes within the
/// shutdown drain (the receiver answers 200 to a live connection and gridlet settles it), so
/// after a restart the persisted event is not delivered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_in_flight_deliveries_finish() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("outbound__webhook__httpsOnly", "false"),
        ("broker__defaultIsPersisted", "true"),
    ];
    let (url, mut arrived, answered) = slow_receiver(Duration::from_millis(1500)).await;
    let (child, base) = start_serving(dir.path(), &env).await;
    let client = reqwest::Client::new();
    let put = |path: String, body: serde_json::Value| {
        let req = client.put(format!("{base}{path}?{V}")).json(&body);
        async move { req.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(put("/topics/t".into(), serde_json::json!({})).await, 200);
    let sub = serde_json::json!({"properties": {"destination": {"endpointType": "WebHook",
        "properties": {"endpointUrl": url}}}});
    assert_eq!(put("/topics/t/eventSubscriptions/s".into(), sub).await, 200);
    let events = serde_json::json!([{"id": "e1", "subject": "s", "eventType": "t",
        "eventTime": "2017-08-10T21:03:07+00:00", "dataVersion": "1", "data": {}}]);
    let r = client
        .post(format!("{base}/topics/t/events?{V}"))
        .json(&events)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    tokio::time::timeout(WAIT, arrived.recv())
        .await
        .expect("the delivery reaches the receiver")
        .unwrap();
    let status = terminate(child).await;
    assert!(status.success(), "{status:?}");
    assert_eq!(answered.load(std::sync::atomic::Ordering::SeqCst), 1);
    // The clean stop closed the store: its last frame and a checkpoint are on disk (the next
    // start reads the checkpoint, not the log).
    let log = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.path().join("gridlet-v2/log"))
        .find(|p| p.is_dir())
        .expect("the event log's directory");
    let slots: Vec<u64> = ["checkpoint.0", "checkpoint.1"]
        .iter()
        .filter_map(|n| std::fs::metadata(log.join(n)).ok().map(|m| m.len()))
        .collect();
    assert!(
        slots.iter().any(|l| *l > 24),
        "a checkpoint at the clean stop: {slots:?}"
    );
    // Restarted on the same directories: the acknowledged event is not delivered again.
    let (child, _) = start_serving(dir.path(), &env).await;
    // Serving already: a pending event would be on its way at start.
    let again = tokio::time::timeout(Duration::from_secs(1), arrived.recv()).await;
    let _ = terminate(child).await;
    assert!(
        again.is_err(),
        "the event was delivered again after the restart"
    );
}

/// A data directory the process cannot write (a host directory bind-mounted without write access
/// for UID 2000) stops start-up with one line that says what to chown, not a store error that
/// reads like corruption. As root (CI) the binary runs as UID 2000 through `setpriv`, since root
/// writes anywhere; otherwise the directory is made read-only.
#[test]
fn unwritable_data_directory_says_what_to_chown() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let meta = dir.path().join("meta");
    let events = dir.path().join("events");
    std::fs::create_dir(&meta).unwrap();
    std::fs::create_dir(&events).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&events, std::fs::Permissions::from_mode(0o555)).unwrap();
    let root = std::fs::metadata("/proc/self").unwrap().uid() == 0;
    let mut cmd = if root {
        std::os::unix::fs::chown(&meta, Some(2000), Some(2000)).unwrap();
        let mut c = Command::new("setpriv");
        c.args(["--reuid", "2000", "--regid", "2000", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_gridlet"));
        c
    } else {
        Command::new(env!("CARGO_BIN_EXE_gridlet"))
    };
    let out = cmd
        .current_dir(dir.path())
        .env("inbound__serverAuth__tlsPolicy", "disabled")
        .env("inbound__httpPort", "0")
        .env("persistence__metadataPath", &meta)
        .env("persistence__eventsPath", &events)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("persistence__eventsPath"), "{err}");
    assert!(err.contains("chown -R"), "{err}");
    assert!(!err.contains("corrupt"), "{err}");
}

fn gridlet_cmd(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    Command::new(env!("CARGO_BIN_EXE_gridlet"))
        .args(args)
        .current_dir(dir.path())
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

#[test]
fn version_and_help_answer_without_starting_the_broker() {
    let out = gridlet_cmd(&["--version"], &[]);
    assert!(out.status.success());
    let v = String::from_utf8_lossy(&out.stdout);
    assert!(
        v.starts_with(&format!("gridlet {} (", env!("CARGO_PKG_VERSION"))),
        "{v}"
    );
    let out = gridlet_cmd(&["--help"], &[]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for s in gridlet::config::SETTINGS {
        assert!(
            help.contains(&format!("{} = ", s.key)),
            "--help lacks {}",
            s.key
        );
    }
    let out = gridlet_cmd(&["serve"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("usage: gridlet"));
}

#[test]
fn check_config_validates_the_environment_and_a_manifest() {
    let out = gridlet_cmd(
        &["check-config"],
        &[
            ("inbound__clientAuth__sasKeys__key1", "topsecret"),
            ("broker__defaultMaxDeliveryAttempts", "4"),
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("* broker__defaultMaxDeliveryAttempts = 4"),
        "{text}"
    );
    assert!(!text.contains("topsecret"), "{text}");
    let out = gridlet_cmd(
        &["check-config"],
        &[("broker__defaultMaxDeliveryAttempts", "many")],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stdout).contains("broker__defaultMaxDeliveryAttempts"));
    // The repository's deployment template: its gridlet module's createOptions Env.
    let template = concat!(env!("CARGO_MANIFEST_DIR"), "/deployment.template.json");
    let out = gridlet_cmd(&["check-config", "--manifest", template], &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("* metrics__reporterType = prometheus"),
        "{text}"
    );
}

/// Issue 39: a misspelled setting is not "valid". `check-config` names it and the closest key and
/// exits 2, from the environment and from a manifest; the running broker's warning names the
/// closest key too.
#[test]
fn a_misspelled_setting_is_refused_with_the_closest_key() {
    let suggestion =
        "unknown setting inbound__serverAuth__tlsPolicies (did you mean inbound__serverAuth__tlsPolicy?)";
    let out = gridlet_cmd(
        &["check-config"],
        &[("inbound__serverAuth__tlsPolicies", "enabled")],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains(suggestion), "{text}");
    assert!(!text.contains("is valid"), "{text}");

    // The repository's deployment template with the same typo in its module's Env.
    let template: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/deployment.template.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let text = template.to_string().replace(
        "inbound__serverAuth__tlsPolicy=",
        "inbound__serverAuth__tlsPolicies=",
    );
    assert_ne!(text, template.to_string(), "the template sets tlsPolicy");
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("typo.json");
    std::fs::write(&manifest, text).unwrap();
    let out = gridlet_cmd(
        &["check-config", "--manifest", manifest.to_str().unwrap()],
        &[],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains(suggestion), "{text}");

    let lines = first_log_lines(&[("broker__defaultMaxDeliveryAtempts", "3")], 3);
    assert!(
        lines.iter().any(|l| l.starts_with("<4> ")
            && l.contains(
                "unknown setting ignored: did you mean broker__defaultMaxDeliveryAttempts?"
            )
            && l.contains("broker__defaultMaxDeliveryAtempts")),
        "{lines:#?}"
    );
}

#[tokio::test]
async fn healthcheck_exits_0_when_serving_and_1_when_not() {
    let dir = tempfile::tempdir().unwrap();
    let (child, base) = start_serving(dir.path(), &[]).await;
    let port = base.rsplit(':').next().unwrap().to_string();
    let env = [
        ("inbound__serverAuth__tlsPolicy", "disabled"),
        ("inbound__bindAddress", "127.0.0.1"),
        ("inbound__httpPort", port.as_str()),
    ];
    let up = gridlet_cmd(&["healthcheck"], &env);
    let _ = terminate(child).await;
    assert_eq!(
        up.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let down = gridlet_cmd(&["healthcheck"], &env);
    assert_eq!(down.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&down.stderr).contains("unhealthy"));
}

/// Start the binary with stdout piped (not a terminal) and return its first log lines.
fn first_log_lines(env: &[(&str, &str)], n: usize) -> Vec<String> {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gridlet"))
        .current_dir(dir.path())
        .env("inbound__serverAuth__tlsPolicy", "disabled")
        .env("inbound__httpPort", "0")
        .env("broker__defaultMaxDeliveryAttempts", "7")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    while lines.len() < n {
        match rx.recv_timeout(WAIT) {
            Ok(l) => lines.push(l),
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    lines
}

#[test]
fn logs_carry_the_syslog_severity_and_no_colour_off_a_terminal() {
    let lines = first_log_lines(&[], 2);
    assert!(!lines.is_empty(), "no log output");
    for l in &lines {
        assert!(l.starts_with("<6> ") || l.starts_with("<4> "), "{l:?}");
        assert!(!l.contains('\u{1b}'), "escape code in {l:?}");
    }
    let start = &lines[0];
    assert!(start.contains("gridlet starting"), "{start}");
    assert!(start.contains(env!("CARGO_PKG_VERSION")), "{start}");
    assert!(
        start.contains("broker__defaultMaxDeliveryAttempts=7"),
        "{start}"
    );
}

#[test]
fn json_logs_are_one_object_per_line() {
    let lines = first_log_lines(&[("log__format", "json")], 2);
    assert!(!lines.is_empty(), "no log output");
    for l in &lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"));
        assert!(v["level"].is_string(), "{l}");
    }
}

/// Issue 16: the retry schedules' old names (`original`, `eventGridCloud`, `workfront`) keep
/// working, in any case, in the module setting and in a subscription; GET shows the name that
/// says what the schedule does, also after a restart on the same data; a wrong name is refused
/// with every accepted name listed.
#[tokio::test]
async fn retry_schedules_keep_their_old_names_as_aliases() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("broker__retrySchedule", "WorkFront"),
        ("outbound__webhook__httpsOnly", "false"),
    ];
    let (child, base) = start_serving(dir.path(), &env).await;
    let client = reqwest::Client::new();
    let mut rx = Receiver::start().await;
    let put = |path: &str, body: serde_json::Value| {
        client.put(format!("{base}{path}?{V}")).json(&body).send()
    };
    assert_eq!(
        put("/topics/t", serde_json::json!({}))
            .await
            .unwrap()
            .status(),
        200
    );
    let sub = |schedule: &str| {
        serde_json::json!({"properties": {
            "destination": {"endpointType": "WebHook", "properties": {"endpointUrl": rx.url("/hook")}},
            "retryPolicy": {"schedule": schedule}}})
    };
    let r = put("/topics/t/eventSubscriptions/old", sub("EVENTGRIDCLOUD"))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let shown: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        shown["properties"]["retryPolicy"]["schedule"],
        "tenSecondsToHourly"
    );
    let r = put("/topics/t/eventSubscriptions/bad", sub("hourly"))
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let text = r.text().await.unwrap();
    assert!(
        text.contains("oneThenEveryTenMinutes, tenSecondsToHourly, doublingForFourDays, original, eventGridCloud, workfront"),
        "{text}"
    );
    let r = client
        .post(format!("{base}/topics/t/events?{V}"))
        .json(&serde_json::json!([eg_event(
            "e1",
            "s",
            "t",
            serde_json::json!({})
        )]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(rx.next().await.json()[0]["id"], "e1");
    assert!(terminate(child).await.success());

    let (child, base) = start_serving(dir.path(), &env).await;
    let got: serde_json::Value = client
        .get(format!("{base}/topics/t/eventSubscriptions/old?{V}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        got["properties"]["retryPolicy"]["schedule"],
        "tenSecondsToHourly"
    );
    assert!(terminate(child).await.success());

    let err = start_up_error("broker__retrySchedule", "hourly");
    assert!(
        err.contains("doublingForFourDays, original, eventGridCloud, workfront"),
        "{err}"
    );
}

/// Issue 34: the real binary SIGKILLed during an uplink outage. Restarted, the endpoint's
/// outage is still known (stored on the transition), nothing was charged, and when the
/// endpoint is back every waiting event arrives once with `aeg-delivery-count: 0`, the health
/// state `Enabled` throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_an_outage_keeps_the_events_and_the_outage() {
    use serde_json::{json, Value};
    let dir = tempfile::tempdir().unwrap();
    let port = free_port(); // nothing listens here yet
    let env = [
        ("outbound__webhook__httpsOnly", "false"),
        ("metrics__reporterType", "prometheus"),
    ];
    let (mut child, base) = start_serving(dir.path(), &env).await;
    let c = reqwest::Client::new();
    let v = V;
    let put = |path: &str, body: Value| c.put(format!("{base}{path}?{v}")).json(&body).send();
    assert_eq!(put("/topics/t1", json!({})).await.unwrap().status(), 200);
    let sub = json!({"properties": {"destination": {"endpointType": "WebHook",
        "properties": {"endpointUrl": format!("http://127.0.0.1:{port}/hook")}},
        "persistencePolicy": {"isPersisted": true}}});
    assert_eq!(
        put("/topics/t1/eventSubscriptions/s1", sub)
            .await
            .unwrap()
            .status(),
        200
    );
    let events: Vec<Value> = (0..3)
        .map(|i| eg_event(&format!("k{i}"), "s", "t", json!({})))
        .collect();
    let r = c
        .post(format!("{base}/topics/t1/events?{v}"))
        .json(&events)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let labels = r#"topic="t1",subscription="s1""#;
    let m = |base: String| {
        let c = c.clone();
        async move {
            let text = c
                .get(format!("{base}/metrics?{v}"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            (
                metric(&text, "gridlet_endpoint_outage", labels),
                metric(&text, "gridlet_endpoint_health_state", labels),
                metric(&text, "gridlet_pending_events", labels),
            )
        }
    };
    eventually("the outage is noted", || async {
        match m(base.clone()).await {
            (Some(1), ..) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    child.kill().unwrap();
    child.wait().unwrap();

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Value, String)>();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |h: axum::http::HeaderMap, body: String| {
            let tx = tx.clone();
            async move {
                let count = h
                    .get("aeg-delivery-count")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                let _ = tx.send((serde_json::from_str(&body).unwrap(), count));
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    // A one-second probe interval, so the stored probe time is the only wait.
    let env = [
        ("outbound__webhook__httpsOnly", "false"),
        ("metrics__reporterType", "prometheus"),
        ("outbound__outageProbeSeconds", "1"),
    ];
    let (child, base) = start_serving(dir.path(), &env).await;
    let (outage, state, pending) = m(base.clone()).await;
    assert_eq!(state, Some(0), "never disabled");
    assert!(outage.is_some() && pending.is_some());
    let mut ids = Vec::new();
    while ids.len() < 3 {
        let (batch, count) = tokio::time::timeout(WAIT, rx.recv())
            .await
            .expect("the waiting events")
            .unwrap();
        assert_eq!(count, "0", "an outage charges no attempt");
        ids.extend(
            batch
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["id"].as_str().unwrap().to_string()),
        );
    }
    ids.sort();
    assert_eq!(ids, ["k0", "k1", "k2"]);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), rx.recv())
            .await
            .is_err(),
        "each once"
    );
    assert!(terminate(child).await.success());
}
