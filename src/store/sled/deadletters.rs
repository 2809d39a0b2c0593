//! Dead letters on disk: the [`DeadLetterStore`] of the sled store.
//!
//! One tree `deadletters` of the letters database (`<eventsPath>/gridlet-v2/letters`), keyed
//! `queue_id u32 BE ‖ letter id u64 BE` so that a queue's letters are one contiguous, id-ordered
//! range. The key `[0xff; 4]` holds the highest id ever handed out: ids keep increasing across
//! restarts even when every letter was replayed or purged.
//!
//! * `put` inserts the letter, evicts what the bounds require (the queue's lowest ids beyond
//!   its count; then, under the byte bound, the oldest letters of the queues holding the most
//!   bytes: the rule is in `store::deadletter`) and raises the high-water id in **one** sled
//!   batch. Per-queue counts and letter bytes kept in memory (rebuilt by the scan at open)
//!   avoid a scan per put; finding a victim is one range read of its queue.
//! * `take` and `delete_queue` remove in one batch. Every mutation holds one mutex across its
//!   sled calls (short, no await), so counts and the tree never disagree.
//! * Letters count against `persistence__maxDiskBytes` (their counted bytes × 2.5, beside the
//!   event log's segments): they bring the disk bound (507 on publish) closer and give their
//!   bytes back when evicted, taken (replay, purge) or deleted with their subscription. A put is
//!   never refused for the disk bound (for a persisted subscription the event it replaces is
//!   settled right after); they are bounded by `broker__deadLetter__maxEventsPerSubscription`
//!   per subscription and `broker__deadLetter__maxBytes` all together.
//! * Writes are made durable by sled's background flush, and **before** the event log settles
//!   the events they replace (`LogStore::remove_dropped` flushes this database first): after a
//!   crash an event is pending, a dead letter, or both; never neither.
//! * Letters of queues that no subscription owns any more are removed at open.

use super::{corrupt, io, item_cost};
use crate::store::deadletter::{
    largest_holder, not_kept, DeadLetter, DeadLetterBound, DeadLetterStore, DropReason,
    LETTER_OVERHEAD,
};
use crate::store::{QueueId, StoreError};
use bytes::Bytes;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Name of the tree in the events database.
pub const TREE: &str = "deadletters";
const HIGH_WATER_KEY: [u8; 4] = [0xff; 4];
const VERSION: u8 = 1;
/// Bytes of an encoded letter that are not its event id, error text or body (see [`encode`]).
const ENCODED_FIXED: u64 = 42;

/// [`DeadLetter::size`] of a stored letter, from its encoded length (no decoding).
fn stored_size(v: &[u8]) -> u64 {
    (v.len() as u64).saturating_sub(ENCODED_FIXED) + LETTER_OVERHEAD
}

/// A letter a put evicts.
struct Victim {
    queue: QueueId,
    id: u64,
    /// [`DeadLetter::size`].
    size: u64,
    /// Its live bytes ([`item_cost`]).
    cost: u64,
}

#[derive(Default)]
struct Counts {
    per_queue: HashMap<QueueId, usize>,
    /// Letter bytes ([`DeadLetter::size`]) per queue, for the byte bound.
    bytes: HashMap<QueueId, u64>,
    /// The sum of `bytes`.
    total: u64,
    /// Highest id handed out (or found at open).
    last_id: u64,
    /// Queues deleted in this process (ids are never reused): a put racing with the delete of
    /// its subscription is dropped instead of leaving letters behind.
    deleted: HashSet<QueueId>,
}

/// Dead letters in a tree of the events database. See the module docs.
pub struct SledDeadLetterStore {
    tree: sled::Tree,
    /// The store's live-bytes counter (events and dead letters), for the disk bound.
    live: Arc<AtomicU64>,
    counts: Mutex<Counts>,
    path: PathBuf,
}

fn key(queue: QueueId, id: u64) -> [u8; 12] {
    super::codec::queue_key(queue, id)
}

fn reason_code(r: DropReason) -> u8 {
    match r {
        DropReason::MaxDeliveryAttemptsExceeded => 1,
        DropReason::TimeToLiveExceeded => 2,
        DropReason::DeliveryRefused => 3,
        DropReason::QueueFull => 4,
    }
}

