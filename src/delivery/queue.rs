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

use super::payload::Pending;
use seqruns::SeqRuns;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::time::Duration;
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

#[derive(Debug)]
struct Spill {
    window: Window,
    /// Sequence numbers of events whose bodies are only in the store, in arrival order (runs:
    /// a backlog of one topic's events is a few pairs, whatever its length).
    seqs: SeqRuns,
    /// Events taken by [`SubQueue::refill_wanted`] and not yet handed back.
    loading: usize,
    /// Retries whose bodies are only in the store: `(due, seq)`, earliest first, the due time
    /// in whole milliseconds since `epoch` (rounded up, so a retry never goes early).
    retries: BinaryHeap<Reverse<(u64, u64)>>,
    /// Retries taken by [`SubQueue::retry_refill_wanted`] and not yet handed back.
    retry_loading: usize,
    epoch: Instant,
}

impl Spill {
    fn ms_after_epoch(&self, t: Instant, round_up: bool) -> u64 {
        let d = t.saturating_duration_since(self.epoch);
        let ms = d.as_millis() as u64;
        ms + u64::from(round_up && !d.subsec_nanos().is_multiple_of(1_000_000))
    }

    fn first_spilled_due(&self) -> Option<Instant> {
        self.retries
            .peek()
            .map(|Reverse((ms, _))| self.epoch + Duration::from_millis(*ms))
    }
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

    /// Add an event recovered from the store that waits for its first attempt, by sequence
    /// number only (its body is read when it enters the window). On a queue without a window
    /// this does nothing but count it: call it only on windowed queues.
    #[cfg(test)]
    pub fn push_spilled(&mut self, seq: u64) {
        if let Some(s) = &mut self.spill {
            self.pending += 1;
            s.seqs.push_back(seq);
        }
    }

