//! Memory of large sled operations, the basis of `store::sled::SLED_BATCH` (results in
//! docs/BENCHMARKS.md):
//!
//! * `cargo run --release --example sled_mem -- batch [INSERTS] [PER_BATCH]`: inserts 300-byte
//!   values into a fresh sled tree, `PER_BATCH` per batch (default: all in one).
//! * `cargo run --release --example sled_mem -- delete [EVENTS]`: stores EVENTS (default
//!   1,000,000) in a persisted subscription through the sled store, reopens it (as after a
//!   restart) and deletes the subscription.
//!
//! Each prints the RSS before and after and the process's peak.

use bytes::Bytes;
use gridlet::store::sled::{SledOptions, SledStore};
use gridlet::store::{RetryState, Store, StoredEvent};

/// `VmRSS` or `VmHWM` of this process, in MB.
fn status_mb(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn arg(i: usize) -> Option<u64> {
    std::env::args().nth(i).and_then(|a| a.parse().ok())
}

fn report(what: &str, before: f64, t: std::time::Instant) {
    println!(
        "{what}: RSS {before:.1} -> {:.1} MB, process peak {:.1} MB, {:.2} s",
        status_mb("VmRSS:"),
        status_mb("VmHWM:"),
        t.elapsed().as_secs_f64()
    );
}

fn batch(dir: &std::path::Path) {
    let n = arg(2).unwrap_or(100_000);
    let per_batch = arg(3).unwrap_or(n).max(1);
    let db = sled::Config::new()
        .path(dir)
        .cache_capacity(8 << 20)
        .open()
        .expect("sled opens");
    let before = status_mb("VmRSS:");
    let t = std::time::Instant::now();
    let value = vec![b'x'; 300];
    let mut i = 0u64;
    while i < n {
        let mut batch = sled::Batch::default();
        for _ in 0..per_batch.min(n - i) {
            batch.insert(&i.to_be_bytes(), value.as_slice());
            i += 1;
        }
        db.apply_batch(batch).expect("batch applies");
    }
    report(&format!("{n} inserts in batches of {per_batch}"), before, t);
}

async fn delete(dir: &std::path::Path) {
    let n = arg(2).unwrap_or(1_000_000);
    let opts = SledOptions {
        metadata_path: dir.join("m"),
        events_path: dir.join("e"),
        max_disk_bytes: 1 << 40,
        cache_bytes: 8 << 20,
        flush_every_ms: 1000,
        checkpoint_every: std::time::Duration::from_millis(200),
    };
    let store = SledStore::open(&opts).expect("store opens");
    let q = store.next_queue_id().expect("queue id");
    store
        .put_subscription("t", q, &serde_json::json!({"name": "s"}))
        .expect("subscription record");
    let body = Bytes::from(vec![b'x'; 256]);
    let state = RetryState {
        attempts: 0,
        first_enqueued_ms: 1,
        due_ms: 0,
    };
    let mut seq = 0;
    while seq < n {
        let items: Vec<_> = (0..1000.min(n - seq))
            .map(|_| {
                seq += 1;
                let e = StoredEvent {
                    seq,
                    id: format!("e{seq}"),
                    body: body.clone(),
                    state,
                };
                (q, e)
            })
            .collect();
        store.append_commit(items).await.expect("append");
    }
    drop(store);
    // Reopened, as after a restart: the backlog is in sled, not in the journal.
    let store = SledStore::open(&opts).expect("store reopens");
    let before = status_mb("VmRSS:");
    let t = std::time::Instant::now();
    store.delete_subscription(q).expect("delete");
    report(
        &format!("deleting a subscription with {n} events"),
        before,
        t,
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let dir = tempfile::tempdir().expect("temporary directory");
    match std::env::args().nth(1).as_deref() {
        Some("batch") => batch(dir.path()),
        Some("delete") => delete(dir.path()).await,
        _ => eprintln!("usage: sled_mem batch [INSERTS] [PER_BATCH] | delete [EVENTS]"),
    }
}
