//! One subscription's queue: a ready lane for first attempts and a timer map for retries.
//!
//! * **ready**: events waiting for their first attempt, oldest first. Batches are cut from its
//!   head without waiting to fill them (the original's "optimistic" batching).
//! * **retry**: batches waiting for a due time, ordered by `(due, first seq)`. Retries run in
//!   their own budget (`retry_cap` of the subscription's in-flight slots), so a backlog of
//!   failing retries never takes the slots first attempts need.
//!
//! * **spilled** (persisted subscriptions only, [`SubQueue::windowed`]): the ready lane of a
//!   persisted subscription is a bounded *window* ([`Window`]). Events that arrive while it is full
//!   (or while older events are still spilled) keep only their sequence number here (8 bytes); their
//!   bodies stay in the store and the dispatcher reads them back, in arrival order, when the window
//!   runs low ([`SubQueue::refill_wanted`] / [`SubQueue::refilled`]). A million-event backlog behind
//!   a down subscriber therefore costs about 8 MiB of RAM instead of its bodies.
//!
//! Pure data structure: no I/O, no clock reads (the caller passes `now`), no awaits.

use bytes::Bytes;
use std::collections::{BTreeMap, VecDeque};
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
    counted_in: Option<Arc<PendingBytes>>,
}

impl EventData {
    /// A payload counted in `pending` (none: not counted, for tests and tools).
    pub fn new(body: Bytes, id: Box<str>, pending: Option<&Arc<PendingBytes>>) -> Self {
        let data = Self {
            body,
            id,
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

/// A batch taken for sending.
#[derive(Debug)]
pub struct Batch {
    /// Events, sent together and settled together.
    pub items: Vec<Pending>,
    /// Taken from the retry lane.
    pub retry: bool,
}

/// Limits the picker obeys.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Events per batch.
    pub max_events: usize,
    /// Bytes per batch (a single larger event is still sent alone).
    pub max_bytes: usize,
    /// Concurrent requests of this subscription.
    pub max_in_flight: usize,
    /// Of which at most this many retries.
    pub retry_cap: usize,
}

/// Bound of a persisted subscription's in-memory ready lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Events held with their bodies.
    pub events: usize,
    /// Body bytes held (a single larger event still enters an empty window).
    pub bytes: usize,
}

impl Window {
    /// The window of every persisted subscription: 2,048 events or 1 MiB of bodies.
    pub const DEFAULT: Window = Window {
        events: 2048,
        bytes: 1 << 20,
    };
}

#[derive(Debug)]
struct Spill {
    window: Window,
    /// Sequence numbers of events whose bodies are only in the store, in arrival order.
    seqs: VecDeque<u64>,
    /// Events taken by [`SubQueue::refill_wanted`] and not yet handed back.
    loading: usize,
}

/// The queue.
#[derive(Debug, Default)]
pub struct SubQueue {
    ready: VecDeque<Pending>,
    ready_bytes: usize,
    retry: BTreeMap<(Instant, u64), Vec<Pending>>,
    in_flight: usize,
    in_flight_retries: usize,
    pending: usize,
    spill: Option<Spill>,
}

impl SubQueue {
    /// A queue whose ready lane keeps at most `window` in memory; the rest stays in the store
    /// (persisted subscriptions).
    pub fn windowed(window: Window) -> Self {
        Self {
            spill: Some(Spill {
                window: Window {
                    events: window.events.max(2),
                    bytes: window.bytes.max(1),
                },
                seqs: VecDeque::new(),
                loading: 0,
            }),
            ..Self::default()
        }
    }

    /// Events accepted and not yet settled (ready + spilled + waiting to retry + in flight).
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Events whose bodies are only in the store (not yet in the window).
    pub fn spilled(&self) -> usize {
        self.spill.as_ref().map_or(0, |s| s.seqs.len() + s.loading)
    }

    /// Events in the ready lane (in memory).
    pub fn ready_len(&self) -> usize {
        self.ready.len()
    }

    fn push_ready(&mut self, p: Pending) {
        self.ready_bytes += p.event.body.len();
        self.ready.push_back(p);
    }

