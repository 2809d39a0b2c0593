//! The event operations of the sled store: the [`Store`] implementation (metadata calls go to
//! [`super::metadata`]), and removing settled events from the unflushed map or sled.
//!
//! Invariants: every stored byte is counted in `live` while stored (reserved before a write,
//! given back when removed); an event is read from the unflushed map first, then sled, under
//! the map's lock so a checkpoint cannot move it between the two reads.

use super::codec::{
    decode_state, decode_value, encode_value, event_key, parse_key, patch_state, read_u64,
};
use super::committer::{lock_map, PendingAppend};
use super::{corrupt, io, item_cost, SledStore, HIGH_WATER_KEY, SLED_BATCH};
use crate::store::deadletter::DeadLetterStore;
use crate::store::{CommitCounters, QueueId, RetryState, Snapshot, Store, StoreError, StoredEvent};
use futures_util::future::BoxFuture;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::oneshot;

/// Remove every key of `queue` from `tree`, in batches of [`SLED_BATCH`]; returns the live bytes
/// freed. Not atomic, and need not be: callers remove the queue's record first, and what a crash
/// leaves is removed at the next start. One batch of a whole backlog is not affordable: deleting
/// a subscription with 1,000,000 stored events in one batch took 7.6 GB of RSS and 35 s; in
/// batches of 256 it stays within the RSS it started at and takes 6 s (`examples/sled_mem.rs`).
pub(super) fn remove_prefix(tree: &sled::Tree, queue: QueueId) -> Result<u64, StoreError> {
    let mut freed = 0u64;
    loop {
        let mut batch = sled::Batch::default();
        let mut n = 0;
        for item in tree.scan_prefix(queue.to_be_bytes()).take(SLED_BATCH) {
            let (k, v) = item.map_err(io)?;
            freed += item_cost(v.len());
            batch.remove(k);
            n += 1;
        }
        if n == 0 {
            return Ok(freed);
        }
        tree.apply_batch(batch).map_err(io)?;
    }
}

impl SledStore {
    /// Drop the scan-at-open index of `queue` (it is being written to).
    pub(super) fn forget_recovered(&self, queue: QueueId) {
        if self.has_recovered.load(Ordering::Relaxed) {
            let mut g = crate::sync::lock(&self.recovered);
            g.remove(&queue);
            if g.is_empty() {
                self.has_recovered.store(false, Ordering::Relaxed);
            }
        }
    }

    /// Remove every stored event of `queue` (see [`remove_prefix`]).
    pub(super) fn remove_queue(&self, queue: QueueId) -> Result<u64, StoreError> {
        let freed = remove_prefix(&self.events, queue)?;
        self.committer.nudge();
        Ok(freed)
    }

    /// Remove settled events: from the unflushed map, else from sled. `journal_removal`: note
    /// them for the next journal record (see [`Store::remove_dropped`] for when not to).
    pub(super) fn remove_events(
        &self,
        queue: QueueId,
        seqs: &[u64],
        journal_removal: bool,
    ) -> Result<(), StoreError> {
        self.forget_recovered(queue);
        let mut freed = 0u64;
        // Events settled before their checkpoint never reach sled.
        let in_sled = self.in_sled(queue, seqs, |map, key| match map.remove(&key) {
            Some(v) => {
                freed += item_cost(v.len());
                true
            }
            None => false,
        });
        for s in &in_sled {
            if let Some(v) = self.events.remove(event_key(queue, *s)).map_err(io)? {
                freed += item_cost(v.len());
            }
        }
        self.sub_live(freed);
        {
            let mut g = self.committer.lock();
            if journal_removal {
                g.removed.extend(seqs.iter().map(|s| (queue, *s)));
            }
            g.dirty |= !in_sled.is_empty();
        }
        if !in_sled.is_empty() {
            self.committer.wake.notify_one();
        }
        Ok(())
    }

    /// Of `seqs`, the events not in the unflushed map (written, not yet checkpointed) and so in
    /// sled. Each one found in the map is handed to `in_memory` (under its lock), which settles it
    /// there and answers true.
    fn in_sled(
        &self,
        queue: QueueId,
        seqs: &[u64],
        mut in_memory: impl FnMut(&mut HashMap<(QueueId, u64), Vec<u8>>, (QueueId, u64)) -> bool,
    ) -> Vec<u64> {
        let mut map = lock_map(&self.unflushed);
        seqs.iter()
            .copied()
            .filter(|s| !in_memory(&mut map, (queue, *s)))
            .collect()
    }

