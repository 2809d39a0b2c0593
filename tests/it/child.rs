//! The real gridlet binary as a child process, for the tests that kill it (SIGKILL), stop it
//! (SIGTERM) and start it again on the same data folder.
//!
//! Each run `run` of a test logs to `gridlet-{run}.log` in the data folder (stdout and stderr:
//! log lines go to stdout, start-up errors to stderr), so a failure can show what the process
//! said.

use crate::util::free_port;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long a start may take before the test fails with the process's log. Generous: a debug
/// build reads back a killed run's frames on two cores shared with the rest of the suite, and
/// one start timed out at the former 20 s while a release build ran beside the suite (cause not
/// found). A start that hangs still fails, with its log.
const START: Duration = Duration::from_secs(60);

/// The binary on `dir`'s `metadataDb` and `eventsDb`, plain HTTP on `http_port` of loopback,
/// no client certificates, `extra` settings last (they win over the defaults here).
pub fn command(dir: &Path, run: usize, http_port: u16, extra: &[(&str, &str)]) -> Command {
    let log = std::fs::File::create(log_path(dir, run)).unwrap();
    let mut c = Command::new(env!("CARGO_BIN_EXE_gridlet"));
    c.env_clear()
        .envs([
            ("inbound__serverAuth__tlsPolicy", "disabled"),
            ("inbound__clientAuth__clientCert__enabled", "false"),
            ("inbound__bindAddress", "127.0.0.1"),
            ("RUST_LOG", "warn"),
        ])
        .env("inbound__httpPort", http_port.to_string())
        .env("inbound__httpsPort", free_port().to_string())
        .env("persistence__metadataPath", dir.join("metadataDb"))
        .env("persistence__eventsPath", dir.join("eventsDb"))
        .envs(extra.iter().copied())
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log));
    c
}

fn log_path(dir: &Path, run: usize) -> PathBuf {
    dir.join(format!("gridlet-{run}.log"))
}

/// A started gridlet; SIGKILLed when dropped, so a failing test leaves nothing behind.
pub struct Gridlet {
    child: Child,
    /// `http://127.0.0.1:{port}`.
    pub base: String,
    log: PathBuf,
}

impl Drop for Gridlet {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Gridlet {
    /// Start run `run` on `dir` (see [`command`]) and wait until `/readyz` answers 200.
    ///
    /// A port [`free_port`] picked can be taken by another test before the child binds it: a
    /// child that exits because it cannot listen is started again on other ports (twice at
    /// most). A child that exits for another reason fails the test at once, with its log.
    pub async fn start(dir: &Path, run: usize, extra: &[(&str, &str)]) -> Self {
        gridlet::tls::install_default_provider();
        let mut attempt = 0;
        loop {
            let port = free_port();
            let child = command(dir, run, port, extra).spawn().unwrap();
            let mut g = Self {
                child,
                base: format!("http://127.0.0.1:{port}"),
                log: log_path(dir, run),
            };
            match g.ready(run).await {
                Ok(()) => return g,
                Err(_) if attempt < 2 && g.log().contains("cannot listen on") => attempt += 1,
                Err(status) => panic!(
                    "gridlet exited during its start (run {run}): {status}\n{}",
                    g.log()
                ),
            }
        }
    }

    /// Wait until `/readyz` answers 200 (within [`START`], else the test fails with the log);
    /// `Err` if the process exited first.
    async fn ready(&mut self, run: usize) -> Result<(), std::process::ExitStatus> {
        let client = reqwest::Client::new();
        let deadline = std::time::Instant::now() + START;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Err(status);
            }
            if let Ok(r) = client.get(format!("{}/readyz", self.base)).send().await {
                if r.status().is_success() {
                    return Ok(());
                }
            }
            assert!(
                std::time::Instant::now() < deadline,
                "timed out after {START:?} waiting for gridlet to start (run {run}):\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The names of the process's threads (`/proc/PID/task/*/comm`).
    pub fn threads(&self) -> Vec<String> {
        let dir = format!("/proc/{}/task", self.child.id());
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                    .map(|n| n.trim().to_string())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    /// What the process logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL, as a power cut looks to the process, and reap it.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, and wait for a clean exit (the store writes its checkpoint).
    pub fn stop(mut self) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(sent.success());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "clean stop: {status}\n{}", self.log());
    }
}
