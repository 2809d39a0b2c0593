//! The spilled part of a windowed (persisted) queue: events and retries whose bodies are only
//! in the store, kept as sequence numbers (runs) and `(due, seq)` pairs, handed to the
//! dispatcher to read back when the window runs low or retries come due.

use super::seqruns::SeqRuns;
use super::{Limits, SubQueue, Window};
use crate::delivery::payload::Pending;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;
use tokio::time::Instant;

#[derive(Debug)]
pub(super) struct Spill {
    pub(super) window: Window,
    /// Sequence numbers of events whose bodies are only in the store, in arrival order (runs:
    /// a backlog of one topic's events is a few pairs, whatever its length).
    pub(super) seqs: SeqRuns,
    /// Events taken by [`SubQueue::refill_wanted`] and not yet handed back.
    pub(super) loading: usize,
    /// Retries whose bodies are only in the store: `(due, seq)`, earliest first, the due time
    /// in whole milliseconds since `epoch` (rounded up, so a retry never goes early).
    pub(super) retries: BinaryHeap<Reverse<(u64, u64)>>,
    /// Retries taken by [`SubQueue::retry_refill_wanted`] and not yet handed back.
    pub(super) retry_loading: usize,
    pub(super) epoch: Instant,
}

impl Spill {
    pub(super) fn ms_after_epoch(&self, t: Instant, round_up: bool) -> u64 {
        let d = t.saturating_duration_since(self.epoch);
        let ms = d.as_millis() as u64;
        ms + u64::from(round_up && !d.subsec_nanos().is_multiple_of(1_000_000))
    }

    pub(super) fn first_spilled_due(&self) -> Option<Instant> {
        self.retries
            .peek()
            .map(|Reverse((ms, _))| self.epoch + Duration::from_millis(*ms))
    }
}

impl SubQueue {
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
}
