//! A queue subscription's lock table: the events received and not yet settled, each with the
//! time its lock expires. Pure data: no I/O, no clock reads (callers pass `now`).
//!
//! Bounded: at most `max` locks (received events) and `max_bytes` locked body bytes per
//! subscription (`broker__maxLocksPerSubscription`, `broker__maxLockedBytesPerSubscription`);
//! a receive first [`Locks::reserve`]s room, so concurrent receivers never pass the count
//! between the check and the insert (the byte bound may be passed by one receive's batch).
//!
//! A lock keeps its event's body only when the event lives nowhere else: an in-memory
//! subscription's (the payload shared with every other subscription it was routed to, counted
//! once in `broker__maxPendingBytes`). A persisted subscription's lock keeps the sequence number
//! and retry facts only; the body is in the event log, read back when the event is released,
//! its lock expires or it becomes a dead letter (issue 37, finding 4: each subscription held its
//! own copy of every locked body, outside every memory bound).

use super::super::payload::{EventData, Pending};
use crate::telemetry::TraceContext;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use tokio::time::Instant;

/// Why a token's lock could not be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lost {
    /// No lock for that event (settled, never received, or received again since: the token
    /// names an older attempt).
    Unknown,
    /// The lock expired (the event is, or is about to be, available again).
    Expired,
}

/// One received event.
#[derive(Debug)]
pub struct Lock {
    /// Sequence number.
    pub seq: u64,
    /// Receives so far, the one that locked it included.
    pub attempts: u32,
    /// First-enqueue wall time (TTL counts from here).
    pub first_enqueued_ms: u64,
    /// When it entered this process's queue.
    pub enqueued_at: Instant,
    /// Body bytes (counted against the byte bound whether kept or not).
    pub size: u64,
    /// The payload, kept for an in-memory subscription only.
    pub event: Option<Arc<EventData>>,
    /// The trace context the event travels in, kept while the tracer is on (for the spans of
    /// the operations that settle or renew it), whether or not the payload is kept.
    pub trace: Option<Arc<TraceContext>>,
    /// When the lock expires.
    pub expires: Instant,
}

/// What a lock keeps of its event besides its sequence number and retry facts.
#[derive(Debug, Clone, Copy)]
pub struct Keep {
    /// The payload (an in-memory subscription: it lives nowhere else).
    pub bodies: bool,
    /// The trace context (the tracer is on).
    pub traces: bool,
}

impl Lock {
    /// The event as a queue entry again, when its payload was kept.
    pub fn into_pending(self) -> Result<Pending, Self> {
        match self.event {
            Some(event) => Ok(Pending {
                seq: self.seq,
                event,
                attempts: self.attempts,
                first_enqueued_ms: self.first_enqueued_ms,
                enqueued_at: self.enqueued_at,
            }),
            None => Err(self),
        }
    }
}

/// What the console shows of a queue subscription's locks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LockSummary {
    /// Events locked.
    pub locked: u64,
    /// Locked events by delivery count: 1, 2, 3, 4, 5 or more.
    pub delivery_counts: [u64; 5],
    /// The earliest first enqueue (wall ms) among the locked events: the oldest one held.
    pub oldest_enqueued_ms: Option<u64>,
    /// When the next lock expires.
    pub next_expiry: Option<Instant>,
}

/// The table.
#[derive(Debug)]
pub struct Locks {
    by_seq: HashMap<u64, Lock>,
    by_expiry: BTreeSet<(Instant, u64)>,
    reserved: usize,
    max: usize,
    bytes: u64,
    max_bytes: u64,
}

impl Locks {
    /// An empty table holding at most `max` locks of at most `max_bytes` body bytes together.
    pub fn new(max: usize, max_bytes: u64) -> Self {
        Self {
            by_seq: HashMap::new(),
            by_expiry: BTreeSet::new(),
            reserved: 0,
            max: max.max(1),
            bytes: 0,
            max_bytes: max_bytes.max(1),
        }
    }

    /// Locks held.
    pub fn len(&self) -> usize {
        self.by_seq.len()
    }

    /// The table summed up (one pass over at most `max` locks).
    pub fn summary(&self) -> LockSummary {
        let mut s = LockSummary {
            locked: self.by_seq.len() as u64,
            next_expiry: self.by_expiry.first().map(|(at, _)| *at),
            ..LockSummary::default()
        };
        for lock in self.by_seq.values() {
            let i = (lock.attempts.max(1) as usize - 1).min(s.delivery_counts.len() - 1);
            s.delivery_counts[i] += 1;
            let first = lock.first_enqueued_ms;
            s.oldest_enqueued_ms = Some(s.oldest_enqueued_ms.map_or(first, |o| o.min(first)));
        }
        s
    }

    /// Body bytes locked.
    #[cfg(test)]
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// No room for another lock (by count or by bytes).
    pub fn full(&self) -> bool {
        self.bytes >= self.max_bytes || self.by_seq.len() + self.reserved >= self.max
    }