    fn pop_ready(&mut self) -> Option<Pending> {
        let p = self.ready.pop_front()?;
        self.ready_bytes = self.ready_bytes.saturating_sub(p.event.body.len());
        Some(p)
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Add a new event to the ready lane. A windowed queue whose window is full, or which still
    /// has spilled events (arrival order is kept), keeps only the sequence number: the body is
    /// in the store already.
    pub fn push(&mut self, p: Pending) {
        self.pending += 1;
        let (ready, bytes) = (self.ready.len(), self.ready_bytes);
        if let Some(s) = &mut self.spill {
            if !s.seqs.is_empty()
                || s.loading > 0
                || ready >= s.window.events
                || (ready > 0 && bytes + p.event.body.len() > s.window.bytes)
            {
                s.seqs.push_back(p.seq);
                return;
            }
        }
        self.push_ready(p);
    }

    /// Add an event recovered from the store that waits for its first attempt, by sequence
    /// number only (its body is read when it enters the window). On a queue without a window
    /// this does nothing but count it: call it only on windowed queues.
    pub fn push_spilled(&mut self, seq: u64) {
        if let Some(s) = &mut self.spill {
            self.pending += 1;
            s.seqs.push_back(seq);
        }
    }

    /// Spilled events the dispatcher should read from the store now: the window is below half
    /// full, nothing is being read, and events are spilled. The caller reads them and hands
    /// them back with [`SubQueue::refilled`]; until then they count as pending and new events
    /// keep spilling behind them.
    pub fn refill_wanted(&mut self) -> Vec<u64> {
        let (ready, bytes) = (self.ready.len(), self.ready_bytes);
        let Some(s) = &mut self.spill else {
            return Vec::new();
        };
        if s.loading > 0
            || s.seqs.is_empty()
            || ready >= s.window.events / 2
            || bytes >= s.window.bytes / 2
        {
            return Vec::new();
        }
        let n = (s.window.events - ready).min(s.seqs.len());
        let out: Vec<u64> = s.seqs.drain(..n).collect();
        s.loading = out.len();
        if s.seqs.is_empty() && s.seqs.capacity() > s.window.events {
            // A drained backlog gives its index memory back.
            s.seqs.shrink_to_fit();
        }
        out
    }

    /// Body bytes the window can take now (for the reader's byte budget).
    pub fn window_room_bytes(&self) -> usize {
        self.spill
            .as_ref()
            .map_or(0, |s| s.window.bytes.saturating_sub(self.ready_bytes))
    }

    /// Hand back what [`SubQueue::refill_wanted`] took: `loaded` events enter the ready lane (in
    /// the given order), `unread` sequence numbers go back to the head of the spilled list
    /// (over the byte budget, or the read failed). Events that were neither (gone from the
    /// store, or expired and dropped by the caller) must be settled by the caller.
    pub fn refilled(&mut self, loaded: Vec<Pending>, unread: Vec<u64>) {
        if let Some(s) = &mut self.spill {
            s.loading = 0;
            for seq in unread.into_iter().rev() {
                s.seqs.push_front(seq);
            }
        }
        for p in loaded {
            self.push_ready(p);
        }
    }

    /// Add an event recovered from the store that waits for a retry.
    pub fn push_recovered_retry(&mut self, due: Instant, p: Pending) {
        self.pending += 1;
        self.retry.entry((due, p.seq)).or_default().push(p);
    }

    /// Put a failed batch back, due at `due`. Its events are still pending.
    pub fn schedule_retry(&mut self, due: Instant, items: Vec<Pending>) {
        if let Some(first) = items.first() {
            self.retry.insert((due, first.seq), items);
        }
    }

    /// Earliest retry due time.
    pub fn next_due(&self) -> Option<Instant> {
        self.retry.keys().next().map(|(due, _)| *due)
    }

    /// When the dispatcher should wake for a retry: the earliest due time, but only while a
    /// retry could actually be sent. With the budget full, a completion (not the timer) is what
    /// frees a slot; waking for an already-due retry then would spin.
    pub fn next_wakeup(&self, lim: &Limits) -> Option<Instant> {
        if self.in_flight >= lim.max_in_flight || self.in_flight_retries >= lim.retry_cap {
            return None;
        }
        self.next_due()
    }

    /// Mark a request finished.
    pub fn finish(&mut self, retry: bool) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if retry {
            self.in_flight_retries = self.in_flight_retries.saturating_sub(1);
        }
    }

    /// `n` events left the queue for good (delivered or dropped).
    pub fn settle(&mut self, n: usize) {
        self.pending = self.pending.saturating_sub(n);
    }

    /// Remove queued (not in-flight) events for which `expired` holds: the expired head of the
    /// ready lane (it is in enqueue order, so TTL order; an out-of-order straggler is caught when
    /// it reaches the head or is picked) and every expired event waiting to retry. They stay
    /// pending until the caller settles them. Cost: the expired events plus the retry lane.
    pub fn take_expired(&mut self, expired: impl Fn(&Pending) -> bool) -> Vec<Pending> {
        let mut out = Vec::new();
        while self.ready.front().is_some_and(&expired) {
            if let Some(p) = self.pop_ready() {
                out.push(p);
            }
        }
        let keys: Vec<(Instant, u64)> = self
            .retry
            .iter()
            .filter(|(_, items)| items.iter().any(&expired))
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            if let Some(items) = self.retry.remove(&k) {
                let (gone, keep): (Vec<_>, Vec<_>) = items.into_iter().partition(|p| expired(p));
                out.extend(gone);
                if !keep.is_empty() {
                    self.retry.insert(k, keep);
                }
            }
        }
        out
    }

