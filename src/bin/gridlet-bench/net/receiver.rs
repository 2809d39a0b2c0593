//! The bench's fast webhook receiver: counts events and requests, finds each event's send
//! stamp for publish→delivery latency, answers as its [`Mode`] says (up, down, stalled), and
//! optionally tracks ids to count duplicates. [`Syncer`] is the raw durable baseline's disk.

use super::{now_us, MAX_SAMPLES, MAX_STALL, STAMP};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// How the receiver answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// 200 at once, counting every event.
    Up,
    /// Hold every request until the mode changes (a subscriber that is down but reachable).
    Stall,
    /// 503 at once (a subscriber that refuses work).
    Refuse,
    /// 400 at once (a subscriber that rejects the events: dead letters under `standard`).
    BadRequest,
}

/// Counters and samples of the receiver.
pub struct RxStats {
    /// Events received with a 200 answer.
    pub events: AtomicU64,
    /// Requests received with a 200 answer.
    pub requests: AtomicU64,
    /// Time of the latest counted request (µs since base).
    pub last_us: AtomicU64,
    /// Time of the first counted request since the last reset (µs since base; 0: none yet).
    pub first_us: AtomicU64,
    /// With [`Receiver::track_ids`]: the publisher's event ids seen (`c{conn}-{seq}`), to
    /// count duplicates.
    ids: Mutex<Option<std::collections::HashSet<u64>>>,
    /// Events whose id was already seen (with [`Receiver::track_ids`]).
    pub duplicates: AtomicU64,
    /// Record latency samples.
    pub sampling: AtomicBool,
    samples: Mutex<Vec<u32>>,
}

impl RxStats {
    /// Take the latency samples (µs) recorded so far.
    pub fn take_samples(&self) -> Vec<u32> {
        std::mem::take(&mut *self.samples.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Forget everything (between runs).
    pub fn reset(&self) {
        self.events.store(0, Relaxed);
        self.requests.store(0, Relaxed);
        self.last_us.store(0, Relaxed);
        self.first_us.store(0, Relaxed);
        self.duplicates.store(0, Relaxed);
        if let Some(ids) = self.ids.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            ids.clear();
        }
        self.take_samples();
    }
}

/// A running receiver.
pub struct Receiver {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its counters.
    pub stats: Arc<RxStats>,
    mode: watch::Sender<Mode>,
    task: tokio::task::JoinHandle<()>,
}

/// Group commit at its simplest, for the **raw durable limit**: every request body is written to
/// one file and `fdatasync`ed before the 200; one thread syncs whatever arrived during the
/// previous sync as one write. The file is zero-filled once and overwritten in place (so a sync
/// writes data blocks, not the inode) with direct I/O where the file system takes it, groups
/// padded to 512 bytes, like gridlet's journal. What a durable hop costs on this disk with this
/// many publishers, with no broker logic at all.
pub struct Syncer {
    /// Bodies waiting for the next sync, and whether to stop.
    state: Mutex<(Vec<Waiting>, bool)>,
    wake: std::sync::Condvar,
}

/// A body waiting for the sync, and who to tell.
type Waiting = (Bytes, tokio::sync::oneshot::Sender<()>);

/// Size of the raw durable receiver's file (wraps around).
const SYNC_FILE_BYTES: u64 = 8 << 20;

impl Syncer {
    /// Create `path` (zero-filled) and start the syncing thread.
    pub fn start(path: &std::path::Path) -> std::io::Result<Arc<Self>> {
        use std::io::Write;
        let mut f = std::fs::File::create(path)?;
        f.write_all(&vec![0u8; SYNC_FILE_BYTES as usize])?;
        f.sync_all()?;
        let me = Arc::new(Self {
            state: Mutex::new((Vec::new(), false)),
            wake: std::sync::Condvar::new(),
        });
        // Direct I/O as gridlet's journal uses it; the page cache where refused.
        let f = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
                .unwrap_or(f)
        };
        let s = me.clone();
        std::thread::Builder::new()
            .name("raw-durable-sync".into())
            .spawn(move || s.run(f))?;
        Ok(me)
    }

