//! Dead-letter storage: what a dead letter is, and the bounded store of them
//! ([`DeadLetterStore`]: [`MemoryDeadLetters`] here, the log store's `LogLetters` in
//! `log/letters.rs`). Every implementation passes `contract::run` (test-only). Deciding
//! *that* an event becomes a dead letter, and forwarding letters, is delivery's
//! (`crate::delivery::deadletter`).
//!
//! # Bounds and the eviction rule
//!
//! Every [`DeadLetterStore::put`] keeps the letters within a [`DeadLetterBound`]:
//!
//! 1. **Count, per subscription** (`broker__deadLetter__maxEventsPerSubscription`): past it the
//!    subscription's oldest letters (lowest ids) go.
//! 2. **Bytes, all subscriptions together** (`broker__deadLetter__maxBytes`, measured by
//!    [`DeadLetter::size`]): while the new letter would not fit, the subscription holding the
//!    most letter bytes (the new letter counted with its own subscription; ties: the lowest
//!    queue id) gives up its oldest letter. Why not the oldest letter broker-wide: dead letters
//!    come in floods from one broken endpoint, and a global oldest-first rule would let that
//!    flood wipe out every other subscription's (few, older) letters; charging the largest
//!    holder makes the flood evict its own letters first, keeps each subscription's newest, and
//!    needs only a per-subscription byte count (no broker-wide index of letters).
//! 3. A letter larger than the byte bound is not kept (evicting everything would not make room)
//!    and is counted as evicted, like any letter when a bound is 0.
//!
//! Evicted letters are counted in the number `put` returns (`gridlet_dead_letters_evicted_total`
//! of the subscription whose letter arrived). With the log store the letters also count
//! against `persistence__maxDiskBytes` (see `log/letters.rs`).

use super::{QueueId, StoreError};
use crate::clock::WallMs;
pub use crate::model::reason::DropReason;
use bytes::Bytes;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// One dead-lettered event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Id within its subscription (assigned by the store, increasing).
    pub id: u64,
    /// The event's queue sequence number.
    pub seq: u64,
    /// Event id.
    pub event_id: String,
    /// The event as it would have been delivered.
    pub body: Bytes,
    /// Why.
    pub reason: DropReason,
    /// Last HTTP status received, if any.
    pub last_status: Option<u16>,
    /// Last failure in words (no secrets: status, timeout, connection error).
    pub last_error: Option<String>,
    /// Attempts made.
    pub attempts: u32,
    /// First enqueued, wall ms.
    pub first_enqueued_ms: WallMs,
    /// Dead-lettered at, wall ms.
    pub dead_lettered_ms: WallMs,
}

/// Bytes a letter counts for against [`DeadLetterBound::max_bytes`]: its event, event id and
/// error text, plus this much for the fixed fields and the store's bookkeeping.
pub const LETTER_OVERHEAD: u64 = 64;

/// The bounds a [`DeadLetterStore::put`] keeps the letters within (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadLetterBound {
    /// Letters kept per subscription (`broker__deadLetter__maxEventsPerSubscription`); 0 = none.
    pub per_subscription: usize,
    /// Letter bytes ([`DeadLetter::size`]) kept by all subscriptions together
    /// (`broker__deadLetter__maxBytes`); 0 = none.
    pub max_bytes: u64,
}

impl DeadLetterBound {
    /// Whether any letter can be kept at all.
    pub fn keeps_any(&self) -> bool {
        self.per_subscription > 0 && self.max_bytes > 0
    }
}

/// The queue that gives up its oldest letter next under the byte bound: the one holding the most
/// bytes, `incoming` bytes counted with `queue` (ties: the lowest queue id). Only queues with
/// letters stored are candidates. Shared by both stores so they evict alike.
pub fn largest_holder(
    held: &HashMap<QueueId, u64>,
    queue: QueueId,
    incoming: u64,
) -> Option<QueueId> {
    held.iter()
        .filter(|(_, b)| **b > 0)
        .map(|(q, b)| (*q, if *q == queue { b + incoming } else { *b }))
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
        .map(|(q, _)| q)
}