fn reason_of(c: u8) -> Option<DropReason> {
    Some(match c {
        1 => DropReason::MaxDeliveryAttemptsExceeded,
        2 => DropReason::TimeToLiveExceeded,
        3 => DropReason::DeliveryRefused,
        4 => DropReason::QueueFull,
        _ => return None,
    })
}

/// Encode a letter: `version u8 ‖ seq u64 ‖ reason u8 ‖ has_status u8 ‖ status u16 ‖
/// attempts u32 ‖ first_enqueued_ms u64 ‖ dead_lettered_ms u64 ‖ id_len u32 ‖ event id ‖
/// has_error u8 ‖ error_len u32 ‖ error ‖ body` (big-endian). The letter id is the key's.
pub fn encode(l: &DeadLetter) -> Vec<u8> {
    let err = l.last_error.as_deref().unwrap_or("");
    let mut v = Vec::with_capacity(48 + l.event_id.len() + err.len() + l.body.len());
    v.push(VERSION);
    v.extend_from_slice(&l.seq.to_be_bytes());
    v.push(reason_code(l.reason));
    v.push(u8::from(l.last_status.is_some()));
    v.extend_from_slice(&l.last_status.unwrap_or(0).to_be_bytes());
    v.extend_from_slice(&l.attempts.to_be_bytes());
    v.extend_from_slice(&l.first_enqueued_ms.to_be_bytes());
    v.extend_from_slice(&l.dead_lettered_ms.to_be_bytes());
    v.extend_from_slice(&(l.event_id.len() as u32).to_be_bytes());
    v.extend_from_slice(l.event_id.as_bytes());
    v.push(u8::from(l.last_error.is_some()));
    v.extend_from_slice(&(err.len() as u32).to_be_bytes());
    v.extend_from_slice(err.as_bytes());
    v.extend_from_slice(&l.body);
    v
}

struct Reader<'a> {
    v: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.v.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn arr<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }
    fn u8(&mut self) -> Option<u8> {
        self.arr::<1>().map(|[b]| b)
    }
    fn u32(&mut self) -> Option<u32> {
        self.arr().map(u32::from_be_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.arr().map(u64::from_be_bytes)
    }
    fn string(&mut self) -> Option<String> {
        let n = self.u32()? as usize;
        Some(std::str::from_utf8(self.take(n)?).ok()?.to_string())
    }
}

/// Decode a value written by [`encode`]; `None` when it is not one.
pub fn decode(id: u64, v: &[u8]) -> Option<DeadLetter> {
    let mut r = Reader { v, at: 0 };
    if r.u8()? != VERSION {
        return None;
    }
    let seq = r.u64()?;
    let reason = reason_of(r.u8()?)?;
    let has_status = r.u8()? != 0;
    let status = r.arr().map(u16::from_be_bytes)?;
    let attempts = r.u32()?;
    let first_enqueued_ms = r.u64()?;
    let dead_lettered_ms = r.u64()?;
    let event_id = r.string()?;
    let has_error = r.u8()? != 0;
    let error = r.string()?;
    let body = Bytes::copy_from_slice(v.get(r.at..)?);
    Some(DeadLetter {
        id,
        seq,
        event_id,
        body,
        reason,
        last_status: has_status.then_some(status),
        last_error: has_error.then_some(error),
        attempts,
        first_enqueued_ms,
        dead_lettered_ms,
    })
}

fn parse_key(k: &[u8]) -> Option<(QueueId, u64)> {
    super::codec::parse_key(k)
}

