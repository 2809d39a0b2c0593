//! The peer of the `store` scenario: NATS JetStream's file store (Debian's `nats-server`), run as
//! a child process on 127.0.0.1 and driven over the NATS text protocol (`CONNECT`, `PUB` with a
//! reply subject, `SUB`, `MSG`/`HMSG`, `PING`/`PONG`) and the JetStream JSON API over
//! request/reply. No client crate: the few verbs the bench needs fit in this file.
//!
//! Every publish waits for its JetStream `PubAck` (so both brokers answer "stored"); consumers are
//! durable pull consumers with explicit acks, acked by publishing to each message's reply subject.

use crate::child;
use bytes::Bytes;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

/// Longest wait for one JetStream API answer or one batch of PubAcks.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// `nats-server` on the PATH or in the sbin directories Debian installs it to.
pub fn find_server() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/usr/bin"].map(PathBuf::from))
        .map(|d| d.join("nats-server"))
        .find(|p| p.is_file())
}

/// The server's version line (`nats-server: v2.9.10`).
pub fn version(bin: &Path) -> String {
    Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "nats-server (version unknown)".into())
}

/// A running `nats-server -js` with its store in `dir`; killed and reaped on drop.
pub struct Server {
    child: Child,
    /// Its pid (for `/proc/<pid>/io`).
    pub pid: u32,
    port: u16,
    /// The JetStream store directory (`-sd`).
    pub dir: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        child::unregister(self.pid);
    }
}

