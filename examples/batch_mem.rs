//! What one sled batch costs in memory: `cargo run --release --example batch_mem -- [INSERTS]
//! [PER_BATCH]` inserts 300-byte values into a fresh sled tree, `PER_BATCH` per batch (default:
//! all in one), and prints the RSS before and after and the peak. The basis of
//! `store::sled::SLED_BATCH` (docs/BENCHMARKS.md).

/// `VmRSS` or `VmHWM` of this process, in MB.
fn status_mb(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn main() {
    let arg = |i: usize| std::env::args().nth(i).and_then(|a| a.parse::<u64>().ok());
    let n = arg(1).unwrap_or(100_000);
    let per_batch = arg(2).unwrap_or(n).max(1);
    let dir = tempfile::tempdir().expect("temporary directory");
    let db = sled::Config::new()
        .path(dir.path())
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
    println!(
        "{n} inserts in batches of {per_batch}: RSS {before:.1} -> {:.1} MB, peak {:.1} MB, {:.2} s",
        status_mb("VmRSS:"),
        status_mb("VmHWM:"),
        t.elapsed().as_secs_f64()
    );
}
