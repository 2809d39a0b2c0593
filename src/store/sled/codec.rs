//! Key layouts of the sled trees: `queue_id u32 BE ‖ n u64 BE`, so a queue is one contiguous,
//! ordered range.

use super::io;
use crate::store::{QueueId, StoreError};

pub(super) fn queue_key(queue: QueueId, n: u64) -> [u8; 12] {
    let mut k = [0u8; 12];
    let (q, s) = k.split_at_mut(4);
    q.copy_from_slice(&queue.to_be_bytes());
    s.copy_from_slice(&n.to_be_bytes());
    k
}

pub(super) fn parse_key(k: &[u8]) -> Option<(QueueId, u64)> {
    let q: [u8; 4] = k.get(..4)?.try_into().ok()?;
    let s: [u8; 8] = k.get(4..12)?.try_into().ok()?;
    (k.len() == 12).then(|| (u32::from_be_bytes(q), u64::from_be_bytes(s)))
}

pub(super) fn be<const N: usize>(v: &[u8], at: usize) -> Option<[u8; N]> {
    v.get(at..at + N)?.try_into().ok()
}

/// Remove every key of `queue` in batches; returns the counted bytes freed.
pub(super) fn remove_prefix(tree: &sled::Tree, queue: QueueId) -> Result<u64, StoreError> {
    let mut freed = 0u64;
    loop {
        let mut batch = sled::Batch::default();
        let mut n = 0;
        for item in tree
            .scan_prefix(queue.to_be_bytes())
            .take(super::SLED_BATCH)
        {
            let (k, v) = item.map_err(io)?;
            freed += super::item_cost(v.len());
            batch.remove(k);
            n += 1;
        }
        if n == 0 {
            return Ok(freed);
        }
        tree.apply_batch(batch).map_err(io)?;
    }
}
