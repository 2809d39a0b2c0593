//! Memory and time of deleting a persisted subscription with a large backlog, straight on the
//! sled store: `cargo run --release --example delete_mem -- [EVENTS]` (default 1,000,000).
//! Prints the RSS before and after the delete and the process's peak. Results are recorded in
//! docs/BENCHMARKS.md.

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

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let dir = tempfile::tempdir().expect("temporary directory");
    let opts = SledOptions {
        metadata_path: dir.path().join("m"),
        events_path: dir.path().join("e"),
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
    println!(
        "{n} events: RSS before the delete {before:.1} MB, after {:.1} MB, process peak {:.1} MB; the delete took {:.2} s",
        status_mb("VmRSS:"),
        status_mb("VmHWM:"),
        t.elapsed().as_secs_f64()
    );
}