impl DeadLetter {
    /// Bytes this letter counts for against the byte bound (see [`LETTER_OVERHEAD`]).
    pub fn size(&self) -> u64 {
        let error = self.last_error.as_ref().map_or(0, String::len);
        LETTER_OVERHEAD + (self.body.len() + self.event_id.len() + error) as u64
    }

    /// The API / webhook representation.
    pub fn to_json(&self) -> Value {
        let event: Value = serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&self.body).into()));
        json!({
            "id": self.id.to_string(),
            "eventId": self.event_id,
            "reason": self.reason.as_str(),
            "lastHttpStatusCode": self.last_status,
            "lastError": self.last_error,
            "deliveryAttempts": self.attempts,
            "firstEnqueuedTime": rfc3339(self.first_enqueued_ms),
            "deadLetteredTime": rfc3339(self.dead_lettered_ms),
            "event": event,
        })
    }
}

/// RFC 3339 (`YYYY-MM-DDTHH:MM:SS.mmmZ`) of a wall time in Unix ms (civil-from-days, no time
/// crate needed).
pub fn rfc3339(ms: WallMs) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60,
        ms % 1000
    )
}

/// What becomes of the letters of one [`super::Letters`], told by the store that keeps them
/// (delivery counts them and logs failures; the store knows only this trait).
pub trait LetterReport: Send + Sync {
    /// Whether the letters are still wanted (no longer once their subscription is deleted).
    fn wanted(&self) -> bool {
        true
    }
    /// `kept` letters were kept, and `evicted` letters evicted or not kept to make room.
    fn kept(&self, kept: usize, evicted: usize);
    /// Keeping a letter failed (it is not kept).
    fn failed(&self, e: &StoreError);
}

/// Put `letters` of `queue` into `store` within `bound`, telling `report`: the one place
/// letters are put (the memory store on the caller's thread, the log store in the committer's
/// round). `Ok` when every letter was put (kept, or not kept by the bound), so their events may
/// go; not wanted letters are not put, and their events stay.
///
/// # Errors
/// The first failed put (reported; the letters after it are not tried).
pub fn keep(
    store: &dyn DeadLetterStore,
    queue: QueueId,
    letters: Vec<DeadLetter>,
    bound: DeadLetterBound,
    report: &dyn LetterReport,
) -> Result<bool, StoreError> {
    if !report.wanted() {
        return Ok(false);
    }
    let (mut kept, mut evicted) = (0, 0);
    let mut result = Ok(true);
    for l in letters {
        match store.put(queue, l, bound) {
            Ok(n) => {
                kept += usize::from(bound.keeps_any());
                evicted += n;
            }
            Err(e) => {
                report.failed(&e);
                result = Err(e);
                break;
            }
        }
    }
    report.kept(kept, evicted);
    result
}

