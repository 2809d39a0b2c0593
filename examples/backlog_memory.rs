//! Heap bytes the event log store holds per pending event of a persisted backlog, counted by
//! the allocator (exact and repeatable, unlike RSS): after publishing N events to one queue, and
//! after a restart (the store reopened from its checkpoint and the queue's pending runs taken,
//! as the broker does at start).
//!
//! cargo run --release --example backlog_memory -- [N]      # N defaults to 1,000,000
//!
//! It also times the publishes (1,000 events per submit, up to 64 submits in flight: group
//! commit) and the drain (settlements of 64 events, as a subscription settles its batches):
//! figures for paired runs of two builds, noisy on a shared machine.
//!
//! A counting allocator needs `unsafe impl GlobalAlloc`: this example measures, it ships in no
//! binary.

use gridlet::store::log::{LogStore, LogStoreOptions};
use gridlet::store::{RetryState, Settled, Store, StoredEvent};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to `System` unchanged; only a counter is kept beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on as it is.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new, Ordering::Relaxed);
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn opts(dir: &std::path::Path) -> LogStoreOptions {
    LogStoreOptions {
        metadata_path: dir.join("m"),
        events_path: dir.join("e"),
        max_disk_bytes: 64 << 30,
        cache_bytes: 8 << 20,
        flush_every_ms: 1000,
        segment_bytes: gridlet::store::log::SEGMENT_BYTES,
        compact_idle_ms: gridlet::store::log::engine::COMPACT_IDLE_MS,
        refuse_damage: false,
    }
}

/// CPU seconds of this process so far (user + system, every thread), from `/proc/self/stat`.
fn cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<u64> = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    f.iter().sum::<u64>() as f64 / 100.0
}

fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.replace(['_', ','], "").parse().ok())
        .unwrap_or(1_000_000);
    let body = vec![b'x'; 256];
    let dir = tempfile::tempdir().unwrap();
    let q;
    {
        let store = LogStore::open(&opts(dir.path())).unwrap();
        q = store.next_queue_id().unwrap();
        let record = serde_json::json!({"v": 1, "name": "s", "topic": "t",
            "deliverySchema": "EventGridSchema", "persisted": true,
            "destination": {"endpointType": "WebHook", "properties": {"endpointUrl": "http://x/"}}});
        store
            .put_subscription(q, &serde_json::from_value(record).unwrap())
            .unwrap();
        let before = live();
        let t = std::time::Instant::now();
        let cpu = cpu_s();
        let mut commits = std::collections::VecDeque::new();
        let mut seq = 1;
        while seq <= n {
            let chunk: Vec<_> = (seq..(seq + 1000).min(n + 1))
                .map(|s| {
                    let e = StoredEvent {
                        seq: s,
                        id: format!("{s:016x}-0000-0000-0000-000000000000"),
                        body: bytes::Bytes::copy_from_slice(&body),
                        state: RetryState {
                            attempts: 0,
                            first_enqueued_ms: 1_800_000_000_000 + s / 1000,
                            due_ms: 0,
                        },
                        trace: None,
                    };
                    (q, e)
                })
                .collect();
            seq += chunk.len() as u64;
            commits.push_back(store.submit(chunk).unwrap());
            if commits.len() >= 64 {
                if let Some(c) = commits.pop_front() {
                    c.wait().await.unwrap();
                }
            }
        }
        for c in commits {
            c.wait().await.unwrap();
        }
        store.commit().await.unwrap();
        let publish_s = t.elapsed().as_secs_f64();
        let publish_cpu = cpu_s() - cpu;
        let held = live().saturating_sub(before);
        println!(
            "{n} pending events of {} B: store heap +{held} B after publishing ({:.2} B/event, the tail of recent bodies included)",
            body.len(),
            held as f64 / n as f64
        );
        println!(
            "  published at {:.0} events/s, {:.2} µs CPU per event",
            n as f64 / publish_s,
            publish_cpu * 1e6 / n as f64
        );
        store.close();
    }
    let before = live();
    let store = LogStore::open(&opts(dir.path())).unwrap();
    let runs = store.pending_runs(q).unwrap();
    let held = live().saturating_sub(before);
    println!(
        "after a restart: store heap +{held} B with {} pending ({:.3} B/event), {} fresh runs",
        runs.len(),
        held as f64 / n as f64,
        runs.fresh.len()
    );
    drop(runs);
    let kept = live().saturating_sub(before);
    println!(
        "  the store alone, pending runs handed over: +{kept} B ({:.3} B/event)",
        kept as f64 / n as f64
    );
    let t = std::time::Instant::now();
    let cpu = cpu_s();
    for first in (1..=n).step_by(64) {
        let seqs = first..(first + 64).min(n + 1);
        store
            .remove(q, &Settled::all(seqs, body.len() as u32))
            .unwrap();
    }
    store.commit().await.unwrap();
    println!(
        "  drained at {:.0} events/s (settlements of 64), {:.3} µs CPU per event",
        n as f64 / t.elapsed().as_secs_f64(),
        (cpu_s() - cpu) * 1e6 / n as f64
    );
    store.close();
}