    /// Reserve room for up to `n` locks; answers how many were granted (0 when full, by count
    /// or by bytes) and the body bytes they may hold together (a first event always fits).
    pub fn reserve(&mut self, n: usize) -> (usize, u64) {
        let bytes = self.max_bytes.saturating_sub(self.bytes);
        if bytes == 0 {
            return (0, 0);
        }
        let room = self.max.saturating_sub(self.by_seq.len() + self.reserved);
        let granted = n.min(room);
        self.reserved += granted;
        (granted, bytes)
    }

    /// Lock `items` (within a reservation of `granted`), until `expires`, keeping what `keep`
    /// says of them.
    pub fn insert(&mut self, granted: usize, items: &[Pending], expires: Instant, keep: Keep) {
        self.reserved = self.reserved.saturating_sub(granted);
        for p in items {
            let size = p.event.body.len() as u64;
            let lock = Lock {
                seq: p.seq,
                attempts: p.attempts,
                first_enqueued_ms: p.first_enqueued_ms,
                enqueued_at: p.enqueued_at,
                size,
                event: keep.bodies.then(|| p.event.clone()),
                trace: match keep.traces {
                    true => p.event.trace.clone(),
                    false => None,
                },
                expires,
            };
            self.by_expiry.insert((expires, p.seq));
            self.bytes += size;
            if let Some(old) = self.by_seq.insert(p.seq, lock) {
                self.by_expiry.remove(&(old.expires, old.seq));
                self.bytes = self.bytes.saturating_sub(old.size);
            }
        }
    }

    fn check(&self, seq: u64, attempt: u32, now: Instant) -> Result<&Lock, Lost> {
        let lock = self.by_seq.get(&seq).ok_or(Lost::Unknown)?;
        if lock.attempts != attempt {
            return Err(Lost::Unknown);
        }
        if lock.expires <= now {
            return Err(Lost::Expired);
        }
        Ok(lock)
    }

    fn remove(&mut self, seq: u64) -> Option<Lock> {
        let lock = self.by_seq.remove(&seq)?;
        self.bytes = self.bytes.saturating_sub(lock.size);
        Some(lock)
    }

    /// Take the lock of `seq` at `attempt` (to settle its event), if it holds at `now`.
    ///
    /// # Errors
    /// [`Lost`] when there is no such lock or it expired (an expired lock stays for
    /// [`Locks::expired`]).
    pub fn take(&mut self, seq: u64, attempt: u32, now: Instant) -> Result<Lock, Lost> {
        let expires = self.check(seq, attempt, now)?.expires;
        self.by_expiry.remove(&(expires, seq));
        self.remove(seq).ok_or(Lost::Unknown)
    }

    /// Extend the lock of `seq` at `attempt` to `until`; answers the lock (its retry facts for
    /// the store, its trace for the span).
    ///
    /// # Errors
    /// As [`Locks::take`].
    pub fn renew(
        &mut self,
        seq: u64,
        attempt: u32,
        now: Instant,
        until: Instant,
    ) -> Result<&Lock, Lost> {
        let old = self.check(seq, attempt, now)?.expires;
        self.by_expiry.remove(&(old, seq));
        self.by_expiry.insert((until, seq));
        let lock = self.by_seq.get_mut(&seq).ok_or(Lost::Unknown)?;
        lock.expires = until;
        Ok(lock)
    }

    /// Remove and answer every lock expired at `now`.
    pub fn expired(&mut self, now: Instant) -> Vec<Lock> {
        let mut out = Vec::new();
        while let Some(&(at, seq)) = self.by_expiry.first() {
            if at > now {
                break;
            }
            self.by_expiry.pop_first();
            if let Some(l) = self.remove(seq) {
                out.push(l);
            }
        }
        if self.by_seq.is_empty() && self.by_seq.capacity() > 1024 {
            self.by_seq.shrink_to_fit();
        }
        out
    }