/// Bounded dead-letter storage, by subscription queue.
pub trait DeadLetterStore: Send + Sync + 'static {
    /// Keep `letter` (its `id` is assigned here) within `bound` (see the module docs); returns
    /// how many letters were evicted (of any queue) or not kept (this one, when it cannot be).
    ///
    /// # Errors
    /// Write failure.
    fn put(
        &self,
        queue: QueueId,
        letter: DeadLetter,
        bound: DeadLetterBound,
    ) -> Result<usize, StoreError>;

    /// Up to `limit` letters with id > `after`, oldest first.
    ///
    /// # Errors
    /// Read failure.
    fn list(&self, queue: QueueId, after: u64, limit: usize)
        -> Result<Vec<DeadLetter>, StoreError>;

    /// The letters with these ids (`None` = all of the queue's), oldest first, left in place
    /// (replay reads them, makes the events durable, and only then takes them).
    ///
    /// # Errors
    /// Read failure.
    fn peek(&self, queue: QueueId, ids: Option<&[u64]>) -> Result<Vec<DeadLetter>, StoreError>;

    /// Remove and return the letters with these ids (`None` = all of the queue's).
    ///
    /// # Errors
    /// Write failure.
    fn take(&self, queue: QueueId, ids: Option<&[u64]>) -> Result<Vec<DeadLetter>, StoreError>;

    /// Letters held for a queue.
    fn count(&self, queue: QueueId) -> usize;

    /// Bytes ([`DeadLetter::size`]) of every letter held, all queues together.
    fn bytes(&self) -> u64;

    /// Forget a deleted subscription's letters.
    ///
    /// # Errors
    /// Write failure.
    fn delete_queue(&self, queue: QueueId) -> Result<(), StoreError>;

    /// Make every letter put so far durable now. Stores whose puts are durable at once, or
    /// never, do nothing.
    ///
    /// # Errors
    /// Write failure.
    fn sync(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// Whether `letter` is not kept at all (the caller counts it as evicted): `bound` keeps no
/// letters, or the letter is too large for it (logged), so that evicting every other letter
/// would not make room for it.
pub fn not_kept(queue: QueueId, letter: &DeadLetter, bound: DeadLetterBound) -> bool {
    if !bound.keeps_any() {
        return true;
    }
    let size = letter.size();
    if size <= bound.max_bytes {
        return false;
    }
    tracing::warn!(
        queue,
        event_id = %letter.event_id,
        bytes = size,
        max_bytes = bound.max_bytes,
        "dead letter larger than broker__deadLetter__maxBytes not kept"
    );
    true
}

#[derive(Default)]
struct MemInner {
    letters: HashMap<QueueId, BTreeMap<u64, DeadLetter>>,
    /// Letter bytes ([`DeadLetter::size`]) per queue, for the byte bound.
    bytes: HashMap<QueueId, u64>,
    /// The sum of `bytes`.
    total: u64,
    next_id: u64,
}

impl MemInner {
    /// Remove the oldest letter of `queue`; false when it has none.
    fn evict_oldest(&mut self, queue: QueueId) -> bool {
        let Some((_, l)) = self.letters.get_mut(&queue).and_then(BTreeMap::pop_first) else {
            return false;
        };
        self.forget(queue, l.size());
        true
    }

    /// Take `size` bytes of `queue`'s letters off the counts.
    fn forget(&mut self, queue: QueueId, size: u64) {
        if let Some(b) = self.bytes.get_mut(&queue) {
            *b = b.saturating_sub(size);
        }
        self.total = self.total.saturating_sub(size);
    }
}

/// Dead letters in memory (lost on restart, like the memory event store).
#[derive(Default)]
pub struct MemoryDeadLetters {
    inner: Mutex<MemInner>,
}

impl MemoryDeadLetters {
    /// Empty.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemInner> {
        // Each call is a few map operations without panics: a poisoned lock is consistent.
        crate::sync::lock(&self.inner)
    }
}

impl DeadLetterStore for MemoryDeadLetters {
    fn put(
        &self,
        queue: QueueId,
        mut letter: DeadLetter,
        bound: DeadLetterBound,
    ) -> Result<usize, StoreError> {
        if not_kept(queue, &letter, bound) {
            return Ok(1);
        }
        let size = letter.size();
        let mut g = self.lock();
        let mut evicted = 0;
        while g.letters.get(&queue).map_or(0, BTreeMap::len) >= bound.per_subscription
            && g.evict_oldest(queue)
        {
            evicted += 1;
        }
        while g.total + size > bound.max_bytes {
            match largest_holder(&g.bytes, queue, size) {
                Some(victim) if g.evict_oldest(victim) => evicted += 1,
                _ => break,
            }
        }
        g.next_id += 1;
        letter.id = g.next_id;
        g.letters
            .entry(queue)
            .or_default()
            .insert(letter.id, letter);
        *g.bytes.entry(queue).or_default() += size;
        g.total += size;
        Ok(evicted)
    }

    fn list(
        &self,
        queue: QueueId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        let g = self.lock();
        Ok(g.letters
            .get(&queue)
            .map(|q| {
                q.range(after.saturating_add(1)..)
                    .take(limit)
                    .map(|(_, l)| l.clone())
                    .collect()
            })
            .unwrap_or_default())
    }

