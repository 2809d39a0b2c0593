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
//!   runs low ([`SubQueue::refill_wanted`] / [`SubQueue::refilled`]). The numbers are kept as runs
//!   of consecutive ones, so a backlog behind a down subscriber costs a few bytes per run
//!   (typically a handful for one topic), not per event.
//! * **spilled retries** (persisted subscriptions only): the retry lane of a persisted
//!   subscription holds bodies for at most one [`Window`] of events too. A failed batch that
//!   would pass it, and every retry recovered at start-up, keeps only `(due, seq)` in a heap
//!   (16 bytes an event); when such retries are due the dispatcher reads their bodies and retry
//!   states back ([`SubQueue::retry_refill_wanted`] / [`SubQueue::retries_loaded`]) and they
//!   are sent as batches cut to the subscription's caps. A million-event backlog that has
//!   failed once therefore costs about 16–32 MiB instead of its bodies. Expiry (TTL) of a
//!   spilled retry is checked when it is read back.
//!
//! * **live** (`drainOrder: LiveFirst`, [`SubQueue::all_due`]): when an outage ends with a
//!   backlog waiting, events published from then on go to a lane of their own, sent before the
//!   backlog (and its retries) until the backlog has drained; then the lane joins the ready
//!   lane. It holds at most one [`Window`] on a windowed queue; live events past it wait
//!   behind the backlog as usual.
//!
//! Pure data structure: no I/O, no clock reads (the caller passes `now`), no awaits.

mod seqruns;
mod spill;

use spill::Spill;

use super::payload::Pending;
use seqruns::SeqRuns;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use tokio::time::Instant;

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

/// What a queue holds waiting ([`SubQueue::waiting`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Waiting {
    /// First enqueue (wall ms) of the oldest event waiting in memory, for a first attempt or
    /// a retry.
    pub oldest_ms: Option<u64>,
    /// Events waiting to retry.
    pub retrying: usize,
    /// When the next retry is due.
    pub next_retry: Option<Instant>,
}

/// The queue.
#[derive(Debug, Default)]
pub struct SubQueue {
    ready: VecDeque<Pending>,
    ready_bytes: usize,
    retry: BTreeMap<(Instant, u64), Vec<Pending>>,
    /// Events and body bytes held in `retry` (bounded by the window when there is one).
    retry_events: usize,
    retry_bytes: usize,
    in_flight: usize,
    in_flight_retries: usize,
    pending: usize,
    /// Body bytes of the events pushed and not yet settled: exact for a queue that is not
    /// windowed (an in-memory subscription holds every body); a windowed one's are the store's
    /// ([`crate::store::Store::pending_bytes`]), which also knows the events restored at start.
    pending_bytes: u64,
    spill: Option<Spill>,
    /// Events published since an outage ended, sent before its backlog (`drainOrder:
    /// LiveFirst`); `None` when no such drain is under way.
    live: Option<VecDeque<Pending>>,
    live_bytes: usize,
}

