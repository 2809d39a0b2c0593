//! The real binary: start-up errors, serving, and graceful shutdown on SIGTERM.

use crate::util::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
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
async fn start_serving(
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
    let deadline = Instant::now() + WAIT;
    let serving = loop {
        if let Ok(r) = client.get(format!("{base}/healthz")).send().await {
            break r.status() == 200;
        }
        if Instant::now() >= deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    if !serving {
        let _ = child.kill();
        let _ = child.wait();
        panic!("gridlet did not start serving");
    }
    (child, base)
}

/// Send SIGTERM and wait for the exit status.
async fn terminate(mut child: std::process::Child) -> std::process::ExitStatus {
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("gridlet did not stop on SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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

/// Threads of `pid` whose name is tokio's worker name. tokio's blocking pool uses the same name,
/// so count before anything ran there (management calls do, see `Broker::manage`).
fn runtime_workers(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "tokio-rt-worker")
        .count()
}

#[tokio::test]
async fn worker_threads_setting_sizes_the_async_runtime() {
    for n in [1usize, 3] {
        let dir = tempfile::tempdir().unwrap();
        let value = n.to_string();
        let (child, _) = start_serving(dir.path(), &[("broker__workerThreads", &value)]).await;
        let workers = runtime_workers(child.id());
        let status = terminate(child).await;
        assert_eq!(workers, n, "broker__workerThreads={n}");
        assert!(status.success(), "{status:?}");
    }
    let err = start_up_error("broker__workerThreads", "5000");
    assert!(err.contains("from 0 to 1024"), "{err}");
}
