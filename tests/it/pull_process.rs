//! Pull delivery against the real binary: an event received and not acknowledged when gridlet
//! is SIGKILLed comes back after the restart with its `deliveryCount` kept and incremented; an
//! event whose acknowledgement was answered 200 never comes back.
//!
//! A lock lasts at least 60 s (Event Grid's minimum), and a real process cannot run on tokio's
//! paused clock. So the test uses the clock seam the binary already has: before the restart it
//! writes the clock's heartbeat file (`src/clock.rs`) two minutes ahead, and the restarted
//! gridlet's clock resumes from there, past the locks' expiry, without anyone waiting for it.

use crate::pull::{publish_batch, receive, settle, Ns};
use crate::util::eventually_within;
use serde_json::json;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Proc {
    child: Child,
    ns: Ns,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn spawn(dir: &Path, run: usize) -> Proc {
    let port = free_port();
    let log = std::fs::File::create(dir.join(format!("gridlet-{run}.log"))).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_gridlet"))
        .env_clear()
        .envs([
            ("inbound__serverAuth__tlsPolicy", "disabled"),
            ("inbound__clientAuth__clientCert__enabled", "false"),
            ("inbound__bindAddress", "127.0.0.1"),
            ("RUST_LOG", "warn"),
        ])
        .env("inbound__httpPort", port.to_string())
        .env("persistence__metadataPath", dir.join("metadataDb"))
        .env("persistence__eventsPath", dir.join("eventsDb"))
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();
    gridlet::tls::install_default_provider();
    let p = Proc {
        child,
        ns: Ns {
            base: format!("http://127.0.0.1:{port}"),
            client: reqwest::Client::new(),
        },
    };
    eventually_within(Duration::from_secs(20), "gridlet to start", || async {
        let r =
            p.ns.client
                .get(format!("{}/readyz", p.ns.base))
                .send()
                .await;
        match r {
            Ok(r) if r.status().is_success() => Ok(()),
            _ => Err(
                std::fs::read_to_string(dir.join(format!("gridlet-{run}.log"))).unwrap_or_default(),
            ),
        }
    })
    .await;
    p
}

/// A CloudEvents topic `q` with a queue subscription `s`.
async fn create(ns: &Ns) {
    for (path, body) in [
        (
            "/topics/q",
            json!({"properties":{"inputSchema":"CloudEventSchemaV1_0"}}),
        ),
        (
            "/topics/q/eventSubscriptions/s",
            json!({"properties":{"deliveryConfiguration":{"deliveryMode":"Queue"}}}),
        ),
    ] {
        let r = ns
            .client
            .put(format!("{}{path}?api-version=2019-01-01-preview", ns.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_between_receive_and_acknowledge_redelivers_and_never_an_acknowledged_event() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = spawn(dir.path(), 0).await;
    create(&p.ns).await;
    publish_batch(&p.ns, "q", ["a", "b", "c"].map(String::from)).await;
    let got = receive(&p.ns, "q", "s", 3, 0).await;
    assert_eq!(
        got.iter().map(|e| (e.2.as_str(), e.1)).collect::<Vec<_>>(),
        [("a", 1), ("b", 1), ("c", 1)]
    );
    let r = settle(&p.ns, "q", "s", "acknowledge", &[&got[0].0]).await;
    assert_eq!(r["succeededLockTokens"].as_array().unwrap().len(), 1);
    // SIGKILL: no shutdown, no final heartbeat.
    p.child.kill().unwrap();
    p.child.wait().unwrap();
    // The restarted gridlet's clock resumes two minutes on: the 60 s locks have expired.
    let ahead = gridlet::clock::system_wall_ms() + 120_000;
    gridlet::clock::write_heartbeat(&dir.path().join("metadataDb"), ahead).unwrap();
    let p = spawn(dir.path(), 1).await;
    let mut again = receive(&p.ns, "q", "s", 10, 5).await;
    again.sort_by(|x, y| x.2.cmp(&y.2));
    assert_eq!(
        again
            .iter()
            .map(|e| (e.2.as_str(), e.1))
            .collect::<Vec<_>>(),
        [("b", 2), ("c", 2)],
        "redelivered with their counts; the acknowledged one never"
    );
    // Tokens from before the restart are lost; the new ones settle.
    let r = settle(&p.ns, "q", "s", "acknowledge", &[&got[1].0]).await;
    assert_eq!(r["failedLockTokens"][0]["error"]["code"], "TokenLost");
    let tokens: Vec<&str> = again.iter().map(|e| e.0.as_str()).collect();
    let r = settle(&p.ns, "q", "s", "acknowledge", &tokens).await;
    assert_eq!(r["succeededLockTokens"].as_array().unwrap().len(), 2);
    assert!(receive(&p.ns, "q", "s", 10, 0).await.is_empty());
}
