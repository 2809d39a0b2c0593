//! Dead-letter storage: what a dead letter is, and the bounded per-subscription store of them
//! ([`DeadLetterStore`]: [`MemoryDeadLetters`] here, the sled store's `SledDeadLetterStore` in
//! `sled/deadletters.rs`). Every implementation passes `contract::run` (test-only). Deciding
//! *that* an event becomes a dead letter, and forwarding letters, is delivery's
//! (`crate::delivery::deadletter`).

use super::{QueueId, StoreError};
use crate::clock::WallMs;
pub use crate::model::reason::DropReason as DeadLetterReason;
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
    pub reason: DeadLetterReason,
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

impl DeadLetter {
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

/// Bounded dead-letter storage, per subscription queue.
pub trait DeadLetterStore: Send + Sync + 'static {
    /// Keep `letter` (its `id` is assigned here); returns how many older letters were evicted
    /// to stay within `capacity`.
    ///
    /// # Errors
    /// Write failure.
    fn put(&self, queue: QueueId, letter: DeadLetter, capacity: usize)
        -> Result<usize, StoreError>;

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

    /// Forget a deleted subscription's letters.
    ///
    /// # Errors
    /// Write failure.
    fn delete_queue(&self, queue: QueueId) -> Result<(), StoreError>;
}

#[derive(Default)]
struct MemInner {
    letters: HashMap<QueueId, BTreeMap<u64, DeadLetter>>,
    next_id: u64,
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
        capacity: usize,
    ) -> Result<usize, StoreError> {
        if capacity == 0 {
            return Ok(1);
        }
        let mut g = self.lock();
        g.next_id += 1;
        letter.id = g.next_id;
        let q = g.letters.entry(queue).or_default();
        q.insert(letter.id, letter);
        let mut evicted = 0;
        while q.len() > capacity {
            q.pop_first();
            evicted += 1;
        }
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
        Ok(match ids {
            None => std::mem::take(q).into_values().collect(),
            Some(ids) => ids.iter().filter_map(|id| q.remove(id)).collect(),
        })
    }

    fn count(&self, queue: QueueId) -> usize {
        self.lock().letters.get(&queue).map_or(0, BTreeMap::len)
    }

    fn delete_queue(&self, queue: QueueId) -> Result<(), StoreError> {
        self.lock().letters.remove(&queue);
        Ok(())
    }
}

/// The contract every dead-letter store passes.
#[cfg(test)]
pub mod contract {
    use super::*;

    fn letter(seq: u64) -> DeadLetter {
        DeadLetter {
            id: 0,
            seq,
            event_id: format!("e{seq}"),
            body: Bytes::from_static(b"{\"a\":1}"),
            reason: DeadLetterReason::TimeToLiveExceeded,
            last_status: Some(500),
            last_error: Some("HTTP 500".into()),
            attempts: 3,
            first_enqueued_ms: 1,
            dead_lettered_ms: 2,
        }
    }

    /// Run the contract.
    pub fn run(s: &dyn DeadLetterStore) {
        assert_eq!(s.put(1, letter(1), 3).unwrap(), 0);
        assert_eq!(s.put(1, letter(2), 3).unwrap(), 0);
        assert_eq!(s.put(2, letter(3), 3).unwrap(), 0);
        assert_eq!(s.put(1, letter(4), 3).unwrap(), 0);
        assert_eq!(s.put(1, letter(5), 3).unwrap(), 1, "oldest evicted");
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
        assert_eq!(s.put(3, letter(6), 0).unwrap(), 1, "capacity 0 keeps none");
        assert_eq!(s.count(3), 0);
        assert_eq!(s.put(3, letter(7), 3).unwrap(), 0);
        let later = s.list(3, 0, 10).unwrap();
        assert!(later[0].id > all[2].id, "ids keep increasing");
        assert_eq!(later[0].body, letter(7).body);
        assert_eq!(later[0].last_error.as_deref(), Some("HTTP 500"));
        s.delete_queue(3).unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_store_passes_the_contract() {
        contract::run(&MemoryDeadLetters::new());
    }

    #[test]
    fn timestamps_render_as_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_649_367_553_123), "2022-04-07T21:39:13.123Z");
    }
}