/// Cut a batch from the head of `lane` (whose body bytes `bytes` counts) within `lim`'s caps,
/// moving expired events met on the way to `expired_out`.
fn cut(
    lane: &mut VecDeque<Pending>,
    bytes: &mut usize,
    lim: &Limits,
    expired: impl Fn(&Pending) -> bool,
    expired_out: &mut Vec<Pending>,
) -> Vec<Pending> {
    let mut items = Vec::new();
    let mut size = 0usize;
    while let Some(front) = lane.front() {
        let len = front.event.body.len();
        if !expired(front)
            && !items.is_empty()
            && (items.len() >= lim.max_events || size + len + 1 > lim.max_bytes)
        {
            break;
        }
        let Some(p) = lane.pop_front() else { break };
        *bytes = bytes.saturating_sub(len);
        if expired(&p) {
            expired_out.push(p);
            continue;
        }
        size += len + 1;
        items.push(p);
        if items.len() >= lim.max_events {
            break;
        }
    }
    items
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
                seqs: SeqRuns::default(),
                loading: 0,
                retries: BinaryHeap::new(),
                retry_loading: 0,
                epoch: Instant::now(),
            }),
            ..Self::default()
        }
    }

    /// Events accepted and not yet settled (ready + spilled + waiting to retry + in flight).
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Body bytes of the events pushed and not yet settled (see the field: a windowed queue's
    /// are the store's).
    pub fn pending_bytes(&self) -> u64 {
        self.pending_bytes
    }

    /// Events whose bodies are only in the store (not yet in the window, or retries not yet
    /// read back).
    pub fn spilled(&self) -> usize {
        self.spill.as_ref().map_or(0, |s| {
            s.seqs.len() + s.loading + s.retries.len() + s.retry_loading
        })
    }

    /// Events that wait for a first attempt with their bodies only in the store: spilled
    /// behind the window, or being read into it. (Retries spilled until their due time are not
    /// counted: they are not ready.)
    pub fn spilled_ready(&self) -> usize {
        self.spill.as_ref().map_or(0, |s| s.seqs.len() + s.loading)
    }

    /// What waits, for the console: the first enqueue (wall ms) of the oldest event waiting in
    /// memory, for its first attempt (the ready lane is in arrival order, and spilled events are
    /// newer than the window's) or for a retry (the retries held here, one pass over at most the
    /// window), the events waiting to retry (held or spilled), and when the next is due.
    /// Spilled retries are counted, but their age is on disk: not read for this.
    pub fn waiting(&self) -> Waiting {
        let oldest_retry = self
            .retry
            .values()
            .flatten()
            .map(|p| p.first_enqueued_ms)
            .min();
        let oldest_ready = self.ready.front().map(|p| p.first_enqueued_ms);
        Waiting {
            oldest_ms: oldest_ready.into_iter().chain(oldest_retry).min(),
            retrying: self.retry_events + self.spill.as_ref().map_or(0, |s| s.retries.len()),
            next_retry: self.next_due(),
        }
    }

    /// Retries held with their bodies.
    #[cfg(test)]
    pub fn retry_len(&self) -> usize {
        self.retry_events
    }

    /// Whether `n` more events keep this queue within `bound` pending events.
    pub fn has_room(&self, n: usize, bound: usize) -> bool {
        self.pending.saturating_add(n) <= bound
    }

    /// Count `n` events as pending before they are pushed with [`SubQueue::push_reserved`]
    /// (admission happens before the publish is persisted; the push after).
    pub fn reserve(&mut self, n: usize) {
        self.pending += n;
    }

    /// Give back reserved places that were not used.
    pub fn unreserve(&mut self, n: usize) {
        self.pending = self.pending.saturating_sub(n);
    }

    /// Events in the ready lane (in memory).
    #[cfg(test)]
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
    /// in the store already. (Publishes reserve their places first: [`SubQueue::push_reserved`].)
    #[cfg(test)]
    pub fn push(&mut self, p: Pending) {
        self.pending += 1;
        self.push_reserved(p);
    }

    /// [`SubQueue::push`] for an event whose place was [`SubQueue::reserve`]d.
    pub fn push_reserved(&mut self, p: Pending) {
        self.pending_bytes += p.event.body.len() as u64;
        let p = match self.push_live(p) {
            Some(p) => p,
            None => return,
        };
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

    /// Put a new event in the live lane while a live-first drain is under way and the lane has
    /// room (one window on a windowed queue); otherwise hand it back.
    fn push_live(&mut self, p: Pending) -> Option<Pending> {
        let Some(live) = &mut self.live else {
            return Some(p);
        };
        let len = p.event.body.len();
        let room = self.spill.as_ref().is_none_or(|s| {
            live.is_empty()
                || (live.len() < s.window.events && self.live_bytes + len <= s.window.bytes)
        });
        if !room {
            return Some(p);
        }
        self.live_bytes += len;
        live.push_back(p);
        None
    }

    /// Whether events older than the live lane's wait: the ready lane, spilled events, retries.
    fn has_backlog(&self) -> bool {
        !self.ready.is_empty()
            || !self.retry.is_empty()
            || self.spill.as_ref().is_some_and(|s| {
                !s.seqs.is_empty() || s.loading > 0 || !s.retries.is_empty() || s.retry_loading > 0
            })
    }

    /// A live-first drain whose backlog is gone ends: the live lane joins the ready lane.
    fn end_drain_if_done(&mut self) {
        if self.live.is_none() || self.has_backlog() {
            return;
        }
        if let Some(live) = self.live.take() {
            self.live_bytes = 0;
            for p in live {
                self.push_ready(p);
            }
        }
    }

    /// Put a failed batch back, due at `due`. Its events are still pending. A windowed queue
    /// whose retry lane already holds a window of bodies keeps only the batch's sequence
    /// numbers (the caller has stored its retry state).
    pub fn schedule_retry(&mut self, due: Instant, items: Vec<Pending>) {
        let bytes: usize = items.iter().map(|p| p.event.body.len()).sum();
        if let Some(s) = &mut self.spill {
            if self.retry_events > 0
                && (self.retry_events + items.len() > s.window.events
                    || self.retry_bytes + bytes > s.window.bytes)
            {
                let at = s.ms_after_epoch(due, true);
                s.retries.extend(items.iter().map(|p| Reverse((at, p.seq))));
                return;
            }
        }
        self.insert_retry(due, items);
    }

    fn insert_retry(&mut self, due: Instant, items: Vec<Pending>) {
        if let Some(first) = items.first() {
            self.retry_events += items.len();
            self.retry_bytes += items.iter().map(|p| p.event.body.len()).sum::<usize>();
            self.retry.insert((due, first.seq), items);
        }
    }

    fn remove_retry(&mut self, key: &(Instant, u64)) -> Option<Vec<Pending>> {
        let items = self.retry.remove(key)?;
        self.retry_events = self.retry_events.saturating_sub(items.len());
        let bytes: usize = items.iter().map(|p| p.event.body.len()).sum();
        self.retry_bytes = self.retry_bytes.saturating_sub(bytes);
        Some(items)
    }

    /// Make every waiting retry due at `now` (an endpoint's outage ended): held batches keep
    /// their order by first sequence number, spilled retries theirs by sequence number, so the
    /// backlog drains oldest first. With `live_first` (`drainOrder: LiveFirst`) and a backlog
    /// waiting, events published from now on go before it (the live lane). Cost: the retries
    /// waiting, once.
    pub fn all_due(&mut self, now: Instant, live_first: bool) {
        if live_first && self.live.is_none() && self.has_backlog() {
            self.live = Some(VecDeque::new());
        }
        if self.retry.keys().any(|(due, _)| *due > now) {
            let held = std::mem::take(&mut self.retry);
            for ((due, seq), items) in held {
                self.retry.insert((due.min(now), seq), items);
            }
        }
        if let Some(s) = &mut self.spill {
            let at = s.ms_after_epoch(now, false);
            if s.retries.peek().is_some() {
                let spilled = std::mem::take(&mut s.retries).into_vec();
                s.retries = spilled
                    .into_iter()
                    .map(|Reverse((due, seq))| Reverse((due.min(at), seq)))
                    .collect();
            }
        }
    }

    /// Earliest retry due time, held in memory or spilled.
    pub fn next_due(&self) -> Option<Instant> {
        let held = self.retry.keys().next().map(|(due, _)| *due);
        let spilled = self.spill.as_ref().and_then(Spill::first_spilled_due);
        match (held, spilled) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
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

    /// `n` events of `bytes` body bytes together left the queue for good (delivered or
    /// dropped).
    pub fn settle(&mut self, n: usize, bytes: u64) {
        self.pending = self.pending.saturating_sub(n);
        self.pending_bytes = self.pending_bytes.saturating_sub(bytes);
    }

    /// Remove queued (not in-flight) events for which `expired` holds: the expired head of the
    /// ready lane (it is in enqueue order, so TTL order; an out-of-order straggler is caught when
    /// it reaches the head or is picked) and every expired event waiting to retry. They stay
    /// pending until the caller settles them. Cost: the expired events plus the retry lane.
    pub fn take_expired(&mut self, expired: impl Fn(&Pending) -> bool) -> Vec<Pending> {
        let mut out = Vec::new();
        if let Some(live) = &mut self.live {
            while live.front().is_some_and(&expired) {
                if let Some(p) = live.pop_front() {
                    self.live_bytes = self.live_bytes.saturating_sub(p.event.body.len());
                    out.push(p);
                }
            }
        }
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
            if let Some(items) = self.remove_retry(&k) {
                let (gone, keep): (Vec<_>, Vec<_>) = items.into_iter().partition(|p| expired(p));
                out.extend(gone);
                if !keep.is_empty() {
                    self.insert_retry(k.0, keep);
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
        self.end_drain_if_done();
        if let Some(live) = &mut self.live {
            let items = cut(live, &mut self.live_bytes, lim, &expired, expired_out);
            if !items.is_empty() {
                self.in_flight += 1;
                return Some(Batch {
                    items,
                    retry: false,
                });
            }
        }
        if self.in_flight_retries < lim.retry_cap {
            while let Some(key) = self.retry.keys().next().copied() {
                if key.0 > now {
                    break;
                }
                let Some(items) = self.remove_retry(&key) else {
                    break;
                };
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
mod tests;