    pub(super) fn unreadable(&self, queue: QueueId, seq: u64) -> StoreError {
        corrupt(
            &self.paths.1,
            format!("event {seq} of queue {queue} is unreadable"),
        )
    }

    pub(super) fn state_of(
        &self,
        queue: QueueId,
        seq: u64,
        v: &[u8],
    ) -> Result<RetryState, StoreError> {
        decode_state(v).ok_or_else(|| self.unreadable(queue, seq))
    }

    pub(super) fn event_of(
        &self,
        queue: QueueId,
        seq: u64,
        v: &[u8],
    ) -> Result<StoredEvent, StoreError> {
        decode_value(seq, v).ok_or_else(|| self.unreadable(queue, seq))
    }
}

impl Store for SledStore {
    fn load(&self) -> Result<Snapshot, StoreError> {
        self.snapshot()
    }

    fn pending(&self, queue: QueueId) -> Result<Vec<StoredEvent>, StoreError> {
        // The map's lock keeps a checkpoint from moving events between the two reads.
        let map = lock_map(&self.unflushed);
        let mut out = Vec::new();
        for ((q, seq), v) in map.iter() {
            if *q == queue {
                out.push(self.event_of(*q, *seq, v)?);
            }
        }
        for item in self.events.scan_prefix(queue.to_be_bytes()) {
            let (k, v) = item.map_err(io)?;
            let (_, seq) = parse_key(&k).ok_or_else(|| corrupt(&self.paths.1, "bad event key"))?;
            out.push(self.event_of(queue, seq, &v)?);
        }
        drop(map);
        out.sort_by_key(|e| e.seq);
        Ok(out)
    }

    fn pending_index(&self, queue: QueueId) -> Result<Vec<(u64, RetryState)>, StoreError> {
        if self.has_recovered.load(Ordering::Relaxed) {
            let mut g = crate::sync::lock(&self.recovered);
            let found = g.remove(&queue);
            if g.is_empty() {
                self.has_recovered.store(false, Ordering::Relaxed);
            }
            if let Some(v) = found {
                return Ok(v);
            }
        }
        // States only (no bodies): a large backlog is indexed without copying it.
        let map = lock_map(&self.unflushed);
        let mut out = Vec::new();
        for ((q, seq), v) in map.iter() {
            if *q == queue {
                out.push((*seq, self.state_of(*q, *seq, v)?));
            }
        }
        for item in self.events.scan_prefix(queue.to_be_bytes()) {
            let (k, v) = item.map_err(io)?;
            let (_, seq) = parse_key(&k).ok_or_else(|| corrupt(&self.paths.1, "bad event key"))?;
            out.push((seq, self.state_of(queue, seq, &v)?));
        }
        drop(map);
        out.sort_by_key(|(seq, _)| *seq);
        Ok(out)
    }

    fn get(&self, queue: QueueId, seqs: &[u64]) -> Result<Vec<Option<StoredEvent>>, StoreError> {
        // An event not in the map is in sled or settled: a checkpoint never moves one back.
        let from_map: Vec<Option<Vec<u8>>> = {
            let map = lock_map(&self.unflushed);
            seqs.iter()
                .map(|s| map.get(&(queue, *s)).cloned())
                .collect()
        };
        let mut out = Vec::with_capacity(seqs.len());
        for (&seq, mapped) in seqs.iter().zip(from_map) {
            let value = match mapped {
                Some(v) => Some(v),
                None => self
                    .events
                    .get(event_key(queue, seq))
                    .map_err(io)?
                    .map(|v| v.to_vec()),
            };
            out.push(match value {
                Some(v) => Some(self.event_of(queue, seq, &v)?),
                None => None,
            });
        }
        Ok(out)
    }

    fn put_topic(&self, key: &str, record: &Value) -> Result<(), StoreError> {
        self.write_topic(key, record)
    }

    fn delete_topic(&self, key: &str) -> Result<(), StoreError> {
        self.remove_topic(key)
    }

    fn put_subscription(
        &self,
        topic: &str,
        queue: QueueId,
        record: &Value,
    ) -> Result<(), StoreError> {
        self.write_subscription(topic, queue, record)
    }

    fn delete_subscription(&self, queue: QueueId) -> Result<(), StoreError> {
        self.remove_subscription(queue)
    }

    fn next_queue_id(&self) -> Result<QueueId, StoreError> {
        self.new_queue_id()
    }