    fn run(&self, f: std::fs::File) {
        use std::os::unix::fs::FileExt;
        const BLOCK: usize = 512;
        const ALIGN: usize = 4096;
        let mut off = 0u64;
        let mut raw = Vec::new();
        loop {
            let group = {
                let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
                while g.0.is_empty() && !g.1 {
                    g = self.wake.wait(g).unwrap_or_else(|p| p.into_inner());
                }
                if g.0.is_empty() {
                    return;
                }
                std::mem::take(&mut g.0)
            };
            let len: usize = group.iter().map(|(b, _)| b.len()).sum();
            let padded = len.div_ceil(BLOCK) * BLOCK;
            raw.clear();
            raw.reserve(padded + ALIGN);
            // Capacity reserved: no reallocation below, the aligned start stays aligned.
            let start = (ALIGN - raw.as_ptr() as usize % ALIGN) % ALIGN;
            raw.resize(start, 0);
            for (b, _) in &group {
                raw.extend_from_slice(b);
            }
            raw.resize(start + padded, 0);
            if off + padded as u64 > SYNC_FILE_BYTES {
                off = 0;
            }
            let buf = raw.get(start..).unwrap_or_default();
            let _ = f.write_all_at(buf, off).and_then(|_| f.sync_data());
            off += padded as u64;
            for (_, tx) in group {
                let _ = tx.send(());
            }
        }
    }