    /// [`SubQueue::push_spilled`] for `count` consecutive sequence numbers from `first`.
    pub fn push_spilled_run(&mut self, first: u64, count: u32) {
        if let Some(s) = &mut self.spill {
            self.pending += count as usize;
            s.seqs.push_back_run(first, count);
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
        let out = s.seqs.take_front(n);
        s.loading = out.len();
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

    /// Add an event recovered from the store that waits for a retry due at `due`, by sequence
    /// number only (its body and retry state are read when it is due). Like
    /// [`SubQueue::push_spilled`], only for windowed queues.
    pub fn push_spilled_retry(&mut self, due: Instant, seq: u64) {
        if let Some(s) = &mut self.spill {
            self.pending += 1;
            let at = s.ms_after_epoch(due, true);
            s.retries.push(Reverse((at, seq)));
        }
    }

    /// Whether the queue keeps a window over a backlog in the store (a persisted subscription).
    pub fn is_windowed(&self) -> bool {
        self.spill.is_some()
    }

    /// Give back events that are pending already (received under a lock that kept no body)
    /// as spilled retries due at `due`: their bodies and retry states are read from the store
    /// when due. Only for windowed queues (a no-op otherwise).
    pub fn return_spilled(&mut self, due: Instant, seqs: impl IntoIterator<Item = u64>) {
        if let Some(s) = &mut self.spill {
            let at = s.ms_after_epoch(due, true);
            s.retries
                .extend(seqs.into_iter().map(|seq| Reverse((at, seq))));
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

    /// Spilled retries the dispatcher should read from the store now: those due at `now`, as
    /// many as fit the retry window, while it is below half full and nothing is being read.
    /// Hand them back with [`SubQueue::retries_loaded`].
    pub fn retry_refill_wanted(&mut self, now: Instant) -> Vec<u64> {
        let (events, bytes) = (self.retry_events, self.retry_bytes);
        let Some(s) = &mut self.spill else {
            return Vec::new();
        };
        if s.retry_loading > 0 || events >= s.window.events / 2 || bytes >= s.window.bytes / 2 {
            return Vec::new();
        }
        let now_ms = s.ms_after_epoch(now, false);
        let room = s.window.events - events;
        let mut out = Vec::new();
        while out.len() < room {
            match s.retries.peek() {
                Some(Reverse((due, _))) if *due <= now_ms => {}
                _ => break,
            }
            if let Some(Reverse((_, seq))) = s.retries.pop() {
                out.push(seq);
            }
        }
        s.retry_loading = out.len();
        if s.retries.is_empty() && s.retries.capacity() > s.window.events {
            // A drained backlog gives its heap back.
            s.retries.shrink_to_fit();
        }
        out
    }

    /// Body bytes the retry window can take now (for the reader's byte budget).
    pub fn retry_room_bytes(&self) -> usize {
        self.spill
            .as_ref()
            .map_or(0, |s| s.window.bytes.saturating_sub(self.retry_bytes))
    }

    /// Hand back what [`SubQueue::retry_refill_wanted`] took: `loaded` retries are due now, in
    /// batches cut to `lim`'s caps; `unread` go back to the spilled heap, due now. As with
    /// [`SubQueue::refilled`], events that were neither must be settled by the caller.
    pub fn retries_loaded(
        &mut self,
        loaded: Vec<Pending>,
        unread: Vec<u64>,
        now: Instant,
        lim: &Limits,
    ) {
        if let Some(s) = &mut self.spill {
            s.retry_loading = 0;
            let at = s.ms_after_epoch(now, false);
            s.retries
                .extend(unread.into_iter().map(|seq| Reverse((at, seq))));
        }
        let mut batch = Vec::new();
        let mut bytes = 0usize;
        for p in loaded {
            let len = p.event.body.len() + 1;
            if !batch.is_empty() && (batch.len() >= lim.max_events || bytes + len > lim.max_bytes) {
                self.insert_retry(now, std::mem::take(&mut batch));
                bytes = 0;
            }
            bytes += len;
            batch.push(p);
        }
        self.insert_retry(now, batch);
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
mod tests {
    use super::super::payload::EventData;
    use super::*;
    use bytes::Bytes;
    use std::sync::Arc;

    fn p(seq: u64, size: usize) -> Pending {
        Pending {
            seq,
            event: Arc::new(EventData::new(
                Bytes::from(vec![b'x'; size]),
                "e".into(),
                None,
                None,
            )),
            attempts: 0,
            first_enqueued_ms: 0,
            enqueued_at: Instant::now(),
        }
    }

    fn lim(events: usize, bytes: usize) -> Limits {
        Limits {
            max_events: events,
            max_bytes: bytes,
            max_in_flight: 4,
            retry_cap: 1,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn all_due_makes_held_and_spilled_retries_due_oldest_first() {
        let now = Instant::now();
        let mut q = SubQueue::windowed(Window {
            events: 2,
            bytes: 1 << 20,
        });
        for i in 0..4 {
            q.reserve(1);
            q.push_reserved(p(i, 10));
        }
        let lim = lim(10, 1 << 20);
        let b = q.pick(now, &lim, |_| false, &mut Vec::new()).unwrap();
        q.finish(false);
        assert_eq!(b.items.len(), 2);
        let ten = now + Duration::from_secs(600);
        q.schedule_retry(ten, b.items);
        q.push_spilled_retry(now + Duration::from_secs(300), 9);
        q.push_spilled_retry(now + Duration::from_secs(900), 7);
        assert_eq!(q.next_due(), Some(now + Duration::from_secs(300)));
        q.all_due(now, false);
        assert_eq!(q.next_due(), Some(now));
        let r = q.pick(now, &lim, |_| false, &mut Vec::new()).unwrap();
        assert!(r.retry);
        assert_eq!(r.items.iter().map(|p| p.seq).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(q.retry_refill_wanted(now), vec![7, 9], "oldest first");
    }

    #[tokio::test(start_paused = true)]
    async fn live_first_sends_what_arrived_after_the_outage_before_the_backlog() {
        let now = Instant::now();
        let lim = lim(2, 1 << 20);
        // Take a batch, and finish its request at once.
        let take = |q: &mut SubQueue| {
            let b = q.pick(now, &lim, |_| false, &mut Vec::new())?;
            q.finish(false);
            Some(b.items.iter().map(|p| p.seq).collect::<Vec<_>>())
        };
        for live_first in [false, true] {
            let mut q = SubQueue::windowed(Window {
                events: 2,
                bytes: 1 << 20,
            });
            // The backlog: two in the window, two spilled.
            for i in 0..4 {
                q.reserve(1);
                q.push_reserved(p(i, 10));
            }
            q.all_due(now, live_first);
            q.reserve(2);
            q.push_reserved(p(10, 10));
            q.push_reserved(p(11, 10));
            let first = take(&mut q);
            if !live_first {
                assert_eq!(first, Some(vec![0, 1]), "oldest first");
                continue;
            }
            assert_eq!(first, Some(vec![10, 11]), "live first");
            assert_eq!(take(&mut q), Some(vec![0, 1]));
            q.refilled(Vec::new(), Vec::new());
            // A live lane holds one window; past it, live events wait behind the backlog.
            for i in 20..23 {
                q.reserve(1);
                q.push_reserved(p(i, 10));
            }
            assert_eq!(take(&mut q), Some(vec![20, 21]));
            assert_eq!(q.spilled(), 3, "2 and 3, then 22");
            // 22 joined the backlog: a later live event still goes first. Once the backlog is
            // gone the drain ends and events queue as usual.
            let _ = q.refill_wanted();
            q.refilled(vec![p(2, 10), p(3, 10)], Vec::new());
            assert_eq!(take(&mut q), Some(vec![2, 3]));
            assert_eq!(q.refill_wanted(), vec![22]);
            q.refilled(vec![p(22, 10)], Vec::new());
            q.reserve(1);
            q.push_reserved(p(30, 10));
            assert_eq!(take(&mut q), Some(vec![30]));
            assert_eq!(take(&mut q), Some(vec![22]));
            q.reserve(1);
            q.push_reserved(p(31, 10));
            assert_eq!(take(&mut q), Some(vec![31]));
            assert!(q.live.is_none());
        }
    }

    #[tokio::test]
    async fn waiting_names_the_oldest_event_retries_included() {
        let mut q = SubQueue::default();
        assert_eq!(q.waiting(), Waiting::default());
        for (seq, ms) in [(1, 10), (2, 20), (3, 30)] {
            q.push(Pending {
                first_enqueued_ms: ms,
                ..p(seq, 1)
            });
        }
        assert_eq!(q.waiting().oldest_ms, Some(10));
        let now = Instant::now();
        let mut out = Vec::new();
        let b = q
            .pick(now, &lim(1, usize::MAX), |_| false, &mut out)
            .unwrap();
        q.finish(false);
        let due = now + Duration::from_secs(60);
        q.schedule_retry(due, b.items);
        let w = q.waiting();
        assert_eq!(
            w.oldest_ms,
            Some(10),
            "the retry of the first event is the oldest"
        );
        assert_eq!(w.retrying, 1);
        assert_eq!(w.next_retry, Some(due));
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
        q.settle(3, 30);
        let mut seqs = Vec::new();
        while let Some(b) = q.pick(Instant::now(), &lim(10, usize::MAX), |_| false, &mut out) {
            seqs.extend(b.items.iter().map(|e| e.seq));
            q.finish(false);
            q.settle(b.items.len(), 0);
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

    #[tokio::test(start_paused = true)]
    async fn a_windowed_retry_lane_keeps_only_sequence_numbers_past_its_window() {
        let w = Window {
            events: 4,
            bytes: 1 << 20,
        };
        let mut q = SubQueue::windowed(w);
        let t0 = Instant::now();
        let minute = Duration::from_secs(60);
        // Three failed batches of two: the first two fit the window's bodies, the third spills.
        for b in 0..3u64 {
            let items = vec![p(b * 2 + 1, 10), p(b * 2 + 2, 10)];
            q.reserve(2);
            q.schedule_retry(t0 + minute + Duration::from_millis(b), items);
        }
        assert_eq!(q.pending(), 6);
        assert_eq!(q.retry_len(), 4, "bodies held: one window");
        assert_eq!(
            q.spilled(),
            2,
            "the third batch keeps only its sequence numbers"
        );
        // Recovered retries are spilled from the start.
        q.push_spilled_retry(t0 + minute / 2, 100);
        assert_eq!((q.pending(), q.spilled()), (7, 3));
        assert_eq!(
            q.next_due(),
            Some(t0 + minute / 2),
            "a spilled retry wakes the task too"
        );
        assert!(q.retry_refill_wanted(t0).is_empty(), "nothing due yet");
        tokio::time::advance(minute + Duration::from_millis(10)).await;
        let now = Instant::now();
        // The window holds 4 bodies (not below half): nothing is read until retries go out.
        assert!(q.retry_refill_wanted(now).is_empty());
        let mut out = Vec::new();
        let l = lim(10, usize::MAX);
        for expected in [[1, 2], [3, 4]] {
            let b = q.pick(now, &l, |_| false, &mut out).unwrap();
            assert!(b.retry);
            assert_eq!(b.items.iter().map(|e| e.seq).collect::<Vec<_>>(), expected);
            q.finish(b.retry);
            q.settle(b.items.len(), 0);
        }
        assert_eq!(q.retry_len(), 0);
        let want = q.retry_refill_wanted(now);
        assert_eq!(want, vec![100, 5, 6], "due order");
        assert!(q.retry_refill_wanted(now).is_empty(), "one read at a time");
        // 6 was not read (over the byte budget): it goes back, due now.
        q.retries_loaded(
            vec![p(100, 10), p(5, 10)],
            vec![6],
            now,
            &lim(1, usize::MAX),
        );
        assert_eq!(q.retry_len(), 2);
        assert_eq!(q.spilled(), 1);
        let mut seqs = Vec::new();
        while let Some(b) = q.pick(now, &l, |_| false, &mut out) {
            assert_eq!(b.items.len(), 1, "loaded retries are cut to the caps");
            seqs.extend(b.items.iter().map(|e| e.seq));
            q.finish(b.retry);
            q.settle(b.items.len(), 0);
            let want = q.retry_refill_wanted(now);
            if !want.is_empty() {
                let loaded = want.iter().map(|s| p(*s, 10)).collect();
                q.retries_loaded(loaded, Vec::new(), now, &l);
            }
        }
        seqs.sort_unstable();
        assert_eq!(seqs, [5, 6, 100], "every spilled retry is sent once");
        assert_eq!((q.pending(), q.spilled(), q.retry_len()), (0, 0, 0));
    }

    #[test]
    fn reserved_places_count_as_pending_until_pushed_or_given_back() {
        let mut q = SubQueue::default();
        assert!(q.has_room(3, 3) && !q.has_room(4, 3));
        q.reserve(3);
        assert!(!q.has_room(1, 3));
        q.push_reserved(p(1, 1));
        q.unreserve(2);
        assert_eq!(q.pending(), 1);
        assert_eq!(q.ready_len(), 1);
    }
}
