//! A persisted event keeps its trace across a restart: the real binary, a persisted
//! subscription whose webhook fails, SIGTERM, a new process on the same directories, and the
//! redelivery is in the publisher's trace (the webhook's `traceparent`, the `deliver` span the
//! collector receives, the JSON `delivered` log line).

use super::*;
use std::process::Child;

/// The real gridlet on the same directories each time, its JSON log lines on a channel.
struct Proc {
    child: Child,
    base: String,
    lines: mpsc::UnboundedReceiver<Value>,
}

impl Proc {
    async fn start(dir: &std::path::Path, c: &Collector) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = Command::new(env!("CARGO_BIN_EXE_gridlet"))
            .current_dir(dir)
            .env("inbound__serverAuth__tlsPolicy", "disabled")
            .env("inbound__clientAuth__clientCert__enabled", "false")
            .env("inbound__bindAddress", "127.0.0.1")
            .env("inbound__httpPort", port.to_string())
            .env("outbound__webhook__httpsOnly", "false")
            .env("persistence__metadataPath", dir.join("metadataDb"))
            .env("persistence__eventsPath", dir.join("eventsDb"))
            // The shortest built-in schedule: the retry is due 10 s after the failure.
            .env("broker__retrySchedule", "tenSecondsToHourly")
            .env("broker__logDeliverySuccess", "true")
            .env("log__format", "json")
            .envs(otel_env(c))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&l) {
                    let _ = tx.send(v);
                }
            }
        });
        gridlet::tls::install_default_provider();
        let base = format!("http://127.0.0.1:{port}");
        let client = reqwest::Client::new();
        let up = poll_within(WAIT, || client.get(format!("{base}/healthz")).send()).await;
        assert!(up.is_ok_and(|r| r.status() == 200), "gridlet serves");
        Self { child, base, lines }
    }

    /// SIGTERM, and wait for a clean exit.
    async fn stop(mut self) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success());
        let child = &mut self.child;
        let exited = poll_within(WAIT, || {
            std::future::ready(child.try_wait().unwrap().ok_or(()))
        })
        .await;
        assert!(exited.is_ok_and(|s| s.success()), "gridlet stops cleanly");
    }

    /// The next JSON log line whose message is `msg`.
    async fn line(&mut self, msg: &str) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let v = tokio::time::timeout_at(deadline, self.lines.recv())
                .await
                .unwrap_or_else(|_| panic!("a '{msg}' log line"))
                .unwrap_or_else(|| panic!("gridlet's output ended before '{msg}'"));
            if v["fields"]["message"] == msg {
                return v;
            }
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persisted_events_trace_survives_a_restart() {
    let mut c = Collector::start();
    let dir = tempfile::tempdir().unwrap();
    let mut rx = Receiver::start().await;
    rx.respond_with(500);

    let first = Proc::start(dir.path(), &c).await;
    let client = reqwest::Client::new();
    let url = |base: &str, p: &str| format!("{base}{p}?{V}");
    let r = client
        .put(url(&first.base, "/topics/t1"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let sub = json!({"properties": {
        "destination": {"endpointType": "WebHook", "properties": {"endpointUrl": rx.url("/h")}},
        "persistencePolicy": {"isPersisted": true}}});
    let r = client
        .put(url(&first.base, "/topics/t1/eventSubscriptions/s1"))
        .json(&sub)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = client
        .post(url(&first.base, "/topics/t1/events"))
        .header("traceparent", traceparent())
        .header("tracestate", "vendor=abc")
        .json(&json!([eg_event("e-1", "s", "t", json!({}))]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // The first attempt fails (500) and is scheduled 10 s later; the process stops before that.
    let failed = rx.next().await;
    assert!(header(&failed, "traceparent").starts_with(&format!("00-{TRACE}-")));
    let spans = c
        .until(
            "the publish, and the first attempt settled as a retry",
            |s| count(s, "publish") == 1 && count(s, "settle") == 1,
        )
        .await;
    let publish = named(&spans, "publish")[0].clone();
    assert_eq!(publish["trace_id"], TRACE);
    first.stop().await;

    // A new process on the same directories: the event comes back from the log with its trace.
    rx.respond_with(200);
    let mut second = Proc::start(dir.path(), &c).await;
    let got = rx.next().await;
    assert_eq!(got.json()[0]["id"], "e-1");
    let spans = c
        .until("the redelivery's deliver span", |s| {
            named(s, "deliver")
                .iter()
                .any(|d| d["attributes"]["gridlet.outcome"] == "delivered")
        })
        .await;
    let deliver = named(&spans, "deliver")
        .into_iter()
        .find(|d| d["attributes"]["gridlet.outcome"] == "delivered")
        .unwrap()
        .clone();
    assert_eq!(
        deliver["trace_id"], TRACE,
        "the publisher's trace: {deliver}"
    );
    assert_eq!(
        deliver["parent_span_id"], publish["span_id"],
        "a child of the publish span before the restart"
    );
    assert_eq!(deliver["trace_state"], "vendor=abc");
    assert_eq!(deliver["attributes"]["gridlet.delivery.attempt"], 2);
    assert_eq!(
        header(&got, "traceparent"),
        format!("00-{TRACE}-{}-01", deliver["span_id"].as_str().unwrap())
    );
    assert_eq!(header(&got, "tracestate"), "vendor=abc");
    let line = second.line("delivered").await;
    assert_eq!(line["fields"]["trace_id"], TRACE, "{line}");
    assert_eq!(line["fields"]["span_id"], deliver["span_id"], "{line}");
    second.stop().await;
}