    fn peek(&self, queue: QueueId, ids: Option<&[u64]>) -> Result<Vec<DeadLetter>, StoreError> {
        let g = self.lock();
        let Some(q) = g.letters.get(&queue) else {
            return Ok(Vec::new());
        };
        Ok(match ids {
            None => q.values().cloned().collect(),
            Some(ids) => {
                let wanted: std::collections::BTreeSet<u64> = ids.iter().copied().collect();
                wanted.iter().filter_map(|id| q.get(id).cloned()).collect()
            }
        })
    }

    fn take(&self, queue: QueueId, ids: Option<&[u64]>) -> Result<Vec<DeadLetter>, StoreError> {
        let mut g = self.lock();
        let Some(q) = g.letters.get_mut(&queue) else {
            return Ok(Vec::new());
        };
        let took: Vec<DeadLetter> = match ids {
            None => std::mem::take(q).into_values().collect(),
            Some(ids) => ids.iter().filter_map(|id| q.remove(id)).collect(),
        };
        let freed = took.iter().map(DeadLetter::size).sum();
        g.forget(queue, freed);
        Ok(took)
    }

    fn count(&self, queue: QueueId) -> usize {
        self.lock().letters.get(&queue).map_or(0, BTreeMap::len)
    }

    fn bytes(&self) -> u64 {
        self.lock().total
    }

    fn delete_queue(&self, queue: QueueId) -> Result<(), StoreError> {
        let mut g = self.lock();
        g.letters.remove(&queue);
        let freed = g.bytes.remove(&queue).unwrap_or(0);
        g.total = g.total.saturating_sub(freed);
        Ok(())
    }
}

/// The contract every dead-letter store passes.
#[cfg(test)]
pub mod contract {
    use super::*;

    /// A letter of event `seq`.
    pub fn letter(seq: u64) -> DeadLetter {
        DeadLetter {
            id: 0,
            seq,
            event_id: format!("e{seq}"),
            body: Bytes::from_static(b"{\"a\":1}"),
            reason: DropReason::TimeToLiveExceeded,
            last_status: Some(500),
            last_error: Some("HTTP 500".into()),
            attempts: 3,
            first_enqueued_ms: 1,
            dead_lettered_ms: 2,
        }
    }

    /// A bound by count only.
    fn count(per_subscription: usize) -> DeadLetterBound {
        DeadLetterBound {
            per_subscription,
            max_bytes: u64::MAX,
        }
    }

    /// A letter whose [`DeadLetter::size`] is `size`.
    fn sized(seq: u64, size: u64) -> DeadLetter {
        let mut l = letter(seq);
        let fixed = l.size() - l.body.len() as u64;
        l.body = Bytes::from(vec![b'x'; (size - fixed) as usize]);
        l
    }

    fn seqs(s: &dyn DeadLetterStore, queue: QueueId) -> Vec<u64> {
        let all = s.list(queue, 0, 100).unwrap();
        all.iter().map(|l| l.seq).collect()
    }

    /// The byte bound (all queues together): the queue holding the most bytes, the incoming
    /// letter counted with its own, gives up its oldest letter first; a letter larger than the
    /// bound is not kept. Queues 1, 2 and 3 must be usable and empty.
    pub fn byte_bound(s: &dyn DeadLetterStore) {
        let b = DeadLetterBound {
            per_subscription: 100,
            max_bytes: 1000,
        };
        assert_eq!(s.put(1, sized(1, 250), b).unwrap(), 0);
        assert_eq!(s.put(2, sized(2, 200), b).unwrap(), 0);
        assert_eq!(s.put(1, sized(3, 250), b).unwrap(), 0);
        assert_eq!(s.put(1, sized(4, 250), b).unwrap(), 0);
        assert_eq!(s.bytes(), 950);
        // 1150 > 1000: queue 1 holds 750, queue 2 200 + the new 200: queue 1's oldest goes.
        assert_eq!(s.put(2, sized(5, 200), b).unwrap(), 1);
        assert_eq!((seqs(s, 1), seqs(s, 2)), (vec![3, 4], vec![2, 5]));
        assert_eq!(s.bytes(), 900);
        // Queue 3 holds nothing yet: 1 (500) pays again rather than 2 (400).
        assert_eq!(s.put(3, sized(6, 300), b).unwrap(), 1);
        assert_eq!(seqs(s, 1), vec![4]);
        assert_eq!(s.bytes(), 950);
        // A flood pays for itself first (2's two letters), then the largest other holder (3).
        assert_eq!(s.put(2, sized(7, 700), b).unwrap(), 3);
        assert_eq!(
            (seqs(s, 1), seqs(s, 2), seqs(s, 3)),
            (vec![4], vec![7], vec![])
        );
        assert_eq!((s.bytes(), s.count(2), s.count(3)), (950, 1, 0));
        // Larger than the whole bound: not kept, and nothing else is evicted for it.
        assert_eq!(s.put(1, sized(8, 1001), b).unwrap(), 1);
        assert_eq!((seqs(s, 1), s.bytes()), (vec![4], 950));
        // Exactly the bound: everything else goes.
        assert_eq!(s.put(3, sized(9, 1000), b).unwrap(), 2);
        assert_eq!(
            (seqs(s, 3), s.count(1), s.count(2), s.bytes()),
            (vec![9], 0, 0, 1000)
        );
        assert_eq!(s.take(3, None).unwrap().len(), 1);
        assert_eq!(s.bytes(), 0);
        for q in 1..=3 {
            s.delete_queue(q).unwrap();
        }
    }