    /// Take the next batch to send, if a slot is free. Events for which `expired` holds are moved
    /// to `expired_out` instead (the caller settles them).
    pub fn pick(
        &mut self,
        now: Instant,
        lim: &Limits,
        expired: impl Fn(&Pending) -> bool,
        expired_out: &mut Vec<Pending>,
    ) -> Option<Batch> {
        if self.in_flight >= lim.max_in_flight {
            return None;
        }
        if self.in_flight_retries < lim.retry_cap {
            while let Some(entry) = self.retry.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                let items = entry.remove();
                let (gone, keep): (Vec<_>, Vec<_>) = items.into_iter().partition(|p| expired(p));
                expired_out.extend(gone);
                if !keep.is_empty() {
                    self.in_flight += 1;
                    self.in_flight_retries += 1;
                    return Some(Batch {
                        items: keep,
                        retry: true,
                    });
                }
            }
        }
        let mut items = Vec::new();
        let mut bytes = 0usize;
        while let Some(front) = self.ready.front() {
            if expired(front) {
                if let Some(p) = self.pop_ready() {
                    expired_out.push(p);
                }
                continue;
            }
            let len = front.event.body.len() + 1;
            if !items.is_empty() && (items.len() >= lim.max_events || bytes + len > lim.max_bytes) {
                break;
            }
            bytes += len;
            if let Some(p) = self.pop_ready() {
                items.push(p);
            }
            if items.len() >= lim.max_events {
                break;
            }
        }
        if items.is_empty() {
            return None;
        }
        self.in_flight += 1;
        Some(Batch {
            items,
            retry: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn p(seq: u64, size: usize) -> Pending {
        Pending {
            seq,
            event: Arc::new(EventData::new(
                Bytes::from(vec![b'x'; size]),
                "e".into(),
                None,
            )),
            attempts: 0,
            first_enqueued_ms: 0,
            enqueued_at: Instant::now(),
        }
    }

    #[test]
    fn a_payload_counts_once_however_many_queues_share_it() {
        let budget = Arc::new(PendingBytes::new(100));
        let shared = Arc::new(EventData::new(
            Bytes::from(vec![b'x'; 40]),
            "id".into(),
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

    fn lim(events: usize, bytes: usize) -> Limits {
        Limits {
            max_events: events,
            max_bytes: bytes,
            max_in_flight: 4,
            retry_cap: 1,
        }
    }

    #[tokio::test]
    async fn batches_never_exceed_the_caps_and_never_wait() {
        let mut q = SubQueue::default();
        for i in 0..10 {
            q.push(p(i, 100));
        }
        let mut out = Vec::new();
        let b = q
            .pick(Instant::now(), &lim(3, usize::MAX), |_| false, &mut out)
            .unwrap();
        assert_eq!(b.items.len(), 3);
        let b = q
            .pick(Instant::now(), &lim(50, 250), |_| false, &mut out)
            .unwrap();
        assert_eq!(b.items.len(), 2, "byte cap");
        let mut q = SubQueue::default();
        q.push(p(0, 5000));
        let b = q
            .pick(Instant::now(), &lim(50, 1024), |_| false, &mut out)
            .unwrap();
        assert_eq!(b.items.len(), 1, "a big event goes alone");
    }

    #[tokio::test]
    async fn retries_have_their_own_budget() {
        let mut q = SubQueue::default();
        let now = Instant::now();
        q.push(p(1, 1));
        q.push(p(2, 1));
        q.push(p(3, 1));
        q.push(p(4, 1));
        let mut out = Vec::new();
        let a = q.pick(now, &lim(1, 100), |_| false, &mut out).unwrap();
        let b = q.pick(now, &lim(1, 100), |_| false, &mut out).unwrap();
        q.finish(false);
        q.finish(false);
        q.schedule_retry(now, a.items);
        q.schedule_retry(now, b.items);
        let r = q.pick(now, &lim(1, 100), |_| false, &mut out).unwrap();
        assert!(r.retry);
        // The second due retry must wait for the retry slot; a first attempt goes instead.
        let n = q.pick(now, &lim(1, 100), |_| false, &mut out).unwrap();
        assert!(!n.retry);
        assert_eq!(q.next_due(), Some(now));
        assert_eq!(
            q.next_wakeup(&lim(1, 100)),
            None,
            "retry budget full: no timer wake-up"
        );
        q.finish(true);
        assert_eq!(q.next_wakeup(&lim(1, 100)), Some(now));
    }

    #[tokio::test]
    async fn take_expired_sweeps_both_lanes() {
        let mut q = SubQueue::default();
        let now = Instant::now();
        for i in 1..=4 {
            q.push(p(i, 1));
        }
        let mut out = Vec::new();
        let b = q.pick(now, &lim(2, 100), |_| false, &mut out).unwrap();
        q.finish(false);
        q.schedule_retry(now + Duration::from_secs(60), b.items);
        // Ready lane now holds 3, 4 (head expired: 3); retry lane holds 1, 2 (expired: 1).
        let gone = q.take_expired(|e| e.seq % 2 == 1);
        let mut seqs: Vec<u64> = gone.iter().map(|e| e.seq).collect();
        seqs.sort();
        assert_eq!(seqs, vec![1, 3]);
        assert_eq!(q.pending(), 4, "pending until settled");
        assert!(q.next_due().is_some(), "seq 2 still waits to retry");
    }

    #[tokio::test]
    async fn expired_events_are_handed_back() {
        let mut q = SubQueue::default();
        q.push(p(1, 1));
        q.push(p(2, 1));
        let mut out = Vec::new();
        let b = q
            .pick(Instant::now(), &lim(10, 100), |e| e.seq == 1, &mut out)
            .unwrap();
        assert_eq!(b.items.len(), 1);
        assert_eq!(out.len(), 1);
        assert_eq!(q.pending(), 2, "pending until settled");
        assert!(q
            .pick(
                Instant::now() + Duration::from_secs(1),
                &lim(10, 100),
                |_| false,
                &mut out
            )
            .is_none());
    }

    #[tokio::test]
    async fn a_windowed_queue_spills_past_its_window_and_keeps_arrival_order() {
        let w = Window {
            events: 4,
            bytes: 1 << 20,
        };
        let mut q = SubQueue::windowed(w);
        for i in 1..=10 {
            q.push(p(i, 10));
        }
        assert_eq!(q.pending(), 10);
        assert_eq!(q.ready_len(), 4);
        assert_eq!(q.spilled(), 6);
        assert!(q.refill_wanted().is_empty(), "window still full");
        let mut out = Vec::new();
        let b = q
            .pick(Instant::now(), &lim(3, usize::MAX), |_| false, &mut out)
            .unwrap();
        assert_eq!(b.items.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
        // One left in the window (< half): refill up to the window.
        let want = q.refill_wanted();
        assert_eq!(want, vec![5, 6, 7]);
        assert!(q.refill_wanted().is_empty(), "one read at a time");
        // New events keep spilling while a read is under way.
        q.push(p(11, 10));
        assert_eq!(q.ready_len(), 1);
        // 7 was over the byte budget: back to the head of the spilled list.
        q.refilled(vec![p(5, 10), p(6, 10)], vec![7]);
        assert_eq!(q.spilled(), 5);
        q.finish(false);
        q.settle(3);
        let mut seqs = Vec::new();
        while let Some(b) = q.pick(Instant::now(), &lim(10, usize::MAX), |_| false, &mut out) {
            seqs.extend(b.items.iter().map(|e| e.seq));
            q.finish(false);
            q.settle(b.items.len());
            let want = q.refill_wanted();
            if !want.is_empty() {
                let loaded = want.iter().map(|s| p(*s, 10)).collect();
                q.refilled(loaded, Vec::new());
            }
        }
        assert_eq!(seqs, (4..=11).collect::<Vec<_>>());
        assert_eq!(q.pending(), 0);
        assert_eq!(q.spilled(), 0);
        // Empty again: new events go straight to the window.
        q.push(p(12, 10));
        assert_eq!((q.ready_len(), q.spilled()), (1, 0));
    }

    #[tokio::test]
    async fn the_window_is_bounded_by_bytes_too() {
        let mut q = SubQueue::windowed(Window {
            events: 100,
            bytes: 1000,
        });
        q.push(p(1, 2000));
        assert_eq!(q.ready_len(), 1, "a big event still enters an empty window");
        q.push(p(2, 10));
        assert_eq!(q.spilled(), 1);
        q.push_spilled(3);
        assert_eq!((q.pending(), q.spilled()), (3, 2));
        assert_eq!(q.window_room_bytes(), 0);
        let mut plain = SubQueue::default();
        for i in 0..10_000 {
            plain.push(p(i, 100));
        }
        assert_eq!(plain.spilled(), 0, "non-persisted queues never spill");
    }
}