    /// Write `body` and wait until it is synced.
    async fn commit(&self, body: Bytes) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .push((body, tx));
        self.wake.notify_one();
        let _ = rx.await;
    }

    /// Stop the thread once the queue is empty.
    pub fn stop(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).1 = true;
        self.wake.notify_one();
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Receiver {
    /// Listen on a free loopback port.
    pub async fn start(base: Instant) -> std::io::Result<Self> {
        Self::start_with(base, None).await
    }

    /// Listen on a free loopback port; with a [`Syncer`], every body is synced before the 200.
    pub async fn start_with(base: Instant, syncer: Option<Arc<Syncer>>) -> std::io::Result<Self> {
        Self::serve(TcpListener::bind("127.0.0.1:0").await?, base, syncer)
    }

    /// Listen on loopback `port` (one nothing listened on until now: a link that returns).
    pub async fn start_on(base: Instant, port: u16) -> std::io::Result<Self> {
        Self::serve(TcpListener::bind(("127.0.0.1", port)).await?, base, None)
    }

    fn serve(
        listener: TcpListener,
        base: Instant,
        syncer: Option<Arc<Syncer>>,
    ) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let stats = Arc::new(RxStats {
            events: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            last_us: AtomicU64::new(0),
            first_us: AtomicU64::new(0),
            ids: Mutex::new(None),
            duplicates: AtomicU64::new(0),
            sampling: AtomicBool::new(true),
            samples: Mutex::new(Vec::with_capacity(1 << 20)),
        });
        let (mode, _) = watch::channel(Mode::Up);
        let st = stats.clone();
        let mode_tx = mode.clone();
        let task = tokio::spawn(async move {
            // Connection tasks are detached on purpose: the bench process exits when done, and
            // aborting the accept loop stops new ones.
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                let st = st.clone();
                let mode_rx = mode_tx.subscribe();
                let syncer = syncer.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        handle(req, st.clone(), mode_rx.clone(), base, syncer.clone())
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(true)
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok(Self {
            addr,
            stats,
            mode,
            task,
        })
    }

    /// Remember every event id from now on and count the ones seen twice.
    pub fn track_ids(&self) {
        *self.stats.ids.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(std::collections::HashSet::new());
    }

    /// Change how later (and held) requests are answered.
    pub fn set_mode(&self, m: Mode) {
        self.mode.send_replace(m);
    }

    /// The URL of a webhook path on this receiver.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
}

async fn handle(
    req: Request<Incoming>,
    st: Arc<RxStats>,
    mut mode: watch::Receiver<Mode>,
    base: Instant,
    syncer: Option<Arc<Syncer>>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let body = req.into_body().collect().await?.to_bytes();
    if let Some(s) = syncer {
        s.commit(body.clone()).await;
    }
    if *mode.borrow() == Mode::Stall {
        let _ = tokio::time::timeout(MAX_STALL, mode.wait_for(|m| *m != Mode::Stall)).await;
    }
    let m = *mode.borrow();
    if m != Mode::Up {
        let mut r = Response::new(Full::new(Bytes::new()));
        *r.status_mut() = match m {
            Mode::BadRequest => StatusCode::BAD_REQUEST,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        };
        return Ok(r);
    }
    let now = now_us(base);
    let mut n = 0u64;
    let sampling = st.sampling.load(Relaxed);
    let mut local = Vec::new();
    let mut rest: &[u8] = &body;
    while let Some(pos) = find(rest, STAMP) {
        rest = rest.get(pos + STAMP.len()..).unwrap_or_default();
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        let ts = std::str::from_utf8(rest.get(..digits).unwrap_or_default())
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(now);
        if sampling {
            local.push(now.saturating_sub(ts).min(u64::from(u32::MAX)) as u32);
        }
        n += 1;
    }
    if !local.is_empty() {
        let mut s = st.samples.lock().unwrap_or_else(|p| p.into_inner());
        if s.len() + local.len() <= MAX_SAMPLES {
            s.extend_from_slice(&local);
        }
    }
    count_ids(&st, &body);
    st.events.fetch_add(n, Relaxed);
    st.requests.fetch_add(1, Relaxed);
    let _ = st
        .first_us
        .compare_exchange(0, now.max(1), Relaxed, Relaxed);
    st.last_us.fetch_max(now, Relaxed);
    Ok(Response::new(Full::new(Bytes::new())))
}

/// With id tracking on, note each `"id":"c{conn}-{seq}"` of `body` and count the repeats.
fn count_ids(st: &RxStats, body: &[u8]) {
    const ID: &[u8] = b"\"id\":\"c";
    let mut guard = st.ids.lock().unwrap_or_else(|p| p.into_inner());
    let Some(ids) = guard.as_mut() else { return };
    let mut rest = body;
    while let Some(pos) = find(rest, ID) {
        rest = rest.get(pos + ID.len()..).unwrap_or_default();
        let num = |s: &[u8]| -> (u64, usize) {
            let d = s.iter().take_while(|b| b.is_ascii_digit()).count();
            let v = std::str::from_utf8(s.get(..d).unwrap_or_default())
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            (v, d)
        };
        let (conn, d) = num(rest);
        let (seq, _) = num(rest.get(d + 1..).unwrap_or_default());
        if !ids.insert(conn << 40 | seq) {
            st.duplicates.fetch_add(1, Relaxed);
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let first = *needle.first()?;
    let mut from = 0;
    while let Some(i) = hay.get(from..)?.iter().position(|b| *b == first) {
        let at = from + i;
        if hay.get(at..at + needle.len())? == needle {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::{events_body, EVENT_BYTES};
    use super::*;

    #[test]
    fn events_have_the_configured_size_and_a_stamp() {
        let base = Instant::now();
        let mut seq = 0;
        let b = events_body(3, &mut seq, 2, EVENT_BYTES, base);
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        let arr = v.as_array().unwrap();
        assert_eq!(arr.len(), 2);
        assert_eq!(seq, 2);
        assert_eq!(b.len(), 2 * EVENT_BYTES + 3);
        assert!(find(&b, STAMP).is_some());
    }

    #[test]
    fn tracked_ids_count_every_second_copy_and_only_those() {
        let st = RxStats {
            events: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            last_us: AtomicU64::new(0),
            first_us: AtomicU64::new(0),
            ids: Mutex::new(None),
            duplicates: AtomicU64::new(0),
            sampling: AtomicBool::new(false),
            samples: Mutex::new(Vec::new()),
        };
        let base = Instant::now();
        let (mut a, mut b) = (0, 0);
        let first = events_body(1, &mut a, 3, EVENT_BYTES, base);
        count_ids(&st, &first);
        assert_eq!(st.duplicates.load(Relaxed), 0, "off until asked");
        *st.ids.lock().unwrap() = Some(Default::default());
        count_ids(&st, &first);
        // Another publisher connection's ids are other events; c1-0..2 again are copies.
        count_ids(&st, &events_body(2, &mut b, 3, EVENT_BYTES, base));
        assert_eq!(st.duplicates.load(Relaxed), 0);
        a = 1;
        count_ids(&st, &events_body(1, &mut a, 3, EVENT_BYTES, base));
        assert_eq!(
            st.duplicates.load(Relaxed),
            2,
            "c1-1 and c1-2 again; c1-3 is new"
        );
        st.reset();
        count_ids(&st, &first);
        assert_eq!(st.duplicates.load(Relaxed), 0, "a reset forgets the ids");
    }
}
