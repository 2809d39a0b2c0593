//! What a queued event is: its payload, shared by every subscription it was routed to and
//! counted once in the broker's memory bound ([`PendingBytes`], `broker__maxPendingBytes`), and
//! one subscription's copy of it ([`Pending`]: sequence number, attempts, age).

use crate::store::{RetryState, Settled, StoredEvent};
use crate::telemetry::TraceContext;
use bytes::Bytes;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::time::Instant;

/// Bytes of event payloads held in memory for delivery (`broker__maxPendingBytes`): each payload
/// counted once however many subscriptions share it, from its creation until the last copy is
/// settled or spilled.
#[derive(Debug, Default)]
pub struct PendingBytes {
    used: AtomicU64,
    limit: u64,
}

impl PendingBytes {
    /// A counter with `limit` bytes (0 = no limit).
    pub fn new(limit: u64) -> Self {
        Self {
            used: AtomicU64::new(0),
            limit,
        }
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// The configured limit (0 = none).
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Whether `more` bytes on top of those held would pass the limit.
    pub fn would_exceed(&self, more: u64) -> bool {
        self.limit > 0 && self.used().saturating_add(more) > self.limit
    }
}

/// What an event with `body` and `id` counts for in [`PendingBytes`]: the bound is checked with
/// this before payloads exist, so it must be what [`EventData`] charges.
pub fn payload_size(body: &[u8], id: &str) -> u64 {
    (body.len() + id.len()) as u64
}

/// The payload shared by every subscription an event was routed to. Its bytes count in the
/// broker's [`PendingBytes`] while it lives.
#[derive(Debug)]
pub struct EventData {
    /// Delivered bytes.
    pub body: Bytes,
    /// Event id.
    pub id: Box<str>,
    /// The trace context it travels in (from its publisher, or the `publish` span; shared by
    /// the events of a request, 8 bytes when there is none). Persisted with the event, so an
    /// event read back from the store (a spilled backlog, a restart) keeps it.
    pub trace: Option<Arc<TraceContext>>,
    counted_in: Option<Arc<PendingBytes>>,
}

impl EventData {
    /// The store record of this payload as `seq`, newly accepted at `now_ms`: no attempt yet,
    /// due at once (publish and dead-letter replay persist with it).
    pub fn to_stored(&self, seq: u64, now_ms: u64) -> StoredEvent {
        StoredEvent {
            seq,
            id: self.id.to_string(),
            body: self.body.clone(),
            state: RetryState {
                attempts: 0,
                first_enqueued_ms: now_ms,
                due_ms: 0,
            },
            trace: self.trace.clone(),
        }
    }

    /// A payload travelling in trace `trace`, counted in `pending` (none: not counted, for
    /// tests and tools). Every way an event enters a queue (a publish, a read back from the
    /// store, a replayed letter) decides its trace here, so none can drop it by omission.
    pub fn new(
        body: Bytes,
        id: Box<str>,
        trace: Option<Arc<TraceContext>>,
        pending: Option<&Arc<PendingBytes>>,
    ) -> Self {
        let data = Self {
            body,
            id,
            trace,
            counted_in: pending.cloned(),
        };
        if let Some(p) = &data.counted_in {
            p.used.fetch_add(data.size(), Ordering::Relaxed);
        }
        data
    }

    /// The bytes it counts for (see [`payload_size`]).
    pub fn size(&self) -> u64 {
        payload_size(&self.body, &self.id)
    }
}

impl Drop for EventData {
    fn drop(&mut self) {
        if let Some(p) = &self.counted_in {
            p.used.fetch_sub(self.size(), Ordering::Relaxed);
        }
    }
}

/// One event in one subscription's queue.
#[derive(Debug, Clone)]
pub struct Pending {
    /// Sequence number (store key).
    pub seq: u64,
    /// Payload.
    pub event: Arc<EventData>,
    /// Attempts made so far.
    pub attempts: u32,
    /// First-enqueue wall time (TTL counts from here).
    pub first_enqueued_ms: u64,
    /// When it entered this process's queue (for `SystemDelayForFirstAttemptMs`).
    pub enqueued_at: Instant,
}

/// The trace context the first of `items` that has one travels in (what a log line about them
/// names).
pub fn first_trace(items: &[Pending]) -> Option<&TraceContext> {
    items.iter().find_map(|p| p.event.trace.as_deref())
}

impl Pending {
    /// This event leaving its queue: its sequence number and body size, for the store.
    pub fn settled(&self) -> Settled {
        Settled::new(self.seq, self.event.body.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_counts_once_however_many_queues_share_it() {
        let budget = Arc::new(PendingBytes::new(100));
        let shared = Arc::new(EventData::new(
            Bytes::from(vec![b'x'; 40]),
            "id".into(),
            None,
            Some(&budget),
        ));
        let copies = [shared.clone(), shared.clone()];
        assert_eq!(budget.used(), 42);
        assert!(!budget.would_exceed(58) && budget.would_exceed(59));
        drop(shared);
        drop(copies);
        assert_eq!(budget.used(), 0, "freed with the last copy");
        assert!(!PendingBytes::new(0).would_exceed(u64::MAX), "0 = no limit");
    }
}
