//! A queue's pending events as recovery hands them to the engine: runs of events never attempted,
//! and the retrying ones with their state, in sequence order.

use super::RetryState;
use crate::clock::WallMs;

/// A run of events never attempted: sequence numbers `first .. first + count`, all first
/// enqueued at `first_enqueued_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreshRun {
    /// First sequence number.
    pub first: u64,
    /// How many.
    pub count: u32,
    /// Their first-enqueue time (wall ms).
    pub first_enqueued_ms: WallMs,
}

/// A queue's pending events for recovery ([`super::Store::pending_runs`]), in sequence order within
/// each list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PendingRuns {
    /// Events never attempted, as runs.
    pub fresh: Vec<FreshRun>,
    /// Events that failed at least once, with their state.
    pub retrying: Vec<(u64, RetryState)>,
}

impl PendingRuns {
    /// Add an event (in sequence order).
    pub fn push(&mut self, seq: u64, st: RetryState) {
        if st.attempts > 0 {
            self.retrying.push((seq, st));
            return;
        }
        self.push_fresh(seq, 1, st.first_enqueued_ms);
    }

    /// Add `count` events never attempted, `first ..`, first enqueued at `ms` (in sequence
    /// order): one run, or added to the last one when they continue it.
    pub fn push_fresh(&mut self, first: u64, count: u64, ms: WallMs) {
        let (mut first, mut count) = (first, count);
        if let Some(r) = self.fresh.last_mut() {
            if r.first_enqueued_ms == ms && r.first + u64::from(r.count) == first {
                let room = u64::from(u32::MAX - r.count).min(count);
                r.count += room as u32;
                first += room;
                count -= room;
            }
        }
        while count > 0 {
            let n = count.min(u64::from(u32::MAX));
            self.fresh.push(FreshRun {
                first,
                count: n as u32,
                first_enqueued_ms: ms,
            });
            first += n;
            count -= n;
        }
    }

    /// Every event with its state, in sequence order.
    pub fn events(&self) -> Vec<(u64, RetryState)> {
        let mut v: Vec<(u64, RetryState)> = self
            .fresh
            .iter()
            .flat_map(|r| {
                (0..u64::from(r.count)).map(move |i| {
                    (
                        r.first + i,
                        RetryState {
                            attempts: 0,
                            first_enqueued_ms: r.first_enqueued_ms,
                            due_ms: 0,
                        },
                    )
                })
            })
            .chain(self.retrying.iter().copied())
            .collect();
        v.sort_unstable_by_key(|(s, _)| *s);
        v
    }

    /// Events held.
    pub fn len(&self) -> usize {
        self.fresh.iter().map(|r| r.count as usize).sum::<usize>() + self.retrying.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.fresh.is_empty() && self.retrying.is_empty()
    }
}