    /// Run the contract.
    pub fn run(s: &dyn DeadLetterStore) {
        assert_eq!(s.put(1, letter(1), count(3)).unwrap(), 0);
        assert_eq!(s.put(1, letter(2), count(3)).unwrap(), 0);
        assert_eq!(s.put(2, letter(3), count(3)).unwrap(), 0);
        assert_eq!(s.put(1, letter(4), count(3)).unwrap(), 0);
        assert_eq!(s.put(1, letter(5), count(3)).unwrap(), 1, "oldest evicted");
        let all = s.list(1, 0, 100).unwrap();
        assert_eq!(all.iter().map(|l| l.seq).collect::<Vec<_>>(), vec![2, 4, 5]);
        assert!(all.windows(2).all(|w| w[0].id < w[1].id));
        let page = s.list(1, all[0].id, 1).unwrap();
        assert_eq!(page.len(), 1);
        assert_eq!(page[0].seq, 4);
        assert_eq!(s.count(1), 3);
        let seen = s
            .peek(1, Some(&[all[2].id, all[1].id, all[1].id, 999]))
            .unwrap();
        assert_eq!(
            seen.iter().map(|l| l.seq).collect::<Vec<_>>(),
            vec![4, 5],
            "by id, once"
        );
        assert_eq!(s.peek(1, None).unwrap(), all, "peek leaves them in place");
        assert_eq!(s.count(1), 3);
        assert!(s.peek(9, None).unwrap().is_empty());
        let took = s.take(1, Some(&[all[1].id, 999])).unwrap();
        assert_eq!(took.len(), 1);
        assert_eq!(took[0].seq, 4);
        assert_eq!(s.count(1), 2);
        assert_eq!(s.take(1, None).unwrap().len(), 2);
        assert_eq!(s.count(1), 0);
        assert_eq!(s.count(2), 1);
        s.delete_queue(2).unwrap();
        assert_eq!(s.count(2), 0);
        assert_eq!(
            s.put(3, letter(6), count(0)).unwrap(),
            1,
            "capacity 0 keeps none"
        );
        assert_eq!(s.count(3), 0);
        assert_eq!(s.put(3, letter(7), count(3)).unwrap(), 0);
        let later = s.list(3, 0, 10).unwrap();
        assert!(later[0].id > all[2].id, "ids keep increasing");
        assert_eq!(later[0].body, letter(7).body);
        assert_eq!(later[0].last_error.as_deref(), Some("HTTP 500"));
        s.delete_queue(3).unwrap();
        assert_eq!(s.bytes(), 0, "every letter's bytes given back");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_store_passes_the_contract() {
        contract::run(&MemoryDeadLetters::new());
        contract::byte_bound(&MemoryDeadLetters::new());
    }

    #[test]
    fn timestamps_render_as_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_649_367_553_123), "2022-04-07T21:39:13.123Z");
    }
}