    /// When the next lock expires.
    pub fn next_expiry(&self) -> Option<Instant> {
        self.by_expiry.first().map(|(at, _)| *at)
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::payload::EventData;
    use super::*;
    use bytes::Bytes;
    use std::sync::Arc;
    use std::time::Duration;

    const BODIES: Keep = Keep {
        bodies: true,
        traces: false,
    };
    const BARE: Keep = Keep {
        bodies: false,
        traces: false,
    };

    fn p(seq: u64, attempts: u32) -> Pending {
        traced(seq, attempts, None)
    }

    fn traced(seq: u64, attempts: u32, trace: Option<Arc<TraceContext>>) -> Pending {
        Pending {
            seq,
            event: Arc::new(EventData::new(
                Bytes::from_static(b"{}"),
                "e".into(),
                trace,
                None,
            )),
            attempts,
            first_enqueued_ms: 5,
            enqueued_at: Instant::now(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_summary_counts_deliveries_and_finds_the_oldest_and_the_next_expiry() {
        let mut t = Locks::new(10, 1 << 20);
        let now = Instant::now();
        assert_eq!(t.summary(), LockSummary::default());
        let at = |seq, attempts, ms| Pending {
            first_enqueued_ms: ms,
            ..p(seq, attempts)
        };
        let (granted, _) = t.reserve(4);
        let items = vec![at(1, 1, 90), at(2, 2, 80), at(3, 1, 7), at(4, 9, 70)];
        t.insert(granted, &items, now + Duration::from_secs(60), BODIES);
        let (granted, _) = t.reserve(1);
        t.insert(
            granted,
            &[at(5, 1, 60)],
            now + Duration::from_secs(30),
            BARE,
        );
        let s = t.summary();
        assert_eq!(s.locked, 5);
        assert_eq!(s.delivery_counts, [3, 1, 0, 0, 1]);
        assert_eq!(s.oldest_enqueued_ms, Some(7));
        assert_eq!(s.next_expiry, Some(now + Duration::from_secs(30)));
    }

    #[tokio::test(start_paused = true)]
    async fn locks_are_bounded_named_by_attempt_and_expire() {
        let t0 = Instant::now();
        let min = Duration::from_secs(60);
        let mut l = Locks::new(3, 1 << 20);
        assert_eq!(l.reserve(2).0, 2);
        assert_eq!(l.reserve(5).0, 1, "bounded, reservations counted");
        assert_eq!(l.reserve(1).0, 0);
        assert!(l.full());
        l.insert(2, &[p(1, 1), p(2, 1)], t0 + min, BODIES);
        l.insert(1, &[p(3, 2)], t0 + 2 * min, BARE);
        assert_eq!(l.len(), 3);
        assert_eq!(
            l.take(1, 2, t0).unwrap_err(),
            Lost::Unknown,
            "older attempt"
        );
        assert_eq!(l.take(9, 1, t0).unwrap_err(), Lost::Unknown);
        assert_eq!(l.bytes(), 6);
        assert!(
            l.take(1, 1, t0).unwrap().into_pending().is_ok(),
            "body kept"
        );
        assert_eq!(l.bytes(), 4);
        assert_eq!(l.take(1, 1, t0).unwrap_err(), Lost::Unknown, "settled once");
        let renewed = l.renew(2, 1, t0, t0 + 3 * min).unwrap();
        assert_eq!((renewed.attempts, renewed.first_enqueued_ms), (1, 5));
        assert_eq!(l.next_expiry(), Some(t0 + 2 * min));
        assert_eq!(l.take(3, 2, t0 + 2 * min).unwrap_err(), Lost::Expired);
        let gone = l.expired(t0 + 2 * min);
        assert_eq!(gone.iter().map(|p| p.seq).collect::<Vec<_>>(), vec![3]);
        assert!(gone[0].event.is_none(), "a persisted lock keeps no body");
        assert_eq!(l.len(), 1);
        assert_eq!(l.reserve(5).0, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn locked_bytes_are_bounded_a_first_event_always_fits() {
        let t = Instant::now() + Duration::from_secs(60);
        let mut l = Locks::new(100, 5);
        assert_eq!(l.reserve(10), (10, 5));
        l.insert(10, &[p(1, 1), p(2, 1), p(3, 1)], t, BARE);
        assert_eq!(
            l.bytes(),
            6,
            "past the bound by the last event of one receive"
        );
        assert_eq!(l.reserve(1), (0, 0), "full by bytes");
        assert!(l.full());
        l.take(2, 1, Instant::now()).unwrap();
        assert_eq!(l.reserve(1), (1, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lock_keeps_its_trace_only_while_the_tracer_is_on_body_or_not() {
        let t = Instant::now() + Duration::from_secs(60);
        let ctx = Arc::new(TraceContext {
            trace_id: 7,
            span_id: 9,
            flags: 1,
            state: None,
        });
        let mut l = Locks::new(10, 1 << 20);
        let on = Keep {
            bodies: false,
            traces: true,
        };
        l.insert(3, &[traced(1, 1, Some(ctx.clone()))], t, on);
        l.insert(0, &[traced(2, 1, Some(ctx.clone()))], t, BARE);
        l.insert(0, &[traced(3, 1, None)], t, on);
        let now = Instant::now();
        let one = l.take(1, 1, now).unwrap();
        assert_eq!(one.trace.as_deref(), Some(&*ctx), "kept without the body");
        assert!(one.event.is_none());
        assert_eq!(l.renew(2, 1, now, t).unwrap().trace, None, "tracer off");
        assert_eq!(l.take(3, 1, now).unwrap().trace, None, "none to keep");
        assert_eq!(Arc::strong_count(&ctx), 2, "one clone, in the lock taken");
    }
}