    fn append(&self, items: &[(QueueId, StoredEvent)]) -> Result<(), StoreError> {
        let deleted = crate::sync::read(&self.deleted);
        let mut batch = sled::Batch::default();
        let mut cost = 0u64;
        let mut max_seq = 0u64;
        for (q, e) in items {
            if deleted.contains(q) {
                continue;
            }
            self.forget_recovered(*q);
            let v = encode_value(e);
            cost += item_cost(v.len());
            max_seq = max_seq.max(e.seq);
            batch.insert(&event_key(*q, e.seq), v);
        }
        if cost == 0 {
            return Ok(());
        }
        self.reserve_live(cost)?;
        // The high-water mark only grows: appends race, so never lower it.
        if max_seq > read_u64(&self.events, &HIGH_WATER_KEY)? {
            batch.insert(&HIGH_WATER_KEY, &max_seq.to_be_bytes());
        }
        if let Err(e) = self.events.apply_batch(batch) {
            self.sub_live(cost);
            return Err(io(e));
        }
        Ok(())
    }

    fn commit(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        let (tx, rx) = oneshot::channel();
        {
            let mut g = self.committer.lock();
            g.waiters.push(tx);
        }
        self.committer.wake.notify_one();
        Box::pin(async move {
            match rx.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(StoreError::Io(format!("flush failed: {e}"))),
                Err(_) => Err(StoreError::Io("the committer stopped".into())),
            }
        })
    }

    fn append_commit(
        &self,
        items: Vec<(QueueId, StoredEvent)>,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        let mut encoded = Vec::with_capacity(items.len());
        let mut cost = 0u64;
        for (q, e) in &items {
            self.forget_recovered(*q);
            let v = encode_value(e);
            cost += item_cost(v.len());
            encoded.push((*q, e.seq, v));
        }
        let reserved = self.reserve_live(cost);
        let (tx, rx) = oneshot::channel();
        if reserved.is_ok() && !encoded.is_empty() {
            let wake = {
                let mut g = self.committer.lock();
                g.appends.push(PendingAppend {
                    items: encoded,
                    cost,
                    done: tx,
                });
                g.sleeping
            };
            if wake {
                self.committer.wake.notify_one();
            }
        }
        Box::pin(async move {
            reserved?;
            if items.is_empty() {
                return Ok(());
            }
            match rx.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(StoreError::Io(format!("journal write failed: {e}"))),
                Err(_) => Err(StoreError::Io("the committer stopped".into())),
            }
        })
    }

    fn update(&self, queue: QueueId, seqs: &[u64], state: RetryState) -> Result<(), StoreError> {
        self.forget_recovered(queue);
        let in_sled = self.in_sled(queue, seqs, |map, key| match map.get_mut(&key) {
            Some(v) => {
                *v = patch_state(v, state);
                true
            }
            None => false,
        });
        if in_sled.is_empty() {
            return Ok(());
        }
        for s in &in_sled {
            // fetch_and_update is atomic: an event removed meanwhile stays removed.
            self.events
                .fetch_and_update(event_key(queue, *s), |old| {
                    old.map(|v| patch_state(v, state))
                })
                .map_err(io)?;
        }
        self.committer.nudge();
        Ok(())
    }

    fn remove(&self, queue: QueueId, seqs: &[u64]) -> Result<(), StoreError> {
        self.remove_events(queue, seqs, true)
    }

    fn remove_dropped(&self, queue: QueueId, seqs: &[u64]) -> Result<(), StoreError> {
        // Not journaled: the dead letters written just before live in sled and become durable at
        // the next checkpoint; a journaled removal could be replayed without them.
        self.remove_events(queue, seqs, false)
    }

    fn size_on_disk(&self) -> u64 {
        self.meta.size_on_disk().unwrap_or(0) + self.events_db.size_on_disk().unwrap_or(0)
    }

    fn dead_letters(&self) -> Option<Arc<dyn DeadLetterStore>> {
        Some(self.dead_letters.clone())
    }

    fn commit_counters(&self) -> Option<CommitCounters> {
        Some(self.committer.lock().stats)
    }

    fn endpoint_health(&self) -> Result<Vec<(String, Value)>, StoreError> {
        self.health_records()
    }

    fn put_endpoint_health(&self, url: &str, record: Option<&Value>) -> Result<(), StoreError> {
        self.write_endpoint_health(url, record)
    }
}