impl SledDeadLetterStore {
    /// Open the tree in `db`, count what it holds (into `live`) and remove the letters of queues
    /// not in `known`.
    ///
    /// # Errors
    /// Unreadable data ([`StoreError::Corrupt`] naming `path`).
    pub fn open(
        db: &sled::Db,
        known: &HashSet<QueueId>,
        live: Arc<AtomicU64>,
        path: PathBuf,
    ) -> Result<Self, StoreError> {
        let tree = db.open_tree(TREE).map_err(io)?;
        let mut counts = Counts::default();
        let mut bytes = 0u64;
        let mut orphans: Vec<QueueId> = Vec::new();
        for item in tree.iter() {
            let (k, v) = item.map_err(io)?;
            if k.as_ref() == HIGH_WATER_KEY {
                let hw = v
                    .as_ref()
                    .try_into()
                    .map(u64::from_be_bytes)
                    .map_err(|_| corrupt(&path, "bad dead-letter high-water mark"))?;
                counts.last_id = counts.last_id.max(hw);
                continue;
            }
            let (q, id) = parse_key(&k).ok_or_else(|| corrupt(&path, "bad dead-letter key"))?;
            counts.last_id = counts.last_id.max(id);
            if known.contains(&q) {
                *counts.per_queue.entry(q).or_default() += 1;
                *counts.bytes.entry(q).or_default() += stored_size(&v);
                counts.total += stored_size(&v);
                bytes += item_cost(v.len());
            } else if orphans.last() != Some(&q) {
                orphans.push(q);
            }
        }
        let store = Self {
            tree,
            live,
            counts: Mutex::new(counts),
            path,
        };
        for q in orphans {
            tracing::warn!(
                queue = q,
                "removing dead letters of a subscription that no longer exists"
            );
            store.remove_range(q)?;
        }
        store.live.fetch_add(bytes, Ordering::Relaxed);
        Ok(store)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        // Each critical section updates the map after a successful sled write; no panic path.
        crate::sync::lock(&self.counts)
    }