impl Server {
    /// Start it on a free loopback port and connect a client (at most 15 s).
    pub async fn start(bin: &Path, dir: PathBuf) -> Result<(Self, Client), String> {
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let port = child::free_port().map_err(|e| format!("free port: {e}"))?;
        let log = std::fs::File::create(dir.with_extension("log"))
            .map_err(|e| format!("nats log file: {e}"))?;
        let log2 = log.try_clone().map_err(|e| format!("nats log file: {e}"))?;
        let child = Command::new(bin)
            .arg("-js")
            .arg("-sd")
            .arg(&dir)
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let pid = child.id();
        child::register(pid);
        let mut s = Self {
            child,
            pid,
            port,
            dir,
        };
        let give_up = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(status)) = s.child.try_wait() {
                return Err(format!("nats-server exited during start-up ({status})"));
            }
            if let Ok(c) = Client::connect(s.port).await {
                // JetStream answers once its store is up.
                if c.request("$JS.API.INFO", b"").await.is_ok() {
                    return Ok((s, c));
                }
            }
            if Instant::now() > give_up {
                return Err("nats-server did not answer $JS.API.INFO within 15 s".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Blocks held under its store directory.
    pub fn du(&self) -> u64 {
        child::du_bytes(&self.dir)
    }
}

/// A message received: subject, reply subject, payload, and whether it carried headers (for a
/// pull consumer that means a status such as `404 No Messages` or `408 Request Timeout`).
#[derive(Debug)]
pub struct Msg {
    pub reply: Option<String>,
    pub payload: Vec<u8>,
    pub status: bool,
}

/// One connection: a reader task routes answers to waiting requests and everything else (pulled
/// messages) to a channel.
pub struct Client {
    w: Arc<tokio::sync::Mutex<OwnedWriteHalf>>,
    waiting: Arc<Mutex<HashMap<String, oneshot::Sender<Msg>>>>,
    pulled: tokio::sync::Mutex<mpsc::UnboundedReceiver<Msg>>,
    inbox: String,
    next: AtomicU64,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Client {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Client {
    async fn connect(port: u16) -> Result<Self, String> {
        let stream = tokio::time::timeout(
            Duration::from_secs(2),
            TcpStream::connect(("127.0.0.1", port)),
        )
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| format!("connect: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (r, w) = stream.into_split();
        let mut r = BufReader::with_capacity(1 << 20, r);
        let mut info = String::new();
        tokio::time::timeout(Duration::from_secs(2), r.read_line(&mut info))
            .await
            .map_err(|_| "no INFO".to_string())?
            .map_err(|e| format!("INFO: {e}"))?;
        if !info.starts_with("INFO ") {
            return Err(format!("expected INFO, got {info:?}"));
        }
        let inbox = format!("_INBOX.bench{}", std::process::id());
        let w = Arc::new(tokio::sync::Mutex::new(w));
        let hello = format!(
            "CONNECT {{\"verbose\":false,\"pedantic\":false,\"headers\":true,\"no_responders\":true,\"lang\":\"rust\",\"version\":\"0\",\"protocol\":1}}\r\nSUB {inbox}.> 1\r\n"
        );
        w.lock()
            .await
            .write_all(hello.as_bytes())
            .await
            .map_err(|e| format!("CONNECT: {e}"))?;
        let waiting = Arc::new(Mutex::new(HashMap::new()));
        let (tx, rx) = mpsc::unbounded_channel();
        let reader = tokio::spawn(read_loop(r, w.clone(), waiting.clone(), tx));
        Ok(Self {
            w,
            waiting,
            pulled: tokio::sync::Mutex::new(rx),
            inbox,
            next: AtomicU64::new(0),
            reader,
        })
    }

    fn new_inbox(&self) -> String {
        format!("{}.{}", self.inbox, self.next.fetch_add(1, Relaxed))
    }

    async fn write(&self, buf: &[u8]) -> Result<(), String> {
        self.w
            .lock()
            .await
            .write_all(buf)
            .await
            .map_err(|e| format!("nats write: {e}"))
    }

    /// Publish `payloads` to `subject`, each with its own reply inbox, in one write; wait for
    /// every answer (the JetStream PubAcks). Errors on the first `{"error":…}`.
    pub async fn publish_acked(&self, subject: &str, payloads: &[Bytes]) -> Result<(), String> {
        let mut buf = Vec::with_capacity(payloads.iter().map(|p| p.len() + 96).sum());
        let mut acks = Vec::with_capacity(payloads.len());
        for p in payloads {
            let inbox = self.new_inbox();
            let (tx, rx) = oneshot::channel();
            lock(&self.waiting).insert(inbox.clone(), tx);
            acks.push(rx);
            buf.extend_from_slice(format!("PUB {subject} {inbox} {}\r\n", p.len()).as_bytes());
            buf.extend_from_slice(p);
            buf.extend_from_slice(b"\r\n");
        }
        self.write(&buf).await?;
        for rx in acks {
            let m = tokio::time::timeout(REQUEST_TIMEOUT, rx)
                .await
                .map_err(|_| "no PubAck within 30 s".to_string())?
                .map_err(|_| "connection closed before the PubAck".to_string())?;
            if m.status || m.payload.windows(8).any(|w| w == b"\"error\":") {
                return Err(format!(
                    "publish refused: {}",
                    String::from_utf8_lossy(&m.payload)
                ));
            }
        }
        Ok(())
    }

    /// One request/reply round trip; the answer's JSON.
    pub async fn request(&self, subject: &str, body: &[u8]) -> Result<serde_json::Value, String> {
        let inbox = self.new_inbox();
        let (tx, rx) = oneshot::channel();
        lock(&self.waiting).insert(inbox.clone(), tx);
        let mut buf = format!("PUB {subject} {inbox} {}\r\n", body.len()).into_bytes();
        buf.extend_from_slice(body);
        buf.extend_from_slice(b"\r\n");
        self.write(&buf).await?;
        let m = tokio::time::timeout(REQUEST_TIMEOUT, rx)
            .await
            .map_err(|_| format!("{subject}: no answer within 30 s"))?
            .map_err(|_| format!("{subject}: connection closed"))?;
        if m.status {
            return Err(format!("{subject}: no responders"));
        }
        let v: serde_json::Value = serde_json::from_slice(&m.payload)
            .map_err(|e| format!("{subject}: answer is not JSON: {e}"))?;
        match v.get("error") {
            Some(e) => Err(format!("{subject}: {e}")),
            None => Ok(v),
        }
    }

    /// A file-storage stream on `subject` (`retention`: `workqueue` or `interest`).
    pub async fn create_stream(
        &self,
        name: &str,
        subject: &str,
        retention: &str,
    ) -> Result<(), String> {
        let cfg = serde_json::json!({"name": name, "subjects": [subject], "retention": retention,
            "storage": "file", "num_replicas": 1, "discard": "old"});
        self.request(
            &format!("$JS.API.STREAM.CREATE.{name}"),
            cfg.to_string().as_bytes(),
        )
        .await
        .map(|_| ())
    }

    /// A durable pull consumer with explicit acks, from the stream's first message.
    pub async fn create_consumer(&self, stream: &str, durable: &str) -> Result<(), String> {
        let cfg = serde_json::json!({"stream_name": stream, "config": {"durable_name": durable,
            "ack_policy": "explicit", "deliver_policy": "all", "max_ack_pending": 1_000_000,
            "ack_wait": 300_000_000_000u64}});
        self.request(
            &format!("$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{durable}"),
            cfg.to_string().as_bytes(),
        )
        .await
        .map(|_| ())
    }

    /// Messages stored in `stream` now.
    pub async fn stream_messages(&self, stream: &str) -> Result<u64, String> {
        let v = self
            .request(&format!("$JS.API.STREAM.INFO.{stream}"), b"")
            .await?;
        v.pointer("/state/messages")
            .and_then(|m| m.as_u64())
            .ok_or_else(|| format!("stream info without state.messages: {v}"))
    }

    /// Pull and ack until `expected` messages arrived or `deadline`; returns how many arrived.
    pub async fn drain(
        &self,
        stream: &str,
        consumer: &str,
        expected: u64,
        deadline: Instant,
    ) -> u64 {
        const BATCH: u64 = 1000;
        let mut got = 0u64;
        let mut rx = self.pulled.lock().await;
        let next = format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}");
        while got < expected && Instant::now() < deadline {
            let want = BATCH.min(expected - got);
            // The answer subject is not registered as waiting, so the messages reach `pulled`.
            let req = format!("{{\"batch\":{want},\"expires\":2000000000}}");
            let mut buf = format!("PUB {next} {} {}\r\n{req}\r\n", self.new_inbox(), req.len());
            if self
                .write(&std::mem::take(&mut buf).into_bytes())
                .await
                .is_err()
            {
                break;
            }
            let mut this = 0;
            let mut acks = Vec::new();
            while this < want {
                let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(3), rx.recv()).await
                else {
                    break;
                };
                if m.status {
                    break; // 408 (the request expired) or 404: ask again
                }
                if let Some(r) = m.reply {
                    acks.extend_from_slice(format!("PUB {r} 0\r\n\r\n").as_bytes());
                }
                this += 1;
            }
            if self.write(&acks).await.is_err() {
                break;
            }
            got += this;
        }
        got
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Read frames until the connection ends; answer `PING`s.
async fn read_loop(
    mut r: BufReader<tokio::net::tcp::OwnedReadHalf>,
    w: Arc<tokio::sync::Mutex<OwnedWriteHalf>>,
    waiting: Arc<Mutex<HashMap<String, oneshot::Sender<Msg>>>>,
    pulled: mpsc::UnboundedSender<Msg>,
) {
    let mut line = String::new();
    loop {
        line.clear();
        match r.read_line(&mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let parts: Vec<&str> = line.split_whitespace().collect();
        // MSG <subject> <sid> [reply] <bytes>; HMSG <subject> <sid> [reply] <hdr bytes> <bytes>
        let (subject, reply, hdr, total) = match parts.as_slice() {
            ["PING"] => {
                let _ = w.lock().await.write_all(b"PONG\r\n").await;
                continue;
            }
            ["MSG", s, _, n] => (*s, None, 0, *n),
            ["MSG", s, _, rep, n] => (*s, Some(*rep), 0, *n),
            ["HMSG", s, _, h, n] => (*s, None, h.parse().unwrap_or(0), *n),
            ["HMSG", s, _, rep, h, n] => (*s, Some(*rep), h.parse().unwrap_or(0), *n),
            [first, ..] if first.starts_with("-ERR") => {
                eprintln!("gridlet-bench: nats: {}", line.trim());
                continue;
            }
            _ => continue, // +OK, PONG, INFO
        };
        let Ok(total) = total.parse::<usize>() else {
            return;
        };
        let mut data = vec![0u8; total + 2];
        if r.read_exact(&mut data).await.is_err() {
            return;
        }
        data.truncate(total);
        let msg = Msg {
            reply: reply.map(str::to_string),
            payload: data.get(hdr..).unwrap_or_default().to_vec(),
            status: hdr > 0,
        };
        let subject = subject.to_string();
        let waiter = lock(&waiting).remove(&subject);
        match waiter {
            Some(tx) => {
                let _ = tx.send(msg);
            }
            None => {
                let _ = pulled.send(msg);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A fake server: answers the first request with `MSG` (JSON) and the second with an `HMSG`
    /// status (no responders), after a `PING` the client must answer.
    async fn fake(listener: TcpListener) -> String {
        let (s, _) = listener.accept().await.unwrap();
        let (r, mut w) = s.into_split();
        let mut r = BufReader::new(r);
        w.write_all(b"INFO {\"server_id\":\"x\"}\r\n")
            .await
            .unwrap();
        let mut seen = String::new();
        let mut line = String::new();
        let mut answered = 0;
        while answered < 2 {
            line.clear();
            if r.read_line(&mut line).await.unwrap() == 0 {
                break;
            }
            seen.push_str(&line);
            let parts: Vec<&str> = line.split_whitespace().collect();
            if let ["PUB", _, inbox, n] = parts.as_slice() {
                let mut body = vec![0; n.parse::<usize>().unwrap() + 2];
                r.read_exact(&mut body).await.unwrap();
                let reply = if answered == 0 {
                    format!("PING\r\nMSG {inbox} 1 8\r\n{{\"ok\":1}}\r\n")
                } else {
                    let h = "NATS/1.0 503\r\n\r\n";
                    format!("HMSG {inbox} 1 {} {}\r\n{h}\r\n", h.len(), h.len())
                };
                w.write_all(reply.as_bytes()).await.unwrap();
                answered += 1;
            }
        }
        line.clear();
        if !seen.contains("PONG") {
            let _ = tokio::time::timeout(Duration::from_secs(5), r.read_line(&mut line)).await;
        }
        seen + &line
    }

    #[tokio::test]
    async fn requests_get_msg_answers_and_statuses_are_errors() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(fake(listener));
        let c = Client::connect(port).await.unwrap();
        let v = c.request("$JS.API.INFO", b"").await.unwrap();
        assert_eq!(v["ok"], 1);
        let e = c
            .publish_acked("nowhere", &[Bytes::from_static(b"x")])
            .await;
        assert!(e.unwrap_err().contains("publish refused"));
        let seen = server.await.unwrap();
        assert!(seen.starts_with("CONNECT {"), "{seen}");
        assert!(seen.contains("PONG"), "the client answers PING: {seen}");
    }
}
