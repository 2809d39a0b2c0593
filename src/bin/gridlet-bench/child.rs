//! gridlet as a child process: start it with bench settings, wait until it serves, read its
//! footprint from `/proc`, stop it. Every child is registered so a panic or the watchdog can kill
//! it; dropping a [`Gridlet`] kills and reaps it.

use crate::net;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// `OTEL_EXPORTER_OTLP_ENDPOINT` for every child (`--otlp`: the bench's sink).
static OTLP_ENDPOINT: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Start every later child with OpenTelemetry export to `endpoint`.
pub fn set_otlp_endpoint(endpoint: String) {
    let _ = OTLP_ENDPOINT.set(endpoint);
}

/// Pids of running children (killed by the panic hook and the watchdog).
static CHILDREN: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// Kill every registered child with SIGKILL (panic hook, watchdog).
pub fn kill_all() {
    let pids = CHILDREN
        .lock()
        .map(|g| g.clone())
        .unwrap_or_else(|p| p.into_inner().clone());
    for pid in pids {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Register a child so the panic hook and the watchdog kill it.
pub fn register(pid: u32) {
    if let Ok(mut g) = CHILDREN.lock() {
        g.push(pid);
    }
}

/// Forget a child that was reaped.
pub fn unregister(pid: u32) {
    if let Ok(mut g) = CHILDREN.lock() {
        g.retain(|p| *p != pid);
    }
}

/// A free loopback port (bound and released; the tiny race is acceptable for a bench).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// How to start gridlet.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The gridlet binary.
    pub bin: PathBuf,
    /// Metadata and events directories live here.
    pub dir: PathBuf,
    /// Extra settings on top of the bench defaults.
    pub env: Vec<(String, String)>,
}

/// A running gridlet.
pub struct Gridlet {
    child: Child,
    /// Its pid.
    pub pid: u32,
    /// Its HTTP address.
    pub addr: SocketAddr,
    /// Spawn → first `/healthz` 200.
    pub startup: Duration,
    spec: Spec,
    http_port: u16,
    https_port: u16,
}

impl Drop for Gridlet {
    fn drop(&mut self) {
        // SIGTERM first (gridlet's graceful stop; profilers write their output), SIGKILL after 3 s.
        // Only while the child is unreaped: a reaped pid may already belong to someone else.
        if !matches!(self.child.try_wait(), Ok(None)) {
            unregister(self.pid);
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        unregister(self.pid);
    }
}

impl Gridlet {
    /// Start gridlet and wait (at most 120 s: a restart may restore a large backlog) until
    /// `/healthz` answers 200.
    pub async fn start(spec: &Spec) -> Result<Self, String> {
        let http_port = free_port().map_err(|e| format!("free port: {e}"))?;
        let https_port = free_port().map_err(|e| format!("free port: {e}"))?;
        Self::start_on(spec.clone(), http_port, https_port).await
    }

    async fn start_on(spec: Spec, http_port: u16, https_port: u16) -> Result<Self, String> {
        std::fs::create_dir_all(&spec.dir).map_err(|e| format!("{}: {e}", spec.dir.display()))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(spec.dir.join("gridlet.log"))
            .map_err(|e| format!("log file: {e}"))?;
        let log2 = log.try_clone().map_err(|e| format!("log file: {e}"))?;
        let mut cmd = Command::new(&spec.bin);
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("RUST_LOG", "info")
            .env("inbound__serverAuth__tlsPolicy", "enabled")
            .env("inbound__clientAuth__clientCert__enabled", "false")
            .env("outbound__webhook__httpsOnly", "false")
            .env("inbound__bindAddress", "127.0.0.1")
            .env("inbound__httpPort", http_port.to_string())
            .env("inbound__httpsPort", https_port.to_string())
            .env("metrics__reporterType", "prometheus")
            .env("persistence__metadataPath", spec.dir.join("metadataDb"))
            .env("persistence__eventsPath", spec.dir.join("eventsDb"))
            .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            // Allocator experiments (MIMALLOC_PURGE_DELAY=0, …) and OpenTelemetry export
            // (OTEL_EXPORTER_OTLP_ENDPOINT=…, the cost of tracing) reach the gridlet under test.
            .envs(
                std::env::vars()
                    .filter(|(k, _)| k.starts_with("MIMALLOC_") || k.starts_with("OTEL_")),
            )
            .envs(
                OTLP_ENDPOINT
                    .get()
                    .map(|e| ("OTEL_EXPORTER_OTLP_ENDPOINT", e.as_str())),
            )
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        let started = Instant::now();
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", spec.bin.display()))?;
        let pid = child.id();
        register(pid);
        let addr = SocketAddr::from(([127, 0, 0, 1], http_port));
        let mut g = Self {
            child,
            pid,
            addr,
            startup: Duration::ZERO,
            spec,
            http_port,
            https_port,
        };
        let give_up = started + Duration::from_secs(120);
        loop {
            if let Ok(Some(status)) = g.child.try_wait() {
                return Err(format!(
                    "gridlet exited during start-up ({status}); log:\n{}",
                    g.log_tail()
                ));
            }
            if let Ok((200, _)) = net::request(addr, "GET", "/healthz", "").await {
                g.startup = started.elapsed();
                return Ok(g);
            }
            if Instant::now() > give_up {
                return Err(format!(
                    "gridlet did not serve /healthz within 120 s; log:\n{}",
                    g.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
    }

    /// Stop it (SIGTERM, then SIGKILL after 15 s) and start it again on the same ports and
    /// directories; returns the new process (its `startup` is the restart time).
    pub async fn restart(self) -> Result<Self, String> {
        self.restart_after("-TERM").await
    }

    /// Kill it (SIGKILL: a crash, no clean stop) and start it again on the same ports and
    /// directories.
    pub async fn crash_restart(self) -> Result<Self, String> {
        self.restart_after("-KILL").await
    }

    async fn restart_after(mut self, signal: &str) -> Result<Self, String> {
        let _ = Command::new("kill")
            .args([signal, &self.pid.to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let spec = self.spec.clone();
        let (h, s) = (self.http_port, self.https_port);
        drop(self);
        Self::start_on(spec, h, s).await
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.spec.dir.join("gridlet.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Lines in its log so far (the hot path should add none at `info`).
    pub fn log_lines(&self) -> usize {
        std::fs::read_to_string(self.spec.dir.join("gridlet.log"))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }

    /// Footprint now.
    pub fn sample(&self) -> Footprint {
        Footprint::of(self.pid)
    }

    /// Bytes under its data directories.
    pub fn disk_bytes(&self) -> u64 {
        dir_size(&self.spec.dir.join("eventsDb")) + dir_size(&self.spec.dir.join("metadataDb"))
    }

    /// Its events directory (`persistence__eventsPath`).
    pub fn events_dir(&self) -> PathBuf {
        self.spec.dir.join("eventsDb")
    }

    /// Blocks allocated under its data directories (`du -sb`'s measure: what the device holds).
    pub fn du(&self) -> u64 {
        du_bytes(&self.events_dir()) + du_bytes(&self.spec.dir.join("metadataDb"))
    }
}

/// `write_bytes` of `/proc/<pid>/io`: bytes the process caused to be sent to the storage layer
/// (page-cache writes count when dirtied, direct I/O when submitted). `None` when unreadable.
pub fn write_bytes(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Σ `st_blocks` × 512 of the files and directories under `p` (what `du -sb` would print for
/// the blocks a file system holds, not the apparent sizes; bounded walk, symlinks not followed).
pub fn du_bytes(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![p.to_path_buf()];
    let mut visited = 0;
    while let Some(d) = stack.pop() {
        visited += 1;
        if visited > 100_000 {
            break;
        }
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(m) = e.metadata() else { continue };
            total += m.blocks() * 512;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    total
}

/// A reading of `/proc/<pid>`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Footprint {
    /// Resident set now (bytes).
    pub rss: u64,
    /// Peak resident set (bytes).
    pub hwm: u64,
    /// User + system CPU seconds so far.
    pub cpu_s: f64,
    /// The system (kernel) part of `cpu_s`: system calls, the block layer, page faults.
    pub sys_s: f64,
    /// Context switches of all its threads so far (voluntary and not): how often a thread
    /// slept and was woken, which costs CPU the closed loop's rate hides.
    pub switches: u64,
}

impl Footprint {
    /// Read `/proc/<pid>/status` and `/proc/<pid>/stat` (zeros where unreadable).
    pub fn of(pid: u32) -> Self {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let kb = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
                * 1024
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Fields after the command name (which may contain spaces) start at state = field 3;
        // utime and stime are fields 14 and 15.
        let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<&str> = after.split_whitespace().collect();
        let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let cpu_ticks = ticks(11) + ticks(12);
        Self {
            rss: kb("VmRSS:"),
            hwm: kb("VmHWM:"),
            cpu_s: cpu_ticks as f64 / clock_ticks() as f64,
            sys_s: ticks(12) as f64 / clock_ticks() as f64,
            switches: switches(pid),
        }
    }
}

/// Bytes written to the block device that holds `dir` so far (its sectors written × 512, from
/// `/sys/dev/block/MAJ:MIN/stat`): every write the device saw, the file system's own metadata
/// included, which `/proc/<pid>/io` does not count. `None` when `dir` is not on a block device.
pub fn device_written(dir: &std::path::Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let base = gridlet::store::fs::block_device_dir(std::fs::metadata(dir).ok()?.dev());
    let stat = std::fs::read_to_string(format!("{base}/stat")).ok()?;
    let sectors: u64 = stat.split_whitespace().nth(6)?.parse().ok()?;
    Some(sectors * 512)
}

/// Context switches of every thread of `pid` (0 where unreadable).
fn switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .flat_map(|status| {
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

fn clock_ticks() -> u64 {
    static TCK: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TCK.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .filter(|t| *t > 0)
            .unwrap_or(100)
    })
}

/// Apparent size of the files under `p` (bounded walk, symlinks not followed).
pub fn dir_size(p: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![p.to_path_buf()];
    let mut visited = 0;
    while let Some(d) = stack.pop() {
        visited += 1;
        if visited > 100_000 {
            break;
        }
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}