    fn sub_live(&self, n: u64) {
        let _ = self
            .live
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(n))
            });
    }

    fn decode_item(&self, k: &[u8], v: &[u8]) -> Result<DeadLetter, StoreError> {
        let (_, id) = parse_key(k).ok_or_else(|| corrupt(&self.path, "bad dead-letter key"))?;
        decode(id, v).ok_or_else(|| corrupt(&self.path, format!("dead letter {id} is unreadable")))
    }

    /// The letters (with their stored sizes) of `queue` with these ids, or all of them.
    fn read(
        &self,
        queue: QueueId,
        ids: Option<&[u64]>,
    ) -> Result<Vec<(DeadLetter, u64)>, StoreError> {
        let mut out = Vec::new();
        match ids {
            None => {
                for item in self.tree.scan_prefix(queue.to_be_bytes()) {
                    let (k, v) = item.map_err(io)?;
                    out.push((self.decode_item(&k, &v)?, item_cost(v.len())));
                }
            }
            Some(ids) => {
                for id in ids.iter().collect::<BTreeSet<_>>() {
                    if let Some(v) = self.tree.get(key(queue, *id)).map_err(io)? {
                        out.push((self.decode_item(&key(queue, *id), &v)?, item_cost(v.len())));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Remove a queue's whole range (see [`super::events::remove_prefix`]); returns the bytes freed.
    fn remove_range(&self, queue: QueueId) -> Result<u64, StoreError> {
        let mut g = self.lock();
        let freed = super::codec::remove_prefix(&self.tree, queue)?;
        g.per_queue.remove(&queue);
        let size = g.bytes.remove(&queue).unwrap_or(0);
        g.total = g.total.saturating_sub(size);
        drop(g);
        Ok(freed)
    }
}

impl SledDeadLetterStore {
    /// The oldest letter of `queue` with an id ≥ `from`, as a victim.
    fn oldest(&self, queue: QueueId, from: u64) -> Result<Option<Victim>, StoreError> {
        let Some(item) = self
            .tree
            .range(key(queue, from)..=key(queue, u64::MAX))
            .next()
        else {
            return Ok(None);
        };
        let (k, v) = item.map_err(io)?;
        let (_, id) = parse_key(&k).ok_or_else(|| corrupt(&self.path, "bad dead-letter key"))?;
        Ok(Some(Victim {
            queue,
            id,
            size: stored_size(&v),
            cost: item_cost(v.len()),
        }))
    }

    /// The letters a put of `size` bytes to `queue` evicts to stay within `bound`: first the
    /// queue's oldest beyond its count, then, under the byte bound, the oldest of whichever
    /// queue [`largest_holder`] names, one at a time (see `store::deadletter`).
    fn plan_evictions(
        &self,
        c: &Counts,
        queue: QueueId,
        size: u64,
        bound: DeadLetterBound,
    ) -> Result<Vec<Victim>, StoreError> {
        let mut held = c.bytes.clone();
        let mut total = c.total;
        // Per queue, the id the next victim is looked for from (past those already chosen).
        let mut from: HashMap<QueueId, u64> = HashMap::new();
        let mut victims = Vec::new();
        let mut over = (c.per_queue.get(&queue).copied().unwrap_or(0) + 1)
            .saturating_sub(bound.per_subscription);
        loop {
            let q = if victims.len() < over {
                queue
            } else if total + size > bound.max_bytes {
                match largest_holder(&held, queue, size) {
                    Some(q) => q,
                    None => break,
                }
            } else {
                break;
            };
            match self.oldest(q, from.get(&q).copied().unwrap_or(0))? {
                Some(v) => {
                    from.insert(q, v.id + 1);
                    let b = held.entry(q).or_default();
                    *b = b.saturating_sub(v.size);
                    total = total.saturating_sub(v.size);
                    victims.push(v);
                }
                // The counts promised letters the tree does not have: stop asking this queue.
                None => {
                    held.remove(&q);
                    if q == queue {
                        over = victims.len();
                    }
                }
            }
        }
        Ok(victims)
    }
}

impl DeadLetterStore for SledDeadLetterStore {
    fn put(
        &self,
        queue: QueueId,
        mut letter: DeadLetter,
        bound: DeadLetterBound,
    ) -> Result<usize, StoreError> {
        if not_kept(queue, &letter, bound) {
            return Ok(1);
        }
        let mut g = self.lock();
        if g.deleted.contains(&queue) {
            return Ok(0);
        }
        let id = g.last_id + 1;
        letter.id = id;
        let size = letter.size();
        let value = encode(&letter);
        let cost = item_cost(value.len());
        let victims = self.plan_evictions(&g, queue, size, bound)?;
        let mut batch = sled::Batch::default();
        for v in &victims {
            batch.remove(&key(v.queue, v.id));
        }
        batch.insert(&key(queue, id), value);
        batch.insert(&HIGH_WATER_KEY, &id.to_be_bytes());
        self.tree.apply_batch(batch).map_err(io)?;
        g.last_id = id;
        let mut freed = 0u64;
        for v in &victims {
            if let Some(n) = g.per_queue.get_mut(&v.queue) {
                *n = n.saturating_sub(1);
            }
            if let Some(b) = g.bytes.get_mut(&v.queue) {
                *b = b.saturating_sub(v.size);
            }
            g.total = g.total.saturating_sub(v.size);
            freed += v.cost;
        }
        *g.per_queue.entry(queue).or_default() += 1;
        *g.bytes.entry(queue).or_default() += size;
        g.total += size;
        drop(g);
        self.live.fetch_add(cost, Ordering::Relaxed);
        self.sub_live(freed);
        Ok(victims.len())
    }

    fn list(
        &self,
        queue: QueueId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        let Some(from) = after.checked_add(1) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for item in self
            .tree
            .range(key(queue, from)..=key(queue, u64::MAX))
            .take(limit)
        {
            let (k, v) = item.map_err(io)?;
            out.push(self.decode_item(&k, &v)?);
        }
        Ok(out)
    }

    fn peek(&self, queue: QueueId, ids: Option<&[u64]>) -> Result<Vec<DeadLetter>, StoreError> {
        Ok(self.read(queue, ids)?.into_iter().map(|(l, _)| l).collect())
    }

    fn take(&self, queue: QueueId, ids: Option<&[u64]>) -> Result<Vec<DeadLetter>, StoreError> {
        let mut g = self.lock();
        let found = self.read(queue, ids)?;
        if found.is_empty() {
            return Ok(Vec::new());
        }
        let mut batch = sled::Batch::default();
        let mut freed = 0u64;
        for (l, cost) in &found {
            batch.remove(&key(queue, l.id));
            freed += cost;
        }
        self.tree.apply_batch(batch).map_err(io)?;
        if let Some(n) = g.per_queue.get_mut(&queue) {
            *n = n.saturating_sub(found.len());
        }
        let size: u64 = found.iter().map(|(l, _)| l.size()).sum();
        if let Some(b) = g.bytes.get_mut(&queue) {
            *b = b.saturating_sub(size);
        }
        g.total = g.total.saturating_sub(size);
        drop(g);
        self.sub_live(freed);
        Ok(found.into_iter().map(|(l, _)| l).collect())
    }

    fn count(&self, queue: QueueId) -> usize {
        self.lock().per_queue.get(&queue).copied().unwrap_or(0)
    }

    fn bytes(&self) -> u64 {
        self.lock().total
    }

    fn delete_queue(&self, queue: QueueId) -> Result<(), StoreError> {
        self.lock().deleted.insert(queue);
        let freed = self.remove_range(queue)?;
        self.sub_live(freed);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
