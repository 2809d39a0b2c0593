//! A FIFO of sequence numbers stored as runs: consecutive numbers cost one `(first, count)` pair.
//!
//! The spilled lane of a persisted subscription holds the sequence numbers of every queued event
//! whose body is only in the store. Events of one topic are numbered consecutively, so a backlog
//! of ten million events is usually a handful of runs instead of 80 MB of numbers; the worst case
//! (no two numbers consecutive) is one 16-byte run per event.

use std::collections::VecDeque;

/// Sequence numbers, first in first out, in runs.
#[derive(Debug, Default)]
pub struct SeqRuns {
    runs: VecDeque<(u64, u32)>,
    len: usize,
}

impl SeqRuns {
    /// Numbers held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Runs held (what the memory costs).
    #[cfg(test)]
    pub fn runs(&self) -> usize {
        self.runs.len()
    }

    /// Add `seq` at the back.
    pub fn push_back(&mut self, seq: u64) {
        self.len += 1;
        if let Some((first, n)) = self.runs.back_mut() {
            if *n < u32::MAX && first.checked_add(u64::from(*n)) == Some(seq) {
                *n += 1;
                return;
            }
        }
        self.runs.push_back((seq, 1));
    }

    /// Add `first .. first + count` at the back.
    pub fn push_back_run(&mut self, first: u64, count: u32) {
        if count == 0 {
            return;
        }
        self.len += count as usize;
        if let Some((f, n)) = self.runs.back_mut() {
            if f.checked_add(u64::from(*n)) == Some(first) {
                if let Some(sum) = n.checked_add(count) {
                    *n = sum;
                    return;
                }
            }
        }
        self.runs.push_back((first, count));
    }

    /// Add `seq` at the front.
    pub fn push_front(&mut self, seq: u64) {
        self.len += 1;
        if let Some((first, n)) = self.runs.front_mut() {
            if *n < u32::MAX && seq.checked_add(1) == Some(*first) {
                *first = seq;
                *n += 1;
                return;
            }
        }
        self.runs.push_front((seq, 1));
    }

    /// Take up to `n` numbers from the front, in order.
    pub fn take_front(&mut self, n: usize) -> Vec<u64> {
        let mut out = Vec::with_capacity(n.min(self.len));
        while out.len() < n {
            let Some((first, count)) = self.runs.front_mut() else {
                break;
            };
            let take = (n - out.len()).min(*count as usize);
            out.extend((0..take as u64).map(|i| *first + i));
            *first += take as u64;
            *count -= take as u32;
            if *count == 0 {
                self.runs.pop_front();
            }
        }
        self.len -= out.len();
        if self.runs.is_empty() && self.runs.capacity() > 64 {
            // A drained backlog gives its index memory back.
            self.runs.shrink_to_fit();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_numbers_are_one_run_and_come_out_in_order() {
        let mut r = SeqRuns::default();
        for s in 10..1_000_010u64 {
            r.push_back(s);
        }
        assert_eq!((r.len(), r.runs()), (1_000_000, 1));
        assert_eq!(r.take_front(3), vec![10, 11, 12]);
        r.push_front(12);
        r.push_front(11);
        assert_eq!(r.runs(), 1, "handed back in front of their run");
        assert_eq!(r.take_front(2), vec![11, 12]);
        assert_eq!(r.len(), 999_997);
    }

    #[test]
    fn gaps_start_new_runs_and_order_is_kept() {
        let mut r = SeqRuns::default();
        for s in [1, 2, 3, 7, 8, 20, 4] {
            r.push_back(s);
        }
        assert_eq!(r.runs(), 4);
        r.push_front(0);
        assert_eq!(r.take_front(100), vec![0, 1, 2, 3, 7, 8, 20, 4]);
        assert!(r.is_empty());
        assert_eq!(r.take_front(5), Vec::<u64>::new());
    }

    #[test]
    fn whole_runs_join_the_run_they_continue() {
        let mut r = SeqRuns::default();
        r.push_back_run(1, 100);
        r.push_back_run(101, 50);
        r.push_back_run(200, 0);
        r.push_back(151);
        assert_eq!((r.len(), r.runs()), (151, 1));
        assert_eq!(r.take_front(2), vec![1, 2]);
    }
}
